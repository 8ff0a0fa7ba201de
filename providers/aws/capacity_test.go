package aws_test

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/smithy-go"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/aws"
	"github.com/elasticd/elasticd/providers/providertest"
)

// capacityFake is a group of three in-service instances sized min 1, desired 3, max 6, with
// the launches that made them an hour and more ago.
func capacityFake(t *testing.T) *fakeAWS {
	f := newFake(t, inst(1), inst(2), inst(3))
	f.setSize(1, 3, 6)
	for i, in := range f.insts {
		at := time.Now().Add(-2*time.Hour + time.Duration(i)*time.Minute)
		f.addActivity(fakeActivity{
			Description: "Launching a new EC2 instance: " + in.ID,
			Cause:       "At " + at.UTC().Format(time.RFC3339) + " an instance was started in response to a difference between desired and actual capacity, increasing the capacity from 0 to 3.",
			StatusCode:  "Successful", Details: `{"Subnet ID":"subnet-0123456789abcdef0","Availability Zone":"` + in.Zone + `"}`,
			Start: at, End: at.Add(40 * time.Second), Progress: 100,
		})
	}
	return f
}

func TestCapacityConformance(t *testing.T) {
	providertest.RunCapacity(t, providertest.CapacityHarness{NewGroup: func(t *testing.T) providertest.CapacityGroup {
		f := capacityFake(t)
		return providertest.CapacityGroup{
			Provider: newProvider(t, f, aws.Config{}),
			Desired:  func(t *testing.T) int { _, d, _ := f.size(); return d },
			Min:      func(t *testing.T) int { m, _, _ := f.size(); return m },
			Replaced: func(t *testing.T) []string { return f.terminatedIDs() },
			RunOut:   func(t *testing.T) { f.runOut("us-east-1b") },
			Deny: func(t *testing.T) {
				f.deny("SetDesiredCapacity", "UpdateAutoScalingGroup", "TerminateInstanceInAutoScalingGroup", "CreateOrUpdateTags", "DeleteTags")
			},
			Stall: func(t *testing.T) {
				f.mu.Lock()
				f.stall = true
				f.mu.Unlock()
			},
		}
	}})
}

// mutations are the capacity calls that change the group.
var mutations = []string{"SetDesiredCapacity", "UpdateAutoScalingGroup", "TerminateInstanceInAutoScalingGroup"}

// sent is what the fake received of op, one url.Values per call.
func (f *fakeAWS) sent(op string) []url.Values {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.inputs[op])
}

// sameParams compares a request's parameters, Action and Version aside, with want.
func sameParams(t *testing.T, op string, got url.Values, want map[string]string) {
	t.Helper()
	have := map[string]string{}
	for k := range got {
		if k != "Action" && k != "Version" {
			have[k] = got.Get(k)
		}
	}
	if len(have) != len(want) {
		t.Errorf("%s sent %v; want exactly %v", op, have, want)
		return
	}
	for k, v := range want {
		if have[k] != v {
			t.Errorf("%s sent %s=%q; want %q (all: %v)", op, k, have[k], v, have)
		}
	}
}

