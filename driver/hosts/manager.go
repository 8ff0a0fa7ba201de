// Package hosts is the driver's host manager: which discovered hosts a job runs on, in a
// stable assignment order, with a blacklist whose cooldown grows per failure and decays.
//
// The Manager is pure: no goroutines, no clock, no I/O. Every call that depends on time takes
// now, so scenarios are table tests; a now earlier than one already seen counts as the latest.
// It is not safe for concurrent use; the driver's one state goroutine owns it.
//
// # Rules
//
// A host is usable when the latest discovery result lists it (with at least one slot), it is
// not marked leaving, and it is not in a blacklist cooldown.
//
// Assignment order: hosts that stay usable keep their relative order; a host that becomes
// usable is appended. Hosts that become usable together are appended by Launched, then ID,
// with digit runs in IDs compared by value (local-2 before local-10); a host whose cooldown
// ends is appended when it ends, in the order cooldowns end. So the order is a function of the
// calls and their times only, never of map or set iteration. A host that stops being usable
// for any reason (gone from discovery, blacklisted, leaving) loses its place: when it comes
// back it is new and goes to the end. A host whose slot count or address changes keeps its
// place.
//
// Blacklist: the n-th failure of a host starts a cooldown of CooldownMin·2^(n-1), capped at
// CooldownMax, so the first cooldown is exactly CooldownMin (10s, 20s, 40s … with the
// defaults). Horovod's code gives 2× to 3× min for the first (min·2^1 plus up to min of
// jitter) while its documentation says min; here code and documentation agree. Failures reported
// while the host is already cooling down are not counted again: the workers of one host often
// fail together, and one bad moment must not cost 2^slots. The failure count halves for every
// DecayAfter without a failure after the cooldown ended (time spent cooling down proves
// nothing: the host runs no work then), so a host that failed once long ago starts again at
// CooldownMin; Horovod's count never decays.
//
// After its cooldown a host comes back only if discovery lists it: if the latest discovery
// result lists it, it is usable again the moment the cooldown ends (NextEvent says when,
// Advance applies it); if not, it comes back with the first Update that lists it. The discovery watcher reports only
// changes, so "the latest result lists it" means discovery still lists it, and a host that
// stayed in the group all along (the local provider's slots) returns without a new Update.
// A blacklisted host that leaves discovery keeps its failure count and cooldown while it is
// gone, so it cannot escape them by vanishing for one poll; its record is dropped once its
// cooldown is over and its count has decayed to zero.
//
// Changes: Update, Blacklist, Advance, SetLeaving and ClearLeaving return whether the usable
// assignment (the ordered hosts with their addresses and slot counts; not zone, type or
// launch time) differs from the one last reported, by Usable or by one of these results. So
// no change goes unseen, a cooldown that ended between two calls included.
//
// Leaving: SetLeaving (an interruption notice, an admin removal) drops a host at once, and it
// stays out whatever discovery says, even if it disappears and comes back, until ClearLeaving.
// A host may be marked before discovery has ever listed it. The manager never drops a mark
// by itself (one small record per marked host): a driver that runs for months clears the
// marks of hosts it knows are gone for good.
//
// Quarantine: Quarantine (a flapping slot) keeps a host out in the same way, cooldown or not,
// until Release (an operator brings it back), which also forgets its failures.
package hosts

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/elasticd/elasticd/providers"
)

// Defaults and limits of Config.
const (
	DefaultCooldownMin = 10 * time.Second
	DefaultCooldownMax = 5 * time.Minute
	DefaultDecayAfter  = 10 * time.Minute
	MaxCooldown        = time.Hour
)

// Config is the blacklist policy. Zero fields take their defaults.
type Config struct {
	// CooldownMin and CooldownMax are --blacklist-cooldown-range: the first cooldown, and the
	// cap of its doubling. Defaults 10s, and 5m or CooldownMin if that is longer;
	// 0 < min <= max <= 1h.
	CooldownMin, CooldownMax time.Duration
	// DecayAfter: a host with no failure for this long after its cooldown ended has its
	// failure count halved, again for every further DecayAfter. Default 10m.
	DecayAfter time.Duration
}

