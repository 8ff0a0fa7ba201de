package driver

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/hosts"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

var t0 = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

// sim drives a Machine through a scenario with its own clock.
type sim struct {
	t   *testing.T
	m   *Machine
	now time.Time
}

func newSim(t *testing.T, cfg Config) *sim {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return &sim{t: t, m: NewMachine(cfg), now: t0}
}

func (s *sim) after(d time.Duration) *sim { s.now = s.now.Add(d); return s }

func (s *sim) hosts(ids ...string) []Action {
	var hs []providers.Host
	for _, id := range ids {
		hs = append(hs, providers.Host{ID: id, Addr: "127.0.0.1", Slots: 1})
	}
	return s.m.Step(HostsDiscovered{Now: s.now, Hosts: hs})
}

func wid(host string) protocol.WorkerID { return protocol.WorkerID{Host: host, Slot: 0} }

func (s *sim) ready(gen uint64, hosts ...string) []Action {
	var acts []Action
	for _, h := range hosts {
		acts = append(acts, s.m.Step(WorkerReported{Now: s.now, Worker: wid(h), Generation: gen, State: protocol.Ready})...)
	}
	return acts
}

func (s *sim) exit(host string, code int) []Action {
	return s.m.Step(WorkerExited{Now: s.now, Worker: wid(host), Code: code})
}

func (s *sim) tick() []Action { return s.m.Step(Tick{Now: s.now}) }

// plan returns the hosts of the last Publish in rank order.
func plan(acts []Action) (uint64, []string) {
	for i := len(acts) - 1; i >= 0; i-- {
		if p, ok := acts[i].(Publish); ok {
			order := make([]string, len(p.Plan))
			for id, a := range p.Plan {
				order[a.Rank] = id.Host
			}
			return p.Generation, order
		}
	}
	return 0, nil
}

func launched(acts []Action) []string {
	var out []string
	for _, a := range acts {
		if l, ok := a.(Launch); ok {
			out = append(out, l.Worker.Host)
		}
	}
	return out
}

func stopped(acts []Action) []string {
	var out []string
	for _, a := range acts {
		if s, ok := a.(Stop); ok {
			out = append(out, s.Worker.Host)
		}
	}
	return out
}

func finish(acts []Action) *Finish {
	for _, a := range acts {
		if f, ok := a.(Finish); ok {
			return &f
		}
	}
	return nil
}

func has[T Action](acts []Action) bool {
	for _, a := range acts {
		if _, ok := a.(T); ok {
			return true
		}
	}
	return false
}

func (s *sim) expectPlan(acts []Action, gen uint64, order ...string) {
	s.t.Helper()
	g, got := plan(acts)
	if g != gen || !slices.Equal(got, order) {
		s.t.Fatalf("plan: generation %d %v, want generation %d %v (actions %v)", g, got, gen, order, acts)
	}
}

// start runs the first generation on hosts h0..h(n-1) and registers everyone.
func (s *sim) start(n int) []string {
	s.t.Helper()
	var ids []string
	for i := range n {
		ids = append(ids, fmt.Sprintf("h%d", i))
	}
	acts := s.hosts(ids...)
	s.expectPlan(acts, 1, ids...)
	if got := launched(acts); !slices.Equal(got, ids) {
		s.t.Fatalf("launched %v, want %v", got, ids)
	}
	s.ready(0, ids...)
	return ids
}

func TestStartWaitsForNPThenLaunchesInOrder(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2})
	if acts := s.hosts("b", "a"); has[Publish](acts) {
		t.Fatalf("started with 2 of -np 3 slots: %v", acts)
	}
	acts := s.after(time.Second).hosts("b", "a", "c")
	s.expectPlan(acts, 1, "a", "b", "c") // new hosts ordered by launch time, then ID
}

func TestStartWithMinNPAfterElasticTimeout(t *testing.T) {
	s := newSim(t, Config{NP: 4, MinNP: 2, ElasticTimeout: time.Minute})
	s.hosts("a", "b")
	if acts := s.after(59 * time.Second).tick(); has[Publish](acts) {
		t.Fatal("started before --elastic-timeout")
	}
	s.expectPlan(s.after(time.Second).tick(), 1, "a", "b")
}

func TestBelowMinNPPastElasticTimeoutFails(t *testing.T) {
	s := newSim(t, Config{NP: 4, MinNP: 3, ElasticTimeout: time.Minute})
	s.hosts("a", "b")
	f := finish(s.after(time.Minute).tick())
	if f == nil || f.Code != ExitFailed || !strings.Contains(f.Reason, "fewer than --min-np 3") {
		t.Fatalf("finish = %+v", f)
	}
}

// A worker dies: its slot is blacklisted, the survivors keep their order, and the job goes on
// smaller; after the cooldown, when discovery lists the slot again, the job grows back and the
// returning slot is appended at the end.
func TestFailureShrinksThenGrowsBack(t *testing.T) {
	s := newSim(t, Config{NP: 4, MinNP: 2, CooldownMin: 10 * time.Second})
	ids := s.start(4)
	acts := s.after(time.Second).exit("h1", 137)
	if has[Publish](acts) {
		t.Fatal("published before the survivors reached the barrier")
	}
	if !has[Abandon](acts) {
		t.Fatal("generation 1 not abandoned: ranks still connecting would wait for the dead one")
	}
	acts = s.ready(1, "h0", "h2")
	if has[Publish](acts) {
		t.Fatal("published before every survivor reached the barrier")
	}
	acts = s.ready(1, "h3")
	s.expectPlan(acts, 2, "h0", "h2", "h3")
	if len(launched(acts)) != 0 {
		t.Fatalf("survivors relaunched: %v", launched(acts))
	}
	if s.m.Resets().All != 1 || s.m.Resets().Failures != 1 {
		t.Fatalf("resets %d/%d, want 1/1", s.m.Resets().All, s.m.Resets().Failures)
	}
	// Still in cooldown: discovery lists it, nothing changes.
	if acts := s.after(5 * time.Second).hosts(ids...); has[NotifyHosts](acts) {
		t.Fatalf("blacklisted slot came back during its cooldown: %v", acts)
	}
	// Discovery reports only changes: the cooldown's end alone brings the slot back, since
	// the latest discovery result still lists it.
	acts = s.after(6 * time.Second).tick()
	if !has[NotifyHosts](acts) {
		t.Fatalf("slot back after its cooldown, but workers not told: %v", acts)
	}
	acts = s.ready(2, "h0", "h2", "h3")
	s.expectPlan(acts, 3, "h0", "h2", "h3", "h1")
	if got := launched(acts); !slices.Equal(got, []string{"h1"}) {
		t.Fatalf("launched %v, want [h1]", got)
	}
	if s.m.Resets().All != 2 || s.m.Resets().Failures != 1 {
		t.Fatalf("resets %d/%d, want 2/1: a scale-up is not a failure", s.m.Resets().All, s.m.Resets().Failures)
	}
	s.ready(2, "h1") // registers for generation 3
	for _, h := range []string{"h0", "h2", "h3"} {
		if f := finish(s.exit(h, 0)); f != nil {
			t.Fatalf("finished before every worker did: %+v", f)
		}
	}
	if f := finish(s.exit("h1", 0)); f == nil || f.Code != ExitOK {
		t.Fatalf("finish = %+v, want success", f)
	}
}

