package driver

import (
	"fmt"
	"strings"
	"time"

	"github.com/elasticd/elasticd/driver/cost"
)

// A budget (--max-cost): before the job's cost passes it, the workers commit and the job
// stops with ExitBudget, its managed group going to zero as at any end. The runner watches the
// cost (the status board prices it) and tells the machine, which owns the decision.

// ExitBudget is `elasticd run`'s exit status when --max-cost stopped the job.
const ExitBudget = 3

// BudgetReached is the cost about to pass --max-cost: Spent so far, and Max.
type BudgetReached struct {
	Now      time.Time
	Spent    float64
	Max      float64
	Currency string
}

// BudgetUnpriced is a host whose time has no price, under --max-cost: the budget cannot be
// kept.
type BudgetUnpriced struct {
	Now   time.Time
	Types []string // "TYPE (lifecycle)"
}

func (e BudgetReached) at() time.Time  { return e.Now }
func (e BudgetUnpriced) at() time.Time { return e.Now }

// budgetStop ends the job for its budget: at once where no worker holds state that a commit
// would keep (starting, waiting, restart mode: a restart-mode script checkpoints on SIGTERM),
// else at the workers' next commit, which the host-change path brings about without rollback;
// by the barrier timeout at the latest.
func (m *Machine) budgetStop(now time.Time, e BudgetReached) []Action {
	if m.budget != "" || m.phase == phaseFinishing {
		return nil
	}
	m.budget = fmt.Sprintf("--max-cost %s reached: %s spent, and at its rate the cost would pass it before the job could stop", cost.Format(e.Currency, e.Max), cost.Format(e.Currency, e.Spent))
	m.j.event(now, EventFinish, "%s: the job stops at the workers' next commit", m.budget)
	switch {
	case m.phase == phaseRunning && m.inProcess():
		m.budgetBy = now.Add(m.cfg.BarrierTimeout)
		return append(m.notifyHosts(), Warn{m.budget + "; the workers commit and the job stops", nil})
	case m.phase == phaseResetting || m.phase == phaseRestarting:
		m.budgetBy = now.Add(m.cfg.BarrierTimeout)
		return []Action{Warn{m.budget + "; the job stops once the reset under way completes", nil}}
	}
	return append([]Action{Warn{m.budget, nil}}, m.finish(ExitBudget, m.budget)...)
}

// budgetUnpriced ends a job under --max-cost whose hosts' time cannot be priced.
func (m *Machine) budgetUnpriced(e BudgetUnpriced) []Action {
	return m.finish(ExitFailed, fmt.Sprintf("--max-cost cannot be kept: no price for %s; give --prices FILE with each instance type's spot and on-demand price per hour (examples/prices.yaml)", strings.Join(e.Types, ", ")))
}

// budgetDue ends the job for its budget when its workers have committed (a reset completing)
// or the wait for them is over.
func (m *Machine) budgetDue(now time.Time, resetDone bool) []Action {
	if m.budget == "" || m.phase == phaseDone || !resetDone && (m.budgetBy.IsZero() || now.Before(m.budgetBy)) {
		return nil
	}
	return m.finish(ExitBudget, m.budget)
}
