package driver

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/elasticd/elasticd/allreduce"
	"github.com/elasticd/elasticd/driver/agents"
	"github.com/elasticd/elasticd/driver/cost"
	"github.com/elasticd/elasticd/driver/discovery"
	"github.com/elasticd/elasticd/driver/hosts"
	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/driver/webui"
	"github.com/elasticd/elasticd/internal/netguard"
	"github.com/elasticd/elasticd/proc"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Options is everything `elasticd run` needs beyond the state machine's Config.
type Options struct {
	Config
	Provider          providers.Provider
	DiscoveryInterval time.Duration // default 1s
	DiscoveryTimeout  time.Duration // per poll; default 10s
	Launcher          proc.Launcher
	Command           []string
	Env               []string // extra KEY=VALUE for every worker
	Dir               string
	OutputDir         string        // per worker and generation stdout/stderr files; "" = none
	Stdout, Stderr    io.Writer     // the terminal: worker lines prefixed "[rank] "
	StopGrace         time.Duration // SIGTERM→SIGKILL; default 5s
	ListenAddr        string        // rendezvous listen address; default 127.0.0.1:0
	AdvertiseHost     string        // host workers use to reach the rendezvous; default the listener's, or this machine's first non-loopback IPv4 address when it listens on all interfaces
	CommTimeout       time.Duration // workers' allreduce timeout; default 30s
	CommTransport     string        // workers' allreduce transport: allreduce.TransportAuto ("" too) or TransportTCP
	Logger            *slog.Logger
	// Agents, when set, serves the agents' protocol on the rendezvous listener, and the
	// notices and GPU faults its agents report reach the job. The caller wraps Provider and
	// sets Launcher with it (Registry.Wrap, Registry.Launcher); Run closes it at the end.
	Agents *agents.Registry
	// Admin, when set, serves the admin API (driver/admin) under /v1/admin/ on the same
	// listener; without it those paths answer 404 saying the API is off.
	Admin http.Handler
	// Rediscover, when set, makes discovery poll at once when it receives (the admin
	// overlay's Changed), so an operator's change reaches the job without waiting for
	// DiscoveryInterval.
	Rediscover <-chan struct{}
	// Operator, when set, is what the operator changed through the admin API (the overlay's
	// Snapshot): saved with the job's state, for a driver started again on it to restore.
	Operator interface {
		Snapshot() (added, stopped []providers.Host)
	}
	// Releases, when set, brings back quarantined (flapping) slots: the admin API sends one
	// when an operator adds a host that is already in the job (elasticd ctl add-host).
	Releases <-chan Release
	// Stops, when set, ends the job when it receives, with the operator's reason (elasticd
	// ctl stop): as an interrupt does, the workers stopped and a managed group set to zero.
	Stops <-chan string
	// Leave, when set, ends the driver but not the job when it receives (SIGTERM under
	// --launcher agent with --state-dir: the driver's machine stopping or rebooting): the job's
	// state is saved as it stands, and the workers are neither stopped nor told anything,
	// nor is a managed group resized; the agents keep them training for their
	// --driver-timeout, and a driver started again on StateDir adopts them, as after a crash.
	// Only for a job whose workers can outlive the driver: Agents and StateDir set.
	Leave <-chan struct{}
	// Status, when set, receives a snapshot of the job whenever the state machine has worked
	// off the events at hand (a burst of them is snapshotted once, after its last step);
	// else Run makes its own. It backs GET /v1/status, /metrics and the live page at /.
	Status *StatusBoard
	// Prices prices the hosts' time (nil: no prices, the cost shows what is unpriced). Run
	// keeps its spot prices fresh while the job runs (cost.Catalog.Run).
	Prices *cost.Catalog
	// ProviderName labels the provider's notices in the counts ("aws"); agents' notices
	// count as "agent".
	ProviderName string
	// JobID and Secret are the job's ID and secret; empty: random. With agents they are
	// derived from the agent secret (agents.JobSecret), so that agents know the secret
	// without it crossing the network.
	JobID  string
	Secret []byte
	// StateDir (--state-dir), when set, is where the job's state is kept (SavedState) so that
	// a driver started again on it takes the job up; Restore is the state found there at
	// start (LoadState), nil for a new job. With agents the workers keep running and are
	// adopted (within AdoptTimeout, default 1m); with the local and ssh launchers they died
	// with the driver, and in-process workers resume from --checkpoint-dir.
	StateDir     string
	Restore      *SavedState
	AdoptTimeout time.Duration
	// MaxCost (--max-cost), when positive, is the job's budget in the prices' currency: before
	// the cost passes it the job stops (ExitBudget). Every host's time must have a price.
	MaxCost float64
	// Capacity is the group Config.Capacity steers (--manage-capacity): the provider's own,
	// not a wrapper of it. Required with Config.Capacity, unused without.
	Capacity providers.Capacity
	// Fallback is the on-demand fallback group (Config.Capacity.Fallback); required with it.
	Fallback providers.Capacity
	// Claim and FallbackClaim are the claims (providers.Claimer) taken on Capacity and
	// Fallback before Run, nil where none was (a cloud that cannot tag its groups, a tag the
	// cloud refused). Run refreshes each with every read of its group's size; when another
	// driver holds the group instead, it stops steering (as after a refused call: no final
	// zero either). At the job's end, after the final sizes, it removes them.
	Claim, FallbackClaim *providers.GroupClaim
}

