package driver

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/elasticd/elasticd/driver/hosts"
	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

// The job controller is a pure state machine: Step takes one event and returns the actions to
// carry out. It holds no goroutines, sockets or clock (time arrives in events), so every
// scenario is a table test; Driver.Run does the I/O around it.

// Event is something that happened to the job.
type Event interface{ at() time.Time }

// HostsDiscovered is a discovery result.
type HostsDiscovered struct {
	Now   time.Time
	Hosts []providers.Host
}

// WorkerReported is a worker's report to the rendezvous. READY for generation g means "done
// with g, ready for the next": a worker being registered reports the generation before the one
// it was launched for; a worker of the current generation that reports it wants a reset.
type WorkerReported struct {
	Now        time.Time
	Worker     protocol.WorkerID
	Generation uint64
	State      protocol.State
	Message    string
	Rollback   protocol.Rollback // with READY: the work it threw away since the last commit
	SilentPeer bool              // with READY: it left because a peer stopped answering
	// Unreachable and Reached, with READY: ranks of that generation whose hosts did not answer
	// its probe, and those that did (or that it was connected to).
	Unreachable, Reached []int
}

// WorkerExited is a worker process ending.
type WorkerExited struct {
	Now    time.Time
	Worker protocol.WorkerID
	Code   int    // exit code; -1 when killed by a signal
	Signal string // non-empty when killed by a signal
	// Progress is the job's progress as last reported when the exit was seen (after the
	// process's last report): restart mode measures from it the steps a restart throws away.
	Progress rendezvous.Progress
	// StartError, set for a launch that started nothing (LaunchFailed), is the launcher's
	// reason; the failure is told by it rather than by the exit code 127 it counts as.
	StartError string
}

// NoticeReceived is the control plane announcing that a host will go away.
type NoticeReceived struct {
	Now    time.Time
	Notice providers.Notice
	// Source is who sent it, for the notice counts: the provider's name ("aws"), or "agent"
	// for an agent's on-host metadata.
	Source string
}

// SlotsFailed is hardware failing under some of a host's slots (an agent's GPU report: a
// critical XID, an uncorrectable ECC error, a lost GPU). Each slot leaves the job as a failed
// worker's does: blacklisted for a cooldown, its worker stopped, the others reset.
type SlotsFailed struct {
	Now    time.Time
	Host   string // Host.ID
	Slots  []int  // nil: every slot of the host
	Reason string
}

// LoadsMeasured is what the driver has heard of the hosts' load, the input of --slot-policy
// loadaware: each worker's mean step time, and each agent host's mean GPU busy fraction.
type LoadsMeasured struct {
	Now       time.Time
	StepTimes map[protocol.WorkerID]time.Duration
	GPUBusy   map[string]float64 // by host ID
}

// WorkerAdopted is a worker of the generation a restarted driver took up (Machine.Restore)
// found running again: its agent listed it.
type WorkerAdopted struct {
	Now    time.Time
	Worker protocol.WorkerID
}

// WorkerStarted is a Launch carried out: the worker's process of generation Generation (the
// Launch's) runs. Launches run beside the machine, so it may arrive after the worker was
// stopped or dropped; the machine then stops the process.
type WorkerStarted struct {
	Now        time.Time
	Worker     protocol.WorkerID
	Generation uint64
}

// LaunchFailed is a Launch that started no process (the launcher's error in Err): the
// worker fails as one that exits 127 at once.
type LaunchFailed struct {
	Now        time.Time
	Worker     protocol.WorkerID
	Generation uint64
	Err        error
}

// DiscoveryFailed is host discovery giving up (discovery.Watcher.Run's error): the job ends.
type DiscoveryFailed struct {
	Now time.Time
	Err error
}

// Tick is the clock reaching Machine.NextDeadline.
type Tick struct{ Now time.Time }

// Interrupted is the driver being told to stop (SIGINT, SIGTERM).
type Interrupted struct {
	Now    time.Time
	Reason string
}

func (e HostsDiscovered) at() time.Time { return e.Now }
func (e WorkerReported) at() time.Time  { return e.Now }
func (e WorkerExited) at() time.Time    { return e.Now }
func (e Tick) at() time.Time            { return e.Now }
func (e NoticeReceived) at() time.Time  { return e.Now }
func (e SlotsFailed) at() time.Time     { return e.Now }
func (e LoadsMeasured) at() time.Time   { return e.Now }
func (e Interrupted) at() time.Time     { return e.Now }
func (e WorkerAdopted) at() time.Time   { return e.Now }
func (e WorkerStarted) at() time.Time   { return e.Now }
func (e LaunchFailed) at() time.Time    { return e.Now }
func (e DiscoveryFailed) at() time.Time { return e.Now }

// Action is something the driver must do.
type Action interface{ action() }

// Launch starts a worker process for generation Generation.
type Launch struct {
	Worker     protocol.WorkerID
	Addr       string // host address to launch on
	Generation uint64
	Assignment protocol.Assignment
	MasterAddr string // address of rank 0's host
	// Group and Groups are the worker's host's index among the generation's hosts (in rank
	// order) and their count: torchrun's GROUP_RANK and GROUP_WORLD_SIZE.
	Group, Groups int
	// Restarts is how many times the whole group was restarted before this launch
	// (TORCHELASTIC_RESTART_COUNT).
	Restarts int
	// InProcess is set when the job recovers in-process: its workers bootstrap through the
	// rendezvous, and MASTER_PORT need not be looked for on rank 0's host.
	InProcess bool
}

// Stop ends a worker process (SIGTERM, then SIGKILL after the grace period).
type Stop struct {
	Worker protocol.WorkerID
	Reason string
	// Deadline, when set, is when the worker must be gone (a notice's): the grace before
	// SIGKILL ends by then, however long --stop-grace is.
	Deadline time.Time
}

// Publish makes a generation current at the rendezvous.
type Publish struct {
	Generation uint64
	Plan       map[protocol.WorkerID]protocol.Assignment
}

// NotifyHosts tells workers that the hosts changed, so they agree on a reset at a commit.
type NotifyHosts struct{}

// Abandon tells ranks still connecting to a generation that it is over (a reset began), so
// they stop waiting for peers that will not come (allreduce.Abandon).
type Abandon struct {
	Generation uint64
	Reason     string
}

// CompleteNotice answers a notice once the host's workers are gone (an ASG lifecycle hook
// waits for it).
type CompleteNotice struct{ Notice providers.Notice }

// GenerationReady is a rendezvous completed: every worker of the generation has registered
// for it, Latency after training stopped (the reset began, or the job started).
type GenerationReady struct {
	Generation uint64
	WorldSize  int
	Latency    time.Duration
}

// Finish ends the job with an exit code and a one-line reason.
type Finish struct {
	Code   int
	Reason string
}

// Note is something worth logging.
type Note struct {
	Msg  string
	Args []any
}

// Warn is something the user should act on, logged as a warning.
type Warn struct {
	Msg  string
	Args []any
}

func (Launch) action()          {}
func (Stop) action()            {}
func (Publish) action()         {}
func (Abandon) action()         {}
func (CompleteNotice) action()  {}
func (NotifyHosts) action()     {}
func (Finish) action()          {}
func (Note) action()            {}
func (Warn) action()            {}
func (GenerationReady) action() {}

// Exit codes of `elasticd run`.
const (
	ExitOK          = 0
	ExitFailed      = 1
	ExitInterrupted = 130
)

type phase int

const (
	phaseStarting   phase = iota // no generation yet: waiting for enough slots
	phaseRunning                 // a generation is training
	phaseResetting               // waiting for every live worker to report READY for the current generation
	phaseRestarting              // restart mode: waiting for every worker of the generation to exit
	phaseWaiting                 // between generations: fewer usable slots than --min-np
	phaseFinishing               // a worker of the final generation exited 0: waiting for the rest
	phaseDone
)

// workerInfo is what the machine knows of one worker process.
type workerInfo struct {
	ready     uint64 // highest generation it reported READY for, plus one (0 = none)
	exited    bool
	succeeded bool
	stopping  bool
	gen       uint64 // the generation it was launched for (or adopted in)
	// launching: its Launch has not reported yet (WorkerStarted, LaunchFailed). A Stop
	// meanwhile finds no process; stopBy is that Stop's deadline, for the one that follows.
	launching bool
	stopBy    time.Time
}

