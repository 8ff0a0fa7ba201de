// Package worker is the runtime inside each training process: it joins the job through the
// driver's rendezvous, builds the communicator for each generation, and runs the training
// loop so that failures and host changes become resets, not lost jobs.
package worker

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticd/elasticd/allreduce"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/worker/peerstate"
	"github.com/elasticd/elasticd/worker/rendezvous"
)

var (
	// ErrHostsUpdated is returned by State.Commit and State.Step when the ranks agreed that
	// the hosts changed: Run resets without restoring (the state is consistent).
	ErrHostsUpdated = errors.New("hosts updated")
	// ErrRemoved is returned by Run when this worker has no place in the next generation
	// (its host was removed); the process should exit 0.
	ErrRemoved = errors.New("worker removed from the job")
)

// Worker is one training process's membership in the job.
type Worker struct {
	id            protocol.WorkerID
	job           string
	client        *rendezvous.Client
	secret        []byte
	hostAddr      string
	commTimeout   time.Duration
	commTransport string
	loadEvery     time.Duration
	log           *slog.Logger
	badTransfer   sync.Once // ELASTICD_STATE_TRANSFER was not understood, and the log said so

	assign protocol.Assignment
	comm   *allreduce.Comm
	seen   uint64        // host-update version this generation already reflects
	latest atomic.Uint64 // newest host-update version the watcher has heard of

	onReset []func(ctx context.Context) error
	peers   *peerstate.Server // serves this worker's commit to joiners; nil until needed

	stopWatch context.CancelFunc
	watchDone chan struct{}
	loadDone  chan struct{}
	stepTime  atomic.Int64 // mean step time in nanoseconds (moving average), 0 before two steps
	closeOnce sync.Once

	// progress carries rank 0's step counts to the reporting goroutine (capacity 1: a report
	// still waiting is replaced by nothing newer until it is sent); lastProgress is when
	// Step last handed one over. last is the State's latest counts, for Close.
	progress     chan protocol.ProgressReport
	lastProgress time.Time
	last         protocol.ProgressReport
	// rollback is the work Restore threw away, told to the driver with the next READY.
	rollback protocol.Rollback
	// ckptDir and ckptEvery: Config.CheckpointDir and CheckpointEvery.
	ckptDir   string
	ckptEvery int
}

// progressEvery is how often rank 0 tells the driver how far training has got.
const progressEvery = time.Second

// Config is what a worker needs to join its job; the driver passes it in the environment
// (ConfigFromEnv).
type Config struct {
	Rendezvous  string            // base URL of the driver's rendezvous
	Secret      []byte            // per-job secret
	JobID       string            // for logs
	ID          protocol.WorkerID // stable worker ID
	Generation  uint64            // the generation the process was launched for (>= 1)
	HostAddr    string            // the address peers reach this host at
	CommTimeout time.Duration     // allreduce.Config.Timeout; default 30s
	// CommTransport is allreduce.Config.Transport: "" or "auto" (shared memory with ranks on
	// this machine), or "tcp".
	CommTransport string
	// CheckpointDir, when set, is where rank 0 writes its commit every CheckpointEvery
	// commits (default protocol.DefaultCheckpointEvery), and where a job that lost every worker resumes from.
	CheckpointDir   string
	CheckpointEvery int
	// DriverWait is how long a request to a driver that does not answer is retried
	// (rendezvous.Client.SetDriverWait); 0: a few quick retries.
	DriverWait time.Duration
	// LoadEvery is how often the worker tells the driver its mean step time (the input of
	// --slot-policy loadaware); default DefaultLoadEvery; negative: never.
	LoadEvery time.Duration
}

// DefaultLoadEvery is Config.LoadEvery when it is not given.
const DefaultLoadEvery = 5 * time.Second

// Validate reports the first missing or invalid field.
func (c Config) Validate() error {
	switch {
	case c.Rendezvous == "":
		return errors.New("worker: no rendezvous URL")
	case len(c.Secret) == 0:
		return errors.New("worker: no job secret")
	case c.ID.Host == "":
		return errors.New("worker: no worker ID")
	case c.Generation == 0:
		return errors.New("worker: generation must be >= 1")
	case c.HostAddr == "":
		return errors.New("worker: no host address")
	case c.CommTimeout < 0:
		return fmt.Errorf("worker: comm timeout %v: must be positive", c.CommTimeout)
	}
	return nil
}

