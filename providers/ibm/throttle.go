package ibm

import (
	"net/http"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"

	"github.com/elasticd/elasticd/providers/throttle"
)

// Each endpoint has its own gate (package throttle), capped by Config.MaxBackoff: a
// throttled instances listing does not slow the memberships listing, and the state of one
// endpoint stays bounded whatever happens. What is IBM's own is below.

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
	if d, ok := throttle.ParseRetryAfter(resp.Headers.Get("Retry-After"), now); ok {
		return d
	}
	return -1
}
