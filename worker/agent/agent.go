// Package agent is `elasticd agent`, the small process on each GPU host: it registers the host
// and its GPUs with the driver, starts and stops worker processes when the driver asks
// (--launcher agent, no ssh), and reports what only the host sees: the cloud's interruption
// notices on the instance metadata service, and GPUs that fail. The protocol is in
// driver/agents and docs/protocol.md §4.
//
// The agent dials the driver and keeps at it: an unreachable driver, a refused secret or a
// metadata service answering garbage is logged and retried with bounded backoff, never a
// crash. Workers it started never outlive it (launch.NewLocal's guard), and when the driver
// is gone for longer than DriverTimeout, or comes back as a new job, it stops them.
package agent

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticd/elasticd/proc"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/python"
	"github.com/elasticd/elasticd/worker/agent/gpu"
)

// GPUSource is the host's GPUs and their health: gpu.Monitor, or a test's.
type GPUSource interface {
	GPUs() []gpu.GPU
	Watch(ctx context.Context, out chan<- gpu.Event) error
}

// Config configures an agent. Zero values take the defaults.
type Config struct {
	// DriverURL is the driver's listener, e.g. http://10.0.0.5:29400.
	DriverURL string
	// Secret is the cluster's agent secret, the same as the driver's.
	Secret []byte
	// HostID is the host's ID as the provider knows it (an instance ID); Addr is where
	// workers on this host listen. The driver matches a discovered host to this agent by
	// either.
	HostID, Addr string
	// Slots overrides the slot count; 0: one per GPU (or the provider's count without GPUs).
	Slots int
	// GPUs reports inventory and health; nil: no GPUs.
	GPUs GPUSource
	// Notices watches the metadata service; nil: none. If it is also a
	// providers.NoticeCompleter, the driver's word that the host's workers are gone
	// completes the notice (Azure: StartRequests).
	Notices providers.Noticer
	// Metadata names the watcher for the driver's log ("aws", "none"...).
	Metadata string
	// NoticeInterval is the pause between metadata polls (default 1s).
	NoticeInterval time.Duration
	// Launcher starts workers (default proc.NewLocal()).
	Launcher proc.Launcher
	// HTTPClient talks to the driver; nil: two of its own, without proxy: HTTP/1.1 to
	// register, and one connection for the session and the workers' relay (its session
	// stream, or HTTP/2 to a driver without).
	HTTPClient *http.Client
	// DriverTimeout: once the driver has been unreachable this long, the workers it started
	// are stopped (default 2m).
	DriverTimeout time.Duration
	// MaxBackoff caps the pause between retries (default 30s).
	MaxBackoff time.Duration
	// StopGrace is the SIGTERM→SIGKILL grace when the agent itself stops workers (default 5s).
	StopGrace time.Duration
	// LoadEvery is how often the agent reports its GPUs' busy fraction (default
	// DefaultLoadEvery).
	LoadEvery time.Duration
	Version   string
	Logger    *slog.Logger
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	u, err := url.Parse(c.DriverURL)
	switch {
	case c.DriverURL == "":
		return errors.New("--driver: no driver URL (e.g. --driver http://10.0.0.5:29400)")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("--driver %q: want the driver's http(s) URL, e.g. http://10.0.0.5:29400", c.DriverURL)
	case len(c.Secret) < protocol.MinAgentSecret:
		return fmt.Errorf("--agent-secret-file: the secret is %d bytes, at least %d are needed (e.g. `head -c 32 /dev/urandom | base64`)", len(c.Secret), protocol.MinAgentSecret)
	case c.HostID == "":
		return errors.New("--host-id: empty")
	case c.Addr == "":
		return errors.New("--addr: empty")
	case c.Slots < 0:
		return fmt.Errorf("--slots %d: must not be negative (0: one per GPU)", c.Slots)
	case c.DriverTimeout < 0 || c.MaxBackoff < 0 || c.NoticeInterval < 0 || c.StopGrace < 0:
		return errors.New("agent durations must not be negative")
	}
	return nil
}

const minBackoff = 500 * time.Millisecond

// errSessionGone: the driver does not know our session (it restarted or counted us lost).
var errSessionGone = errors.New("the driver ended the agent's session")