// A slot that fails again soon after each return is flapping: its failures do not count
// toward --reset-limit, and after --flap-limit such returns it is quarantined; the healthy
// job goes on without it, and the operator's release brings it back at once.
func TestFlappingSlotIsQuarantined(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, ResetLimit: 1, CooldownMin: time.Second, CooldownMax: time.Second, FlapWindow: time.Minute, FlapLimit: 3})
	s.start(3)
	gen := uint64(1)
	// One reset: h1 fails, the survivors go on as gen+1.
	fail := func() {
		t.Helper()
		acts := s.after(5*time.Second).exit("h1", 1)
		acts = append(acts, s.ready(gen, "h0", "h2")...)
		gen++
		s.expectPlan(acts, gen, "h0", "h2")
	}
	// Its return: the cooldown is over, the workers agree at a commit, h1 is launched.
	back := func() {
		t.Helper()
		if acts := s.after(2 * time.Second).tick(); !has[NotifyHosts](acts) {
			t.Fatalf("h1 not back after its cooldown: %v", acts)
		}
		acts := s.ready(gen, "h0", "h2")
		gen++
		s.expectPlan(acts, gen, "h0", "h2", "h1")
		s.ready(gen-1, "h1")
	}
	fail() // a first failure: counts
	for range 3 {
		back()
		fail() // within --flap-window of its return: flapping, not counted
	}
	if f := finish(nil); s.m.Done() || f != nil {
		t.Fatal("the job ended")
	}
	if s.m.Resets().Failures != 4 || s.m.Resets().Counted != 1 {
		t.Fatalf("failure resets %d, counted %d; want 4 and 1", s.m.Resets().Failures, s.m.Resets().Counted)
	}
	if acts := s.after(time.Hour).tick(); has[NotifyHosts](acts) || len(launched(acts)) > 0 {
		t.Fatal("a quarantined slot came back by itself")
	}
	st := s.m.Snapshot()
	for _, h := range st.Hosts {
		if want := map[bool]int{true: 1, false: 0}[h.ID == "h1"]; h.Quarantined != want {
			t.Fatalf("host %s: %d quarantined slots, want %d", h.ID, h.Quarantined, want)
		}
		if h.ID == "h1" && h.State != "quarantined" {
			t.Fatalf("host h1 is %q, want quarantined (its one slot is)", h.State)
		}
	}
	if !strings.Contains(eventsText(st), "slot h1/0 is flapping") {
		t.Fatalf("the journal does not say h1 is flapping: %s", eventsText(st))
	}
	n, acts := s.m.Release(s.now, "h1")
	if n != 1 || !has[NotifyHosts](acts) {
		t.Fatalf("release: %d slots, actions %v", n, acts)
	}
	acts = s.ready(gen, "h0", "h2")
	s.expectPlan(acts, gen+1, "h0", "h2", "h1")
	// Its history is forgotten: a failure now is a first failure, and counts (limit 1 passed).
	s.ready(gen, "h1")
	acts = s.after(5*time.Second).exit("h1", 1)
	acts = append(acts, s.ready(gen+1, "h0", "h2")...)
	if f := finish(acts); f == nil || !strings.Contains(f.Reason, "reset limit reached: 2") {
		t.Fatalf("finish %+v, want the reset limit passed by a counted failure", f)
	}
}

// With --checkpoint-dir, losing every worker is not the end: the slots that come back are
// launched again as a new generation (their rank 0 resumes from the checkpoint).
func TestTotalLossStartsOverWithCheckpoints(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, CooldownMin: time.Second, CooldownMax: time.Second, CheckpointDir: "/ckpt"})
	s.start(3)
	var acts []Action
	for _, h := range []string{"h0", "h1", "h2"} {
		acts = append(acts, s.exit(h, 137)...)
	}
	if f := finish(acts); f != nil {
		t.Fatalf("the job ended: %+v", f)
	}
	acts = s.after(2 * time.Second).tick()
	s.expectPlan(acts, 2, "h0", "h1", "h2")
	if got := launched(acts); !slices.Equal(got, []string{"h0", "h1", "h2"}) {
		t.Fatalf("launched %v, want every slot again", got)
	}
	if !strings.Contains(eventsText(s.m.Snapshot()), "starts over from the newest checkpoint in /ckpt") {
		t.Fatal("the journal does not say the job starts over")
	}
	// Without it, the same loss ends the job, and says what would have saved it.
	s = newSim(t, Config{NP: 3, MinNP: 2})
	s.start(3)
	acts = nil
	for _, h := range []string{"h0", "h1", "h2"} {
		acts = append(acts, s.exit(h, 137)...)
	}
	if f := finish(acts); f == nil || f.Code != ExitFailed || !strings.Contains(f.Reason, "--checkpoint-dir") {
		t.Fatalf("finish %+v", f)
	}
}

