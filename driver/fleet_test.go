package driver

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

// hostsN discovers hosts h0..h(n-1) with slots each.
func (s *sim) hostsN(n, slots int) []Action {
	var hs []providers.Host
	for i := range n {
		hs = append(hs, providers.Host{ID: fmt.Sprintf("h%d", i), Addr: fmt.Sprintf("10.0.0.%d", i+1), Slots: slots})
	}
	return s.m.Step(HostsDiscovered{Now: s.now, Hosts: hs})
}

func capActs[T Action](acts []Action) []T {
	var out []T
	for _, a := range acts {
		if c, ok := a.(T); ok {
			out = append(out, c)
		}
	}
	return out
}

func managed(np, maxNP int) Config {
	return Config{NP: np, MaxNP: maxNP, MinNP: 1, Capacity: &CapacityConfig{Group: "aws group g"}}
}

// The group is sized for --max-np from the hosts' slot count, within its own maximum, and
// set back when someone else changes it; each change is in the status.
func TestManageCapacitySizesTheGroup(t *testing.T) {
	s := newSim(t, managed(4, 8))
	acts := s.hostsN(2, 2)
	if len(capActs[ReadCapacity](acts)) != 1 {
		t.Fatalf("first step: %v, want the group's size read", acts)
	}
	if acts := s.hostsN(2, 2); len(capActs[ReadCapacity](acts)) != 0 {
		t.Fatalf("a second read while one is under way: %v", acts)
	}
	acts = s.m.Step(CapacityRead{Now: s.now, Size: providers.GroupSize{Desired: 2, Min: 1, Max: 10, Instances: 2}})
	if got := capActs[SetCapacity](acts); len(got) != 1 || got[0].From != 2 || got[0].To != 4 || got[0].Final {
		t.Fatalf("after reading desired 2: %v, want it set to 4 (8 slots / 2 per host)", acts)
	}
	if acts := s.m.Step(CapacitySet{Now: s.now, From: 2, To: 4}); len(capActs[SetCapacity](acts)) != 0 {
		t.Fatalf("set again right after: %v", acts)
	}
	if dl := s.m.NextDeadline(s.now); dl.IsZero() || dl.After(s.now.Add(DefaultCapacityCheck)) {
		t.Fatalf("next deadline %v, want the next read within %v", dl, DefaultCapacityCheck)
	}
	// Someone set it to 3 meanwhile: it is set back at the next read.
	s.after(DefaultCapacityCheck)
	if acts := s.tick(); len(capActs[ReadCapacity](acts)) != 1 {
		t.Fatalf("no read at the check: %v", acts)
	}
	acts = s.m.Step(CapacityRead{Now: s.now, Size: providers.GroupSize{Desired: 3, Min: 1, Max: 10, Instances: 3}})
	if got := capActs[SetCapacity](acts); len(got) != 1 || got[0].From != 3 || got[0].To != 4 {
		t.Fatalf("after someone set 3: %v, want it set back to 4", acts)
	}
	s.m.Step(CapacitySet{Now: s.now, From: 3, To: 4})
	st := s.m.Snapshot().Capacity
	if st == nil || !slices.Equal(st.Changes, []string{"2 → 4", "3 → 4"}) || st.Desired != 4 {
		t.Fatalf("status %+v", st)
	}
	if !strings.Contains(eventsText(s.m.Snapshot()), "changed from 4 to 3 outside this driver") {
		t.Errorf("the outside change is not in the journal:\n%s", eventsText(s.m.Snapshot()))
	}
}

