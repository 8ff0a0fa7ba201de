package ibm

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
)

const (
	// baseBackoff is the first wait after an endpoint throttles without a Retry-After or
	// fails with a server error; it doubles per strike up to Config.MaxBackoff.
	baseBackoff = time.Second
	// maxStrikes bounds the strike count, so that the doubling can never overflow and a long
	// run of failures is forgotten after as many successes.
	maxStrikes = 8
	// maxAttempts bounds the requests one poll spends on one throttled page.
	maxAttempts = 3
)

// gate is one endpoint's backoff state. A failure sets notBefore; each failure in a row adds
// a strike (the next wait doubles), each success takes one away. There is no global counter:
// a throttled instances listing does not slow the memberships listing, and the state of one
// endpoint is bounded by maxStrikes and MaxBackoff whatever happens.
type gate struct {
	notBefore time.Time
	strikes   int
	// why is the failure that set notBefore, for the errors of polls that cannot wait.
	why string
}

// failed records a failure at now. wait is what the server asked for (a Retry-After), or
// negative when it did not say: then the exponential backoff applies. Either is capped.
func (g *gate) failed(now time.Time, wait, max time.Duration, why string) time.Duration {
	g.strikes = min(g.strikes+1, maxStrikes)
	if wait < 0 {
		wait = baseBackoff << (g.strikes - 1)
	}
	wait = min(wait, max)
	g.notBefore = now.Add(wait)
	g.why = why
	return wait
}

// succeeded decays the strikes: a recovered endpoint starts again gently, not at full
// backoff and not from nothing.
func (g *gate) succeeded() {
	g.strikes = max(g.strikes-1, 0)
}

// fits reports whether waiting d leaves the poll inside its deadline.
func fits(ctx context.Context, d time.Duration) bool {
	deadline, ok := ctx.Deadline()
	return !ok || time.Now().Add(d).Before(deadline)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// throttled reports whether an HTTP status asks the client to slow down.
func throttled(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable
}

// retryAfter is the wait a response asks for in its Retry-After header (seconds or an HTTP
// date), or -1 when it asks for none or the header is unreadable.
func retryAfter(resp *core.DetailedResponse, now time.Time) time.Duration {
	if resp == nil || resp.Headers == nil {
		return -1
	}
	v := strings.TrimSpace(resp.Headers.Get("Retry-After"))
	if v == "" {
		return -1
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s < 0 {
			return -1
		}
		// A day is already far beyond any cap; clamping first keeps the multiplication sane.
		return time.Duration(min(s, 86400)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return -1
}
