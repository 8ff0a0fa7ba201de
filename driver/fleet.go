package driver

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

// Steering the group (--manage-capacity). Every call is real money, so the machine decides
// them like everything else, from events, and the runner only makes them: the group's desired
// size follows what the job can use (enough hosts for --max-np, within the group's own
// maximum, which is never raised) and goes to zero when the job ends for good; a host the job
// cannot use (a failed GPU, every slot quarantined) is handed back for a replacement once no
// worker runs there, a bounded number of times per hour, each instance once. A call the cloud
// refuses (a permission) is said once, and the job goes on unmanaged.

// CapacityConfig is --manage-capacity.
type CapacityConfig struct {
	// Group names the group in the log, the journal and the status ("aws group spot-g").
	Group string
	// SlotsPerHost is the slot count of one host, when known ahead (--slots-per-host); 0: it
	// is learned from the hosts listed, and a group with none is first asked for one host.
	SlotsPerHost int
	// CheckEvery is how often the group's size is read, so that a size changed by someone
	// else is set back (0: DefaultCapacityCheck).
	CheckEvery time.Duration
	// ReplacePerHour bounds the hosts handed back for a replacement in any hour (0:
	// DefaultReplacePerHour).
	ReplacePerHour int
	// AgentTimeout, when positive, is how long a host may be listed with no agent connecting
	// for it (--launcher agent) before it is handed back for a replacement.
	AgentTimeout time.Duration
	// Fallback, when set, is an on-demand group of the same cloud that the job falls back
	// on while spot capacity has run out (fallback.go).
	Fallback *FallbackConfig
}

// Defaults of CapacityConfig.
const (
	DefaultCapacityCheck  = 30 * time.Second
	DefaultReplacePerHour = 4
	// DefaultAgentTimeout is --agent-timeout's default: a GPU instance boots, installs and
	// starts its agent well within it.
	DefaultAgentTimeout = 10 * time.Minute
)

func (c CapacityConfig) withDefaults() CapacityConfig {
	if c.CheckEvery <= 0 {
		c.CheckEvery = DefaultCapacityCheck
	}
	if c.ReplacePerHour <= 0 {
		c.ReplacePerHour = DefaultReplacePerHour
	}
	return c
}

// CapacityRead is the group's size as read (ReadCapacity carried out); with a fallback
// group, the spot group's read also brings its recent launch failures.
type CapacityRead struct {
	Now      time.Time
	Fallback bool // the fallback group's
	Size     providers.GroupSize
	Failures []providers.LaunchFailure
	Err      error
}

// CapacitySet is a SetCapacity carried out.
type CapacitySet struct {
	Now      time.Time
	Fallback bool
	From, To int
	Err      error
}

// HostHandedBack is a HandBack carried out.
type HostHandedBack struct {
	Now  time.Time
	Host string
	Err  error
}

func (e CapacityRead) at() time.Time   { return e.Now }
func (e CapacitySet) at() time.Time    { return e.Now }
func (e HostHandedBack) at() time.Time { return e.Now }

// HostUnusable is a host the job cannot use though the cloud lists it (its agent never
// connected): under --manage-capacity it is handed back for a replacement.
type HostUnusable struct {
	Now      time.Time
	Host     string
	Fallback bool // a host of the fallback group
	Reason   string
}

func (e HostUnusable) at() time.Time { return e.Now }

// ReadCapacity reads the group's size (providers.Capacity.GroupSize), and with Failures its
// recent launch failures (LaunchFailures).
type ReadCapacity struct {
	Fallback bool // the fallback group
	Failures bool
}

// SetCapacity sets the group's desired size (providers.Capacity.SetDesired). Final is the
// job's end: the runner makes it once the workers are stopped, and the job's result says how
// it went.
type SetCapacity struct {
	Fallback bool // the fallback group
	From, To int
	Reason   string
	Final    bool
}

// HandBack hands a host back to the cloud for a replacement (providers.Capacity.Replace).
type HandBack struct {
	Host, Reason string
	Fallback     bool // a host of the fallback group
}

func (ReadCapacity) action() {}
func (SetCapacity) action()  {}
func (HandBack) action()     {}

// EventCapacity is the journal's kind for what the driver did to the group.
const EventCapacity = "capacity"