// TestSetDesiredRequests: which call SetDesired makes, with exactly which parameters, and
// what the group holds after it.
func TestSetDesiredRequests(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		n         int
		op        string            // the one mutating call; "" for none
		params    map[string]string // its parameters
		min, want int               // the group's minimum and desired size after it
		err       error
	}{
		{"Raise", 5, "SetDesiredCapacity", map[string]string{"AutoScalingGroupName": fakeGroup, "DesiredCapacity": "5", "HonorCooldown": "false"}, 1, 5, nil},
		{"RaiseToMax", 6, "SetDesiredCapacity", map[string]string{"AutoScalingGroupName": fakeGroup, "DesiredCapacity": "6", "HonorCooldown": "false"}, 1, 6, nil},
		{"LowerToMin", 1, "SetDesiredCapacity", map[string]string{"AutoScalingGroupName": fakeGroup, "DesiredCapacity": "1", "HonorCooldown": "false"}, 1, 1, nil},
		{"LowerBelowMin", 0, "UpdateAutoScalingGroup", map[string]string{"AutoScalingGroupName": fakeGroup, "MinSize": "0", "DesiredCapacity": "0"}, 0, 0, nil},
		{"Unchanged", 3, "", nil, 1, 3, nil},
		{"AboveMax", 7, "", nil, 1, 3, providers.ErrAboveMax},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := capacityFake(t)
			p := newProvider(t, f, aws.Config{})
			err := p.SetDesired(pollCtx(t), c.n)
			if c.err == nil && err != nil || !errors.Is(err, c.err) {
				t.Fatalf("SetDesired(%d): %v; want %v", c.n, err, c.err)
			}
			if err != nil {
				t.Logf("the error reads: %v", err)
			}
			for _, op := range mutations {
				got := f.sent(op)
				switch {
				case op == c.op && len(got) != 1:
					t.Errorf("%d %s calls; want 1", len(got), op)
				case op == c.op:
					sameParams(t, op, got[0], c.params)
				case len(got) != 0:
					t.Errorf("%s called (%v); want no call of it", op, got)
				}
			}
			if n := f.count("DescribeAutoScalingGroups"); n != 1 {
				t.Errorf("%d DescribeAutoScalingGroups calls; want 1 (the read before the change)", n)
			}
			if min, desired, max := f.size(); min != c.min || desired != c.want || max != 6 {
				t.Errorf("the group holds min %d, desired %d, max %d; want %d, %d, 6", min, desired, max, c.min, c.want)
			}
		})
	}
}