func (c Config) withDefaults() Config {
	if c.CooldownMin == 0 {
		c.CooldownMin = DefaultCooldownMin
	}
	if c.CooldownMax == 0 {
		c.CooldownMax = max(DefaultCooldownMax, c.CooldownMin)
	}
	if c.DecayAfter == 0 {
		c.DecayAfter = DefaultDecayAfter
	}
	return c
}

// Validate reports the first invalid field, after defaults are applied to the zero ones.
func (c Config) Validate() error {
	switch {
	case c.CooldownMin < 0:
		return fmt.Errorf("blacklist cooldown minimum %v: must be positive (0 for the default %v)", c.CooldownMin, DefaultCooldownMin)
	case c.CooldownMax < 0:
		return fmt.Errorf("blacklist cooldown maximum %v: must be positive (0 for the default %v)", c.CooldownMax, DefaultCooldownMax)
	case c.DecayAfter < 0:
		return fmt.Errorf("blacklist decay interval %v: must be positive (0 for the default %v)", c.DecayAfter, DefaultDecayAfter)
	}
	d := c.withDefaults()
	switch {
	case d.CooldownMin > d.CooldownMax:
		return fmt.Errorf("blacklist cooldown range %v to %v: the minimum is above the maximum", d.CooldownMin, d.CooldownMax)
	case d.CooldownMax > MaxCooldown:
		return fmt.Errorf("blacklist cooldown maximum %v: must be at most %v", d.CooldownMax, MaxCooldown)
	}
	return nil
}

// cooldown is the cooldown of a host's n-th failure (n >= 1).
func (c Config) cooldown(n int) time.Duration {
	d := c.CooldownMin
	for i := 1; i < n && d < c.CooldownMax; i++ {
		d *= 2 // d < CooldownMax <= 1h before doubling: no overflow
	}
	return min(d, c.CooldownMax)
}

// BlacklistEntry is a host in cooldown.
type BlacklistEntry struct {
	ID       string
	Failures int       // after decay
	Until    time.Time // when the cooldown ends
}

// Manager tracks the hosts of one job. Make it with New.
type Manager struct {
	cfg     Config
	now     time.Time          // the latest time seen; an earlier time passed in counts as this
	records map[string]*record // hosts discovered, blacklisted or marked leaving
	order   []string           // the usable hosts at now, in assignment order
	// reported is the assignment the caller last saw (from Usable or a call's result).
	reported []slot
	next     time.Time // NextEvent's answer (or earlier), while nextOK
	nextOK   bool
	drop     map[string]bool // hosts SetLeaving took out, still in order and reported (compact)
	// synced: reported is the assignment of order as it is (report made it so, and nothing
	// changed order or the hosts since but a SetLeaving, which keeps both alike).
	synced bool
}

type record struct {
	host      providers.Host // as last discovered; only the ID if never discovered
	listed    bool           // in the latest discovery result
	leaving   bool
	held      bool // quarantined: out until Release, whatever discovery says
	failures  int
	decayFrom time.Time // the end of the last cooldown, moved on by DecayAfter at each halving
	until     time.Time // end of the cooldown; zero if never blacklisted
}

// slot is what the assignment depends on; a change in other fields is not a change of it.
type slot struct {
	id, addr string
	slots    int
}

// New returns a manager with no hosts. Zero fields of cfg take their defaults; New panics if
// cfg is invalid, so check user input with Validate first.
func New(cfg Config) *Manager {
	if err := cfg.Validate(); err != nil {
		panic("hosts.New: " + err.Error())
	}
	return &Manager{cfg: cfg.withDefaults(), records: make(map[string]*record), drop: map[string]bool{}}
}

// Update records a discovery result at now: the group is exactly discovered (hosts with an
// empty ID or no slots are ignored; a repeated ID counts once, its last entry winning). It
// returns true when the usable assignment (the ordered hosts with their addresses and slot
// counts) differs from the one last reported, by Usable or by the result of any call.
func (m *Manager) Update(now time.Time, discovered []providers.Host) bool {
	m.compact()
	now = m.advance(now)
	for _, r := range m.records {
		r.listed = false
	}
	for _, h := range discovered {
		if h.ID == "" || h.Slots < 1 {
			continue
		}
		r := m.record(h.ID)
		r.host, r.listed = h, true
	}
	m.reorder(now)
	m.forget(now)
	return m.report()
}

