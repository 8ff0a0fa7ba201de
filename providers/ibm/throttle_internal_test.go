package ibm

import (
	"net/http"
	"testing"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
)

// TestGateBoundedAndDecaying: the backoff doubles per failure in a row, never passes its cap
// however many failures come (no counter grows without bound), and decays one strike per
// success.
func TestGateBoundedAndDecaying(t *testing.T) {
	var g gate
	now := time.Unix(1e9, 0)
	const cap = 30 * time.Second
	var waits []time.Duration
	for range 1000 {
		waits = append(waits, g.failed(now, -1, cap, "503"))
	}
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, cap, cap} {
		if waits[i] != want {
			t.Errorf("wait after %d failures: %v; want %v", i+1, waits[i], want)
		}
	}
	if g.strikes != maxStrikes || waits[999] != cap {
		t.Errorf("after 1000 failures: %d strikes, wait %v; want %d and %v", g.strikes, waits[999], maxStrikes, cap)
	}
	for range 1000 {
		g.succeeded()
	}
	if g.strikes != 0 {
		t.Errorf("after 1000 successes: %d strikes; want 0", g.strikes)
	}
	g.failed(now, -1, cap, "503")
	g.failed(now, -1, cap, "503")
	g.succeeded()
	if w := g.failed(now, -1, cap, "503"); w != 2*time.Second {
		t.Errorf("fail, fail, succeed, fail: wait %v; want 2s (one strike forgiven)", w)
	}
	if w := g.failed(now, 5*time.Second, cap, "429"); w != 5*time.Second || !g.notBefore.Equal(now.Add(5*time.Second)) {
		t.Errorf("Retry-After 5s: wait %v until %v; want 5s", w, g.notBefore)
	}
	if w := g.failed(now, time.Hour, cap, "429"); w != cap {
		t.Errorf("Retry-After 1h: wait %v; want the cap %v", w, cap)
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 10, 1, 8, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		header string
		want   time.Duration
	}{
		{"", -1},
		{"0", 0},
		{"7", 7 * time.Second},
		{" 3 ", 3 * time.Second},
		{"-4", -1},
		{"99999999999999999", 86400 * time.Second},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
		{"soon", -1},
	} {
		resp := &core.DetailedResponse{Headers: http.Header{}}
		if c.header != "" {
			resp.Headers.Set("Retry-After", c.header)
		}
		if got := retryAfter(resp, now); got != c.want {
			t.Errorf("Retry-After %q: %v; want %v", c.header, got, c.want)
		}
	}
	if got := retryAfter(nil, now); got != -1 {
		t.Errorf("no response: %v; want -1", got)
	}
}

// TestServiceURL: the region picks the public regional endpoint unless Endpoint is set.
func TestServiceURL(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Region: "us-south"}, "https://us-south.iaas.cloud.ibm.com/v1"},
		{Config{Region: "eu-de"}, "https://eu-de.iaas.cloud.ibm.com/v1"},
		{Config{Region: "xx-new"}, "https://xx-new.iaas.cloud.ibm.com/v1"},
		{Config{Region: "us-south", Endpoint: "https://us-south.private.iaas.cloud.ibm.com/v1/"}, "https://us-south.private.iaas.cloud.ibm.com/v1"},
	} {
		if got := c.cfg.serviceURL(); got != c.want {
			t.Errorf("%+v: %s; want %s", c.cfg, got, c.want)
		}
	}
}
