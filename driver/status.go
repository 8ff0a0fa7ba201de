package driver

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/elasticd/elasticd/driver/cost"
	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

// Status is a snapshot of the job as the state machine sees it, for readers outside the
// driver's loop: GET /v1/status, the metrics, the live page, `elasticd status` and the admin
// API. It shares nothing with the machine. docs/protocol.md §6 documents its JSON.
type Status struct {
	JobID          string    `json:"job_id"`
	StartedAt      time.Time `json:"started_at"`      // the job's first event
	Now            time.Time `json:"now"`             // when this answer was made
	ElapsedSeconds float64   `json:"elapsed_seconds"` // Now - StartedAt
	Generation     uint64    `json:"generation"`
	WorldSize      int       `json:"world_size"`
	Phase          string    `json:"phase"` // starting, running, resetting, restarting, waiting, finishing, done
	// Mode is how the workers recover: "in-process" (they registered with the rendezvous)
	// or "restart" (the whole group is restarted; --mode, docs/pytorch.md).
	Mode          string         `json:"mode"`
	NP            int            `json:"np"`
	MinNP         int            `json:"min_np"`
	MaxNP         int            `json:"max_np"`
	Resets        int            `json:"resets"`
	ResetsByCause map[string]int `json:"resets_by_cause"` // every cause of ResetCauses, 0 included
	Progress      ProgressStatus `json:"progress"`
	Hosts         []HostStatus   `json:"hosts"`   // the hosts of the latest discovery result, by ID
	Workers       []WorkerStatus `json:"workers"` // the worker processes not yet exited: by rank, then the others by ID
	// HostsTotal and WorkersTotal count every host and worker, HostStates and WorkerStates
	// by state (every state, 0 included), whether Hosts and Workers list them all or a page
	// of them (Page). HostsMatching counts the hosts of the state the page asked for.
	HostsTotal    int            `json:"hosts_total"`
	HostStates    map[string]int `json:"host_states"`
	HostsMatching int            `json:"hosts_matching"`
	WorkersTotal  int            `json:"workers_total"`
	WorkerStates  map[string]int `json:"worker_states"`
	WorldHistory  []WorldPoint   `json:"world_history"`
	// ProgressHistory is the step, step rate, loss and cost over time, oldest first: at most
	// maxProgressPoints, evenly spaced, then the point of this answer (progressHistory).
	ProgressHistory []ProgressPoint `json:"progress_history"`
	Events          []JobEvent      `json:"events"`  // oldest first, at most 100
	Notices         []NoticeCount   `json:"notices"` // by source, then kind
	Cost            *cost.Summary   `json:"cost"`    // nil until Board.Current prices it
	Finished        *Finished       `json:"finished"`
	// Capacity is what --manage-capacity did to the group; nil without it.
	Capacity *CapacityStatus `json:"capacity,omitempty"`

	lives      []usage            // every host ever discovered, for the cost; shared, read-only
	rolledBack map[string]float64 // host ID -> slot-seconds rolled back
	rbSteps    uint64
	unreported int
}

// rolledBackSlotSeconds is the slot-seconds of work rolled back, over every host.
func (s *Status) rolledBackSlotSeconds() float64 {
	sum := 0.0
	for _, sec := range s.rolledBack {
		sum += sec
	}
	return sum
}

// ProgressStatus is how far training has got (rank 0's reports) and what rollbacks cost.
type ProgressStatus struct {
	Step            uint64  `json:"step"`
	CommittedStep   uint64  `json:"committed_step"`
	StepsPerSecond  float64 `json:"steps_per_second"`
	StepSeconds     float64 `json:"step_seconds"` // 1/StepsPerSecond; 0 when unknown
	RolledBackSteps uint64  `json:"rolled_back_steps"`
	RolledBackGPUs  float64 `json:"rolled_back_gpu_seconds"` // slot-seconds of work thrown away
	// UnreportedRestarts counts restarts whose loss is unknown: the script reported no
	// progress (elasticd.progress) in the generation that restarted.
	UnreportedRestarts int        `json:"unreported_restarts"`
	UpdatedAt          *time.Time `json:"updated_at"` // nil before the first report
	// Loss is the training loss of rank 0's newest report that had one; nil when the
	// program reports none (State.SetLoss, elasticd.progress(loss=...)).
	Loss *float64 `json:"loss"`
	// TotalSteps is the job's steps in all, as the program reported it; 0 when unknown.
	TotalSteps uint64 `json:"total_steps"`
	// ETASeconds is the time to go at the current step rate: (TotalSteps - Step) /
	// StepsPerSecond; nil when either is unknown (or 0: not stepping).
	ETASeconds *float64 `json:"eta_seconds"`
}