// The loop asks NextDeadline with the clock as it is when it comes back to wait, which may be
// past cooldowns that ended while it stepped the last event. Those must still bring a Tick:
// here the Tick for h0's return finds one usable slot of --min-np 2, and by the time the loop
// asks for its next deadline h1's and h2's cooldowns have ended too. Asking must not take them
// in unseen, leaving only --elastic-timeout to wait for (the driver hung "waiting for slots").
func TestTotalLossCooldownsEndingWhileTheLoopSteps(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, CooldownMin: time.Second, CooldownMax: time.Second, CheckpointDir: "/ckpt"})
	s.start(3)
	start := s.now
	for i, h := range []string{"h0", "h1", "h2"} { // SIGKILLed together, seen a few ms apart
		s.now = start.Add(time.Duration(i) * 10 * time.Millisecond)
		if f := finish(s.exit(h, -1)); f != nil {
			t.Fatalf("the job ended: %+v", f)
		}
	}
	if dl := s.m.NextDeadline(s.now); !dl.Equal(start.Add(time.Second)) {
		t.Fatalf("next deadline %v after the loss, want h0's return at %v", dl, start.Add(time.Second))
	}
	s.now = start.Add(time.Second + 5*time.Millisecond) // h0 is back, h1 and h2 are not
	if _, order := plan(s.tick()); order != nil {
		t.Fatalf("generation planned on %v with one usable slot", order)
	}
	now := start.Add(time.Second + 30*time.Millisecond) // the loop is back: every cooldown is over
	dl := s.m.NextDeadline(now)
	if dl.IsZero() || dl.After(now) {
		t.Fatalf("next deadline %v at %v, with every cooldown over: the slots that came back wait for no Tick", dl, now)
	}
	s.now = now
	acts := s.tick()
	s.expectPlan(acts, 2, "h0", "h1", "h2")
}

// A slot that fails long after its return is not flapping: every failure counts.
func TestLateFailuresAreNotFlapping(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, CooldownMin: time.Second, CooldownMax: time.Second, FlapWindow: time.Minute})
	s.start(3)
	gen := uint64(1)
	for range 4 {
		acts := s.after(2*time.Minute).exit("h1", 1)
		acts = append(acts, s.ready(gen, "h0", "h2")...)
		gen++
		s.expectPlan(acts, gen, "h0", "h2")
		s.after(2 * time.Second).tick()
		acts = s.ready(gen, "h0", "h2")
		gen++
		s.expectPlan(acts, gen, "h0", "h2", "h1")
		s.ready(gen-1, "h1")
	}
	if s.m.Resets().Counted != 4 || len(s.m.hosts.Quarantined()) != 0 {
		t.Fatalf("counted %d, quarantined %v; want 4 and none", s.m.Resets().Counted, s.m.hosts.Quarantined())
	}
}

// Horovod #3852: a worker removed with its host exits 0; that must not end the job.
// A slot whose host discovery no longer lists does not come back when its cooldown ends.
func TestBlacklistedSlotOfVanishedHostStaysOut(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, CooldownMin: 10 * time.Second})
	s.start(3)
	s.exit("h1", 1)
	s.expectPlan(s.ready(1, "h0", "h2"), 2, "h0", "h2")
	s.hosts("h0", "h2")
	if acts := s.after(time.Minute).tick(); has[NotifyHosts](acts) {
		t.Fatalf("a slot discovery no longer lists came back: %v", acts)
	}
}

func TestRemovedWorkerExitZeroDoesNotEndJob(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2})
	s.start(3)
	if acts := s.hosts("h0", "h1"); !has[NotifyHosts](acts) {
		t.Fatalf("host removal not notified: %v", acts)
	}
	acts := s.ready(1, "h0", "h1", "h2")
	s.expectPlan(acts, 2, "h0", "h1")
	if got := stopped(acts); !slices.Equal(got, []string{"h2"}) {
		t.Fatalf("stopped %v, want the removed worker", got)
	}
	if f := finish(s.exit("h2", 0)); f != nil {
		t.Fatalf("the removed worker's exit 0 ended the job: %+v", f)
	}
	if s.m.Resets().Failures != 0 {
		t.Fatalf("a removal counted as a failure reset")
	}
}

func TestHungWorkerFailsAtBarrierTimeout(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, BarrierTimeout: 30 * time.Second})
	s.start(3)
	s.ready(1, "h0", "h2") // h1 is stopped (SIGSTOP): it never arrives
	if acts := s.after(29 * time.Second).tick(); has[Publish](acts) || len(stopped(acts)) > 0 {
		t.Fatal("acted before --barrier-timeout")
	}
	acts := s.after(time.Second).tick()
	if got := stopped(acts); !slices.Equal(got, []string{"h1"}) {
		t.Fatalf("stopped %v, want the hung worker", got)
	}
	s.expectPlan(acts, 2, "h0", "h2")
	if s.m.Resets().Failures != 1 {
		t.Fatalf("failure resets %d, want 1", s.m.Resets().Failures)
	}
}

// A worker that reports a silent peer cuts the barrier to HungWindow: the members still
// missing when it is over (two here, so neither can be told hung by elimination) are killed at
// once (no grace), and the job goes on long before --barrier-timeout.
func TestSilentPeerCutsTheBarrierShort(t *testing.T) {
	s := newSim(t, Config{NP: 4, MinNP: 2, BarrierTimeout: time.Minute})
	s.start(4)
	acts := s.m.Step(WorkerReported{Now: s.now, Worker: wid("h0"), Generation: 1, State: protocol.Ready, Message: "timed out", SilentPeer: true})
	if !has[Abandon](acts) {
		t.Fatalf("a silent peer should begin a reset: %+v", acts)
	}
	s.after(300*time.Millisecond).ready(1, "h1") // h2 and h3 are stopped
	if acts := s.after(HungWindow - 400*time.Millisecond).tick(); len(stopped(acts)) > 0 || has[Publish](acts) {
		t.Fatal("acted before the hung window was over")
	}
	acts = s.after(100 * time.Millisecond).tick()
	var stops []Stop
	for _, a := range acts {
		if st, ok := a.(Stop); ok {
			stops = append(stops, st)
		}
	}
	if len(stops) != 2 || stops[0].Worker != wid("h2") || stops[1].Worker != wid("h3") {
		t.Fatalf("stops %+v, want h2 and h3", stops)
	}
	for _, st := range stops {
		if !st.Deadline.Equal(s.now) || !strings.Contains(st.Reason, "silent") {
			t.Fatalf("stop %+v, want it killed now, as hung", st)
		}
	}
	s.expectPlan(acts, 2, "h0", "h1")
	if s.m.Resets().Failures != 1 {
		t.Fatalf("failure resets %d, want 1", s.m.Resets().Failures)
	}
}

