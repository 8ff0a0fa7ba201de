package throttle_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers/throttle"
)

// clock is a fake clock: After records the wait and fires at once (or never, when hang).
type clock struct {
	mu    sync.Mutex
	now   time.Time
	waits []time.Duration
	hang  bool
}

func newClock() *clock { return &clock{now: time.Now()} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func (c *clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waits = append(c.waits, d)
	ch := make(chan time.Time, 1)
	if !c.hang {
		c.now = c.now.Add(d)
		ch <- c.now
	}
	return ch
}

func (c *clock) waited() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}

func newGates(c *clock, cfg throttle.Config) *throttle.Gates {
	cfg.Now, cfg.After = c.Now, c.After
	return throttle.New(cfg)
}

// deadline is a context whose deadline is d after the fake clock's now (which starts at the
// real now, so the context does not end during the test).
func deadline(t *testing.T, c *clock, d time.Duration) context.Context {
	ctx, cancel := context.WithDeadline(t.Context(), c.Now().Add(d))
	t.Cleanup(cancel)
	return ctx
}

var errBoom = errors.New("HTTP 429")

// The backoff doubles per throttle from Base to Max and stays there however long the
// throttling lasts (seeds/001: no counter that grows without bound); each success takes one
// step back down, and a recovered endpoint starts again from Base.
func TestBackoffIsBoundedAndDecays(t *testing.T) {
	g := throttle.New(throttle.Config{})
	const ep = "instances.list"
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
	for i, w := range want {
		if got := g.Throttled(ep, -1, errBoom); got != w {
			t.Fatalf("throttle %d: wait %v; want %v", i+1, got, w)
		}
	}
	for range 10_000 {
		if got := g.Throttled(ep, -1, errBoom); got != throttle.DefaultMax {
			t.Fatalf("wait %v after many throttles; want the cap %v", got, throttle.DefaultMax)
		}
	}
	g.Succeeded(ep)
	if got := g.Throttled(ep, -1, errBoom); got != 16*time.Second {
		t.Errorf("throttle after one success: wait %v; want a step down, 16s", got)
	}
	for range 100 { // many more than the steps up: the level stops at zero
		g.Succeeded(ep)
	}
	if got := g.Throttled(ep, -1, errBoom); got != throttle.DefaultBase {
		t.Errorf("throttle after recovering: wait %v; want %v again", got, throttle.DefaultBase)
	}
	g.Throttled(ep, -1, errBoom) // 2s
	g.Succeeded(ep)
	if got := g.Throttled(ep, -1, errBoom); got != 2*time.Second {
		t.Errorf("throttle, throttle, success, throttle: wait %v; want 2s (one step forgiven)", got)
	}
}

func TestRetryAfterIsHonouredAndCapped(t *testing.T) {
	c := newClock()
	g := newGates(c, throttle.Config{})
	const ep = "ec2"
	for _, tc := range []struct{ said, want time.Duration }{
		{3 * time.Second, 3 * time.Second},
		{0, 0},
		{100 * time.Millisecond, 100 * time.Millisecond}, // not raised to the backoff
		{time.Hour, throttle.DefaultMaxRetryAfter},
	} {
		if got := g.Throttled(ep, tc.said, errBoom); got != tc.want || !g.Until(ep).Equal(c.Now().Add(tc.want)) {
			t.Errorf("Retry-After %v: wait %v until %v; want %v", tc.said, got, g.Until(ep).Sub(c.Now()), tc.want)
		}
	}
}

func TestConfigOverrides(t *testing.T) {
	// A cap below Base (IBM's MaxBackoff in its tests) bounds every wait, a Retry-After too.
	g := throttle.New(throttle.Config{Max: 20 * time.Millisecond, MaxRetryAfter: 20 * time.Millisecond})
	for i := range 5 {
		if got := g.Throttled("a", -1, errBoom); got != 20*time.Millisecond {
			t.Errorf("throttle %d: wait %v; want the cap 20ms", i+1, got)
		}
	}
	if got := g.Throttled("a", time.Hour, errBoom); got != 20*time.Millisecond {
		t.Errorf("Retry-After 1h: wait %v; want the cap 20ms", got)
	}
}

