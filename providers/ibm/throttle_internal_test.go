package ibm

import (
	"net/http"
	"testing"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
)

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
		{"1.5", 1500 * time.Millisecond},
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
