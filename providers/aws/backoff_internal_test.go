package aws

import (
	"errors"
	"testing"
	"time"
)

// TestBackoffBoundedAndDecaying: the backoff doubles per failure up to backoffMax however many
// failures there are, a Retry-After is honoured up to retryAfterMax, and successes bring the
// backoff back to zero.
func TestBackoffBoundedAndDecaying(t *testing.T) {
	var e endpoint
	now := time.Now()
	boom := errors.New("throttled")
	for i := range 1000 {
		wait := e.failed(now, boom, 0, false)
		if e.backoff > backoffMax || wait > backoffMax || wait < e.backoff/2 {
			t.Fatalf("failure %d: backoff %v, wait %v; want wait in [backoff/2, backoff] and backoff <= %v", i+1, e.backoff, wait, backoffMax)
		}
	}
	if e.backoff != backoffMax {
		t.Errorf("after 1000 failures the backoff is %v; want it held at %v", e.backoff, backoffMax)
	}
	if wait := e.failed(now, boom, time.Hour, true); wait != retryAfterMax {
		t.Errorf("Retry-After 1h: wait %v; want the cap %v", wait, retryAfterMax)
	}
	if wait := e.failed(now, boom, 3*time.Second, true); wait != 3*time.Second || !e.notBefore.Equal(now.Add(3*time.Second)) {
		t.Errorf("Retry-After 3s: wait %v, rest until %v; want exactly what the server asked", wait, e.notBefore.Sub(now))
	}
	steps := 0
	for e.backoff > 0 {
		e.succeeded()
		steps++
		if steps > 10 {
			t.Fatalf("backoff %v after %d successes; want it to decay to 0", e.backoff, steps)
		}
	}
	if !e.notBefore.IsZero() || e.why != nil {
		t.Error("a success must open the endpoint")
	}
	if wait := e.failed(now, boom, 0, false); wait > backoffMin {
		t.Errorf("first failure after recovery: wait %v; want at most %v", wait, backoffMin)
	}
}