type agent struct {
	cfg     Config
	log     *slog.Logger
	reg     *client // registrations (HTTP/1.1)
	c       *client // the session (its stream, or HTTP/2)
	relay   *relay  // the workers' way to the driver
	agentID string
	gpus    []gpu.GPU

	lastContact atomic.Int64 // unix nanoseconds of the last answer from the driver
	noLoads     atomic.Bool  // the session's driver reads no GPU busy fractions

	mu      sync.Mutex
	cur     *outbox                // the session's outbox; nil between sessions
	notices []protocol.AgentNotice // active notices, sent again to every new session
	faults  []protocol.AgentEvent  // GPU faults seen between sessions
	// held are the workers of a session the driver ended (it restarted, or lost us): kept
	// running for the next registration, where a driver that took up their job adopts them.
	held []*wproc

	procWG sync.WaitGroup // every worker's exit watcher, and the stops of held workers
	bg     sync.WaitGroup // the watchers, and notice completions in progress: Run waits for them
}

// Run runs the agent until ctx ends. Every worker it started has exited when it returns.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg.NoticeInterval = cmp.Or(cfg.NoticeInterval, time.Second)
	cfg.DriverTimeout = cmp.Or(cfg.DriverTimeout, 2*time.Minute)
	cfg.MaxBackoff = cmp.Or(cfg.MaxBackoff, 30*time.Second)
	cfg.StopGrace = cmp.Or(cfg.StopGrace, proc.DefaultGrace)
	cfg.LoadEvery = cmp.Or(cfg.LoadEvery, DefaultLoadEvery)
	if cfg.Launcher == nil {
		cfg.Launcher = proc.NewLocal()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	auth, err := protocol.NewAuth(cfg.Secret, protocol.AgentAuthLabel, 0)
	if err != nil {
		return err
	}
	var id [8]byte
	rand.Read(id[:])
	regHC, sessHC := cfg.HTTPClient, cfg.HTTPClient
	if cfg.HTTPClient == nil {
		regHC, sessHC = driverClient(cfg.DriverURL, auth, false), driverClient(cfg.DriverURL, auth, true)
		defer regHC.CloseIdleConnections()
		defer sessHC.CloseIdleConnections()
	}
	rl, err := startRelay(cfg.Logger, cfg.DriverURL, sessHC, cfg.Secret)
	if err != nil {
		return err
	}
	defer rl.close() // last: after every worker has exited
	a := &agent{cfg: cfg, log: cfg.Logger, reg: newClient(cfg.DriverURL, auth, regHC), c: newClient(cfg.DriverURL, auth, sessHC), relay: rl, agentID: hex.EncodeToString(id[:])}
	if cfg.GPUs != nil {
		a.gpus = cfg.GPUs.GPUs()
	}
	if len(a.gpus) == 0 {
		a.log.Info("no GPUs found on this host; offering the driver's slot count (or --slots)")
	}

	defer a.bg.Wait()
	defer a.procWG.Wait()
	defer a.stopHeld("the agent is stopping")
	bctx, stop := context.WithCancel(ctx)
	defer stop()
	if cfg.Notices != nil {
		a.bg.Go(func() { a.watchNotices(bctx) })
	}
	if len(a.gpus) > 0 {
		a.bg.Go(func() { a.watchGPUs(bctx) })
		a.bg.Go(func() { a.reportLoad(bctx) })
	}

	// short counts sessions in a row that ended soon after they began: another agent claiming
	// the same --host-id takes the session from us as we take it from it, and without a
	// pause the two would register against each other as fast as the driver answers.
	short := 0
	for ctx.Err() == nil {
		reg, err := a.register(ctx)
		if err != nil {
			break // ctx ended
		}
		began := time.Now()
		err = a.session(ctx, reg)
		if time.Since(began) < shortSession {
			short++
		} else {
			short = 0
		}
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, errSessionGone) && short > 1:
			a.log.Warn("the driver keeps ending this agent's session right after it registers: is another agent running with the same --host-id? Give each host its own; registering again after a pause",
				"host", a.cfg.HostID, "addr", a.cfg.Addr, "retry_in", a.pause(short))
		case errors.Is(err, errSessionGone) && a.holding() > 0:
			a.log.Warn("the driver ended this agent's session (it restarted, or lost contact with us); registering again and keeping its workers running for a driver that takes up their job (those it does not adopt are stopped)", "workers", a.holding())
		case errors.Is(err, errSessionGone):
			a.log.Warn("the driver ended this agent's session (it restarted, or lost contact with us); registering again")
		default:
			a.log.Warn("lost the driver; its workers were stopped; registering again", "err", err)
		}
		if short > 1 && !a.backoff(ctx, short) {
			break
		}
	}
	return nil
}