// TestCapacityErrors: what each error Auto Scaling answers the capacity calls means.
func TestCapacityErrors(t *testing.T) {
	t.Parallel()
	denied := func(op string) fault {
		return fault{status: 403, code: "AccessDenied", msg: "User: arn:aws:sts::123456789012:assumed-role/x/y is not authorized to perform: autoscaling:" + op +
			" on resource: " + fakeGroupARN + fakeGroup}
	}
	setDesired := func(n int) func(context.Context, *aws.Provider) error {
		return func(ctx context.Context, p *aws.Provider) error { return p.SetDesired(ctx, n) }
	}
	replace := func(ctx context.Context, p *aws.Provider) error { return p.Replace(ctx, inst(2).ID) }
	failures := func(ctx context.Context, p *aws.Provider) error { _, err := p.LaunchFailures(ctx); return err }
	size := func(ctx context.Context, p *aws.Provider) error { _, err := p.GroupSize(ctx); return err }
	for _, c := range []struct {
		name   string
		op     string // the operation that fails
		faults []fault
		call   func(context.Context, *aws.Provider) error
		is     error    // nil: the call succeeds
		isNot  error    // what the error must not wrap
		want   []string // in the error
		calls  int      // of op
	}{
		{"SetDesiredAccessDenied", "SetDesiredCapacity", []fault{denied("SetDesiredCapacity")}, setDesired(4),
			providers.ErrRefused, nil, []string{"set the desired capacity to 4 refused (needs autoscaling:SetDesiredCapacity)", "AccessDenied"}, 1},
		{"SetDesiredAccessDeniedException", "SetDesiredCapacity", []fault{{status: 400, code: "AccessDeniedException", msg: "denied"}}, setDesired(4),
			providers.ErrRefused, nil, []string{"needs autoscaling:SetDesiredCapacity"}, 1},
		{"SetDesiredUnauthorizedOperation", "SetDesiredCapacity", []fault{{status: 403, code: "UnauthorizedOperation", msg: "You are not authorized to perform this operation."}}, setDesired(4),
			providers.ErrRefused, nil, []string{"needs autoscaling:SetDesiredCapacity"}, 1},
		{"SetDesiredAboveMaxSinceRead", "SetDesiredCapacity", []fault{{status: 400, code: "ValidationError", msg: "New SetDesiredCapacity value 5 is above max value 4 for the AutoScalingGroup."}}, setDesired(5),
			providers.ErrAboveMax, providers.ErrRefused, []string{"set the desired capacity to 5", "above max value 4"}, 1},
		{"SetDesiredBelowMinSinceRead", "SetDesiredCapacity", []fault{{status: 400, code: "ValidationError", msg: "New SetDesiredCapacity value 2 is below min value 3 for the AutoScalingGroup."}}, setDesired(2),
			providers.ErrRefused, providers.ErrAboveMax, []string{"set the desired capacity to 2 refused", "below min value 3"}, 1},
		{"ScalingActivityInProgress", "SetDesiredCapacity", []fault{{status: 400, code: "ScalingActivityInProgress", msg: "Scaling activity 1f0c9d8e is in progress and blocks this action."}}, setDesired(4),
			nil, nil, nil, 2},
		{"ResourceContention", "SetDesiredCapacity", []fault{{status: 500, code: "ResourceContention", msg: "You already have a pending update to an Auto Scaling resource (for example, a group, instance, or load balancer)."}}, setDesired(4),
			nil, nil, nil, 2},
		{"ScalingActivityInProgressStill", "SetDesiredCapacity", slices.Repeat([]fault{{status: 400, code: "ScalingActivityInProgress", msg: "Scaling activity 1f0c9d8e is in progress and blocks this action."}}, 3), setDesired(4),
			errAny, providers.ErrRefused, []string{"3 tries", "ScalingActivityInProgress"}, 3},
		{"UpdateAccessDenied", "UpdateAutoScalingGroup", []fault{denied("UpdateAutoScalingGroup")}, setDesired(0),
			providers.ErrRefused, nil, []string{"lower the minimum size from 1 to 0 with the desired capacity refused (needs autoscaling:UpdateAutoScalingGroup)"}, 1},
		{"UpdateValidation", "UpdateAutoScalingGroup", []fault{{status: 400, code: "ValidationError", msg: "Desired capacity:0 must be between the specified min size:1 and max size:0"}}, setDesired(0),
			providers.ErrRefused, providers.ErrAboveMax, []string{"must be between"}, 1},
		{"ReplaceAccessDenied", "TerminateInstanceInAutoScalingGroup", []fault{denied("TerminateInstanceInAutoScalingGroup")}, replace,
			providers.ErrRefused, nil, []string{"replace " + inst(2).ID + " refused (needs autoscaling:TerminateInstanceInAutoScalingGroup)"}, 1},
		{"ReplaceGoneSinceRead", "TerminateInstanceInAutoScalingGroup", []fault{{status: 400, code: "ValidationError", msg: "Instance Id not found - No managed instance found for instance ID: " + inst(2).ID}}, replace,
			providers.ErrNotInGroup, providers.ErrRefused, []string{"replace " + inst(2).ID, "No managed instance found"}, 1},
		{"ReplaceOtherValidation", "TerminateInstanceInAutoScalingGroup", []fault{{status: 400, code: "ValidationError", msg: "The instance " + inst(2).ID + " is in a warm pool."}}, replace,
			providers.ErrRefused, providers.ErrNotInGroup, []string{"warm pool"}, 1},
		{"ReplaceScalingActivityInProgress", "TerminateInstanceInAutoScalingGroup", []fault{{status: 400, code: "ScalingActivityInProgress", msg: "in progress"}}, replace,
			nil, nil, nil, 2},
		{"LaunchFailuresAccessDenied", "DescribeScalingActivities", []fault{denied("DescribeScalingActivities")}, failures,
			providers.ErrRefused, nil, []string{"list the scaling activities refused (needs autoscaling:DescribeScalingActivities)"}, 1},
		{"GroupSizeAccessDenied", "DescribeAutoScalingGroups", []fault{denied("DescribeAutoScalingGroups")}, size,
			providers.ErrRefused, nil, []string{"read the group refused (needs autoscaling:DescribeAutoScalingGroups)"}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := capacityFake(t)
			f.fail(c.op, c.faults...)
			p := newProvider(t, f, aws.Config{})
			start := time.Now()
			err := c.call(pollCtx(t), p)
			if took := time.Since(start); c.is == nil && c.calls > 1 && took < 400*time.Millisecond {
				t.Errorf("retried after %v; want the endpoint to rest first (0.5-1 s)", took)
			}
			switch {
			case c.is == nil && err != nil:
				t.Fatalf("error %v; want success after the retry", err)
			case c.is == errAny && err == nil, c.is != nil && c.is != errAny && !errors.Is(err, c.is):
				t.Fatalf("error %v; want one wrapping %v", err, c.is)
			case c.isNot != nil && errors.Is(err, c.isNot):
				t.Errorf("error %v wraps %v", err, c.isNot)
			}
			if err != nil {
				if !strings.HasPrefix(err.Error(), `aws: auto scaling group "gpu-workers" in us-east-1`) {
					t.Errorf("error %q; want it to start with the group and region", err)
				}
				if !containsAll(err.Error(), c.want...) {
					t.Errorf("error %q\nwant it to contain %q", err, c.want)
				}
				t.Logf("the error reads: %v", err)
			}
			if n := f.count(c.op); n != c.calls {
				t.Errorf("%d %s calls; want %d", n, c.op, c.calls)
			}
		})
	}
}

