package driver

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/cost"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

func causes(s Status) map[string]int { return s.ResetsByCause }

func readyFor(gen uint64, rb protocol.Rollback, host string) WorkerReported {
	return WorkerReported{Worker: wid(host), Generation: gen, State: protocol.Ready, Rollback: rb}
}

func eventKinds(s Status) []string {
	var out []string
	for _, e := range s.Events {
		out = append(out, e.Kind)
	}
	return out
}

// Each completed reset is counted once, by what caused it.
func TestResetsByCause(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 1, MaxNP: 4, CooldownMin: 10 * time.Second})
	s.start(3)
	want := map[string]int{CauseFailure: 0, CauseScaleUp: 0, CauseRemoval: 0, CauseNotice: 0}
	check := func(step string) {
		t.Helper()
		if got := causes(s.m.Snapshot()); !mapsEqual(got, want) {
			t.Fatalf("%s: resets by cause %v, want %v", step, got, want)
		}
	}
	check("start")

	// Scale-up: a fourth host.
	s.after(time.Second).hosts("h0", "h1", "h2", "h3")
	check("a host announced, reset not done yet")
	acts := s.ready(1, "h0", "h1", "h2")
	s.expectPlan(acts, 2, "h0", "h1", "h2", "h3")
	s.ready(1, "h3") // registers
	want[CauseScaleUp]++
	check("scale-up")

	// Removal: h3 leaves discovery.
	s.after(time.Second).hosts("h0", "h1", "h2")
	s.expectPlan(s.ready(2, "h0", "h1", "h2", "h3"), 3, "h0", "h1", "h2")
	want[CauseRemoval]++
	check("removal")

	// Notice: h2 will be taken; a removal discovered before the reset completes does not
	// change the cause.
	s.m.Step(NoticeReceived{Now: s.now, Source: "aws", Notice: providers.Notice{ID: "n", HostID: "h2", Kind: providers.Interruption}})
	s.hosts("h0", "h1")
	s.expectPlan(s.ready(3, "h0", "h1", "h2"), 4, "h0", "h1")
	want[CauseNotice]++
	check("notice")

	// Failure: h1 dies.
	s.after(time.Second).exit("h1", 1)
	s.expectPlan(s.ready(4, "h0"), 5, "h0")
	want[CauseFailure]++
	check("failure")

	st := s.m.Snapshot()
	if st.Resets != 4 {
		t.Fatalf("%d resets, want 4", st.Resets)
	}
	if len(st.Notices) != 1 || st.Notices[0] != (NoticeCount{Provider: "aws", Kind: "interruption", Count: 1}) {
		t.Fatalf("notices %+v, want one aws interruption", st.Notices)
	}
}

// A failure's rollback: the most any survivor threw away, on every worker of the failed
// generation; counted when the reset completes.
func TestRollbackAccounting(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 1})
	s.start(3)
	s.after(time.Second).exit("h2", 1)
	s.m.Step(readyFor(1, protocol.Rollback{Steps: 7, Seconds: 1.5}, "h0"))
	if p := s.m.Snapshot(); p.rbSteps != 0 {
		t.Fatal("rollback counted before the reset completed")
	}
	acts := s.m.Step(readyFor(1, protocol.Rollback{Steps: 9, Seconds: 2}, "h1"))
	s.expectPlan(acts, 2, "h0", "h1")
	st := s.m.Snapshot()
	if st.rbSteps != 9 {
		t.Fatalf("rolled back %d steps, want the largest report, 9", st.rbSteps)
	}
	// 2 s on each of the 3 workers of generation 1, the dead one's included.
	if st.rolledBackSlotSeconds() != 6 || st.rolledBack["h0"] != 2 || st.rolledBack["h2"] != 2 {
		t.Fatalf("rolled back slot-seconds %v by host %v, want 6: 2 on each", st.rolledBackSlotSeconds(), st.rolledBack)
	}
	// A planned reset reports nothing and adds nothing.
	s.after(time.Second).hosts("h0", "h1", "h2", "h3")
	s.ready(2, "h0", "h1")
	if st := s.m.Snapshot(); st.rbSteps != 9 || st.rolledBackSlotSeconds() != 6 {
		t.Fatalf("a planned reset changed the rollback: %d steps, %v slot-seconds", st.rbSteps, st.rolledBackSlotSeconds())
	}
	last := st.Events[len(st.Events)-1]
	if !slices.ContainsFunc(st.Events, func(e JobEvent) bool {
		return e.Kind == EventReset && strings.Contains(e.Message, "rolled back 9 steps")
	}) {
		t.Fatalf("no rollback event; last event %+v", last)
	}
}