// shortSession: a session that ends sooner than this after its registration counts toward
// the pause before registering again.
const shortSession = 5 * time.Second

// backoff sleeps for the attempt-th retry's pause, less up to a fifth of it at random; false
// if ctx ended.
func (a *agent) backoff(ctx context.Context, attempt int) bool {
	d := a.pause(attempt)
	d = d - d/5 + time.Duration(mrand.Int64N(int64(d/5)+1))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// pause is the attempt-th retry's pause before jitter: doubling from minBackoff up to
// MaxBackoff.
func (a *agent) pause(attempt int) time.Duration {
	return min(minBackoff<<min(attempt, 16), a.cfg.MaxBackoff)
}

// register registers with the driver, retrying until it succeeds or ctx ends.
func (a *agent) register(ctx context.Context) (protocol.AgentRegisterAnswer, error) {
	req := protocol.AgentRegisterRequest{
		Protocol: protocol.AgentProtocolVersion,
		AgentID:  a.agentID, HostID: a.cfg.HostID, Addr: a.cfg.Addr, Slots: a.cfg.Slots,
		Version: a.cfg.Version, Metadata: cmp.Or(a.cfg.Metadata, "none"), GPUs: []protocol.AgentGPU{},
	}
	req.Hostname, _ = os.Hostname()
	for _, g := range a.gpus {
		req.GPUs = append(req.GPUs, protocol.AgentGPU{Index: g.Index, UUID: g.UUID, Model: g.Model, MemoryBytes: g.MemoryBytes})
	}
	var ans protocol.AgentRegisterAnswer
	for attempt := 0; ; attempt++ {
		req.Procs = a.heldProcs()
		err := a.reg.do(ctx, http.MethodPost, protocol.AgentPathRegister, req, &ans, 0)
		if err == nil && ans.Session != "" && ans.JobID != "" {
			a.touch()
			a.log.Info("registered with the driver", "driver", a.cfg.DriverURL, "job", ans.JobID, "host", a.cfg.HostID, "addr", a.cfg.Addr, "gpus", len(a.gpus))
			return ans, nil
		}
		if ctx.Err() != nil {
			return ans, ctx.Err()
		}
		if err == nil {
			err = errors.New("the driver's answer has no session or job ID")
		}
		if a.holding() > 0 && a.driverGone() {
			a.stopHeld(fmt.Sprintf("no driver for %v (--driver-timeout)", a.cfg.DriverTimeout))
		}
		a.log.Warn("cannot register with the driver; retrying", "driver", a.cfg.DriverURL, "err", describe(err), "retry_in", a.pause(attempt))
		if !a.backoff(ctx, attempt) {
			return ans, ctx.Err()
		}
	}
}

// describe turns a request error into the line an operator needs.
func describe(err error) string {
	if _, ok := errors.AsType[*net.OpError](err); ok {
		return "driver unreachable: " + err.Error()
	}
	return err.Error()
}

func (a *agent) touch() { a.lastContact.Store(time.Now().UnixNano()) }

// driverGone reports whether the driver has been silent for longer than DriverTimeout.
func (a *agent) driverGone() bool {
	return time.Since(time.Unix(0, a.lastContact.Load())) > a.cfg.DriverTimeout
}

// session serves one registration until the driver ends it, is gone for DriverTimeout, or ctx
// ends; then it stops every worker it started and waits for them.
func (a *agent) session(ctx context.Context, reg protocol.AgentRegisterAnswer) error {
	ob := newOutbox()
	a.mu.Lock()
	for _, n := range a.notices {
		ob.add(protocol.AgentEvent{Kind: protocol.KindNotice, Notice: &n})
	}
	for _, f := range a.faults {
		ob.add(f)
	}
	a.faults = nil
	a.cur = ob
	held := a.held
	a.held = nil
	a.mu.Unlock()

	a.noLoads.Store(reg.NoLoads)
	sctx, cancel := context.WithCancelCause(ctx)
	s := &sess{a: a, id: reg.Session, jobID: reg.JobID, ob: ob, procs: map[uint64]*wproc{}, ended: map[uint64]*wproc{}, jobSecret: hex.EncodeToString(protocol.JobSecret(a.cfg.Secret, reg.JobID))}
	a.relay.forJob(reg.JobID)
	s.adopt(held, reg.Adopted)
	wait := time.Duration(reg.PollWaitMS) * time.Millisecond
	var loops sync.WaitGroup
	loops.Go(func() { cancel(s.pollCommands(sctx, wait)) })
	loops.Go(func() { cancel(s.sendEvents(sctx)) })
	loops.Go(func() { cancel(s.watchDriver(sctx, wait)) })
	<-sctx.Done()
	err := context.Cause(sctx)
	loops.Wait()

	if errors.Is(err, errSessionGone) && ctx.Err() == nil {
		// The driver may have restarted with its state (--state-dir): keep the workers
		// training, and offer them to the next registration.
		a.mu.Lock()
		a.held = s.release()
		a.cur = nil
		a.mu.Unlock()
		s.stops.Wait()
		return err
	}
	// Stop this session's workers; their exits go to the driver if it is still there.
	s.stopAll(a.cfg.StopGrace)
	s.stops.Wait()
	fctx, fcancel := context.WithTimeout(context.Background(), 2*time.Second)
	s.flush(fctx)
	fcancel()
	a.mu.Lock()
	a.cur = nil
	a.mu.Unlock()
	return err
}

// holding is how many workers wait for a driver to adopt them.
func (a *agent) holding() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.held)
}