// ProgressPoint is the job's progress at one time. A point that stands for several merged
// ones (progressHistory) has their mean rate and loss, and the last one's step and cost.
type ProgressPoint struct {
	T              time.Time `json:"t"`
	Step           uint64    `json:"step"`
	StepsPerSecond float64   `json:"steps_per_second"`
	Loss           *float64  `json:"loss,omitempty"` // absent before the program reports one
	// Cost is what the job's priced instance time had cost by then; absent while none of
	// it is priced (cost.unpriced says what is not).
	Cost *float64 `json:"cost,omitempty"`
}

// HostStatus is one discovered host.
type HostStatus struct {
	ID          string `json:"id"`
	Addr        string `json:"addr"`
	Slots       int    `json:"slots"`
	Blacklisted int    `json:"blacklisted_slots"` // slots cooling down after a failure
	Quarantined int    `json:"quarantined_slots"` // flapping slots kept out until `elasticd ctl add-host`
	Leaving     bool   `json:"leaving"`           // a notice says it goes away, or the cloud is taking it
	Fallback    bool   `json:"fallback"`          // a host of the on-demand fallback group
	// State is "active" (runs a worker of the current generation), "leaving", "quarantined"
	// (every slot kept out as flapping), "blacklisted" (every slot cooling down) or
	// "idle" (usable, unused: over --max-np, or between generations).
	State        string    `json:"state"`
	Lifecycle    string    `json:"lifecycle"` // spot or on-demand
	Type         string    `json:"type"`
	Zone         string    `json:"zone"`
	Since        time.Time `json:"since"`          // in the group since
	PricePerHour *float64  `json:"price_per_hour"` // nil when unknown
	// UptimeSeconds is how long the host has been in the group: now - Since.
	UptimeSeconds float64 `json:"uptime_seconds"`
	// LastHeartbeat is when the driver last heard from the host: its agent's latest poll,
	// or its workers' latest request to the rendezvous (in-process workers; restart-mode
	// scripts only when they report progress). Nil when never: the driver has no channel
	// to the host other than the processes it launched.
	LastHeartbeat       *time.Time `json:"last_heartbeat"`
	HeartbeatAgeSeconds *float64   `json:"heartbeat_age_seconds"` // now - LastHeartbeat
	HostFailures
}

// HostFailures counts the worker failures on one host over the job (exits other than 0,
// hangs, late registrations), with the latest.
type HostFailures struct {
	Count int          `json:"failures"`
	Last  *HostFailure `json:"last_failure"` // nil when none
}

// HostFailure is one worker failure.
type HostFailure struct {
	At     time.Time `json:"at"`
	Worker string    `json:"worker"` // HOST/SLOT
	Cause  string    `json:"cause"`  // "exit 1", "killed by SIGKILL", "hung: ..."
}

// WorldPoint is the world size from a time on: a generation's start, or 0 while waiting.
type WorldPoint struct {
	At         time.Time `json:"at"`
	Generation uint64    `json:"generation"`
	WorldSize  int       `json:"world_size"`
}

// JobEvent is one line of the job's recent history.
type JobEvent struct {
	At      time.Time `json:"at"`
	Kind    string    `json:"kind"` // generation, join, leave, failure, notice, host-added, host-removed, reset, finish
	Message string    `json:"message"`
}

// NoticeCount counts the notices of one source and kind.
type NoticeCount struct {
	Provider string `json:"provider"`
	Kind     string `json:"kind"`
	Count    int    `json:"count"`
}

// Finished is how the job ended.
type Finished struct {
	Code   int    `json:"code"`
	Reason string `json:"reason"`
}

// usage is one host's time in the group, as of the snapshot's machine time.
type usage struct {
	host  providers.Host
	stays []cost.Stay
}

// WorkerStatus is one worker process.
type WorkerStatus struct {
	ID   string `json:"id"` // HOST/SLOT: stable for the life of the job
	Host string `json:"host"`
	Slot int    `json:"slot"`
	Rank int    `json:"rank"` // in the current generation; -1 when not part of it
	// State is "running" (registered; with --mode restart, launched; with auto, launched
	// longer than --start-timeout ago), "starting" (launched, not registered yet) or
	// "stopping" (told to stop: its host left, it failed, or it is over --max-np).
	State string `json:"state"`
}