func TestJitter(t *testing.T) {
	g := throttle.New(throttle.Config{Jitter: true})
	backoff := time.Second
	for i := range 50 {
		got := g.Throttled("sqs", -1, errBoom)
		if got < backoff/2 || got > backoff {
			t.Fatalf("throttle %d: wait %v; want within [%v, %v]", i+1, got, backoff/2, backoff)
		}
		backoff = min(2*backoff, throttle.DefaultMax)
	}
	if got := g.Throttled("sqs", 3*time.Second, errBoom); got != 3*time.Second {
		t.Errorf("Retry-After 3s with jitter: wait %v; want exactly 3s", got)
	}
}

// A throttled endpoint holds back no other.
func TestGatesArePerEndpoint(t *testing.T) {
	c := newClock()
	g := newGates(c, throttle.Config{})
	g.Throttled("nics", 5*time.Second, errBoom)
	g.Throttled("nics", -1, errBoom)
	if err := g.Open("vms"); err != nil {
		t.Errorf("vms: %v; want open", err)
	}
	if got := g.Throttled("vms", -1, errBoom); got != time.Second {
		t.Errorf("first throttle of vms: wait %v; want 1s, whatever nics did", got)
	}
	err := g.Open("nics")
	if !errors.Is(err, throttle.ErrThrottled) || !strings.HasPrefix(err.Error(), "nics ") {
		t.Errorf("nics: %v; want ErrThrottled naming nics", err)
	}
}

func TestWait(t *testing.T) {
	const ep = "autoscaling"
	t.Run("open: no wait", func(t *testing.T) {
		c := newClock()
		g := newGates(c, throttle.Config{})
		if err := g.Wait(deadline(t, c, time.Second), ep); err != nil {
			t.Fatal(err)
		}
		g.Throttled(ep, 2*time.Second, errBoom)
		g.Succeeded(ep)
		if err := g.Wait(deadline(t, c, time.Second), ep); err != nil || len(c.waited()) != 0 {
			t.Errorf("after a success: %v, waits %v; want open at once", err, c.waited())
		}
	})
	t.Run("a rest that fits is waited out", func(t *testing.T) {
		c := newClock()
		g := newGates(c, throttle.Config{})
		g.Throttled(ep, 2*time.Second, errBoom)
		c.advance(500 * time.Millisecond)
		if err := g.Wait(deadline(t, c, 10*time.Second), ep); err != nil {
			t.Fatal(err)
		}
		if w := c.waited(); len(w) != 1 || w[0] != 1500*time.Millisecond {
			t.Errorf("waits %v; want the 1.5s left of the rest", w)
		}
		if err := g.Open(ep); err != nil {
			t.Errorf("after the rest: %v", err)
		}
		// No deadline at all: bounded by MaxWait only.
		g.Throttled(ep, 3*time.Second, errBoom)
		if err := g.Wait(t.Context(), ep); err != nil {
			t.Errorf("no deadline: %v", err)
		}
	})
	t.Run("a rest past the deadline fails at once", func(t *testing.T) {
		c := newClock()
		g := newGates(c, throttle.Config{})
		g.Throttled(ep, 2*time.Second, errBoom)
		for _, d := range []time.Duration{500 * time.Millisecond, 2 * time.Second, 2*time.Second + throttle.DefaultMargin - time.Millisecond} {
			err := g.Wait(deadline(t, c, d), ep)
			var te *throttle.Error
			if !errors.As(err, &te) || !errors.Is(err, throttle.ErrThrottled) || !errors.Is(err, errBoom) {
				t.Fatalf("deadline in %v: %v; want an *Error that is ErrThrottled and wraps the cause", d, err)
			}
			if te.Endpoint != ep || te.Wait != 2*time.Second || !te.Until.Equal(c.Now().Add(2*time.Second)) {
				t.Errorf("deadline in %v: %+v", d, te)
			}
			for _, s := range []string{ep, "resting for another 2s", "HTTP 429"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%q does not say %q", err, s)
				}
			}
		}
		if w := c.waited(); len(w) != 0 {
			t.Errorf("waits %v; want none begun", w)
		}
		if err := g.Wait(deadline(t, c, 2*time.Second+throttle.DefaultMargin), ep); err != nil {
			t.Errorf("a wait that leaves the margin: %v", err)
		}
	})
	t.Run("a rest past MaxWait fails at once", func(t *testing.T) {
		c := newClock()
		g := newGates(c, throttle.Config{})
		g.Throttled(ep, throttle.DefaultMaxWait+time.Second, errBoom)
		if err := g.Wait(deadline(t, c, time.Minute), ep); !errors.Is(err, throttle.ErrThrottled) {
			t.Errorf("%v; want ErrThrottled", err)
		}
		if err := g.Ready(deadline(t, c, time.Minute), ep); !errors.Is(err, throttle.ErrThrottled) {
			t.Errorf("Ready: %v; want ErrThrottled", err)
		}
	})
	t.Run("the context ends first", func(t *testing.T) {
		c := newClock()
		c.hang = true
		g := newGates(c, throttle.Config{})
		g.Throttled(ep, time.Second, errBoom)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- g.Wait(ctx, ep) }()
		for len(c.waited()) == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("%v; want context.Canceled", err)
		}
		if err := g.Wait(ctx, "other"); !errors.Is(err, context.Canceled) {
			t.Errorf("ended context, open gate: %v; want context.Canceled", err)
		}
	})
}