// Machine is the job state machine. It is not safe for concurrent use: one goroutine owns it.
type Machine struct {
	cfg   Config
	hosts *hosts.Manager

	gen     uint64
	phase   phase
	order   []protocol.WorkerID // rank order of the current generation
	plan    map[protocol.WorkerID]protocol.Assignment
	workers map[protocol.WorkerID]*workerInfo // processes not yet exited
	failed  bool                              // the reset under way was caused by a failure
	silent  bool                              // a READY of the reset under way found a peer silent: the barrier is cut to HungWindow
	// probes: per member, what its READY of the reset under way said of its peers' hosts
	// (which answered its probe or its connection, which did not); failCutOff weighs them.
	probes   map[protocol.WorkerID]probeReport
	deadline time.Time                       // barrier / start / elastic deadline of the phase
	regDue   map[protocol.WorkerID]time.Time // workers that must register by then
	regLow   time.Time                       // at or before the earliest of regDue
	slotCap  int                             // above every slot in workers (addWorker)
	// resetScan is where advance's scan of order for a member not yet at the reset barrier
	// of generation resetScanGen goes on from.
	resetScan    int
	resetScanGen uint64
	discovered   []providers.Host              // the latest discovery result, one pseudo-host per slot
	raw          []providers.Host              // the latest discovery result as the provider gave it
	pending      map[string][]providers.Notice // host ID -> notices to complete once its workers are gone
	loads        map[string]hosts.Load         // host ID -> load, for --slot-policy loadaware

	// notified is the generation whose workers were last told the hosts changed (notifyHosts).
	notified   uint64
	registered bool                // a worker has registered with the rendezvous: in-process under ModeAuto
	started    time.Time           // when the current generation was published
	growAt     time.Time           // restart mode: when to restart to take in the slots that arrived
	progress   rendezvous.Progress // the newest progress heard with a worker's exit
	ownExits   int                 // restart mode: workers of the generation that failed by themselves
	atStart    bool                // restart mode: the restart under way began with a failure at start

	resets      ResetCounts
	counted     bool                            // the reset under way has a failure that counts toward --reset-limit
	returnedAt  map[protocol.WorkerID]time.Time // a slot's latest launch after a failure of its own
	failedSince map[protocol.WorkerID]bool      // the slot failed and was not launched since: its next launch is a return
	flaps       map[protocol.WorkerID]int       // returns in a row that failed within --flap-window
	slotFails   map[protocol.WorkerID]int       // failures of each slot that were not flapping
	lastFailure string
	j           journal

	addrs map[protocol.WorkerID]string // the address each member of the generation was launched on
	// adoptUntil, while set, is when a restarted driver stops waiting for the workers of the
	// generation it took up (adoptWait) to be found running, and for discovery to list their
	// slots: until then discovery is not applied, so that hosts whose agents have not come
	// back yet do not count as gone.
	adoptUntil time.Time
	adoptWait  map[protocol.WorkerID]bool

	fl *fleet // --manage-capacity; nil without

	budget   string    // why --max-cost stops the job; "" until it does
	budgetBy time.Time // when it stops at the latest, if the workers have not committed
}

// NewMachine returns a machine for cfg, which must be valid (Config.Validate).
func NewMachine(cfg Config) *Machine {
	cfg = cfg.withDefaults()
	var fl *fleet
	if cfg.Capacity != nil {
		fl = newFleet(*cfg.Capacity)
	}
	return &Machine{
		fl:      fl,
		cfg:     cfg,
		hosts:   hosts.New(cfg.hostsConfig()),
		workers: map[protocol.WorkerID]*workerInfo{},
		regDue:  map[protocol.WorkerID]time.Time{},
		pending: map[string][]providers.Notice{},
		loads:   map[string]hosts.Load{},
		j:       newJournal(),

		returnedAt:  map[protocol.WorkerID]time.Time{},
		failedSince: map[protocol.WorkerID]bool{},
		flaps:       map[protocol.WorkerID]int{},
		slotFails:   map[protocol.WorkerID]int{},
	}
}

// Generation returns the current generation (0 before the first).
func (m *Machine) Generation() uint64 { return m.gen }

// ResetCounts are a job's resets so far.
type ResetCounts struct {
	All      int // every reset (and restart)
	Failures int // those caused by failures
	// Counted are the failure resets that count toward --reset-limit: not those caused only
	// by flapping slots, which quarantine handles.
	Counted int
}

// Resets returns the job's reset counts.
func (m *Machine) Resets() ResetCounts { return m.resets }

// WorldSize returns the size of the current generation.
func (m *Machine) WorldSize() int { return len(m.order) }

// Done reports whether the machine has finished.
func (m *Machine) Done() bool { return m.phase == phaseDone }

// NextDeadline is when the machine wants a Tick, or zero.
func (m *Machine) NextDeadline(now time.Time) time.Time {
	t := m.deadline
	for _, at := range []time.Time{m.growAt, m.adoptUntil, m.steerDeadline(), m.budgetBy} {
		if !at.IsZero() && (t.IsZero() || at.Before(t)) {
			t = at
		}
	}
	// The earliest registration due, or an earlier time (a Tick then finds none due, and
	// learns the earliest anew): a scan here would cost every event of a large job's reset
	// as much as its workers.
	if due := m.regLow; len(m.regDue) > 0 && (t.IsZero() || due.Before(t)) {
		t = due
	}
	// A cooldown that ended since the last Step is due now (hosts.Manager.NextEvent): the
	// Tick applies it. Not while adopting, when a Tick does not apply discovery: the
	// adoption's end does.
	if h := m.hosts.NextEvent(); !m.adopting() && !h.IsZero() && (t.IsZero() || h.Before(t)) {
		t = h
	}
	return t
}

// slotHosts expands hosts into one pseudo-host per slot, so that blacklisting, ordering and
// cooldowns work per slot: a failed worker holds out its own slot, not its whole host.
func slotHosts(hs []providers.Host) []providers.Host {
	var out []providers.Host
	for _, h := range hs {
		if h.Leaving { // the cloud is already taking it away: move off it now
			continue
		}
		for s := range h.Slots {
			sh := h
			sh.ID = protocol.WorkerID{Host: h.ID, Slot: s}.String()
			sh.Slots = 1
			out = append(out, sh)
		}
	}
	return out
}

func slotWorker(h providers.Host) protocol.WorkerID {
	id, err := protocol.ParseWorkerID(h.ID)
	if err != nil { // slotHosts made it; cannot happen
		panic(err)
	}
	return id
}

// HungWindow is how long, after a worker reports that a peer went silent inside a collective,
// the members that have not reached the reset barrier get before they are failed as hung. The
// healthy ones are blocked in that same collective and reach the barrier within moments.
const HungWindow = time.Second

// Step applies one event and returns what to do.
func (m *Machine) Step(ev Event) []Action {
	if m.phase == phaseDone {
		return nil
	}
	now := ev.at()
	if m.j.started.IsZero() {
		m.j.started, m.j.rdvStart = now, now
	}
	m.j.now = now
	before := m.phase
	var acts []Action
	switch e := ev.(type) {
	case HostsDiscovered:
		m.discovered, m.raw = slotHosts(e.Hosts), e.Hosts
		m.j.discovered(now, e.Hosts)
		if m.adopting() {
			acts = m.settleAdoption(now)
		} else {
			acts = m.refreshHosts(now)
		}
	case WorkerAdopted:
		delete(m.adoptWait, e.Worker)
		acts = m.settleAdoption(now)
	case WorkerReported:
		acts = m.reported(now, e)
	case WorkerExited:
		acts = m.exited(now, e)
	case WorkerStarted:
		acts = m.launchDone(e)
	case LaunchFailed:
		acts = m.launchFailed(now, e)
	case Interrupted:
		return m.finish(ExitInterrupted, "interrupted: "+e.Reason)
	case DiscoveryFailed:
		return m.finish(ExitFailed, fmt.Sprintf("host discovery failed: %v", e.Err))
	case NoticeReceived:
		acts = m.notice(now, e.Notice, e.Source)
	case SlotsFailed:
		acts = m.slotsFailed(now, e)
	case LoadsMeasured:
		m.measured(e)
	case Tick:
		acts = m.tick(now)
	case CapacityRead, CapacitySet, HostHandedBack, HostUnusable:
		acts = m.fleetEvent(now, e)
	case BudgetReached:
		acts = m.budgetStop(now, e)
	case BudgetUnpriced:
		return m.budgetUnpriced(e)
	}
	if m.phase == phaseDone {
		return acts
	}
	// Only a discovery, or a reset or restart just begun, can find a member's host gone: the
	// READY reports of a large job's reset do not each look again.
	if _, discovered := ev.(HostsDiscovered); discovered || m.phase != before {
		acts = append(acts, m.loseGone(now)...)
	}
	acts = append(acts, m.advance(now)...)
	if _, report := ev.(WorkerReported); m.fl != nil && !report { // a reset's reports change nothing it looks at
		acts = append(acts, m.checkQuarantined(now)...)
		acts = append(acts, m.steer(now)...)
	}
	return acts
}

