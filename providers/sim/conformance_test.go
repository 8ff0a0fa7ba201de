package sim_test

import (
	"context"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/providertest"
	"github.com/elasticd/elasticd/providers/sim"
)

// oneGroup is a cloud of one spot group of two instances that boot fast.
func oneGroup(hook time.Duration) sim.Config {
	return sim.Config{
		Groups:           []sim.GroupConfig{{Name: "spot", Spot: true, Type: "sim.gpu2", Slots: 2, Min: 1, Desired: 2, Max: 4}},
		SpotCapacity:     sim.Unlimited,
		LaunchDelay:      20 * time.Millisecond,
		InterruptWarning: 300 * time.Millisecond,
		LaunchRetry:      100 * time.Millisecond,
		TerminateGrace:   2 * time.Second,
		LifecycleHook:    hook,
	}
}

func hostsOf(is []sim.Instance) []providers.Host {
	hs := make([]providers.Host, len(is))
	for i, in := range is {
		hs[i] = in.Host
	}
	return hs
}

func TestConformance(t *testing.T) {
	providertest.Run(t, providertest.Harness{NewGroup: func(t *testing.T) providertest.Group {
		// With a lifecycle hook, a scale-in holds the instance as Leaving with a notice that
		// needs an answer, until it is given: a change that stays put while the test looks.
		f := start(t, oneGroup(time.Hour))
		p := f.group(t, "spot")
		is := f.running(t, 2)
		oldest, newest := is[0], is[1]
		return providertest.Group{
			Provider: p,
			Want:     hostsOf(is),
			Change: func(t *testing.T) []providers.Host {
				if err := p.SetDesired(t.Context(), 1); err != nil {
					t.Fatal(err)
				}
				leaving := newest.Host
				leaving.Leaving = true
				return []providers.Host{oldest.Host, leaving}
			},
			Fail:  func(t *testing.T) { setOn(t, f.cloud.SetOutage) },
			Stall: func(t *testing.T) { setOn(t, f.cloud.SetStalled) },
			Announce: func(t *testing.T) func(t *testing.T) {
				interrupt := func(t *testing.T) {
					if err := f.cloud.Interrupt(t.Context(), oldest.ID, time.Hour); err != nil {
						t.Fatal(err)
					}
				}
				interrupt(t)
				return interrupt
			},
			AnnounceAnswerable: func(t *testing.T) {
				if err := p.SetDesired(t.Context(), 1); err != nil {
					t.Fatal(err)
				}
			},
			Answered: func(t *testing.T) int { return len(calls(f.cloud, "complete-notice")) },
		}
	}})
}

func TestCapacityConformance(t *testing.T) {
	providertest.RunCapacity(t, providertest.CapacityHarness{NewGroup: func(t *testing.T) providertest.CapacityGroup {
		f := start(t, oneGroup(0))
		p := f.group(t, "spot")
		f.running(t, 2)
		return providertest.CapacityGroup{
			Provider: p,
			Replaced: func(t *testing.T) []string {
				var ids []string
				for _, c := range calls(f.cloud, "replace") {
					ids = append(ids, c.HostID)
				}
				return ids
			},
			RunOut: func(t *testing.T) {
				if err := f.cloud.SetSpotCapacity(t.Context(), 0); err != nil {
					t.Fatal(err)
				}
				// The running instances are reclaimed only after their notice: ask for one
				// more, so that the group tries a launch at once.
				if err := p.SetDesired(t.Context(), 3); err != nil {
					t.Fatal(err)
				}
			},
			Deny:  func(t *testing.T) { setOn(t, f.cloud.SetDenied) },
			Stall: func(t *testing.T) { setOn(t, f.cloud.SetStalled) },
		}
	}})
}

// setOn switches one of the cloud's conditions on.
func setOn(t *testing.T, set func(context.Context, bool) error) {
	t.Helper()
	if err := set(t.Context(), true); err != nil {
		t.Fatal(err)
	}
}

// calls lists the cloud's successful calls of op.
func calls(c *sim.Cloud, op string) []sim.Call {
	var out []sim.Call
	for _, call := range c.Calls() {
		if call.Op == op && call.Err == "" {
			out = append(out, call)
		}
	}
	return out
}
