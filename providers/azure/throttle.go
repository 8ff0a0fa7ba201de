package azure

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
)

// ErrThrottled is wrapped by the error of a poll that Azure Resource Manager throttled, or
// that did not call an endpoint because that endpoint's back-off had not run out yet.
var ErrThrottled = errors.New("throttled by Azure Resource Manager")

// Throttling is answered at two levels. Inside one request the SDK's retry waits for a
// Retry-After that fits in the poll (it honours retry-after-ms, x-ms-retry-after-ms and
// Retry-After, and gives up at once on a longer one). Across polls each endpoint has a gate:
// a request that still ends throttled closes that endpoint's gate for the longer of the
// server's Retry-After and the endpoint's own back-off, and polls until then fail at once
// with ErrThrottled instead of calling it. The back-off doubles with each throttled
// response, is capped, and steps down with each successful call: state per endpoint, never
// a counter that grows without bound (a throttled VM listing says nothing about the NICs).
const (
	backoffBase = time.Second
	backoffMax  = time.Minute
	// maxLevel is where backoffBase<<level passes backoffMax; level stops there.
	maxLevel = 6
	// retryAfterMax bounds a server's Retry-After: one that asks for hours is a bug, and
	// discovery must come back by itself.
	retryAfterMax = 5 * time.Minute
)

// gate is the throttling state of one endpoint.
type gate struct {
	name  string
	level int       // 0…maxLevel: up one per throttled response, down one per success
	until time.Time // no call before this
}

// open is nil when the endpoint may be called at now, else a *throttledError.
func (g *gate) open(now time.Time) error {
	if wait := g.until.Sub(now); wait > 0 {
		return &throttledError{endpoint: g.name, wait: wait}
	}
	return nil
}

// throttled closes the gate after a throttled response and returns for how long.
func (g *gate) throttled(now time.Time, retryAfter time.Duration) time.Duration {
	wait := max(min(backoffBase<<g.level, backoffMax), min(retryAfter, retryAfterMax))
	g.level = min(g.level+1, maxLevel)
	g.until = now.Add(wait)
	return wait
}

func (g *gate) succeeded() {
	if g.level > 0 {
		g.level--
	}
}

// gates are the provider's endpoints.
type gates struct{ scaleSet, vms, nics *gate }

// open is nil when every endpoint may be called: a poll needs all three, so one that
// cannot finish does not start.
func (gs gates) open(now time.Time) error {
	for _, g := range []*gate{gs.scaleSet, gs.vms, gs.nics} {
		if err := g.open(now); err != nil {
			return err
		}
	}
	return nil
}

type throttledError struct {
	endpoint string
	wait     time.Duration
}

func (e *throttledError) Error() string {
	return fmt.Sprintf("%s: throttled by Azure Resource Manager; not calling it again for %v", e.endpoint, e.wait.Round(time.Millisecond))
}

func (e *throttledError) Is(target error) bool { return target == ErrThrottled }

// observe closes g when err is a throttled response: HTTP 429, or 503 with a Retry-After.
func (p *Provider) observe(g *gate, err error) {
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		return
	}
	now := time.Now()
	ra := retryAfter(re.RawResponse, now)
	if re.StatusCode == http.StatusTooManyRequests || (re.StatusCode == http.StatusServiceUnavailable && ra > 0) {
		wait := g.throttled(now, ra)
		p.log.Warn("Azure Resource Manager throttled discovery; backing off",
			"endpoint", g.name, "status", re.StatusCode, "retry_after", ra, "wait", wait, "level", g.level)
	}
}

// retryAfter is how long the response asks to wait, 0 when it does not say; the headers are
// those the SDK reads, in its order.
func retryAfter(resp *http.Response, now time.Time) time.Duration {
	if resp == nil {
		return 0
	}
	for _, h := range []string{"retry-after-ms", "x-ms-retry-after-ms"} {
		if ms, err := strconv.ParseInt(resp.Header.Get(h), 10, 64); err == nil {
			return clampWait(time.Duration(min(ms, int64(retryAfterMax/time.Millisecond))) * time.Millisecond)
		}
	}
	v := resp.Header.Get("Retry-After")
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		return clampWait(time.Duration(min(s, int64(retryAfterMax/time.Second))) * time.Second)
	}
	if t, err := http.ParseTime(v); err == nil {
		return clampWait(t.Sub(now))
	}
	return 0
}

func clampWait(d time.Duration) time.Duration { return min(max(d, 0), retryAfterMax) }
