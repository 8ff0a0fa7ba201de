package azure

import (
	"net/http"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers/throttle"
)

// The gates themselves are tested in package throttle; what is Azure's own is which
// headers name the wait.
func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 10, 2, 9, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		header map[string]string
		want   time.Duration
		said   bool
	}{
		{map[string]string{}, 0, false},
		{map[string]string{"Retry-After": "7"}, 7 * time.Second, true},
		{map[string]string{"Retry-After": "0"}, 0, true},
		{map[string]string{"Retry-After": "-3"}, 0, false},
		{map[string]string{"Retry-After": "soon"}, 0, false},
		{map[string]string{"Retry-After": now.Add(90 * time.Second).Format(http.TimeFormat)}, 90 * time.Second, true},
		{map[string]string{"Retry-After": now.Add(-time.Minute).Format(http.TimeFormat)}, 0, true},
		{map[string]string{"retry-after-ms": "250", "Retry-After": "9"}, 250 * time.Millisecond, true},
		{map[string]string{"x-ms-retry-after-ms": "1500"}, 1500 * time.Millisecond, true},
		{map[string]string{"x-ms-retry-after-ms": "-5", "Retry-After": "2"}, 2 * time.Second, true},
		{map[string]string{"x-ms-retry-after-ms": "9223372036854775807"}, throttle.DefaultMaxRetryAfter, true},
	} {
		r := &http.Response{Header: http.Header{}}
		for k, v := range c.header {
			r.Header.Set(k, v)
		}
		if got, said := retryAfter(r, now); got != c.want || said != c.said {
			t.Errorf("retryAfter(%v) = %v, %v; want %v, %v", c.header, got, said, c.want, c.said)
		}
	}
	if _, said := retryAfter(nil, now); said {
		t.Error("retryAfter(nil) says a wait")
	}
}
