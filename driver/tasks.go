package driver

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/elasticd/elasticd/proc"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

// tasks owns the runner's goroutines besides the loop: launches, stops, process watchers,
// notice completions, discovery and the fan-in. Each reports to the loop with an event; ctx
// ends when the job does (cancel), and Wait returns once every task has.
type tasks struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newTasks(parent context.Context) *tasks {
	ctx, cancel := context.WithCancel(parent)
	return &tasks{ctx: ctx, cancel: cancel}
}

// Go runs f as a task with the tasks' context.
func (t *tasks) Go(f func(ctx context.Context)) { t.wg.Go(func() { f(t.ctx) }) }

// Wait waits for every task.
func (t *tasks) Wait() { t.wg.Wait() }

// Later counts a task that a callback will run (a process's exit): Wait waits for it as for
// any other. The returned func runs f as that task; it must be called exactly once.
func (t *tasks) Later() func(f func(ctx context.Context)) {
	t.wg.Add(1)
	return func(f func(context.Context)) {
		defer t.wg.Done()
		f(t.ctx)
	}
}

// running is a started worker process and what it writes to.
type running struct {
	p    proc.Process
	outs []io.Closer
	// cancel ends the context the process was launched with, which the launcher watches for
	// the process's whole life (a cancel stops it): called once it has exited.
	cancel context.CancelFunc
}

// procStarted is a launch's success as it reaches the loop: the event for the machine, and
// the process for the runner (runner.step).
type procStarted struct {
	WorkerStarted
	p *running
}

// launch starts a's process as a task, so that a slow launcher (ssh waits for its wrapper)
// holds up nothing else. The result comes back as procStarted or LaunchFailed; a Stop meanwhile
// cancels the launch's context (runner.do).
func (d *runner) launch(ctx context.Context, a Launch) {
	lctx, cancel := context.WithCancel(ctx)
	d.launching[a.Worker] = cancel
	if d.port == nil || d.port.gen != a.Generation {
		d.port = &masterPort{gen: a.Generation}
	}
	port := d.port
	d.tasks.Go(func(context.Context) {
		p, err := d.start(lctx, a, port)
		if err != nil {
			cancel()
			d.events <- LaunchFailed{Now: time.Now(), Worker: a.Worker, Generation: a.Generation, Err: err} // the loop or drain always reads
			return
		}
		p.cancel = cancel
		// Sent before the watcher starts, so that the loop hears of the start before the exit.
		d.events <- procStarted{WorkerStarted{Now: time.Now(), Worker: a.Worker, Generation: a.Generation}, p}
		d.watchExit(a.Worker, p)
	})
}

// watchExit has the exit of worker id's process p reported to the loop: as a task once it
// exits, for a process that says so (proc.ExitNotifier: no goroutine per worker while it
// runs), else as a task that waits for it.
func (d *runner) watchExit(id protocol.WorkerID, p *running) {
	if n, ok := p.p.(proc.ExitNotifier); ok {
		run := d.tasks.Later()
		n.OnExit(func() { run(func(context.Context) { d.watch(id, p) }) })
		return
	}
	d.tasks.Go(func(context.Context) { d.watch(id, p) })
}

