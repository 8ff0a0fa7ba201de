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
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
	// Releases, when set, brings back quarantined (flapping) slots: the admin API sends one
	// when an operator adds a host that is already in the job (elasticd ctl add-host).
	Releases <-chan Release
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
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.StopGrace == 0 {
		o.StopGrace = 5 * time.Second
	}
	if o.CommTimeout == 0 {
		o.CommTimeout = 30 * time.Second
	}
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
	d := &runner{o: o, log: o.Logger, secret: secret, procs: map[protocol.WorkerID]*running{}, events: make(chan Event, 256)}
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
type Release struct {
	Host  string
	Reply chan<- int
}

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
	procs   map[protocol.WorkerID]*running
	ranks   sync.Map       // WorkerID -> current rank (int), for output prefixes
	wg      sync.WaitGroup // process watchers and stoppers
	// port is the MASTER_PORT of generation portGen, found on its rank 0's host.
	port    int
	portGen uint64
	state   *stateDir // --state-dir; nil without
	// published is the generation last published at the rendezvous (saved states of a newer
	// one carry the host-update version it will be published with).
	published uint64
}

// running is a worker process the runner started, with the writers of its output.
type running struct {
	p    proc.Process
	outs []io.Closer
}

func (d *runner) run(ctx context.Context) (Result, error) {
	srv, err := rendezvous.NewServer(rendezvous.ServerConfig{Secret: d.secret, Logger: d.log})
	if err != nil {
		return Result{}, err
	}
	d.srv = srv
	listen := cmp.Or(d.o.ListenAddr, "127.0.0.1:0")
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return Result{}, fmt.Errorf("rendezvous: listen on %s: %w", listen, err)
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
	d.board, d.metrics = board, NewMetrics(board)
	mux := http.NewServeMux()
	mux.Handle("/v1/", srv)
	var agentNotices <-chan providers.Notice
	var agentFaults <-chan agents.Fault
	if d.o.Agents != nil {
		mux.Handle(protocol.AgentPathPrefix, d.o.Agents)
		agentNotices, agentFaults = d.o.Agents.Notices(), d.o.Agents.Faults()
		defer d.o.Agents.Close()
	}
	mux.Handle("/v1/admin/", adminOrOff(d.o.Admin))
	mux.Handle("GET /v1/status", statusHandler(board))
	mux.Handle("GET /metrics", promhttp.HandlerFor(d.metrics.Registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelWarn)}))
	mux.Handle("/", webui.Handler())
	// A connection flood (the port listens on every interface with --launcher ssh or agent)
	// must not take the job's port: pending connections are capped and the idle ones closed
	// after ReadHeaderTimeout (internal/netguard).
	guard := netguard.New(ln, netguard.Config{Logger: d.log})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ConnState: guard.ConnState}
	serveDone := make(chan struct{})
	go func() { defer close(serveDone); hs.Serve(guard) }()
	d.log.Info("rendezvous listening", "addr", ln.Addr().String(), "advertised", adv)
	d.log.Info("live page at "+d.url+"/ (also /v1/status and /metrics)", "job", d.jobID)

	d.m = NewMachine(d.o.Config)
	wctx, stopWatch := context.WithCancel(ctx)
	var bg sync.WaitGroup
	if st := d.o.Restore; st != nil {
		d.restore(wctx, st, &bg)
	}
	board.store(d.m.Snapshot())
	watchErr := make(chan error, 1)
	hostsCh := make(chan []providers.Host)
	w := &discovery.Watcher{Provider: d.o.Provider, Interval: d.o.DiscoveryInterval, Timeout: d.o.DiscoveryTimeout, Logger: d.log, Poke: d.o.Rediscover}
	bg.Go(func() { watchErr <- w.Run(wctx, hostsCh) })
	noticeCh := make(chan providers.Notice)
	bg.Go(func() { w.RunNotices(wctx, noticeCh) })
	bg.Go(func() { d.o.Prices.Run(wctx, board.Types) })
	var loadTick <-chan time.Time // only loadaware reads the loads: no ticks without it
	if p := d.o.SlotPolicy; p != nil && p.Name == hosts.LoadAware {
		t := time.NewTicker(loadEvery)
		defer t.Stop()
		loadTick = t.C
	}
	bg.Go(func() {
		for {
			select {
			case <-wctx.Done():
				return
			case now := <-loadTick:
				ev := LoadsMeasured{Now: now, StepTimes: srv.StepTimes()}
				if d.o.Agents != nil {
					ev.GPUBusy = d.o.Agents.GPUBusy()
				}
				d.send(wctx, ev)
			case hs := <-hostsCh:
				d.send(wctx, HostsDiscovered{Now: time.Now(), Hosts: hs})
			case n := <-noticeCh:
				d.send(wctx, NoticeReceived{Now: time.Now(), Notice: n, Source: cmp.Or(d.o.ProviderName, "provider")})
			case n := <-agentNotices:
				d.send(wctx, NoticeReceived{Now: time.Now(), Notice: n, Source: "agent"})
			case f := <-agentFaults:
				d.send(wctx, SlotsFailed{Now: time.Now(), Host: f.HostID, Slots: f.Slots, Reason: f.Reason})
			case ev, ok := <-srv.Events():
				if !ok {
					return
				}
				d.send(wctx, WorkerReported{Now: ev.At, Worker: ev.Worker, Generation: ev.Generation, State: ev.State, Message: ev.Message, Rollback: ev.Rollback, SilentPeer: ev.SilentPeer})
			}
		}
	})

	var res Result
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	interrupted := ctx.Done()
	for !d.m.Done() {
		now := time.Now()
		if dl := d.m.NextDeadline(now); !dl.IsZero() {
			timer.Reset(max(dl.Sub(now), time.Millisecond))
		} else {
			timer.Reset(time.Hour)
		}
		var acts []Action
		select {
		case ev := <-d.events:
			acts = d.m.Step(ev)
		case <-timer.C:
			acts = d.m.Step(Tick{Now: time.Now()})
		case <-interrupted:
			interrupted = nil
			acts = d.m.Step(Interrupted{Now: time.Now(), Reason: context.Cause(ctx).Error()})
		case r := <-d.o.Releases:
			var n int
			n, acts = d.m.Release(time.Now(), r.Host)
			r.Reply <- n
		case err := <-watchErr:
			if err != nil && ctx.Err() == nil {
				acts = d.m.finish(ExitFailed, fmt.Sprintf("host discovery failed: %v", err))
			}
		}
		for _, a := range acts {
			if f, ok := a.(Finish); ok {
				res.Code, res.Reason = f.Code, f.Reason
			}
			d.do(ctx, a)
		}
		// A burst of events (a reset's READY reports) is snapshotted once, when it has been
		// worked off: whenever the loop waits, the board holds the machine's current state.
		if len(d.events) == 0 || d.m.Done() {
			board.store(d.m.Snapshot())
			if !d.m.Done() {
				d.save(srv.HostsVersion(), false)
			}
		}
	}
	if d.state != nil {
		if res.Code == ExitInterrupted { // its workers are being stopped: nothing to adopt
			d.save(srv.HostsVersion(), true)
		} else if err := d.state.remove(); err != nil {
			d.log.Warn("could not remove the finished job's state", "dir", d.o.StateDir, "err", err)
		}
	}
	res.Generations, res.Resets, res.FailureResets = d.m.Generation(), d.m.Resets, d.m.FailureResets
	res.Status = board.Current(time.Now())

	// Nothing outlives the job: stop what is still running and wait for every process.
	for id, p := range d.procs {
		d.stop(id, p, d.o.StopGrace)
	}
	if c, ok := d.o.Launcher.(io.Closer); ok { // launch.Warm's spare interpreters
		defer c.Close()
	}
	stopWatch()
	d.drain(&bg)
	srv.Close()
	if d.o.Agents != nil {
		d.o.Agents.Close() // ends the agents' long-polls, which would hold up Shutdown
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	hs.Shutdown(sctx)
	cancel()
	<-serveDone
	return res, nil
}

