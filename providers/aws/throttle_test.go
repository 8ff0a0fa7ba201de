package aws_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers/aws"
)

// TestRetryAfter: a throttled call waits as long as the server asks, tries again and the poll
// succeeds; the other endpoint is not slowed.
func TestRetryAfter(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		flt  fault
	}{
		{"EC2RequestLimitExceeded", fault{status: 503, code: "RequestLimitExceeded", msg: "Request limit exceeded.", retryAfter: "1"}},
		{"HTTP429", fault{status: 429, code: "TooManyRequests", msg: "slow down", retryAfter: "1"}},
		{"HTTPDate", fault{status: 503, code: "RequestLimitExceeded", msg: "Request limit exceeded.", retryAfter: "date"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if c.flt.retryAfter == "date" { // 2 s from now, in whole seconds: 1-2 s
				c.flt.retryAfter = time.Now().Add(2 * time.Second).UTC().Format(http.TimeFormat)
			}
			f := newFake(t, inst(1), inst(2))
			f.fail("DescribeInstances", c.flt)
			p := newProvider(t, f, aws.Config{})
			start := time.Now()
			hosts := mustHosts(t, p)
			took := time.Since(start)
			if len(hosts) != 2 {
				t.Errorf("%d hosts after the throttle; want 2", len(hosts))
			}
			if took < 900*time.Millisecond || took > 3*time.Second {
				t.Errorf("the poll took %v; want the ~1 s the server asked for", took)
			}
			if a, e := f.count("DescribeAutoScalingGroups"), f.count("DescribeInstances"); a != 1 || e != 2 {
				t.Errorf("calls: autoscaling %d, ec2 %d; want 1 and 2 (the throttled one, then its retry)", a, e)
			}
			// Recovered: the next poll is not held back.
			start = time.Now()
			mustHosts(t, p)
			if took := time.Since(start); took > 200*time.Millisecond {
				t.Errorf("the poll after recovery took %v", took)
			}
		})
	}
}

// TestBackoffIsPerEndpoint: while EC2 rests after asking for 2 s, a poll whose deadline comes
// sooner fails at once without calling EC2, Auto Scaling and SQS are still called, and the
// first poll that can wait gets through once the rest is over.
func TestBackoffIsPerEndpoint(t *testing.T) {
	t.Parallel()
	f := newFake(t, inst(1))
	p := newProvider(t, f, aws.Config{SQSQueueURL: f.queueURL})
	f.failAlways("DescribeInstances", fault{status: 503, code: "RequestLimitExceeded", msg: "Request limit exceeded.", retryAfter: "2"})
	short := func() (time.Duration, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := p.Hosts(ctx)
		return time.Since(start), err
	}
	start := time.Now()
	took, err := short()
	if err == nil || !strings.Contains(err.Error(), "RequestLimitExceeded") || took > 300*time.Millisecond {
		t.Fatalf("first poll: %v after %v; want the throttle at once (its Retry-After outlasts the poll)", err, took)
	}
	t.Logf("throttled poll: %v", err)
	f.mu.Lock()
	delete(f.always, "DescribeInstances")
	f.mu.Unlock()

	took, err = short()
	if err == nil || !strings.Contains(err.Error(), "resting") || took > 300*time.Millisecond {
		t.Errorf("second poll: %v after %v; want at once an error saying ec2 rests", err, took)
	}
	t.Logf("poll while ec2 rests: %v", err)
	if a, e := f.count("DescribeAutoScalingGroups"), f.count("DescribeInstances"); a != 2 || e != 1 {
		t.Errorf("calls: autoscaling %d, ec2 %d; want 2 (it does not rest) and 1 (it does)", a, e)
	}
	if _, err := p.Notices(pollCtx(t)); err != nil {
		t.Errorf("notices while ec2 rests: %v", err)
	}

	hosts := mustHosts(t, p) // a 10 s poll waits out the rest
	if waited := time.Since(start); len(hosts) != 1 || waited < 1900*time.Millisecond {
		t.Errorf("poll after the rest: %d hosts, %v after the throttle; want 1 host, ≥ 2 s", len(hosts), waited)
	}
	if e := f.count("DescribeInstances"); e != 2 {
		t.Errorf("ec2 called %d times in all; want 2", e)
	}
}

// TestThrottleWithoutRetryAfter: throttles that name no wait are backed off (at least half a
// second, then a second) and the third attempt succeeds; one that persists fails the poll
// after three attempts.
func TestThrottleWithoutRetryAfter(t *testing.T) {
	t.Parallel()
	f := newFake(t, inst(1))
	throttle := fault{status: 400, code: "Throttling", msg: "Rate exceeded"}
	f.fail("DescribeAutoScalingGroups", throttle, throttle)
	p := newProvider(t, f, aws.Config{})
	start := time.Now()
	mustHosts(t, p)
	if took := time.Since(start); took < 1500*time.Millisecond || took > 4*time.Second {
		t.Errorf("took %v; want the backoff of 0.5-1 s, then 1-2 s", took)
	}
	if a := f.count("DescribeAutoScalingGroups"); a != 3 {
		t.Errorf("%d calls; want 3", a)
	}

	// A throttle that persists fails the poll after three attempts (short Retry-After: fast).
	f.resetCounts()
	f.failAlways("DescribeAutoScalingGroups", fault{status: 400, code: "Throttling", msg: "Rate exceeded", retryAfter: "0.1"})
	_, err := p.Hosts(pollCtx(t))
	if err == nil || !strings.Contains(err.Error(), "Throttling") {
		t.Errorf("persistent throttle: %v", err)
	}
	if a := f.count("DescribeAutoScalingGroups"); a != 3 {
		t.Errorf("persistent throttle: %d calls in one poll; want 3 (bounded)", a)
	}
}
