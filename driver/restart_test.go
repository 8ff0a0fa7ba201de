package driver

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

// startRestart runs the first generation of a restart-mode job on h0..h(n-1); nobody
// registers, as a torchrun-style script never does.
func (s *sim) startRestart(n int) {
	s.t.Helper()
	var ids []string
	for i := range n {
		ids = append(ids, "h"+string(rune('0'+i)))
	}
	acts := s.hosts(ids...)
	s.expectPlan(acts, 1, ids...)
}

// exitAll reports the exits of the stopped workers, as their processes end.
func (s *sim) exitAll(hosts ...string) []Action {
	var acts []Action
	for _, h := range hosts {
		acts = append(acts, s.m.Step(WorkerExited{Now: s.now, Worker: wid(h), Code: -1, Signal: "SIGTERM"})...)
	}
	return acts
}

func TestRestartStopsTheWholeGroupAndBlamesOnlyTheCause(t *testing.T) {
	for _, mode := range []Mode{ModeRestart, ModeAuto} {
		t.Run(string(mode), func(t *testing.T) {
			s := newSim(t, Config{NP: 4, MinNP: 2, Mode: mode})
			s.startRestart(4)
			acts := s.after(time.Second).m.Step(WorkerExited{Now: s.now, Worker: wid("h1"), Code: -1, Signal: "SIGKILL"})
			if has[Publish](acts) || has[Launch](acts) || has[Abandon](acts) || has[Stop](acts) {
				t.Fatalf("after the failure, before the peers' window: %v", acts)
			}
			// A peer that dies of the failure a moment later (gloo: "Connection closed by peer")
			// is not blamed; the others are stopped when the window ends, and nothing is
			// launched while one process of generation 1 lives.
			s.after(30*time.Millisecond).exit("h2", 1)
			if got := stopped(s.after(peerExitWindow).tick()); !slices.Equal(got, []string{"h0", "h3"}) {
				t.Fatalf("stopped %v after the window, want the workers still there", got)
			}
			if acts := s.exitAll("h0"); has[Launch](acts) {
				t.Fatalf("launched beside a live worker of the old generation: %v", acts)
			}
			acts = s.exitAll("h3")
			s.expectPlan(acts, 2, "h0", "h2", "h3")
			if got := launched(acts); !slices.Equal(got, []string{"h0", "h2", "h3"}) {
				t.Fatalf("launched %v, want every slot of the new generation", got)
			}
			for _, a := range acts {
				if l, ok := a.(Launch); ok && l.Restarts != 1 {
					t.Fatalf("launch %v: Restarts %d, want 1 (TORCHELASTIC_RESTART_COUNT)", l.Worker, l.Restarts)
				}
			}
			if s.m.Resets().All != 1 || s.m.Resets().Failures != 1 {
				t.Fatalf("resets %d, failure resets %d: want 1 and 1", s.m.Resets().All, s.m.Resets().Failures)
			}
			bl := s.m.hosts.Blacklisted(s.now)
			if len(bl) != 1 || bl[0].ID != wid("h1").String() {
				t.Fatalf("blacklisted %v, want only h1's slot", bl)
			}
			if st := s.m.Snapshot(); st.Mode != "restart" || st.Phase != "running" {
				t.Fatalf("status mode %q phase %q", st.Mode, st.Phase)
			}
		})
	}
}

func TestRestartModeNeverFailsAWorkerForNotRegistering(t *testing.T) {
	s := newSim(t, Config{NP: 2, Mode: ModeRestart, StartTimeout: time.Minute})
	s.startRestart(2)
	for range 3 {
		if acts := s.after(time.Minute).tick(); has[Stop](acts) || finish(acts) != nil {
			t.Fatalf("after the start timeout: %v", acts)
		}
	}
	if dl := s.m.NextDeadline(s.now); !dl.IsZero() && !dl.After(s.now) {
		t.Fatalf("a deadline in the past (%v) would spin the driver's loop", dl)
	}
}

func TestAutoModeBecomesInProcessOnceAWorkerRegisters(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2})
	s.start(3) // registers everyone
	acts := s.exit("h2", 1)
	if got := stopped(acts); len(got) != 0 {
		t.Fatalf("in-process survivors were stopped: %v", got)
	}
	if !has[Abandon](acts) {
		t.Fatalf("no in-process reset: %v", acts)
	}
	s.expectPlan(s.ready(1, "h0", "h1"), 2, "h0", "h1")
	if st := s.m.Snapshot(); st.Mode != "in-process" {
		t.Fatalf("mode %q, want in-process", st.Mode)
	}
}