// fleet is the machine's state of --manage-capacity.
type fleet struct {
	cfg      CapacityConfig
	fb       *fallback // the fallback group; nil without
	size     providers.GroupSize
	known    bool      // size was read at least once
	busy     bool      // a read or a set is under way: one call at a time
	nextRead time.Time // zero: read at once
	lastRead time.Time // the last read that answered
	refused  string    // a call was refused: the job goes on unmanaged, and says why
	capped   bool      // said once that the group's maximum holds the job below --max-np
	changes  []string  // "4 → 0" of each size set, oldest first

	broken        map[string]string    // hosts to hand back, with why, until handed back
	fallbackHosts map[string]bool      // broken hosts of the fallback group discovery does not list
	handedBack    map[string]time.Time // instances handed back, each once
	handing       string               // the host whose HandBack is under way
	recentHands   []time.Time          // for ReplacePerHour
}

func newFleet(cfg CapacityConfig) *fleet {
	f := &fleet{cfg: cfg.withDefaults(), broken: map[string]string{}, handedBack: map[string]time.Time{}, fallbackHosts: map[string]bool{}}
	if cfg.Fallback != nil {
		f.fb = newFallback(*cfg.Fallback)
	}
	return f
}

// steerDeadline is when the fleet wants a Tick (its next read), or zero.
func (m *Machine) steerDeadline() time.Time {
	f := m.fl
	if f == nil || f.refused != "" {
		return time.Time{}
	}
	var t time.Time
	if !f.busy {
		t = f.nextRead
	}
	// A broken host held back by the hourly bound: when the oldest hand-back of the hour ages out.
	if len(f.broken) > 0 && f.handing == "" && len(f.recentHands) >= f.cfg.ReplacePerHour {
		if at := f.recentHands[0].Add(time.Hour); t.IsZero() || at.Before(t) {
			t = at
		}
	}
	if at := m.fallbackDeadline(); !at.IsZero() && (t.IsZero() || at.Before(t)) {
		t = at
	}
	return t
}

// hostSlots is the slot count of one of the group's hosts: --slots-per-host, else the most
// any listed host has; 0 with neither.
func (m *Machine) hostSlots() int {
	slots := m.fl.cfg.SlotsPerHost
	if slots == 0 {
		for _, h := range m.raw {
			slots = max(slots, h.Slots)
		}
	}
	return slots
}

// wantHosts is the desired size the job can use: enough hosts for --max-np, within the
// group's bounds (the minimum is not lowered while the job runs, the maximum never raised),
// and whether the job could use more than the maximum. Without a host to learn the slots
// from, a group at zero is asked for one host first, and any other size is left as it is.
func (m *Machine) wantHosts() (want int, overMax bool) {
	f := m.fl
	want = f.size.Desired
	switch slots := m.hostSlots(); {
	case slots > 0:
		want = (m.cfg.MaxNP + slots - 1) / slots
	case f.size.Desired == 0:
		want = 1
	}
	return min(max(want, f.size.Min), f.size.Max), want > f.size.Max
}

// steer makes the fleet's next call, if any is due: a read when its time has come, else a set
// when the group's size is not what the job can use, else a host handed back.
func (m *Machine) steer(now time.Time) []Action {
	f := m.fl
	if f == nil || f.refused != "" || m.phase == phaseDone || m.adopting() {
		return nil
	}
	var acts []Action
	if m.fallbackWantsRead(now) {
		f.nextRead = now
	}
	if !f.busy && !now.Before(f.nextRead) {
		f.busy = true
		acts = append(acts, ReadCapacity{Failures: f.fb != nil})
	}
	if !f.busy && f.known {
		want, overMax := m.wantHosts()
		if want != f.size.Desired {
			f.busy = true
			why := fmt.Sprintf("the job uses up to %d slots (--max-np)", m.cfg.MaxNP)
			if want == 1 && f.size.Desired == 0 && f.cfg.SlotsPerHost == 0 && len(m.raw) == 0 {
				why = "one host first, to learn how many slots a host has"
			}
			acts = append(acts, SetCapacity{From: f.size.Desired, To: want, Reason: why})
		}
		if !f.capped && overMax {
			f.capped = true
			msg := fmt.Sprintf("%s is at its maximum size %d: the job stays below --max-np %d (elasticd never raises a group's maximum; raise it in the group if the job should grow)", f.cfg.Group, f.size.Max, m.cfg.MaxNP)
			m.j.event(now, EventCapacity, "%s", msg)
			acts = append(acts, Warn{msg, nil})
		}
	}
	acts = append(acts, m.steerFallback(now)...)
	return append(acts, m.handBack(now)...)
}

// hostBusy reports whether a worker process of the host has yet to exit (one being stopped
// included).
func (m *Machine) hostBusy(host string) bool {
	for id, w := range m.workers {
		if id.Host == host && !w.exited {
			return true
		}
	}
	return false
}

