package gcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/api/googleapi"
)

// ErrThrottled is wrapped by the error of a poll that the API turned away for now (HTTP 429,
// a rate-limit 403, 502/503/504) or that did not call it because it asked to wait longer than
// the poll could.
var ErrThrottled = errors.New("compute API asks to slow down")

// Throttling is answered per endpoint (each list method has its own gate), never with a
// counter that grows without bound: see seeds/001 for how that deadlocks.
const (
	// minBackoff and maxBackoff bound the wait after a throttled request that did not say
	// how long to wait: it doubles with each throttled request and halves with each success.
	minBackoff = time.Second
	maxBackoff = 30 * time.Second
	// maxRetryAfter bounds how long a Retry-After is honoured (a bad value must not stop
	// discovery for hours).
	maxRetryAfter = 2 * time.Minute
	// maxPollWait is the longest a poll waits for a gate before giving up on its own; a poll
	// also gives up when the wait would leave it less than waitMargin before its deadline.
	maxPollWait = 10 * time.Second
	waitMargin  = 500 * time.Millisecond
	// maxTries bounds the requests for one page within one poll (each after the wait the
	// server asked for).
	maxTries = 3
)

// Endpoints, the keys of gates.
const (
	epManaged   = "listManagedInstances"
	epInstances = "instances.list"
)

// gate is one endpoint's throttling state.
type gate struct {
	notBefore time.Time     // no request before this
	backoff   time.Duration // the last backoff; the next one is twice it, within the bounds
	last      time.Time     // when the endpoint last throttled us
}

type gates map[string]*gate

func (gs gates) get(ep string) *gate {
	g := gs[ep]
	if g == nil {
		g = &gate{}
		gs[ep] = g
	}
	return g
}

// throttled records a throttled request at now and returns how long the endpoint is closed:
// retryAfter when the server said (bounded by maxRetryAfter), else the doubled backoff.
func (g *gate) throttled(now time.Time, retryAfter time.Duration, said bool) time.Duration {
	if now.Sub(g.last) > maxBackoff {
		g.backoff = 0 // the last trouble is long past: start over
	}
	g.last = now
	g.backoff = min(max(2*g.backoff, minBackoff), maxBackoff)
	wait := g.backoff
	if said {
		wait = min(max(retryAfter, 0), maxRetryAfter)
	}
	g.notBefore = now.Add(wait)
	return wait
}

// ok records a successful request: the backoff decays.
func (g *gate) ok() {
	g.backoff /= 2
	if g.backoff < minBackoff {
		g.backoff = 0
	}
}

// wait blocks until ep's gate opens, or returns an error wrapping ErrThrottled at once when
// the wait would be longer than maxPollWait or run past ctx's deadline.
func (gs gates) wait(ctx context.Context, ep string) error {
	g := gs.get(ep)
	d := time.Until(g.notBefore)
	if d <= 0 {
		return nil
	}
	if dl, ok := ctx.Deadline(); d > maxPollWait || (ok && time.Until(dl) < d+waitMargin) {
		return fmt.Errorf("%s: %w: not asking again for %v (until %s)", ep, ErrThrottled,
			d.Round(time.Millisecond), g.notBefore.Format(time.RFC3339))
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// call makes one request through ep's gate. A throttled request closes the gate; when the
// server said how long to wait (Retry-After) and that fits in the poll, the request is made
// again after it, up to maxTries in all. Any other failure is returned as is.
func (p *Provider) call(ctx context.Context, ep string, do func(context.Context) error) error {
	g := p.gates.get(ep)
	var last error // the previous try's throttled answer
	for try := 1; ; try++ {
		if err := p.gates.wait(ctx, ep); err != nil {
			if last != nil {
				return fmt.Errorf("%w; the last answer: %w", err, last)
			}
			return err
		}
		err := do(ctx)
		if err == nil {
			g.ok()
			return nil
		}
		retryAfter, said, ok := throttling(err)
		if !ok || ctx.Err() != nil {
			return err
		}
		wait := g.throttled(time.Now(), retryAfter, said)
		p.log.Warn("compute API throttled discovery", "endpoint", ep, "status", httpCode(err),
			"retry_after", retryAfter, "said", said, "wait", wait, "try", try)
		if !said || try >= maxTries {
			return fmt.Errorf("%s: %w (try %d, waiting %v before the next): %w", ep, ErrThrottled, try, wait, err)
		}
		last = err
	}
}

// throttling reports whether err is the API asking to slow down, and the Retry-After it gave.
func throttling(err error) (retryAfter time.Duration, said, ok bool) {
	var ge *googleapi.Error
	if !errors.As(err, &ge) {
		return 0, false, false
	}
	switch ge.Code {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
	case http.StatusForbidden:
		if !rateLimited(ge) {
			return 0, false, false
		}
	default:
		return 0, false, false
	}
	retryAfter, said = parseRetryAfter(ge.Header.Get("Retry-After"), time.Now())
	return retryAfter, said, true
}

// rateLimited reports whether a 403 is a rate limit rather than a missing permission.
func rateLimited(ge *googleapi.Error) bool {
	for _, e := range ge.Errors {
		switch e.Reason {
		case "rateLimitExceeded", "userRateLimitExceeded":
			return true
		}
	}
	return false
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date (RFC 9110 §10.2.3).
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(n) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// httpCode is err's HTTP status, or 0.
func httpCode(err error) int {
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		return ge.Code
	}
	return 0
}