func TestRestartOnNoticeStopsEveryWorkerByTheDeadline(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, Mode: ModeRestart})
	s.startRestart(3)
	deadline := s.now.Add(2 * time.Minute)
	acts := s.after(time.Second).m.Step(NoticeReceived{Now: s.now, Source: "aws", Notice: providers.Notice{ID: "n1", HostID: "h1", Kind: providers.Interruption, Deadline: deadline}})
	var stops []Stop
	for _, a := range acts {
		if st, ok := a.(Stop); ok {
			stops = append(stops, st)
		}
	}
	if len(stops) != 3 {
		t.Fatalf("stops %v: want all three workers SIGTERMed at once, so that each can checkpoint", stops)
	}
	for _, st := range stops {
		if !st.Deadline.Equal(deadline) {
			t.Fatalf("stop %v without the notice's deadline", st)
		}
	}
	if has[CompleteNotice](acts) {
		t.Fatal("notice completed while the host's worker still runs")
	}
	s.exitAll("h0", "h2")
	acts = s.exitAll("h1")
	if !has[CompleteNotice](acts) {
		t.Fatalf("notice not completed once the host's worker was gone: %v", acts)
	}
	s.expectPlan(acts, 2, "h0", "h2")
	if s.m.Resets().Failures != 0 || s.m.j.causes[CauseNotice] != 1 {
		t.Fatalf("failure resets %d, causes %v: a notice is not a failure", s.m.Resets().Failures, s.m.j.causes)
	}
}

func TestRestartBatchesGrowth(t *testing.T) {
	s := newSim(t, Config{NP: 2, MaxNP: 4, Mode: ModeRestart, ScaleUpInterval: 30 * time.Second})
	s.startRestart(2)
	if acts := s.after(5*time.Second).hosts("h0", "h1", "h2"); has[Stop](acts) {
		t.Fatalf("restarted for growth before --scale-up-interval: %v", acts)
	}
	if acts := s.after(10*time.Second).hosts("h0", "h1", "h2", "h3"); has[Stop](acts) {
		t.Fatalf("restarted for growth before --scale-up-interval: %v", acts)
	}
	if dl := s.m.NextDeadline(s.now); !dl.Equal(t0.Add(30 * time.Second)) {
		t.Fatalf("next deadline %v, want the generation's start + 30s", dl)
	}
	s.now = t0.Add(30 * time.Second)
	acts := s.tick()
	if got := stopped(acts); !slices.Equal(got, []string{"h0", "h1"}) {
		t.Fatalf("stopped %v at the growth time", got)
	}
	acts = s.exitAll("h0", "h1")
	s.expectPlan(acts, 2, "h0", "h1", "h2", "h3")
	if s.m.Resets().Failures != 0 || s.m.j.causes[CauseScaleUp] != 1 {
		t.Fatalf("failure resets %d, causes %v", s.m.Resets().Failures, s.m.j.causes)
	}
	// At --max-np, a new slot is no reason to restart.
	if acts := s.after(time.Minute).hosts("h0", "h1", "h2", "h3", "h4"); has[Stop](acts) || !s.m.growAt.IsZero() {
		t.Fatalf("restart planned at --max-np: %v", acts)
	}
}

func TestRestartNowWhenAWorkersSlotGoesAway(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, Mode: ModeRestart})
	s.startRestart(3)
	acts := s.after(time.Second).hosts("h0", "h2")
	if got := stopped(acts); !slices.Equal(got, []string{"h0", "h1", "h2"}) {
		t.Fatalf("stopped %v", got)
	}
	s.expectPlan(s.exitAll("h0", "h1", "h2"), 2, "h0", "h2")
	if s.m.j.causes[CauseRemoval] != 1 {
		t.Fatalf("causes %v", s.m.j.causes)
	}
}

func TestRestartResetLimit(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 1, Mode: ModeRestart, ResetLimit: 2, CooldownMin: time.Hour, CooldownMax: time.Hour})
	s.startRestart(3)
	left := []string{"h0", "h1", "h2"}
	var f *Finish
	for i := 0; f == nil && i < 3; i++ {
		first := left[0]
		acts := s.after(time.Second).exit(first, 1) // the script fails at once on every start
		acts = append(acts, s.exitAll(left[1:]...)...)
		left = left[1:]
		f = finish(acts)
	}
	if f == nil || f.Code != ExitFailed || !strings.Contains(f.Reason, "reset limit reached: 3 restarts caused by failures, --reset-limit 2") || !strings.Contains(f.Reason, "exit 1") {
		t.Fatalf("finish = %+v", f)
	}
}

func TestRestartCountsTheStepsSinceTheCheckpoint(t *testing.T) {
	s := newSim(t, Config{NP: 2, MinNP: 1, Mode: ModeRestart})
	s.startRestart(2)
	p := rendezvous.Progress{Generation: 1, Step: 57, Committed: 50, At: s.now, StepsPerSecond: 10}
	s.after(time.Second).m.Step(WorkerExited{Now: s.now, Worker: wid("h1"), Code: 1, Progress: p})
	s.m.Step(WorkerExited{Now: s.now, Worker: wid("h0"), Code: -1, Signal: "SIGTERM", Progress: p})
	st := s.m.Snapshot()
	if st.rbSteps != 7 || st.unreported != 0 {
		t.Fatalf("rolled back %d steps (%d unreported restarts), want 7", st.rbSteps, st.unreported)
	}
	// The next generation reports nothing: its restart's loss is unknown, not 0.
	s.after(time.Second).exit("h0", 1)
	st = s.m.Snapshot()
	if st.rbSteps != 7 || st.unreported != 1 {
		t.Fatalf("rolled back %d steps, %d unreported restarts: want 7 and 1", st.rbSteps, st.unreported)
	}
}