// DefaultAdoptTimeout is how long a restarted driver waits for its agents to list the
// workers they kept: longer than an agent's longest pause between registrations (30s).
const DefaultAdoptTimeout = time.Minute

// loadEvery is how often the workers' step times and the agents' GPU busy reach the machine
// (--slot-policy loadaware).
const loadEvery = 5 * time.Second

// Result is how a job ended.
type Result struct {
	Code                  int
	Reason                string
	Generations           uint64
	Resets, FailureResets int
	// Status is the job's last status, priced until its end (for the summary line).
	Status *Status
	// Left is true when the driver left a running job (Options.Leave): Code is 0, and the
	// job goes on without it.
	Left bool
}

// Run drives one job to its end. It returns when the job has finished or ctx ends (then
// every worker is stopped: SIGTERM, SIGKILL after StopGrace); no worker outlives it.
func Run(ctx context.Context, o Options) (Result, error) {
	if err := o.Config.Validate(); err != nil {
		return Result{}, err
	}
	if len(o.Command) == 0 {
		return Result{}, errors.New("no command to run")
	}
	if o.MaxCost < 0 {
		return Result{}, fmt.Errorf("--max-cost %v: must be positive", o.MaxCost)
	}
	if o.Leave != nil && (o.Agents == nil || o.StateDir == "") {
		return Result{}, errors.New("a driver may leave its job running only with agents (--launcher agent) and --state-dir")
	}
	if (o.Config.Capacity != nil) != (o.Capacity != nil) {
		return Result{}, errors.New("--manage-capacity needs both the group's settings and the provider's capacity calls")
	}
	if (o.Config.Capacity != nil && o.Config.Capacity.Fallback != nil) != (o.Fallback != nil) {
		return Result{}, errors.New("a fallback group needs both its settings and its capacity calls, with --manage-capacity")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.StopGrace == 0 {
		o.StopGrace = 5 * time.Second
	}
	if o.CommTimeout == 0 {
		o.CommTimeout = 30 * time.Second
	}
	o.CommTransport = cmp.Or(o.CommTransport, allreduce.TransportAuto)
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	if o.Stderr == nil {
		o.Stderr = io.Discard
	}
	// Every worker's PrefixWriters share these two: locked, so that lines never interleave.
	if proc.SameWriter(o.Stdout, o.Stderr) {
		o.Stdout = proc.NewLockedWriter(o.Stdout)
		o.Stderr = o.Stdout
	} else {
		o.Stdout, o.Stderr = proc.NewLockedWriter(o.Stdout), proc.NewLockedWriter(o.Stderr)
	}
	if o.AdoptTimeout == 0 {
		o.AdoptTimeout = DefaultAdoptTimeout
	}
	secret := o.Secret
	if secret == nil {
		secret = make([]byte, 32)
		rand.Read(secret)
	}
	d := &runner{o: o, log: o.Logger, secret: secret, procs: map[protocol.WorkerID]*running{}, launching: map[protocol.WorkerID]context.CancelFunc{}, events: make(chan Event, 256)}
	d.claims[0] = newHeldClaim(o.Capacity, o.Claim, o.Config.Capacity, false)
	d.claims[1] = newHeldClaim(o.Fallback, o.FallbackClaim, o.Config.Capacity, true)
	// A random ID, independent of the secret: it is shown on the unauthenticated status page,
	// in /metrics and in every log line.
	d.jobID = o.JobID
	if d.jobID == "" {
		id := make([]byte, 4)
		rand.Read(id)
		d.jobID = hex.EncodeToString(id)
	}
	if st := o.Restore; st != nil {
		switch {
		case o.StateDir == "":
			return Result{}, errors.New("a saved state to restore needs its --state-dir")
		case st.JobID != d.jobID:
			return Result{}, fmt.Errorf("--state-dir holds job %s, not job %s", st.JobID, d.jobID)
		case o.Agents != nil && st.SecretFrom == "agents" && st.SecretCheck != secretCheck(secret):
			return Result{}, fmt.Errorf("--state-dir %s: job %s was started with another --agent-secret-file; its agents and workers would refuse this driver: use that file, or move the state away to start a new job", o.StateDir, st.JobID)
		}
	}
	if o.StateDir != "" {
		sd, err := openStateDir(o.StateDir)
		if err != nil {
			return Result{}, err
		}
		defer sd.close()
		d.state = sd
	}
	return d.run(ctx)
}

// Release asks the job to take back the quarantined slots of a host; Reply (buffered) gets
// how many it released.
// Release asks the job to take back the quarantined slots of a host; Reply (buffered) gets
// how many it released.
type Release struct {
	Host  string
	Reply chan<- int
}

// runner is one job's I/O around its Machine, shaped as etcd/raft's node: one goroutine, the
// loop, owns the machine and only steps it and hands out its actions; whatever may block (an
// ssh launch waits for its wrapper, a stop for its grace, discovery for the cloud) runs as a
// task of tasks and comes back to the loop as an event.
type runner struct {
	o       Options
	log     *slog.Logger
	secret  []byte
	jobID   string
	url     string
	srv     *rendezvous.Server
	board   *StatusBoard
	metrics *Metrics
	m       *Machine
	events  chan Event
	tasks   *tasks
	// procs are the started processes and launching the launches under way (each one's
	// cancel), by worker; the loop owns both.
	procs      map[protocol.WorkerID]*running
	launching  map[protocol.WorkerID]context.CancelFunc
	ranks      sync.Map    // WorkerID -> current rank (int), for output prefixes
	launchLogs launchLogs  // how many launches of the newest generation were logged
	port       *masterPort // the MASTER_PORT of the generation launched last
	state      *stateDir   // --state-dir; nil without
	// published is the generation last published at the rendezvous (saved states of a newer
	// one carry the host-update version it will be published with).
	published uint64
	// final are the groups' sizes at the job's end (--manage-capacity), set once the workers
	// are stopped (shutdown).
	final []SetCapacity
	// claims are the claims on the steered group and the fallback group (Options.Claim,
	// FallbackClaim); nil where none is held.
	claims [2]*heldClaim
	// journal and progress are what the last saves carried of the job's past, taken at
	// journalAt (journalEvery, or at once when journalKey changes); leaving is set once the
	// driver leaves a running job.
	journal    *SavedJournal
	progress   []ProgressPoint
	journalAt  time.Time
	journalKey [4]uint64 // what the job was when journal was taken: generation, resets, hosts
	leaving    bool
}

// inputs are the sources the fan-in forwards to the loop as events.
type inputs struct {
	hosts   <-chan []providers.Host
	notices <-chan providers.Notice
	loads   <-chan time.Time // nil without --slot-policy loadaware
	// The agents' notices and GPU faults; nil without agents.
	agentNotices <-chan providers.Notice
	agentFaults  <-chan agents.Fault
}

// run serves the job's listener, starts its inputs, runs the loop to the job's end and shuts
// everything down.
func (d *runner) run(ctx context.Context) (Result, error) {
	stopServing, err := d.serve(ctx)
	if err != nil {
		return Result{}, err
	}
	if d.o.Agents != nil {
		defer d.o.Agents.Close()
	}
	d.tasks = newTasks(ctx)
	d.m = NewMachine(d.o.Config)
	if st := d.o.Restore; st != nil {
		d.board.hist.restore(st.Progress)
		d.restore(ctx, st)
	}
	d.board.store(d.m.Snapshot())
	stopInputs := d.startInputs()
	defer stopInputs()
	res := d.loop(ctx)
	d.shutdown(&res, stopServing)
	return res, nil
}

// serve starts the rendezvous server and the HTTP server of the job's listener (rendezvous,
// agents, admin API, status, metrics, live page); the returned func shuts it down.
func (d *runner) serve(ctx context.Context) (stop func(), err error) {
	srv, err := rendezvous.NewServer(rendezvous.ServerConfig{Secret: d.secret, Logger: d.log})
	if err != nil {
		return nil, err
	}
	d.srv = srv
	listen := cmp.Or(d.o.ListenAddr, "127.0.0.1:0")
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: listen on %s: %w", listen, err)
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = OutboundIP()
	}
	adv := net.JoinHostPort(cmp.Or(d.o.AdvertiseHost, host), port)
	d.url = "http://" + adv
	board := d.o.Status
	if board == nil {
		board = &StatusBoard{}
	}
	board.jobID, board.progress, board.prices = d.jobID, srv.Progress, d.o.Prices
	board.heard = func() map[string]time.Time {
		heard := srv.Heard()
		if d.o.Agents != nil {
			d.o.Agents.LastSeen(heard)
		}
		return heard
	}
	d.board, d.metrics = board, NewMetrics(board)
	mux := http.NewServeMux()
	mux.Handle("/v1/", srv)
	if d.o.Agents != nil {
		mux.Handle(protocol.AgentPathPrefix, d.o.Agents)
		d.o.Agents.SetViewer(srv)
	}
	mux.Handle("/v1/admin/", adminOrOff(d.o.Admin))
	mux.Handle("GET /v1/status", statusHandler(board))
	mux.Handle("GET /metrics", promhttp.HandlerFor(d.metrics.Registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelWarn)}))
	mux.Handle("/", webui.Handler())
	if d.o.Agents != nil { // the agents' session streams carry requests to the same API
		d.o.Agents.SetHandler(mux)
	}
	// A connection flood (the port listens on every interface with --launcher ssh or agent)
	// must not take the job's port: pending connections are capped and the idle ones closed
	// after ReadHeaderTimeout (internal/netguard).
	guard := netguard.New(ln, netguard.Config{Logger: d.log})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ConnState: guard.ConnState}
	// An agent carries its host's whole session (its commands, events, the watch, and its
	// workers' relayed requests) over one connection: its session stream, which the
	// registry takes over from an HTTP/1.1 request, or HTTP/2 with prior knowledge on plain
	// http for an agent without streams (docs/protocol.md §4); workers, operators and
	// browsers speak HTTP/1.1.
	hs.Protocols = new(http.Protocols)
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	hs.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: maxAgentStreams}
	served := make(chan struct{})
	go func() { defer close(served); hs.Serve(guard) }() // stop waits for it
	d.log.Info("rendezvous listening", "addr", ln.Addr().String(), "advertised", adv)
	d.log.Info("live page at "+d.url+"/ (also /v1/status and /metrics)", "job", d.jobID)
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		hs.Shutdown(sctx)
		<-served
	}, nil
}

