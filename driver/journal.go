package driver

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/elasticd/elasticd/driver/cost"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

// The machine's journal: what the status API, the metrics and the live page show beyond the
// job's current state — how long each host has been in the group (for its cost), the world
// size over time, recent events, resets by cause, notices, and work rolled back. Like the
// rest of the machine it takes time only from events.

// Reset causes, the label of elasticd_resets_total.
const (
	CauseFailure = "failure"  // a worker died, hung, or its hardware failed
	CauseScaleUp = "scale-up" // slots were added (discovery, ctl add-host, a cooldown ended)
	CauseRemoval = "removal"  // slots went away (discovery, ctl remove-host, over --max-np)
	CauseNotice  = "notice"   // the cloud announced it takes a host (spot interruption, scale-in)
)

// ResetCauses lists the causes in display order.
var ResetCauses = []string{CauseFailure, CauseScaleUp, CauseRemoval, CauseNotice}

// Event kinds of the journal.
const (
	EventGeneration  = "generation"
	EventJoin        = "join"
	EventLeave       = "leave"
	EventFailure     = "failure"
	EventNotice      = "notice"
	EventHostAdded   = "host-added"
	EventHostRemoved = "host-removed"
	EventReset       = "reset"
	EventFinish      = "finish"
)

// Bounds of what the journal keeps.
const (
	maxEvents  = 100
	maxHistory = 512
)

// hostLife is one host's time in the group, for its cost: it is billed from the first
// discovery that lists it to the first that does not.
type hostLife struct {
	host  providers.Host // as last discovered
	stays []cost.Stay    // the last one open (zero To) while the host is in the group
}

// present reports whether the host is in the group now, and since when.
func (l *hostLife) present() (time.Time, bool) {
	if n := len(l.stays); n > 0 && l.stays[n-1].To.IsZero() {
		return l.stays[n-1].From, true
	}
	return time.Time{}, false
}

type journal struct {
	started time.Time // the first event
	now     time.Time // the latest event
	lives   map[string]*hostLife
	// usage is lives as snapshots share it, by host ID: made again by each discovery (which
	// reports changes only), not for every snapshot, and never written into afterwards.
	usage    []usage
	failures map[string]*HostFailures // by host ID: every host that ever had a worker fail
	events   []JobEvent
	history  []WorldPoint
	causes   map[string]int
	notices  map[[2]string]int // (source, kind) -> count
	finished *Finished

	// The reset under way: its cause when planned (the first change announced since the
	// last generation), the largest rollback its workers reported, and when it began.
	hostsCause        string
	rbSteps           uint64
	rbSeconds         float64
	rolledBackSteps   uint64
	rolledBackSlotSec map[string]float64 // host ID -> slot-seconds of work rolled back
	// unreportedRestarts counts restarts whose loss is unknown: the script reported no
	// progress in the generation it restarted.
	unreportedRestarts int
	rdvStart           time.Time
	rdvGen             uint64 // generation whose registrations are awaited, 0 when none
}

func newJournal() journal {
	return journal{lives: map[string]*hostLife{}, failures: map[string]*HostFailures{}, causes: map[string]int{}, notices: map[[2]string]int{}, rolledBackSlotSec: map[string]float64{}}
}

func (j *journal) event(now time.Time, kind, format string, args ...any) {
	if len(j.events) == maxEvents {
		j.events = slices.Delete(j.events, 0, 1)
	}
	j.events = append(j.events, JobEvent{At: now, Kind: kind, Message: fmt.Sprintf(format, args...)})
}

// failed counts a failure of worker id (it died, or hung, or came too late): why is how.
func (j *journal) failed(now time.Time, id protocol.WorkerID, why string) {
	f := j.failures[id.Host]
	if f == nil {
		f = &HostFailures{}
		j.failures[id.Host] = f
	}
	f.Count++
	f.Last = &HostFailure{At: now, Worker: id.String(), Cause: why}
}

func (j *journal) point(now time.Time, gen uint64, size int) {
	if n := len(j.history); n > 0 && j.history[n-1].Generation == gen && j.history[n-1].WorldSize == size {
		return
	}
	if len(j.history) == maxHistory {
		j.history = slices.Delete(j.history, 0, 1)
	}
	j.history = append(j.history, WorldPoint{At: now, Generation: gen, WorldSize: size})
}

// discovered updates the hosts' lives from a discovery result.
func (j *journal) discovered(now time.Time, hs []providers.Host) {
	seen := make(map[string]bool, len(hs))
	for _, h := range hs {
		seen[h.ID] = true
		l := j.lives[h.ID]
		if l == nil {
			l = &hostLife{}
			j.lives[h.ID] = l
		}
		l.host = h
		if _, ok := l.present(); !ok {
			l.stays = append(l.stays, cost.Stay{From: now})
			j.event(now, EventHostAdded, "host %s (%s) joined the group: %d slots, %s%s", h.ID, h.Addr, h.Slots, cost.Lifecycle(h.Spot), typeSuffix(h.Type))
		}
	}
	for id, l := range j.lives {
		if since, ok := l.present(); ok && !seen[id] {
			l.stays[len(l.stays)-1].To = now
			j.event(now, EventHostRemoved, "host %s left the group after %s", id, now.Sub(since).Round(time.Second))
		}
	}
	j.refreshUsage()
}

