package providertest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/providertest"
)

// brokenProvider breaks one rule of the contract, chosen by name.
type brokenProvider struct {
	name  string
	hosts []providers.Host
	calls atomic.Int64
}

func (p *brokenProvider) Hosts(ctx context.Context) ([]providers.Host, error) {
	n := p.calls.Add(1)
	if p.name != "ignores-ctx" && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	switch p.name {
	case "shares-slice":
		return p.hosts, nil
	case "duplicate-id":
		return []providers.Host{p.hosts[0], p.hosts[0]}, nil
	case "no-slots":
		return []providers.Host{{ID: "a", Addr: "a"}}, nil
	case "port-in-addr":
		return []providers.Host{{ID: "a", Addr: "a:22", Slots: 1}}, nil
	case "unstable":
		return []providers.Host{{ID: "a", Addr: "a", Slots: int(n)}}, nil
	}
	return append([]providers.Host(nil), p.hosts...), nil
}

var brokenRules = map[string]string{
	"ignores-ctx":  "want one wrapping context canceled",
	"shares-slice": "poll after the caller changed the first result",
	"duplicate-id": `host ID "a" is listed twice`,
	"no-slots":     `host "a" has 0 slots`,
	"port-in-addr": "with port 22",
	"unstable":     "poll 2:",

	"notice-unstable-id":   "delivered again: IDs",
	"notice-ignores-ctx":   "Notices with an ended context: error",
	"notice-empty-id":      "has no ID",
	"complete-again-fails": "again: no such lifecycle action; want it harmless",
}

// brokenNoticer is brokenProvider with notices, breaking one rule of theirs, chosen by name.
type brokenNoticer struct {
	*brokenProvider
	mu       sync.Mutex
	queue    []providers.Notice
	sent     int
	answered map[string]bool
}

func (p *brokenNoticer) announce(n providers.Notice) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.queue = append(p.queue, n)
}

func (p *brokenNoticer) Notices(ctx context.Context) ([]providers.Notice, error) {
	if p.name != "notice-ignores-ctx" && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ns := p.queue
	p.queue = nil
	for i := range ns {
		p.sent++
		switch p.name {
		case "notice-unstable-id":
			ns[i].ID = fmt.Sprintf("%s-%d", ns[i].ID, p.sent)
		case "notice-empty-id":
			ns[i].ID = ""
		}
	}
	return ns, nil
}

func (p *brokenNoticer) CompleteNotice(ctx context.Context, n providers.Notice) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.answered[n.ID] && p.name == "complete-again-fails" {
		return errors.New("no such lifecycle action")
	}
	p.answered[n.ID] = true
	return nil
}

// TestBrokenProvider runs the suite on one broken provider; TestSuiteCatchesBrokenProviders
// runs it in a child process and expects it to fail.
func TestBrokenProvider(t *testing.T) {
	name := os.Getenv("PROVIDERTEST_BROKEN")
	if name == "" {
		t.Skip("run by TestSuiteCatchesBrokenProviders")
	}
	providertest.Run(t, providertest.Harness{NewGroup: func(t *testing.T) providertest.Group {
		p := &brokenNoticer{brokenProvider: &brokenProvider{name: name, hosts: []providers.Host{{ID: "a", Addr: "a", Slots: 1}}},
			answered: map[string]bool{}}
		return providertest.Group{
			Provider: p,
			Announce: func(t *testing.T) func(t *testing.T) {
				n := providers.Notice{ID: "ev-1", HostID: "a", Kind: providers.Interruption}
				p.announce(n)
				return func(t *testing.T) { p.announce(n) }
			},
			AnnounceAnswerable: func(t *testing.T) {
				p.announce(providers.Notice{ID: "ev-2", HostID: "a", Kind: providers.ScaleIn, Token: "tok"})
			},
		}
	}})
}

// TestSuiteCatchesBrokenProviders: a suite that cannot fail proves nothing.
func TestSuiteCatchesBrokenProviders(t *testing.T) {
	for name, want := range brokenRules {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBrokenProvider$", "-test.count=1")
			cmd.Env = append(os.Environ(), "PROVIDERTEST_BROKEN="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a provider that is %s:\n%s", name, out)
			}
			if !strings.Contains(string(out), want) {
				t.Errorf("the suite failed, but not with %q:\n%s", want, out)
			}
		})
	}
	// The same provider, unbroken, passes.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBrokenProvider$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PROVIDERTEST_BROKEN=none")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("the suite failed a provider that keeps every rule: %v\n%s", err, out)
	}
}
