// Long-polls held without a goroutine: an agent's commands poll and watch, when they come on
// its session stream. Over HTTP/2 each held poll is a goroutine (Registry.commands, .watch);
// a driver of 10,000 hosts holds 20,000 of them, and their stacks were a tenth of its memory.
// A held poll here is a record that a command, a new view, the poll's timer, the session's end
// or the agent calling it off answers. The answers are the same as over HTTP/2.

package agents

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/elasticd/elasticd/protocol"
)

type pollKind int

const (
	commandsPoll pollKind = iota
	watchPoll
)

// heldPoll is a commands poll or watch of a session stream, waiting for its answer.
type heldPoll struct {
	st      *stream
	id      uint64 // its request's ID on the stream
	nonce   string // its request's, which the answer's signature covers
	kind    pollKind
	s       *session
	after   uint64    // commands: the last command the agent has
	seen    [2]uint64 // watch: the generation and host-update version the agent has
	workers []protocol.WorkerID
	timer   *time.Timer
	done    bool // answered or called off (the registry's lock)
	waking  bool // a command woke it: its answer is on its way (the registry's lock)
}

// pollEnd is why a held poll ends.
type pollEnd int

const (
	endWoke      pollEnd = iota // a command was queued, or the view moved past what the agent has
	endTimedOut                 // its wait is over
	endLost                     // its session ended (or the driver is closing)
	endCalledOff                // the agent called it off, or its stream closed: no answer
)

// pollTarget tells the commands poll and the watch (GET, under AgentPathPrefix) apart from
// any other request of a stream, with the session they name.
func pollTarget(f protocol.Frame) (pollKind, string, bool) {
	if f.Head.Method != http.MethodGet {
		return 0, "", false
	}
	path, _, _ := strings.Cut(f.Head.Target, "?")
	rest, ok := strings.CutPrefix(path, protocol.AgentPathPrefix)
	if !ok {
		return 0, "", false
	}
	if session, ok := strings.CutSuffix(rest, "/commands"); ok && !strings.ContainsAny(session, "/%") {
		return commandsPoll, session, true
	}
	if session, ok := strings.CutSuffix(rest, "/watch"); ok && !strings.ContainsAny(session, "/%") {
		return watchPoll, session, true
	}
	return 0, "", false
}

// poll serves a commands poll or watch of stream st as ServeHTTP would, checks and answers
// alike, and holds it, without a goroutine, when it must wait.
func (r *Registry) poll(st *stream, f protocol.Frame, kind pollKind, sessionID string) {
	rec := protocol.NewRecorder()
	rec.Header().Set(protocol.HeaderAgentsProtocol, strconv.Itoa(protocol.AgentProtocolVersion))
	answer := func() {
		status, header, body := rec.Result()
		st.answer(f.ID, status, header, body)
		st.finish(f.ID)
	}
	u, err := url.ParseRequestURI(f.Head.Target)
	if err != nil {
		http.Error(rec, "malformed target: "+err.Error(), http.StatusBadRequest)
		answer()
		return
	}
	req := &http.Request{Method: f.Head.Method, URL: u, RequestURI: f.Head.Target, Header: http.Header{}, Host: st.host, RemoteAddr: st.remote}
	for k, vs := range f.Head.Header {
		req.Header[http.CanonicalHeaderKey(k)] = vs
	}
	a, ok := r.admit(rec, req, f.Body, time.Now())
	if !ok {
		answer()
		return
	}
	s := r.session(a, sessionID)
	if s == nil {
		answer()
		return
	}
	p := &heldPoll{st: st, id: f.ID, nonce: a.Nonce, kind: kind, s: s}
	var wait time.Duration
	switch kind {
	case commandsPoll:
		if p.after, wait, ok = r.commandsQuery(a, u.Query()); !ok {
			answer()
			return
		}
		r.mu.Lock()
		if cmds := s.pendingLocked(p.after); len(cmds) > 0 {
			r.mu.Unlock()
			a.JSON(protocol.AgentCommandsAnswer{Commands: cmds})
			answer()
			return
		}
		r.mu.Unlock()
	case watchPoll:
		if p.seen, wait, p.workers, ok = r.watchQuery(a, u.Query()); !ok {
			answer()
			return
		}
	}
	if !st.hold(f.ID, func() { r.endPoll(p, endCalledOff, nil) }) {
		return // the stream closed meanwhile
	}
	r.hold(p, wait)
}