// start launches a's process with its environment and output (a task: it may block).
func (d *runner) start(ctx context.Context, a Launch, port *masterPort) (*running, error) {
	as := a.Assignment
	env := append(append([]string{}, d.o.Env...),
		protocol.EnvRendezvous+"="+d.url,
		protocol.EnvSecret+"="+hex.EncodeToString(d.secret),
		protocol.EnvJobID+"="+d.jobID,
		protocol.EnvWorkerID+"="+a.Worker.String(),
		protocol.EnvGeneration+"="+strconv.FormatUint(a.Generation, 10),
		protocol.EnvHostAddr+"="+a.Addr,
		protocol.EnvCommTimeout+"="+d.o.CommTimeout.String(),
		protocol.EnvCommTransport+"="+d.o.CommTransport,
		// The conventional names, so unmodified scripts find their place (at launch).
		"RANK="+strconv.Itoa(as.Rank), "WORLD_SIZE="+strconv.Itoa(as.Size),
		"LOCAL_RANK="+strconv.Itoa(as.LocalRank), "LOCAL_WORLD_SIZE="+strconv.Itoa(as.LocalSize),
		"GROUP_RANK="+strconv.Itoa(a.Group), "GROUP_WORLD_SIZE="+strconv.Itoa(a.Groups),
		"ROLE_RANK="+strconv.Itoa(as.Rank), "ROLE_WORLD_SIZE="+strconv.Itoa(as.Size), "ROLE_NAME=default",
		"MASTER_ADDR="+a.MasterAddr, "MASTER_PORT="+strconv.Itoa(port.get(ctx, d, a)),
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
	if !d.loadAware() { // nothing reads the workers' step times: spare the driver their reports
		env = append(env, protocol.EnvLoadEvery+"=0s")
	}
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
	if err != nil && ctx.Err() != nil { // called off: its worker was stopped, or the job ended
		d.log.Info("launch called off", "worker", a.Worker.String(), "err", err)
		closeAll(p.outs)
		return nil, err
	}
	if err != nil {
		d.log.Error("launch failed", "worker", a.Worker.String(), "err", err)
		fmt.Fprintf(d.o.Stderr, "%slaunch failed: %v\n", prefix(), err)
		closeAll(p.outs)
		return nil, err
	}
	p.p = lp
	level := d.launchLogs.level(a.Generation, d.log)
	if pid := lp.PID(); pid != 0 {
		d.log.Log(ctx, level, "launched worker", "worker", a.Worker.String(), "rank", as.Rank, "generation", a.Generation, "pid", pid)
	} else { // the agent launcher: the agent logs the PID on its host
		d.log.Log(ctx, level, "launched worker", "worker", a.Worker.String(), "rank", as.Rank, "generation", a.Generation, "host", a.Addr)
	}
	return p, nil
}

// launchLogsListed is how many launches of one generation the log lists at info level; the
// rest are at debug. A fleet of thousands of hosts launches tens of thousands of workers at
// once, and a line each buries the rest of the log (and costs the driver a write each).
const launchLogsListed = 64

// launchLogs counts the launches logged per generation.
type launchLogs struct {
	mu  sync.Mutex
	gen uint64
	n   int
}

// level is the level to log generation gen's next launch at, saying once, at the first launch
// past launchLogsListed, that the others are at debug.
func (l *launchLogs) level(gen uint64, log *slog.Logger) slog.Level {
	l.mu.Lock()
	if gen != l.gen {
		l.gen, l.n = gen, 0
	}
	l.n++
	n := l.n
	l.mu.Unlock()
	switch {
	case n <= launchLogsListed:
		return slog.LevelInfo
	case n == launchLogsListed+1:
		log.Info(fmt.Sprintf("more workers of generation %d launched: past %d, each is logged only with --verbose; the status counts them all", gen, launchLogsListed), "generation", gen)
	}
	return slog.LevelDebug
}

// watch waits for worker id's process p to exit and reports it to the loop (a task).
func (d *runner) watch(id protocol.WorkerID, p *running) {
	st, err := p.p.Wait()
	closeAll(p.outs)
	if p.cancel != nil {
		p.cancel()
	}
	ev := WorkerExited{Now: time.Now(), Worker: id, Code: st.Code, Signal: st.Signal, Progress: d.srv.Progress()}
	if err != nil && st.Code == 0 && st.Signal == "" {
		ev.Code = -1
		ev.Signal = err.Error()
	}
	d.events <- ev // the loop or drain always reads
}

// stop stops p (SIGTERM, SIGKILL after grace) as a task; its watcher reports the exit.
func (d *runner) stop(p *running, grace time.Duration) {
	d.tasks.Go(func(context.Context) { p.p.Stop(grace) })
}

// completeNotice answers a notice whose host's workers are gone (a task: the cloud's API). A
// completion begun is seen through, within its own bound, even as the job ends: an ASG
// lifecycle hook left unanswered holds the instance until its heartbeat times out.
func (d *runner) completeNotice(ctx context.Context, c providers.NoticeCompleter, n providers.Notice) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := c.CompleteNotice(cctx, n); err != nil {
		d.log.Warn("could not complete the notice", "host", n.HostID, "notice", n.ID, "err", err)
		return
	}
	d.log.Info("notice completed: the host's workers are gone", "host", n.HostID, "notice", n.ID)
}