// errAny stands for any error in a table.
var errAny = errors.New("any error")

// TestRefusalText: a refusal reads as what to grant, after the group and the cloud's answer.
func TestRefusalText(t *testing.T) {
	f := capacityFake(t)
	f.deny("SetDesiredCapacity")
	p := newProvider(t, f, aws.Config{})
	err := p.SetDesired(pollCtx(t), 4)
	want := `aws: auto scaling group "gpu-workers" in us-east-1 via ` + f.srv.URL + `: set the desired capacity to 4 refused ` +
		`(needs autoscaling:SetDesiredCapacity): operation error Auto Scaling: SetDesiredCapacity, https response error StatusCode: 403, ` +
		`RequestID: b2c5c8a4-96f5-4d3c-a3f7-5d0b9c1f2e01, api error AccessDenied: User: arn:aws:sts::123456789012:assumed-role/elasticd-driver/i-0123456789abcdef0 ` +
		`is not authorized to perform: autoscaling:SetDesiredCapacity on resource: ` + fakeGroupARN + fakeGroup +
		` because no identity-based policy allows the autoscaling:SetDesiredCapacity action`
	if err == nil || err.Error() != want {
		t.Errorf("the refusal reads\n %v\nwant\n %s", err, want)
	}
	if _, desired, _ := f.size(); desired != 3 {
		t.Errorf("a refused SetDesired left desired %d; want 3", desired)
	}
}

// TestGroupSize: the size is the group's, read afresh each call; an unknown group names --asg.
func TestGroupSize(t *testing.T) {
	f := capacityFake(t)
	f.change(func() { f.insts[2].Lifecycle = "Terminating:Wait" }) // still the group's
	p := newProvider(t, f, aws.Config{MinInterval: time.Hour})
	got, err := p.GroupSize(pollCtx(t))
	if want := (providers.GroupSize{Desired: 3, Min: 1, Max: 6, Instances: 3}); err != nil || got != want {
		t.Errorf("GroupSize: %+v, %v; want %+v", got, err, want)
	}
	f.setSize(0, 2, 4)
	got, err = p.GroupSize(pollCtx(t))
	if want := (providers.GroupSize{Desired: 2, Min: 0, Max: 4, Instances: 3}); err != nil || got != want {
		t.Errorf("GroupSize after the group changed: %+v, %v; want %+v", got, err, want)
	}

	f.change(func() { f.exists = false })
	_, err = p.GroupSize(pollCtx(t))
	if err == nil || !containsAll(err.Error(), `auto scaling group "gpu-workers" in us-east-1`, "not found", "--asg") || errors.Is(err, providers.ErrRefused) {
		t.Errorf("GroupSize of an unknown group: %v; want not found, naming --asg", err)
	}
}