// The group's maximum is never raised, nor its minimum lowered while the job runs; a group at
// zero is first asked for one host, to learn its slots.
func TestManageCapacityBounds(t *testing.T) {
	t.Run("AtMax", func(t *testing.T) {
		s := newSim(t, managed(4, 16))
		s.hostsN(2, 2)
		acts := s.m.Step(CapacityRead{Now: s.now, Size: providers.GroupSize{Desired: 2, Max: 3, Instances: 2}})
		if got := capActs[SetCapacity](acts); len(got) != 1 || got[0].To != 3 {
			t.Fatalf("%v, want the desired size set to the group's max 3", acts)
		}
		acts = append(acts, s.m.Step(CapacitySet{Now: s.now, From: 2, To: 3})...)
		acts = append(acts, s.hostsN(3, 2)...)
		if w := capActs[Warn](acts); len(w) != 1 || !strings.Contains(w[0].Msg, "never raises a group's maximum") {
			t.Fatalf("%v, want one warning that the maximum holds the job back", acts)
		}
		if w := capActs[Warn](s.hostsN(3, 2)); len(w) != 0 {
			t.Fatalf("warned again: %v", w)
		}
	})
	t.Run("AboveMin", func(t *testing.T) {
		s := newSim(t, managed(2, 2))
		s.hostsN(1, 2)
		acts := s.m.Step(CapacityRead{Now: s.now, Size: providers.GroupSize{Desired: 3, Min: 3, Max: 5}})
		if got := capActs[SetCapacity](acts); len(got) != 0 {
			t.Fatalf("%v: the minimum was lowered while the job runs", got)
		}
	})
	t.Run("FromZero", func(t *testing.T) {
		s := newSim(t, managed(8, 8))
		s.m.Step(Tick{Now: s.now})
		acts := s.m.Step(CapacityRead{Now: s.now, Size: providers.GroupSize{Max: 10}})
		if got := capActs[SetCapacity](acts); len(got) != 1 || got[0].To != 1 || !strings.Contains(got[0].Reason, "learn") {
			t.Fatalf("%v, want one host asked for first", acts)
		}
		s.m.Step(CapacitySet{Now: s.now, From: 0, To: 1})
		acts = s.hostsN(1, 4)
		if got := capActs[SetCapacity](acts); len(got) != 1 || got[0].From != 1 || got[0].To != 2 {
			t.Fatalf("%v, want 2 hosts of 4 slots for -np 8", acts)
		}
	})
	t.Run("SlotsPerHost", func(t *testing.T) {
		cfg := managed(8, 8)
		cfg.Capacity.SlotsPerHost = 8
		s := newSim(t, cfg)
		s.m.Step(Tick{Now: s.now})
		acts := s.m.Step(CapacityRead{Now: s.now, Size: providers.GroupSize{Max: 10}})
		if got := capActs[SetCapacity](acts); len(got) != 1 || got[0].To != 1 || strings.Contains(got[0].Reason, "learn") {
			t.Fatalf("%v, want one host of 8 slots", acts)
		}
	})
}

// Whatever ends the job (success, failure, an interrupt), the group goes to zero as its last
// act, the final flag telling the runner to do it once the workers are stopped.
func TestManageCapacityZeroAtTheEnd(t *testing.T) {
	for _, c := range []struct {
		name string
		end  func(s *sim) []Action
		code int
	}{
		{"Success", func(s *sim) []Action { return append(s.exit("h0", 0), s.exit("h1", 0)...) }, ExitOK},
		{"Interrupted", func(s *sim) []Action { return s.m.Step(Interrupted{Now: s.now, Reason: "SIGTERM"}) }, ExitInterrupted},
		{"DiscoveryFailed", func(s *sim) []Action { return s.m.Step(DiscoveryFailed{Now: s.now, Err: errors.New("gone")}) }, ExitFailed},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSim(t, managed(2, 2))
			s.start(2)
			s.m.Step(CapacityRead{Now: s.now, Size: providers.GroupSize{Desired: 2, Min: 2, Max: 4}})
			acts := c.end(s)
			f := finish(acts)
			if f == nil || f.Code != c.code {
				t.Fatalf("%v: want the job finished with %d", acts, c.code)
			}
			got := capActs[SetCapacity](acts)
			if len(got) != 1 || !got[0].Final || got[0].To != 0 || got[0].From != 2 {
				t.Fatalf("%v: want one final SetCapacity 2 → 0", acts)
			}
			if i, j := slices.IndexFunc(acts, func(a Action) bool { _, ok := a.(SetCapacity); return ok }), slices.IndexFunc(acts, func(a Action) bool { _, ok := a.(Finish); return ok }); i > j {
				t.Errorf("the final size comes after Finish: %v", acts)
			}
		})
	}
}

