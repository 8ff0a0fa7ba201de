package admin_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/admin"
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/providertest"
)

var launched = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// group is a provider whose hosts and notices the test changes between polls.
type group struct {
	mu        sync.Mutex
	hosts     []providers.Host
	err       error
	notices   []providers.Notice
	completed []providers.Notice
}

func (g *group) Hosts(ctx context.Context) ([]providers.Host, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("group: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return nil, g.err
	}
	return slices.Clone(g.hosts), nil
}

func (g *group) set(hs ...providers.Host) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.hosts = hs
}

func (g *group) Notices(ctx context.Context) ([]providers.Notice, error) {
	if err := ctx.Err(); err != nil { // as a cloud client does
		return nil, fmt.Errorf("group: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.notices, nil
}

func (g *group) CompleteNotice(ctx context.Context, n providers.Notice) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("group: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.completed = append(g.completed, n)
	return nil
}

func host(id string, slots int) providers.Host { return providers.Host{ID: id, Addr: id, Slots: slots} }

// poll polls o and returns "id:slots" per host, in order.
func poll(t *testing.T, o *admin.Overlay) []string {
	t.Helper()
	hs, err := o.Hosts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ids(hs)
}

func ids(hs []providers.Host) []string {
	out := []string{}
	for _, h := range hs {
		out = append(out, fmt.Sprintf("%s:%d", h.ID, h.Slots))
	}
	return out
}

func want(t *testing.T, what string, got []string, w ...string) {
	t.Helper()
	if w == nil {
		w = []string{}
	}
	if !slices.Equal(got, w) {
		t.Fatalf("%s: %v, want %v", what, got, w)
	}
}

func wantErr(t *testing.T, err, kind error, parts ...string) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("error %v, want %v", err, kind)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q lacks %q", err, p)
		}
	}
}

// The overlay is a provider like any other: it passes the shared conformance suite, with a
// host of the provider removed and one added.
func TestOverlayConformance(t *testing.T) {
	providertest.Run(t, providertest.Harness{NewGroup: func(t *testing.T) providertest.Group {
		g := &group{hosts: []providers.Host{host("a", 2), host("b", 1), host("c", 4)}}
		o := admin.NewOverlay(g, 1)
		poll(t, o)
		if err := o.Remove("b", false); err != nil {
			t.Fatal(err)
		}
		if err := o.Add(providers.Host{Addr: "d", Slots: 2, Launched: launched}); err != nil {
			t.Fatal(err)
		}
		d := providers.Host{ID: "d", Addr: "d", Slots: 2, Launched: launched}
		return providertest.Group{
			Provider: o,
			Want:     []providers.Host{host("a", 2), host("c", 4), d},
			Change: func(t *testing.T) []providers.Host {
				if err := o.Add(providers.Host{Addr: "e", Slots: 1, Launched: launched}); err != nil {
					t.Fatal(err)
				}
				return []providers.Host{host("a", 2), host("c", 4), d, {ID: "e", Addr: "e", Slots: 1, Launched: launched}}
			},
			Fail: func(t *testing.T) {
				g.mu.Lock()
				g.err = errors.New("cloud API down")
				g.mu.Unlock()
			},
		}
	}})
}

// Add, remove, add back: a stopped host returns with its ID and slot count, and nothing is
// discovered again.
func TestOverlayAddRemoveReAdd(t *testing.T) {
	g := &group{hosts: []providers.Host{host("127.0.0.2", 2)}}
	o := admin.NewOverlay(g, 2)
	want(t, "first poll", poll(t, o), "127.0.0.2:2")

	if err := o.Add(providers.Host{Addr: "127.0.0.3", Slots: 2}); err != nil {
		t.Fatal(err)
	}
	want(t, "current right after the add", ids(o.Current()), "127.0.0.2:2", "127.0.0.3:2")
	want(t, "after the add", poll(t, o), "127.0.0.2:2", "127.0.0.3:2")
	want(t, "added", ids(o.Added()), "127.0.0.3:2")

	wantErr(t, o.Add(providers.Host{Addr: "127.0.0.3"}), admin.ErrAlreadyPresent, "host 127.0.0.3 is already part of the job")
	wantErr(t, o.Add(providers.Host{Addr: "127.0.0.2", Slots: 4}), admin.ErrAlreadyPresent, "host 127.0.0.2 is already part of the job")

	if err := o.Remove("127.0.0.3", false); err != nil {
		t.Fatal(err)
	}
	want(t, "after the removal", poll(t, o), "127.0.0.2:2")
	want(t, "stopped", ids(o.Stopped()), "127.0.0.3:2")
	want(t, "added while stopped", ids(o.Added()))
	wantErr(t, o.Remove("127.0.0.3", false), admin.ErrAlreadyStopped, "already stopped", "add-host 127.0.0.3")

	// Back without a slot count: as it was.
	if err := o.Add(providers.Host{Addr: "127.0.0.3"}); err != nil {
		t.Fatal(err)
	}
	want(t, "after the re-add", poll(t, o), "127.0.0.2:2", "127.0.0.3:2")
	want(t, "stopped after the re-add", ids(o.Stopped()))

	// A new slot count for the operator's own host is taken.
	if err := o.Remove("127.0.0.3", false); err != nil {
		t.Fatal(err)
	}
	if err := o.Add(providers.Host{Addr: "127.0.0.3", Slots: 3}); err != nil {
		t.Fatal(err)
	}
	want(t, "re-added with 3 slots", poll(t, o), "127.0.0.2:2", "127.0.0.3:3")
}

