package gcp

import (
	"context"
	"errors"
	"net/http"
	"time"

	"google.golang.org/api/googleapi"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/throttle"
)

// ErrThrottled is wrapped by the error of a poll that the API turned away for now (HTTP 429,
// a rate-limit 403, 502/503/504) or that did not call it because it asked to wait longer than
// the poll could.
var ErrThrottled = errors.New("compute API asks to slow down")

// Endpoints, each with its own gate in the portable loop (package throttle), never a counter
// that grows without bound: see seeds/001 for how that deadlocks.
const (
	epManaged   = "listManagedInstances"
	epInstances = "instances.list"

	// The capacity calls' (capacity.go).
	epGet        = "instanceGroupManagers.get"
	epAutoscaler = "autoscalers.get"
	epResize     = "instanceGroupManagers.resize"
	epRecreate   = "instanceGroupManagers.recreateInstances"
	epErrors     = "instanceGroupManagers.listErrors"
	epOperation  = "operations.get"
)

// call makes one request through ep's gate (providers.Loop.Call). A throttled request
// closes the gate; when the server said how long to wait (Retry-After) and that fits in the
// poll, the request is made again after it, up to throttle.Tries in all. A throttled error
// wraps ErrThrottled; any other failure is returned as is.
func (p *Provider) call(ctx context.Context, ep string, do func(context.Context) error) error {
	return p.loop.Call(ctx, ep, do)
}

// Classify: the API asking to slow down rests the endpoint; it is asked again within the
// poll only when it said how long to wait.
func (d driver) Classify(err error) providers.Verdict {
	retryAfter, said, ok := throttling(err)
	if !ok {
		return providers.Permanent
	}
	if !said {
		retryAfter = -1
	}
	return providers.Verdict{Rest: true, Retry: said, After: retryAfter}
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