// A refused call is said once, with what the cloud needs, and the job goes on unmanaged: no
// later call, not even at its end. A transient failure is tried again at the next check.
func TestManageCapacityRefusedAndTransient(t *testing.T) {
	s := newSim(t, managed(2, 4))
	s.start(2)
	acts := s.m.Step(CapacityRead{Now: s.now, Err: errors.New("aws: throttled")})
	if w := capActs[Warn](acts); len(w) != 1 {
		t.Fatalf("%v, want one warning", acts)
	}
	s.after(DefaultCapacityCheck)
	if acts := s.tick(); len(capActs[ReadCapacity](acts)) != 1 {
		t.Fatalf("a transient failure was not tried again: %v", acts)
	}
	acts = s.m.Step(CapacityRead{Now: s.now, Size: providers.GroupSize{Desired: 1, Max: 4}})
	if len(capActs[SetCapacity](acts)) != 1 {
		t.Fatalf("%v", acts)
	}
	denied := providers.Refused("set desired capacity", "autoscaling:SetDesiredCapacity", errors.New("AccessDenied"))
	acts = s.m.Step(CapacitySet{Now: s.now, From: 1, To: 2, Err: fmt.Errorf("aws: %w", denied)})
	w := capActs[Warn](acts)
	if len(w) != 1 || !strings.Contains(w[0].Msg, "autoscaling:SetDesiredCapacity") || !strings.Contains(w[0].Msg, "no longer managed") {
		t.Fatalf("%v, want one warning naming the permission and that the group is no longer managed", acts)
	}
	s.after(10 * DefaultCapacityCheck)
	acts = s.tick()
	acts = append(acts, s.m.Step(Interrupted{Now: s.now, Reason: "SIGTERM"})...)
	if len(capActs[ReadCapacity](acts))+len(capActs[SetCapacity](acts)) != 0 {
		t.Fatalf("calls after a refusal: %v", acts)
	}
	if st := s.m.Snapshot().Capacity; st == nil || !strings.Contains(st.Refused, "AccessDenied") || !strings.Contains(st.CapacityLine(), "not managed") {
		t.Fatalf("status %+v", st)
	}
}

// A host whose GPU failed is handed back once its workers are gone, never twice, and no more
// than --manage-capacity's hourly bound; a host whose every slot is quarantined too.
func TestManageCapacityHandsBackBrokenHosts(t *testing.T) {
	cfg := managed(3, 3)
	cfg.Capacity.ReplacePerHour = 1
	s := newSim(t, cfg)
	s.start(3)
	s.m.Step(CapacityRead{Now: s.now, Size: providers.GroupSize{Desired: 3, Max: 6}})
	acts := s.m.Step(SlotsFailed{Now: s.now, Host: "h1", Reason: "XID 79"})
	if got := capActs[HandBack](acts); len(got) != 0 {
		t.Fatalf("handed back while its worker still runs: %v", acts)
	}
	if !slices.Contains(stopped(acts), "h1") {
		t.Fatalf("the failed GPU's worker was not stopped: %v", acts)
	}
	acts = s.m.Step(WorkerExited{Now: s.now, Worker: wid("h1"), Code: -1, Signal: "SIGTERM"})
	got := capActs[HandBack](acts)
	if len(got) != 1 || got[0].Host != "h1" || !strings.Contains(got[0].Reason, "XID 79") {
		t.Fatalf("%v, want h1 handed back, saying why", acts)
	}
	s.m.Step(HostHandedBack{Now: s.now, Host: "h1"})
	// The same instance again: never twice.
	if got := capActs[HandBack](s.m.Step(SlotsFailed{Now: s.now, Host: "h1", Reason: "XID 79"})); len(got) != 0 {
		t.Fatalf("handed back twice: %v", got)
	}
	// Another broken host within the hour waits for the next hour.
	s.ready(1, "h0", "h2")
	s.m.Step(SlotsFailed{Now: s.now, Host: "h2", Reason: "lost GPU"})
	acts = s.m.Step(WorkerExited{Now: s.now, Worker: wid("h2"), Code: -1, Signal: "SIGKILL"})
	if got := capActs[HandBack](acts); len(got) != 0 {
		t.Fatalf("more than --replace-per-hour: %v", got)
	}
	s.ready(2, "h0")
	if dl := s.m.NextDeadline(s.now); !dl.Equal(t0.Add(time.Hour)) && dl.After(t0.Add(time.Hour)) {
		t.Fatalf("next deadline %v: the held-back host is never looked at again", dl)
	}
	s.after(time.Hour)
	if got := capActs[HandBack](s.tick()); len(got) != 1 || got[0].Host != "h2" {
		t.Fatalf("h2 not handed back in the next hour: %v", got)
	}
	st := s.m.Snapshot()
	if !strings.Contains(eventsText(st), "host h1 handed back to aws group g for a replacement: hardware fault: XID 79") {
		t.Errorf("journal:\n%s", eventsText(st))
	}
	if !slices.Equal(st.Capacity.HandedBack, []string{"h1"}) {
		t.Errorf("handed back %v", st.Capacity.HandedBack)
	}
}