// heldProcs describes the held workers for a registration.
func (a *agent) heldProcs() []protocol.HeldProc {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []protocol.HeldProc
	for _, w := range a.held {
		out = append(out, w.held())
	}
	return out
}

// stopHeld stops the workers no driver adopted (in the background: Run waits for them).
func (a *agent) stopHeld(why string) {
	a.mu.Lock()
	held := a.held
	a.held = nil
	a.mu.Unlock()
	if len(held) == 0 {
		return
	}
	a.log.Warn("stopping workers no driver took up", "workers", len(held), "reason", why)
	for _, w := range held {
		a.procWG.Go(func() { w.p.Stop(a.cfg.StopGrace) })
	}
}

// emit queues an event for the current session, or keeps a GPU fault for the next one. Other
// events are dropped between sessions (notices are kept apart, in a.notices).
func (a *agent) emit(ev protocol.AgentEvent) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cur != nil {
		a.cur.add(ev)
	} else if ev.Kind == protocol.KindGPU && len(a.faults) < 64 {
		a.faults = append(a.faults, ev)
	}
}

// sess is one session's state.
type sess struct {
	a         *agent
	id        string
	jobID     string
	ob        *outbox
	jobSecret string
	stops     sync.WaitGroup // OpStop's

	mu    sync.Mutex
	procs map[uint64]*wproc // running workers, by their number in this session
	// ended are workers that exited in this session whose exit the driver may not have
	// taken yet: a driver that dies first never hears of it, so the next registration
	// lists them (exited) for the driver started again to adopt, and learn their end.
	ended map[uint64]*wproc
}

// wproc is a worker process the agent started. It belongs to one session at a time: when the
// driver ends a session, its workers may be held and adopted by the next one (a driver
// restarted with --state-dir), which numbers them anew.
type wproc struct {
	p      proc.Process
	worker string
	jobID  string

	mu    sync.Mutex
	s     *sess  // its session
	id    uint64 // its number there
	ended bool   // it has exited: st is how
	st    proc.ExitStatus
	gone  chan struct{} // closed once its exit has been queued
}