// When everyone but one has reset after a silent report, the one missing is the hung one: it
// is killed at once, without waiting out the window.
func TestSilentPeerLastOneMissingIsFailedAtOnce(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, BarrierTimeout: time.Minute})
	s.start(3)
	s.m.Step(WorkerReported{Now: s.now, Worker: wid("h0"), Generation: 1, State: protocol.Ready, SilentPeer: true})
	acts := s.after(10*time.Millisecond).ready(1, "h2")
	if got := stopped(acts); !slices.Equal(got, []string{"h1"}) {
		t.Fatalf("stopped %v, want h1, the only one missing", got)
	}
	s.expectPlan(acts, 2, "h0", "h2")
}

// A worker launched into a generation that stops as it starts (SIGSTOP, a hang) never
// registers; the others wait for it as the generation forms and, at the formation timeout,
// report a silent peer. It is the one failed, even while a registered member's report is a
// moment behind theirs: that member is healthy, only slower to tell.
func TestSilentPeerDuringFormationFailsTheMemberThatNeverRegistered(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, BarrierTimeout: time.Minute, CooldownMin: time.Second})
	ids := s.start(3)
	s.after(time.Second).exit("h1", 137)
	acts := s.ready(1, "h0", "h2")
	s.expectPlan(acts, 2, "h0", "h2")
	s.after(2 * time.Second).hosts(ids...)
	s.tick()
	acts = s.ready(2, "h0", "h2")
	s.expectPlan(acts, 3, "h0", "h2", "h1")
	if got := launched(acts); !slices.Equal(got, []string{"h1"}) {
		t.Fatalf("launched %v, want [h1]", got)
	}
	s.m.Step(WorkerStarted{Now: s.now, Worker: wid("h1"), Generation: 3})
	// h1 stops before it registers; at the formation timeout h0 reports first.
	acts = s.after(5 * time.Second).m.Step(WorkerReported{Now: s.now, Worker: wid("h0"), Generation: 3, State: protocol.Ready,
		Message: "generation did not form: 2 of 3 members reached the group before its formation timeout", SilentPeer: true})
	if got := stopped(acts); !slices.Equal(got, []string{"h1"}) {
		t.Fatalf("stopped %v, want h1, which never registered (not h2, whose report is on its way)", got)
	}
	acts = s.after(10*time.Millisecond).ready(3, "h2")
	s.expectPlan(acts, 4, "h0", "h2")
}

// probed is h's READY for gen after a silent peer, naming the ranks whose hosts answered its
// probe and those that did not.
func (s *sim) probed(gen uint64, h string, reached, unreachable []int) []Action {
	return s.m.Step(WorkerReported{Now: s.now, Worker: wid(h), Generation: gen, State: protocol.Ready, Message: "timed out",
		SilentPeer: true, Reached: reached, Unreachable: unreachable})
}

func stops(acts []Action) []Stop {
	var out []Stop
	for _, a := range acts {
		if st, ok := a.(Stop); ok {
			out = append(out, st)
		}
	}
	return out
}

// A host cut off from its peers but not from the driver: every member's collective times out
// and every one reports, the cut one too, each naming the hosts it reached and those it could
// not. Once all have, the group that can train together goes on and the cut one is failed; a
// healthy member whose report comes last is not taken for hung meanwhile.
func TestCutOffMemberIsFailed(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, BarrierTimeout: time.Minute})
	s.start(3)
	acts := s.probed(1, "h2", nil, []int{0, 1}) // the cut host: no peer answers it
	acts = append(acts, s.after(5*time.Millisecond).probed(1, "h0", []int{1}, []int{2})...)
	if got := stops(acts); len(got) > 0 {
		t.Fatalf("stopped %+v before every member reported", got)
	}
	acts = s.after(5*time.Millisecond).probed(1, "h1", []int{0}, []int{2})
	got := stops(acts)
	if len(got) != 1 || got[0].Worker != wid("h2") || !strings.Contains(got[0].Reason, "could not be reached over the network by h0/0, h1/0, or could not reach them: cut off from the 2 members that go on") {
		t.Fatalf("stops %+v, want h2, cut off", got)
	}
	s.expectPlan(acts, 2, "h0", "h1")
}

// Two hosts cut off at once (from the rest and from each other), and a network split in
// halves: the largest group that can train together goes on; of equal ones, rank 0's.
func TestCutOffGroups(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reports map[string][2][]int // host: reached, unreachable (ranks)
	}{
		{"two hosts cut off", map[string][2][]int{
			"h0": {{1}, {2, 3}}, "h1": {{0}, {2, 3}}, "h2": {nil, {0, 1, 3}}, "h3": {nil, {0, 1, 2}},
		}},
		{"split in halves", map[string][2][]int{
			"h0": {{1}, {2, 3}}, "h1": {{0}, {2, 3}}, "h2": {{3}, {0, 1}}, "h3": {{2}, {0, 1}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, Config{NP: 4, MinNP: 2, BarrierTimeout: time.Minute})
			s.start(4)
			var acts []Action
			for _, h := range []string{"h3", "h2", "h1", "h0"} {
				acts = append(acts, s.after(time.Millisecond).probed(1, h, tc.reports[h][0], tc.reports[h][1])...)
			}
			if got := stopped(acts); !slices.Equal(got, []string{"h2", "h3"}) {
				t.Fatalf("stopped %v, want h2 and h3", got)
			}
			s.expectPlan(acts, 2, "h0", "h1")
		})
	}
}

