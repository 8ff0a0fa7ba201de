package driver

import (
	"fmt"
	"time"
)

// Restart mode: the driver is the elastic agent of scripts that never talk to it (torchrun's
// contract, docs/pytorch.md). Their state is their own checkpoint, so any change of
// membership stops the whole group and launches every slot into the next generation; a new
// worker never runs beside processes of an older generation. What is kept from in-process
// recovery: the blacklist, the reset limit, notices, the journal and the cost.
//
// Blame: the first worker whose exit the driver sees is the failure: its slot is blacklisted
// and the restart counts against --reset-limit. Its peers usually die of its absence a moment
// later (gloo's "Connection closed by peer"); they are not blamed. They are given
// peerExitWindow to exit by themselves before they are sent SIGTERM: a PyTorch process that
// gets SIGTERM while it is exiting after a gloo error can hang in its own teardown until
// SIGKILL (measured: one restart in three waited out --stop-grace), and they are exiting
// anyway. A notice, a host lost or growth stops every worker at once.

// A script that fails wherever it runs (a typo in its name, a missing module, a bad
// argument) must end the job at once, as it does in-process, rather than be restarted on
// ever fewer slots. Such a failure is an exit code of 1-127 (not a signal, not a lost
// connection's 255, not a SIGTERM handler's 143) soon after the generation started, and its
// peers are failing too. So a worker that fails by itself within startupWindow of the start
// does not stop the others at once: for collateralWindow they may fail by themselves as
// well, and if every worker of the generation does (two or more), the job ends. A failure
// later on, or by a signal (a lost spot host), restarts at once.
const (
	startupWindow    = 30 * time.Second
	collateralWindow = 2 * time.Second
	peerExitWindow   = time.Second
)

// failedByItself reports an exit that the process chose (an exception, a missing file).
func failedByItself(e WorkerExited) bool {
	return e.Signal == "" && e.Code > 0 && e.Code < 128
}

// inProcess reports whether the job's workers recover in-process (they registered with the
// rendezvous) rather than by a restart of the whole group.
func (m *Machine) inProcess() bool {
	switch m.cfg.Mode {
	case ModeRestart:
		return false
	case ModeInProcess:
		return true
	}
	return m.registered
}

// restart stops every worker of the running generation at once (SIGTERM, so that scripts
// can checkpoint; SIGKILL after the grace or at deadline, when set); advance launches the
// next generation once they are all gone.
func (m *Machine) restart(now time.Time, failure bool, why string, deadline time.Time) []Action {
	m.failed = m.failed || failure
	if m.phase != phaseRunning {
		return nil
	}
	m.phase, m.deadline, m.growAt = phaseRestarting, time.Time{}, time.Time{}
	m.j.rdvStart, m.j.rdvGen = now, 0
	m.j.event(now, EventReset, "generation %d restarts: %s", m.gen, why)
	acts := []Action{Note{"restarting the whole group", []any{"generation", m.gen, "reason", why}}}
	return append(acts, m.stopAll(deadline, "restart of generation "+fmt.Sprint(m.gen)+": "+why)...)
}

// awaitPeers begins the restart after a failure without stopping the others yet: tick stops
// those left after peerExitWindow, or collateralWindow after a failure at start (then the
// job ends if they all fail by themselves meanwhile; see startupWindow).
func (m *Machine) awaitPeers(now time.Time, atStart bool) []Action {
	wait := peerExitWindow
	if atStart {
		wait = collateralWindow
	}
	m.failed, m.atStart = true, atStart
	m.phase, m.deadline, m.growAt = phaseRestarting, now.Add(wait), time.Time{}
	m.j.rdvStart, m.j.rdvGen = now, 0
	m.j.event(now, EventReset, "generation %d restarts: %s", m.gen, m.lastFailure)
	return []Action{Note{"restarting the whole group; the others are stopped unless they exit by themselves first", []any{"generation", m.gen, "reason", m.lastFailure, "wait", wait}}}
}

// stopAll stops every live worker of the generation at once.
func (m *Machine) stopAll(deadline time.Time, why string) []Action {
	var acts []Action
	for _, id := range sortedIDs(m.workers) {
		if w := m.workers[id]; !w.exited && !w.stopping {
			w.stopping, w.stopBy = true, deadline
			acts = append(acts, Stop{Worker: id, Reason: why, Deadline: deadline})
		}
	}
	return acts
}

// hostsChanged answers a change of the usable slots in restart mode: a running worker whose
// slot is gone means a restart now; slots to grow into mean one restart, no sooner than
// --scale-up-interval after the generation started, so that hosts arriving one by one join
// together.
func (m *Machine) hostsChanged(now time.Time) []Action {
	usable := m.usableSet()
	for _, id := range m.order {
		if w := m.workers[id]; w != nil && !w.exited && !w.stopping && !usable[id.String()] {
			m.j.plannedCause(CauseRemoval)
			return m.restart(now, false, id.String()+" is no longer usable", time.Time{})
		}
	}
	if m.growAt.IsZero() && m.canGrow() {
		m.growAt = m.started.Add(m.cfg.ScaleUpInterval)
		if m.growAt.Before(now) {
			m.growAt = now
		}
		return []Action{Note{"slots to grow into: the group restarts to take them in", []any{"at", m.growAt.Format("15:04:05.000"), "world_size", len(m.order), "max_np", m.cfg.MaxNP}}}
	}
	return nil
}

// canGrow reports whether a usable slot is left out of a generation below --max-np.
func (m *Machine) canGrow() bool {
	if len(m.order) >= m.cfg.MaxNP {
		return false
	}
	in := make(map[string]bool, len(m.order))
	for _, id := range m.order {
		in[id.String()] = true
	}
	for _, id := range m.hosts.Current() {
		if !in[id] {
			return true
		}
	}
	return false
}

func (m *Machine) usableSet() map[string]bool {
	cur := m.hosts.Current()
	set := make(map[string]bool, len(cur))
	for _, id := range cur {
		set[id] = true
	}
	return set
}

// runsOn reports whether a worker of the generation runs on the host.
func (m *Machine) runsOn(host string) bool {
	for _, id := range m.order {
		if w := m.workers[id]; id.Host == host && w != nil && !w.exited {
			return true
		}
	}
	return false
}

// restartLost records what the restart that just completed threw away: the steps since the
// script's last checkpoint, as its last progress report of the generation says (a script
// that checkpoints on SIGTERM and reports it loses none). A script that reports no progress
// leaves the loss unknown, and the summary says so rather than "0 steps".
func (m *Machine) restartLost() {
	p := m.progress
	if p.Generation != m.gen || p.At.IsZero() {
		m.j.unreportedRestarts++
		return
	}
	steps := p.Step - p.Committed
	secs := 0.0
	if p.StepsPerSecond > 0 {
		secs = float64(steps) / p.StepsPerSecond
	}
	m.j.rbSteps = max(m.j.rbSteps, steps)
	m.j.rbSeconds = max(m.j.rbSeconds, secs)
}