// Blacklist marks a host failed at now: its failure count (after decay) goes up by one and it
// cools down for min(CooldownMax, CooldownMin·2^(failures-1)). A host already cooling down is
// left as it is. A host unknown so far is recorded, so it starts cooling down if it appears.
// It returns true when the usable assignment differs from the one last reported.
func (m *Manager) Blacklist(now time.Time, hostID string) bool {
	m.compact()
	now = m.advance(now)
	r := m.record(hostID)
	if r.until.After(now) {
		return m.report()
	}
	r.failures++
	r.until = now.Add(m.cfg.cooldown(r.failures))
	r.decayFrom = r.until
	m.order = slices.DeleteFunc(m.order, func(id string) bool { return id == hostID })
	return m.report()
}

// Usable returns the hosts to run on at now, in assignment order, and makes that the
// assignment last reported.
func (m *Manager) Usable(now time.Time) []providers.Host {
	m.compact()
	m.advance(now)
	hosts := make([]providers.Host, len(m.order))
	for i, id := range m.order {
		hosts[i] = m.records[id].host
	}
	m.reported, m.synced = m.assignment(), true
	return hosts
}

// Current returns the IDs of the usable hosts as of the manager's latest time, in order,
// without moving its clock or counting as a report (unlike Usable).
func (m *Manager) Current() []string {
	m.compact()
	return slices.Clone(m.order)
}

// Advance moves the manager to now, so that hosts whose cooldown has ended rejoin the
// assignment, and returns true when the usable assignment differs from the one last reported.
// Call it when NextEvent's time comes: discovery sends nothing when a cooldown ends.
func (m *Manager) Advance(now time.Time) bool {
	m.compact()
	m.advance(now)
	m.forget(m.now)
	return m.report()
}

// NextEvent returns the earliest time at which Usable changes with no call in between (a
// listed host's cooldown ending), or the zero time if there is none. A cooldown that has
// ended but that no call has applied yet is still an event: its time, not after the caller's
// clock, says it is due, and stays so until a call at or after it (Advance, Update, Usable …)
// applies it. NextEvent only looks: it takes no time and does not move the manager's, so
// that asking, however late, never takes a host back in without its caller being told.
//
// The driver asks after every event it handles, thousands in a reset of a large job: the
// answer is kept until a call may have made an event sooner or moved the manager's time.
// SetLeaving and Quarantine only take hosts out, so the time kept may then be earlier than
// the next event, never later: a caller woken for nothing finds Advance says no change.
func (m *Manager) NextEvent() time.Time {
	if m.nextOK {
		return m.next
	}
	var next time.Time
	for _, r := range m.records {
		if r.listed && !r.leaving && !r.held && r.until.After(m.now) && (next.IsZero() || r.until.Before(next)) {
			next = r.until
		}
	}
	m.next, m.nextOK = next, true
	return next
}

// changed drops NextEvent's kept answer: every call that may change a record or the
// manager's time calls it.
func (m *Manager) changed() { m.nextOK = false }

// SetLeaving marks a host as leaving: it is dropped from the assignment at once and not
// re-added, whatever discovery says, until ClearLeaving. Like ClearLeaving it takes no time:
// it acts at the latest time the manager has seen. It returns true when the usable
// assignment differs from the one last reported.
//
// A notice marks every slot of its host at once: one call, and, when nothing else changed
// since the last report, no new assignment is built (a mass reclaim of a large job gives
// hundreds of notices within a second).
func (m *Manager) SetLeaving(hostIDs ...string) bool {
	if m.synced {
		// The reported assignment is the order's: the hosts leave both at the next call that
		// reads them (compact), so that a burst of notices costs one pass. The order holds
		// exactly the hosts usable at the manager's time.
		changed := false
		for _, id := range hostIDs {
			r := m.record(id)
			if m.usable(r, m.now) {
				m.drop[id], changed = true, true
			}
			r.leaving = true
		}
		return changed
	}
	m.compact()
	set := make(map[string]bool, len(hostIDs))
	for _, id := range hostIDs {
		m.record(id).leaving = true
		set[id] = true
	}
	m.order = slices.DeleteFunc(m.order, func(id string) bool { return set[id] })
	return m.report()
}

