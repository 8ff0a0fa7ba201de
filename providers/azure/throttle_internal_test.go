package azure

import (
	"net/http"
	"testing"
	"time"
)

// The back-off is per endpoint, bounded and decaying: these are hard to see through the fake
// in a fast test, so they are checked here, on the gate itself.

func TestGateBackoffIsBoundedAndDecays(t *testing.T) {
	now := time.Date(2026, 10, 2, 9, 0, 0, 0, time.UTC)
	g := &gate{name: "list scale set VMs"}
	var waits []time.Duration
	for range 100 { // a server that throttles for ever
		w := g.throttled(now, 0)
		if w > backoffMax {
			t.Fatalf("wait %v past the cap %v", w, backoffMax)
		}
		waits = append(waits, w)
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute}
	for i, w := range want {
		if waits[i] != w {
			t.Errorf("throttle %d: wait %v; want %v", i+1, waits[i], w)
		}
	}
	if g.level != maxLevel {
		t.Errorf("level %d after 100 throttles; want it held at %d", g.level, maxLevel)
	}
	if err := g.open(now.Add(59 * time.Second)); err == nil {
		t.Error("gate open before its wait ran out")
	}
	if err := g.open(now.Add(time.Minute)); err != nil {
		t.Errorf("gate closed after its wait: %v", err)
	}
	for range maxLevel {
		g.succeeded()
	}
	g.succeeded() // one more does not go below zero
	if g.level != 0 {
		t.Errorf("level %d after %d successes; want 0", g.level, maxLevel+1)
	}
	if w := g.throttled(now, 0); w != backoffBase {
		t.Errorf("after recovering, a throttle waits %v; want %v again", w, backoffBase)
	}
}

func TestGateHonoursRetryAfter(t *testing.T) {
	now := time.Now()
	g := &gate{}
	if w := g.throttled(now, 20*time.Second); w != 20*time.Second {
		t.Errorf("Retry-After 20s: wait %v", w)
	}
	if w := g.throttled(now, time.Hour); w != retryAfterMax {
		t.Errorf("Retry-After 1h: wait %v; want it bounded at %v", w, retryAfterMax)
	}
	if w := g.throttled(now, 100*time.Millisecond); w != 4*time.Second {
		t.Errorf("short Retry-After at level 2: wait %v; want the endpoint's own back-off, 4s", w)
	}
}

func TestGatesAreIndependent(t *testing.T) {
	now := time.Now()
	gs := gates{scaleSet: &gate{name: "a"}, vms: &gate{name: "b"}, nics: &gate{name: "c"}}
	gs.nics.throttled(now, 0)
	gs.nics.throttled(now, 0)
	if gs.vms.level != 0 || gs.scaleSet.level != 0 || gs.nics.level != 2 {
		t.Errorf("levels %d %d %d; want only the throttled endpoint's raised", gs.scaleSet.level, gs.vms.level, gs.nics.level)
	}
	if err := gs.open(now); err == nil || err.Error()[:1] != "c" {
		t.Errorf("gates.open: %v; want the NIC endpoint named", err)
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 10, 2, 9, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		header map[string]string
		want   time.Duration
	}{
		{map[string]string{}, 0},
		{map[string]string{"Retry-After": "7"}, 7 * time.Second},
		{map[string]string{"Retry-After": "0"}, 0},
		{map[string]string{"Retry-After": "-3"}, 0},
		{map[string]string{"Retry-After": "soon"}, 0},
		{map[string]string{"Retry-After": "99999999999999"}, retryAfterMax},
		{map[string]string{"Retry-After": now.Add(90 * time.Second).Format(http.TimeFormat)}, 90 * time.Second},
		{map[string]string{"Retry-After": now.Add(-time.Minute).Format(http.TimeFormat)}, 0},
		{map[string]string{"retry-after-ms": "250", "Retry-After": "9"}, 250 * time.Millisecond},
		{map[string]string{"x-ms-retry-after-ms": "1500"}, 1500 * time.Millisecond},
		{map[string]string{"x-ms-retry-after-ms": "9223372036854775807"}, retryAfterMax},
	} {
		r := &http.Response{Header: http.Header{}}
		for k, v := range c.header {
			r.Header.Set(k, v)
		}
		if got := retryAfter(r, now); got != c.want {
			t.Errorf("retryAfter(%v) = %v; want %v", c.header, got, c.want)
		}
	}
	if retryAfter(nil, now) != 0 {
		t.Error("retryAfter(nil) != 0")
	}
}