// handBack hands back the next broken host that no worker runs on any more, within the
// hourly bound.
func (m *Machine) handBack(now time.Time) []Action {
	f := m.fl
	if f.handing != "" || len(f.broken) == 0 {
		return nil
	}
	keep := f.recentHands[:0]
	for _, at := range f.recentHands {
		if now.Sub(at) < time.Hour {
			keep = append(keep, at)
		}
	}
	f.recentHands = keep
	for _, host := range slices.Sorted(maps.Keys(f.broken)) {
		if m.hostBusy(host) {
			continue // its workers leave first, as on a notice
		}
		if len(f.recentHands) >= f.cfg.ReplacePerHour {
			return nil // the next hour's
		}
		f.handing = host
		f.recentHands = append(f.recentHands, now)
		return []Action{HandBack{Host: host, Reason: f.broken[host], Fallback: m.isFallback(host) || f.fallbackHosts[host]}}
	}
	return nil
}

// brokenHost marks a host the job cannot use to be handed back for a replacement, once its
// workers are gone. An instance is handed back once; one already marked keeps its reason.
func (m *Machine) brokenHost(now time.Time, host, why string) []Action {
	f := m.fl
	if f == nil || f.refused != "" {
		return nil
	}
	if _, done := f.handedBack[host]; done {
		return nil
	}
	if _, marked := f.broken[host]; marked {
		return nil
	}
	f.broken[host] = why
	m.j.event(now, EventCapacity, "host %s will be handed back to %s for a replacement: %s", host, f.cfg.Group, why)
	acts := []Action{Note{"broken host to be handed back for a replacement once its workers are gone", []any{"host", host, "reason", why}}}
	return append(acts, m.retire(now, host)...)
}

// retire moves the job off a host that is to be handed back, as a notice does: its slots are
// no longer offered, and its workers leave at their next commit, without rollback (restart
// mode: the group restarts without it).
func (m *Machine) retire(now time.Time, host string) []Action {
	changed := m.hosts.SetLeaving(m.slotIDs(host)...)
	if !changed || m.phase != phaseRunning || !m.runsOn(host) {
		return nil
	}
	m.j.plannedCause(CauseRemoval)
	if !m.inProcess() {
		return m.restart(now, false, "host "+host+" is to be handed back for a replacement", time.Time{})
	}
	return m.notifyHosts()
}

// checkQuarantined marks the hosts whose every listed slot is quarantined as broken.
func (m *Machine) checkQuarantined(now time.Time) []Action {
	if m.fl == nil {
		return nil
	}
	q := map[string]int{}
	for _, s := range m.hosts.Quarantined() {
		if id, err := protocol.ParseWorkerID(s); err == nil {
			q[id.Host]++
		}
	}
	var acts []Action
	for _, h := range m.raw {
		if h.Slots > 0 && q[h.ID] >= h.Slots {
			acts = append(acts, m.brokenHost(now, h.ID, fmt.Sprintf("all its %d slots are quarantined for flapping", h.Slots))...)
		}
	}
	return acts
}

// fleetEvent applies the result of a fleet call.
func (m *Machine) fleetEvent(now time.Time, ev Event) []Action {
	f := m.fl
	if f == nil {
		return nil
	}
	switch e := ev.(type) {
	case CapacityRead:
		if e.Fallback {
			return m.fallbackRead(now, e)
		}
		f.busy = false
		f.nextRead = now.Add(f.cfg.CheckEvery)
		if e.Err != nil {
			return m.fleetFailed(now, "read the group's size", e.Err)
		}
		if f.known && e.Size.Desired != f.size.Desired {
			m.j.event(now, EventCapacity, "%s: its desired size changed from %d to %d outside this driver", f.cfg.Group, f.size.Desired, e.Size.Desired)
		}
		f.size, f.known, f.lastRead = e.Size, true, now
		m.spotFailures(now, e.Failures)
	case CapacitySet:
		if e.Fallback {
			return m.fallbackSet(now, e)
		}
		f.busy = false
		if e.Err != nil {
			return m.fleetFailed(now, fmt.Sprintf("set the desired size to %d", e.To), e.Err)
		}
		change := fmt.Sprintf("%d → %d", e.From, e.To)
		f.changes = append(f.changes, change)
		f.size.Desired = e.To
		f.size.Min = min(f.size.Min, e.To)
		m.j.event(now, EventCapacity, "%s: desired size %s", f.cfg.Group, change)
		return []Action{Note{"group resized", []any{"group", f.cfg.Group, "from", e.From, "to", e.To}}}
	case HostUnusable:
		if e.Fallback {
			f.fallbackHosts[e.Host] = true
		}
		return m.brokenHost(now, e.Host, e.Reason)
	case HostHandedBack:
		f.handing = ""
		why := f.broken[e.Host]
		delete(f.broken, e.Host)
		if e.Err != nil && !errors.Is(e.Err, providers.ErrNotInGroup) {
			if errors.Is(e.Err, providers.ErrRefused) {
				return m.fleetFailed(now, "hand back host "+e.Host, e.Err)
			}
			f.broken[e.Host] = why // tried again at the next step
			return []Action{Warn{"could not hand the host back; trying again", []any{"host", e.Host, "err", e.Err}}}
		}
		f.handedBack[e.Host] = now
		m.j.event(now, EventCapacity, "host %s handed back to %s for a replacement: %s", e.Host, f.cfg.Group, why)
		return []Action{Note{"host handed back for a replacement", []any{"host", e.Host, "group", f.cfg.Group, "reason", why}}}
	}
	return nil
}