// drain waits for the background goroutines while still consuming their events.
func (d *runner) drain(bg *sync.WaitGroup) {
	done := make(chan struct{})
	go func() { d.wg.Wait(); bg.Wait(); close(done) }()
	for {
		select {
		case <-done:
			return
		case <-d.events:
		}
	}
}

func (d *runner) send(ctx context.Context, ev Event) {
	select {
	case d.events <- ev:
	case <-ctx.Done():
	}
}

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
			d.wg.Go(func() {
				cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := c.CompleteNotice(cctx, a.Notice); err != nil {
					d.log.Warn("could not complete the notice", "host", a.Notice.HostID, "notice", a.Notice.ID, "err", err)
					return
				}
				d.log.Info("notice completed: the host's workers are gone", "host", a.Notice.HostID, "notice", a.Notice.ID)
			})
		}
	case Abandon:
		// Best effort: the generation's store may already be gone.
		_ = allreduce.Abandon(ctx, d.srv.Store(a.Generation), a.Generation, a.Reason)
	case Launch:
		d.launch(ctx, a)
	case Stop:
		if p := d.procs[a.Worker]; p != nil {
			grace := d.o.StopGrace
			if !a.Deadline.IsZero() {
				grace = max(min(grace, time.Until(a.Deadline)), 0)
			}
			d.log.Info("stopping worker", "worker", a.Worker.String(), "reason", a.Reason, "grace", grace)
			d.stop(a.Worker, p, grace)
		}
	case Note:
		d.log.Info(a.Msg, a.Args...)
	case Finish:
		d.log.Info("job finished", "code", a.Code, "reason", a.Reason)
	case GenerationReady:
		d.metrics.ObserveRendezvous(a.Latency)
		d.log.Info("rendezvous complete", "generation", a.Generation, "world_size", a.WorldSize, "took", a.Latency.Round(time.Millisecond))
	}
}