var phaseNames = map[phase]string{
	phaseStarting: "starting", phaseRunning: "running", phaseResetting: "resetting", phaseRestarting: "restarting",
	phaseWaiting: "waiting", phaseFinishing: "finishing", phaseDone: "done",
}

// Snapshot returns the job's status. It reads the machine without changing it (the host
// manager's clock included), so it may be called between any two steps.
func (m *Machine) Snapshot() Status {
	s := Status{
		StartedAt: m.j.started, Now: m.j.now,
		Generation: m.gen, WorldSize: len(m.order), Phase: phaseNames[m.phase],
		NP: m.cfg.NP, MinNP: m.cfg.MinNP, MaxNP: m.cfg.MaxNP, Resets: m.resets.All,
		ResetsByCause: map[string]int{},
		Hosts:         []HostStatus{}, Workers: []WorkerStatus{},
		WorldHistory: slices.Clone(m.j.history), Events: slices.Clone(m.j.events), Notices: []NoticeCount{},
		rolledBack: maps.Clone(m.j.rolledBackSlotSec), rbSteps: m.j.rolledBackSteps, unreported: m.j.unreportedRestarts,
		Mode: "restart",
	}
	if m.inProcess() {
		s.Mode = "in-process"
	}
	if m.j.finished != nil {
		f := *m.j.finished
		s.Finished = &f
	}
	s.Capacity = m.capacityStatus()
	for _, c := range ResetCauses {
		s.ResetsByCause[c] = m.j.causes[c]
	}
	for k, n := range m.j.notices {
		s.Notices = append(s.Notices, NoticeCount{Provider: k[0], Kind: k[1], Count: n})
	}
	slices.SortFunc(s.Notices, func(a, b NoticeCount) int {
		return cmp.Or(strings.Compare(a.Provider, b.Provider), strings.Compare(a.Kind, b.Kind))
	})
	s.lives = m.j.usage
	byID := map[string]int{} // host ID -> index in s.Hosts
	for _, h := range m.raw {
		if _, dup := byID[h.ID]; dup {
			continue
		}
		byID[h.ID] = len(s.Hosts)
		hs := HostStatus{ID: h.ID, Addr: h.Addr, Slots: h.Slots, Leaving: h.Leaving, Fallback: h.Fallback, Lifecycle: cost.Lifecycle(h.Spot), Type: h.Type, Zone: h.Zone}
		if l := m.j.lives[h.ID]; l != nil {
			hs.Since, _ = l.present()
		}
		if f := m.j.failures[h.ID]; f != nil {
			hs.Count, hs.Last = f.Count, new(*f.Last) // the journal's record changes with the next failure
		}
		s.Hosts = append(s.Hosts, hs)
	}
	// The zero time never moves the manager's clock: this lists the cooldowns as of the
	// latest time the machine has seen.
	for _, b := range m.hosts.Blacklisted(time.Time{}) {
		if id, err := protocol.ParseWorkerID(b.ID); err == nil {
			if i, ok := byID[id.Host]; ok {
				s.Hosts[i].Blacklisted++
			}
		}
	}
	for _, q := range m.hosts.Quarantined() {
		if id, err := protocol.ParseWorkerID(q); err == nil {
			if i, ok := byID[id.Host]; ok {
				s.Hosts[i].Quarantined++
			}
		}
	}
	active := map[string]bool{}
	for id := range m.plan {
		if w := m.workers[id]; w != nil && !w.exited && !w.stopping {
			active[id.Host] = true
		}
	}
	for i := range s.Hosts {
		h := &s.Hosts[i]
		_, pending := m.pending[h.ID]
		h.Leaving = h.Leaving || pending
		switch {
		case h.Leaving:
			h.State = "leaving"
		case h.Quarantined >= h.Slots:
			h.State = "quarantined"
		case h.Blacklisted >= h.Slots:
			h.State = "blacklisted"
		case active[h.ID]:
			h.State = "active"
		default:
			h.State = "idle"
		}
	}
	slices.SortFunc(s.Hosts, func(a, b HostStatus) int { return strings.Compare(a.ID, b.ID) })
	for id, w := range m.workers {
		if w.exited {
			continue
		}
		ws := WorkerStatus{ID: id.String(), Host: id.Host, Slot: id.Slot, Rank: -1, State: "running"}
		if a, ok := m.plan[id]; ok {
			ws.Rank = a.Rank
		}
		_, due := m.regDue[id]
		switch {
		case w.stopping:
			ws.State, ws.Rank = "stopping", -1
		case due && m.cfg.Mode != ModeRestart: // a restart-mode script never registers
			ws.State = "starting"
		}
		s.Workers = append(s.Workers, ws)
	}
	slices.SortFunc(s.Workers, func(a, b WorkerStatus) int {
		ra, rb := a.Rank, b.Rank
		if ra < 0 {
			ra = 1 << 30
		}
		if rb < 0 {
			rb = 1 << 30
		}
		return cmp.Or(cmp.Compare(ra, rb), strings.Compare(a.ID, b.ID))
	})
	s.HostsTotal, s.HostsMatching, s.WorkersTotal = len(s.Hosts), len(s.Hosts), len(s.Workers)
	s.HostStates, s.WorkerStates = make(map[string]int, len(HostStates)), make(map[string]int, len(WorkerStates))
	for _, st := range HostStates {
		s.HostStates[st] = 0
	}
	for _, st := range WorkerStates {
		s.WorkerStates[st] = 0
	}
	for _, h := range s.Hosts {
		s.HostStates[h.State]++
	}
	for _, w := range s.Workers {
		s.WorkerStates[w.State]++
	}
	return s
}