// snapEvery: the loop spends at most about 1/snapEvery of its time on snapshots and saves.
const snapEvery = 20

// maxAgentStreams bounds the requests one agent has in flight on its HTTP/2 connection: its
// commands poll, watch and events, and its workers' relayed requests (a few each while a
// generation forms). Beyond it the agent's HTTP/2 client opens another connection. (A
// session stream has the same bound: driver/agents.)
const maxAgentStreams = 1000

// startInputs starts the tasks that feed the loop: discovery of hosts and notices, the spot
// prices, and the fan-in of everything the job hears. The returned func releases what is not
// a task (the load ticker).
func (d *runner) startInputs() func() {
	hostsCh, noticeCh := make(chan []providers.Host), make(chan providers.Notice)
	in := inputs{hosts: hostsCh, notices: noticeCh}
	w := &discovery.Watcher{Provider: d.o.Provider, Interval: d.o.DiscoveryInterval, Timeout: d.o.DiscoveryTimeout, Logger: d.log, Poke: d.o.Rediscover}
	d.tasks.Go(func(ctx context.Context) {
		if err := w.Run(ctx, hostsCh); err != nil && ctx.Err() == nil {
			d.send(ctx, DiscoveryFailed{Now: time.Now(), Err: err})
		}
	})
	d.tasks.Go(func(ctx context.Context) { w.RunNotices(ctx, noticeCh) })
	d.tasks.Go(func(ctx context.Context) { d.o.Prices.Run(ctx, d.board.Types) })
	d.tasks.Go(func(ctx context.Context) { record(ctx, d.board, historyEvery) })
	if d.o.MaxCost > 0 {
		d.tasks.Go(d.watchBudget)
	}
	if c := d.o.Config.Capacity; c != nil && c.AgentTimeout > 0 && d.o.Agents != nil {
		d.tasks.Go(d.watchUnconnected)
	}
	if d.o.Agents != nil {
		in.agentNotices, in.agentFaults = d.o.Agents.Notices(), d.o.Agents.Faults()
	}
	stop := func() {}
	if d.loadAware() {
		t := time.NewTicker(loadEvery)
		in.loads, stop = t.C, t.Stop
	}
	d.tasks.Go(func(ctx context.Context) { d.fanIn(ctx, in) })
	return stop
}