// Open never waits: a caller that leaves waiting to its SDK fails while the gate is closed.
func TestOpenAndReady(t *testing.T) {
	c := newClock()
	g := newGates(c, throttle.Config{})
	g.Throttled("vms", time.Second, errBoom)
	if err := g.Ready(deadline(t, c, 5*time.Second), "vms"); err != nil {
		t.Errorf("Ready with time to wait: %v", err)
	}
	if err := g.Open("vms"); !errors.Is(err, throttle.ErrThrottled) {
		t.Errorf("Open: %v; want ErrThrottled", err)
	}
	if w := c.waited(); len(w) != 0 {
		t.Errorf("waits %v; want none", w)
	}
	c.advance(time.Second)
	if err := g.Open("vms"); err != nil {
		t.Errorf("Open after the rest: %v", err)
	}
	if !g.Until("never-used").IsZero() {
		t.Error("an endpoint never throttled has a rest")
	}
}

func TestConcurrentUse(t *testing.T) {
	g := throttle.New(throttle.Config{Max: time.Millisecond})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			ep := []string{"a", "b"}[i%2]
			for range 200 {
				g.Throttled(ep, -1, errBoom)
				_ = g.Wait(t.Context(), ep)
				g.Succeeded(ep)
			}
		})
	}
	wg.Wait()
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"7", 7 * time.Second, true},
		{" 2 ", 2 * time.Second, true},
		{"0", 0, true},
		{"0.1", 100 * time.Millisecond, true},
		{"1.5", 1500 * time.Millisecond, true},
		{"-3", 0, false},
		{"NaN", 0, false},
		{"99999999999999", 24 * time.Hour, true}, // clamped before it can overflow
		{"Sun, 01 Mar 2026 12:00:30 GMT", 30 * time.Second, true},
		{"Sun, 01 Mar 2026 11:00:00 GMT", 0, true}, // in the past: no wait
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{"soon", 0, false},
	} {
		got, ok := throttle.ParseRetryAfter(c.v, now)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", c.v, got, ok, c.want, c.ok)
		}
	}
}