// fleetFailed takes a failed call: a refusal ends the steering (said once, with what the cloud
// needs); anything else is tried again at the next read.
func (m *Machine) fleetFailed(now time.Time, what string, err error) []Action {
	f := m.fl
	if errors.Is(err, providers.ErrClaimed) {
		f.refused = err.Error()
		msg := fmt.Sprintf("%s: another driver steers it now (%v); this job goes on, but no longer steers the group, nor sets it to zero at its end", f.cfg.Group, err)
		m.j.event(now, EventCapacity, "%s", msg)
		return []Action{Warn{msg, nil}}
	}
	if errors.Is(err, providers.ErrRefused) {
		f.refused = fmt.Sprintf("could not %s: %v", what, err)
		msg := fmt.Sprintf("%s: %s; the job goes on, but the group is no longer managed (grant what the error names, or drop --manage-capacity)", f.cfg.Group, f.refused)
		m.j.event(now, EventCapacity, "%s", msg)
		return []Action{Warn{msg, nil}}
	}
	return []Action{Warn{"capacity call failed; trying again at the next check", []any{"group", f.cfg.Group, "call", what, "err", err, "next", f.cfg.CheckEvery}}}
}

// finalCapacity is the job's end for the group: its desired size to zero, unless the steering
// was refused.
func (m *Machine) finalCapacity(reason string) []Action {
	f := m.fl
	if f == nil || f.refused != "" {
		return nil
	}
	acts := []Action{SetCapacity{From: f.size.Desired, To: 0, Reason: "the job ended: " + reason, Final: true}}
	if fb := f.fb; fb != nil && (!fb.known || fb.size.Desired > 0 || fb.size.Min > 0) {
		acts = append(acts, SetCapacity{Fallback: true, From: fb.size.Desired, To: 0, Reason: "the job ended: " + reason, Final: true})
	}
	return acts
}

// CapacityStatus is what --manage-capacity did to the group, for /v1/status and the job's
// last line.
type CapacityStatus struct {
	Group     string   `json:"group"`
	Desired   int      `json:"desired"`
	Min       int      `json:"min"`
	Max       int      `json:"max"`
	Instances int      `json:"instances"`
	Changes   []string `json:"changes"`           // "4 → 0", oldest first
	Refused   string   `json:"refused,omitempty"` // why the group is no longer managed
	// HandedBack are the instances handed back for a replacement.
	HandedBack []string `json:"handed_back"`
	// Final is how the job's end left the group ("4 → 0", or why it did not).
	Final string `json:"final,omitempty"`
	// Fallback is the on-demand fallback group's part; nil without one.
	Fallback *FallbackStatus `json:"fallback,omitempty"`
}

// capacityStatus is the fleet's part of the status; nil without --manage-capacity.
func (m *Machine) capacityStatus() *CapacityStatus {
	f := m.fl
	if f == nil {
		return nil
	}
	s := &CapacityStatus{Group: f.cfg.Group, Desired: f.size.Desired, Min: f.size.Min, Max: f.size.Max, Instances: f.size.Instances,
		Changes: slices.Clone(f.changes), Refused: f.refused, HandedBack: slices.Sorted(maps.Keys(f.handedBack))}
	if s.Changes == nil {
		s.Changes = []string{}
	}
	s.Fallback = m.fallbackStatus()
	return s
}

// CapacityLine is the job's last word on the group: "aws group spot-g: 4 → 0".
func (s *CapacityStatus) CapacityLine() string {
	if s == nil {
		return ""
	}
	line := s.Group + ": " + strings.Join(s.Changes, ", ")
	switch {
	case s.Final != "":
		line = s.Group + ": " + s.Final
	case s.Refused != "":
		return s.Group + ": not managed: " + s.Refused
	}
	if fb := s.Fallback; fb != nil {
		line += "; " + fb.line()
	}
	return line
}