// historyEvery is how often the status board records the job's progress and cost.
const historyEvery = time.Second

// record adds a point to the board's progress history every interval until ctx ends.
func record(ctx context.Context, b *StatusBoard, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			b.Record(now)
		}
	}
}

// loadAware reports whether the job places slots by load (--slot-policy loadaware), the
// only reader of the workers' step times and the agents' GPU busy fractions.
func (d *runner) loadAware() bool {
	return d.o.SlotPolicy != nil && d.o.SlotPolicy.Name == hosts.LoadAware
}

// fanIn turns what the job hears (discovery, notices, agents' faults, the workers' reports,
// the load ticker) into the machine's events, until ctx ends or the rendezvous closes.
func (d *runner) fanIn(ctx context.Context, in inputs) {
	for {
		var ev Event
		select {
		case <-ctx.Done():
			return
		case now := <-in.loads:
			l := LoadsMeasured{Now: now, StepTimes: d.srv.StepTimes()}
			if d.o.Agents != nil {
				l.GPUBusy = d.o.Agents.GPUBusy()
			}
			ev = l
		case hs := <-in.hosts:
			ev = HostsDiscovered{Now: time.Now(), Hosts: hs}
		case n := <-in.notices:
			ev = NoticeReceived{Now: time.Now(), Notice: n, Source: cmp.Or(d.o.ProviderName, "provider")}
		case n := <-in.agentNotices:
			ev = NoticeReceived{Now: time.Now(), Notice: n, Source: "agent"}
		case f := <-in.agentFaults:
			ev = SlotsFailed{Now: time.Now(), Host: f.HostID, Slots: f.Slots, Reason: f.Reason}
		case r, ok := <-d.srv.Events():
			if !ok {
				return
			}
			ev = WorkerReported{Now: r.At, Worker: r.Worker, Generation: r.Generation, State: r.State, Message: r.Message, Rollback: r.Rollback, SilentPeer: r.SilentPeer, Unreachable: r.Unreachable, Reached: r.Reached}
		}
		d.send(ctx, ev)
	}
}

