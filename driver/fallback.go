package driver

import (
	"fmt"
	"strings"
	"time"

	"github.com/elasticd/elasticd/providers"
)

// Falling back on on-demand capacity and returning to spot (--fallback-asg and its kin). A
// cloud's spot group never falls back by itself: with no spot capacity it retries spot for
// ever. When the job has been short of -np on its spot hosts for FallbackConfig.After and the
// spot group reports that it has no capacity, the on-demand fallback group is grown by the
// hosts missing, no more. When the spot group can carry -np again, the job moves off the
// fallback hosts at a commit, as on a notice (no rollback), and the fallback group goes back to
// zero once no worker runs there.

// FallbackConfig is the fallback group's part of --manage-capacity.
type FallbackConfig struct {
	// Group names the fallback group in the log, the journal and the status.
	Group string
	// After is how long the job is short of -np on spot before it falls back
	// (--fallback-after; 0: DefaultFallbackAfter).
	After time.Duration
}

// DefaultFallbackAfter is --fallback-after's default: cluster-autoscaler's scale-up wait is
// of the same order.
const DefaultFallbackAfter = 10 * time.Minute

// fallback is the machine's state of the fallback group.
type fallback struct {
	cfg      FallbackConfig
	size     providers.GroupSize
	known    bool
	busy     bool
	nextRead time.Time
	changes  []string

	shortSince time.Time       // since when the spot hosts' usable slots are fewer than -np; zero while not
	stockout   time.Time       // the newest no-capacity failure the spot group reported
	stockCode  string          // its code, for the log
	seen       map[string]bool // failure IDs taken in
	moving     bool            // moving off the fallback hosts (spot carries the job again)
	usedSince  time.Time       // fallback workers in the generation since; zero while none
	used       time.Duration   // their time in the generation before usedSince
	hosts      map[string]bool // every fallback host seen
	spotWarned bool            // said that the fallback group launched a spot instance
}

func newFallback(cfg FallbackConfig) *fallback {
	if cfg.After <= 0 {
		cfg.After = DefaultFallbackAfter
	}
	return &fallback{cfg: cfg, seen: map[string]bool{}, hosts: map[string]bool{}}
}

// isFallback reports whether the latest discovery lists host in the fallback group.
func (m *Machine) isFallback(host string) bool {
	for _, h := range m.raw {
		if h.ID == host {
			return h.Fallback
		}
	}
	return false
}

// spotSlots counts the usable slots of spot-group hosts.
func (m *Machine) spotSlots(now time.Time) int {
	n := 0
	for _, h := range m.hosts.Usable(now) {
		if !h.Fallback {
			n++
		}
	}
	return n
}

// spotFailures takes in the spot group's launch failures: the newest no-capacity one.
func (m *Machine) spotFailures(now time.Time, fs []providers.LaunchFailure) {
	fb := m.fl.fb
	if fb == nil {
		return
	}
	for _, f := range fs {
		if f.Kind != providers.NoCapacity || fb.seen[f.ID] {
			continue
		}
		fb.seen[f.ID] = true
		at := f.At
		if at.IsZero() || at.After(now) {
			at = now
		}
		if at.After(fb.stockout) {
			fb.stockout, fb.stockCode = at, f.Code
		}
	}
	if len(fb.seen) > 4096 { // bounded: the recent ones are what counts
		clear(fb.seen)
	}
}

// fallbackDeadline is when the fallback wants a Tick: its next read, or the end of the wait
// before falling back.
func (m *Machine) fallbackDeadline() time.Time {
	fb := m.fl.fb
	if fb == nil {
		return time.Time{}
	}
	var t time.Time
	if !fb.busy {
		t = fb.nextRead
	}
	if !fb.shortSince.IsZero() {
		if at := fb.shortSince.Add(fb.cfg.After); t.IsZero() || at.Before(t) {
			t = at
		}
	}
	return t
}