// TestReplace: the exact request, the group's view after it, and the calls it saves.
func TestReplace(t *testing.T) {
	f := capacityFake(t)
	p := newProvider(t, f, aws.Config{MinInterval: time.Hour})
	target := f.insts[1]
	if hosts := mustHosts(t, p); len(hosts) != 3 {
		t.Fatalf("%d hosts; want 3", len(hosts))
	}
	if err := p.Replace(pollCtx(t), target.ID); err != nil {
		t.Fatalf("Replace: %v", err)
	}
	sent := f.sent("TerminateInstanceInAutoScalingGroup")
	if len(sent) != 1 {
		t.Fatalf("%d TerminateInstanceInAutoScalingGroup calls; want 1", len(sent))
	}
	sameParams(t, "TerminateInstanceInAutoScalingGroup", sent[0], map[string]string{"InstanceId": target.ID, "ShouldDecrementDesiredCapacity": "false"})
	if _, desired, _ := f.size(); desired != 3 {
		t.Errorf("desired %d after Replace; want 3 (the group replaces the instance)", desired)
	}

	// The next poll asks the cloud despite MinInterval, and sees the instance leave.
	before := f.count("DescribeAutoScalingGroups")
	hosts := mustHosts(t, p)
	if f.count("DescribeAutoScalingGroups") == before {
		t.Error("the poll after Replace reused the last answer; want it to ask the cloud")
	}
	if i := slices.IndexFunc(hosts, func(h providers.Host) bool { return h.ID == target.ID }); i < 0 || !hosts[i].Leaving {
		t.Errorf("after Replace, hosts %+v; want %s listed as leaving", hosts, target.ID)
	}

	// Again (a retry after a lost answer): the instance is already leaving, nothing is called.
	if err := p.Replace(pollCtx(t), target.ID); err != nil {
		t.Errorf("Replace of an instance already terminating: %v", err)
	}
	// Not the group's: refused before any termination, which would take any group's instance.
	err := p.Replace(pollCtx(t), "i-0fffffffffffffff0")
	if !errors.Is(err, providers.ErrNotInGroup) || !strings.HasPrefix(err.Error(), `aws: auto scaling group "gpu-workers"`) {
		t.Errorf("Replace of another group's instance: %v; want ErrNotInGroup, prefixed", err)
	}
	if n := f.count("TerminateInstanceInAutoScalingGroup"); n != 1 {
		t.Errorf("%d TerminateInstanceInAutoScalingGroup calls in all; want 1", n)
	}
}

// TestForgetAfterSetDesired: after a change of size the next poll asks the cloud.
func TestForgetAfterSetDesired(t *testing.T) {
	f := capacityFake(t)
	p := newProvider(t, f, aws.Config{MinInterval: time.Hour})
	mustHosts(t, p)
	mustHosts(t, p)
	if n := f.count("DescribeAutoScalingGroups"); n != 1 {
		t.Fatalf("%d DescribeAutoScalingGroups calls for two polls within MinInterval; want 1", n)
	}
	if err := p.SetDesired(pollCtx(t), 4); err != nil {
		t.Fatal(err)
	}
	before := f.count("DescribeAutoScalingGroups")
	mustHosts(t, p)
	if f.count("DescribeAutoScalingGroups") == before {
		t.Error("the poll after SetDesired reused the last answer; want it to ask the cloud")
	}
}

