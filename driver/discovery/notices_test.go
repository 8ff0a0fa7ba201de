package discovery_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/discovery"
	"github.com/elasticd/elasticd/providers"
)

// noticeFake answers scripted notice polls, one script entry per poll, then nothing.
type noticeFake struct {
	mu     sync.Mutex
	polls  [][]providers.Notice
	errs   []error
	called int
}

func (f *noticeFake) Hosts(context.Context) ([]providers.Host, error) { return nil, nil }

func (f *noticeFake) Notices(context.Context) ([]providers.Notice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.called
	f.called++
	if i < len(f.errs) && f.errs[i] != nil {
		return nil, f.errs[i]
	}
	if i < len(f.polls) {
		return f.polls[i], nil
	}
	return nil, nil
}

func TestRunNoticesDeduplicatesAndSurvivesErrors(t *testing.T) {
	a := providers.Notice{ID: "a", HostID: "i-1", Kind: providers.Interruption}
	b := providers.Notice{ID: "b", HostID: "i-2", Kind: providers.ScaleIn}
	f := &noticeFake{
		polls: [][]providers.Notice{{a}, nil, {a, b}, {b}},
		errs:  []error{nil, errors.New("throttled"), nil, nil},
	}
	w := &discovery.Watcher{Provider: f, Interval: time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make(chan providers.Notice)
	done := make(chan error, 1)
	go func() { done <- w.RunNotices(ctx, out) }()
	var got []string
	for len(got) < 2 {
		select {
		case n := <-out:
			got = append(got, n.ID)
		case <-ctx.Done():
			t.Fatalf("got %v before the deadline", got)
		}
	}
	if got[0] != "a" || got[1] != "b" {
		t.Fatalf("notices %v, want [a b]", got)
	}
	select { // no duplicate follows
	case n := <-out:
		t.Fatalf("duplicate notice %v", n)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("RunNotices: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("RunNotices did not end with its context")
	}
}

// A provider without notices makes RunNotices return at once.
func TestRunNoticesWithoutNoticer(t *testing.T) {
	w := &discovery.Watcher{Provider: providers.NewLocal(1)}
	if err := w.RunNotices(context.Background(), make(chan providers.Notice)); err != nil {
		t.Fatal(err)
	}
}

// hostScript answers scripted host polls, repeating the last.
type hostScript struct {
	mu    sync.Mutex
	polls [][]providers.Host
	i     int
}

func (p *hostScript) Hosts(context.Context) ([]providers.Host, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.polls[min(p.i, len(p.polls)-1)]
	p.i++
	return h, nil
}

// A host that turns Leaving, with nothing else changed, is a change the driver must hear of
// (on IBM it is the only sign of a preemption).
func TestWatcherSendsLeavingChange(t *testing.T) {
	up := providers.Host{ID: "i-1", Addr: "10.0.0.1", Slots: 1}
	leaving := up
	leaving.Leaving = true
	w := &discovery.Watcher{Provider: &hostScript{polls: [][]providers.Host{{up}, {leaving}}}, Interval: time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make(chan []providers.Host)
	go w.Run(ctx, out)
	for _, want := range []bool{false, true} {
		select {
		case hs := <-out:
			if len(hs) != 1 || hs[0].Leaving != want {
				t.Fatalf("got %+v, want Leaving=%v", hs, want)
			}
		case <-ctx.Done():
			t.Fatalf("no host set with Leaving=%v was sent", want)
		}
	}
}
