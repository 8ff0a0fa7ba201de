package aws_test

import (
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/aws"
)

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestFirstPollErrors: what a user can get wrong reads as what to fix, with the group and the
// region named.
func TestFirstPollErrors(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(*fakeAWS)
		want  []string
	}{
		{"GroupNotFound", func(f *fakeAWS) { f.exists = false },
			[]string{`auto scaling group "gpu-workers" in us-east-1`, "not found", "--asg", "--region"}},
		{"CredentialsRejected", func(f *fakeAWS) {
			f.always["DescribeAutoScalingGroups"] = fault{status: 403, code: "InvalidClientTokenId", msg: "The security token included in the request is invalid."}
		}, []string{`"gpu-workers" in us-east-1`, "InvalidClientTokenId", "rejected the credentials"}},
		{"ExpiredToken", func(f *fakeAWS) {
			f.always["DescribeAutoScalingGroups"] = fault{status: 403, code: "ExpiredToken", msg: "The security token included in the request is expired"}
		}, []string{`"gpu-workers" in us-east-1`, "ExpiredToken", "rejected the credentials"}},
		{"EC2Denied", func(f *fakeAWS) {
			f.always["DescribeInstances"] = fault{status: 403, code: "UnauthorizedOperation", msg: "You are not authorized to perform this operation."}
		}, []string{`"gpu-workers" in us-east-1`, "UnauthorizedOperation", "ec2:DescribeInstances"}},
		{"AutoScalingDenied", func(f *fakeAWS) {
			f.always["DescribeAutoScalingGroups"] = fault{status: 403, code: "AccessDenied", msg: "not authorized to perform: autoscaling:DescribeAutoScalingGroups"}
		}, []string{`"gpu-workers" in us-east-1`, "autoscaling:DescribeAutoScalingGroups", "IAM role"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, inst(1))
			f.change(func() { c.setup(f) })
			p := newProvider(t, f, aws.Config{})
			start := time.Now()
			hosts, err := p.Hosts(pollCtx(t))
			if err == nil || hosts != nil {
				t.Fatalf("Hosts: %v, %v; want an error and no hosts", hosts, err)
			}
			if !containsAll(err.Error(), c.want...) {
				t.Errorf("error %q\nwant it to contain %q", err, c.want)
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("took %v: an error a retry cannot fix must not be retried", took)
			}
			t.Logf("the error reads: %v", err)
		})
	}
}

// TestNoCredentials: with nothing in the default chain the first poll says so, names the
// group and region, and nothing reaches the API.
func TestNoCredentials(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	f := newFake(t, inst(1))
	p := newProvider(t, f, aws.Config{})
	_, err := p.Hosts(pollCtx(t))
	if err == nil || !containsAll(err.Error(), `"gpu-workers" in us-east-1`, "no usable AWS credentials", "AWS_PROFILE") {
		t.Fatalf("Hosts without credentials: %v", err)
	}
	if n := f.count("DescribeAutoScalingGroups"); n != 0 {
		t.Errorf("%d unsigned calls reached the API", n)
	}
	t.Logf("the error reads: %v", err)
}

// TestMalformedResponses: bodies that are not what the API sends give a clear error and no
// panic; partial ones give what can be trusted.
func TestMalformedResponses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, op string
		flt      fault
		want     string
	}{
		{"TruncatedXML", "DescribeAutoScalingGroups", fault{file: "asg_truncated.xml"}, "DescribeAutoScalingGroups"},
		{"HTMLFromAProxy", "DescribeInstances", fault{file: "bad_gateway.html"}, "EC2 describes none of the group's 1 in-service"},
		{"HTML502FromAProxy", "DescribeInstances", fault{status: 502, file: "bad_gateway.html"}, "502"},
		{"BadTimestamp", "DescribeInstances", fault{file: "ec2_bad_time.xml"}, "DescribeInstances"},
		{"RepeatedPageToken", "DescribeInstances", fault{file: "ec2_repeated_token.xml"}, "repeated page token"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, inst(1))
			f.failAlways(c.op, c.flt)
			hosts, err := newProvider(t, f, aws.Config{}).Hosts(pollCtx(t))
			if err == nil || hosts != nil {
				t.Fatalf("Hosts: %v, %v; want an error and no hosts", hosts, err)
			}
			if !containsAll(err.Error(), `"gpu-workers" in us-east-1`, c.want) {
				t.Errorf("error %q; want it to name the group and contain %q", err, c.want)
			}
			t.Logf("the error reads: %v", err)
		})
	}

	t.Run("Partial", func(t *testing.T) {
		// The group lists an instance without an ID (skipped), one without a lifecycle state
		// (not in service), and three in service; EC2 describes one without an ID (ignored),
		// one without a state (skipped), one without type, zone or launch time (the group's
		// type and zone), and one with a type but no zone.
		f := newFake(t)
		f.failAlways("DescribeAutoScalingGroups", fault{file: "asg_partial.xml"})
		f.failAlways("DescribeInstances", fault{file: "ec2_partial.xml"})
		hosts, err := newProvider(t, f, aws.Config{}).Hosts(pollCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		sameHosts(t, "partial", hosts, []providers.Host{
			{ID: "i-0aaaaaaaaaaaaaaa3", Addr: "10.1.0.3", Slots: 4, Zone: "us-east-1c", Type: "g5.12xlarge"},
			{ID: "i-0aaaaaaaaaaaaaaa5", Addr: "10.1.0.5", Slots: 8, Type: "p5.48xlarge"},
		})
	})
}
