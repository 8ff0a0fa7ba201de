// Package admin lets an operator add and remove hosts of a running job (`elasticd ctl`):
// an Overlay over the job's provider, and the signed HTTP API that drives it.
package admin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/elasticd/elasticd/providers"
)

// Refusals of Add and Remove, for errors.Is; the errors themselves say what to do.
var (
	ErrAlreadyPresent = errors.New("host already part of the job")
	ErrAlreadyStopped = errors.New("host already stopped")
	ErrUnknownHost    = errors.New("unknown host")
	ErrBelowMinNP     = errors.New("would go below --min-np")
	ErrBadHost        = errors.New("malformed host")
	// ErrNotDiscovered: the driver has just started and its provider has not answered yet, so
	// a host cannot be told apart from one it lists (ReasonNotDiscovered).
	ErrNotDiscovered = errors.New("hosts not discovered yet")
)

// ReasonNotDiscovered is the message of ErrNotDiscovered, which the handler answers with 503
// and the client tries again on.
const ReasonNotDiscovered = "the driver has not listed its hosts yet (it has just started): try again in a moment"

// refusal is an error with a message for people and a kind for programs.
type refusal struct {
	kind error
	msg  string
}

func (r *refusal) Error() string        { return r.msg }
func (r *refusal) Is(target error) bool { return target == r.kind }

