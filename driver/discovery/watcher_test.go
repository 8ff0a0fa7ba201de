package discovery_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/discovery"
	"github.com/elasticd/elasticd/providers"
)

// fakeProvider hands each poll to the test, which answers it (or not) through the poll.
type fakeProvider struct{ polls chan *poll }

type poll struct {
	ctx   context.Context
	reply chan answer
}

type answer struct {
	hosts []providers.Host
	err   error
}

func newFake() *fakeProvider { return &fakeProvider{polls: make(chan *poll)} }

func (f *fakeProvider) Hosts(ctx context.Context) ([]providers.Host, error) {
	p := &poll{ctx: ctx, reply: make(chan answer, 1)}
	select {
	case f.polls <- p:
	case <-ctx.Done():
		return nil, fmt.Errorf("fake: %w", ctx.Err())
	}
	select {
	case a := <-p.reply:
		return a.hosts, a.err
	case <-ctx.Done():
		return nil, fmt.Errorf("fake: %w", ctx.Err())
	}
}

func (p *poll) answer(hosts ...providers.Host) { p.reply <- answer{hosts: hosts} }
func (p *poll) fail(err error)                 { p.reply <- answer{err: err} }

// nextPoll waits for the watcher's next poll.
func (f *fakeProvider) nextPoll(t *testing.T) *poll {
	t.Helper()
	select {
	case p := <-f.polls:
		return p
	case <-time.After(5 * time.Second):
		t.Fatal("no poll")
		return nil
	}
}

func (f *fakeProvider) noPoll(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-f.polls:
		t.Fatalf("a poll started within %v", d)
	case <-time.After(d):
	}
}

// tick is the poll interval of tests that check that nothing was sent: quiet, the time they
// watch for a send, is shorter, so a send that should not happen is waiting the whole time.
const (
	tick  = 50 * time.Millisecond
	quiet = 30 * time.Millisecond
)

func host(id string, slots int) providers.Host { return providers.Host{ID: id, Addr: id, Slots: slots} }

// logs collects the watcher's log lines and passes them on to t.Log.
type logs struct {
	t  *testing.T
	mu sync.Mutex
	b  strings.Builder
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Write(p)
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type run struct {
	out    chan []providers.Host
	errc   chan error
	cancel context.CancelFunc
	logs   *logs
}

// start runs w in a goroutine the test owns: cleanup cancels it and waits for it.
func start(t *testing.T, w *discovery.Watcher) *run {
	t.Helper()
	r := &run{out: make(chan []providers.Host), errc: make(chan error, 1), logs: &logs{t: t}}
	w.Logger = slog.New(slog.NewTextHandler(r.logs, nil))
	ctx, cancel := context.WithCancel(t.Context())
	r.cancel = cancel
	go func() { r.errc <- w.Run(ctx, r.out) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.errc:
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after its context was cancelled")
		}
	})
	return r
}

// recv waits for a send and returns its IDs and slots, "a:1 b:2".
func (r *run) recv(t *testing.T) string {
	t.Helper()
	select {
	case hs := <-r.out:
		return describe(hs)
	case err := <-r.errc:
		t.Fatalf("Run returned %v while a send was expected", err)
	case <-time.After(5 * time.Second):
		t.Fatal("nothing sent")
	}
	return ""
}

func (r *run) noRecv(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case hs := <-r.out:
		t.Fatalf("sent %q; expected nothing", describe(hs))
	case err := <-r.errc:
		t.Fatalf("Run returned %v", err)
	case <-time.After(d):
	}
}

// ended waits for Run to return and says how long that took.
func (r *run) ended(t *testing.T) (error, time.Duration) {
	t.Helper()
	start := time.Now()
	select {
	case err := <-r.errc:
		r.errc <- err // for cleanup
		return err, time.Since(start)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return")
		return nil, 0
	}
}

func describe(hs []providers.Host) string {
	s := make([]string, len(hs))
	for i, h := range hs {
		s[i] = fmt.Sprintf("%s:%d", h.ID, h.Slots)
		if h.Zone != "" {
			s[i] += "@" + h.Zone
		}
	}
	return strings.Join(s, " ")
}

