// Reports: what workers tell the driver (state, progress, load), queued for Server.Events.

package rendezvous

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/elasticd/elasticd/protocol"
)

// Events delivers worker reports in arrival order. It never drops one and never blocks a
// request on a slow reader: reports queue inside the server (up to MaxQueuedEvents) and one
// goroutine feeds the channel. The channel is closed when Close returns; reports still queued
// then are discarded.
func (s *Server) Events() <-chan Event { return s.events }

// feed hands queued reports to the Events channel, one at a time, until Close.
func (s *Server) feed() {
	defer close(s.fed)
	defer close(s.events)
	for {
		s.qmu.Lock()
		if len(s.queue) == 0 {
			s.qmu.Unlock()
			select {
			case <-s.qwake:
				continue
			case <-s.closing:
				return
			}
		}
		ev := s.queue[0]
		s.queue[0] = Event{}
		s.queue = s.queue[1:]
		if len(s.queue) == 0 {
			s.queue = nil // give the backing array back
		}
		s.qmu.Unlock()
		select {
		case s.events <- ev:
		case <-s.closing:
			return
		}
	}
}

var (
	errShuttingDown = errors.New("rendezvous shutting down")
	errQueueFull    = errors.New("driver is behind on reports; retry")
)

// enqueueLocked queues ev, s.qmu held; the caller wakes the feeder.
func (s *Server) enqueueLocked(ev Event) error {
	if s.isClosing() {
		return errShuttingDown
	}
	if len(s.queue) >= s.cfg.MaxQueuedEvents {
		return errQueueFull
	}
	s.queue = append(s.queue, ev)
	return nil
}

// wakeFeeder tells feed that the queue has grown.
func (s *Server) wakeFeeder() {
	select {
	case s.qwake <- struct{}{}:
	default:
	}
}