// masterPort is the MASTER_PORT of generation gen: a port free on rank 0's host, found there
// once per generation, by whichever of its launches asks first (proc.PortFinder); a random
// one where the launcher cannot look, and in-process, where workers bootstrap through the
// rendezvous and a look would only delay the launch.
type masterPort struct {
	gen  uint64
	once sync.Once
	port int
}

func (mp *masterPort) get(ctx context.Context, d *runner, a Launch) int {
	mp.once.Do(func() {
		if f, ok := d.o.Launcher.(proc.PortFinder); ok && !a.InProcess {
			port, err := f.FreePort(ctx, a.MasterAddr)
			if err == nil {
				mp.port = port
				return
			}
			d.log.Warn("could not find a free MASTER_PORT on rank 0's host; using a random one", "host", a.MasterAddr, "err", err)
		}
		mp.port = 20000 + mrand.IntN(12768)
	})
	return mp.port
}

func (d *runner) prefix(id protocol.WorkerID) func() string {
	return func() string {
		if r, ok := d.ranks.Load(id); ok {
			return fmt.Sprintf("[%d] ", r.(int))
		}
		return "[" + id.String() + "] "
	}
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

func closeAll(cs []io.Closer) {
	for _, c := range cs {
		c.Close()
	}
}

// capacityCallTimeout bounds one capacity call (the provider's loop retries within it): long
// enough for a cloud that answers once the change is done (an Azure operation, a GCP resize).
const capacityCallTimeout = 10 * time.Minute

// steer makes a fleet call (--manage-capacity) as a task that reports back; the job's final
// sizes are kept for shutdown, which makes them once the workers are stopped.
func (d *runner) steer(a Action) {
	group := func(fallback bool) (providers.Capacity, string) {
		if fallback {
			return d.o.Fallback, d.o.Config.Capacity.Fallback.Group
		}
		return d.o.Capacity, d.o.Config.Capacity.Group
	}
	switch a := a.(type) {
	case ReadCapacity:
		c, _ := group(a.Fallback)
		d.tasks.Go(func(ctx context.Context) {
			cctx, cancel := context.WithTimeout(ctx, capacityCallTimeout)
			defer cancel()
			ev := CapacityRead{Fallback: a.Fallback}
			ev.Size, ev.Err = c.GroupSize(cctx)
			if ev.Err == nil {
				// Another driver's claim reads as a refusal: the machine stops steering.
				ev.Err = d.refreshClaim(cctx, a.Fallback)
			}
			if ev.Err == nil && a.Failures {
				// Without them the fallback cannot tell a stockout; the size read stands.
				fs, err := c.LaunchFailures(cctx)
				if err != nil {
					d.log.Warn("could not read the group's launch failures", "err", err)
				}
				ev.Failures = fs
			}
			ev.Now = time.Now()
			d.send(ctx, ev)
		})
	case SetCapacity:
		if a.Final {
			d.final = append(d.final, a)
			return
		}
		c, name := group(a.Fallback)
		d.log.Info("setting the group's desired size", "group", name, "from", a.From, "to", a.To, "reason", a.Reason)
		d.tasks.Go(func(ctx context.Context) {
			cctx, cancel := context.WithTimeout(ctx, capacityCallTimeout)
			defer cancel()
			err := c.SetDesired(cctx, a.To)
			d.send(ctx, CapacitySet{Now: time.Now(), Fallback: a.Fallback, From: a.From, To: a.To, Err: err})
		})
	case HandBack:
		c, name := group(a.Fallback)
		d.log.Warn("handing a host back to the cloud for a replacement", "group", name, "host", a.Host, "reason", a.Reason)
		d.tasks.Go(func(ctx context.Context) {
			// Seen through as the job ends: the instance is useless, and paid for.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), capacityCallTimeout)
			defer cancel()
			err := c.Replace(cctx, a.Host)
			d.send(ctx, HostHandedBack{Now: time.Now(), Host: a.Host, Err: err})
		})
	}
}

// finalCapacity sets the groups' sizes for the job's end (zero: nothing bills after it), now
// that no worker runs, and says so in the job's result; then it releases the groups' claims.
// Bounded, whatever ended the job.
func (d *runner) finalCapacity(res *Result) {
	defer d.releaseClaims()
	for _, a := range d.final {
		c, group := d.o.Capacity, d.o.Config.Capacity.Group
		if a.Fallback {
			c, group = d.o.Fallback, d.o.Config.Capacity.Fallback.Group
		}
		ctx, cancel := context.WithTimeout(context.Background(), capacityCallTimeout)
		d.log.Info("the job ended: setting the group's desired size", "group", group, "from", a.From, "to", a.To)
		err := c.SetDesired(ctx, a.To)
		cancel()
		if err != nil {
			d.log.Error("the job ended, but the group could not be scaled down: set its desired size yourself, or it keeps billing", "group", group, "desired", a.From, "err", err)
		} else {
			d.log.Info("group scaled down for the job's end", "group", group, "from", a.From, "to", a.To)
		}
		cs := res.Status.Capacity
		if cs == nil {
			continue
		}
		change := fmt.Sprintf("%d → %d", a.From, a.To)
		final := change
		if err != nil {
			final = fmt.Sprintf("left at %d: could not set its desired size to %d (%v); set it yourself, or it keeps billing", a.From, a.To, err)
		}
		if a.Fallback {
			if fb := cs.Fallback; fb != nil {
				fb.Final = final
				if err == nil {
					fb.Desired, fb.Changes = a.To, append(fb.Changes, change)
				}
			}
			continue
		}
		cs.Final = final
		if err == nil {
			cs.Desired, cs.Min = a.To, min(cs.Min, a.To)
			cs.Changes = append(cs.Changes, change)
		}
	}
}

// budgetEvery is how often the cost is compared with --max-cost.
const budgetEvery = 2 * time.Second

// watchBudget tells the machine when the job's cost would pass --max-cost before the next
// look and the workers' stop (at the rate it grew since the last look), or when some of the
// hosts' time has no price, which makes the budget impossible to keep. It returns once it
// has told, or when ctx ends.
func (d *runner) watchBudget(ctx context.Context) {
	t := time.NewTicker(budgetEvery)
	defer t.Stop()
	var prev float64
	var prevAt time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s := d.board.current(now)
			if s == nil || s.Cost == nil {
				continue
			}
			c := s.Cost
			var unpriced []string
			for _, u := range c.Unpriced {
				if !strings.Contains(u, "for the savings") {
					unpriced = append(unpriced, u)
				}
			}
			if len(unpriced) > 0 {
				d.send(ctx, BudgetUnpriced{Now: now, Types: unpriced})
				return
			}
			rate := 0.0 // per second
			if !prevAt.IsZero() && now.After(prevAt) {
				rate = max(c.Total-prev, 0) / now.Sub(prevAt).Seconds()
			}
			ahead := c.Total + rate*(2*budgetEvery+d.o.StopGrace).Seconds()
			if ahead >= d.o.MaxCost {
				d.send(ctx, BudgetReached{Now: now, Spent: c.Total, Max: d.o.MaxCost, Currency: c.Currency})
				return
			}
			prev, prevAt = c.Total, now
		}
	}
}