// compact applies the removals SetLeaving left for later to the order and the reported
// assignment; every other call begins with it.
func (m *Manager) compact() {
	if len(m.drop) == 0 {
		return
	}
	m.order = slices.DeleteFunc(m.order, func(id string) bool { return m.drop[id] })
	m.reported = slices.DeleteFunc(m.reported, func(s slot) bool { return m.drop[s.id] })
	clear(m.drop)
}

// ClearLeaving lifts SetLeaving. If the host is otherwise usable (listed, not cooling down)
// it is appended to the assignment at once. It returns true when the usable assignment
// differs from the one last reported.
func (m *Manager) ClearLeaving(hostID string) bool {
	m.compact()
	m.changed()
	if r, ok := m.records[hostID]; ok && r.leaving {
		r.leaving = false
		if m.usable(r, m.now) {
			m.order = append(m.order, hostID)
		}
		m.forget(m.now)
	}
	return m.report()
}

// Quarantine keeps a host (a flapping slot) out of the assignment, whatever discovery says and
// however its cooldown runs, until Release. It returns true when the usable assignment
// differs from the one last reported.
func (m *Manager) Quarantine(hostID string) bool {
	m.compact()
	m.record(hostID).held = true
	m.order = slices.DeleteFunc(m.order, func(id string) bool { return id == hostID })
	return m.report()
}

// Release lifts Quarantine (an operator brought the host back) and forgets its failures and
// cooldown: it is usable at once if discovery lists it. It reports whether the host was
// quarantined.
func (m *Manager) Release(hostID string) bool {
	m.compact()
	m.changed()
	r, ok := m.records[hostID]
	if !ok || !r.held {
		return false
	}
	r.held, r.failures, r.until = false, 0, time.Time{}
	if m.usable(r, m.now) && !slices.Contains(m.order, hostID) {
		m.order = append(m.order, hostID)
		m.synced = false
	}
	m.forget(m.now)
	return true
}

