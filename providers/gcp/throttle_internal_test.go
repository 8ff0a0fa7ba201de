package gcp

import (
	"testing"
	"time"
)

// The backoff of one endpoint is bounded however long the throttling lasts, decays with
// successes, and starts over once the trouble is long past (seeds/001: no counter that grows
// without bound).
func TestGateBackoffIsBoundedAndDecays(t *testing.T) {
	var g gate
	now := time.Unix(1_000_000, 0)
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}
	for i, w := range want {
		if got := g.throttled(now, 0, false); got != w {
			t.Fatalf("throttle %d: wait %v; want %v", i+1, got, w)
		}
		now = now.Add(time.Second)
	}
	for range 10_000 {
		if got := g.throttled(now, 0, false); got > maxBackoff {
			t.Fatalf("wait %v after many throttles; want at most %v", got, maxBackoff)
		}
		now = now.Add(time.Millisecond)
	}
	if g.backoff != maxBackoff {
		t.Fatalf("backoff %v after many throttles; want the cap %v", g.backoff, maxBackoff)
	}
	for range 7 { // 30s halves to under 1s in 5 steps, then to 0
		g.ok()
	}
	if g.backoff != 0 {
		t.Errorf("backoff %v after 7 successes; want 0", g.backoff)
	}

	g = gate{}
	g.throttled(now, 0, false)
	g.throttled(now, 0, false) // 2s
	if got := g.throttled(now.Add(2*maxBackoff), 0, false); got != minBackoff {
		t.Errorf("a throttle long after the last: wait %v; want a fresh %v", got, minBackoff)
	}
}

func TestGateHonoursRetryAfter(t *testing.T) {
	var g gate
	now := time.Unix(1_000_000, 0)
	for _, c := range []struct{ said, want time.Duration }{
		{3 * time.Second, 3 * time.Second},
		{0, 0},
		{time.Hour, maxRetryAfter},
		{-time.Second, 0},
	} {
		if got := g.throttled(now, c.said, true); got != c.want || !g.notBefore.Equal(now.Add(c.want)) {
			t.Errorf("Retry-After %v: wait %v until %v; want %v", c.said, got, g.notBefore.Sub(now), c.want)
		}
	}
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
		{"-3", 0, false},
		{"1.5", 0, false},
		{"99999999999999", 0, false},
		{"Sun, 01 Mar 2026 12:00:30 GMT", 30 * time.Second, true},
		{"Sun, 01 Mar 2026 11:00:00 GMT", 0, true}, // in the past: no wait
		{"soon", 0, false},
	} {
		got, ok := parseRetryAfter(c.v, now)
		if got != c.want || ok != c.ok {
			t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", c.v, got, ok, c.want, c.ok)
		}
	}
}

func TestNameFilterAndURLs(t *testing.T) {
	for _, c := range []struct {
		url        string
		zone, name string
		ok         bool
	}{
		{"https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a/instances/gpu-1", "us-central1-a", "gpu-1", true},
		{"projects/p/zones/z/instances/n", "z", "n", true},
		{"https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a/instances/", "", "", false},
		{"https://www.googleapis.com/compute/v1/projects/p/regions/r/instances/n", "", "", false},
		{"", "", "", false},
		{"n", "", "", false},
	} {
		zone, name, ok := zoneAndName(c.url)
		if zone != c.zone || name != c.name || ok != c.ok {
			t.Errorf("zoneAndName(%q) = %q, %q, %v; want %q, %q, %v", c.url, zone, name, ok, c.zone, c.name, c.ok)
		}
	}
}