// A host of the provider is removed by ID or address and stays out while the provider still
// lists it; added back, it comes from the provider again (or, once the provider no longer
// lists it, from the stopped record: the operator vouches for it).
func TestOverlayProviderHosts(t *testing.T) {
	g := &group{hosts: []providers.Host{
		{ID: "i-1", Addr: "10.0.0.1", Slots: 4}, {ID: "i-2", Addr: "10.0.0.2", Slots: 4},
	}}
	o := admin.NewOverlay(g, 1)
	poll(t, o)
	if err := o.Remove("10.0.0.1", false); err != nil { // by address
		t.Fatal(err)
	}
	want(t, "after removing i-1", poll(t, o), "i-2:4")
	want(t, "stopped", ids(o.Stopped()), "i-1:4")
	wantErr(t, o.Add(providers.Host{Addr: "10.0.0.2"}), admin.ErrAlreadyPresent, "host 10.0.0.2 is already part of the job", "address 10.0.0.2")

	if err := o.Add(providers.Host{ID: "i-1", Addr: "i-1"}); err != nil { // by ID
		t.Fatal(err)
	}
	want(t, "i-1 back", poll(t, o), "i-1:4", "i-2:4")
	want(t, "no operator hosts", ids(o.Added()))

	// Removed, then gone from the provider, then added back.
	if err := o.Remove("i-2", false); err != nil {
		t.Fatal(err)
	}
	g.set(providers.Host{ID: "i-1", Addr: "10.0.0.1", Slots: 4})
	want(t, "i-2 gone", poll(t, o), "i-1:4")
	if err := o.Add(providers.Host{Addr: "10.0.0.2"}); err != nil {
		t.Fatal(err)
	}
	want(t, "i-2 vouched for", poll(t, o), "i-1:4", "i-2:4")
}

func TestOverlayMinNP(t *testing.T) {
	g := &group{hosts: []providers.Host{host("a", 2), host("b", 1), {ID: "c", Addr: "c", Slots: 8, Leaving: true}}}
	o := admin.NewOverlay(g, 2)
	poll(t, o)
	if err := o.Remove("b", false); err != nil { // 2 usable left
		t.Fatal(err)
	}
	// The leaving host's slots are not usable: removing a leaves none.
	wantErr(t, o.Remove("a", false), admin.ErrBelowMinNP, "would leave 0 usable slots, fewer than --min-np 2: use --force")
	want(t, "after the refusal", poll(t, o), "a:2", "c:8")
	if err := o.Add(providers.Host{Addr: "d", Slots: 1}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, o.Remove("a", false), admin.ErrBelowMinNP, "would leave 1 usable slot, fewer than --min-np 2")
	if err := o.Remove("a", true); err != nil {
		t.Fatalf("forced: %v", err)
	}
	want(t, "after the forced removal", poll(t, o), "c:8", "d:1")
	// Removing the leaving host takes no usable slot away.
	if err := o.Remove("c", false); err != nil {
		t.Fatal(err)
	}
}

func TestOverlayUnknownHost(t *testing.T) {
	var hs []providers.Host
	for i := range 7 {
		hs = append(hs, host(fmt.Sprintf("h%d", i), 1))
	}
	o := admin.NewOverlay(&group{hosts: hs}, 1)
	poll(t, o)
	if err := o.Remove("h6", false); err != nil {
		t.Fatal(err)
	}
	wantErr(t, o.Remove("10.9.9.9", false), admin.ErrUnknownHost, `unknown host "10.9.9.9"`, "the job's hosts are h0, h1, h2, h3, h4, and 1 more", "stopped: h6")

	// The local provider's hosts share one address: it names none of them.
	l := admin.NewOverlay(providers.NewLocal(2), 1)
	poll(t, l)
	wantErr(t, l.Remove("127.0.0.1", false), admin.ErrUnknownHost, "shared by hosts local-0, local-1", "by its ID")
	if err := l.Remove("local-1", false); err != nil {
		t.Fatal(err)
	}

	// Before the first poll, nothing is known: a driver that has just started says so (the
	// client tries again), rather than taking a listed host for unknown, or for a new one.
	early := admin.NewOverlay(providers.NewLocal(1), 1)
	wantErr(t, early.Remove("local-0", false), admin.ErrNotDiscovered, "has not listed its hosts yet")
	wantErr(t, early.Add(providers.Host{Addr: "127.0.0.1"}), admin.ErrNotDiscovered, "has not listed its hosts yet")
	poll(t, early)
	if err := early.Remove("local-0", true); err != nil {
		t.Fatalf("after the first poll: %v", err)
	}
}