// ConfigFromEnv reads the ELASTICD_* environment `elasticd run` gives every worker.
func ConfigFromEnv() (Config, error) {
	var errs []error
	get := func(k string) string {
		v := os.Getenv(k)
		if v == "" {
			errs = append(errs, fmt.Errorf("worker: %s is not set: run this program under `elasticd run`", k))
		}
		return v
	}
	url, secretHex, idText, genText, hostAddr := get(protocol.EnvRendezvous), get(protocol.EnvSecret), get(protocol.EnvWorkerID), get(protocol.EnvGeneration), get(protocol.EnvHostAddr)
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	cfg := Config{Rendezvous: url, JobID: os.Getenv(protocol.EnvJobID), HostAddr: hostAddr, CommTimeout: 30 * time.Second}
	var err error
	if cfg.Secret, err = hex.DecodeString(secretHex); err != nil {
		return Config{}, fmt.Errorf("worker: %s is not hex: %w", protocol.EnvSecret, err)
	}
	if cfg.ID, err = protocol.ParseWorkerID(idText); err != nil {
		return Config{}, fmt.Errorf("worker: %s: %w", protocol.EnvWorkerID, err)
	}
	if cfg.Generation, err = strconv.ParseUint(genText, 10, 64); err != nil || cfg.Generation == 0 {
		return Config{}, fmt.Errorf("worker: %s %q: want a generation number >= 1", protocol.EnvGeneration, genText)
	}
	if v := os.Getenv(protocol.EnvCommTimeout); v != "" {
		if cfg.CommTimeout, err = time.ParseDuration(v); err != nil || cfg.CommTimeout <= 0 {
			return Config{}, fmt.Errorf("worker: %s %q: want a positive duration like 30s", protocol.EnvCommTimeout, v)
		}
	}
	switch v := os.Getenv(protocol.EnvCommTransport); v {
	case "", allreduce.TransportAuto, allreduce.TransportTCP:
		cfg.CommTransport = v
	default:
		return Config{}, fmt.Errorf("worker: %s %q: want %s or %s", protocol.EnvCommTransport, v, allreduce.TransportAuto, allreduce.TransportTCP)
	}
	if v := os.Getenv(protocol.EnvDriverWait); v != "" {
		if cfg.DriverWait, err = time.ParseDuration(v); err != nil || cfg.DriverWait < 0 {
			return Config{}, fmt.Errorf("worker: %s %q: want a duration like 2m0s", protocol.EnvDriverWait, v)
		}
	}
	if v := os.Getenv(protocol.EnvLoadEvery); v != "" {
		if cfg.LoadEvery, err = time.ParseDuration(v); err != nil || cfg.LoadEvery < 0 {
			return Config{}, fmt.Errorf("worker: %s %q: want a duration like 5s, or 0s for no reports", protocol.EnvLoadEvery, v)
		}
		if cfg.LoadEvery == 0 {
			cfg.LoadEvery = -1 // the driver wants none
		}
	}
	cfg.CheckpointDir = os.Getenv(protocol.EnvCheckpointDir)
	if v := os.Getenv(protocol.EnvCheckpointEvery); v != "" {
		if cfg.CheckpointEvery, err = strconv.Atoi(v); err != nil || cfg.CheckpointEvery < 1 {
			return Config{}, fmt.Errorf("worker: %s %q: want a number of commits, at least 1", protocol.EnvCheckpointEvery, v)
		}
	}
	return cfg, nil
}

// Init joins the job from the environment the driver set (ConfigFromEnv, then New).
func Init(ctx context.Context, log *slog.Logger) (*Worker, error) {
	cfg, err := ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	return New(ctx, cfg, log)
}

// New joins the job: it registers, waits for this worker's assignment and builds the
// communicator. log may be nil.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.CommTimeout == 0 {
		cfg.CommTimeout = 30 * time.Second
	}
	w := &Worker{
		id: cfg.ID, job: cfg.JobID, secret: cfg.Secret, hostAddr: cfg.HostAddr, commTimeout: cfg.CommTimeout, commTransport: cfg.CommTransport,
		ckptDir: cfg.CheckpointDir, ckptEvery: cmp.Or(cfg.CheckpointEvery, protocol.DefaultCheckpointEvery),
		client:   rendezvous.NewClient(cfg.Rendezvous, cfg.Secret, cfg.ID, nil),
		log:      log.With("worker", cfg.ID.String()),
		progress: make(chan protocol.ProgressReport, 1), loadEvery: cmp.Or(cfg.LoadEvery, DefaultLoadEvery),
	}
	w.client.SetDriverWait(cfg.DriverWait)
	// Registering = READY for the generation before the one we were launched for.
	if err := w.join(ctx, cfg.Generation-1, protocol.ReadyReport{Message: "registering"}, nil); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.Background()) // owned by w: Close stops it
	w.stopWatch, w.watchDone, w.loadDone = cancel, make(chan struct{}), make(chan struct{})
	go w.watchHosts(wctx)
	go w.reportLoad(wctx)
	return w, nil
}