func (d *runner) stop(id protocol.WorkerID, p *running, grace time.Duration) {
	delete(d.procs, id)
	d.wg.Go(func() { p.p.Stop(grace) })
}

func (d *runner) launch(ctx context.Context, a Launch) {
	as := a.Assignment
	env := append(append([]string{}, d.o.Env...),
		protocol.EnvRendezvous+"="+d.url,
		protocol.EnvSecret+"="+hex.EncodeToString(d.secret),
		protocol.EnvJobID+"="+d.jobID,
		protocol.EnvWorkerID+"="+a.Worker.String(),
		protocol.EnvGeneration+"="+strconv.FormatUint(a.Generation, 10),
		protocol.EnvHostAddr+"="+a.Addr,
		protocol.EnvCommTimeout+"="+d.o.CommTimeout.String(),
		// The conventional names, so unmodified scripts find their place (at launch).
		"RANK="+strconv.Itoa(as.Rank), "WORLD_SIZE="+strconv.Itoa(as.Size),
		"LOCAL_RANK="+strconv.Itoa(as.LocalRank), "LOCAL_WORLD_SIZE="+strconv.Itoa(as.LocalSize),
		"GROUP_RANK="+strconv.Itoa(a.Group), "GROUP_WORLD_SIZE="+strconv.Itoa(a.Groups),
		"ROLE_RANK="+strconv.Itoa(as.Rank), "ROLE_WORLD_SIZE="+strconv.Itoa(as.Size), "ROLE_NAME=default",
		"MASTER_ADDR="+a.MasterAddr, "MASTER_PORT="+strconv.Itoa(d.masterPort(ctx, a)),
		"TORCHELASTIC_RESTART_COUNT="+strconv.Itoa(a.Restarts),
		"TORCHELASTIC_MAX_RESTARTS="+strconv.Itoa(cmp.Or(d.o.ResetLimit, math.MaxInt32)),
		"TORCHELASTIC_RUN_ID="+d.jobID, "TORCHELASTIC_USE_AGENT_STORE=False",
		// A process that dies on an NCCL error ends in a restart; one that hangs in NCCL waits
		// for ever (torchrun sets it too; torch < 2.2 reads the old name).
		"TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "NCCL_ASYNC_ERROR_HANDLING=1",
		"HOROVOD_RANK="+strconv.Itoa(as.Rank), "HOROVOD_SIZE="+strconv.Itoa(as.Size),
		"HOROVOD_LOCAL_RANK="+strconv.Itoa(as.LocalRank), "HOROVOD_LOCAL_SIZE="+strconv.Itoa(as.LocalSize),
		"HOROVOD_CROSS_RANK="+strconv.Itoa(as.CrossRank), "HOROVOD_CROSS_SIZE="+strconv.Itoa(as.CrossSize),
		"HOROVOD_HOSTNAME="+a.Addr, "HOROVOD_ELASTIC=1", "PYTHONUNBUFFERED=1",
	)
	if d.o.CheckpointDir != "" {
		env = append(env, protocol.EnvCheckpointDir+"="+d.o.CheckpointDir, protocol.EnvCheckpointEvery+"="+strconv.Itoa(cmp.Or(d.o.CheckpointEvery, protocol.DefaultCheckpointEvery)))
	}
	// As torchrun: several processes on one host each get one OpenMP thread, unless the
	// user chose a number.
	if _, set := d.lookupEnv("OMP_NUM_THREADS"); !set && as.LocalSize > 1 {
		env = append(env, "OMP_NUM_THREADS=1")
	}
	prefix := d.prefix(a.Worker)
	stdout := proc.NewPrefixWriterFunc(d.o.Stdout, prefix)
	stderr := proc.NewPrefixWriterFunc(d.o.Stderr, prefix)
	p := &running{outs: []io.Closer{stdout, stderr}}
	var out, errw io.Writer = stdout, stderr
	if d.o.OutputDir != "" {
		fo, fe, err := d.outputFiles(a)
		if err != nil {
			d.log.Error("cannot write worker output files", "worker", a.Worker.String(), "err", err)
		} else {
			out, errw = io.MultiWriter(stdout, fo), io.MultiWriter(stderr, fe)
			p.outs = append(p.outs, fo, fe)
		}
	}
	spec := proc.Spec{
		Name: fmt.Sprintf("rank %d (%s)", as.Rank, a.Worker), Host: a.Addr, Slot: a.Worker.Slot,
		Command: d.o.Command, Env: env, Dir: d.o.Dir, Stdout: out, Stderr: errw,
	}
	lp, err := d.o.Launcher.Start(ctx, spec)
	if err != nil {
		d.log.Error("launch failed", "worker", a.Worker.String(), "err", err)
		fmt.Fprintf(d.o.Stderr, "%slaunch failed: %v\n", prefix(), err)
		closeAll(p.outs)
		go d.send(context.Background(), WorkerExited{Now: time.Now(), Worker: a.Worker, Code: 127})
		return
	}
	p.p = lp
	if pid := lp.PID(); pid != 0 {
		d.log.Info("launched worker", "worker", a.Worker.String(), "rank", as.Rank, "generation", a.Generation, "pid", pid)
	} else { // the agent launcher: the agent logs the PID on its host
		d.log.Info("launched worker", "worker", a.Worker.String(), "rank", as.Rank, "generation", a.Generation, "host", a.Addr)
	}
	d.watch(a.Worker, p)
}

