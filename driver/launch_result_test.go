package driver

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
)

func (s *sim) started(host string, gen uint64) []Action {
	return s.m.Step(WorkerStarted{Now: s.now, Worker: wid(host), Generation: gen})
}

func stopOf(acts []Action, host string) *Stop {
	for _, a := range acts {
		if st, ok := a.(Stop); ok && st.Worker.Host == host {
			return &st
		}
	}
	return nil
}

// Launches run beside the machine: a worker stopped while its launch was under way (the
// Stop found no process) has the process stopped once the launch reports it, with the Stop's
// deadline; the job went on meanwhile, and the process's exit later changes nothing.
func TestLaunchReportedAfterItsWorkerWasStopped(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, StartTimeout: time.Minute, Mode: ModeInProcess})
	s.hosts("h0", "h1", "h2")
	for _, h := range []string{"h0", "h2"} {
		if acts := s.started(h, 1); len(acts) != 0 {
			t.Fatalf("a launch reported in time: %v, want nothing to do", acts)
		}
	}
	s.ready(0, "h0", "h2")
	acts := s.after(time.Minute).tick() // h1's launch never reported: it never registered
	if got := stopped(acts); !slices.Equal(got, []string{"h1"}) {
		t.Fatalf("stopped %v, want h1", got)
	}
	acts = append(acts, s.ready(1, "h0", "h2")...)
	s.expectPlan(acts, 2, "h0", "h2")

	acts = s.after(time.Second).started("h1", 1)
	if st := stopOf(acts, "h1"); st == nil || st.Reason != "stopped while it was being launched" || !st.Deadline.IsZero() {
		t.Fatalf("launch of the stopped h1 reported: %v, want it stopped", acts)
	}
	acts = s.exit("h1", -1)
	if has[Launch](acts) || has[Publish](acts) || has[Abandon](acts) {
		t.Fatalf("the stopped h1 exiting: %v, want no change to the job", acts)
	}
	if g := s.m.Generation(); g != 2 {
		t.Fatalf("generation %d, want 2", g)
	}
}

// A notice's Stop has the notice's deadline; a worker whose launch had not reported then is
// stopped by that deadline too once it does.
func TestLaunchReportedAfterAStopWithDeadline(t *testing.T) {
	s := newSim(t, Config{NP: 2, MinNP: 1, Mode: ModeRestart})
	s.hosts("h0", "h1")
	s.started("h0", 1)
	deadline := s.now.Add(time.Minute)
	acts := s.m.Step(NoticeReceived{Now: s.now, Notice: providers.Notice{ID: "n1", HostID: "h1", Kind: providers.Interruption, Deadline: deadline}})
	if st := stopOf(acts, "h1"); st == nil || !st.Deadline.Equal(deadline) {
		t.Fatalf("notice: %v, want h1 stopped by %v", acts, deadline)
	}
	acts = s.started("h1", 1)
	if st := stopOf(acts, "h1"); st == nil || !st.Deadline.Equal(deadline) {
		t.Fatalf("launch of h1 reported after its notice's stop: %v, want a Stop by %v", acts, deadline)
	}
}

// A launch that reports a process the machine did not wait for (of a worker it does not
// have, or of another generation) has the process stopped.
func TestStaleLaunchReportIsStopped(t *testing.T) {
	s := newSim(t, Config{NP: 2, MinNP: 1})
	s.start(2)
	s.started("h0", 1)
	for _, tc := range []struct {
		name string
		host string
		gen  uint64
	}{
		{"unknown worker", "h9", 1},
		{"other generation", "h1", 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if st := stopOf(s.started(tc.host, tc.gen), tc.host); st == nil {
				t.Fatalf("stale launch report of %s (generation %d) not stopped", tc.host, tc.gen)
			}
		})
	}
}

// A launch that fails fails its worker as an exit 127 would: the slot is blacklisted and the
// generation resets without it. A stale failure report changes nothing.
func TestLaunchFailedFailsTheWorker(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 1, Mode: ModeInProcess})
	s.start(3)
	acts := s.m.Step(LaunchFailed{Now: s.now, Worker: wid("h2"), Generation: 1, Err: errors.New("ssh: connection refused")})
	if !has[Abandon](acts) {
		t.Fatalf("failed launch: %v, want the generation reset", acts)
	}
	s.expectPlan(s.ready(1, "h0", "h1"), 2, "h0", "h1")
	acts = s.m.Step(LaunchFailed{Now: s.now, Worker: wid("h2"), Generation: 1, Err: errors.New("again")})
	if has[Abandon](acts) || has[Publish](acts) || has[Stop](acts) {
		t.Fatalf("stale launch failure: %v, want nothing but a note", acts)
	}
}

// Discovery giving up ends the job.
func TestDiscoveryFailedEndsTheJob(t *testing.T) {
	s := newSim(t, Config{NP: 2})
	s.start(2)
	f := finish(s.m.Step(DiscoveryFailed{Now: s.now, Err: errors.New("describe asg: throttled")}))
	if f == nil || f.Code != ExitFailed || f.Reason != "host discovery failed: describe asg: throttled" {
		t.Fatalf("finish = %+v", f)
	}
}
