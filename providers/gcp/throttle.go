package gcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/api/googleapi"

	"github.com/elasticd/elasticd/providers/throttle"
)

// ErrThrottled is wrapped by the error of a poll that the API turned away for now (HTTP 429,
// a rate-limit 403, 502/503/504) or that did not call it because it asked to wait longer than
// the poll could.
var ErrThrottled = errors.New("compute API asks to slow down")

// Endpoints, the keys of Provider.gates: each list method has its own gate (package
// throttle), never a counter that grows without bound: see seeds/001 for how that deadlocks.
const (
	epManaged   = "listManagedInstances"
	epInstances = "instances.list"
)

// call makes one request through ep's gate. A throttled request closes the gate; when the
// server said how long to wait (Retry-After) and that fits in the poll, the request is made
// again after it, up to throttle.Tries in all. Any other failure is returned as is.
func (p *Provider) call(ctx context.Context, ep string, do func(context.Context) error) error {
	var last error // the previous try's throttled answer
	for try := 1; ; try++ {
		if err := p.wait(ctx, ep); err != nil {
			if last != nil {
				return fmt.Errorf("%w; the last answer: %w", err, last)
			}
			return err
		}
		err := do(ctx)
		if err == nil {
			p.gates.Succeeded(ep)
			return nil
		}
		retryAfter, said, ok := throttling(err)
		if !ok || ctx.Err() != nil {
			return err
		}
		if !said {
			retryAfter = -1
		}
		wait := p.gates.Throttled(ep, retryAfter, err)
		p.log.Warn("compute API throttled discovery", "endpoint", ep, "status", httpCode(err),
			"retry_after", retryAfter, "said", said, "wait", wait, "try", try)
		if !said || try >= throttle.Tries {
			return fmt.Errorf("%s: %w (try %d, waiting %v before the next): %w", ep, ErrThrottled, try, wait, err)
		}
		last = err
	}
}

// wait waits for ep's gate, or says in terms of ErrThrottled why it does not.
func (p *Provider) wait(ctx context.Context, ep string) error {
	err := p.gates.Wait(ctx, ep)
	var te *throttle.Error
	if errors.As(err, &te) {
		return fmt.Errorf("%s: %w: not asking again for %v (until %s)", ep, ErrThrottled,
			te.Wait.Round(time.Millisecond), te.Until.Format(time.RFC3339))
	}
	return err
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
	retryAfter, said = throttle.ParseRetryAfter(ge.Header.Get("Retry-After"), time.Now())
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

// httpCode is err's HTTP status, or 0.
func httpCode(err error) int {
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		return ge.Code
	}
	return 0
}