func TestFirstPollFailureIsFatal(t *testing.T) {
	t.Parallel()
	boom := errors.New("describe asg: access denied")
	f := newFake()
	r := start(t, &discovery.Watcher{Provider: f, Interval: time.Millisecond})
	f.nextPoll(t).fail(boom)
	err, took := r.ended(t)
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "first poll") {
		t.Errorf("Run returned %v; want the first poll's error", err)
	}
	if took > time.Second {
		t.Errorf("Run took %v to return the first poll's error", took)
	}
}

func TestFirstPollTimeoutIsFatal(t *testing.T) {
	t.Parallel()
	f := newFake()
	r := start(t, &discovery.Watcher{Provider: f, Timeout: 50 * time.Millisecond})
	p := f.nextPoll(t)
	if d, ok := p.ctx.Deadline(); !ok || time.Until(d) > 50*time.Millisecond {
		t.Errorf("poll context deadline %v, %v; want one within the 50ms Timeout", d, ok)
	}
	err, _ := r.ended(t) // never answered
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer within 50ms") {
		t.Errorf("Run returned %v; want a timeout of the first poll", err)
	}
}

func TestMalformedHosts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		hosts []providers.Host
		want  string
	}{
		{"repeated ID", []providers.Host{host("a", 1), host("b", 1), host("a", 2)}, `host "a" twice`},
		{"empty ID", []providers.Host{{Addr: "10.0.0.1", Slots: 1}}, `no ID (address "10.0.0.1")`},
		{"no slots", []providers.Host{host("a", 0)}, `host "a" with 0 slots`},
		{"no address", []providers.Host{{ID: "i-1", Slots: 1}}, `host "i-1" with no address`},
	}
	for _, tt := range tests {
		t.Run(tt.name+" first", func(t *testing.T) {
			f := newFake()
			r := start(t, &discovery.Watcher{Provider: f})
			f.nextPoll(t).answer(tt.hosts...)
			if err, _ := r.ended(t); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Run returned %v; want an error containing %q", err, tt.want)
			}
		})
		t.Run(tt.name+" later", func(t *testing.T) {
			f := newFake()
			r := start(t, &discovery.Watcher{Provider: f, Interval: tick})
			f.nextPoll(t).answer(host("z", 1))
			if got := r.recv(t); got != "z:1" {
				t.Fatalf("sent %q", got)
			}
			f.nextPoll(t).answer(tt.hosts...)
			r.noRecv(t, quiet)
			f.nextPoll(t) // still polling
			if !strings.Contains(r.logs.String(), strings.ReplaceAll(tt.want, `"`, `\"`)) {
				t.Errorf("log does not say %q", tt.want)
			}
		})
	}
}

// TestSendsChanges: a send for the first set and for every change, none for a repeat.
func TestSendsChanges(t *testing.T) {
	t.Parallel()
	f := newFake()
	r := start(t, &discovery.Watcher{Provider: f, Interval: tick})
	zoned := host("a", 1)
	zoned.Zone = "us-east-1a"
	steps := []struct {
		answer []providers.Host
		want   string // "" = no send
	}{
		{[]providers.Host{host("b", 2), host("a", 1)}, "a:1 b:2"},
		{[]providers.Host{host("a", 1), host("b", 2)}, ""}, // order alone is no change
		{[]providers.Host{host("b", 2), host("a", 1)}, ""},
		{[]providers.Host{host("a", 1), host("b", 4)}, "a:1 b:4"},
		{[]providers.Host{zoned, host("b", 4)}, "a:1@us-east-1a b:4"},
		{[]providers.Host{zoned}, "a:1@us-east-1a"},
		{nil, "-"}, // "-": the empty group, a change
		{nil, ""},
		{[]providers.Host{}, ""},
		{[]providers.Host{host("c", 1)}, "c:1"},
	}
	for i, s := range steps {
		f.nextPoll(t).answer(s.answer...)
		switch s.want {
		case "":
			r.noRecv(t, quiet)
		case "-":
			if got := r.recv(t); got != "" {
				t.Fatalf("step %d: sent %q; want the empty group", i, got)
			}
		default:
			if got := r.recv(t); got != s.want {
				t.Fatalf("step %d: sent %q; want %q", i, got, s.want)
			}
		}
	}
}

