package aws

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/throttle"
)

// Endpoints, the keys of the loop's gates. Each rests on its own, so that throttled EC2 calls
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

// call runs op against endpoint ep through the portable loop (providers.Loop.CallN): it
// waits out ep's rest when that fits ctx, and a throttled or transient failure rests ep and
// is tried again (attempts in all); Classify says which failures those are.
func (p *Provider) call(ctx context.Context, ep string, attempts int, op func(context.Context) error) error {
	return p.loop.CallN(ctx, ep, attempts, op)
}

// Classify: a failure that named a Retry-After, a throttle or a transient failure rests the
// endpoint and is tried again; anything else (a bad request, denied credentials) neither.
func (d driver) Classify(err error) providers.Verdict {
	after, asked := retryAfter(err)
	if !asked && !retryable(err) {
		return providers.Permanent // the request is wrong, not the endpoint busy
	}
	if !asked {
		after = -1
	}
	return providers.Verdict{Rest: true, Retry: true, After: after}
}

var (
	retryables = retry.IsErrorRetryables(retry.DefaultRetryables)
	throttles  = retry.IsErrorThrottles(retry.DefaultThrottles)
)

// retryable: a throttle (by error code or HTTP 429) or a transient failure (5xx, a dropped
// connection), as the SDK's standard retryer classifies them, or a transient Auto Scaling code.
func retryable(err error) bool {
	var certErr *tls.CertificateVerificationError
	if errors.As(err, &certErr) {
		return false // the SDK would retry it; trying again changes nothing
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() == http.StatusTooManyRequests {
		return true
	}
	if code, _ := apiError(err); transientCodes[code] {
		return true
	}
	return throttles.IsErrorThrottle(err) == awssdk.TrueTernary || retryables.IsErrorRetryable(err) == awssdk.TrueTernary
}

// transientCodes are Auto Scaling's answers to a change that meets another in progress (a
// scaling activity, a pending update of the group): the same request succeeds once that is
// over. The SDK's retryer knows neither (ScalingActivityInProgress is an HTTP 400).
var transientCodes = map[string]bool{"ScalingActivityInProgress": true, "ResourceContention": true}

// retryAfter reads a Retry-After header (seconds or an HTTP date) off a failed response.
func retryAfter(err error) (time.Duration, bool) {
	var re *smithyhttp.ResponseError
	if !errors.As(err, &re) || re.Response == nil {
		return 0, false
	}
	return throttle.ParseRetryAfter(re.Response.Header.Get("Retry-After"), time.Now())
}
