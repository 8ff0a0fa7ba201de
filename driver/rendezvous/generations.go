// Generations: what the driver publishes (plans, host-set updates) and how workers learn it.

package rendezvous

import (
	"net/http"

	"github.com/elasticd/elasticd/protocol"
)

// Publish makes generation gen current: workers in plan get their Assignment (the server sets
// its Generation to gen and its HostsVersion to the current host-update version); any other
// worker that asks for an assignment after an older generation gets
// Assignment{Generation: gen, Removed: true, HostsVersion: …}. Key-value data of generations older than gen is
// dropped (a later request for such a key answers 410 Gone). Generations start at 1 and must
// increase: a gen not above the current one is ignored (and logged as an error).
func (s *Server) Publish(gen uint64, plan map[protocol.WorkerID]protocol.Assignment) {
	p := make(map[protocol.WorkerID]protocol.Assignment, len(plan))
	for id, a := range plan {
		a.Generation = gen
		p[id] = a
	}
	s.mu.Lock()
	cur := s.gen
	if gen <= cur {
		s.mu.Unlock()
		s.log.Error("publish ignored: generation is not newer than the current one", "generation", gen, "current", cur)
		return
	}
	for id, a := range p {
		a.HostsVersion = s.hostsVer
		p[id] = a
	}
	s.gen, s.plan, s.planHosts = gen, p, s.hostsVer
	close(s.genCh)
	s.genCh = make(chan struct{})
	s.viewChangedLocked()
	for g, kv := range s.kv {
		if g < gen {
			for _, ch := range kv.waiting {
				close(ch)
			}
			delete(s.kv, g)
		}
	}
	s.kvFloor = gen
	s.mu.Unlock()
	s.log.Info("generation published", "generation", gen, "workers", len(p))
}

// Restore makes the server take up a job where an earlier driver's server left it (a driver
// restarted with --state-dir, whose workers kept running): gen is current with plan (each
// Assignment as the workers got it), the host-update version is hostsVersion and progress
// the last saved. Call it once, before serving and before any Publish.
func (s *Server) Restore(gen uint64, plan map[protocol.WorkerID]protocol.Assignment, planHosts, hostsVersion uint64, progress Progress) {
	p := make(map[protocol.WorkerID]protocol.Assignment, len(plan))
	for id, a := range plan {
		a.Generation, a.HostsVersion = gen, planHosts
		p[id] = a
	}
	s.mu.Lock()
	s.gen, s.plan, s.planHosts, s.kvFloor = gen, p, planHosts, gen
	s.hostsVer = max(hostsVersion, planHosts)
	s.progress = progress
	s.mu.Unlock()
	s.log.Info("generation restored", "generation", gen, "workers", len(plan), "hosts_version", s.hostsVer)
}

// PlanHostsVersion returns the host-update version the current generation's assignments
// carry.
func (s *Server) PlanHostsVersion() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.planHosts
}

// HostsVersion returns the current host-update version.
func (s *Server) HostsVersion() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hostsVer
}

// NotifyHostsUpdated bumps the host-update version that workers long-poll; returns the new
// version.
func (s *Server) NotifyHostsUpdated() uint64 {
	s.mu.Lock()
	s.hostsVer++
	v := s.hostsVer
	close(s.hostsCh)
	s.hostsCh = make(chan struct{})
	s.viewChangedLocked()
	s.mu.Unlock()
	s.log.Info("hosts updated", "version", v)
	return v
}

func (s *Server) viewChangedLocked() {
	close(s.viewCh)
	s.viewCh = make(chan struct{})
}

// View is what an agent's relay needs to answer its workers' assignment and host-update
// long-polls itself (docs/protocol.md §4.5): the current generation and host-update version,
// and each worker's assignment in that generation, as GET /v1/workers/{id}/assignment would
// answer it once the generation is past the worker's. changed is closed when the generation
// or the host-update version may have moved on. The driver thus holds one watch per host,
// not a long-poll per worker.
func (s *Server) View(workers []protocol.WorkerID) (v protocol.AgentWatchAnswer, changed <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v = protocol.AgentWatchAnswer{Generation: s.gen, HostsVersion: s.hostsVer, Assignments: make([]protocol.WorkerPlacement, 0, len(workers))}
	for _, id := range workers {
		a, inPlan := s.plan[id]
		if !inPlan {
			a = protocol.Assignment{Generation: s.gen, Removed: true, HostsVersion: s.planHosts}
		}
		v.Assignments = append(v.Assignments, protocol.WorkerPlacement{Worker: id.String(), Assignment: a})
	}
	return v, s.viewCh
}

func (s *Server) handleAssignment(w http.ResponseWriter, r *http.Request) {
	id, ok := workerParam(w, r)
	if !ok {
		return
	}
	after, ok := uintParam(w, r, "after", true)
	if !ok {
		return
	}
	s.longPoll(w, r, &s.assignPolls, func() (func(), <-chan struct{}) {
		gen := s.gen
		if gen <= after {
			return nil, s.genCh
		}
		a, inPlan := s.plan[id]
		if !inPlan {
			a = protocol.Assignment{Generation: gen, Removed: true, HostsVersion: s.planHosts}
		}
		return func() {
			s.log.Debug("assignment", "worker", id, "generation", gen, "rank", a.Rank, "removed", a.Removed)
			writeJSON(w, a)
		}, nil
	})
}

func (s *Server) handleHosts(w http.ResponseWriter, r *http.Request) {
	after, ok := uintParam(w, r, "after", true)
	if !ok {
		return
	}
	s.longPoll(w, r, &s.hostPolls, func() (func(), <-chan struct{}) {
		v := s.hostsVer
		if v <= after {
			return nil, s.hostsCh
		}
		return func() { writeJSON(w, protocol.HostsVersion{Version: v}) }, nil
	})
}