func TestFirstEmptyGroupIsSent(t *testing.T) {
	t.Parallel()
	f := newFake()
	r := start(t, &discovery.Watcher{Provider: f, Interval: time.Millisecond})
	f.nextPoll(t).answer()
	select {
	case hs := <-r.out:
		if hs == nil || len(hs) != 0 {
			t.Errorf("sent %v; want an empty, non-nil set", hs)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first (empty) set was not sent")
	}
}

// TestReceiverOwnsSends: the receiver may change what it got; the watcher compares against
// its own copy.
func TestReceiverOwnsSends(t *testing.T) {
	t.Parallel()
	f := newFake()
	r := start(t, &discovery.Watcher{Provider: f, Interval: tick})
	answer := []providers.Host{host("a", 1), host("b", 1)}
	f.nextPoll(t).answer(answer...)
	got := <-r.out
	got[0].Slots, got[1].ID = 99, "changed"
	answer[0].Slots = 42 // and the provider may change what it returned
	f.nextPoll(t).answer(host("a", 1), host("b", 1))
	r.noRecv(t, quiet)
}

func TestLaterFailuresKeepTheLastSet(t *testing.T) {
	t.Parallel()
	f := newFake()
	r := start(t, &discovery.Watcher{Provider: f, Interval: tick, Timeout: 100 * time.Millisecond})
	f.nextPoll(t).answer(host("a", 1))
	if got := r.recv(t); got != "a:1" {
		t.Fatalf("sent %q", got)
	}
	f.nextPoll(t).fail(errors.New("throttled"))
	r.noRecv(t, quiet)
	f.nextPoll(t).fail(errors.New("throttled again"))
	r.noRecv(t, quiet)
	f.nextPoll(t) // unanswered: times out
	r.noRecv(t, 100*time.Millisecond+quiet)
	log := r.logs.String()
	for _, want := range []string{
		"error=throttled failures=1",
		"error=\"throttled again\" failures=2 failing_for=",
		"no answer within 100ms",
		"failures=3",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log does not contain %q", want)
		}
	}
	// failing_for runs from the start of the first failed poll, a tick before the second.
	if m := regexp.MustCompile(`failures=2 failing_for=(\S+)`).FindStringSubmatch(log); m == nil {
		t.Error("no failing_for in the log of the second failure")
	} else if d, err := time.ParseDuration(m[1]); err != nil || d < tick {
		t.Errorf("failing_for=%s at the second failure; want at least the interval %v", m[1], tick)
	}
	f.nextPoll(t).answer(host("a", 1)) // recovered, unchanged: nothing to send
	r.noRecv(t, quiet)
	if log := r.logs.String(); !strings.Contains(log, `discovery recovered" failures=3 failed_for=`) {
		t.Error("log does not report the recovery")
	}
	f.nextPoll(t).answer(host("b", 1))
	if got := r.recv(t); got != "b:1" {
		t.Fatalf("sent %q", got)
	}
	f.nextPoll(t).fail(errors.New("throttled"))
	f.nextPoll(t) // the failure is logged before the next poll starts
	if log := r.logs.String(); strings.Count(log, "failures=1 ") != 2 {
		t.Errorf("the count of failures did not start again after the recovery:\n%s", log)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		interval time.Duration
		// setup brings the watcher to the state in which it is cancelled.
		setup func(t *testing.T, f *fakeProvider, r *run)
	}{
		{"during the first poll", time.Hour, func(t *testing.T, f *fakeProvider, r *run) { f.nextPoll(t) }},
		{"during a later poll", time.Millisecond, func(t *testing.T, f *fakeProvider, r *run) {
			f.nextPoll(t).answer(host("a", 1))
			r.recv(t)
			f.nextPoll(t)
		}},
		{"between polls", time.Hour, func(t *testing.T, f *fakeProvider, r *run) {
			f.nextPoll(t).answer(host("a", 1))
			r.recv(t)
		}},
		{"while nobody receives", time.Hour, func(t *testing.T, f *fakeProvider, r *run) {
			f.nextPoll(t).answer(host("a", 1))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake()
			r := start(t, &discovery.Watcher{Provider: f, Interval: tt.interval, Timeout: time.Hour})
			tt.setup(t, f, r)
			r.cancel()
			err, took := r.ended(t)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run returned %v; want an error wrapping context.Canceled", err)
			}
			if took > time.Second {
				t.Errorf("Run took %v to return after cancel", took)
			}
		})
	}
}