func TestRestartKeepsRankOrderAndGroups(t *testing.T) {
	s := newSim(t, Config{NP: 4, MinNP: 2, Mode: ModeRestart})
	hs := []providers.Host{{ID: "a", Addr: "10.0.0.1", Slots: 2}, {ID: "b", Addr: "10.0.0.2", Slots: 2}}
	acts := s.m.Step(HostsDiscovered{Now: s.now, Hosts: hs})
	for _, a := range acts {
		if l, ok := a.(Launch); ok {
			wantGroup := 0
			if l.Addr == "10.0.0.2" {
				wantGroup = 1
			}
			if l.Group != wantGroup || l.Groups != 2 || l.MasterAddr != "10.0.0.1" {
				t.Fatalf("launch %+v: want group %d of 2, master 10.0.0.1", l, wantGroup)
			}
		}
	}
	a0, a1, b0, b1 := protocol.WorkerID{Host: "a", Slot: 0}, protocol.WorkerID{Host: "a", Slot: 1}, protocol.WorkerID{Host: "b", Slot: 0}, protocol.WorkerID{Host: "b", Slot: 1}
	s.after(time.Second).m.Step(WorkerExited{Now: s.now, Worker: a1, Code: 1})
	for _, id := range []protocol.WorkerID{a0, b0} {
		s.m.Step(WorkerExited{Now: s.now, Worker: id, Code: -1, Signal: "SIGTERM"})
	}
	acts = s.m.Step(WorkerExited{Now: s.now, Worker: b1, Code: -1, Signal: "SIGTERM"})
	for _, a := range acts {
		if p, ok := a.(Publish); ok {
			if p.Plan[a0].Rank != 0 || p.Plan[b0].Rank != 1 || p.Plan[b1].Rank != 2 {
				t.Fatalf("plan %v: rank 0 must stay on host a, where its checkpoint may be", p.Plan)
			}
			return
		}
	}
	t.Fatalf("no new generation: %v", acts)
}

func TestRestartEndsWhenEveryWorkerFailsByItself(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 1, Mode: ModeRestart})
	s.startRestart(3)
	s.after(time.Second).exit("h0", 2) // python3: can't open file 'tarin.py'
	s.exit("h1", 2)
	f := finish(s.exit("h2", 2))
	if f == nil || f.Code != ExitFailed || !strings.Contains(f.Reason, "all 3 workers of generation 1 failed; last failure: rank 0 (h0/0) exit 2") {
		t.Fatalf("finish = %+v", f)
	}
	// Peers that a SIGKILLed worker took down are no such case.
	s = newSim(t, Config{NP: 3, MinNP: 1, Mode: ModeRestart})
	s.startRestart(3)
	s.after(time.Second).m.Step(WorkerExited{Now: s.now, Worker: wid("h0"), Code: -1, Signal: "SIGKILL"})
	s.exit("h1", 1)
	s.expectPlan(s.exit("h2", 1), 2, "h1", "h2")
}

// A worker failing by itself at start waits collateralWindow before the others are stopped;
// later, a failure waits peerExitWindow; then the others are stopped and the group restarts.
func TestRestartWaitsForPeersBeforeStoppingThem(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 1, Mode: ModeRestart})
	s.startRestart(3)
	acts := s.after(time.Second).exit("h0", 1)
	if has[Stop](acts) {
		t.Fatalf("stopped the others at once after a failure at start: %v", acts)
	}
	if dl := s.m.NextDeadline(s.now); !dl.Equal(s.now.Add(collateralWindow)) {
		t.Fatalf("deadline %v", dl)
	}
	if got := stopped(s.after(collateralWindow).tick()); !slices.Equal(got, []string{"h1", "h2"}) {
		t.Fatalf("stopped %v after the window", got)
	}
	s.expectPlan(s.exitAll("h1", "h2"), 2, "h1", "h2")
	acts = s.after(time.Minute).exit("h1", 1)
	if dl := s.m.NextDeadline(s.now); has[Stop](acts) || !dl.Equal(s.now.Add(peerExitWindow)) {
		t.Fatalf("later failure: actions %v, deadline %v", acts, dl)
	}
	if got := stopped(s.after(peerExitWindow).tick()); !slices.Equal(got, []string{"h2"}) {
		t.Fatalf("stopped %v", got)
	}
	// Past the start, every worker failing by itself is a restart, not the end of the job
	// (an exception on one rank takes its peers down with it).
	s.expectPlan(s.exit("h2", 1), 3, "h2", "h0") // h0 is back from its cooldown
}