// A host that failed in only some of its slots is moved off first: its other workers leave at
// their next commit, and it is handed back once they are gone.
func TestManageCapacityMovesOffAPartlyBrokenHost(t *testing.T) {
	s := newSim(t, Config{NP: 4, MinNP: 2, Capacity: &CapacityConfig{Group: "g"}})
	hs := []providers.Host{{ID: "a", Addr: "10.0.0.1", Slots: 2}, {ID: "b", Addr: "10.0.0.2", Slots: 2}}
	acts := s.m.Step(HostsDiscovered{Now: s.now, Hosts: hs})
	s.m.Step(CapacityRead{Now: s.now, Size: providers.GroupSize{Desired: 2, Max: 4}})
	ids := func(host string) []protocol.WorkerID {
		return []protocol.WorkerID{{Host: host, Slot: 0}, {Host: host, Slot: 1}}
	}
	for _, id := range append(ids("a"), ids("b")...) {
		s.m.Step(WorkerReported{Now: s.now, Worker: id, Generation: 0, State: protocol.Ready})
	}
	_ = acts
	acts = s.m.Step(SlotsFailed{Now: s.now, Host: "b", Slots: []int{1}, Reason: "ECC"})
	if got := capActs[HandBack](acts); len(got) != 0 {
		t.Fatalf("handed back with workers on it: %v", got)
	}
	acts = s.m.Step(WorkerExited{Now: s.now, Worker: protocol.WorkerID{Host: "b", Slot: 1}, Code: -1, Signal: "SIGTERM"})
	for _, id := range append(ids("a"), protocol.WorkerID{Host: "b", Slot: 0}) {
		acts = append(acts, s.m.Step(WorkerReported{Now: s.now, Worker: id, Generation: 1, State: protocol.Ready})...)
	}
	_, order := plan(acts)
	if slices.Contains(order, "b") {
		t.Fatalf("the next generation still uses the broken host: %v", order)
	}
	if got := capActs[HandBack](acts); len(got) != 0 {
		t.Fatalf("handed back before its last worker exited: %v", got)
	}
	acts = s.m.Step(WorkerExited{Now: s.now, Worker: protocol.WorkerID{Host: "b", Slot: 0}, Code: -1, Signal: "SIGTERM"})
	if got := capActs[HandBack](acts); len(got) != 1 || got[0].Host != "b" {
		t.Fatalf("%v, want b handed back once its last worker exited", acts)
	}
}

// A host the cloud lists whose agent never connected is handed back at once: no worker
// runs there, and the job never had it.
func TestManageCapacityHandsBackAHostWithoutAgent(t *testing.T) {
	s := newSim(t, managed(2, 2))
	s.start(2)
	s.m.Step(CapacityRead{Now: s.now, Size: providers.GroupSize{Desired: 3, Max: 3}})
	acts := s.m.Step(HostUnusable{Now: s.now, Host: "i-silent", Fallback: true, Reason: "its agent never connected within --agent-timeout 10m0s"})
	got := capActs[HandBack](acts)
	if len(got) != 1 || got[0].Host != "i-silent" || !got[0].Fallback || !strings.Contains(got[0].Reason, "never connected") {
		t.Fatalf("%v: want i-silent handed back to its (fallback) group", acts)
	}
	if has[NotifyHosts](acts) || has[Stop](acts) {
		t.Fatalf("the job was disturbed for a host it never had: %v", acts)
	}
}