// Quarantined lists the quarantined hosts, sorted.
func (m *Manager) Quarantined() []string {
	var ids []string
	for id, r := range m.records {
		if r.held {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, compareIDs)
	return ids
}

// Blacklisted lists the hosts cooling down at now, by the end of their cooldown, then ID.
// Like NextEvent it only looks: a cooldown it finds over is applied by the next call that
// moves the manager's time. (A host's failures do not decay while it cools down, so the
// counts listed need no advance.)
func (m *Manager) Blacklisted(now time.Time) []BlacklistEntry {
	if now.Before(m.now) {
		now = m.now
	}
	var list []BlacklistEntry
	for id, r := range m.records {
		if r.until.After(now) {
			list = append(list, BlacklistEntry{ID: id, Failures: r.failures, Until: r.until})
		}
	}
	slices.SortFunc(list, func(a, b BlacklistEntry) int {
		return cmp.Or(a.Until.Compare(b.Until), compareIDs(a.ID, b.ID))
	})
	return list
}

// advance moves the manager's time to now (never back) and returns it. Hosts whose cooldown
// ended in between join the order in the order their cooldowns ended, as if the manager had
// watched the clock; failure counts decay.
func (m *Manager) advance(now time.Time) time.Time {
	m.changed()
	if now.Before(m.now) {
		now = m.now
	}
	var back []*record
	for _, r := range m.records {
		if r.until.After(m.now) && !r.until.After(now) && m.usable(r, now) {
			back = append(back, r)
		}
	}
	slices.SortFunc(back, func(a, b *record) int {
		return cmp.Or(a.until.Compare(b.until), launchOrder(a, b))
	})
	for _, r := range back {
		m.order = append(m.order, r.host.ID)
		m.synced = false
	}
	m.now = now
	if d := m.cfg.DecayAfter; d > 0 {
		for _, r := range m.records {
			if r.failures == 0 {
				continue
			}
			if k := now.Sub(r.decayFrom) / d; k >= 63 {
				r.failures = 0
			} else if k > 0 {
				r.failures >>= k
				r.decayFrom = r.decayFrom.Add(k * d)
			}
		}
	}
	return now
}

// reorder makes the order the usable hosts at now: survivors in their order, then the hosts
// that became usable, by launch time and ID.
func (m *Manager) reorder(now time.Time) {
	kept := slices.DeleteFunc(m.order, func(id string) bool {
		r, ok := m.records[id]
		return !ok || !m.usable(r, now)
	})
	in := make(map[string]bool, len(kept))
	for _, id := range kept {
		in[id] = true
	}
	var fresh []*record
	for id, r := range m.records {
		if !in[id] && m.usable(r, now) {
			fresh = append(fresh, r)
		}
	}
	slices.SortFunc(fresh, launchOrder)
	for _, r := range fresh {
		kept = append(kept, r.host.ID)
	}
	m.order = kept
}

func (m *Manager) usable(r *record, now time.Time) bool {
	return r.listed && !r.leaving && !r.held && !r.until.After(now)
}

// forget drops the records that no longer matter: not listed, not leaving, no cooldown
// running and no failures left to remember.
func (m *Manager) forget(now time.Time) {
	for id, r := range m.records {
		if !r.listed && !r.leaving && !r.held && r.failures == 0 && !r.until.After(now) {
			delete(m.records, id)
		}
	}
}

func (m *Manager) record(id string) *record {
	r, ok := m.records[id]
	if !ok {
		r = &record{host: providers.Host{ID: id}}
		m.records[id] = r
	}
	return r
}

func (m *Manager) assignment() []slot {
	a := make([]slot, len(m.order))
	for i, id := range m.order {
		h := m.records[id].host
		a[i] = slot{h.ID, h.Addr, h.Slots}
	}
	return a
}

// report makes the current assignment the one last reported and says whether it changed.
func (m *Manager) report() bool {
	a := m.assignment()
	changed := !slices.Equal(a, m.reported)
	m.reported, m.synced = a, true
	return changed
}

func launchOrder(a, b *record) int {
	return cmp.Or(a.host.Launched.Compare(b.host.Launched), compareIDs(a.host.ID, b.host.ID))
}

// compareIDs orders IDs with runs of digits compared by value ("local-2" < "local-10",
// "10.0.0.9" < "10.0.0.10"), the rest byte by byte; IDs equal that way ("a01", "a1") fall
// back to plain string order, so the order is total.
func compareIDs(a, b string) int {
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		if isDigit(a[i]) && isDigit(b[j]) {
			si, sj := i, j
			for i < len(a) && isDigit(a[i]) {
				i++
			}
			for j < len(b) && isDigit(b[j]) {
				j++
			}
			x, y := trimZeros(a[si:i]), trimZeros(b[sj:j])
			if c := cmp.Or(cmp.Compare(len(x), len(y)), cmp.Compare(x, y)); c != 0 {
				return c
			}
			continue
		}
		if c := cmp.Compare(a[i], b[j]); c != 0 {
			return c
		}
		i, j = i+1, j+1
	}
	return cmp.Or(cmp.Compare(len(a)-i, len(b)-j), cmp.Compare(a, b))
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func trimZeros(s string) string {
	for len(s) > 1 && s[0] == '0' {
		s = s[1:]
	}
	return s
}

// Restore brings back what another manager of the same job knew of failures (a driver
// restarted with --state-dir): each entry's failure count and cooldown, and the quarantined
// hosts. Cooldowns already over at now are ignored. Call it before the first Update.
func (m *Manager) Restore(now time.Time, blacklist []BlacklistEntry, quarantined []string) {
	m.compact()
	now = m.advance(now)
	m.synced = false
	for _, e := range blacklist {
		if e.ID == "" || !e.Until.After(now) {
			continue
		}
		r := m.record(e.ID)
		r.failures, r.until, r.decayFrom = max(e.Failures, 1), e.Until, e.Until
		m.order = slices.DeleteFunc(m.order, func(id string) bool { return id == e.ID })
	}
	for _, id := range quarantined {
		if id != "" {
			m.record(id).held = true
			m.order = slices.DeleteFunc(m.order, func(o string) bool { return o == id })
		}
	}
}