// join reports READY after generation `after` and builds the communicator of the next
// generation this worker is part of, skipping generations abandoned while it connected.
//
// prev is the communicator of the generation being left after a planned reset, whose healthy
// connections to members that are neighbours again are carried over (allreduce.Config.Previous);
// nil builds every connection afresh.
func (w *Worker) join(ctx context.Context, after uint64, why protocol.ReadyReport, prev *allreduce.Comm) error {
	for {
		why.Rollback = w.rollback
		if err := w.client.ReportReady(ctx, after, why); err != nil {
			return fmt.Errorf("worker %s: report ready: %w", w.id, err)
		}
		w.rollback = protocol.Rollback{}
		a, err := w.client.Assignment(ctx, after)
		if err != nil {
			return fmt.Errorf("worker %s: wait for an assignment after generation %d: %w", w.id, after, err)
		}
		if a.Removed {
			return ErrRemoved
		}
		comm, err := allreduce.New(ctx, allreduce.Config{
			Rank: a.Rank, Size: a.Size, Generation: a.Generation,
			Store:      w.client.Store(a.Generation),
			ListenAddr: net.JoinHostPort(w.hostAddr, "0"), AdvertiseHost: w.hostAddr,
			Timeout: w.commTimeout, Transport: w.commTransport, Secret: w.secret, Logger: w.log,
			ID: w.id.String(), Previous: prev,
		})
		if err == nil {
			w.assign, w.comm = a, comm
			w.seen = max(w.seen, a.HostsVersion)
			w.log.Info("joined generation", "generation", a.Generation, "rank", a.Rank, "world_size", a.Size,
				"shared_memory_peers", comm.Stats().SharedMemory)
			return nil
		}
		if !commError(err) || ctx.Err() != nil {
			return fmt.Errorf("worker %s: connect generation %d: %w", w.id, a.Generation, err)
		}
		w.log.Info("generation ended while connecting; asking for the next", "generation", a.Generation, "err", err)
		// A peer that never came within the timeout is hung, stopped or never started: say
		// so, and the driver fails it at once (its generation still current) instead of
		// waiting out --barrier-timeout for it.
		unreachable, reached := allreduce.Unreachable(err)
		after, why = a.Generation, protocol.ReadyReport{Message: err.Error(), Unreachable: unreachable, Reached: reached, SilentPeer: errors.Is(err, allreduce.ErrPeerSilent)}
	}
}

// watchHosts long-polls the driver's host-update version; Commit compares it with seen.
func (w *Worker) watchHosts(ctx context.Context) {
	defer close(w.watchDone)
	var v uint64
	failing := false // said once per outage: the driver may be away for a while (a restart)
	for ctx.Err() == nil {
		nv, err := w.client.HostsUpdated(ctx, v)
		if err != nil {
			if ctx.Err() == nil {
				if !failing {
					w.log.Warn("cannot reach the driver for host updates; training goes on, retrying every second", "err", err)
				}
				failing = true
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
			continue
		}
		if failing {
			w.log.Info("the driver answers again")
			failing = false
		}
		v = nv
		w.latest.Store(nv)
	}
}

// reportLoad sends the mean step time to the driver every Config.LoadEvery while it changes (an
// input of --slot-policy loadaware), and rank 0's progress as Step hands it over; failures
// are only logged: both are for display and advice, not state.
func (w *Worker) reportLoad(ctx context.Context) {
	defer close(w.loadDone)
	var tick <-chan time.Time // nil when the driver wants no step times: progress only
	if w.loadEvery > 0 {
		t := time.NewTicker(w.loadEvery)
		defer t.Stop()
		tick = t.C
	}
	var sent int64
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-w.progress:
			if err := w.client.ReportProgress(ctx, p); err != nil {
				w.log.Debug("could not report progress", "err", err)
			}
			continue
		case <-tick:
		}
		if st := w.stepTime.Load(); st > 0 && st != sent {
			if err := w.client.ReportLoad(ctx, time.Duration(st)); err != nil {
				w.log.Debug("could not report the step time", "err", err)
				continue
			}
			sent = st
		}
	}
}

