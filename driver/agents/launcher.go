package agents

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticd/elasticd/proc"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

// Launcher starts workers through the agents: --launcher agent.
func (r *Registry) Launcher() proc.Launcher { return launcher{r} }

type launcher struct{ r *Registry }

// Start asks the agent of s.Host to start the worker. It does not wait for the agent: a
// process the agent cannot start exits with code 127 and the agent's reason on its stderr.
func (l launcher) Start(ctx context.Context, s proc.Spec) (proc.Process, error) {
	r := l.r
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	if len(s.Command) == 0 {
		return nil, fmt.Errorf("start %s: empty command", s.Name)
	}
	env := make([]string, 0, len(s.Env))
	for _, kv := range s.Env {
		// The agent derives the job secret itself; it never crosses the network.
		if !strings.HasPrefix(kv, protocol.EnvSecret+"=") {
			env = append(env, kv)
		}
	}
	r.mu.Lock()
	sess := r.agentForLocked(s.Host)
	if sess == nil {
		r.mu.Unlock()
		return nil, fmt.Errorf("start %s: no agent is connected for host %s (is `elasticd agent --driver URL` running there, with this driver's --agent-secret-file?)", s.Name, s.Host)
	}
	r.nextProc++
	// The process keeps what it needs of the spec: its name, host and output, not the
	// command and environment, which the start command carries (kilobytes per worker, tens
	// of thousands of workers).
	kept := proc.Spec{Name: s.Name, Host: s.Host, Slot: s.Slot, Stdout: s.Stdout, Stderr: s.Stderr}
	p := &process{r: r, s: sess, id: r.nextProc, spec: kept, done: make(chan struct{})}
	sess.procs[p.id] = p
	sess.queueLocked(protocol.AgentCommand{Op: protocol.OpStart, Proc: p.id, Worker: workerOf(s), Slot: s.Slot, Argv: s.Command, Env: env, Dir: s.Dir})
	r.mu.Unlock()
	// Cancelling ctx stops the worker. A callback, not a goroutine per worker: a driver holds
	// tens of thousands of these.
	context.AfterFunc(ctx, func() {
		select {
		case <-p.done:
		default:
			p.Stop(proc.DefaultGrace)
		}
	})
	return p, nil
}

// findPortTimeout bounds FreePort's wait for the agent's answer: an agent older than the
// driver ignores the command, and the driver then picks a port itself.
const findPortTimeout = 5 * time.Second

// FreePort asks the agent of host for a TCP port free there (launch.PortFinder).
func (l launcher) FreePort(ctx context.Context, host string) (int, error) {
	r := l.r
	r.mu.Lock()
	sess := r.agentForLocked(host)
	if sess == nil {
		r.mu.Unlock()
		return 0, fmt.Errorf("find a free port on %s: no agent is connected for it", host)
	}
	r.nextProc++
	id := r.nextProc
	ch := make(chan protocol.AgentEvent, 1)
	if r.ports == nil {
		r.ports = map[uint64]chan protocol.AgentEvent{}
	}
	r.ports[id] = ch
	sess.queueLocked(protocol.AgentCommand{Op: protocol.OpFindPort, Proc: id})
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.ports, id)
		r.mu.Unlock()
	}()
	timer := time.NewTimer(findPortTimeout)
	defer timer.Stop()
	select {
	case ev := <-ch:
		if ev.Error != "" || ev.Port <= 0 || ev.Port > 65535 {
			return 0, fmt.Errorf("find a free port on %s: the agent answered port %d: %s", host, ev.Port, ev.Error)
		}
		return ev.Port, nil
	case <-ctx.Done():
		return 0, fmt.Errorf("find a free port on %s: %w", host, ctx.Err())
	case <-timer.C:
		return 0, fmt.Errorf("find a free port on %s: no answer from its agent within %v (an agent older than this driver?)", host, findPortTimeout)
	}
}