// Page returns s with Hosts narrowed to the hosts in state ("": every state), from the
// offset-th of them, at most limit (all: limit < 0), and Workers to the workers of the hosts
// listed. The totals and counts by state stay the job's. A page of a fleet of thousands is
// what the live page asks for each second.
func (s Status) Page(state string, offset, limit int) Status {
	hosts := s.Hosts
	if state != "" {
		hosts = make([]HostStatus, 0, s.HostStates[state])
		for _, h := range s.Hosts {
			if h.State == state {
				hosts = append(hosts, h)
			}
		}
	}
	s.HostsMatching = len(hosts)
	hosts = hosts[min(offset, len(hosts)):]
	if limit >= 0 && limit < len(hosts) {
		hosts = hosts[:limit]
	}
	listed := make(map[string]bool, len(hosts))
	for _, h := range hosts {
		listed[h.ID] = true
	}
	workers := make([]WorkerStatus, 0, len(hosts))
	for _, w := range s.Workers {
		if listed[w.Host] {
			workers = append(workers, w)
		}
	}
	s.Hosts, s.Workers = slices.Clip(hosts), workers
	return s
}

// StatusBoard holds the latest Status for readers on other goroutines: the driver's loop
// publishes one whenever it has worked off the events at hand; the admin API, the status
// API and the metrics read it. Safe for concurrent use.
type StatusBoard struct {
	p atomic.Pointer[Status]
	// Set by Run before it serves anything, read-only after.
	jobID    string
	progress func() rendezvous.Progress
	prices   *cost.Catalog
	// heard is when each host was last heard from (agents, workers), by host ID; nil: never.
	heard func() map[string]time.Time
	now   func() time.Time // time.Now when nil; tests set it

	hist progressHistory // Record's points
}

// clock is the time readers price the status at.
func (b *StatusBoard) clock() time.Time {
	if b.now != nil {
		return b.now()
	}
	return time.Now()
}

// Load returns the latest snapshot as the machine made it, or nil before the job's first
// step. It is shared with other readers: do not modify it.
func (b *StatusBoard) Load() *Status { return b.p.Load() }

func (b *StatusBoard) store(s Status) { b.p.Store(&s) }

// staleProgress is how old rank 0's last report may be for its step rate to count: past it
// the job is not stepping (a reset, a hang), and the rate shows 0.
const staleProgress = 5 * time.Second

// Current returns the latest status completed as of now: the job ID, rank 0's progress, and
// the hosts' prices and the cost of their time until now (until the end, for a finished
// job). Nil before the job's first step. The result is the caller's.
func (b *StatusBoard) Current(now time.Time) *Status {
	s := b.current(now)
	if s != nil {
		s.ProgressHistory = b.hist.points()
		if n := len(s.ProgressHistory); n == 0 || s.Now.After(s.ProgressHistory[n-1].T) {
			s.ProgressHistory = append(s.ProgressHistory, progressPoint(s))
		}
	}
	return s
}

// Record adds the progress and cost as of now to the history that Current returns. The
// driver calls it every second; the history stays bounded however long the job runs.
func (b *StatusBoard) Record(now time.Time) {
	if s := b.current(now); s != nil {
		b.hist.add(progressPoint(s))
	}
}

