package driver

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

// fbSim drives a job with a spot group and an on-demand fallback group, hosts of 2 slots.
type fbSim struct {
	*sim
}

func (s fbSim) discover(spot []string, fallback ...string) []Action {
	var hs []providers.Host
	for _, id := range spot {
		hs = append(hs, providers.Host{ID: id, Addr: id, Slots: 2, Spot: true})
	}
	for _, id := range fallback {
		hs = append(hs, providers.Host{ID: id, Addr: id, Slots: 2, Fallback: true})
	}
	return s.m.Step(HostsDiscovered{Now: s.now, Hosts: hs})
}

// register reports READY for generation gen-1 from every worker launched in acts.
func (s fbSim) register(acts []Action) []Action {
	var out []Action
	for _, a := range acts {
		if l, ok := a.(Launch); ok {
			out = append(out, s.m.Step(WorkerReported{Now: s.now, Worker: l.Worker, Generation: l.Generation - 1, State: protocol.Ready})...)
		}
	}
	return out
}

// resetAll has every live member of the current generation report READY for it.
func (s fbSim) resetAll() []Action {
	var out []Action
	for _, id := range slices.Clone(s.m.order) {
		if w := s.m.workers[id]; w != nil && !w.exited && !w.stopping {
			out = append(out, s.m.Step(WorkerReported{Now: s.now, Worker: id, Generation: s.m.gen, State: protocol.Ready})...)
		}
	}
	return out
}

// answerReads answers the capacity reads among acts (the spot group at desired, the
// fallback at fbDesired, both of max 4) and returns acts with what followed.
func (s fbSim) answerReads(acts []Action, desired, fbDesired int) []Action {
	for i := 0; i < len(acts); i++ { // the answers' own reads too
		r, ok := acts[i].(ReadCapacity)
		if !ok {
			continue
		}
		size := providers.GroupSize{Desired: desired, Max: 4}
		if r.Fallback {
			size.Desired = fbDesired
		}
		acts = append(acts, s.m.Step(CapacityRead{Now: s.now, Fallback: r.Fallback, Size: size})...)
	}
	return acts
}

func fallbackSets(acts []Action) []SetCapacity {
	var out []SetCapacity
	for _, a := range capActs[SetCapacity](acts) {
		if a.Fallback {
			out = append(out, a)
		}
	}
	return out
}