// watch makes p the process of worker id and reports its exit to the loop.
func (d *runner) watch(id protocol.WorkerID, p *running) {
	d.procs[id] = p
	d.wg.Go(func() {
		st, err := p.p.Wait()
		closeAll(p.outs)
		ev := WorkerExited{Now: time.Now(), Worker: id, Code: st.Code, Signal: st.Signal, Progress: d.srv.Progress()}
		if err != nil && st.Code == 0 && st.Signal == "" {
			ev.Code = -1
			ev.Signal = err.Error()
		}
		d.events <- ev // the loop or drain always reads
	})
}

// prefix is the prefix of worker id's output lines: its current rank.
func (d *runner) prefix(id protocol.WorkerID) func() string {
	return func() string {
		if r, ok := d.ranks.Load(id); ok {
			return fmt.Sprintf("[%d] ", r.(int))
		}
		return "[" + id.String() + "] "
	}
}

// restore takes the job up from its saved state (Options.Restore). With agents, the saved
// generation's workers kept running: each becomes a process of this driver that its agent
// hands over when it registers again (agents.Registry.Adopt), and the rendezvous takes up the
// generation as the workers know it. Otherwise they are gone, and the machine starts anew.
func (d *runner) restore(ctx context.Context, st *SavedState, bg *sync.WaitGroup) {
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
			d.watch(id, &running{p: lp, outs: []io.Closer{stdout, stderr}})
			bg.Go(func() {
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

// masterPort is the MASTER_PORT of a's generation: a port free on rank 0's host, found there
// once per generation (launch.PortFinder); a random one where the launcher cannot look, and
// in-process, where workers bootstrap through the rendezvous and a look would only delay
// the launch.
func (d *runner) masterPort(ctx context.Context, a Launch) int {
	if d.portGen == a.Generation {
		return d.port
	}
	d.portGen = a.Generation
	if f, ok := d.o.Launcher.(proc.PortFinder); ok && !a.InProcess {
		port, err := f.FreePort(ctx, a.MasterAddr)
		if err == nil {
			d.port = port
			return port
		}
		d.log.Warn("could not find a free MASTER_PORT on rank 0's host; using a random one", "host", a.MasterAddr, "err", err)
	}
	d.port = 20000 + mrand.IntN(12768)
	return d.port
}

// lookupEnv finds a variable in what workers inherit: Options.Env, then the driver's own
// environment (which the local launcher passes on).
func (d *runner) lookupEnv(key string) (string, bool) {
	for i := len(d.o.Env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(d.o.Env[i], "="); ok && k == key {
			return v, true
		}
	}
	return os.LookupEnv(key)
}

// outputFiles opens DIR/<worker>/gen-<g>.stdout and .stderr for a process launched in
// generation g (a process that survives resets keeps writing to its launch files).
func (d *runner) outputFiles(a Launch) (io.WriteCloser, io.WriteCloser, error) {
	dir := filepath.Join(d.o.OutputDir, strings.NewReplacer("/", "_", ":", "_").Replace(a.Worker.String()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	base := filepath.Join(dir, fmt.Sprintf("gen-%d", a.Generation))
	fo, err := os.Create(base + ".stdout")
	if err != nil {
		return nil, nil, err
	}
	fe, err := os.Create(base + ".stderr")
	if err != nil {
		fo.Close()
		return nil, nil, err
	}
	return fo, fe, nil
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
		s := board.Current(board.clock())
		if s == nil {
			http.Error(w, "the job has not started yet", http.StatusServiceUnavailable)
			return
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

func closeAll(cs []io.Closer) {
	for _, c := range cs {
		c.Close()
	}
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