// progressPoint is s's progress and cost as a point of the history.
func progressPoint(s *Status) ProgressPoint {
	pt := ProgressPoint{T: s.Now, Step: s.Progress.Step, StepsPerSecond: s.Progress.StepsPerSecond, Loss: s.Progress.Loss}
	if c := s.Cost; c != nil && (len(c.Unpriced) == 0 || slices.ContainsFunc(c.Lines, func(l cost.Line) bool { return l.Cost != nil })) {
		pt.Cost = new(c.Total)
	}
	return pt
}

// current is Current without the progress history.
func (b *StatusBoard) current(now time.Time) *Status {
	p := b.Load()
	if p == nil {
		return nil
	}
	s := *p
	s.JobID = b.jobID
	at := now
	if s.Finished != nil {
		at = p.Now // the clock stops with the job
	}
	s.Now = at
	if !s.StartedAt.IsZero() {
		s.ElapsedSeconds = max(0, at.Sub(s.StartedAt).Seconds())
	}
	s.Progress = ProgressStatus{RolledBackSteps: p.rbSteps, RolledBackGPUs: p.rolledBackSlotSeconds(), UnreportedRestarts: p.unreported}
	if b.progress != nil {
		if pr := b.progress(); !pr.At.IsZero() {
			s.Progress.Step, s.Progress.CommittedStep = pr.Step, pr.Committed
			if at.Sub(pr.At) < staleProgress && pr.StepsPerSecond > 0 {
				s.Progress.StepsPerSecond, s.Progress.StepSeconds = pr.StepsPerSecond, 1/pr.StepsPerSecond
			}
			t := pr.At
			s.Progress.UpdatedAt = &t
			if pr.Loss != nil {
				s.Progress.Loss = new(*pr.Loss)
			}
			s.Progress.TotalSteps = pr.TotalSteps
			if n, sp := pr.TotalSteps, s.Progress.StepsPerSecond; n > 0 && sp > 0 {
				s.Progress.ETASeconds = new(float64(n-min(n, pr.Step)) / sp)
			} else if n > 0 && pr.Step >= n {
				s.Progress.ETASeconds = new(0.0) // done, whatever the rate
			}
		}
	}
	var heard map[string]time.Time
	if b.heard != nil {
		heard = b.heard()
	}
	s.Hosts = slices.Clone(p.Hosts)
	for i, h := range s.Hosts {
		hs := &s.Hosts[i]
		if price, _, ok := b.prices.Price(h.Type, h.Zone, h.Lifecycle == cost.LifecycleSpot); ok {
			hs.PricePerHour = &price
		}
		if !h.Since.IsZero() {
			hs.UptimeSeconds = max(0, at.Sub(h.Since).Seconds())
		}
		if t, ok := heard[h.ID]; ok && !t.IsZero() {
			hs.LastHeartbeat, hs.HeartbeatAgeSeconds = new(t), new(max(0, at.Sub(t).Seconds()))
		}
	}
	us := make([]cost.Usage, 0, len(p.lives))
	for _, l := range p.lives {
		us = append(us, cost.Usage{
			Type: l.host.Type, Zone: l.host.Zone, Spot: l.host.Spot, Slots: l.host.Slots,
			Stays: l.stays, RolledBackSlotSeconds: p.rolledBack[l.host.ID],
		})
	}
	sum := cost.Compute(b.prices, us, at)
	s.Cost = &sum
	if c := p.Capacity; c != nil && c.Fallback != nil {
		cc, fb := *c, *c.Fallback // the snapshot is shared: change copies
		cc.Fallback, s.Capacity = &fb, &cc
		if !fb.since.IsZero() {
			fb.JobSeconds += max(0, at.Sub(fb.since).Seconds())
		}
		var fus []cost.Usage
		for _, l := range p.lives {
			if l.host.Fallback {
				fus = append(fus, cost.Usage{Type: l.host.Type, Zone: l.host.Zone, Spot: l.host.Spot, Slots: l.host.Slots, Stays: l.stays})
			}
		}
		fsum := cost.Compute(b.prices, fus, at)
		for _, l := range fsum.Lines {
			fb.HostHours += l.Seconds / 3600
		}
		if len(fsum.Unpriced) == 0 {
			fb.Cost, fb.Currency = new(fsum.Total), fsum.Currency
		}
	}
	return &s
}

// Types returns the instance types of the hosts in the latest snapshot, for the price
// catalog to ask about.
func (b *StatusBoard) Types() []string {
	p := b.Load()
	if p == nil {
		return nil
	}
	seen := map[string]bool{}
	for _, l := range p.lives {
		if l.host.Type != "" {
			seen[l.host.Type] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}
