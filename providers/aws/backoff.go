package aws

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// Backoff of one endpoint. The SDK's own retryer is off (it does not read Retry-After, and a
// second retry layer would multiply the calls): these are the only retries in the provider.
const (
	// backoffMin is the wait after a first failure; each further failure doubles it…
	backoffMin = time.Second
	// …up to backoffMax, and each success halves it, back to zero.
	backoffMax = 30 * time.Second
	// retryAfterMax caps a server's Retry-After: a notice queue must not go deaf for an hour
	// because of one odd header.
	retryAfterMax = 2 * time.Minute
	// maxAttempts bounds the tries of one call within one poll (throttles and transient errors
	// only; anything else fails at once).
	maxAttempts = 3
)

// endpoint is the backoff state of one API endpoint (Auto Scaling, EC2, SQS). Each has its
// own, so that throttled EC2 calls hold back neither the notices nor a lifecycle completion.
// The backoff is a level that doubles per failure and halves per success, never a count that
// grows without bound. Guarded by Provider.mu.
type endpoint struct {
	name      string
	backoff   time.Duration // the next wait when the server names none; 0 while healthy
	notBefore time.Time     // no call before this
	why       error         // the failure that set notBefore
}

// failed records a failed call and returns how long the endpoint now rests: what the server
// asked for (Retry-After, capped at retryAfterMax) when it did, else the backoff, jittered.
func (e *endpoint) failed(now time.Time, err error, retryAfter time.Duration, asked bool) time.Duration {
	e.backoff = min(max(2*e.backoff, backoffMin), backoffMax)
	wait := e.backoff/2 + rand.N(e.backoff/2+1)
	if asked {
		wait = min(max(retryAfter, 0), retryAfterMax)
	}
	e.notBefore, e.why = now.Add(wait), err
	return wait
}

// succeeded decays the backoff and opens the endpoint.
func (e *endpoint) succeeded() {
	if e.backoff /= 2; e.backoff < backoffMin {
		e.backoff = 0
	}
	e.notBefore, e.why = time.Time{}, nil
}

// call runs op against e. It first waits out e's rest; a throttled or transient failure rests
// e and is tried again (attempts in all) after the wait the server asked for or e's backoff.
// Other failures (a bad request, denied credentials) neither rest e nor are tried again. A wait
// that would outlast ctx's deadline is not begun: the call fails at once and says until when
// the endpoint rests, and the next poll, not this one, calls it again.
func (p *Provider) call(ctx context.Context, e *endpoint, attempts int, op func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		if err := p.rest(ctx, e); err != nil {
			return err
		}
		err := op(ctx)
		if err == nil {
			p.mu.Lock()
			e.succeeded()
			p.mu.Unlock()
			return nil
		}
		if ctx.Err() != nil {
			if errors.Is(err, ctx.Err()) {
				return err
			}
			return fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		after, asked := retryAfter(err)
		if !asked && !retryable(err) {
			return err // the request is wrong, not the endpoint busy: nothing to back off from
		}
		p.mu.Lock()
		wait := e.failed(time.Now(), err, after, asked)
		p.mu.Unlock()
		if attempt >= attempts {
			return err
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return fmt.Errorf("%w (%s now rests %v before the next try, longer than this poll may wait)", err, e.name, wait.Round(time.Millisecond))
		}
		p.log.Debug("aws call failed; trying again", "endpoint", e.name, "attempt", attempt, "wait", wait, "error", err)
	}
}

// rest waits until e may be called, or fails at once when ctx would end first.
func (p *Provider) rest(ctx context.Context, e *endpoint) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	until, why := e.notBefore, e.why
	p.mu.Unlock()
	d := time.Until(until)
	if d <= 0 {
		return nil
	}
	if dl, ok := ctx.Deadline(); ok && dl.Before(until) {
		return fmt.Errorf("not called: %s is resting for another %v, longer than this poll may wait, after: %w",
			e.name, d.Round(time.Millisecond), why)
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

var (
	retryables = retry.IsErrorRetryables(retry.DefaultRetryables)
	throttles  = retry.IsErrorThrottles(retry.DefaultThrottles)
)

// retryable: a throttle (by error code or HTTP 429) or a transient failure (5xx, a dropped
// connection), as the SDK's standard retryer classifies them.
func retryable(err error) bool {
	var certErr *tls.CertificateVerificationError
	if errors.As(err, &certErr) {
		return false // the SDK would retry it; trying again changes nothing
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() == http.StatusTooManyRequests {
		return true
	}
	return throttles.IsErrorThrottle(err) == awssdk.TrueTernary || retryables.IsErrorRetryable(err) == awssdk.TrueTernary
}

// retryAfter reads a Retry-After header (seconds or an HTTP date) off a failed response.
func retryAfter(err error) (time.Duration, bool) {
	var re *smithyhttp.ResponseError
	if !errors.As(err, &re) || re.Response == nil {
		return 0, false
	}
	v := strings.TrimSpace(re.Response.Header.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 && s < 1e6 {
		return time.Duration(s * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0), true
	}
	return 0, false
}