// loop owns the machine until the job is done: it steps it with each event (a tick at its
// next deadline, the interrupt once) and hands out the actions, and returns how the job ended.
func (d *runner) loop(ctx context.Context) Result {
	var res Result
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	interrupted := ctx.Done()
	discovered := false // a discovery result was stepped since the last snapshot
	// The snapshot (and the save) costs as much as the job has workers: taken whenever the
	// loop has worked off what came in, it would take most of a large job's reset, whose
	// READY reports come in a trickle. So one is taken at most every snapEvery times what the
	// last one cost; one skipped is taken by snapLate, so the board is never behind by more.
	var snapAt time.Time
	var snapCost time.Duration
	var snapLate <-chan time.Time
	for !d.m.Done() && !res.Left {
		now := time.Now()
		if dl := d.m.NextDeadline(now); !dl.IsZero() {
			timer.Reset(max(dl.Sub(now), time.Millisecond))
		} else {
			timer.Reset(time.Hour)
		}
		var acts []Action
		select {
		case ev := <-d.events:
			_, isHosts := ev.(HostsDiscovered)
			discovered = discovered || isHosts
			acts = d.step(ev)
		case <-timer.C:
			acts = d.m.Step(Tick{Now: time.Now()})
		case <-interrupted:
			interrupted = nil
			acts = d.m.Step(Interrupted{Now: time.Now(), Reason: context.Cause(ctx).Error()})
		case reason := <-d.o.Stops:
			why := "stopped by the operator (elasticd ctl stop)"
			if reason != "" {
				why += ": " + reason
			}
			acts = d.m.Step(Interrupted{Now: time.Now(), Reason: why})
		case r := <-d.o.Releases:
			var n int
			n, acts = d.m.Release(time.Now(), r.Host)
			r.Reply <- n
		case <-d.o.Leave:
			res.Left, d.leaving = true, true // the save below is the last: with the whole journal
			res.Reason = fmt.Sprintf("the driver stopped; the job goes on: its agents keep the workers training for their --driver-timeout, and a driver started again on --state-dir %s (with the same --listen) takes them up", d.o.StateDir)
		case <-snapLate:
			snapLate = nil
		}
		for _, a := range acts {
			if f, ok := a.(Finish); ok {
				res.Code, res.Reason = f.Code, f.Reason
			}
			d.do(ctx, a)
		}
		// A burst of events (a reset's READY reports) is snapshotted once, when it has been
		// worked off: whenever the loop waits, the board holds the machine's current state.
		final := d.m.Done() || res.Left
		if len(d.events) == 0 || final {
			if wait := snapEvery*snapCost - time.Since(snapAt); wait > 0 && !final {
				if snapLate == nil {
					snapLate = time.After(wait)
				}
				continue
			}
			began := time.Now()
			d.board.store(d.m.Snapshot())
			if discovered { // the board knows the new hosts' types now: price them at once
				d.o.Prices.Wake()
				discovered = false
			}
			if !d.m.Done() {
				d.save(d.srv.HostsVersion(), false)
			}
			snapAt, snapLate = time.Now(), nil
			snapCost = snapAt.Sub(began)
		}
	}
	return res
}