// loseGone counts lost, at once, the workers that a reset or a restart waits for on hosts the
// cloud no longer lists or is taking away (Leaving): such a worker will never reach the
// barrier nor report its exit, and waiting for its agent's lease or the barrier timeout would
// stall the whole job while the survivors wait. A worker still training on a leaving host is
// not touched while the job runs: it leaves at its next commit, as on a notice.
func (m *Machine) loseGone(now time.Time) []Action {
	if m.adopting() || m.raw == nil || (m.phase != phaseResetting && m.phase != phaseRestarting) {
		return nil
	}
	listed, leaving := map[string]bool{}, map[string]bool{}
	for _, h := range m.raw {
		listed[h.ID] = true
		leaving[h.ID] = h.Leaving
	}
	var acts []Action
	lost := 0
	for _, id := range sortedIDs(m.workers) {
		w := m.workers[id]
		if w.exited || (listed[id.Host] && !leaving[id.Host]) {
			continue
		}
		why := "its host left the group"
		if listed[id.Host] {
			why = "its host is being taken away by the cloud"
		}
		if m.phase == phaseRestarting {
			// A restart-mode script may be writing its checkpoint on SIGTERM on a host that is
			// only being taken away: wait for it there. From a host that left the group its
			// exit may never be reported (its agent went with it): the restart stops it as
			// it stops every worker, but does not wait, and a late report finds no worker.
			if listed[id.Host] {
				continue
			}
			if !w.stopping {
				acts = append(acts, Stop{Worker: id, Reason: "lost: " + why})
			}
			delete(m.workers, id)
			m.j.event(now, EventLeave, "%s lost: %s; the restart goes on without it", id, why)
			acts = append(acts, Note{"worker lost with its host; the restart does not wait for it", []any{"worker", id.String(), "host", id.Host}})
			continue
		}
		if _, member := m.plan[id]; !member || w.stopping || w.ready != m.gen {
			continue // not waited for: not a member, going already, or at the barrier
		}
		m.lastFailure = fmt.Sprintf("%s lost: %s", id, why)
		m.j.event(now, EventFailure, "%s lost: %s; the reset goes on without it", id, why)
		m.j.failed(now, id, "lost: "+why)
		acts = append(acts, Stop{Worker: id, Reason: "lost: " + why, Deadline: now},
			Note{"worker lost with its host; the reset does not wait for it", []any{"worker", id.String(), "host", id.Host, "reason", why}})
		w.stopping, w.stopBy = true, now
		lost++
	}
	if lost == 0 {
		return acts
	}
	if m.phase == phaseResetting && m.j.hostsCause == "" {
		m.failed = true // a planned reset (a notice, a removal) stays planned
	}
	if m.phase == phaseResetting && m.allFailed() && m.cfg.CheckpointDir != "" {
		return append(acts, m.restartFromCheckpoint(now)...)
	}
	return acts
}

// launchDone takes the report of a launch. A process launched for a worker that was stopped
// meanwhile (the Stop found none) or that the machine no longer has is stopped now: no
// process outlives its place in the job.
func (m *Machine) launchDone(e WorkerStarted) []Action {
	w := m.workers[e.Worker]
	if w == nil || w.exited || !w.launching || w.gen != e.Generation {
		// The runner has no other process of the slot (one slot, one process: a slot is
		// launched again only once its last process exited), so the Stop reaches this one.
		return []Action{Stop{Worker: e.Worker, Reason: fmt.Sprintf("launched for generation %d, which no longer has it", e.Generation)}}
	}
	w.launching = false
	if w.stopping {
		return []Action{Stop{Worker: e.Worker, Reason: "stopped while it was being launched", Deadline: w.stopBy}}
	}
	return nil
}

// startError is a launch error's cause, without the launcher's "start rank N (worker): "
// prefix, which the failure's own description repeats.
func startError(err error) string {
	if err == nil {
		return "the launcher gave no reason"
	}
	msg := err.Error()
	if i := strings.Index(msg, "): "); strings.HasPrefix(msg, "start ") && i >= 0 {
		msg = msg[i+3:]
	}
	return msg
}

// launchFailed fails a worker whose launch started nothing, as an exit 127 (the shell's
// "command not found"); a stale report, of a launch the machine no longer waits for, is
// only noted.
func (m *Machine) launchFailed(now time.Time, e LaunchFailed) []Action {
	w := m.workers[e.Worker]
	if w == nil || w.exited || !w.launching || w.gen != e.Generation {
		return []Action{Note{"failed launch of a worker no longer in the job ignored", []any{"worker", e.Worker.String(), "generation", e.Generation, "err", e.Err}}}
	}
	w.launching = false
	return m.exited(now, WorkerExited{Now: now, Worker: e.Worker, Code: 127, StartError: startError(e.Err)})
}

func (m *Machine) reported(now time.Time, e WorkerReported) []Action {
	w := m.workers[e.Worker]
	if w == nil || w.exited {
		return []Action{Note{"report from an unknown or exited worker ignored", []any{"worker", e.Worker.String(), "state", string(e.State)}}}
	}
	if e.State != protocol.Ready {
		return nil // SUCCESS/FAILURE are confirmed by the exit status
	}
	w.ready = max(w.ready, e.Generation+1)
	if w.ready == m.gen { // registered: a member the reset barrier waits for (advance)
		m.resetScan = 0
	}
	if m.cfg.Mode == ModeAuto && !m.registered {
		m.registered = true
		m.j.event(now, EventJoin, "%s registered with the rendezvous: the job recovers in-process", e.Worker)
	}
	if e.Generation < m.gen {
		if _, due := m.regDue[e.Worker]; due {
			delete(m.regDue, e.Worker) // registered for the current generation
			if a, ok := m.plan[e.Worker]; ok {
				m.j.event(now, EventJoin, "%s joined generation %d as rank %d", e.Worker, m.gen, a.Rank)
			}
			return m.rendezvousDone(now)
		}
		return nil
	}
	if e.Generation == m.gen && (e.Rollback.Steps > 0 || e.Rollback.Seconds > 0) {
		m.j.rbSteps = max(m.j.rbSteps, e.Rollback.Steps)
		m.j.rbSeconds = max(m.j.rbSeconds, e.Rollback.Seconds)
	}
	var acts []Action
	if e.Generation == m.gen && m.phase == phaseRunning {
		acts = append(acts, Note{"worker asked for a reset", []any{"worker", e.Worker.String(), "generation", m.gen, "reason", e.Message}})
		acts = append(acts, m.beginReset(now, e.SilentPeer, e.Worker.String()+" reset: "+e.Message)...)
	}
	// A peer that stopped answering (hung, or SIGSTOPped) will not reach the barrier, and
	// every healthy member is stuck in the same collective and follows within moments: wait
	// HungWindow for them, not --barrier-timeout, and fail whoever is still missing.
	if e.Generation == m.gen && e.SilentPeer && m.phase == phaseResetting && !m.silent {
		m.silent = true
		m.failed = true
		if d := now.Add(HungWindow); d.Before(m.deadline) {
			m.deadline = d
		}
		acts = append(acts, Note{"a worker found a peer silent; whoever has not reset within the hung window is failed", []any{"worker", e.Worker.String(), "window", HungWindow}})
	}
	// What a member's probe of its peers' hosts found, weighed once every live member has
	// reported (advance, failCutOff).
	if e.Generation == m.gen && len(e.Unreachable)+len(e.Reached) > 0 && m.phase == phaseResetting {
		m.noteProbes(e.Worker, e.Reached, e.Unreachable)
	}
	// Someone is hung. A member launched into this generation that never registered cannot
	// have reached it: the others waited for it as it formed, and it is the one (hung or
	// stopped as it started), not a registered member whose report is a moment behind.
	// Otherwise, when everybody else is at the barrier, the one missing is it. Neither when a
	// member reported peers unreachable: then the one missing may be a healthy peer whose
	// report is on its way, and a cut member reports too (it reaches the driver).
	if m.silent && m.phase == phaseResetting && !m.cutSuspected() {
		if late := m.neverRegistered(); len(late) > 0 {
			for _, id := range late {
				acts = append(acts, m.failWorker(now, id, "never registered for the generation its peers waited for, after a peer found a rank silent (hung or stopped as it started?)", true)...)
			}
		} else if missing := m.barrierMissing(); len(missing) == 1 {
			acts = append(acts, m.failWorker(now, missing[0], "was the only member not to reach the reset barrier after a peer found a rank silent (hung or stopped?)", true)...)
		}
	}
	return acts
}

