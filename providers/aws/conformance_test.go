package aws_test

import (
	"slices"
	"testing"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/aws"
	"github.com/elasticd/elasticd/providers/providertest"
)

func TestConformance(t *testing.T) {
	providertest.Run(t, providertest.Harness{NewGroup: func(t *testing.T) providertest.Group {
		a, b, c := inst(1), inst(2), inst(3)
		b.Type, b.Spot = "g5.xlarge", true
		c.Type = "m7i.large" // not a GPU type: 1 slot
		f := newFake(t, a, b, c)
		return providertest.Group{
			Provider: newProvider(t, f, aws.Config{SQSQueueURL: f.queueURL}),
			Want:     []providers.Host{a.host(8), b.host(1), c.host(1)},
			Change: func(t *testing.T) []providers.Host {
				d := inst(4)
				f.change(func() {
					f.insts = slices.DeleteFunc(f.insts, func(i *fakeInst) bool { return i == b })
					f.insts = append(f.insts, d)
					c.Lifecycle = "Terminating:Wait"
				})
				left := c.host(1)
				left.Leaving = true
				return []providers.Host{a.host(8), left, d.host(8)}
			},
			Fail: func(t *testing.T) {
				f.failAlways("DescribeAutoScalingGroups", fault{status: 403, code: "AccessDenied",
					msg: "User: arn:aws:sts::123456789012:assumed-role/elasticd-driver/i-0 is not authorized to perform: autoscaling:DescribeAutoScalingGroups"})
			},
			Stall: func(t *testing.T) {
				f.mu.Lock()
				f.stall = true
				f.mu.Unlock()
			},
			// A spot interruption through EventBridge; SQS redelivers it.
			Announce: func(t *testing.T) func(t *testing.T) {
				ev := eventData{ID: "ev-spot", Instance: a.ID}
				f.send("spot_interruption.json", ev)
				return func(t *testing.T) { f.send("spot_interruption.json", ev) }
			},
			// A scale-in: a terminate lifecycle action, answered with CompleteLifecycleAction.
			AnnounceAnswerable: func(t *testing.T) {
				f.send("lifecycle_terminate.json", eventData{ID: "ev-scalein", Instance: a.ID, Token: "tok-a", Hook: "drain-hook"})
			},
			Answered: func(t *testing.T) int {
				f.mu.Lock()
				defer f.mu.Unlock()
				return len(f.completed)
			},
		}
	}})
}