// step steps the machine with ev. A launch's result first settles what the runner holds of
// it: a started process becomes the worker's (procs) before the machine hears of it.
func (d *runner) step(ev Event) []Action {
	switch e := ev.(type) {
	case procStarted:
		delete(d.launching, e.Worker)
		if d.procs[e.Worker] != nil { // one slot, one process (Machine.launchDone): cannot happen
			d.log.Error("a second process for one worker stopped", "worker", e.Worker.String(), "generation", e.Generation)
			d.stop(e.p, d.o.StopGrace)
			return nil
		}
		d.procs[e.Worker] = e.p
		ev = e.WorkerStarted
	case LaunchFailed:
		delete(d.launching, e.Worker)
	case WorkerExited: // the worker's process: a slot is launched again only after this
		delete(d.procs, e.Worker)
	}
	return d.m.Step(ev)
}

// shutdown ends the job: it records how it ended (the state kept for an interrupted job,
// removed for a finished one), stops every process and launch still under way, waits for every
// task, and closes the servers. Nothing outlives the job.
func (d *runner) shutdown(res *Result, stopServing func()) {
	if res.Left {
		d.leave(res, stopServing)
		return
	}
	if d.state != nil {
		if res.Code == ExitInterrupted { // its workers are being stopped: nothing to adopt
			d.save(d.srv.HostsVersion(), true)
		} else if err := d.state.remove(); err != nil {
			d.log.Warn("could not remove the finished job's state", "dir", d.o.StateDir, "err", err)
		}
	}
	d.summarize(res)
	for id, p := range d.procs {
		delete(d.procs, id)
		d.stop(p, d.o.StopGrace)
	}
	for _, cancel := range d.launching { // what they start regardless, drain stops
		cancel()
	}
	d.tasks.cancel()
	d.drain(true)
	d.finalCapacity(res)
	if c, ok := d.o.Launcher.(io.Closer); ok { // launch.Warm's spare interpreters
		defer c.Close()
	}
	d.srv.Close()
	if d.o.Agents != nil {
		d.o.Agents.Close() // ends the agents' long-polls, which would hold up Shutdown
	}
	stopServing()
}

// leave ends the driver and leaves the job running (Options.Leave): the state saved as the
// loop left it says where the job stands, and everything the job holds is let go of as a
// crash would let go of it, tidily: no worker stopped, no command sent to an agent, no group
// resized, no claim removed (a driver taken up on the state is the same claimant).
func (d *runner) leave(res *Result, stopServing func()) {
	d.summarize(res)
	d.log.Info("the driver leaves the job running: the agents keep its workers", "generation", d.m.Generation(), "workers", len(d.procs), "state_dir", d.o.StateDir)
	if d.o.Capacity != nil {
		d.log.Warn("the group keeps its size until a driver takes the job up again: if none does, the agents stop the workers after their --driver-timeout, but the instances bill on; end a job for good with elasticd ctl stop or SIGINT", "group", d.o.Config.Capacity.Group)
	}
	for _, cancel := range d.launching {
		cancel()
	}
	d.tasks.cancel()
	// The registry lets go of its sessions: the workers' waits end here (not on the hosts),
	// and the agents' long-polls end with "shutting down" (503), which an agent retries as it
	// would an unreachable driver, holding its workers.
	d.o.Agents.Close()
	d.drain(false) // a worker a launch started meanwhile is the agents' to keep
	d.srv.Close()
	stopServing()
}

// summarize puts the job's counts and last status, priced to now, in res.
func (d *runner) summarize(res *Result) {
	res.Generations, res.Resets, res.FailureResets = d.m.Generation(), d.m.Resets().All, d.m.Resets().Failures
	d.board.Record(time.Now()) // the end, which the ticker may not have caught
	res.Status = d.board.Current(time.Now())
}