// hold keeps p until it is answered: at once when it need not wait after all (a command
// queued, a view moved, the session lost meanwhile), else when one of those comes or its wait
// is over.
func (r *Registry) hold(p *heldPoll, wait time.Duration) {
	s := p.s
	for {
		var v protocol.AgentWatchAnswer
		var changed <-chan struct{}
		if p.kind == watchPoll {
			r.mu.Lock()
			viewer := r.viewer
			r.mu.Unlock()
			if viewer == nil {
				r.endPoll(p, endLost, nil) // answered 503 below: the rendezvous is not serving yet
				return
			}
			v, changed = viewer.View(p.workers)
			if v.Generation > p.seen[0] || v.HostsVersion > p.seen[1] {
				r.endPoll(p, endWoke, &v)
				return
			}
		}
		r.mu.Lock()
		switch {
		case p.done: // called off meanwhile
			r.mu.Unlock()
			return
		case r.sessions[s.id] != s:
			r.mu.Unlock()
			r.endPoll(p, endLost, nil)
			return
		case p.kind == commandsPoll && len(s.cmds) > 0 && s.cmds[len(s.cmds)-1].Seq > p.after:
			r.mu.Unlock()
			r.endPoll(p, endWoke, nil)
			return
		case p.kind == watchPoll && isClosed(changed): // it moved since: look again
			r.mu.Unlock()
			continue
		}
		s.held = append(s.held, p)
		if p.kind == commandsPoll {
			s.polling++
		} else {
			r.watches[p] = struct{}{}
			r.watching.Add(1)
			if !r.answering {
				r.answering = true
				go r.answerWatches()
			}
		}
		p.timer = time.AfterFunc(wait, func() { r.endPoll(p, endTimedOut, nil) })
		r.mu.Unlock()
		return
	}
}

// endPoll answers held poll p (unless the agent called it off), once: v, when given, is the
// view that woke a watch.
func (r *Registry) endPoll(p *heldPoll, why pollEnd, v *protocol.AgentWatchAnswer) {
	s := p.s
	now := time.Now()
	r.mu.Lock()
	if p.done {
		r.mu.Unlock()
		return
	}
	p.done = true
	held := slices.Contains(s.held, p)
	if held {
		p.timer.Stop()
		s.held = slices.DeleteFunc(s.held, func(q *heldPoll) bool { return q == p })
	}
	closing, viewer := r.isClosing(), r.viewer
	var cmds []protocol.AgentCommand
	switch p.kind {
	case commandsPoll:
		if held {
			s.polling--
		}
		s.lastSeen = now
		if why == endCalledOff {
			// As over HTTP/2: a commands poll cut under it is the agent's connection gone,
			// unless the agent asks again within DropGrace.
			s.dropped = now
		}
		if why == endWoke || why == endTimedOut {
			cmds = s.pendingLocked(p.after)
		}
	case watchPoll:
		if held {
			delete(r.watches, p)
			r.watching.Add(-1)
		}
		if why != endCalledOff && why != endLost { // a cut watch says nothing of the agent
			s.lastSeen = now
		}
	}
	r.mu.Unlock()
	if why == endCalledOff {
		p.st.finish(p.id)
		return
	}
	rec := protocol.NewRecorder()
	rec.Header().Set(protocol.HeaderAgentsProtocol, strconv.Itoa(protocol.AgentProtocolVersion))
	a := protocol.Answer{W: rec, Auth: r.auth, Nonce: p.nonce}
	switch {
	case why == endLost && closing:
		a.Error(http.StatusServiceUnavailable, "driver shutting down")
	case why == endLost && p.kind == watchPoll && viewer == nil:
		a.Error(http.StatusServiceUnavailable, "the driver's rendezvous is not serving yet; retry")
	case why == endLost:
		a.Error(http.StatusNotFound, "agent session ended: register again")
	case p.kind == commandsPoll:
		if cmds == nil {
			cmds = []protocol.AgentCommand{}
		}
		a.JSON(protocol.AgentCommandsAnswer{Commands: cmds})
	default:
		if v == nil {
			view, _ := viewer.View(p.workers)
			v = &view
		}
		a.JSON(*v)
	}
	status, header, body := rec.Result()
	p.st.answer(p.id, status, header, body)
	p.st.finish(p.id)
}

// answerWatches answers the held watches whose view moved, each time the view changes, until
// the registry closes.
func (r *Registry) answerWatches() {
	for {
		r.mu.Lock()
		viewer := r.viewer
		r.mu.Unlock()
		_, changed := viewer.View(nil)
		select {
		case <-changed:
		case <-r.closing:
			return
		}
		r.mu.Lock()
		ps := make([]*heldPoll, 0, len(r.watches))
		for p := range r.watches {
			ps = append(ps, p)
		}
		r.mu.Unlock()
		for _, p := range ps {
			go func() {
				if v, _ := viewer.View(p.workers); v.Generation > p.seen[0] || v.HostsVersion > p.seen[1] {
					r.endPoll(p, endWoke, &v)
				}
			}()
		}
	}
}

// endHeldLocked ends the held polls of session s, which is lost: each is answered (404, or
// 503 when the driver is closing) by a goroutine of its own, the registry's lock being held.
func (s *session) endHeldLocked() {
	for _, p := range s.held {
		go p.st.r.endPoll(p, endLost, nil)
	}
}

// wakeCommandsLocked has s's held commands polls answered, a command having been queued, the
// registry's lock held: once each, however many commands come before the answer goes.
func (s *session) wakeCommandsLocked() {
	for _, p := range s.held {
		if p.kind == commandsPoll && !p.waking {
			p.waking = true
			go p.st.r.endPoll(p, endWoke, nil)
		}
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