// A split in halves where a member of rank 0's half probed nothing (its collective failed
// on a peer's abort, not a silent one): the others' reports still place it, and its half is
// the one that goes on, not the other half, larger than what reported on rank 0's side.
func TestCutOffCountsMembersWithoutAReport(t *testing.T) {
	s := newSim(t, Config{NP: 4, MinNP: 2, BarrierTimeout: time.Minute})
	s.start(4)
	acts := s.probed(1, "h0", []int{1}, []int{2, 3})
	acts = append(acts, s.probed(1, "h2", []int{3}, []int{0, 1})...)
	acts = append(acts, s.probed(1, "h3", []int{2}, []int{0, 1})...)
	acts = append(acts, s.ready(1, "h1")...)
	if got := stopped(acts); !slices.Equal(got, []string{"h2", "h3"}) {
		t.Fatalf("stopped %v, want h2 and h3: rank 0's half goes on", got)
	}
	s.expectPlan(acts, 2, "h0", "h1")
}

// One failed probe does not set a member apart from a group it is otherwise joined to (h1
// reached both): no one is failed, and the next generation has everyone.
func TestCutOffNeedsTheGroupApart(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, BarrierTimeout: time.Minute})
	s.start(3)
	acts := s.probed(1, "h0", []int{1}, []int{2})
	acts = append(acts, s.probed(1, "h1", []int{0, 2}, []int{})...)
	acts = append(acts, s.ready(1, "h2")...)
	if got := stops(acts); len(got) > 0 {
		t.Fatalf("stopped %+v: h2 is joined to the others through h1", got)
	}
	s.expectPlan(acts, 2, "h0", "h1", "h2")
}

// Without a silent report, a missing member still gets --barrier-timeout (it may be slow, not
// hung); once it is failed there, it is killed without the grace.
func TestBarrierTimeoutKillsWithoutGrace(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, BarrierTimeout: 30 * time.Second})
	s.start(3)
	s.ready(1, "h0", "h2")
	if acts := s.after(5 * time.Second).tick(); len(stopped(acts)) > 0 {
		t.Fatal("a READY without a silent peer must not cut the barrier")
	}
	acts := s.after(25 * time.Second).tick()
	if got := stopped(acts); !slices.Equal(got, []string{"h1"}) {
		t.Fatalf("stopped %v at --barrier-timeout, want the hung h1", got)
	}
	for _, a := range acts {
		if st, ok := a.(Stop); ok && !st.Deadline.Equal(s.now) {
			t.Fatalf("stop %+v: a hung worker gets no grace", st)
		}
	}
}

func TestUnregisteredWorkerFailsAtStartTimeout(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, StartTimeout: time.Minute})
	s.hosts("h0", "h1", "h2")
	s.ready(0, "h0", "h2")
	acts := s.after(time.Minute).tick()
	if got := stopped(acts); !slices.Equal(got, []string{"h1"}) {
		t.Fatalf("stopped %v, want the worker that never registered", got)
	}
	acts = append(acts, s.ready(1, "h0", "h2")...)
	s.expectPlan(acts, 2, "h0", "h2")
}

func TestAllWorkersFailing(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 1})
	s.start(3)
	s.exit("h0", 1)
	s.exit("h1", 1)
	f := finish(s.exit("h2", 3))
	if f == nil || f.Code != ExitFailed || !strings.Contains(f.Reason, "all 3 workers of generation 1 failed") || !strings.Contains(f.Reason, "exit 3") {
		t.Fatalf("finish = %+v", f)
	}
}

// Workers failing one by one before they register (a broken command) end the job as soon as
// the last one fails, not after --elastic-timeout.
func TestAllWorkersFailingBeforeRegistering(t *testing.T) {
	s := newSim(t, Config{NP: 3, Mode: ModeInProcess})
	s.hosts("h0", "h1", "h2")
	s.exit("h0", 2)
	s.after(time.Second).exit("h1", 2)
	f := finish(s.exit("h2", 2))
	if f == nil || f.Code != ExitFailed || !strings.Contains(f.Reason, "all 3 workers of generation 1 failed") {
		t.Fatalf("finish = %+v", f)
	}
}

func TestResetLimit(t *testing.T) {
	s := newSim(t, Config{NP: 4, MinNP: 1, ResetLimit: 1})
	s.start(4)
	s.exit("h3", 1)
	s.expectPlan(s.ready(1, "h0", "h1", "h2"), 2, "h0", "h1", "h2")
	s.exit("h2", 1)
	f := finish(s.ready(2, "h0", "h1"))
	if f == nil || f.Code != ExitFailed || !strings.Contains(f.Reason, "reset limit reached") {
		t.Fatalf("finish = %+v", f)
	}
}

func TestFailureAfterAnotherFinished(t *testing.T) {
	s := newSim(t, Config{NP: 2})
	s.start(2)
	s.exit("h0", 0)
	f := finish(s.exit("h1", 2))
	if f == nil || f.Code != ExitFailed || !strings.Contains(f.Reason, "after another worker had finished") {
		t.Fatalf("finish = %+v", f)
	}
}

func TestInterruptStopsEveryWorker(t *testing.T) {
	s := newSim(t, Config{NP: 3})
	s.start(3)
	acts := s.m.Step(Interrupted{Now: s.now, Reason: "SIGTERM"})
	if got := stopped(acts); !slices.Equal(got, []string{"h0", "h1", "h2"}) {
		t.Fatalf("stopped %v", got)
	}
	if f := finish(acts); f == nil || f.Code != ExitInterrupted {
		t.Fatalf("finish = %+v", f)
	}
	if acts := s.exit("h0", 0); len(acts) != 0 || !s.m.Done() {
		t.Fatalf("acted after finishing: %v", acts)
	}
}

func TestMaxNPCapsAndExtraSlotsWait(t *testing.T) {
	s := newSim(t, Config{NP: 2, MaxNP: 3})
	s.expectPlan(s.hosts("a", "b", "c", "d"), 1, "a", "b", "c")
}