func refuse(kind error, format string, args ...any) error {
	return &refusal{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// Overlay is a providers.Provider over the job's own: its hosts are inner's, less the hosts
// the operator removed, plus the hosts the operator added. A removed host is kept as
// *stopped*, with its ID and slot count, so that adding it back needs no discovery and its
// workers come back under the same IDs. Changes reach the job at the next discovery poll
// (--discovery-interval): a removed host's workers then leave at their next commit, without
// rollback, like any host that discovery drops; an added host is a newly discovered one.
// Its methods are safe for concurrent use.
type Overlay struct {
	inner providers.Provider
	minNP int
	now   func() time.Time

	changed chan struct{} // capacity 1: the operator changed the hosts

	mu        sync.Mutex
	polled    bool                      // inner has answered once (lastInner is its answer)
	lastInner []providers.Host          // inner's latest good answer
	added     map[string]providers.Host // by the operator, whether or not inner lists them
	stopped   map[string]providers.Host // removed by the operator
}

// NewOverlay wraps inner (nil: no hosts but the added ones). minNP is the job's --min-np:
// Remove refuses, unless forced, to leave fewer usable slots.
func NewOverlay(inner providers.Provider, minNP int) *Overlay {
	return &Overlay{inner: inner, minNP: minNP, now: time.Now, added: map[string]providers.Host{}, stopped: map[string]providers.Host{}, changed: make(chan struct{}, 1)}
}

// Inner is the provider the overlay was made on.
func (o *Overlay) Inner() providers.Provider { return o.inner }

// Changed receives after each successful Add or Remove, so that discovery can poll at once
// (discovery.Watcher.Poke) rather than at its next interval.
func (o *Overlay) Changed() <-chan struct{} { return o.changed }

func (o *Overlay) poke() {
	select {
	case o.changed <- struct{}{}:
	default:
	}
}

// Hosts polls inner once and applies the operator's changes.
func (o *Overlay) Hosts(ctx context.Context) ([]providers.Host, error) {
	var hs []providers.Host
	if o.inner != nil {
		var err error
		if hs, err = o.inner.Hosts(ctx); err != nil {
			return nil, err
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.polled = true
	o.lastInner = slices.Clone(hs)
	for _, h := range hs { // keep the stopped record of a host inner still lists up to date
		if _, ok := o.stopped[h.ID]; ok {
			o.stopped[h.ID] = h
		}
	}
	return o.currentLocked(), nil
}

// Current returns the hosts the next poll will offer if inner does not change: the latest
// poll of inner with the operator's changes, sorted by ID.
func (o *Overlay) Current() []providers.Host {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.currentLocked()
}

// Stopped returns the hosts the operator removed, sorted by ID.
func (o *Overlay) Stopped() []providers.Host {
	o.mu.Lock()
	defer o.mu.Unlock()
	return sortedHosts(o.stopped)
}

// Added returns the hosts the operator added that are not stopped, sorted by ID.
func (o *Overlay) Added() []providers.Host {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []providers.Host
	for _, h := range sortedHosts(o.added) {
		if _, ok := o.stopped[h.ID]; !ok {
			out = append(out, h)
		}
	}
	return out
}

// Snapshot returns what the operator changed: the hosts added and the hosts stopped, sorted
// by ID. The driver saves them with the job's state (--state-dir), for Restore.
func (o *Overlay) Snapshot() (added, stopped []providers.Host) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return sortedHosts(o.added), sortedHosts(o.stopped)
}

// Restore takes up the operator's changes a Snapshot saved, in a driver started again on
// the job's state: a host removed stays removed, a host added stays in the job.
func (o *Overlay) Restore(added, stopped []providers.Host) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, h := range added {
		o.added[h.ID] = h
	}
	for _, h := range stopped {
		o.stopped[h.ID] = h
	}
}

func (o *Overlay) currentLocked() []providers.Host {
	out := make([]providers.Host, 0, len(o.lastInner)+len(o.added))
	seen := map[string]bool{}
	for _, h := range o.lastInner {
		if _, ok := o.stopped[h.ID]; !ok && !seen[h.ID] {
			out = append(out, h)
			seen[h.ID] = true
		}
	}
	for _, h := range o.added {
		if _, ok := o.stopped[h.ID]; !ok && !seen[h.ID] {
			out = append(out, h)
			seen[h.ID] = true
		}
	}
	slices.SortFunc(out, func(a, b providers.Host) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Add puts a host into the job. A stopped host comes back as it was (same ID, so its
// workers keep their IDs; h.Slots, when not 0, changes the slot count of a host the operator
// had added). Any other host is new: ID and Addr are h.Addr when h.ID is empty, and h.Slots
// 0 means 1. A host already in the job, matched by ID or address, is refused
// (ErrAlreadyPresent).
func (o *Overlay) Add(h providers.Host) error {
	_, _, err := o.add(h)
	return err
}

// add is Add, also saying whether the host was a stopped one brought back.
func (o *Overlay) add(h providers.Host) (_ providers.Host, _ bool, err error) {
	defer func() {
		if err == nil {
			o.poke()
		}
	}()
	h.ID = cmp.Or(h.ID, h.Addr)
	h.Addr = cmp.Or(h.Addr, h.ID)
	if h.ID == "" {
		return h, false, refuse(ErrBadHost, "no host given: name it by address, e.g. 10.0.0.5")
	}
	if h.Slots < 0 || h.Slots > providers.MaxSlots {
		return h, false, refuse(ErrBadHost, "slots %d: must be between 1 and %d", h.Slots, providers.MaxSlots)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.polled && o.inner != nil {
		return h, false, refuse(ErrNotDiscovered, ReasonNotDiscovered)
	}
	if s, ok := findHost(sortedHosts(o.stopped), h.ID); ok {
		delete(o.stopped, s.ID)
		_, listed := findHost(o.lastInner, s.ID)
		if a, ok := o.added[s.ID]; ok || !listed {
			// The operator's own host, or one the provider no longer lists: the operator
			// vouches for it.
			if ok {
				s = a
			}
			if h.Slots > 0 {
				s.Slots = h.Slots
			}
			o.added[s.ID] = s
		}
		return s, true, nil
	}
	if c, ok := findHost(o.currentLocked(), h.ID); ok {
		return c, false, refuse(ErrAlreadyPresent, "host %s is already part of the job (%s)", h.ID, describe(c))
	}
	h.Slots = max(h.Slots, 1)
	if h.Launched.IsZero() {
		h.Launched = o.now() // new hosts are ordered by launch time, then ID
	}
	o.added[h.ID] = h
	return h, false, nil
}

// Remove takes a host out of the job (by ID, or by address when one host has it): its
// workers leave at their next commit and the host is kept as stopped until Add brings it
// back. Refused, unless force, when the usable slots left would be fewer than --min-np
// (ErrBelowMinNP); an unknown host is ErrUnknownHost, a stopped one ErrAlreadyStopped.
func (o *Overlay) Remove(id string, force bool) error {
	_, err := o.remove(id, force)
	return err
}

func (o *Overlay) remove(id string, force bool) (_ providers.Host, err error) {
	defer func() {
		if err == nil {
			o.poke()
		}
	}()
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.polled && o.inner != nil {
		return providers.Host{}, refuse(ErrNotDiscovered, ReasonNotDiscovered)
	}
	cur := o.currentLocked()
	h, ok := findHost(cur, id)
	if !ok {
		if s, ok := findHost(sortedHosts(o.stopped), id); ok {
			return s, refuse(ErrAlreadyStopped, "host %s is already stopped; add-host %s brings it back", s.ID, s.ID)
		}
		if ids := hostsByAddr(cur, id); len(ids) > 1 {
			return h, refuse(ErrUnknownHost, "address %s is shared by hosts %s: name one by its ID", id, strings.Join(ids, ", "))
		}
		msg := known(cur)
		if st := sortedHosts(o.stopped); len(st) > 0 {
			msg += "; stopped: " + strings.TrimPrefix(known(st), "the job's hosts are ")
		}
		return h, refuse(ErrUnknownHost, "unknown host %q: %s", id, msg)
	}
	usable := 0
	for _, c := range cur {
		if !c.Leaving {
			usable += c.Slots
		}
	}
	left := usable
	if !h.Leaving {
		left -= h.Slots
	}
	if left < o.minNP && left < usable && !force { // a host without usable slots may always go
		return h, refuse(ErrBelowMinNP, "would leave %d usable %s, fewer than --min-np %d: use --force", left, plural(left, "slot"), o.minNP)
	}
	o.stopped[h.ID] = h
	return h, nil
}

// findHost finds a host by ID, else by address when exactly one host has it.
func findHost(hs []providers.Host, id string) (providers.Host, bool) {
	for _, h := range hs {
		if h.ID == id {
			return h, true
		}
	}
	var match []providers.Host
	for _, h := range hs {
		if h.Addr == id {
			match = append(match, h)
		}
	}
	if len(match) == 1 {
		return match[0], true
	}
	return providers.Host{}, false
}

func hostsByAddr(hs []providers.Host, addr string) []string {
	var ids []string
	for _, h := range hs {
		if h.Addr == addr {
			ids = append(ids, h.ID)
		}
	}
	return ids
}

// known names the first few hosts of the job, for an unknown-host error.
func known(hs []providers.Host) string {
	if len(hs) == 0 {
		return "the job has no hosts"
	}
	const few = 5
	var names []string
	for i, h := range hs {
		if i == few {
			names = append(names, fmt.Sprintf("and %d more", len(hs)-few))
			break
		}
		names = append(names, h.ID)
	}
	return "the job's hosts are " + strings.Join(names, ", ")
}

func describe(h providers.Host) string {
	s := fmt.Sprintf("%d %s", h.Slots, plural(h.Slots, "slot"))
	if h.Addr != h.ID {
		s = "address " + h.Addr + ", " + s
	}
	return s
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

func sortedHosts(m map[string]providers.Host) []providers.Host {
	out := make([]providers.Host, 0, len(m))
	for _, h := range m {
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b providers.Host) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Notices passes inner's notices through.
func (o *Overlay) Notices(ctx context.Context) ([]providers.Notice, error) {
	if n, ok := o.inner.(providers.Noticer); ok {
		return n.Notices(ctx)
	}
	return nil, ctx.Err() // none, but an ended context is said, as every Noticer does
}

// CompleteNotice passes the completion of a notice through to inner.
func (o *Overlay) CompleteNotice(ctx context.Context, n providers.Notice) error {
	if c, ok := o.inner.(providers.NoticeCompleter); ok {
		return c.CompleteNotice(ctx, n)
	}
	return ctx.Err()
}