// workerOf is the worker ID in a spec's environment, for the agent's log.
func workerOf(s proc.Spec) string {
	if v, ok := protocol.EnvValue(s.Env, protocol.EnvWorkerID); ok {
		return v
	}
	return s.Name
}

// agentForLocked is the live session serving host (a provider address or ID), preferring the
// one a discovery matched.
func (r *Registry) agentForLocked(host string) *session {
	var best *session
	for _, s := range r.byName[host] {
		switch {
		case s.hostAddr == host || s.hostID == host:
			if best == nil || best.hostAddr != host || s.registered.After(best.registered) {
				best = s
			}
		case best == nil && (s.info.Addr == host || s.info.HostID == host):
			best = s
		}
	}
	return best
}

// process is a worker started through an agent.
type process struct {
	r    *Registry
	s    *session
	id   uint64
	spec proc.Spec
	pid  atomic.Int64

	done       chan struct{}
	finishOnce sync.Once
	status     proc.ExitStatus
	err        error
	exitMu     sync.Mutex
	onExit     []func() // OnExit's, run once done is closed
	stopOnce   sync.Once
	outMu      sync.Mutex

	// Adopt's: closed when an agent took the worker back; until then s is nil, and the
	// worker fails at deadline (wait after the driver's start).
	adopted  chan struct{}
	deadline time.Time
	wait     time.Duration
}

// PID is the worker's process ID on its host, 0 until the agent has started it.
func (p *process) PID() int { return int(p.pid.Load()) }

func (p *process) Wait() (proc.ExitStatus, error) {
	<-p.done
	return p.status, p.err
}

// OnExit runs f in a goroutine of its own once the worker has exited (proc.ExitNotifier).
func (p *process) OnExit(f func()) {
	p.exitMu.Lock()
	defer p.exitMu.Unlock()
	select {
	case <-p.done:
		go f()
	default:
		p.onExit = append(p.onExit, f)
	}
}

// Stop asks the agent to stop the worker and waits until it has exited, or until the agent
// is lost; when the agent cannot be reached, it gives up after the grace period plus a lease
// (the agent stops its workers itself once the driver is gone).
func (p *process) Stop(grace time.Duration) {
	p.stopOnce.Do(func() {
		p.r.mu.Lock()
		switch {
		case p.s == nil: // an Adopt's worker no agent has listed yet: give it up
			for id, e := range p.r.expected {
				if e == p {
					delete(p.r.expected, id)
				}
			}
			p.finish(proc.ExitStatus{Code: -1}, errors.New("stopped before its agent listed it"))
		case p.r.sessions[p.s.id] != nil:
			p.s.queueLocked(protocol.AgentCommand{Op: protocol.OpStop, Proc: p.id, GraceMS: grace.Milliseconds()})
		}
		p.r.mu.Unlock()
	})
	t := time.NewTimer(grace + p.r.cfg.Lease)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		p.r.log.Warn("worker did not stop in time; giving up on it", "worker", p.spec.Name, "host", p.spec.Host) // p.s.hostAddr is discovery's, under r.mu
	}
}

func (p *process) output(stream string, data []byte) {
	w := p.spec.Stdout
	if stream == "stderr" {
		w = p.spec.Stderr
	}
	if w == nil {
		return
	}
	p.outMu.Lock()
	w.Write(data)
	p.outMu.Unlock()
}

// finish records how the process ended, flushes its output and wakes Wait.
func (p *process) finish(st proc.ExitStatus, err error) {
	p.finishOnce.Do(func() {
		p.outMu.Lock()
		for _, w := range []io.Writer{p.spec.Stdout, p.spec.Stderr} {
			if f, ok := w.(interface{ Flush() error }); ok {
				f.Flush()
			}
		}
		p.outMu.Unlock()
		p.status, p.err = st, err
		p.exitMu.Lock()
		close(p.done)
		fs := p.onExit
		p.onExit = nil
		p.exitMu.Unlock()
		for _, f := range fs {
			go f()
		}
	})
}