// Hosts are billed from the first discovery that lists them to the first that does not;
// Current prices that time, and the hosts, from the catalog.
func TestHostLivesAndCost(t *testing.T) {
	s := newSim(t, Config{NP: 1, MinNP: 1, MaxNP: 2})
	spotHost := providers.Host{ID: "s", Addr: "10.0.0.1", Slots: 2, Spot: true, Type: "g", Zone: "z"}
	odHost := providers.Host{ID: "o", Addr: "10.0.0.2", Slots: 1, Type: "g", Zone: "z"}
	s.m.Step(HostsDiscovered{Now: s.now, Hosts: []providers.Host{spotHost, odHost}})
	s.after(time.Hour)
	s.m.Step(HostsDiscovered{Now: s.now, Hosts: []providers.Host{spotHost}}) // o leaves after 1 h
	s.after(time.Hour)
	s.m.Step(HostsDiscovered{Now: s.now, Hosts: []providers.Host{spotHost, odHost}}) // o back
	b := &StatusBoard{}
	b.store(s.m.Snapshot())
	b.prices = cost.NewCatalog(&cost.File{Currency: "USD", Types: map[string]cost.Rate{"g": {OnDemand: 4, Spot: 1}}}, nil, nil)
	st := b.Current(s.now.Add(30 * time.Minute))
	c := st.Cost
	// s: 2.5 h spot at 1 = 2.5; o: 1.5 h on demand at 4 = 6.
	if math.Abs(c.Spot-2.5) > 1e-9 || math.Abs(c.OnDemand-6) > 1e-9 || math.Abs(c.Total-8.5) > 1e-9 {
		t.Fatalf("cost %+v, want spot 2.5, on-demand 6", c)
	}
	if math.Abs(c.Savings-7.5) > 1e-9 { // s's 2.5 h would have cost 10 on demand
		t.Fatalf("savings %v, want 7.5", c.Savings)
	}
	if st.ElapsedSeconds != 2.5*3600 {
		t.Fatalf("elapsed %v", st.ElapsedSeconds)
	}
	for _, h := range st.Hosts {
		want := map[string]float64{"s": 1, "o": 4}[h.ID]
		if h.PricePerHour == nil || *h.PricePerHour != want {
			t.Fatalf("host %s price %v, want %v", h.ID, h.PricePerHour, want)
		}
	}
	hostEvents := slices.DeleteFunc(eventKinds(*st), func(k string) bool { return !strings.HasPrefix(k, "host-") })
	if got := hostEvents; !slices.Equal(got, []string{EventHostAdded, EventHostAdded, EventHostRemoved, EventHostAdded}) {
		t.Fatalf("events %v", got)
	}
	if o := st.Hosts[0]; o.ID != "o" || !o.Since.Equal(t0.Add(2*time.Hour)) || o.Lifecycle != "on-demand" || o.Type != "g" || o.Zone != "z" {
		t.Fatalf("host o %+v, want in the group since its return", o)
	}
	if got := b.Types(); !slices.Equal(got, []string{"g"}) {
		t.Fatalf("types %v", got)
	}
	// A finished job's clock stops: later reads cost the same.
	s.m.Step(Interrupted{Now: s.now, Reason: "test"})
	b.store(s.m.Snapshot())
	a1, a2 := b.Current(s.now.Add(time.Hour)), b.Current(s.now.Add(5*time.Hour))
	if a1.Finished == nil || a1.Cost.Total != a2.Cost.Total || a1.ElapsedSeconds != a2.ElapsedSeconds {
		t.Fatalf("finished job: cost %v then %v, elapsed %v then %v", a1.Cost.Total, a2.Cost.Total, a1.ElapsedSeconds, a2.ElapsedSeconds)
	}
}