// fallbackWantsRead reports whether the spot group's launch failures should be read now: the
// wait before falling back is over, no stockout is known within it, and the last read is
// older than the wait's end (the regular reads may be far apart).
func (m *Machine) fallbackWantsRead(now time.Time) bool {
	fb := m.fl.fb
	if fb == nil || fb.shortSince.IsZero() {
		return false
	}
	due := fb.shortSince.Add(fb.cfg.After)
	return !now.Before(due) && fb.stockout.Before(fb.shortSince.Add(-fb.cfg.After)) && m.fl.lastRead.Before(due)
}

// steerFallback grows the fallback group while spot is out, and moves the job off it and
// empties it once spot can carry -np again.
func (m *Machine) steerFallback(now time.Time) []Action {
	f := m.fl
	fb := f.fb
	if fb == nil {
		return nil
	}
	var acts []Action
	if !fb.busy && !now.Before(fb.nextRead) {
		fb.busy = true
		acts = append(acts, ReadCapacity{Fallback: true})
	}
	acts = append(acts, m.fallbackUse(now)...)
	spot := m.spotSlots(now)
	if spot < m.cfg.NP {
		if fb.shortSince.IsZero() {
			fb.shortSince = now
		}
	} else {
		fb.shortSince = time.Time{}
	}
	switch {
	case spot >= m.cfg.NP:
		acts = append(acts, m.leaveFallback(now)...)
	case !fb.shortSince.IsZero() && !now.Before(fb.shortSince.Add(fb.cfg.After)) && !fb.stockout.Before(fb.shortSince.Add(-fb.cfg.After)):
		fb.moving = false
		slots := max(m.hostSlots(), 1)
		// The fallback hosts already there count toward what is missing.
		have := 0
		for _, h := range m.raw {
			if h.Fallback && !h.Leaving {
				have += h.Slots
			}
		}
		missing := m.cfg.NP - spot
		want := min((missing+slots-1)/slots, fb.size.Max)
		if fb.known && !fb.busy && want > fb.size.Desired && have < missing {
			fb.busy = true
			why := fmt.Sprintf("the job has had %d of -np %d slots on spot for %v and the spot group reports no capacity (%s): %d on-demand %s for the %d slots missing", spot, m.cfg.NP, now.Sub(fb.shortSince).Round(time.Second), fb.stockCode, want, map[bool]string{true: "host", false: "hosts"}[want == 1], missing)
			m.j.event(now, EventCapacity, "falling back on %s: %s", fb.cfg.Group, why)
			acts = append(acts, SetCapacity{Fallback: true, From: fb.size.Desired, To: want, Reason: why})
		}
	}
	return acts
}

// leaveFallback moves the job off the fallback hosts (spot carries -np again) and sets the
// fallback group to zero once none of its hosts runs a worker.
func (m *Machine) leaveFallback(now time.Time) []Action {
	fb := m.fl.fb
	var acts []Action
	busy := false
	for _, h := range m.raw {
		if !h.Fallback {
			continue
		}
		if !fb.moving {
			fb.moving = true
			m.j.event(now, EventCapacity, "spot carries -np %d again: the job moves off the on-demand fallback hosts at its next commit", m.cfg.NP)
			acts = append(acts, Note{"spot capacity is back: moving off the on-demand fallback hosts at the next commit", []any{"group", fb.cfg.Group}})
		}
		acts = append(acts, m.retire(now, h.ID)...)
		busy = busy || m.hostBusy(h.ID)
	}
	if fb.known && !fb.busy && fb.size.Desired > 0 && !busy {
		fb.busy = true
		acts = append(acts, SetCapacity{Fallback: true, From: fb.size.Desired, To: 0, Reason: "spot carries the job again and no worker runs on the fallback hosts"})
	}
	return acts
}

