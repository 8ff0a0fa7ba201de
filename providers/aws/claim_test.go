package aws_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/aws"
)

// TestClaimRequests: the claim is the group's elasticd-driver tag, written with exactly these
// parameters, read back, and removed by its owner alone; the group's other tags stay.
func TestClaimRequests(t *testing.T) {
	f := capacityFake(t)
	f.setTag("team", "ml-infra")
	p := newProvider(t, f, aws.Config{MinInterval: time.Hour})
	at := time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)
	c := providers.GroupClaim{Owner: "0a1b2c3d", Host: "driver-1.example.com", At: at}
	held, err := p.Claim(pollCtx(t), c)
	if err != nil || held != nil {
		t.Fatalf("Claim of a free group: held %v, %v; want it claimed", held, err)
	}
	const value = "job=0a1b2c3d;host=driver-1.example.com;at=2026-09-01T12:00:00Z"
	sent := f.sent("CreateOrUpdateTags")
	if len(sent) != 1 {
		t.Fatalf("%d CreateOrUpdateTags calls; want 1", len(sent))
	}
	sameParams(t, "CreateOrUpdateTags", sent[0], map[string]string{
		"Tags.member.1.ResourceId": fakeGroup, "Tags.member.1.ResourceType": "auto-scaling-group",
		"Tags.member.1.Key": "elasticd-driver", "Tags.member.1.Value": value, "Tags.member.1.PropagateAtLaunch": "false",
	})
	if n := f.count("DescribeAutoScalingGroups"); n != 2 {
		t.Errorf("%d DescribeAutoScalingGroups calls; want 2 (the read before the write, the read back)", n)
	}
	if got := strings.Join(f.tagList(), ","); got != "team=ml-infra,elasticd-driver="+value {
		t.Errorf("the group's tags: %s; want team's kept and the claim added", got)
	}

	// Another driver reads the claim and writes nothing.
	other := providers.GroupClaim{Owner: "ffee0011", Host: "driver-2", At: at.Add(time.Minute)}
	held, err = p.Claim(pollCtx(t), other)
	if err != nil || held == nil || *held != c {
		t.Fatalf("another owner's Claim: held %v, %v; want %+v", held, err, c)
	}
	if n := len(f.sent("CreateOrUpdateTags")); n != 1 {
		t.Errorf("%d CreateOrUpdateTags calls after a refused claim; want still 1", n)
	}
	if err := p.Unclaim(pollCtx(t), other.Owner); err != nil || len(f.sent("DeleteTags")) != 0 {
		t.Errorf("Unclaim by another owner: %v, %d DeleteTags calls; want nil and none", err, len(f.sent("DeleteTags")))
	}
	if err := p.Unclaim(pollCtx(t), c.Owner); err != nil {
		t.Fatalf("Unclaim: %v", err)
	}
	del := f.sent("DeleteTags")
	if len(del) != 1 {
		t.Fatalf("%d DeleteTags calls; want 1", len(del))
	}
	sameParams(t, "DeleteTags", del[0], map[string]string{
		"Tags.member.1.ResourceId": fakeGroup, "Tags.member.1.ResourceType": "auto-scaling-group", "Tags.member.1.Key": "elasticd-driver",
	})
	if got := strings.Join(f.tagList(), ","); got != "team=ml-infra" {
		t.Errorf("the group's tags after Unclaim: %s; want team's alone", got)
	}
}

// TestClaimLostRace: another driver's write lands between this one's write and its read
// back; this one reads the other's claim back and steps aside.
func TestClaimLostRace(t *testing.T) {
	f := capacityFake(t)
	p := newProvider(t, f, aws.Config{})
	f.mu.Lock()
	f.afterTagWrite = func() { f.setTag("elasticd-driver", "job=ffee0011;host=driver-2;at=2026-09-01T12:00:01Z") }
	f.mu.Unlock()
	held, err := p.Claim(pollCtx(t), providers.GroupClaim{Owner: "0a1b2c3d", Host: "driver-1", At: time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)})
	if err != nil || held == nil || held.Owner != "ffee0011" || held.Host != "driver-2" {
		t.Fatalf("Claim that lost the race: held %v, %v; want the other driver's claim", held, err)
	}
	if n := f.count("DescribeAutoScalingGroups"); n != 2 {
		t.Errorf("%d DescribeAutoScalingGroups calls; want 2 (the read, the read back)", n)
	}
}

// TestClaimErrors: what each error of the tag calls means.
func TestClaimErrors(t *testing.T) {
	claim := providers.GroupClaim{Owner: "0a1b2c3d", Host: "driver-1", At: time.Now()}
	for _, c := range []struct {
		name, op string
		flt      fault
		unclaim  bool
		is       error
		want     string
		calls    int
	}{
		{"WriteDenied", "CreateOrUpdateTags", fault{status: 403, code: "AccessDenied", msg: "not authorized to perform: autoscaling:CreateOrUpdateTags"}, false,
			providers.ErrRefused, "write the group's elasticd-driver tag refused (needs autoscaling:CreateOrUpdateTags)", 1},
		{"WriteLimit", "CreateOrUpdateTags", fault{status: 400, code: "LimitExceeded", msg: "The quota of 50 tags per Auto Scaling group has been reached."}, false,
			providers.ErrRefused, "50 tags", 1},
		{"WriteContention", "CreateOrUpdateTags", fault{status: 500, code: "ResourceContention", msg: "You already have a pending update to an Auto Scaling resource."}, false,
			nil, "", 2},
		{"DeleteDenied", "DeleteTags", fault{status: 403, code: "AccessDenied", msg: "not authorized to perform: autoscaling:DeleteTags"}, true,
			providers.ErrRefused, "remove the group's elasticd-driver tag refused (needs autoscaling:DeleteTags)", 1},
		{"ReadDenied", "DescribeAutoScalingGroups", fault{status: 403, code: "AccessDenied", msg: "not authorized"}, false,
			providers.ErrRefused, "read the group refused (needs autoscaling:DescribeAutoScalingGroups)", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := capacityFake(t)
			p := newProvider(t, f, aws.Config{})
			if c.unclaim {
				if held, err := p.Claim(pollCtx(t), claim); err != nil || held != nil {
					t.Fatalf("Claim: %v, %v", held, err)
				}
			}
			f.fail(c.op, c.flt)
			var err error
			if c.unclaim {
				err = p.Unclaim(pollCtx(t), claim.Owner)
			} else {
				_, err = p.Claim(pollCtx(t), claim)
			}
			switch {
			case c.is == nil && err != nil:
				t.Fatalf("error %v; want success after the retry", err)
			case c.is != nil && !errors.Is(err, c.is):
				t.Fatalf("error %v; want one wrapping %v", err, c.is)
			}
			if err != nil {
				if !strings.HasPrefix(err.Error(), `aws: auto scaling group "gpu-workers" in us-east-1`) || !strings.Contains(err.Error(), c.want) {
					t.Errorf("error %q; want the group's prefix and %q", err, c.want)
				}
				t.Logf("the error reads: %v", err)
			}
			if n := f.count(c.op); c.op != "DescribeAutoScalingGroups" && n != c.calls {
				t.Errorf("%d %s calls; want %d", n, c.op, c.calls)
			}
		})
	}
}