// TestSlowPollsDoNotPileUp: a poll longer than the interval delays the next one; the pause is
// measured from the end of a poll.
func TestSlowPollsDoNotPileUp(t *testing.T) {
	t.Parallel()
	const interval = 20 * time.Millisecond
	f := newFake()
	r := start(t, &discovery.Watcher{Provider: f, Interval: interval})
	p := f.nextPoll(t)
	f.noPoll(t, 10*interval) // the slow poll is still running: no second one
	p.answer(host("a", 1))
	answered := time.Now()
	r.recv(t)
	for range 3 {
		p = f.nextPoll(t)
		if gap := time.Since(answered); gap < interval {
			t.Errorf("next poll %v after the previous one ended; want at least the interval %v", gap, interval)
		}
		f.noPoll(t, 3*interval)
		p.answer(host("a", 1))
		answered = time.Now()
	}
}

// TestSlowReceiverGetsTheLatestSet: while nobody receives, polls go on and only the latest
// set waits.
func TestSlowReceiverGetsTheLatestSet(t *testing.T) {
	t.Parallel()
	f := newFake()
	r := start(t, &discovery.Watcher{Provider: f, Interval: 2 * tick})
	f.nextPoll(t).answer(host("a", 1))
	f.nextPoll(t).answer(host("b", 1))
	f.nextPoll(t).answer(host("c", 1))
	if got := r.recv(t); got != "c:1" {
		t.Fatalf("sent %q; want the latest set c:1", got)
	}
	r.noRecv(t, quiet)
	f.nextPoll(t).answer(host("c", 1))
	r.noRecv(t, quiet)

	// A change and its undoing, both unseen by the receiver, send nothing.
	f.nextPoll(t).answer(host("d", 1))
	f.nextPoll(t).answer(host("c", 1))
	r.noRecv(t, quiet)
}

func TestValidate(t *testing.T) {
	t.Parallel()
	f := newFake()
	tests := []struct {
		w    discovery.Watcher
		want string
	}{
		{discovery.Watcher{}, "Provider is nil"},
		{discovery.Watcher{Provider: f, Interval: -time.Second}, "interval -1s"},
		{discovery.Watcher{Provider: f, Timeout: -time.Second}, "timeout -1s"},
	}
	for _, tt := range tests {
		err := tt.w.Run(t.Context(), make(chan []providers.Host))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: Run returned %v; want an error containing %q", tt.w, err, tt.want)
		}
	}
}

// A poke starts the next poll at once instead of after Interval.
func TestWatcherPoke(t *testing.T) {
	p := &countingProvider{}
	poke := make(chan struct{}, 1)
	w := &discovery.Watcher{Provider: p, Interval: time.Hour, Poke: poke}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out := make(chan []providers.Host, 1)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, out) }()
	<-out // the first poll
	poke <- struct{}{}
	deadline := time.Now().Add(5 * time.Second)
	for p.calls.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no poll after the poke within 5s (Interval is an hour)")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
}

type countingProvider struct{ calls atomic.Int64 }

func (p *countingProvider) Hosts(context.Context) ([]providers.Host, error) {
	p.calls.Add(1)
	return []providers.Host{{ID: "h", Addr: "127.0.0.1", Slots: 1}}, nil
}
