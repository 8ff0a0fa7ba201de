package aws

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/elasticd/elasticd/providers/throttle"
)

// Endpoints, the keys of Provider.gates. Each rests on its own, so that throttled EC2 calls
// hold back neither the notices nor a lifecycle completion. The SDK's own retryer is off (it
// does not read Retry-After, and a second retry layer would multiply the calls): these are
// the only retries in the provider.
const (
	epASG = "autoscaling"
	epEC2 = "ec2"
	epSQS = "sqs"
)

// maxAttempts bounds the tries of one call within one poll (throttles and transient errors
// only; anything else fails at once).
const maxAttempts = throttle.Tries

// call runs op against endpoint ep. It first waits out ep's rest; a throttled or transient
// failure rests ep and is tried again (attempts in all) after the wait the server asked for
// or ep's backoff. Other failures (a bad request, denied credentials) neither rest ep nor are
// tried again. A wait that would outlast ctx's deadline is not begun: the call fails at once
// and says until when the endpoint rests, and the next poll, not this one, calls it again.
func (p *Provider) call(ctx context.Context, ep string, attempts int, op func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		if err := p.gates.Wait(ctx, ep); err != nil {
			var te *throttle.Error
			if errors.As(err, &te) {
				return fmt.Errorf("not called: %w", err)
			}
			return err
		}
		err := op(ctx)
		if err == nil {
			p.gates.Succeeded(ep)
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
		if !asked {
			after = -1
		}
		wait := p.gates.Throttled(ep, after, err)
		if attempt >= attempts {
			return err
		}
		if p.gates.Ready(ctx, ep) != nil {
			return fmt.Errorf("%w (%s now rests %v before the next try, longer than this poll may wait)", err, ep, wait.Round(time.Millisecond))
		}
		p.log.Debug("aws call failed; trying again", "endpoint", ep, "attempt", attempt, "wait", wait, "error", err)
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
	return throttle.ParseRetryAfter(re.Response.Header.Get("Retry-After"), time.Now())
}