// drain waits for every task while still consuming their events; with stopStarted, a process
// a launch started after the loop ended is stopped.
func (d *runner) drain(stopStarted bool) {
	done := make(chan struct{})
	go func() { d.tasks.Wait(); close(done) }() // drain waits for it
	for {
		select {
		case <-done:
			return
		case ev := <-d.events:
			if l, ok := ev.(procStarted); ok && stopStarted {
				d.stop(l.p, d.o.StopGrace)
			}
		}
	}
}

// send hands ev to the loop, or drops it when ctx ends first.
func (d *runner) send(ctx context.Context, ev Event) {
	select {
	case d.events <- ev:
	case <-ctx.Done():
	}
}

// do hands out one action. What may block runs as a task.
func (d *runner) do(ctx context.Context, a Action) {
	switch a := a.(type) {
	case Publish:
		for id, as := range a.Plan {
			d.ranks.Store(id, as.Rank)
		}
		d.save(d.srv.HostsVersion(), false) // before any worker can see the generation
		d.srv.Publish(a.Generation, a.Plan)
		d.published = a.Generation
	case NotifyHosts:
		d.save(d.srv.HostsVersion()+1, false) // before any worker can see the version
		d.srv.NotifyHostsUpdated()
	case CompleteNotice:
		if c, ok := d.o.Provider.(providers.NoticeCompleter); ok {
			d.tasks.Go(func(ctx context.Context) { d.completeNotice(ctx, c, a.Notice) })
		}
	case Abandon:
		// Best effort: the generation's store may already be gone.
		_ = allreduce.Abandon(ctx, d.srv.Store(a.Generation), a.Generation, a.Reason)
	case Launch:
		d.launch(ctx, a)
	case Stop:
		if cancel := d.launching[a.Worker]; cancel != nil {
			// No process yet: the launch is called off where the launcher can; a process it
			// starts regardless is stopped when it reports (Machine.launchDone).
			d.log.Info("stopping worker while it is being launched", "worker", a.Worker.String(), "reason", a.Reason)
			cancel()
			return
		}
		if p := d.procs[a.Worker]; p != nil {
			grace := d.o.StopGrace
			if !a.Deadline.IsZero() {
				grace = max(min(grace, time.Until(a.Deadline)), 0)
			}
			d.log.Info("stopping worker", "worker", a.Worker.String(), "reason", a.Reason, "grace", grace)
			delete(d.procs, a.Worker)
			d.stop(p, grace)
		}
	case Note:
		d.log.Info(a.Msg, a.Args...)
	case Warn:
		d.log.Warn(a.Msg, a.Args...)
	case Finish:
		d.log.Info("job finished", "code", a.Code, "reason", a.Reason)
	case ReadCapacity, SetCapacity, HandBack:
		d.steer(a)
	case GenerationReady:
		d.metrics.ObserveRendezvous(a.Latency)
		d.log.Info("rendezvous complete", "generation", a.Generation, "world_size", a.WorldSize, "took", a.Latency.Round(time.Millisecond))
	}
}

// restore takes the job up from its saved state (Options.Restore). With agents, the saved
// generation's workers kept running: each becomes a process of this driver that its agent
// hands over when it registers again (agents.Registry.Adopt), and the rendezvous takes up the
// generation as the workers know it. Otherwise they are gone, and the machine starts anew.
func (d *runner) restore(ctx context.Context, st *SavedState) {
	adopt := d.o.Agents != nil && !st.WorkersStopped && len(st.Workers) > 0
	acts := d.m.Restore(time.Now(), st, adopt, d.o.AdoptTimeout)
	if adopt {
		plan := map[protocol.WorkerID]protocol.Assignment{}
		for _, w := range st.Workers {
			id, _ := protocol.ParseWorkerID(w.Worker)
			plan[id] = w.Assignment
			d.ranks.Store(id, w.Assignment.Rank)
		}
		d.srv.Restore(st.Generation, plan, st.PlanHosts, st.HostsVersion,
			rendezvous.Progress{Generation: st.Generation, Step: st.Step, Committed: st.Committed, At: time.Now()})
		d.published = st.Generation
		if st.URL != d.url {
			d.log.Warn("the workers to adopt reach the driver at another address: they cannot report to this one; start it with the --listen (and --driver-addr) of the last", "workers_use", st.URL, "this_driver", d.url)
		}
		for _, w := range st.Workers {
			id, _ := protocol.ParseWorkerID(w.Worker)
			prefix := d.prefix(id)
			stdout := proc.NewPrefixWriterFunc(d.o.Stdout, prefix)
			stderr := proc.NewPrefixWriterFunc(d.o.Stderr, prefix)
			spec := proc.Spec{Name: fmt.Sprintf("rank %d (%s)", w.Assignment.Rank, id), Host: w.Addr, Slot: id.Slot, Stdout: stdout, Stderr: stderr}
			lp, adopted := d.o.Agents.Adopt(w.Worker, spec, d.o.AdoptTimeout)
			p := &running{p: lp, outs: []io.Closer{stdout, stderr}}
			d.procs[id] = p
			d.watchExit(id, p)
			d.tasks.Go(func(ctx context.Context) {
				select {
				case <-adopted:
					d.send(ctx, WorkerAdopted{Now: time.Now(), Worker: id})
				case <-ctx.Done():
				}
			})
		}
	}
	for _, a := range acts {
		d.do(ctx, a)
	}
}

