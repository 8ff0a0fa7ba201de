// The watch: one long-poll per host through which an agent's relay answers its workers'
// assignment and host-update long-polls (docs/protocol.md §4.5).

package agents

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/elasticd/elasticd/protocol"
)

// Viewer is what a watch reads: the rendezvous server's generation, host-update version and
// assignments (rendezvous.Server.View), and a channel closed when they may have changed.
type Viewer interface {
	View(workers []protocol.WorkerID) (protocol.AgentWatchAnswer, <-chan struct{})
}

// SetViewer gives the registry the rendezvous server its watches read. Until it is set a
// watch gets 503, which the agent retries.
func (r *Registry) SetViewer(v Viewer) {
	r.mu.Lock()
	r.viewer = v
	r.mu.Unlock()
}

// Watches is how many watches are held now.
func (r *Registry) Watches() int { return int(r.watching.Load()) }

// watch answers GET /v1/agents/{session}/watch?generation=G&hosts_version=V&worker=ID...
// as soon as the generation is past G or the host-update version past V, else with the
// current view after the poll wait.
func (r *Registry) watch(a protocol.Answer, req *http.Request, id string) {
	s := r.session(a, id)
	if s == nil {
		return
	}
	after, wait, workers, ok := r.watchQuery(a, req.URL.Query())
	if !ok {
		return
	}
	r.mu.Lock()
	viewer := r.viewer
	r.mu.Unlock()
	if viewer == nil {
		a.Error(http.StatusServiceUnavailable, "the driver's rendezvous is not serving yet; retry")
		return
	}
	r.watching.Add(1)
	defer r.watching.Add(-1)
	defer func() {
		// A watch cut under it says nothing of the agent: the agent cancels its watch
		// whenever its workers change (the connection stays), and a connection that closed
		// is the commands poll's to see. Counted as seen, a cut would hide the commands
		// poll's drop (the agent gone); counted as a drop, it would lose an agent that only
		// asked again while the driver was slow to answer.
		if req.Context().Err() == nil {
			r.mu.Lock()
			s.lastSeen = time.Now()
			r.mu.Unlock()
		}
	}()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		v, changed := viewer.View(workers)
		if v.Generation > after[0] || v.HostsVersion > after[1] {
			a.JSON(v)
			return
		}
		switch r.await(a, req, s, changed, timer) {
		case pollTimedOut:
			a.JSON(v)
			return
		case pollEnded:
			return
		}
	}
}

// watchQuery reads a watch's query: the generation and host-update version it has seen, its
// wait, and its workers; ok is false when it answered a 400.
func (r *Registry) watchQuery(a protocol.Answer, q url.Values) (after [2]uint64, wait time.Duration, workers []protocol.WorkerID, ok bool) {
	for i, name := range []string{"generation", "hosts_version"} {
		if v := q.Get(name); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				a.Error(http.StatusBadRequest, fmt.Sprintf("%s=%q: want a non-negative decimal", name, v))
				return after, 0, nil, false
			}
			after[i] = n
		}
	}
	if wait, ok = r.pollWait(a, q.Get("wait_ms")); !ok {
		return after, 0, nil, false
	}
	names := q["worker"]
	if len(names) > protocol.MaxWatchedWorkers {
		a.Error(http.StatusBadRequest, fmt.Sprintf("%d workers: a watch asks about at most %d", len(names), protocol.MaxWatchedWorkers))
		return after, 0, nil, false
	}
	workers = make([]protocol.WorkerID, 0, len(names))
	for _, n := range names {
		w, err := protocol.ParseWorkerID(n)
		if err != nil {
			a.Error(http.StatusBadRequest, "worker="+strconv.Quote(n)+": "+err.Error())
			return after, 0, nil, false
		}
		workers = append(workers, w)
	}
	return after, wait, workers, true
}

// pollWait is the wait of a long-poll that asked for wait_ms=v: PollWait, or less.
func (r *Registry) pollWait(a protocol.Answer, v string) (time.Duration, bool) {
	wait := r.cfg.PollWait
	if v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 {
			a.Error(http.StatusBadRequest, fmt.Sprintf("wait_ms=%q: want milliseconds", v))
			return 0, false
		}
		wait = min(wait, time.Duration(ms)*time.Millisecond)
	}
	return wait, true
}