func TestAssignLocalAndCrossRanks(t *testing.T) {
	order := []protocol.WorkerID{{Host: "x", Slot: 0}, {Host: "y", Slot: 0}, {Host: "x", Slot: 1}, {Host: "z", Slot: 0}}
	addr := map[protocol.WorkerID]string{order[0]: "10.0.0.1", order[1]: "10.0.0.2", order[2]: "10.0.0.1", order[3]: "10.0.0.3"}
	p := assign(order, addr, 5)
	want := []protocol.Assignment{
		{Generation: 5, Rank: 0, Size: 4, LocalRank: 0, LocalSize: 2, CrossRank: 0, CrossSize: 3},
		{Generation: 5, Rank: 1, Size: 4, LocalRank: 0, LocalSize: 1, CrossRank: 1, CrossSize: 3},
		{Generation: 5, Rank: 2, Size: 4, LocalRank: 1, LocalSize: 2, CrossRank: 0, CrossSize: 1},
		{Generation: 5, Rank: 3, Size: 4, LocalRank: 0, LocalSize: 1, CrossRank: 2, CrossSize: 3},
	}
	for i, id := range order {
		got := p[id]
		got.HostsVersion = 0
		if got != want[i] {
			t.Errorf("%v: %+v, want %+v", id, got, want[i])
		}
	}
}

func TestConfigValidateNamesTheFlag(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{NP: 0}, "-np 0"},
		{Config{NP: 2, MinNP: 3}, "--min-np 3"},
		{Config{NP: 4, MaxNP: 2}, "--max-np 2"},
		{Config{NP: 1, ResetLimit: -1}, "--reset-limit"},
		{Config{NP: 1, CooldownMin: time.Minute, CooldownMax: time.Second}, "--blacklist-cooldown-range"},
		{Config{NP: 1, CooldownDecay: -time.Second}, "--blacklist-cooldown-range"}, // would have made hosts.New panic
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
}

// An interruption notice moves the job off the host before the cloud takes it: the workers
// agree at their next step and reset without rollback (not a failure reset); the notice is
// completed once the host's worker has exited. A rebalance recommendation changes nothing.
func TestInterruptionNoticeMovesOffTheHost(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2})
	s.start(3)
	if acts := s.m.Step(NoticeReceived{Now: s.now, Notice: providers.Notice{ID: "r", HostID: "h1", Kind: providers.Rebalance}}); has[NotifyHosts](acts) {
		t.Fatalf("a rebalance recommendation moved the job: %v", acts)
	}
	n := providers.Notice{ID: "n1", HostID: "h2", Kind: providers.Interruption, Deadline: s.now.Add(2 * time.Minute)}
	acts := s.m.Step(NoticeReceived{Now: s.now, Notice: n})
	if !has[NotifyHosts](acts) || has[CompleteNotice](acts) {
		t.Fatalf("notice: %v, want workers told and the notice still open", acts)
	}
	acts = s.ready(1, "h0", "h1", "h2")
	s.expectPlan(acts, 2, "h0", "h1")
	if got := stopped(acts); !slices.Equal(got, []string{"h2"}) {
		t.Fatalf("stopped %v, want the interrupted host's worker", got)
	}
	if s.m.Resets().Failures != 0 {
		t.Fatal("a notice counted as a failure")
	}
	acts = s.exit("h2", 143)
	if !has[CompleteNotice](acts) {
		t.Fatalf("notice not completed after the host's worker exited: %v", acts)
	}
	// The host stays out while discovery still lists it.
	if acts := s.after(time.Minute).hosts("h0", "h1", "h2"); has[NotifyHosts](acts) {
		t.Fatalf("the interrupted host came back: %v", acts)
	}
}

// A zone reclaiming hosts one notice after another: the workers are told once a generation,
// and the next generation leaves out every host noticed before it formed.
func TestNoticesTellTheWorkersOnceAGeneration(t *testing.T) {
	s := newSim(t, Config{NP: 5, MinNP: 1})
	s.start(5)
	notice := func(host string) []Action {
		return s.m.Step(NoticeReceived{Now: s.now, Notice: providers.Notice{ID: "n-" + host, HostID: host, Kind: providers.Interruption, Deadline: s.now.Add(2 * time.Minute)}})
	}
	if acts := notice("h4"); !has[NotifyHosts](acts) {
		t.Fatalf("first notice: %v, want the workers told", acts)
	}
	if acts := notice("h3"); has[NotifyHosts](acts) {
		t.Fatalf("second notice of the generation: %v, want no second host update", acts)
	}
	// A host removed in the same generation is not told again either.
	if acts := s.hosts("h0", "h1", "h2", "h3"); has[NotifyHosts](acts) {
		t.Fatalf("discovery in the same generation: %v, want no second host update", acts)
	}
	s.expectPlan(s.ready(1, "h0", "h1", "h2", "h3", "h4"), 2, "h0", "h1", "h2")
	// The next generation's notice is told.
	if acts := notice("h2"); !has[NotifyHosts](acts) {
		t.Fatalf("notice of generation 2: %v, want the workers told", acts)
	}
	s.expectPlan(s.ready(2, "h0", "h1", "h2"), 3, "h0", "h1")
}

// A host that discovery reports as Leaving is moved off like a removed one.
func TestLeavingHostFromDiscovery(t *testing.T) {
	s := newSim(t, Config{NP: 2, MinNP: 1})
	s.start(2)
	acts := s.m.Step(HostsDiscovered{Now: s.now, Hosts: []providers.Host{
		{ID: "h0", Addr: "127.0.0.1", Slots: 1}, {ID: "h1", Addr: "127.0.0.1", Slots: 1, Leaving: true}}})
	if !has[NotifyHosts](acts) {
		t.Fatalf("leaving host not acted on: %v", acts)
	}
	s.expectPlan(s.ready(1, "h0", "h1"), 2, "h0")
}