// emit queues an event of the worker for its session.
func (w *wproc) emit(ev protocol.AgentEvent) {
	w.mu.Lock()
	ev.Proc = w.id
	w.s.ob.add(ev)
	w.mu.Unlock()
}

func (w *wproc) output(stream string, p []byte) {
	w.mu.Lock()
	w.s.ob.output(w.id, stream, p)
	w.mu.Unlock()
}

// held describes the worker for a registration's Procs.
func (w *wproc) held() protocol.HeldProc {
	w.mu.Lock()
	defer w.mu.Unlock()
	h := protocol.HeldProc{Proc: w.id, Worker: w.worker, JobID: w.jobID, PID: w.p.PID()}
	if w.ended {
		h.Exited, h.Code, h.Signal = true, w.st.Code, w.st.Signal
	}
	return h
}

// wprocOutput writes a worker's stdout or stderr into its session's outbox.
type wprocOutput struct {
	w      *wproc
	stream string
}

func (o wprocOutput) Write(p []byte) (int, error) {
	o.w.output(o.stream, p)
	return len(p), nil
}

// adopt moves the held workers the driver adopted into s, with the output they wrote while no
// driver heard it; it stops the others.
func (s *sess) adopt(held []*wproc, adopted []protocol.Adoption) {
	renumber := map[uint64]uint64{}
	for _, a := range adopted {
		renumber[a.Old] = a.New
	}
	var stop []*wproc
	for _, w := range held {
		w.mu.Lock()
		nid, ok := renumber[w.id]
		if !ok || w.jobID != s.jobID {
			w.mu.Unlock()
			stop = append(stop, w)
			continue
		}
		for _, ev := range w.s.ob.takeOutput(w.id) {
			s.ob.output(nid, ev.Stream, ev.Data)
		}
		w.s, w.id = s, nid
		if w.ended { // it exited after the registration listed it running
			s.ob.add(protocol.AgentEvent{Kind: protocol.KindExited, Proc: nid, Code: w.st.Code, Signal: w.st.Signal})
		} else {
			s.mu.Lock()
			s.procs[nid] = w
			s.mu.Unlock()
		}
		w.mu.Unlock()
		s.a.log.Info("the driver adopted a worker", "worker", w.worker, "pid", w.p.PID(), "proc", nid)
	}
	if len(stop) > 0 {
		s.a.log.Warn("stopping workers the driver did not adopt (another job, or it counted them lost)", "workers", len(stop))
		for _, w := range stop {
			s.a.procWG.Go(func() { w.p.Stop(s.a.cfg.StopGrace) })
		}
	}
}

// release hands the session's running workers over, to be held for the next session, with
// those that exited unheard of.
func (s *sess) release() []*wproc {
	unacked := s.ob.unackedExits()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*wproc, 0, len(s.procs))
	for _, w := range s.procs {
		out = append(out, w)
	}
	for pid, w := range s.ended { // exited, and the driver that ended the session never heard
		if unacked[pid] {
			out = append(out, w)
		}
	}
	s.procs, s.ended = map[uint64]*wproc{}, map[uint64]*wproc{}
	return out
}

func (s *sess) path(what string) string {
	return protocol.AgentPathPrefix + url.PathEscape(s.id) + "/" + what
}

// pollCommands long-polls the driver's commands and carries them out in order.
func (s *sess) pollCommands(ctx context.Context, wait time.Duration) error {
	var after uint64
	for attempt := 0; ctx.Err() == nil; {
		var ans protocol.AgentCommandsAnswer
		target := s.path("commands") + "?after=" + strconv.FormatUint(after, 10) + "&wait_ms=" + strconv.FormatInt(wait.Milliseconds(), 10)
		err := s.a.c.do(ctx, http.MethodGet, target, nil, &ans, wait)
		if err != nil {
			if err := s.retry(ctx, err, "cannot reach the driver for commands; retrying", attempt); err != nil {
				return err
			}
			attempt++
			continue
		}
		attempt = 0
		s.a.touch()
		for _, c := range ans.Commands {
			if c.Seq <= after {
				continue
			}
			s.exec(ctx, c)
			after = c.Seq
		}
	}
	return ctx.Err()
}