// unconnectedEvery is how often the hosts without an agent are looked at.
const unconnectedEvery = 10 * time.Second

// watchUnconnected reports the hosts listed for longer than --agent-timeout with no agent
// connected for them (--manage-capacity hands them back). Each is reported once.
func (d *runner) watchUnconnected(ctx context.Context) {
	t := time.NewTicker(unconnectedEvery)
	defer t.Stop()
	told := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, u := range d.o.Agents.Unconnected(d.o.Config.Capacity.AgentTimeout, now) {
				if told[u.Host.ID] {
					continue
				}
				told[u.Host.ID] = true
				d.send(ctx, HostUnusable{Now: now, Host: u.Host.ID, Fallback: u.Host.Fallback,
					Reason: fmt.Sprintf("listed since %s, its agent never connected within --agent-timeout %v (a bad image, a failed cloud-init, a firewall?)", u.Since.Format("15:04:05"), d.o.Config.Capacity.AgentTimeout)})
			}
		}
	}
}

// heldClaim is this driver's claim on one group (providers.Claimer). Refreshes run in the
// group's read tasks, one at a time (the machine reads a group once its last read is done),
// and the release after every task; mu guards the little they share.
type heldClaim struct {
	c     providers.Claimer
	claim providers.GroupClaim
	group string

	mu sync.Mutex
	// refused: the cloud refused a refresh (a permission); no more are made. lost: another
	// driver holds the group; neither refreshed nor released.
	refused, lost bool
}