// A GPU fault under a worker's slot fails that worker: it is stopped, its slot blacklisted,
// and the others reset as after a failure; a fault under a spare slot only keeps it out.
func TestGPUFaultFailsTheSlot(t *testing.T) {
	s := newSim(t, Config{NP: 2, MinNP: 1, MaxNP: 2, CooldownMin: time.Minute})
	acts := s.m.Step(HostsDiscovered{Now: s.now, Hosts: []providers.Host{{ID: "g", Addr: "127.0.0.1", Slots: 3}}})
	_, order := plan(acts)
	if len(order) != 2 {
		t.Fatalf("plan %v, want two slots of g", order)
	}
	s.m.Step(WorkerReported{Now: s.now, Worker: protocol.WorkerID{Host: "g", Slot: 0}, Generation: 0, State: protocol.Ready})
	s.m.Step(WorkerReported{Now: s.now, Worker: protocol.WorkerID{Host: "g", Slot: 1}, Generation: 0, State: protocol.Ready})

	acts = s.m.Step(SlotsFailed{Now: s.now, Host: "g", Slots: []int{1}, Reason: "XID 79"})
	var stops []protocol.WorkerID
	for _, a := range acts {
		if st, ok := a.(Stop); ok {
			stops = append(stops, st.Worker)
		}
	}
	if !slices.Equal(stops, []protocol.WorkerID{{Host: "g", Slot: 1}}) || !has[Abandon](acts) {
		t.Fatalf("fault under slot 1: %v, want its worker stopped and the generation abandoned", acts)
	}
	// The survivor reaches the barrier: the spare slot 2 replaces 1.
	acts = s.m.Step(WorkerReported{Now: s.now, Worker: protocol.WorkerID{Host: "g", Slot: 0}, Generation: 1, State: protocol.Ready})
	var p *Publish
	for _, a := range acts {
		if pp, ok := a.(Publish); ok {
			p = &pp
		}
	}
	if p == nil {
		t.Fatalf("no new generation after the faulty slot's worker exited: %v", acts)
	}
	if _, ok := p.Plan[protocol.WorkerID{Host: "g", Slot: 1}]; ok || len(p.Plan) != 2 {
		t.Fatalf("generation 2 plan %v: want slots 0 and 2, not the faulty 1", p.Plan)
	}
	if s.m.Resets().Failures != 1 {
		t.Fatalf("failure resets %d, want 1: a GPU fault is a failure", s.m.Resets().Failures)
	}
	// A fault on the whole host fails every slot: with no slot left, the job fails.
	acts = s.m.Step(SlotsFailed{Now: s.now, Host: "g", Reason: "GPU lost"})
	var failed []int
	for _, a := range acts {
		if st, ok := a.(Stop); ok && st.Reason == "GPU lost" {
			failed = append(failed, st.Worker.Slot)
		}
	}
	if f := finish(acts); !slices.Equal(failed, []int{0, 2}) || f == nil || f.Code != ExitFailed {
		t.Fatalf("whole-host fault: stopped slots %v, finish %+v; want slots [0 2] and a failed job: %v", failed, f, acts)
	}
}

// With --slot-policy roundrobin, the slots of a generation are spread over the hosts, one per
// host in turn, rather than filling the first host.
func TestSlotPolicyRoundRobin(t *testing.T) {
	p := hosts.DefaultSlotPolicy()
	p.Name = hosts.RoundRobin
	s := newSim(t, Config{NP: 4, SlotPolicy: &p})
	acts := s.m.Step(HostsDiscovered{Now: s.now, Hosts: []providers.Host{
		{ID: "a", Addr: "10.0.0.1", Slots: 4}, {ID: "b", Addr: "10.0.0.2", Slots: 4}}})
	var got []string
	for _, a := range acts {
		if l, ok := a.(Launch); ok {
			got = append(got, l.Worker.String())
		}
	}
	// Two slots on each host; ranks stay grouped by host, so ring neighbours share a machine.
	if want := []string{"a/0", "a/1", "b/0", "b/1"}; !slices.Equal(got, want) {
		t.Fatalf("launched %v, want %v", got, want)
	}
	// Without a policy, the first host is filled first (horovodrun's order).
	s = newSim(t, Config{NP: 4})
	acts = s.m.Step(HostsDiscovered{Now: s.now, Hosts: []providers.Host{
		{ID: "a", Addr: "10.0.0.1", Slots: 4}, {ID: "b", Addr: "10.0.0.2", Slots: 4}}})
	got = nil
	for _, a := range acts {
		if l, ok := a.(Launch); ok {
			got = append(got, l.Worker.String())
		}
	}
	if want := []string{"a/0", "a/1", "a/2", "a/3"}; !slices.Equal(got, want) {
		t.Fatalf("packed: launched %v, want %v", got, want)
	}
}

// With loadaware, slow hosts get fewer of the new slots: step times from the workers and GPU
// busy from the agents feed the scores.
func TestSlotPolicyLoadAwareUsesMeasuredLoad(t *testing.T) {
	p := hosts.DefaultSlotPolicy()
	p.Name, p.Groups, p.Gradient, p.Weights = hosts.LoadAware, 2, 1, hosts.Weights{StepTime: 1, GPUBusy: 1}
	s := newSim(t, Config{NP: 2, MinNP: 1, MaxNP: 8, SlotPolicy: &p})
	hs := []providers.Host{{ID: "slow", Addr: "10.0.0.1", Slots: 1}, {ID: "fast", Addr: "10.0.0.2", Slots: 1}}
	s.m.Step(HostsDiscovered{Now: s.now, Hosts: hs})
	for _, h := range []string{"slow", "fast"} {
		s.m.Step(WorkerReported{Now: s.now, Worker: protocol.WorkerID{Host: h}, Generation: 0, State: protocol.Ready})
	}
	s.m.Step(LoadsMeasured{Now: s.now, StepTimes: map[protocol.WorkerID]time.Duration{
		{Host: "slow"}: 2 * time.Second, {Host: "fast"}: 500 * time.Millisecond}, GPUBusy: map[string]float64{"slow": 0.9}})
	if l := s.m.loads["slow"]; l.StepTime != 2*time.Second || l.GPUBusy != 0.9 {
		t.Fatalf("load of slow = %+v, want its worker's step time and its agent's GPU busy", l)
	}
	// Both hosts grow to 5 slots; 6 new slots go 4 to the fast group, 2 to the slow one.
	hs[0].Slots, hs[1].Slots = 5, 5
	acts := s.m.Step(HostsDiscovered{Now: s.now, Hosts: hs})
	if !has[NotifyHosts](acts) {
		t.Fatalf("growth not announced: %v", acts)
	}
	var acts2 []Action
	for _, h := range []string{"slow", "fast"} {
		acts2 = append(acts2, s.m.Step(WorkerReported{Now: s.now, Worker: protocol.WorkerID{Host: h}, Generation: 1, State: protocol.Ready})...)
	}
	_, order := plan(acts2)
	if order == nil {
		t.Fatal("no generation 2")
	}
	count := map[string]int{}
	for _, h := range order {
		count[h]++
	}
	if count["fast"] <= count["slow"] || count["fast"]+count["slow"] != 8 {
		t.Fatalf("generation 2 has %v slots per host, want 8 with more on the fast host", count)
	}
}