// neverRegistered are the members of the current generation that were launched and have not
// registered yet, in rank order.
func (m *Machine) neverRegistered() []protocol.WorkerID {
	var out []protocol.WorkerID
	for _, id := range m.order {
		if w := m.workers[id]; w != nil && !w.exited && !w.stopping {
			if _, due := m.regDue[id]; due {
				out = append(out, id)
			}
		}
	}
	return out
}

// cutSuspected reports whether a member of the reset under way could not reach a peer's host.
func (m *Machine) cutSuspected() bool {
	for _, p := range m.probes {
		if len(p.unreachable) > 0 {
			return true
		}
	}
	return false
}

// probeReport is what one member's probe found: the members whose hosts answered (or that
// it is connected to) and those whose hosts did not.
type probeReport struct{ reached, unreachable []protocol.WorkerID }

// noteProbes records reporter's probe, given as ranks of the current generation.
func (m *Machine) noteProbes(reporter protocol.WorkerID, reached, unreachable []int) {
	if m.probes == nil {
		m.probes = map[protocol.WorkerID]probeReport{}
	}
	ids := func(ranks []int) []protocol.WorkerID {
		var out []protocol.WorkerID
		for _, r := range ranks {
			if r >= 0 && r < len(m.order) && m.order[r] != reporter && !slices.Contains(out, m.order[r]) {
				out = append(out, m.order[r])
			}
		}
		return out
	}
	m.probes[reporter] = probeReport{reached: ids(reached), unreachable: ids(unreachable)}
}

// failCutOff fails the members a network cut separates from the rest, once every live
// member has reported: two live members are joined when either reached the other and
// neither failed to, as their probes say, and the largest group so joined goes on (of equal
// ones, the one with the lowest rank). A member outside it that some member of it could not
// reach, or that could not reach one, is failed. One host cut off from the rest, several,
// or a network split: the group that can still train together stays. A member nothing is
// known of is left alone.
func (m *Machine) failCutOff(now time.Time) []Action {
	if !m.cutSuspected() {
		return nil
	}
	// Every live member, those that sent no report too (a member whose failure was no
	// silent peer probes nothing): the others' reports say whom it reaches.
	var P []protocol.WorkerID // in rank order
	for _, id := range m.order {
		if w := m.workers[id]; w != nil && !w.exited && !w.stopping {
			P = append(P, id)
		}
	}
	if len(P) < 2 {
		return nil
	}
	bad := func(x, y protocol.WorkerID) bool {
		return slices.Contains(m.probes[x].unreachable, y) || slices.Contains(m.probes[y].unreachable, x)
	}
	parent := make([]int, len(P)) // union-find by index into P
	for i := range parent {
		parent[i] = i
	}
	find := func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	for i, x := range P {
		for j := i + 1; j < len(P); j++ {
			y := P[j]
			if !bad(x, y) && (slices.Contains(m.probes[x].reached, y) || slices.Contains(m.probes[y].reached, x)) {
				parent[find(i)] = find(j)
			}
		}
	}
	size := map[int]int{}
	for i := range P {
		size[find(i)]++
	}
	best := find(0) // of equal groups, the one with the lowest rank
	for i := range P {
		if r := find(i); size[r] > size[best] {
			best = r
		}
	}
	var acts []Action
	for i, x := range P {
		if find(i) == best {
			continue
		}
		var by []protocol.WorkerID
		for j, y := range P {
			if find(j) == best && bad(x, y) {
				by = append(by, y)
			}
		}
		if len(by) == 0 {
			continue // nothing says it is cut off from the group that goes on
		}
		why := fmt.Sprintf("could not be reached over the network by %s, or could not reach them: cut off from the %d members that go on", joinIDs(by), size[best])
		acts = append(acts, m.failWorker(now, x, why, false)...)
	}
	return acts
}

func joinIDs(ids []protocol.WorkerID) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = id.String()
	}
	return strings.Join(s, ", ")
}

// barrierMissing lists the live members of the current generation that have not reported
// READY for it.
func (m *Machine) barrierMissing() []protocol.WorkerID {
	var out []protocol.WorkerID
	for _, id := range m.order {
		if w := m.workers[id]; w != nil && !w.exited && !w.stopping && w.ready == m.gen {
			out = append(out, id)
		}
	}
	return out
}

func (m *Machine) exited(now time.Time, e WorkerExited) []Action {
	w := m.workers[e.Worker]
	if w == nil {
		return nil
	}
	w.exited = true
	delete(m.regDue, e.Worker)
	delete(m.adoptWait, e.Worker)
	if p := e.Progress; p.Generation > m.progress.Generation || p.Generation == m.progress.Generation && p.At.After(m.progress.At) {
		m.progress = p
	}
	_, inPlan := m.plan[e.Worker]
	status := fmt.Sprintf("exit %d", e.Code)
	switch {
	case e.StartError != "":
		status = "could not start: " + e.StartError
	case e.Code == 127 && e.Signal == "":
		status += " (command not found: is the training command on the host's PATH?)"
	}
	if e.Signal != "" {
		status = "killed by " + e.Signal
	}
	if !inPlan || w.stopping {
		delete(m.workers, e.Worker)
		acts := []Action{Note{"worker outside the current generation exited", []any{"worker", e.Worker.String(), "status", status}}}
		return append(acts, m.completeNotices(e.Worker.Host)...)
	}
	rank := m.plan[e.Worker].Rank
	if e.Code == 0 && e.Signal == "" {
		w.succeeded = true
		if m.phase != phaseFinishing {
			m.phase = phaseFinishing
			m.deadline = time.Time{}
			return []Action{Note{"a worker finished training; waiting for the others", []any{"rank", rank, "worker", e.Worker.String()}}}
		}
		return nil
	}
	delete(m.workers, e.Worker)
	if failedByItself(e) {
		m.ownExits++
	}
	if m.phase == phaseRestarting { // one more worker failing at start, in the collateral window
		m.j.event(now, EventFailure, "rank %d (%s) %s too", rank, e.Worker, status)
		m.j.failed(now, e.Worker, status)
		return []Action{Note{"worker failed too", []any{"rank", rank, "worker", e.Worker.String(), "status", status}}}
	}
	m.lastFailure = fmt.Sprintf("rank %d (%s) %s", rank, e.Worker, status)
	if m.phase == phaseFinishing {
		return m.finish(ExitFailed, fmt.Sprintf("%s after another worker had finished", m.lastFailure))
	}
	out, flapping := m.slotFailed(now, e.Worker)
	m.j.event(now, EventFailure, "rank %d (%s) %s; its slot is %s", rank, e.Worker, status, out)
	m.j.failed(now, e.Worker, status)
	acts := append([]Action{Note{"worker failed; its slot is " + out, []any{"rank", rank, "worker", e.Worker.String(), "status", status}}}, flapping...)
	// In restart mode the state is the script's checkpoint, not in the workers: losing them
	// all is one more restart.
	if m.inProcess() && m.allFailed() {
		if m.cfg.CheckpointDir == "" {
			return append(acts, m.finish(ExitFailed, fmt.Sprintf("all %d workers of generation %d failed; last failure: %s (with --checkpoint-dir the job would start over from its last checkpoint)", len(m.order), m.gen, m.lastFailure))...)
		}
		return append(acts, m.restartFromCheckpoint(now)...)
	}
	if m.phase == phaseRunning && !m.inProcess() {
		return append(acts, m.awaitPeers(now, failedByItself(e) && now.Sub(m.started) < startupWindow)...)
	}
	if m.phase == phaseRunning && lostUnseen(e) {
		// The launcher lost the worker without seeing it exit (its agent's lease ran out: the
		// host is cut off from the driver): it may still run and answer its peers, whose
		// collectives then never fail, so they would train on with it until the barrier
		// timed out and failed them all. Tell them the hosts changed: they agree on it at
		// their next step and reset without rollback, the lost worker with them.
		acts = append(acts, m.notifyHosts()...)
	}
	if m.phase == phaseRunning || m.phase == phaseResetting {
		acts = append(acts, m.beginReset(now, true, m.lastFailure)...)
	}
	return acts
}

// lostUnseen reports whether an exit is the launcher's word that it lost the worker, not an
// exit status it saw: code -1 with no signal (driver/agents, an agent lost).
func lostUnseen(e WorkerExited) bool {
	return e.Code == -1 && e.Signal == "" && e.StartError == ""
}