// sendEvents sends the outbox to the driver as events arrive.
func (s *sess) sendEvents(ctx context.Context) error {
	for attempt := 0; ; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.ob.wake:
		}
		for s.ob.pending() && ctx.Err() == nil {
			err := s.sendBatch(ctx)
			if err == nil {
				attempt = 0
				continue
			}
			if err := s.retry(ctx, err, "cannot send events to the driver; retrying", attempt); err != nil {
				return err
			}
			attempt++
		}
	}
}

// retry handles a failed request: nil after the attempt-th pause when it is worth trying
// again; else why the session is over (the driver ended it, was gone for DriverTimeout, or
// ctx ended).
func (s *sess) retry(ctx context.Context, err error, msg string, attempt int) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case isStatus(err, http.StatusNotFound):
		return errSessionGone
	case s.a.driverGone():
		return fmt.Errorf("no answer from the driver for %v (last error: %w)", s.a.cfg.DriverTimeout, err)
	}
	s.a.log.Warn(msg, "err", describe(err), "retry_in", s.a.pause(attempt))
	if !s.a.backoff(ctx, attempt) {
		return ctx.Err()
	}
	return nil
}

func (s *sess) sendBatch(ctx context.Context) error {
	evs, last := s.ob.batch()
	if len(evs) == 0 {
		return nil
	}
	if err := s.a.c.do(ctx, http.MethodPost, s.path("events"), protocol.AgentEventsRequest{Events: evs}, nil, 0); err != nil {
		return err
	}
	s.a.touch()
	s.ob.ack(last)
	return nil
}

// flush sends what is left, once, best effort.
func (s *sess) flush(ctx context.Context) {
	for s.ob.pending() && ctx.Err() == nil {
		if s.sendBatch(ctx) != nil {
			return
		}
	}
}

func (s *sess) exec(ctx context.Context, c protocol.AgentCommand) {
	switch c.Op {
	case protocol.OpStart:
		s.start(ctx, c)
	case protocol.OpStop:
		s.mu.Lock()
		w := s.procs[c.Proc]
		s.mu.Unlock()
		if w != nil {
			grace := time.Duration(c.GraceMS) * time.Millisecond
			s.a.log.Info("stopping worker", "proc", c.Proc, "pid", w.p.PID(), "grace", grace)
			s.stops.Go(func() { w.p.Stop(grace) })
		}
	case protocol.OpCompleteNotice:
		s.a.completeNotice(ctx, c.Notice)
	case protocol.OpFindPort:
		ev := protocol.AgentEvent{Kind: protocol.KindPort, Proc: c.Proc}
		port, err := proc.NewLocal().(proc.PortFinder).FreePort(ctx, "")
		if err != nil {
			ev.Error = err.Error()
		}
		ev.Port = port
		s.ob.add(ev)
	default:
		s.a.log.Warn("unknown command from the driver ignored (is the driver newer than this agent?)", "op", c.Op)
	}
}

