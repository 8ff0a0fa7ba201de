package driver

import (
	"strings"
	"testing"

	"github.com/elasticd/elasticd/providers"
)

// In-process, a budget about to be passed makes the workers commit (the host-change path, no
// rollback) and the job stop with ExitBudget once they have; a managed group goes to zero.
func TestBudgetStopsAtTheNextCommit(t *testing.T) {
	cfg := Config{NP: 2, MinNP: 1, Mode: ModeInProcess, Capacity: &CapacityConfig{Group: "g"}}
	s := newSim(t, cfg)
	s.start(2)
	s.m.Step(CapacityRead{Now: s.now, Size: providers.GroupSize{Desired: 2, Max: 4}})
	acts := s.m.Step(BudgetReached{Now: s.now, Spent: 9.5, Max: 10, Currency: "USD"})
	if !has[NotifyHosts](acts) || finish(acts) != nil || len(stopped(acts)) != 0 {
		t.Fatalf("%v: want the workers told to commit, nothing stopped yet", acts)
	}
	acts = s.ready(1, "h0", "h1")
	f := finish(acts)
	if f == nil || f.Code != ExitBudget || !strings.Contains(f.Reason, "--max-cost 10.00 USD reached: 9.50 USD spent") {
		t.Fatalf("%v: want the job finished with ExitBudget, saying why", acts)
	}
	if got := capActs[SetCapacity](acts); len(got) != 1 || !got[0].Final || got[0].To != 0 {
		t.Fatalf("%v: want the managed group set to zero", acts)
	}
	if has[Publish](acts) {
		t.Fatalf("a new generation was started after the budget: %v", acts)
	}
}

// Workers that do not reach the commit within --barrier-timeout do not keep the job going.
func TestBudgetStopsByTheBarrierTimeout(t *testing.T) {
	s := newSim(t, Config{NP: 2, MinNP: 1, Mode: ModeInProcess})
	s.start(2)
	s.m.Step(BudgetReached{Now: s.now, Spent: 9.5, Max: 10, Currency: "USD"})
	if dl := s.m.NextDeadline(s.now); dl.IsZero() || dl.After(s.now.Add(DefaultBarrierTimeout)) {
		t.Fatalf("next deadline %v", dl)
	}
	acts := s.after(DefaultBarrierTimeout).tick()
	if f := finish(acts); f == nil || f.Code != ExitBudget {
		t.Fatalf("%v: want ExitBudget at the barrier timeout", acts)
	}
	if got := stopped(acts); len(got) != 2 {
		t.Fatalf("stopped %v, want both workers", got)
	}
}

// A restart-mode script checkpoints on SIGTERM: the job stops at once, every worker stopped
// with the grace; so does a job with no generation yet. A second budget event changes
// nothing.
func TestBudgetStopsAtOnceOtherwise(t *testing.T) {
	s := newSim(t, Config{NP: 2, MinNP: 1, Mode: ModeRestart})
	s.startRestart(2)
	acts := s.m.Step(BudgetReached{Now: s.now, Spent: 1, Max: 1, Currency: "EUR"})
	if f := finish(acts); f == nil || f.Code != ExitBudget || len(stopped(acts)) != 2 {
		t.Fatalf("%v: want both stopped and ExitBudget", acts)
	}

	s = newSim(t, Config{NP: 4})
	s.hosts("h0")
	if f := finish(s.m.Step(BudgetReached{Now: s.now, Spent: 1, Max: 1, Currency: "EUR"})); f == nil || f.Code != ExitBudget {
		t.Fatal("a job waiting for slots did not stop for its budget")
	}
}

// Time with no price makes the budget impossible to keep: the job stops, saying which type
// needs a price.
func TestBudgetUnpriced(t *testing.T) {
	s := newSim(t, Config{NP: 1})
	s.start(1)
	f := finish(s.m.Step(BudgetUnpriced{Now: s.now, Types: []string{"g5.xlarge (spot)"}}))
	if f == nil || f.Code != ExitFailed || !strings.Contains(f.Reason, "g5.xlarge (spot)") || !strings.Contains(f.Reason, "--prices") {
		t.Fatalf("finish %+v", f)
	}
}
