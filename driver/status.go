package driver

import (
	"cmp"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/elasticd/elasticd/driver/rendezvous"
)

// Status is a snapshot of the job as the state machine sees it, for readers outside the
// driver's loop (the admin API, `elasticd ctl status`). It shares nothing with the machine.
type Status struct {
	Generation uint64         `json:"generation"`
	WorldSize  int            `json:"world_size"`
	Phase      string         `json:"phase"` // starting, running, resetting, waiting, finishing, done
	MinNP      int            `json:"min_np"`
	MaxNP      int            `json:"max_np"`
	Resets     int            `json:"resets"`
	Hosts      []HostStatus   `json:"hosts"`   // the hosts of the latest discovery result, by ID
	Workers    []WorkerStatus `json:"workers"` // the worker processes not yet exited: by rank, then the others by ID
}

// HostStatus is one discovered host.
type HostStatus struct {
	ID          string `json:"id"`
	Addr        string `json:"addr"`
	Slots       int    `json:"slots"`
	Blacklisted int    `json:"blacklisted_slots"` // slots cooling down after a failure
	Leaving     bool   `json:"leaving"`           // a notice says it goes away; its workers are moving off
}

// WorkerStatus is one worker process.
type WorkerStatus struct {
	ID   string `json:"id"` // HOST/SLOT: stable for the life of the job
	Host string `json:"host"`
	Slot int    `json:"slot"`
	Rank int    `json:"rank"` // in the current generation; -1 when not part of it
	// State is "running" (registered), "starting" (launched, not registered yet) or
	// "stopping" (told to stop: its host left, it failed, or it is over --max-np).
	State string `json:"state"`
}

var phaseNames = map[phase]string{
	phaseStarting: "starting", phaseRunning: "running", phaseResetting: "resetting",
	phaseWaiting: "waiting", phaseFinishing: "finishing", phaseDone: "done",
}

// Snapshot returns the job's status. It reads the machine without changing it (the host
// manager's clock included), so it may be called between any two steps.
func (m *Machine) Snapshot() Status {
	s := Status{
		Generation: m.gen, WorldSize: len(m.order), Phase: phaseNames[m.phase],
		MinNP: m.cfg.MinNP, MaxNP: m.cfg.MaxNP, Resets: m.Resets,
		Hosts: []HostStatus{}, Workers: []WorkerStatus{},
	}
	byID := map[string]int{} // host ID -> index in s.Hosts
	for _, h := range m.discovered {
		id := slotWorker(h)
		i, ok := byID[id.Host]
		if !ok {
			i = len(s.Hosts)
			byID[id.Host] = i
			s.Hosts = append(s.Hosts, HostStatus{ID: id.Host, Addr: h.Addr})
		}
		s.Hosts[i].Slots++
	}
	// The zero time never moves the manager's clock: this lists the cooldowns as of the
	// latest time the machine has seen.
	for _, b := range m.hosts.Blacklisted(time.Time{}) {
		if id, err := rendezvous.ParseWorkerID(b.ID); err == nil {
			if i, ok := byID[id.Host]; ok {
				s.Hosts[i].Blacklisted++
			}
		}
	}
	for i := range s.Hosts {
		_, s.Hosts[i].Leaving = m.pending[s.Hosts[i].ID]
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
		case due:
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
	return s
}

// StatusBoard holds the latest Status for readers on other goroutines: the driver's loop
// publishes one whenever it has worked off the events at hand, the admin API reads it. Safe
// for concurrent use.
type StatusBoard struct{ p atomic.Pointer[Status] }

// Load returns the latest status, or nil before the job's first step. It is shared with
// other readers: do not modify it.
func (b *StatusBoard) Load() *Status { return b.p.Load() }

func (b *StatusBoard) store(s Status) { b.p.Store(&s) }