// restartFromCheckpoint starts over after a total loss: the state in the workers is gone, but
// rank 0 wrote it to the checkpoint directory. The job starts again on the slots that come
// back; the new rank 0 has no commit of its own and resumes from the newest valid checkpoint.
func (m *Machine) restartFromCheckpoint(now time.Time) []Action {
	msg := fmt.Sprintf("all %d workers of generation %d are lost: the job starts over from the newest checkpoint in %s on the slots that come back (within --elastic-timeout %v)", len(m.order), m.gen, m.cfg.CheckpointDir, m.cfg.ElasticTimeout)
	m.j.event(now, EventReset, "%s", msg)
	m.failed, m.counted = true, true
	return append([]Action{Note{msg, nil}}, m.completeReset(now, "resets")...)
}

// beginReset starts the reset barrier of the current generation.
func (m *Machine) beginReset(now time.Time, failure bool, why string) []Action {
	if !m.inProcess() {
		return m.restart(now, failure, why, time.Time{})
	}
	m.failed = m.failed || failure
	if m.phase != phaseRunning {
		return nil
	}
	m.phase, m.resetScan = phaseResetting, 0
	m.deadline = now.Add(m.cfg.BarrierTimeout)
	m.j.rdvStart, m.j.rdvGen = now, 0
	m.j.event(now, EventReset, "generation %d resets: %s", m.gen, why)
	return []Action{Abandon{Generation: m.gen, Reason: why}}
}

// allFailed reports whether every worker of the current generation has failed.
func (m *Machine) allFailed() bool {
	for _, id := range m.order {
		if w := m.workers[id]; w != nil && !w.exited && !w.stopping {
			return false
		}
	}
	return len(m.order) > 0
}

// notice moves the job off a host the cloud will take: its slots are marked leaving, the
// workers agree on the change at their next step and reset without rollback, and the notice
// is completed once the host's workers are gone. A rebalance recommendation is only logged:
// leaving on a maybe would throw away capacity.
func (m *Machine) notice(now time.Time, n providers.Notice, source string) []Action {
	acts := []Action{Note{"notice", []any{"host", n.HostID, "kind", string(n.Kind), "deadline", n.Deadline, "detail", n.Detail}}}
	m.j.notices[[2]string{source, string(n.Kind)}]++
	m.j.event(now, EventNotice, "%s %s notice for host %s%s", source, n.Kind, n.HostID, detailSuffix(n))
	if n.Kind == providers.Rebalance {
		return acts
	}
	changed := m.hosts.SetLeaving(m.slotIDs(n.HostID)...)
	m.pending[n.HostID] = append(m.pending[n.HostID], n)
	if changed && m.phase == phaseRunning {
		if !m.inProcess() {
			if m.runsOn(n.HostID) {
				m.j.plannedCause(CauseNotice)
				acts = append(acts, m.restart(now, false, fmt.Sprintf("%s notice for host %s", n.Kind, n.HostID), n.Deadline)...)
			}
		} else {
			m.j.plannedCause(CauseNotice)
			acts = append(acts, m.notifyHosts()...)
			acts = append(acts, Note{"moving off the host before the cloud takes it; workers will reset at their next step", []any{"host", n.HostID}})
		}
	}
	return append(acts, m.completeNotices(n.HostID)...)
}

// notifyHosts tells the workers that the hosts changed: they agree on it at their next commit
// and reset. Once a generation: told once, its workers reset whatever changes after, and the
// next generation is made of the hosts as they are then. A zone reclaiming hundreds of hosts
// within a second is one host update, not hundreds, each sent to every host.
func (m *Machine) notifyHosts() []Action {
	if m.gen > 0 && m.notified == m.gen {
		return nil
	}
	m.notified = m.gen
	return []Action{NotifyHosts{}}
}