// Spot runs out: after --fallback-after short of -np with the spot group reporting no
// capacity, the fallback group is grown by the hosts missing, no more; when spot carries -np
// again, the job moves off the fallback host at a commit (no failure) and the fallback group
// goes back to zero once its worker is gone.
func TestFallbackAndReturn(t *testing.T) {
	// Reads only at the start: each step below answers for the cloud.
	cfg := Config{NP: 4, MinNP: 2, Mode: ModeInProcess, Capacity: &CapacityConfig{Group: "spot group", CheckEvery: 1000 * time.Hour,
		Fallback: &FallbackConfig{Group: "on-demand group", After: 10 * time.Minute}}}
	s := fbSim{newSim(t, cfg)}
	acts := s.discover([]string{"s0", "s1"})
	reads := capActs[ReadCapacity](acts)
	if len(reads) != 2 || !reads[0].Failures || !reads[1].Fallback {
		t.Fatalf("reads %+v: want the spot group's size with its failures, and the fallback's", reads)
	}
	s.register(acts)
	s.m.Step(CapacityRead{Now: s.now, Size: providers.GroupSize{Desired: 2, Max: 4}})
	s.m.Step(CapacityRead{Now: s.now, Fallback: true, Size: providers.GroupSize{Desired: 0, Max: 4}})

	// s1 is reclaimed; the job goes on with s0's 2 slots.
	s.after(time.Second)
	acts = s.discover([]string{"s0"})
	acts = append(acts, s.resetAll()...)
	if _, order := plan(acts); len(order) != 2 {
		t.Fatalf("after s1 left: %v", acts)
	}
	stockout := providers.LaunchFailure{ID: "a1", At: s.now, Kind: providers.NoCapacity, Code: "InsufficientInstanceCapacity"}
	s.after(5 * time.Minute)
	acts = s.m.Step(CapacityRead{Now: s.now, Size: providers.GroupSize{Desired: 2, Max: 4}, Failures: []providers.LaunchFailure{stockout}})
	acts = s.answerReads(acts, 2, 0)
	if got := fallbackSets(acts); len(got) != 0 {
		t.Fatalf("fell back before --fallback-after: %+v", got)
	}
	if dl := s.m.NextDeadline(s.now); dl.IsZero() || dl.After(t0.Add(time.Second+10*time.Minute)) {
		t.Fatalf("next deadline %v: the fallback's wait is not kept", dl)
	}
	s.now = t0.Add(time.Second + 10*time.Minute)
	acts = s.answerReads(s.tick(), 2, 0)
	got := fallbackSets(acts)
	if len(got) != 1 || got[0].From != 0 || got[0].To != 1 || !strings.Contains(got[0].Reason, "InsufficientInstanceCapacity") {
		t.Fatalf("%v: want the fallback group grown 0 → 1 (2 slots missing, 2 a host), saying why", acts)
	}
	s.m.Step(CapacitySet{Now: s.now, Fallback: true, From: 0, To: 1})
	// The on-demand host arrives: the job grows back to -np.
	s.after(time.Minute)
	acts = s.discover([]string{"s0"}, "f0")
	acts = append(acts, s.resetAll()...)
	_, order := plan(acts)
	if !slices.Equal(order, []string{"s0", "s0", "f0", "f0"}) {
		t.Fatalf("order %v: want the fallback host's slots in the job", order)
	}
	s.register(acts)
	// Spot returns: a new spot host joins and the fallback host leaves at the same commit.
	s.after(time.Hour)
	acts = s.answerReads(s.discover([]string{"s0", "s2"}, "f0"), 2, 1)
	if !has[NotifyHosts](acts) || len(fallbackSets(acts)) != 0 {
		t.Fatalf("%v: want the workers told to commit, the fallback group not emptied while its workers run", acts)
	}
	acts = s.resetAll()
	_, order = plan(acts)
	if !slices.Equal(order, []string{"s0", "s0", "s2", "s2"}) {
		t.Fatalf("order %v: want spot hosts only", order)
	}
	if got := stopped(acts); !slices.Equal(got, []string{"f0", "f0"}) {
		t.Fatalf("stopped %v, want the fallback host's workers", got)
	}
	if s.m.Resets().Failures != 0 {
		t.Fatalf("resets %+v: moving off the fallback host counted as a failure", s.m.Resets())
	}
	s.register(acts)
	acts = s.m.Step(WorkerExited{Now: s.now, Worker: protocol.WorkerID{Host: "f0", Slot: 0}, Code: 143})
	if len(fallbackSets(acts)) != 0 {
		t.Fatalf("emptied with a fallback worker still running: %v", acts)
	}
	acts = s.m.Step(WorkerExited{Now: s.now, Worker: protocol.WorkerID{Host: "f0", Slot: 1}, Code: 143})
	if got := fallbackSets(acts); len(got) != 1 || got[0].To != 0 || got[0].Final {
		t.Fatalf("%v: want the fallback group set to zero once its workers are gone", acts)
	}
	s.m.Step(CapacitySet{Now: s.now, Fallback: true, From: 1, To: 0})
	st := s.m.Snapshot().Capacity
	if st.Fallback == nil || !slices.Equal(st.Fallback.Changes, []string{"0 → 1", "1 → 0"}) || st.Fallback.JobSeconds < 3600 {
		t.Fatalf("fallback status %+v", st.Fallback)
	}
	if !strings.Contains(st.CapacityLine(), "fallback on-demand group: 0 → 1, 1 → 0 (kept the job going 1h0m0s") {
		t.Errorf("line %q", st.CapacityLine())
	}
	ev := eventsText(s.m.Snapshot())
	for _, want := range []string{"falling back on on-demand group", "moves off the on-demand fallback hosts"} {
		if !strings.Contains(ev, want) {
			t.Errorf("journal lacks %q:\n%s", want, ev)
		}
	}
}

// Short of -np without a stockout (a failed worker's slot cooling down, a host the user
// removed) is no reason to pay for on-demand hosts.
func TestNoFallbackWithoutAStockout(t *testing.T) {
	cfg := Config{NP: 4, MinNP: 2, Mode: ModeInProcess, Capacity: &CapacityConfig{Group: "g",
		Fallback: &FallbackConfig{Group: "od", After: time.Minute}}}
	s := fbSim{newSim(t, cfg)}
	s.register(s.discover([]string{"s0", "s1"}))
	s.m.Step(CapacityRead{Now: s.now, Size: providers.GroupSize{Desired: 2, Max: 4}})
	s.m.Step(CapacityRead{Now: s.now, Fallback: true, Size: providers.GroupSize{Max: 4}})
	s.discover([]string{"s0"})
	s.resetAll()
	s.after(time.Hour)
	acts := s.tick()
	acts = append(acts, s.m.Step(CapacityRead{Now: s.now, Size: providers.GroupSize{Desired: 2, Max: 4},
		Failures: []providers.LaunchFailure{{ID: "q", At: s.now, Kind: providers.Quota, Code: "MaxSpotInstanceCountExceeded"}}})...)
	if got := fallbackSets(acts); len(got) != 0 {
		t.Fatalf("fell back without a stockout: %+v", got)
	}
}