func eventsText(s Status) string {
	var b strings.Builder
	for _, e := range s.Events {
		b.WriteString(e.Message + "\n")
	}
	return b.String()
}

// A host that vanishes (killed with its agent, no notice) does not stall the job: once a
// survivor asks for a reset, the worker on a host that discovery no longer lists, or lists as
// being taken away, is counted lost at once, and the next generation starts without it,
// whichever of the two (the survivor's request, the discovery) comes first.
func TestVanishedHostsWorkerIsLostAtOnce(t *testing.T) {
	for _, c := range []struct {
		name          string
		discoverFirst bool
		leaving       bool
	}{
		{"ResetThenGone", false, false},
		{"GoneThenReset", true, false},
		{"ResetThenTerminating", false, true},
		{"TerminatingThenReset", true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSim(t, Config{NP: 3, MinNP: 2})
			s.start(3)
			discover := func() []Action {
				hs := []providers.Host{{ID: "h0", Addr: "127.0.0.1", Slots: 1}, {ID: "h1", Addr: "127.0.0.1", Slots: 1}}
				if c.leaving {
					hs = append(hs, providers.Host{ID: "h2", Addr: "127.0.0.1", Slots: 1, Leaving: true})
				}
				return s.m.Step(HostsDiscovered{Now: s.now, Hosts: hs})
			}
			var acts []Action
			if c.discoverFirst {
				s.after(time.Second)
				acts = append(acts, discover()...)
			}
			// The survivors lose their peer and ask for a reset.
			acts = append(acts, s.after(10*time.Millisecond).m.Step(WorkerReported{Now: s.now, Worker: wid("h0"), Generation: 1, State: protocol.Ready, Message: "peer lost"})...)
			acts = append(acts, s.ready(1, "h1")...)
			if !c.discoverFirst {
				if _, order := plan(acts); order != nil {
					t.Fatalf("planned %v before anything said h2 was gone", order)
				}
				acts = append(acts, s.after(time.Second).m.Step(HostsDiscovered{})...)
				acts = append(acts, discover()...)
			}
			s.expectPlan(acts, 2, "h0", "h1")
			var stop *Stop
			for _, a := range acts {
				if st, ok := a.(Stop); ok && st.Worker.Host == "h2" {
					stop = &st
				}
			}
			if stop == nil || stop.Deadline.IsZero() {
				t.Fatalf("the lost worker was not stopped at once (no grace): %v", acts)
			}
			if !strings.Contains(stop.Reason, "lost") {
				t.Errorf("stop reason %q does not say the worker was lost", stop.Reason)
			}
			// Not the job's fault: never counted toward --reset-limit. Seen first as a failure
			// it is a failure reset; seen first as the group shrinking, a planned one.
			if r := s.m.Resets(); r.Counted != 0 || r.Failures != map[bool]int{true: 0, false: 1}[c.discoverFirst] {
				t.Errorf("resets %+v", r)
			}
			// Its exit, reported at last when the agent's lease ran out, changes nothing.
			if acts := s.after(30 * time.Second).m.Step(WorkerExited{Now: s.now, Worker: wid("h2"), Code: -1}); has[Publish](acts) || has[Abandon](acts) {
				t.Fatalf("the lost worker's late exit reset the job again: %v", acts)
			}
		})
	}
}

// A worker that is only slow to reach the barrier on a host discovery still lists is waited
// for, as before.
func TestListedHostsWorkerIsWaitedFor(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2})
	s.start(3)
	acts := s.ready(1, "h0", "h1")
	acts = append(acts, s.after(time.Second).hosts("h0", "h1", "h2")...)
	if has[Publish](acts) || slices.Contains(stopped(acts), "h2") {
		t.Fatalf("a worker on a listed host was not waited for: %v", acts)
	}
	s.expectPlan(s.ready(1, "h2"), 2, "h0", "h1", "h2")
}

// In restart mode, a worker whose host left the group is stopped with the others, but the
// restart does not wait for an exit that may never be reported.
func TestRestartDoesNotWaitForAVanishedHost(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, Mode: ModeRestart})
	s.startRestart(3)
	acts := s.after(time.Second).exit("h0", 1) // a survivor's collective failed
	acts = append(acts, s.after(time.Second).hosts("h0", "h1")...)
	acts = append(acts, s.after(time.Minute).tick()...) // the collateral window ends: stop the rest
	acts = append(acts, s.exit("h1", 143)...)
	s.expectPlan(acts, 2, "h0", "h1")
	if !slices.Contains(stopped(acts), "h2") {
		t.Fatalf("the vanished host's worker was never stopped: %v", acts)
	}
}

// A worker its launcher lost without seeing it exit (its agent's lease ran out: the host is
// cut off from the driver, not dead) may still train with its peers, whose collectives then
// never fail: they are told that the hosts changed, so that they reset at their next step
// and reach the barrier, instead of training on until --barrier-timeout fails them all. A
// worker seen to exit needs no such word: its peers' collectives fail.
func TestLostWorkerTellsThePeersToReset(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, BarrierTimeout: time.Minute})
	s.start(3)
	if acts := s.exit("h1", -1); !has[NotifyHosts](acts) {
		t.Fatalf("a lost worker's peers were not told to reset: %v", acts)
	}
	acts := s.ready(1, "h0", "h2")
	s.expectPlan(acts, 2, "h0", "h2")

	s = newSim(t, Config{NP: 3, MinNP: 2, BarrierTimeout: time.Minute})
	s.start(3)
	if acts := s.exit("h1", 1); has[NotifyHosts](acts) {
		t.Fatalf("an exit seen told the peers the hosts changed: %v", acts)
	}
}