func (s *Server) handleState(w http.ResponseWriter, r *http.Request) {
	id, ok := workerParam(w, r)
	if !ok {
		return
	}
	body, _ := io.ReadAll(r.Body) // already in memory, and bounded
	rep, err := parseState(id, body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := s.queueReports([]stateReport{rep})[0]; err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// stateReport is a worker's state report, checked and ready to queue.
type stateReport struct {
	ev Event
	id string // its report ID, for de-duplication; "" for none
}

// parseState decodes and checks worker id's state report; the error is a 400's text.
func parseState(id protocol.WorkerID, body []byte) (stateReport, error) {
	var req protocol.StateReport
	if err := decodeBody(body, &req); err != nil {
		return stateReport{}, err
	}
	switch {
	case req.Protocol != 0 && req.Protocol != protocol.ProtocolVersion:
		return stateReport{}, fmt.Errorf("rendezvous protocol version %d is not spoken by this driver, which speaks version %d: run workers and driver from the same elasticd release", req.Protocol, protocol.ProtocolVersion)
	case req.Generation == nil:
		return stateReport{}, errors.New(`missing "generation"`)
	case !req.State.Valid():
		return stateReport{}, fmt.Errorf("unknown state %q: want READY, SUCCESS or FAILURE", req.State)
	case len(req.Message) > protocol.MaxMessage:
		return stateReport{}, fmt.Errorf("message of %d bytes is longer than %d", len(req.Message), protocol.MaxMessage)
	case len(req.ReportID) > maxReportIDLen:
		return stateReport{}, fmt.Errorf("report_id longer than %d bytes", maxReportIDLen)
	case !(req.Seconds >= 0 && req.Seconds < maxRollbackSeconds):
		return stateReport{}, fmt.Errorf(`"rolled_back_seconds" %v: want seconds, at least 0 and below a year`, req.Seconds)
	case len(req.Unreachable) > protocol.MaxUnreachable || len(req.Reached) > protocol.MaxUnreachable:
		return stateReport{}, fmt.Errorf(`"unreachable_ranks" and "reached_ranks" name at most %d ranks each`, protocol.MaxUnreachable)
	case slices.ContainsFunc(req.Unreachable, func(r int) bool { return r < 0 }) || slices.ContainsFunc(req.Reached, func(r int) bool { return r < 0 }):
		return stateReport{}, errors.New(`"unreachable_ranks", "reached_ranks": a rank is at least 0`)
	}
	ev := Event{Worker: id, Generation: *req.Generation, State: req.State, Message: req.Message, At: time.Now(), Rollback: req.Rollback, SilentPeer: req.SilentPeer && req.State == protocol.Ready}
	if req.State == protocol.Ready {
		ev.Unreachable, ev.Reached = req.Unreachable, req.Reached
	}
	return stateReport{ev: ev, id: req.ReportID}, nil
}

// queueReports queues reports in their order, each once: a report whose ID is its worker's
// last queued one is a retry, answered as delivered and not queued again. It returns each
// report's error (a full queue, a server closing), nil when it was queued or a retry.
//
// De-duplication and queueing are under one lock: a retry racing its original cannot slip in
// between, and a report refused by a full queue is not remembered as delivered. A batch's
// reports (an agent's relay sends its workers' together) are queued under one lock, with one
// wake of the feeder.
func (s *Server) queueReports(reps []stateReport) []error {
	if len(reps) == 0 {
		return nil
	}
	errs := make([]error, len(reps))
	s.mu.Lock()
	s.qmu.Lock()
	queued := false
	for i, rep := range reps {
		id := rep.ev.Worker
		if rep.id != "" && s.lastReport[id] == rep.id {
			s.log.Debug("worker report", "worker", id, "generation", rep.ev.Generation, "state", string(rep.ev.State), "duplicate", true)
			continue
		}
		if errs[i] = s.enqueueLocked(rep.ev); errs[i] != nil {
			continue
		}
		queued = true
		if rep.id != "" {
			s.lastReport[id] = rep.id
		}
		s.log.Debug("worker report", "worker", id, "generation", rep.ev.Generation, "state", string(rep.ev.State), "duplicate", false)
	}
	if queued {
		s.wakeFeeder()
	}
	s.qmu.Unlock()
	s.mu.Unlock()
	return errs
}

// handleLoad records a worker's recent mean step time (for --slot-policy loadaware).
func (s *Server) handleLoad(w http.ResponseWriter, r *http.Request) {
	id, ok := workerParam(w, r)
	if !ok {
		return
	}
	var req protocol.LoadReport
	if !decodeJSON(w, r, &req) {
		return
	}
	if !(req.StepSeconds > 0 && req.StepSeconds < 86400) {
		http.Error(w, fmt.Sprintf(`"step_seconds" %v: want a step time in seconds, above 0 and below a day`, req.StepSeconds), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.stepTimes[id] = time.Duration(req.StepSeconds * float64(time.Second))
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// maxRollbackSeconds bounds a reported rollback: a year of work since a commit is a bug.
const maxRollbackSeconds = 365 * 24 * 3600

// handleProgress records how far training has got. Reports of an older generation than the
// newest one heard, or behind it in the same generation (a delayed request), are ignored:
// after a rollback the step goes back only with a new generation.
func (s *Server) handleProgress(w http.ResponseWriter, r *http.Request) {
	if _, ok := workerParam(w, r); !ok {
		return
	}
	var req protocol.ProgressReport
	if !decodeJSON(w, r, &req) {
		return
	}
	if req.Committed > req.Step {
		http.Error(w, fmt.Sprintf(`"committed_step" %d is past "step" %d`, req.Committed, req.Step), http.StatusBadRequest)
		return
	}
	now := time.Now()
	s.mu.Lock()
	p := &s.progress
	if req.Generation > p.Generation || req.Generation == p.Generation && req.Step >= p.Step {
		if req.Step < p.Step { // rolled back: the rate starts over
			s.progressSamples = s.progressSamples[:0]
		}
		p.Generation, p.Step, p.Committed, p.At = req.Generation, req.Step, req.Committed, now
		// The loss and the total are kept from the report that last had them: an old client,
		// or a report sent before the program's first loss, says nothing new, not "unknown".
		if req.Loss != nil {
			l := *req.Loss // a fresh variable: Progress values handed out share the pointer
			p.Loss = &l
		}
		if req.TotalSteps > 0 {
			p.TotalSteps = req.TotalSteps
		}
		s.progressSamples = append(s.progressSamples, progressSample{at: now, step: req.Step})
		// Keep the samples of the window, and the one just before it as its start.
		i := 0
		for i+1 < len(s.progressSamples) && now.Sub(s.progressSamples[i+1].at) >= ProgressWindow {
			i++
		}
		s.progressSamples = append(s.progressSamples[:0], s.progressSamples[i:]...)
		p.StepsPerSecond = 0
		if first := s.progressSamples[0]; len(s.progressSamples) > 1 && now.After(first.at) {
			p.StepsPerSecond = float64(req.Step-first.step) / now.Sub(first.at).Seconds()
		}
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

type progressSample struct {
	at   time.Time
	step uint64
}

// Progress returns how far training has got, as last reported.
func (s *Server) Progress() Progress {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.progress
}

// StepTimes returns each worker's latest reported mean step time.
func (s *Server) StepTimes() map[protocol.WorkerID]time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.stepTimes)
}