// --- discovery ---

// Wrap makes a provider whose hosts are inner's hosts that have a connected agent (matched by
// host ID or address), with the agent's slot count (one per GPU, or its --slots) when it has
// one. A nil inner offers every connected agent's host. Notices of inner pass through, and the
// wrapper completes notices that came from agents by asking the agent (Azure: StartRequests).
func (r *Registry) Wrap(inner providers.Provider) providers.Provider {
	return &wrapped{r: r, inner: inner, waiting: map[string]bool{}}
}

// Wraps reports whether p is this registry's Wrap of a provider.
func (r *Registry) Wraps(p providers.Provider) bool {
	w, ok := p.(*wrapped)
	return ok && w.r == r
}

type wrapped struct {
	r       *Registry
	inner   providers.Provider
	mu      sync.Mutex
	waiting map[string]bool // hosts already logged as having no agent
}

func (w *wrapped) Hosts(ctx context.Context) ([]providers.Host, error) {
	r := w.r
	if w.inner == nil {
		r.mu.Lock()
		defer r.mu.Unlock()
		var out []providers.Host
		for _, s := range r.sessions {
			r.setHostLocked(s, s.info.HostID, s.info.Addr)
			out = append(out, providers.Host{ID: s.hostID, Addr: s.hostAddr, Slots: s.slots(1), Launched: s.registered})
		}
		return out, nil
	}
	hs, err := w.inner.Hosts(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]providers.Host, 0, len(hs))
	var missing []string
	now := time.Now()
	r.mu.Lock()
	listed := make(map[string]bool, len(hs))
	for _, h := range hs {
		listed[h.ID] = true
		var match *session
		for _, s := range r.namedLocked(h.ID, h.Addr) {
			if s.info.HostID == h.ID || s.info.Addr == h.Addr {
				if match == nil || s.registered.After(match.registered) {
					match = s
				}
			}
		}
		if match == nil {
			missing = append(missing, h.ID)
			if _, ok := r.unconnected[h.ID]; !ok {
				r.unconnected[h.ID] = Unconnected{Host: h, Since: now}
			}
			continue
		}
		delete(r.unconnected, h.ID)
		r.setHostLocked(match, h.ID, h.Addr)
		h.Slots = match.slots(h.Slots)
		out = append(out, h)
	}
	for id := range r.unconnected {
		if !listed[id] {
			delete(r.unconnected, id) // gone from the provider
		}
	}
	r.mu.Unlock()
	w.mu.Lock()
	for _, id := range missing {
		if !w.waiting[id] {
			w.waiting[id] = true
			r.log.Info("host has no agent connected yet; not using it", "host", id)
		}
	}
	for id := range w.waiting {
		if !slices.ContainsFunc(out, func(h providers.Host) bool { return h.ID == id }) && !slices.Contains(missing, id) {
			delete(w.waiting, id) // gone from the provider
		}
	}
	w.mu.Unlock()
	return out, nil
}

// Notices passes inner's notices through.
func (w *wrapped) Notices(ctx context.Context) ([]providers.Notice, error) {
	if n, ok := w.inner.(providers.Noticer); ok {
		return n.Notices(ctx)
	}
	return nil, nil
}

// CompleteNotice answers a notice: an agent's through its agent, inner's through inner.
func (w *wrapped) CompleteNotice(ctx context.Context, n providers.Notice) error {
	if id, ok := strings.CutPrefix(n.ID, "agent:"); ok {
		r := w.r
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, s := range r.byAgent[n.Token] {
			if s.info.AgentID == n.Token {
				s.queueLocked(protocol.AgentCommand{Op: protocol.OpCompleteNotice, Notice: id})
				return nil
			}
		}
		return fmt.Errorf("the agent of host %s is no longer connected", n.HostID)
	}
	if c, ok := w.inner.(providers.NoticeCompleter); ok {
		return c.CompleteNotice(ctx, n)
	}
	return nil
}