func (s *sess) start(ctx context.Context, c protocol.AgentCommand) {
	// The worker waits for a restarting driver as long as this agent keeps it.
	env := append(append([]string{}, c.Env...), protocol.EnvSecret+"="+s.jobSecret, protocol.EnvDriverWait+"="+s.a.cfg.DriverTimeout.String())
	// elasticd's Python package, from this binary, ahead of the worker's own PYTHONPATH.
	if root, err := python.Install(python.CacheDir()); err != nil {
		s.a.log.Warn("could not write out the Python package; workers cannot import elasticd", "err", err)
	} else {
		cur, _ := os.LookupEnv("PYTHONPATH")
		if v, ok := protocol.EnvValue(c.Env, "PYTHONPATH"); ok {
			cur = v
		}
		env = append(env, python.Env(root, cur))
	}
	if _, set := protocol.EnvValue(c.Env, "CUDA_VISIBLE_DEVICES"); !set && len(s.a.gpus) > 0 {
		env = append(env, "CUDA_VISIBLE_DEVICES="+visibleDevices(s.a.gpus, c.Slot, c.Env))
	}
	// The worker reaches the driver's rendezvous through the agent's relay.
	if rdzv, ok := protocol.EnvValue(c.Env, protocol.EnvRendezvous); ok {
		env = append(env, protocol.EnvRendezvous+"="+s.a.relay.url(rdzv))
	}
	s.a.relay.watch(c.Worker, +1)
	w := &wproc{worker: c.Worker, jobID: s.jobID, s: s, id: c.Proc, gone: make(chan struct{})}
	spec := proc.Spec{
		Name: c.Worker, Command: c.Argv, Env: env, Dir: c.Dir, Slot: c.Slot,
		Stdout: wprocOutput{w, "stdout"}, Stderr: wprocOutput{w, "stderr"},
	}
	// The worker lives as long as the agent, not as the request: a session may end and the
	// next adopt it.
	p, err := s.a.cfg.Launcher.Start(context.WithoutCancel(ctx), spec)
	if err != nil {
		s.a.relay.watch(c.Worker, -1)
		s.a.log.Warn("cannot start worker", "worker", c.Worker, "err", err)
		s.ob.add(protocol.AgentEvent{Kind: protocol.KindExited, Proc: c.Proc, Code: 127, Error: err.Error()})
		return
	}
	w.p = p
	s.a.log.Info("started worker", "worker", c.Worker, "proc", c.Proc, "pid", p.PID())
	s.mu.Lock()
	s.procs[c.Proc] = w
	s.mu.Unlock()
	s.ob.add(protocol.AgentEvent{Kind: protocol.KindStarted, Proc: c.Proc, PID: p.PID()})
	s.a.procWG.Go(func() {
		st, err := p.Wait()
		w.mu.Lock()
		w.ended, w.st = true, st
		cur, id := w.s, w.id
		w.mu.Unlock()
		unacked := cur.ob.unackedExits()
		cur.mu.Lock()
		delete(cur.procs, id)
		for pid := range cur.ended {
			if !unacked[pid] { // the driver took that exit: nothing to tell the next one
				delete(cur.ended, pid)
			}
		}
		cur.ended[id] = w
		cur.mu.Unlock()
		ev := protocol.AgentEvent{Kind: protocol.KindExited, Code: st.Code, Signal: st.Signal}
		if err != nil {
			ev.Error = err.Error()
		}
		s.a.relay.watch(c.Worker, -1)
		s.a.log.Info("worker exited", "worker", c.Worker, "proc", id, "status", st.String())
		w.emit(ev)
		close(w.gone)
	})
}

// stopAll stops every worker of the session and waits until their exits are queued.
func (s *sess) stopAll(grace time.Duration) {
	s.mu.Lock()
	ws := make([]*wproc, 0, len(s.procs))
	for _, w := range s.procs {
		ws = append(ws, w)
	}
	s.mu.Unlock()
	if len(ws) > 0 {
		s.a.log.Info("stopping this session's workers", "workers", len(ws))
	}
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() {
			w.p.Stop(grace)
			<-w.gone
		})
	}
	wg.Wait()
}

// visibleDevices is the CUDA_VISIBLE_DEVICES of the worker in slot: its GPU is slot mod #GPUs,
// listed at position LOCAL_RANK (from the worker's env) among the host's other GPUs. Scripts
// written for torchrun and Horovod call torch.cuda.set_device(LOCAL_RANK), which must pick
// the worker's own GPU: with that GPU alone visible, every local rank but 0 would fail with
// "invalid device ordinal". Without a LOCAL_RANK below the GPU count, only its GPU is visible.
func visibleDevices(gpus []gpu.GPU, slot int, env []string) string {
	name := func(g gpu.GPU) string { return cmp.Or(g.UUID, strconv.Itoa(g.Index)) }
	own := gpus[slot%len(gpus)]
	local := -1
	if v, ok := protocol.EnvValue(env, "LOCAL_RANK"); ok {
		if n, err := strconv.Atoi(v); err == nil {
			local = n
		}
	}
	if local < 0 || local >= len(gpus) {
		return name(own)
	}
	list := make([]string, 0, len(gpus))
	for _, g := range gpus {
		if g != own {
			list = append(list, name(g))
		}
	}
	return strings.Join(slices.Insert(list, local, name(own)), ",")
}