// fallbackUse keeps the time fallback workers were in the generation, for the status, and
// warns once of a spot instance in the fallback group.
func (m *Machine) fallbackUse(now time.Time) []Action {
	var acts []Action
	fb := m.fl.fb
	for _, h := range m.raw {
		if !h.Fallback {
			continue
		}
		fb.hosts[h.ID] = true
		if h.Spot && !fb.spotWarned {
			fb.spotWarned = true
			msg := fmt.Sprintf("the fallback group %s launched a spot instance (%s): a fallback group must launch on-demand instances, or it runs out with the spot group; fix its launch template", fb.cfg.Group, h.ID)
			m.j.event(now, EventCapacity, "%s", msg)
			acts = append(acts, Warn{msg, nil})
		}
	}
	in := false
	if m.phase == phaseRunning {
		for _, id := range m.order {
			if fb.hosts[id.Host] {
				in = true
				break
			}
		}
	}
	switch {
	case in && fb.usedSince.IsZero():
		fb.usedSince = now
	case !in && !fb.usedSince.IsZero():
		fb.used += now.Sub(fb.usedSince)
		fb.usedSince = time.Time{}
	}
	return acts
}

// fallbackRead takes the fallback group's size.
func (m *Machine) fallbackRead(now time.Time, e CapacityRead) []Action {
	fb := m.fl.fb
	fb.busy = false
	fb.nextRead = now.Add(m.fl.cfg.CheckEvery)
	if e.Err != nil {
		return m.fleetFailed(now, "read the fallback group's size", e.Err)
	}
	fb.size, fb.known = e.Size, true
	return nil
}

// fallbackSet takes a change of the fallback group's size.
func (m *Machine) fallbackSet(now time.Time, e CapacitySet) []Action {
	fb := m.fl.fb
	fb.busy = false
	if e.Err != nil {
		return m.fleetFailed(now, fmt.Sprintf("set the fallback group's desired size to %d", e.To), e.Err)
	}
	change := fmt.Sprintf("%d → %d", e.From, e.To)
	fb.changes = append(fb.changes, change)
	fb.size.Desired, fb.size.Min = e.To, min(fb.size.Min, e.To)
	m.j.event(now, EventCapacity, "%s: desired size %s", fb.cfg.Group, change)
	return []Action{Note{"fallback group resized", []any{"group", fb.cfg.Group, "from", e.From, "to", e.To}}}
}

// FallbackStatus is the on-demand fallback group's part of CapacityStatus.
type FallbackStatus struct {
	Group   string   `json:"group"`
	Desired int      `json:"desired"`
	Changes []string `json:"changes"`
	// Hosts are the fallback hosts the job has seen.
	Hosts []string `json:"hosts"`
	// JobSeconds is how long fallback workers were part of the generation: the time it
	// kept the job at -np (or running at all) while spot was out.
	JobSeconds float64 `json:"job_seconds"`
	// HostHours and Cost are the fallback hosts' time and its cost (nil: unpriced), the
	// price of that time.
	HostHours float64  `json:"host_hours"`
	Cost      *float64 `json:"cost"`
	Currency  string   `json:"currency,omitempty"`
	// Final is how the job's end left the group.
	Final string    `json:"final,omitempty"`
	since time.Time // the machine's usedSince: the board adds the time since
}

func (m *Machine) fallbackStatus() *FallbackStatus {
	fb := m.fl.fb
	if fb == nil {
		return nil
	}
	s := &FallbackStatus{Group: fb.cfg.Group, Desired: fb.size.Desired, Changes: append([]string{}, fb.changes...), JobSeconds: fb.used.Seconds(), since: fb.usedSince}
	for h := range fb.hosts {
		s.Hosts = append(s.Hosts, h)
	}
	if s.Hosts == nil {
		s.Hosts = []string{}
	}
	return s
}

func (s *FallbackStatus) line() string {
	changes := strings.Join(s.Changes, ", ")
	if s.Final != "" {
		changes = s.Final
	}
	if changes == "" {
		changes = "not used"
	}
	out := fmt.Sprintf("fallback %s: %s", s.Group, changes)
	if s.JobSeconds > 0 {
		out += fmt.Sprintf(" (kept the job going %s on %.2f on-demand host-hours", (time.Duration(s.JobSeconds) * time.Second).Round(time.Second), s.HostHours)
		if s.Cost != nil {
			out += fmt.Sprintf(", %.4f %s", *s.Cost, s.Currency)
		}
		out += ")"
	}
	return out
}