// newHeldClaim is the claim taken on c before Run, or nil when none was (or c cannot hold one).
func newHeldClaim(c providers.Capacity, claim *providers.GroupClaim, cfg *CapacityConfig, fallback bool) *heldClaim {
	cl, ok := c.(providers.Claimer)
	if !ok || claim == nil || cfg == nil {
		return nil
	}
	group := cfg.Group
	if fallback && cfg.Fallback != nil {
		group = cfg.Fallback.Group
	}
	return &heldClaim{c: cl, claim: *claim, group: group}
}

// refreshClaim refreshes the claim on the group just read (a task). It returns an error only
// when another driver holds the group now (this one's claim lapsed, or the two raced at
// start): a refusal, which ends the steering without a fight, and without the job's final
// zero. A refresh that fails otherwise is said, and tried again at the next read; one the
// cloud refuses is said once, and not tried again.
func (d *runner) refreshClaim(ctx context.Context, fallback bool) error {
	h := d.claims[0]
	if fallback {
		h = d.claims[1]
	}
	if h == nil {
		return nil
	}
	h.mu.Lock()
	stopped, c := h.refused || h.lost, h.claim
	h.mu.Unlock()
	if stopped {
		return nil
	}
	c.At = time.Now()
	held, err := h.c.Claim(ctx, c)
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err != nil && errors.Is(err, providers.ErrRefused):
		h.refused = true
		d.log.Warn("could not refresh the group's claim: once it lapses, another driver would not learn of this one; the job goes on", "group", h.group, "lapses", c.At.Add(providers.ClaimLapse).Format(time.RFC3339), "err", err)
	case err != nil:
		d.log.Warn("could not refresh the group's claim; trying again at the next check", "group", h.group, "err", err)
	case held != nil:
		h.lost = true
		return providers.Refused("steer the group", "", fmt.Errorf("%w: %s holds it now (this driver's claim lapsed, or the two started together): this driver leaves the group to it", providers.ErrClaimed, held))
	default:
		h.claim = c
	}
	return nil
}

// releaseClaims removes this driver's claims at the job's end, each bounded: a group another
// driver holds now is left alone.
func (d *runner) releaseClaims() {
	for _, h := range d.claims {
		if h == nil {
			continue
		}
		h.mu.Lock()
		lost, c := h.lost, h.claim
		h.mu.Unlock()
		if lost {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := h.c.Unclaim(ctx, c.Owner)
		cancel()
		if err != nil {
			d.log.Warn("could not remove the group's claim: it lapses on its own", "group", h.group, "tag", providers.ClaimTagKey, "lapses", c.Lapses().Format(time.RFC3339), "err", err)
			continue
		}
		d.log.Info("the group's claim removed", "group", h.group, "tag", providers.ClaimTagKey)
	}
}