// slotsFailed takes the failed slots out of the job as failures.
func (m *Machine) slotsFailed(now time.Time, e SlotsFailed) []Action {
	var ids []protocol.WorkerID
	if e.Slots == nil {
		for _, h := range m.discovered {
			if id := slotWorker(h); id.Host == e.Host {
				ids = append(ids, id)
			}
		}
		for id := range m.workers {
			if id.Host == e.Host && !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
		slices.SortFunc(ids, func(a, b protocol.WorkerID) int { return a.Slot - b.Slot })
	} else {
		for _, s := range e.Slots {
			ids = append(ids, protocol.WorkerID{Host: e.Host, Slot: s})
		}
	}
	acts := []Action{Note{"hardware fault: its slots leave the job as failed", []any{"host", e.Host, "slots", len(ids), "reason", e.Reason}}}
	for _, id := range ids {
		if w := m.workers[id]; w != nil && !w.exited && !w.stopping {
			acts = append(acts, m.failWorker(now, id, e.Reason, false)...)
		} else {
			_, flapping := m.slotFailed(now, id)
			acts = append(acts, flapping...)
		}
	}
	// Under --manage-capacity a host with failed hardware is handed back for a new one.
	return append(acts, m.brokenHost(now, e.Host, "hardware fault: "+e.Reason)...)
}

// Release brings back the quarantined slots of a host (an operator's `elasticd ctl add-host`
// of a host already in the job): their failure history is forgotten and they are usable at
// once. It returns how many were released.
func (m *Machine) Release(now time.Time, host string) (int, []Action) {
	n := 0
	for _, q := range m.hosts.Quarantined() {
		if id, err := protocol.ParseWorkerID(q); err == nil && id.Host == host && m.hosts.Release(q) {
			n++
			delete(m.flaps, id)
			delete(m.returnedAt, id)
			delete(m.failedSince, id)
			m.j.event(now, EventJoin, "slot %s released from quarantine by the operator", id)
		}
	}
	if n == 0 {
		return 0, nil
	}
	acts := []Action{Note{"quarantined slots released by the operator", []any{"host", host, "slots", n}}}
	return n, append(append(acts, m.refreshHosts(now)...), m.advance(now)...)
}

// slotFailed blacklists a failed slot, or quarantines it when it is flapping: it failed within
// --flap-window of coming back, --flap-limit times in a row. It says which ("blacklisted",
// "quarantined"), and notes whether the reset under way counts toward --reset-limit: a
// flapping slot's failures do not, so one bad slot cannot end a healthy job. A quarantine is
// said once, plainly, in the log (the returned action) and the journal.
func (m *Machine) slotFailed(now time.Time, id protocol.WorkerID) (string, []Action) {
	at, returned := m.returnedAt[id]
	flap := returned && now.Sub(at) < m.cfg.FlapWindow
	m.failedSince[id] = true
	m.hosts.Blacklist(now, id.String())
	if !flap {
		m.flaps[id] = 0
		m.counted = true
		m.slotFails[id]++
		if m.cfg.ResetLimit == 0 && m.slotFails[id] == repeatFailures {
			msg := fmt.Sprintf("slot %s has failed %d times; with --reset-limit 0 (unlimited, the default) the job resets for it each time it comes back, for as long as it runs: set --reset-limit N to end the job after N failure resets, or take the host out with `elasticd ctl remove-host %s`", id, repeatFailures, id.Host)
			m.j.event(now, EventFailure, "%s", msg)
			return "blacklisted", []Action{Warn{msg, nil}}
		}
		return "blacklisted", nil
	}
	m.flaps[id]++
	if m.flaps[id] < m.cfg.FlapLimit {
		return fmt.Sprintf("blacklisted (flapping: %d of %d returns in a row failed within --flap-window %v)", m.flaps[id], m.cfg.FlapLimit, m.cfg.FlapWindow), nil
	}
	m.hosts.Quarantine(id.String())
	msg := fmt.Sprintf("slot %s is flapping: it failed within --flap-window %v of each of its last %d returns; it is quarantined, out of the job until an operator takes it back with `elasticd ctl add-host %s`; the job goes on without it, and its failures did not count toward --reset-limit", id, m.cfg.FlapWindow, m.flaps[id], id.Host)
	m.j.event(now, EventFailure, "%s", msg)
	return "quarantined (flapping)", []Action{Note{msg, nil}}
}

// repeatFailures is how many failures of one slot make the machine warn, once, that an
// unlimited --reset-limit will let the job reset for it for as long as it runs.
const repeatFailures = 3

// sortedIDs returns the keys of a map by worker ID in a stable order, for loops that emit
// actions: the machine's actions depend only on its events, not on map order.
func sortedIDs[V any](m map[protocol.WorkerID]V) []protocol.WorkerID {
	return slices.SortedFunc(maps.Keys(m), protocol.WorkerID.Compare)
}

// completeNotices completes the notices of hosts that have no worker left.
// A host's notice can be completed only once its last worker is gone, which an exit of one
// of its workers or its notice tells: only that host is looked at, so that a mass reclaim of
// a large job costs each exit a few lookups, not a scan of every worker.
func (m *Machine) completeNotices(host string) []Action {
	ns, ok := m.pending[host]
	if !ok {
		return nil
	}
	for s := range m.slotCap {
		if w := m.workers[protocol.WorkerID{Host: host, Slot: s}]; w != nil && !w.exited {
			return nil
		}
	}
	var acts []Action
	for _, n := range ns {
		acts = append(acts, CompleteNotice{Notice: n})
	}
	delete(m.pending, host)
	return acts
}

// slotIDs are the IDs of host's slots in the latest discovery (slotHosts), none when it is
// not listed or already leaving.
func (m *Machine) slotIDs(host string) []string {
	for _, h := range m.raw {
		if h.ID == host && !h.Leaving {
			ids := make([]string, h.Slots)
			for s := range h.Slots {
				ids[s] = protocol.WorkerID{Host: h.ID, Slot: s}.String()
			}
			return ids
		}
	}
	return nil
}

// addWorker records a worker of slot id.
func (m *Machine) addWorker(id protocol.WorkerID, w *workerInfo) {
	m.workers[id] = w
	m.slotCap = max(m.slotCap, id.Slot+1)
}

// refreshHosts applies the latest discovery result. Discovery reports only changes, so when
// a cooldown expires the last result, which still lists the slot, is applied again.
func (m *Machine) refreshHosts(now time.Time) []Action {
	if m.adopting() {
		return nil // settleAdoption applies discovery once the adopted workers' hosts are back
	}
	var before []string
	if m.phase == phaseRunning && m.j.hostsCause == "" {
		before = m.hosts.Current()
	}
	if m.hosts.Update(now, m.discovered) && m.phase == phaseRunning {
		if !m.inProcess() {
			return m.hostsChanged(now)
		}
		if m.j.hostsCause == "" {
			m.j.plannedCause(changeCause(before, m.hosts.Current()))
		}
		return append(m.notifyHosts(), Note{"hosts changed; workers will reset at their next commit", []any{"usable_slots", len(m.hosts.Usable(now))}})
	}
	return nil
}

func (m *Machine) tick(now time.Time) []Action {
	if acts := m.budgetDue(now, false); acts != nil {
		return acts
	}
	acts := m.settleAdoption(now)
	acts = append(acts, m.refreshHosts(now)...)
	// Workers that did not register in time are failed, where workers register: a script
	// that never talks to elasticd (restart mode) is not failed for it.
	var late []protocol.WorkerID
	m.regLow = time.Time{}
	for id, due := range m.regDue {
		if !now.Before(due) {
			late = append(late, id)
		} else if m.regLow.IsZero() || due.Before(m.regLow) {
			m.regLow = due
		}
	}
	slices.SortFunc(late, protocol.WorkerID.Compare)
	for _, id := range late {
		delete(m.regDue, id)
		if m.inProcess() {
			acts = append(acts, m.failWorker(now, id, fmt.Sprintf("did not register within --start-timeout %v", m.cfg.StartTimeout), false)...)
		}
	}
	if !m.growAt.IsZero() && !now.Before(m.growAt) {
		m.growAt = time.Time{}
		if m.phase == phaseRunning && m.canGrow() {
			m.j.plannedCause(CauseScaleUp)
			acts = append(acts, m.restart(now, false, "slots became usable: growing", time.Time{})...)
		}
	}
	if m.deadline.IsZero() || now.Before(m.deadline) {
		return acts
	}
	switch m.phase {
	case phaseRestarting: // the collateral window is over: stop whoever has not failed
		m.deadline = time.Time{}
		acts = append(acts, m.stopAll(time.Time{}, "restart of generation "+strconv.FormatUint(m.gen, 10)+": "+m.lastFailure)...)
	case phaseResetting: // the barrier timed out: whoever has not reported is hung
		why := fmt.Sprintf("did not reach the reset barrier within --barrier-timeout %v", m.cfg.BarrierTimeout)
		if m.silent {
			why = fmt.Sprintf("did not reach the reset barrier within %v after a peer found a rank silent (hung or stopped?)", HungWindow)
		}
		for _, id := range m.barrierMissing() {
			acts = append(acts, m.failWorker(now, id, why, true)...)
		}
	case phaseStarting, phaseWaiting:
		n := len(m.hosts.Usable(now))
		if n >= m.cfg.MinNP && m.phase == phaseStarting {
			return append(acts, m.nextGeneration(now)...) // -np never came: start with what there is
		}
		return append(acts, m.finish(ExitFailed, fmt.Sprintf("only %d usable slots, fewer than --min-np %d, for longer than --elastic-timeout %v%s", n, m.cfg.MinNP, m.cfg.ElasticTimeout, m.lastFailureSuffix()))...)
	}
	return acts
}

// failWorker stops a worker that is hung or late and blacklists its slot. A hung worker is
// killed at once: a process that does not answer its peers will not answer SIGTERM either
// (a stopped one cannot), and the grace would only hold up the job.
func (m *Machine) failWorker(now time.Time, id protocol.WorkerID, why string, hung bool) []Action {
	w := m.workers[id]
	if w == nil || w.exited {
		return nil
	}
	w.stopping = true
	out, flapping := m.slotFailed(now, id)
	m.lastFailure = fmt.Sprintf("%s %s", id, why)
	m.j.event(now, EventFailure, "%s %s; its slot is %s", id, why, out)
	m.j.failed(now, id, why)
	stop := Stop{Worker: id, Reason: why}
	if hung {
		stop.Deadline = now // no grace: SIGKILL
		w.stopBy = now
	}
	acts := append([]Action{stop, Note{"worker failed; its slot is " + out, []any{"worker", id.String(), "reason", why}}}, flapping...)
	return append(acts, m.beginReset(now, true, m.lastFailure)...)
}

func (m *Machine) lastFailureSuffix() string {
	if m.lastFailure == "" {
		return ""
	}
	return "; last failure: " + m.lastFailure
}

// advance moves between phases once their conditions hold.
func (m *Machine) advance(now time.Time) []Action {
	switch m.phase {
	case phaseStarting:
		if len(m.hosts.Usable(now)) >= m.cfg.NP {
			return m.nextGeneration(now)
		}
		if m.deadline.IsZero() {
			m.deadline = now.Add(m.cfg.ElasticTimeout)
		}
	case phaseResetting:
		if m.adopting() { // a restarted driver plans the next generation once it found the members
			return nil
		}
		// A worker registered for this generation (READY for the one before) that has not yet
		// reported READY for this one may still be training: wait for it. One launched for
		// this generation and not yet registered is still starting; it will be given the
		// next generation when it asks, and --start-timeout covers it if it hangs.
		//
		// Every READY of the reset comes here: the scan goes on from the member it last
		// waited for (those before it have reported, exited or are stopping, and stay so
		// unless one registers, which starts it over), so that a reset of n workers costs n
		// steps, not n²/2.
		if m.resetScanGen != m.gen {
			m.resetScan, m.resetScanGen = 0, m.gen
		}
		for i := m.resetScan; i < len(m.order); i++ {
			if w := m.workers[m.order[i]]; w != nil && !w.exited && !w.stopping && w.ready == m.gen {
				m.resetScan = i
				return nil
			}
		}
		live := 0
		for _, id := range m.order {
			if w := m.workers[id]; w != nil && !w.exited && !w.stopping {
				live++
			}
		}
		if live == 0 && m.failed {
			return m.finish(ExitFailed, fmt.Sprintf("all %d workers of generation %d failed%s", len(m.order), m.gen, m.lastFailureSuffix()))
		}
		// Every live member has reported: a network cut among them is weighed now.
		acts := m.failCutOff(now)
		return append(acts, m.completeReset(now, "resets")...)
	case phaseRestarting:
		for _, w := range m.workers {
			if !w.exited {
				return nil
			}
		}
		if m.atStart && len(m.order) > 1 && m.ownExits >= len(m.order) {
			return m.finish(ExitFailed, fmt.Sprintf("all %d workers of generation %d failed%s", len(m.order), m.gen, m.lastFailureSuffix()))
		}
		m.restartLost()
		return m.completeReset(now, "restarts")
	case phaseWaiting:
		if len(m.hosts.Usable(now)) >= m.cfg.MinNP {
			return m.nextGeneration(now)
		}
	case phaseFinishing:
		for _, id := range m.order {
			if w := m.workers[id]; w != nil && !w.succeeded {
				return nil
			}
		}
		return m.finish(ExitOK, fmt.Sprintf("all %d workers of generation %d finished", len(m.order), m.gen))
	}
	return nil
}

// completeReset counts the reset that just completed (what: "resets", or "restarts" in
// restart mode) and starts the next generation, unless failures passed --reset-limit.
func (m *Machine) completeReset(now time.Time, what string) []Action {
	m.resets.All++
	m.resetDone()
	if acts := m.budgetDue(now, true); acts != nil {
		return acts
	}
	if m.failed {
		m.resets.Failures++
		if m.counted {
			m.resets.Counted++
		}
		if m.cfg.ResetLimit > 0 && m.resets.Counted > m.cfg.ResetLimit {
			return m.finish(ExitFailed, fmt.Sprintf("reset limit reached: %d %s caused by failures, --reset-limit %d%s", m.resets.Counted, what, m.cfg.ResetLimit, m.lastFailureSuffix()))
		}
	}
	return m.nextGeneration(now)
}

// nextGeneration plans generation gen+1 from the usable slots: survivors keep their rank
// order (the oldest worker is rank 0, holding the newest state); new slots follow in the
// host manager's deterministic order; at most --max-np.
func (m *Machine) nextGeneration(now time.Time) []Action {
	if m.adopting() { // a reset during the adoption: plan on what discovery says now
		m.adoptUntil, m.adoptWait = time.Time{}, nil
		m.hosts.Update(now, m.discovered)
	}
	usable := m.hosts.Usable(now)
	if len(usable) < m.cfg.MinNP {
		if m.phase != phaseWaiting {
			m.phase, m.deadline = phaseWaiting, now.Add(m.cfg.ElasticTimeout)
			m.j.point(now, m.gen, 0)
		}
		return []Action{Note{"waiting for slots", []any{"usable", len(usable), "min_np", m.cfg.MinNP, "elastic_timeout", m.cfg.ElasticTimeout}}}
	}
	addrOf := map[protocol.WorkerID]string{}
	for _, h := range usable {
		addrOf[slotWorker(h)] = h.Addr
	}
	var order []protocol.WorkerID
	for _, id := range m.order { // survivors first, in their old order
		w := m.workers[id]
		alive := w != nil && !w.exited && !w.stopping
		// After a restart nobody survives, but slots keep their ranks: rank 0 stays where the
		// script's checkpoint may be.
		kept := alive || m.phase == phaseRestarting && w == nil
		if kept && addrOf[id] != "" && len(order) < m.cfg.MaxNP {
			order = append(order, id)
		}
	}
	kept := make(map[protocol.WorkerID]bool, len(order))
	for _, id := range order {
		kept[id] = true
	}
	var fresh []protocol.WorkerID // usable slots not in the order yet, in the manager's order
	for _, h := range usable {
		id := slotWorker(h)
		if kept[id] {
			continue
		}
		if w := m.workers[id]; w != nil && !w.exited { // a process of this slot is still winding down
			continue
		}
		fresh = append(fresh, id)
	}
	order = append(order, m.chooseSlots(fresh, m.cfg.MaxNP-len(order))...)
	if len(order) < m.cfg.MinNP {
		if m.phase != phaseWaiting {
			m.phase, m.deadline = phaseWaiting, now.Add(m.cfg.ElasticTimeout)
			m.j.point(now, m.gen, 0)
		}
		return nil
	}
	m.gen++
	m.order = order
	m.plan = assign(order, addrOf, m.gen)
	m.addrs = map[protocol.WorkerID]string{}
	for _, id := range order {
		m.addrs[id] = addrOf[id]
	}
	m.phase, m.failed, m.silent, m.counted, m.deadline = phaseRunning, false, false, false, time.Time{}
	m.probes = nil
	m.started, m.growAt, m.ownExits, m.atStart = now, time.Time{}, 0, false
	acts := []Action{Publish{Generation: m.gen, Plan: m.plan}}
	master := addrOf[order[0]]
	group := map[string]int{} // address -> its index among the generation's hosts, in rank order
	for _, id := range order {
		if _, ok := group[addrOf[id]]; !ok {
			group[addrOf[id]] = len(group)
		}
	}
	for _, id := range order {
		if w := m.workers[id]; w == nil || w.exited {
			m.addWorker(id, &workerInfo{gen: m.gen, launching: true})
			m.regDue[id] = now.Add(m.cfg.StartTimeout)
			if m.regLow.IsZero() || m.regDue[id].Before(m.regLow) {
				m.regLow = m.regDue[id]
			}
			if m.failedSince[id] {
				m.returnedAt[id] = now
				delete(m.failedSince, id)
			}
			acts = append(acts, Launch{Worker: id, Addr: addrOf[id], Generation: m.gen, Assignment: m.plan[id], MasterAddr: master,
				Group: group[addrOf[id]], Groups: len(group), Restarts: m.resets.All, InProcess: m.inProcess()})
		}
	}
	// Workers left out (removed hosts, over --max-np) are stopped, in a stable order: the machine's
	// actions depend only on its events (see the golden transcripts).
	for _, id := range sortedIDs(m.workers) {
		w := m.workers[id]
		if _, ok := m.plan[id]; !ok && !w.exited && !w.stopping {
			w.stopping = true
			acts = append(acts, Stop{Worker: id, Reason: "not part of generation " + strconv.FormatUint(m.gen, 10)})
			m.j.event(now, EventLeave, "%s left: not part of generation %d", id, m.gen)
		}
	}
	if m.fl != nil && m.fl.fb != nil {
		acts = append(acts, m.fallbackUse(now)...) // the members changed: are fallback hosts among them?
	}
	acts = append(acts, Note{"generation started", []any{"generation", m.gen, "world_size", len(order), "resets", m.resets.All}})
	m.j.point(now, m.gen, len(order))
	m.j.event(now, EventGeneration, "generation %d started with %d workers", m.gen, len(order))
	m.j.hostsCause, m.j.rdvGen = "", m.gen
	return append(acts, m.rendezvousDone(now)...)
}

// chooseSlots picks n of the fresh slots (all when there are no more): with --slot-policy,
// by the policy over the hosts the slots are on; else the first n.
func (m *Machine) chooseSlots(fresh []protocol.WorkerID, n int) []protocol.WorkerID {
	if n <= 0 {
		return nil
	}
	if len(fresh) <= n {
		return fresh
	}
	if m.cfg.SlotPolicy == nil {
		return fresh[:n]
	}
	var offers []hosts.Offer
	var slots [][]protocol.WorkerID // per offer, its fresh slots in order
	index := map[string]int{}       // host -> its offer
	for _, id := range fresh {
		i, ok := index[id.Host]
		if !ok {
			i = len(offers)
			index[id.Host] = i
			offers = append(offers, hosts.Offer{Host: id.Host, Load: m.loads[id.Host]})
			slots = append(slots, nil)
		}
		offers[i].Slots++
		slots[i] = append(slots[i], id)
	}
	// Active slots of the host count towards its load (loadaware's third weight).
	for id, w := range m.workers {
		if i, ok := index[id.Host]; ok && !w.exited && !w.stopping {
			offers[i].Load.ActiveSlots++
		}
	}
	picked, err := hosts.Allocate(*m.cfg.SlotPolicy, offers, n)
	if err != nil { // Config.Validate checked the policy; cannot happen
		panic(err)
	}
	var out []protocol.WorkerID
	for i, idx := range picked {
		for _, k := range idx {
			out = append(out, slots[i][k])
		}
	}
	return out
}

// measured replaces the hosts' loads: a host's step time is the mean over its live workers
// that reported one; its GPU busy fraction is its agent's.
func (m *Machine) measured(e LoadsMeasured) {
	sum, n := map[string]time.Duration{}, map[string]int{}
	for id, d := range e.StepTimes {
		if w := m.workers[id]; w != nil && !w.exited && d > 0 {
			sum[id.Host] += d
			n[id.Host]++
		}
	}
	loads := map[string]hosts.Load{}
	for host, k := range n {
		l := loads[host]
		l.StepTime = sum[host] / time.Duration(k)
		loads[host] = l
	}
	for host, b := range e.GPUBusy {
		l := loads[host]
		l.GPUBusy = b
		loads[host] = l
	}
	m.loads = loads
}

// assign gives dense ranks in order; local ranks count workers on the same address, cross
// ranks count addresses among the workers of the same local rank.
func assign(order []protocol.WorkerID, addrOf map[protocol.WorkerID]string, gen uint64) map[protocol.WorkerID]protocol.Assignment {
	plan := make(map[protocol.WorkerID]protocol.Assignment, len(order))
	localCount := map[string]int{}
	localRank := make([]int, len(order))
	for i, id := range order {
		localRank[i] = localCount[addrOf[id]]
		localCount[addrOf[id]]++
	}
	crossCount := map[int]int{}
	for i, id := range order {
		a := protocol.Assignment{
			Generation: gen, Rank: i, Size: len(order),
			LocalRank: localRank[i], LocalSize: localCount[addrOf[id]],
			CrossRank: crossCount[localRank[i]],
		}
		crossCount[localRank[i]]++
		plan[id] = a
	}
	for id, a := range plan {
		a.CrossSize = crossCount[a.LocalRank]
		plan[id] = a
	}
	return plan
}

func (m *Machine) finish(code int, reason string) []Action {
	m.phase = phaseDone
	m.j.finished = &Finished{Code: code, Reason: reason}
	m.j.event(m.j.now, EventFinish, "%s", reason)
	acts := []Action{}
	for _, id := range sortedIDs(m.workers) {
		if w := m.workers[id]; !w.exited && !w.succeeded {
			acts = append(acts, Stop{Worker: id, Reason: "job finished"})
		}
	}
	acts = append(acts, m.finalCapacity(reason)...)
	return append(acts, Finish{Code: code, Reason: reason})
}

// rendezvousDone completes the rendezvous of the current generation once none of its
// workers has yet to register.
func (m *Machine) rendezvousDone(now time.Time) []Action {
	if m.j.rdvGen != m.gen || m.gen == 0 {
		return nil
	}
	for id := range m.regDue {
		if _, ok := m.plan[id]; ok {
			return nil
		}
	}
	m.j.rdvGen = 0
	return []Action{GenerationReady{Generation: m.gen, WorldSize: len(m.order), Latency: now.Sub(m.j.rdvStart)}}
}

// resetDone counts the reset that just completed by its cause, and the work it rolled back:
// the most any survivor threw away, on every worker of the generation that failed.
func (m *Machine) resetDone() {
	cause := m.j.hostsCause
	if m.failed || cause == "" {
		cause = CauseFailure
	}
	m.j.causes[cause]++
	if m.j.rbSteps > 0 || m.j.rbSeconds > 0 {
		m.j.rolledBackSteps += m.j.rbSteps
		for _, id := range m.order {
			m.j.rolledBackSlotSec[id.Host] += m.j.rbSeconds
		}
		m.j.event(m.j.now, EventReset, "generation %d rolled back %d steps (%.1f s of work on each of %d workers)", m.gen, m.j.rbSteps, m.j.rbSeconds, len(m.order))
	}
	m.j.rbSteps, m.j.rbSeconds = 0, 0
}

// changeCause tells a scale-up (only slots added) from a removal (some slot went away).
func changeCause(before, after []string) string {
	now := make(map[string]bool, len(after))
	for _, id := range after {
		now[id] = true
	}
	for _, id := range before {
		if !now[id] {
			return CauseRemoval
		}
	}
	return CauseScaleUp
}

func detailSuffix(n providers.Notice) string {
	s := ""
	if !n.Deadline.IsZero() {
		s += " (deadline " + n.Deadline.UTC().Format(time.RFC3339) + ")"
	}
	if n.Detail != "" {
		s += ": " + n.Detail
	}
	return s
}

// --- a driver restarted with --state-dir ---

// Save returns the machine's part of the job's state (SavedState): the generation and its
// members, the latest discovery, the slots held out and the reset counts.
func (m *Machine) Save(now time.Time) SavedState {
	st := SavedState{
		Generation: m.gen, InProcess: m.inProcess(), Hosts: m.raw,
		Blacklist: m.hosts.Blacklisted(now), Quarantined: m.hosts.Quarantined(),
		Resets: m.resets.All, FailureResets: m.resets.Failures, CountedResets: m.resets.Counted,
	}
	st.Resetting = m.phase == phaseResetting
	if m.phase == phaseRunning || m.phase == phaseResetting || m.phase == phaseFinishing {
		for _, id := range m.order {
			if w := m.workers[id]; w != nil && !w.exited && !w.stopping {
				st.Workers = append(st.Workers, SavedWorker{Worker: id.String(), Addr: m.addrs[id], Assignment: m.plan[id]})
			}
		}
	}
	return st
}

// SaveJournal is the journal as a restarted driver takes it up (SavedState.Journal).
func (m *Machine) SaveJournal() *SavedJournal { return m.j.save() }

// Restore takes up a job from its saved state, before the first Step. With adopt (the workers
// kept running through their agents), the saved generation is current again with its members
// as they were, and the machine waits up to wait for each to be found (WorkerAdopted) and for
// discovery to list their slots; a member never found fails as a lost worker would. Without,
// the members are gone: the next generation starts on the usable slots, and in-process
// workers resume from the checkpoint. Blacklist, quarantine and reset counts carry over.
func (m *Machine) Restore(now time.Time, st *SavedState, adopt bool, wait time.Duration) []Action {
	m.j.started, m.j.rdvStart, m.j.now = now, now, now
	if st.Journal != nil {
		m.j.restore(st.Journal)
	}
	m.gen = st.Generation
	m.resets = ResetCounts{All: st.Resets, Failures: st.FailureResets, Counted: st.CountedResets}
	m.registered = st.InProcess
	m.hosts.Restore(now, st.Blacklist, st.Quarantined)
	if !adopt || len(st.Workers) == 0 {
		// As after losing every worker: the next generation starts on the slots the first
		// discovery offers, as soon as there are --min-np of them.
		m.phase, m.deadline = phaseWaiting, now.Add(m.cfg.ElasticTimeout)
		msg := fmt.Sprintf("the driver restarted; the workers of generation %d are gone: the job starts again", m.gen)
		if st.InProcess && m.cfg.CheckpointDir != "" {
			msg += " from the newest checkpoint in " + m.cfg.CheckpointDir
		}
		m.j.event(now, EventReset, "%s", msg)
		return []Action{Note{msg, nil}}
	}
	m.raw, m.discovered = st.Hosts, slotHosts(st.Hosts)
	m.hosts.Update(now, m.discovered)
	m.hosts.Usable(now) // what the workers' plan reflects: the baseline of the next change
	m.order, m.plan, m.addrs = nil, map[protocol.WorkerID]protocol.Assignment{}, map[protocol.WorkerID]string{}
	m.adoptWait = map[protocol.WorkerID]bool{}
	for _, w := range st.Workers {
		id, _ := protocol.ParseWorkerID(w.Worker) // LoadState checked them
		m.order = append(m.order, id)
		m.plan[id], m.addrs[id] = w.Assignment, w.Addr
		m.addWorker(id, &workerInfo{ready: m.gen, gen: m.gen})
		m.adoptWait[id] = true
	}
	m.phase, m.adoptUntil = phaseRunning, now.Add(wait)
	if st.Resetting {
		// They reported READY to the last driver, which had not yet planned the next
		// generation: count them at the barrier, and plan it once they are found. One that had
		// not reached it yet is still in a collective whose peers left; it fails there and asks
		// for the next generation too.
		m.phase, m.resetScan = phaseResetting, 0
		for _, w := range m.workers {
			w.ready = m.gen + 1
		}
	}
	// Not a start: a restart-mode failure now is not a failure at start-up.
	m.started = now.Add(-startupWindow)
	m.j.point(now, m.gen, len(m.order))
	msg := fmt.Sprintf("the driver restarted: taking up generation %d with its %d workers, which have %v to be found running", m.gen, len(m.order), wait)
	m.j.event(now, EventGeneration, "%s", msg)
	return []Action{Note{msg, nil}}
}

func (m *Machine) adopting() bool { return !m.adoptUntil.IsZero() }

// settleAdoption ends the adoption once every member was found and discovery lists their
// slots, or at its deadline; then discovery applies again.
func (m *Machine) settleAdoption(now time.Time) []Action {
	if !m.adopting() {
		return nil
	}
	if now.Before(m.adoptUntil) && (len(m.adoptWait) > 0 || !m.discoveryLists(m.order)) {
		return nil
	}
	m.adoptUntil, m.adoptWait = time.Time{}, nil
	m.j.event(now, EventJoin, "generation %d taken up: the restarted driver goes on with it", m.gen)
	acts := []Action{Note{"adoption over: the job goes on", []any{"generation", m.gen, "workers", len(m.barrierMissing())}}}
	return append(acts, m.refreshHosts(now)...)
}

// discoveryLists reports whether the latest discovery lists every slot of ids.
func (m *Machine) discoveryLists(ids []protocol.WorkerID) bool {
	listed := map[string]bool{}
	for _, h := range m.discovered {
		listed[h.ID] = true
	}
	for _, id := range ids {
		if w := m.workers[id]; w != nil && !w.exited && !listed[id.String()] {
			return false
		}
	}
	return true
}