// refreshUsage makes usage again from lives: a new slice with copies of the stays, since
// snapshots already out hold the old one.
func (j *journal) refreshUsage() {
	j.usage = make([]usage, 0, len(j.lives))
	for _, l := range j.lives {
		j.usage = append(j.usage, usage{host: l.host, stays: slices.Clone(l.stays)})
	}
	slices.SortFunc(j.usage, func(a, b usage) int { return strings.Compare(a.host.ID, b.host.ID) })
}

// plannedCause remembers why the hosts changed, for the reset it will bring.
func (j *journal) plannedCause(c string) {
	if j.hostsCause == "" {
		j.hostsCause = c
	}
}

func typeSuffix(t string) string {
	if t == "" {
		return ""
	}
	return " " + t
}

// SavedJournal is the journal as --state-dir keeps it, so that a driver started again on it
// shows the job's whole history and cost: when it started, each host's time in the group,
// failures, recent events, world sizes, resets by cause, notices and work rolled back.
type SavedJournal struct {
	Started               time.Time                `json:"started"`
	Lives                 []SavedLife              `json:"lives"`
	Failures              map[string]*HostFailures `json:"failures,omitempty"`
	Events                []JobEvent               `json:"events,omitempty"`
	WorldHistory          []WorldPoint             `json:"world_history,omitempty"`
	Causes                map[string]int           `json:"reset_causes,omitempty"`
	Notices               []NoticeCount            `json:"notices,omitempty"`
	RolledBackSteps       uint64                   `json:"rolled_back_steps,omitempty"`
	RolledBackSlotSeconds map[string]float64       `json:"rolled_back_slot_seconds,omitempty"`
	UnreportedRestarts    int                      `json:"unreported_restarts,omitempty"`
}

// SavedLife is one host's time in the group.
type SavedLife struct {
	Host  providers.Host `json:"host"`
	Stays []cost.Stay    `json:"stays"`
}

// save copies what a restarted driver needs of the journal; nothing of it is shared.
func (j *journal) save() *SavedJournal {
	s := &SavedJournal{
		Started: j.started, Failures: map[string]*HostFailures{}, Events: slices.Clone(j.events),
		WorldHistory: slices.Clone(j.history), Causes: maps.Clone(j.causes), RolledBackSteps: j.rolledBackSteps,
		RolledBackSlotSeconds: maps.Clone(j.rolledBackSlotSec), UnreportedRestarts: j.unreportedRestarts,
	}
	for _, u := range j.usage { // sorted by host ID, the stays already copies
		s.Lives = append(s.Lives, SavedLife{Host: u.host, Stays: u.stays})
	}
	for id, f := range j.failures {
		c := *f
		if f.Last != nil {
			last := *f.Last
			c.Last = &last
		}
		s.Failures[id] = &c
	}
	for k, n := range j.notices {
		s.Notices = append(s.Notices, NoticeCount{Provider: k[0], Kind: k[1], Count: n})
	}
	slices.SortFunc(s.Notices, func(a, b NoticeCount) int {
		return cmp.Or(strings.Compare(a.Provider, b.Provider), strings.Compare(a.Kind, b.Kind))
	})
	return s
}

// restore takes the journal up from s, before the restarted driver's first event: the hosts'
// open stays go on (the first discovery closes those no longer listed), so the job's cost
// counts the time the driver was away.
func (j *journal) restore(s *SavedJournal) {
	if !s.Started.IsZero() {
		j.started = s.Started
	}
	for _, l := range s.Lives {
		j.lives[l.Host.ID] = &hostLife{host: l.Host, stays: slices.Clone(l.Stays)}
	}
	j.refreshUsage()
	for id, f := range s.Failures {
		if f != nil {
			j.failures[id] = f
		}
	}
	j.events = append(slices.Clone(s.Events), j.events...)
	if n := len(j.events); n > maxEvents {
		j.events = slices.Delete(j.events, 0, n-maxEvents)
	}
	j.history = append(slices.Clone(s.WorldHistory), j.history...)
	if n := len(j.history); n > maxHistory {
		j.history = slices.Delete(j.history, 0, n-maxHistory)
	}
	maps.Copy(j.causes, s.Causes)
	for _, n := range s.Notices {
		j.notices[[2]string{n.Provider, n.Kind}] += n.Count
	}
	j.rolledBackSteps += s.RolledBackSteps
	for id, sec := range s.RolledBackSlotSeconds {
		j.rolledBackSlotSec[id] += sec
	}
	j.unreportedRestarts += s.UnreportedRestarts
}