// TestLaunchFailures: which activities are failures, and what is read from each message.
func TestLaunchFailures(t *testing.T) {
	now := time.Now().Truncate(time.Millisecond)
	details := func(zone string) string {
		return `{"Subnet ID":"subnet-0123456789abcdef0","Availability Zone":"` + zone + `"}`
	}
	type want struct {
		code string
		kind providers.FailureKind
		zone string
	}
	for _, c := range []struct {
		name     string
		activity fakeActivity
		want     *want // nil: not a failure
	}{
		{"SpotStockout", stockout("us-east-1b", now), &want{"InsufficientInstanceCapacity", providers.NoCapacity, "us-east-1b"}},
		{"Unfulfillable", fakeActivity{StatusCode: "Failed", Details: details("us-east-1c"),
			StatusMessage: "UnfulfillableCapacity - Unable to fulfill capacity due to your request configuration. Please adjust your request and try again. Launching EC2 instance failed."},
			&want{"UnfulfillableCapacity", providers.NoCapacity, "us-east-1c"}},
		{"MaxSpotCountWithCode", fakeActivity{StatusCode: "Failed", Details: "{}",
			StatusMessage: "Could not launch Spot Instances. MaxSpotInstanceCountExceeded - Max spot instance count exceeded. Launching EC2 instance failed."},
			&want{"MaxSpotInstanceCountExceeded", providers.Quota, ""}},
		{"MaxSpotCountBare", fakeActivity{StatusCode: "Failed", StatusMessage: "Max spot instance count exceeded"},
			&want{"MaxSpotInstanceCountExceeded", providers.Quota, ""}},
		{"OnDemandNoZoneInDetails", fakeActivity{StatusCode: "Failed", Details: "{}",
			StatusMessage: "We currently do not have sufficient p4d.24xlarge capacity in the Availability Zone you requested (us-east-1a). Our system will be working on provisioning additional capacity. You can currently get p4d.24xlarge capacity by not specifying an Availability Zone in your request or choosing us-east-1b, us-east-1c. Launching EC2 instance failed."},
			&want{"InsufficientInstanceCapacity", providers.NoCapacity, "us-east-1a"}},
		{"BadTemplate", fakeActivity{StatusCode: "Failed", Details: details("us-east-1a"),
			StatusMessage: "The image id 'ami-4edb0327' does not exist. Launching EC2 instance failed."},
			&want{"", providers.OtherFailure, "us-east-1a"}},
		{"VcpuLimit", fakeActivity{StatusCode: "Cancelled", Details: details("us-east-1a"),
			StatusMessage: "Could not launch On-Demand Instances. VcpuLimitExceeded - You have requested more vCPU capacity than your current vCPU limit of 96 allows for the instance bucket that the specified instance type belongs to. Launching EC2 instance failed."},
			&want{"VcpuLimitExceeded", providers.Quota, "us-east-1a"}},
		{"WaitingForSpot", fakeActivity{StatusCode: "WaitingForSpotInstanceRequestId", StatusMessage: "Placed Spot instance request: sir-0123abcd. Waiting for instance(s)"}, nil},
		{"PendingSpotBid", fakeActivity{StatusCode: "PendingSpotBidPlacement"}, nil},
		{"InProgress", fakeActivity{StatusCode: "InProgress", Description: "Launching a new EC2 instance: i-0aaaaaaaaaaaaaaa9"}, nil},
		{"Successful", fakeActivity{StatusCode: "Successful", Description: "Launching a new EC2 instance: i-0aaaaaaaaaaaaaaa8"}, nil},
		{"FailedTwoHoursAgo", stockout("us-east-1a", now.Add(-2*time.Hour)), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := capacityFake(t)
			a := c.activity
			if a.Start.IsZero() {
				a.Start = now
			}
			id := f.addActivity(a)
			fs, err := newProvider(t, f, aws.Config{}).LaunchFailures(pollCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c.want == nil && len(fs) != 0:
				t.Errorf("failures %+v; want none", fs)
			case c.want == nil:
			case len(fs) != 1:
				t.Errorf("failures %+v; want one", fs)
			default:
				got := fs[0]
				if got.ID != id || !got.At.Equal(a.Start) || got.Message != a.StatusMessage ||
					got.Code != c.want.code || got.Kind != c.want.kind || got.Zone != c.want.zone {
					t.Errorf("failure %+v\nwant ID %s, At %v, Code %q, Kind %s, Zone %q, Message %q",
						got, id, a.Start, c.want.code, c.want.kind, c.want.zone, a.StatusMessage)
				}
			}
		})
	}

	t.Run("RequestAndOrder", func(t *testing.T) {
		f := capacityFake(t)
		older := f.addActivity(stockout("us-east-1a", now.Add(-30*time.Minute)))
		newer := f.addActivity(stockout("us-east-1b", now.Add(-time.Minute)))
		f.addActivity(fakeActivity{StatusCode: "WaitingForSpotInstanceRequestId", Start: now})
		fs, err := newProvider(t, f, aws.Config{}).LaunchFailures(pollCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		if ids := []string{}; len(fs) != 2 || fs[0].ID != older || fs[1].ID != newer {
			for _, x := range fs {
				ids = append(ids, x.ID)
			}
			t.Errorf("failures %v; want %s then %s (newest last)", ids, older, newer)
		}
		sent := f.sent("DescribeScalingActivities")
		if len(sent) != 1 {
			t.Fatalf("%d DescribeScalingActivities calls; want 1", len(sent))
		}
		sameParams(t, "DescribeScalingActivities", sent[0], map[string]string{"AutoScalingGroupName": fakeGroup, "MaxRecords": "100"})
	})
}