func TestHostStates(t *testing.T) {
	s := newSim(t, Config{NP: 2, MinNP: 1, MaxNP: 2, CooldownMin: time.Minute})
	s.start(2)
	s.hosts("h0", "h1", "h2", "h3") // over --max-np: h2 and h3 idle
	s.after(time.Second).exit("h1", 1)
	s.m.Step(NoticeReceived{Now: s.now, Source: "gcp", Notice: providers.Notice{ID: "n", HostID: "h0", Kind: providers.Interruption}})
	state := map[string]string{}
	for _, h := range s.m.Snapshot().Hosts {
		state[h.ID] = h.State
	}
	want := map[string]string{"h0": "leaving", "h1": "blacklisted", "h2": "idle", "h3": "idle"}
	if !mapsEqual(state, want) {
		t.Fatalf("host states %v, want %v", state, want)
	}
	s.ready(1, "h0")
	state = map[string]string{}
	for _, h := range s.m.Snapshot().Hosts {
		state[h.ID] = h.State
	}
	if want := map[string]string{"h0": "leaving", "h1": "blacklisted", "h2": "active", "h3": "active"}; !mapsEqual(state, want) {
		t.Fatalf("after the reset: host states %v, want %v", state, want)
	}
}

// The world size over time, one point per generation and a 0 while waiting; a rendezvous
// completes when every member has registered, its latency from the reset's start.
func TestWorldHistoryAndRendezvous(t *testing.T) {
	s := newSim(t, Config{NP: 2, MinNP: 2, CooldownMin: 10 * time.Second})
	acts := s.hosts("h0", "h1")
	if has[GenerationReady](acts) {
		t.Fatal("rendezvous complete before anyone registered")
	}
	s.after(300*time.Millisecond).ready(0, "h0")
	acts = s.after(200*time.Millisecond).ready(0, "h1")
	if r := ready(acts); r == nil || r.Generation != 1 || r.WorldSize != 2 || r.Latency != 500*time.Millisecond {
		t.Fatalf("generation 1's rendezvous: %+v, want 500ms after the start", r)
	}
	s.after(time.Second).exit("h1", 1) // below --min-np: waiting
	acts = s.after(100*time.Millisecond).ready(1, "h0")
	if has[GenerationReady](acts) {
		t.Fatal("rendezvous complete while waiting for slots")
	}
	acts = s.after(10 * time.Second).tick() // the cooldown ends: generation 2
	s.expectPlan(acts, 2, "h0", "h1")
	acts = s.after(time.Second).ready(1, "h1")
	if r := ready(acts); r == nil || r.Generation != 2 || r.Latency != 11100*time.Millisecond {
		t.Fatalf("generation 2's rendezvous: %+v, want 11.1s after the failure", r)
	}
	var got []string
	for _, p := range s.m.Snapshot().WorldHistory {
		got = append(got, p.At.Sub(t0).String()+":"+string(rune('0'+p.Generation))+":"+string(rune('0'+p.WorldSize)))
	}
	if want := []string{"0s:1:2", "1.6s:1:0", "11.6s:2:2"}; !slices.Equal(got, want) {
		t.Fatalf("world history %v, want %v", got, want)
	}
}

func ready(acts []Action) *GenerationReady {
	for _, a := range acts {
		if r, ok := a.(GenerationReady); ok {
			return &r
		}
	}
	return nil
}

// The journal keeps the newest events only.
func TestEventsAreBounded(t *testing.T) {
	j := newJournal()
	for i := range maxEvents + 10 {
		j.event(t0.Add(time.Duration(i)*time.Second), EventNotice, "n%d", i)
	}
	if len(j.events) != maxEvents || j.events[0].Message != "n10" || j.events[maxEvents-1].Message != "n109" {
		t.Fatalf("%d events from %q to %q", len(j.events), j.events[0].Message, j.events[len(j.events)-1].Message)
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