// What the operator changed is saved with the job's state and restored in a driver started
// again on it: a removed host stays removed, an added one stays in the job.
func TestOverlaySnapshotRestore(t *testing.T) {
	g := &group{hosts: []providers.Host{host("127.0.0.2", 2), host("127.0.0.3", 2)}}
	o := admin.NewOverlay(g, 1)
	poll(t, o)
	if err := o.Remove("127.0.0.3", false); err != nil {
		t.Fatal(err)
	}
	if err := o.Add(providers.Host{Addr: "127.0.0.4", Slots: 1}); err != nil {
		t.Fatal(err)
	}
	added, stopped := o.Snapshot()
	want(t, "snapshot: added", ids(added), "127.0.0.4:1")
	want(t, "snapshot: stopped", ids(stopped), "127.0.0.3:2")

	again := admin.NewOverlay(g, 1) // the restarted driver's
	again.Restore(added, stopped)
	want(t, "the restarted driver's first poll", poll(t, again), "127.0.0.2:2", "127.0.0.4:1")
	want(t, "stopped after the restart", ids(again.Stopped()), "127.0.0.3:2")
	if err := again.Add(providers.Host{Addr: "127.0.0.3"}); err != nil { // brought back as before
		t.Fatal(err)
	}
	want(t, "back", poll(t, again), "127.0.0.2:2", "127.0.0.3:2", "127.0.0.4:1")
}

func TestOverlayBadHost(t *testing.T) {
	o := admin.NewOverlay(nil, 1)
	wantErr(t, o.Add(providers.Host{}), admin.ErrBadHost, "no host given")
	wantErr(t, o.Add(providers.Host{Addr: "x", Slots: providers.MaxSlots + 1}), admin.ErrBadHost, "slots 4097")
	// Without a provider, the operator's hosts are the job's.
	if err := o.Add(providers.Host{Addr: "x"}); err != nil {
		t.Fatal(err)
	}
	want(t, "nil inner", poll(t, o), "x:1")
}

func TestOverlayPassesNoticesThrough(t *testing.T) {
	n := providers.Notice{ID: "n1", HostID: "a", Kind: providers.Interruption}
	g := &group{hosts: []providers.Host{host("a", 1)}, notices: []providers.Notice{n}}
	o := admin.NewOverlay(g, 1)
	got, err := o.Notices(context.Background())
	if err != nil || len(got) != 1 || got[0].ID != "n1" {
		t.Fatalf("Notices: %v, %v", got, err)
	}
	if err := o.CompleteNotice(context.Background(), n); err != nil || len(g.completed) != 1 {
		t.Fatalf("CompleteNotice: %v, completed %v", err, g.completed)
	}
	// A provider without notices: none, and completing is a no-op.
	p := admin.NewOverlay(providers.NewLocal(1), 1)
	if got, err := p.Notices(context.Background()); err != nil || got != nil {
		t.Fatalf("Notices of a provider without: %v, %v", got, err)
	}
	if err := p.CompleteNotice(context.Background(), n); err != nil {
		t.Fatal(err)
	}
}

// Polls, adds and removals from many goroutines (run with -race).
func TestOverlayConcurrent(t *testing.T) {
	o := admin.NewOverlay(&group{hosts: []providers.Host{host("a", 4)}}, 1)
	poll(t, o)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			name := fmt.Sprintf("h%d", i)
			for range 50 {
				if _, err := o.Hosts(context.Background()); err != nil {
					t.Error(err)
					return
				}
				if err := o.Add(providers.Host{Addr: name}); err != nil {
					t.Error(err)
					return
				}
				if err := o.Remove(name, false); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	want(t, "after the storm", poll(t, o), "a:4")
	if got := len(o.Stopped()); got != 8 {
		t.Fatalf("%d stopped hosts, want 8", got)
	}
}

// hostsOnly is a provider without notices.
type hostsOnly struct{}

func (hostsOnly) Hosts(context.Context) ([]providers.Host, error) { return nil, nil }

// Over a provider without notices, the overlay has none to give, but an ended context is still
// said, as every Noticer says it.
func TestOverlayWithoutNotices(t *testing.T) {
	o := admin.NewOverlay(hostsOnly{}, 1)
	if ns, err := o.Notices(t.Context()); err != nil || len(ns) != 0 {
		t.Errorf("Notices = %v, %v; want none and no error", ns, err)
	}
	if err := o.CompleteNotice(t.Context(), providers.Notice{ID: "n"}); err != nil {
		t.Errorf("CompleteNotice = %v; want nil", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := o.Notices(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Notices with an ended context: %v; want context.Canceled", err)
	}
	if err := o.CompleteNotice(ctx, providers.Notice{ID: "n"}); !errors.Is(err, context.Canceled) {
		t.Errorf("CompleteNotice with an ended context: %v; want context.Canceled", err)
	}
}