// TestFakeKeepsBounds: the fake answers what Auto Scaling answers a request outside the
// group's bounds (the provider checks them first, so its tests rarely get there), through the
// real SDK client.
func TestFakeKeepsBounds(t *testing.T) {
	f := capacityFake(t)
	ctx := pollCtx(t)
	cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion("us-east-1"), config.WithBaseEndpoint(f.srv.URL),
		config.WithRetryer(func() awssdk.Retryer { return awssdk.NopRetryer{} }))
	if err != nil {
		t.Fatal(err)
	}
	c := autoscaling.NewFromConfig(cfg)
	group := awssdk.String(fakeGroup)
	check := func(what string, err error, want string) {
		t.Helper()
		var ae smithy.APIError
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v", what, err)
		case want != "" && (!errors.As(err, &ae) || ae.ErrorCode() != "ValidationError" || ae.ErrorMessage() != want):
			t.Errorf("%s: %v; want ValidationError %q", what, err, want)
		}
	}
	_, err = c.SetDesiredCapacity(ctx, &autoscaling.SetDesiredCapacityInput{AutoScalingGroupName: group, DesiredCapacity: awssdk.Int32(7)})
	check("SetDesiredCapacity above max", err, "New SetDesiredCapacity value 7 is above max value 6 for the AutoScalingGroup.")
	_, err = c.SetDesiredCapacity(ctx, &autoscaling.SetDesiredCapacityInput{AutoScalingGroupName: group, DesiredCapacity: awssdk.Int32(0)})
	check("SetDesiredCapacity below min", err, "New SetDesiredCapacity value 0 is below min value 1 for the AutoScalingGroup.")
	_, err = c.UpdateAutoScalingGroup(ctx, &autoscaling.UpdateAutoScalingGroupInput{AutoScalingGroupName: group, DesiredCapacity: awssdk.Int32(9)})
	check("UpdateAutoScalingGroup above max", err, "Desired capacity:9 must be between the specified min size:1 and max size:6")
	_, err = c.UpdateAutoScalingGroup(ctx, &autoscaling.UpdateAutoScalingGroupInput{AutoScalingGroupName: group, MinSize: awssdk.Int32(4)})
	check("UpdateAutoScalingGroup raising the minimum", err, "")
	if min, desired, max := f.size(); min != 4 || desired != 4 || max != 6 {
		t.Errorf("after MinSize 4 alone, the group holds %d, %d, %d; want 4, 4, 6 (the desired capacity follows the minimum)", min, desired, max)
	}
	_, err = c.TerminateInstanceInAutoScalingGroup(ctx, &autoscaling.TerminateInstanceInAutoScalingGroupInput{
		InstanceId: awssdk.String(inst(1).ID), ShouldDecrementDesiredCapacity: awssdk.Bool(true)})
	check("TerminateInstanceInAutoScalingGroup below min", err, "Currently, desiredSize equals minSize (4). Terminating instance without replacement "+
		"will violate group's min size constraint. Either set shouldDecrementDesiredCapacity flag to false or lower group's min size.")
	_, err = c.TerminateInstanceInAutoScalingGroup(ctx, &autoscaling.TerminateInstanceInAutoScalingGroupInput{
		InstanceId: awssdk.String("i-0fffffffffffffff0"), ShouldDecrementDesiredCapacity: awssdk.Bool(false)})
	check("TerminateInstanceInAutoScalingGroup of a stranger", err, "Instance Id not found - No managed instance found for instance ID: i-0fffffffffffffff0")
	out, err := c.TerminateInstanceInAutoScalingGroup(ctx, &autoscaling.TerminateInstanceInAutoScalingGroupInput{
		InstanceId: awssdk.String(inst(1).ID), ShouldDecrementDesiredCapacity: awssdk.Bool(false)})
	check("TerminateInstanceInAutoScalingGroup", err, "")
	if a := out.Activity; a == nil || a.StatusCode != "InProgress" || awssdk.ToString(a.Description) != "Terminating EC2 instance: "+inst(1).ID {
		t.Errorf("TerminateInstanceInAutoScalingGroup's activity: %+v", a)
	}
	_, err = c.DescribeScalingActivities(ctx, &autoscaling.DescribeScalingActivitiesInput{AutoScalingGroupName: group, MaxRecords: awssdk.Int32(101)})
	check("DescribeScalingActivities of 101", err, "1 validation error detected: Value '101' at 'maxRecords' failed to satisfy constraint: Member must have value less than or equal to 100")
	acts, err := c.DescribeScalingActivities(ctx, &autoscaling.DescribeScalingActivitiesInput{AutoScalingGroupName: group})
	check("DescribeScalingActivities", err, "")
	if len(acts.Activities) != 4 || acts.Activities[0].StatusCode != "InProgress" {
		t.Errorf("activities %+v; want the termination in progress first, then the 3 launches", acts.Activities)
	}
}
