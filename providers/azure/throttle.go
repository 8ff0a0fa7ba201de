package azure

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/throttle"
)

// ErrThrottled is wrapped by the error of a poll that Azure Resource Manager throttled, or
// that did not call an endpoint because that endpoint's back-off had not run out yet.
var ErrThrottled = errors.New("throttled by Azure Resource Manager")

// Throttling is answered at two levels. Inside one request the SDK's retry waits for a
// Retry-After that fits in the poll (it honours retry-after-ms, x-ms-retry-after-ms and
// Retry-After, and gives up at once on a longer one). Across polls each endpoint has a gate
// (package throttle): a request that still ends throttled closes that endpoint's gate for
// the server's Retry-After, or the endpoint's own back-off when it names none, and polls
// until then fail at once with ErrThrottled instead of calling it.

// Endpoints, the keys of the loop's gates, named as errors name them.
const (
	opScaleSet = "get scale set"
	opVMs      = "list scale set VMs"
	opNICs     = "list scale set network interfaces"
)

// open is nil when every endpoint may be called now: a poll needs all three, so one that
// cannot finish does not start, and none waits (the SDK does the waiting, within a request).
func (p *Provider) open() error {
	for _, op := range []string{opScaleSet, opVMs, opNICs} {
		var te *throttle.Error
		if err := p.loop.Open(op); errors.As(err, &te) {
			return fmt.Errorf("%s: %w; not calling it again for %v", op, ErrThrottled, te.Wait.Round(time.Millisecond))
		}
	}
	return nil
}

// Classify: a throttled response (HTTP 429, or 503 with a Retry-After) rests the endpoint
// for the server's Retry-After, or its own back-off; it is not retried here, as the SDK
// already retried it within the request.
func (d driver) Classify(err error) providers.Verdict {
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		return providers.Permanent
	}
	ra, said := retryAfter(re.RawResponse, time.Now())
	if re.StatusCode == http.StatusTooManyRequests || (re.StatusCode == http.StatusServiceUnavailable && said) {
		if !said {
			ra = -1
		}
		return providers.Verdict{Rest: true, After: ra}
	}
	return providers.Permanent
}

// retryAfter is how long the response asks to wait, and whether it says; the headers are
// those the SDK reads, in its order.
func retryAfter(resp *http.Response, now time.Time) (time.Duration, bool) {
	if resp == nil {
		return 0, false
	}
	for _, h := range []string{"retry-after-ms", "x-ms-retry-after-ms"} {
		if ms, err := strconv.ParseInt(resp.Header.Get(h), 10, 64); err == nil && ms >= 0 {
			return time.Duration(min(ms, int64(throttle.DefaultMaxRetryAfter/time.Millisecond))) * time.Millisecond, true
		}
	}
	return throttle.ParseRetryAfter(resp.Header.Get("Retry-After"), now)
}