// noteProgress records the State's step counts (and loss and total, when it has them); on
// rank 0 it hands them to the reporting goroutine at most once per progressEvery, without
// waiting for it.
func (w *Worker) noteProgress(now time.Time, p protocol.ProgressReport) {
	p.Generation = w.assign.Generation
	w.last = p
	if w.assign.Rank != 0 || now.Sub(w.lastProgress) < progressEvery {
		return
	}
	select {
	case w.progress <- p:
		w.lastProgress = now
	default: // the previous report is still on its way
	}
}

// observeStep folds the time since the previous step into the moving average.
func (w *Worker) observeStep(d time.Duration) {
	old := w.stepTime.Load()
	if old == 0 {
		w.stepTime.Store(int64(d))
		return
	}
	w.stepTime.Store(old + (int64(d)-old)/8)
}

// reset leaves the current generation and joins the next one.
func (w *Worker) reset(ctx context.Context, why error) error {
	old := w.assign.Generation
	// Tell ranks still connecting to this generation that it is over (best effort: the
	// driver may already have dropped it).
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_ = allreduce.Abandon(actx, w.client.Store(old), old, fmt.Sprintf("rank %d reset: %v", w.assign.Rank, why))
	cancel()
	// A peer that went silent is hung or stopped and will not reset: say so, and the driver
	// fails it at once instead of waiting out --barrier-timeout. Or the network cut it off:
	// the neighbours whose hosts answer a probe and those whose hosts do not are named, and
	// the driver keeps the members that reach each other.
	ready := protocol.ReadyReport{Message: why.Error(), SilentPeer: errors.Is(why, allreduce.ErrPeerSilent)}
	if ready.SilentPeer {
		ready.Unreachable, ready.Reached = w.comm.ProbeNeighbours(ctx)
		if len(ready.Unreachable) > 0 {
			w.log.Warn("the hosts of some peers do not answer: a network cut?", "generation", old, "ranks", ready.Unreachable)
		}
	}
	// A planned reset (hosts changed) leaves a healthy communicator: its connections to
	// members that stay neighbours are reused. After a failure the communicator is broken
	// and is closed at once, as its failure must reach every peer.
	var prev *allreduce.Comm
	if errors.Is(why, ErrHostsUpdated) {
		prev = w.comm
		defer prev.Close()
	} else {
		w.comm.Close()
	}
	w.comm = nil
	if err := w.join(ctx, old, ready, prev); err != nil {
		return err
	}
	for _, fn := range w.onReset {
		if err := fn(ctx); err != nil {
			return fmt.Errorf("reset callback: %w", err)
		}
	}
	return nil
}

// OnReset registers fn to run after every reset, once the new communicator is up (for
// example to scale the learning rate with the world size).
func (w *Worker) OnReset(fn func(ctx context.Context) error) { w.onReset = append(w.onReset, fn) }

// Comm is the communicator of the current generation.
func (w *Worker) Comm() *allreduce.Comm { return w.comm }

// Rank, Size, LocalRank, Generation describe this worker's place in the current generation.
func (w *Worker) Rank() int          { return w.assign.Rank }
func (w *Worker) Size() int          { return w.assign.Size }
func (w *Worker) LocalRank() int     { return w.assign.LocalRank }
func (w *Worker) Generation() uint64 { return w.assign.Generation }

// ID is this worker's stable identity.
func (w *Worker) ID() protocol.WorkerID { return w.id }

// Close reports how the worker ended (err nil = success), stops the host watcher and closes
// the communicator.
func (w *Worker) Close(ctx context.Context, err error) {
	w.closeOnce.Do(func() {
		st, msg := protocol.Success, ""
		if err != nil && !errors.Is(err, ErrRemoved) {
			st, msg = protocol.Failure, err.Error()
		}
		if err == nil || !errors.Is(err, ErrRemoved) {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if err == nil && w.assign.Rank == 0 && w.last.Step > 0 { // the last steps, which no tick sent
				w.last.Generation = w.assign.Generation
				if perr := w.client.ReportProgress(rctx, w.last); perr != nil {
					w.log.Debug("could not report progress", "err", perr)
				}
			}
			if rerr := w.client.Report(rctx, w.assign.Generation, st, msg); rerr != nil {
				w.log.Warn("could not report the end", "err", rerr)
			}
			cancel()
		}
		w.stopWatch()
		<-w.watchDone
		<-w.loadDone
		if w.comm != nil {
			w.comm.Close()
		}
		if w.peers != nil {
			w.peers.Close()
		}
		w.client.CloseIdleConnections()
	})
}

// commError reports whether err means the generation's communicator is broken.
func commError(err error) bool {
	return errors.Is(err, allreduce.ErrPeerLost) || errors.Is(err, allreduce.ErrProtocol) || errors.Is(err, allreduce.ErrClosed)
}