// save writes the job's state to --state-dir (when set) if it changed; hostsVersion is the
// host-update version to record (the next one, when it is about to be announced).
// journalEvery is how often a save takes the journal and the progress history anew: they
// change with every event and every second, and a job of thousands of hosts would otherwise
// write them out as often. A crash loses at most this much of the status page's past.
const journalEvery = 10 * time.Second

func (d *runner) save(hostsVersion uint64, stopped bool) {
	if d.state == nil {
		return
	}
	st := d.m.Save(time.Now())
	st.JobID, st.URL, st.SecretFrom, st.SecretCheck = d.jobID, d.url, "random", secretCheck(d.secret)
	if d.o.Agents != nil {
		st.SecretFrom = "agents"
	}
	st.HostsVersion, st.WorkersStopped = hostsVersion, stopped
	if d.o.Operator != nil {
		st.OperatorAdded, st.OperatorStopped = d.o.Operator.Snapshot()
	}
	// At once when the job changed (a generation, a reset, the group), else every journalEvery.
	key := [4]uint64{st.Generation, uint64(st.Resets), uint64(len(st.Hosts)), hostsVersion}
	if now := time.Now(); stopped || d.leaving || key != d.journalKey || now.Sub(d.journalAt) >= journalEvery {
		d.journal, d.progress, d.journalAt, d.journalKey = d.m.SaveJournal(), d.board.hist.points(), now, key
	}
	st.Journal, st.Progress = d.journal, d.progress
	st.PlanHosts = d.srv.PlanHostsVersion()
	if st.Generation != d.published { // about to be published, with the current version
		st.PlanHosts = d.srv.HostsVersion()
	}
	p := d.srv.Progress()
	st.Step, st.Committed = p.Step, p.Committed
	if err := d.state.save(st); err != nil {
		d.log.Error("could not save the job's state; a restarted driver would not find it", "dir", d.o.StateDir, "err", err)
	}
}

// adminOrOff is the admin API, or an answer that it is off.
func adminOrOff(admin http.Handler) http.Handler {
	if admin != nil {
		return admin
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "the admin API is off: start elasticd run with --admin-secret-file", http.StatusNotFound)
	})
}

// statusHandler answers GET /v1/status: the job's status as JSON (docs/protocol.md §6). It
// is read-only and unauthenticated, like /metrics: it holds no secret.
func statusHandler(board *StatusBoard) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		state, offset, limit, err := statusPage(r.URL.Query())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s := board.Current(board.clock())
		if s == nil {
			http.Error(w, "the job has not started yet", http.StatusServiceUnavailable)
			return
		}
		if state != "" || offset > 0 || limit >= 0 {
			s = new(s.Page(state, offset, limit))
		}
		b, err := json.Marshal(s)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.Write(append(b, '\n'))
	})
}

// statusPage reads the page of hosts that GET /v1/status?state=&offset=&limit= asks for:
// limit -1 when not given (every host).
func statusPage(q url.Values) (state string, offset, limit int, err error) {
	state, limit = q.Get("state"), -1
	if state != "" && !slices.Contains(HostStates, state) {
		return "", 0, 0, fmt.Errorf("state=%q: want a host state, one of %s", state, strings.Join(HostStates, ", "))
	}
	for _, p := range []struct {
		name string
		v    *int
	}{{"offset", &offset}, {"limit", &limit}} {
		if v := q.Get(p.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return "", 0, 0, fmt.Errorf("%s=%q: want a number of hosts, 0 or more", p.name, v)
			}
			*p.v = n
		}
	}
	return state, offset, limit, nil
}

// OutboundIP is this machine's first non-loopback IPv4 address, or 127.0.0.1.
func OutboundIP() string {
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
				return n.IP.String()
			}
		}
	}
	return "127.0.0.1"
}
