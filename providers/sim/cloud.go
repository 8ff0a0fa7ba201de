// Package sim is a simulated cloud on this machine, for tests and for trying capacity steering
// without a cloud: autoscaling groups whose instances are real processes (elasticd agents) on
// loopback addresses 127.0.0.N, with spot capacity that runs out and returns.
package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/elasticd/elasticd/proc"
	"github.com/elasticd/elasticd/providers"
)

var (
	// ErrClosed is a call on a cloud that Close (or the end of Start's context) has stopped.
	ErrClosed = errors.New("sim: the cloud is closed")
	// ErrNoInstance is a control (Interrupt, Vanish) naming no instance the cloud runs.
	ErrNoInstance = errors.New("no such instance")
	// ErrOutage is what every provider call returns during an outage (SetOutage).
	ErrOutage = errors.New("the control plane is unavailable (a simulated outage)")
	// errDenied is the cloud's refusal while SetDenied is on.
	errDenied = errors.New("AccessDenied: the simulation withholds the permission (deny on)")
)

// State is where an instance is in its life.
type State string

const (
	// Pending: booting (LaunchDelay); no process yet, not listed by Hosts.
	Pending State = "pending"
	// Running: the process runs.
	Running State = "running"
	// Interrupted: running, with an interruption notice; reclaimed at ReclaimAt.
	Interrupted State = "interrupted"
	// Terminating: the group is removing it (held by the lifecycle hook, or between SIGTERM
	// and the process's exit); listed as Leaving.
	Terminating State = "terminating"
)

// Instance is one of the cloud's instances, for tests and reports.
type Instance struct {
	// Host is the instance as its group's provider lists it (or will, once it has booted).
	providers.Host
	Group string
	State State
	// PID is the instance's process, which leads its own process group; 0 while pending.
	PID int
	// ReclaimAt is when an interrupted instance is taken; zero otherwise.
	ReclaimAt time.Time
}

// Call is one mutating call made through a group's provider (the driver steering it).
type Call struct {
	At    time.Time
	Group string
	// Op is "set-desired", "replace" or "complete-notice".
	Op string
	// N is set-desired's size; HostID replace's instance or the completed notice's;
	// NoticeID the completed notice.
	N        int
	HostID   string
	NoticeID string
	// Err is the call's error as the caller got it; empty when it succeeded.
	Err string
}

// Cloud is a running simulated cloud. Its one goroutine (the loop) owns every group and
// instance; the providers and controls hand it work over a channel, and one goroutine per
// running process reaps it and reports the exit to the loop. Close stops and waits for all.
type Cloud struct {
	cfg    Config
	log    *slog.Logger
	out    io.Writer // the instances' output, serialised; nil: discarded
	cancel context.CancelFunc

	reqs  chan request
	exits chan *instance
	quit  chan struct{} // closed when the loop stops taking requests
	done  chan struct{} // closed when the loop has returned and every process has exited
	procs sync.WaitGroup

	callsMu sync.Mutex
	calls   []Call

	w world // owned by the loop
}

type request struct {
	fn   func(now time.Time)
	done chan struct{}
}

// world is the cloud's state; only the loop touches it.
type world struct {
	start     time.Time
	groups    []*group
	spotCap   int
	outage    bool
	denied    bool
	stalled   bool
	addrs     [256]bool // 127.0.0.N in use (held from launch until the process is reaped)
	lastAddr  int
	running   map[*instance]bool // started processes not yet reaped
	noticeSeq int
	failSeq   int
	step      int // next scenario step
}

type group struct {
	cfg               GroupConfig
	min, desired, max int
	seq               int
	insts             []*instance // members in launch order
	failures          []providers.LaunchFailure
	retryAt           time.Time
	claim             string // the group's providers.ClaimTagKey tag; "" when none
}

type instance struct {
	id       string
	addrN    int
	g        *group
	launched time.Time
	state    State
	bootAt   time.Time
	proc     *proc.Group
	notices  []providers.Notice
	// reclaimAt: an interruption's deadline. hookUntil: while the lifecycle hook holds a
	// terminating instance, until when. killAt: SIGKILL after SIGTERM.
	reclaimAt, hookUntil, killAt time.Time
	termSent, killSent           bool
	gone                         bool // no longer the group's (its process may still be reaped)
}

func (in *instance) addr() string { return "127.0.0." + strconv.Itoa(in.addrN) }

// Start validates cfg and starts the cloud: its groups launch instances up to their desired
// sizes, and the scenario runs from now. The cloud runs until Close, or until ctx ends (Close
// must still be called then, to wait for it).
func Start(ctx context.Context, cfg Config) (*Cloud, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sim: start: %w", err)
	}
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(ctx)
	c := &Cloud{
		cfg:    cfg,
		log:    cfg.Logger,
		cancel: cancel,
		reqs:   make(chan request),
		exits:  make(chan *instance),
		quit:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	if cfg.Output != nil {
		c.out = proc.NewLockedWriter(cfg.Output)
	}
	c.w = world{start: time.Now(), spotCap: max(cfg.SpotCapacity, Unlimited), lastAddr: 1, running: map[*instance]bool{}}
	for _, g := range cfg.Groups {
		c.w.groups = append(c.w.groups, &group{cfg: g, min: g.Min, desired: g.Desired, max: g.Max})
	}
	go c.loop(ctx)
	return c, nil
}

// Close stops the cloud: every instance's process group gets SIGTERM, then SIGKILL after
// TerminateGrace, and Close returns once every instance's process has been reaped (what it
// started in its group is SIGKILLed with it) and every goroutine of the cloud has returned.
// It may be called more than once.
func (c *Cloud) Close() {
	c.cancel()
	<-c.done
	c.procs.Wait()
}

// Group returns the provider of the group called name: what the driver polls and steers.
func (c *Cloud) Group(name string) (*Provider, error) {
	i := slices.IndexFunc(c.cfg.Groups, func(g GroupConfig) bool { return g.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("sim: no group %q: the cloud has %s", name, c.cfg.groupNames())
	}
	return &Provider{c: c, name: name}, nil
}

// Calls returns the calls the driver made through the groups' providers so far, oldest first.
// It works after Close too, for a report.
func (c *Cloud) Calls() []Call {
	c.callsMu.Lock()
	defer c.callsMu.Unlock()
	return slices.Clone(c.calls)
}

func (c *Cloud) record(call Call) {
	c.callsMu.Lock()
	defer c.callsMu.Unlock()
	c.calls = append(c.calls, call)
}

// do runs fn on the loop and returns once it has run: ctx.Err() or ErrClosed when it could
// not be handed over. The loop runs nothing that waits, so once handed over, fn runs soon.
func (c *Cloud) do(ctx context.Context, fn func(now time.Time)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r := request{fn: fn, done: make(chan struct{})}
	select {
	case c.reqs <- r:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.quit:
		return ErrClosed
	}
	<-r.done
	return nil
}

// SetSpotCapacity sets how many spot instances the cloud can run (Unlimited: no limit). When
// more run, the newest beyond n get interruption notices and are reclaimed after
// InterruptWarning (those still booting fail at once); the groups' launches beyond n fail
// with InsufficientInstanceCapacity until capacity returns.
func (c *Cloud) SetSpotCapacity(ctx context.Context, n int) error {
	return c.control(ctx, "set spot capacity", func(now time.Time) error { c.setSpotCapacity(now, n); return nil })
}

// Interrupt gives the running instance id an interruption notice: it is reclaimed (its
// process group SIGKILLed, as a cloud takes the host) after warning, or InterruptWarning when
// warning is not positive. An instance already interrupted keeps its notice.
func (c *Cloud) Interrupt(ctx context.Context, id string, warning time.Duration) error {
	return c.control(ctx, "interrupt "+id, func(now time.Time) error {
		in := c.find(id)
		if in == nil || in.state == Pending {
			return fmt.Errorf("%w running (gone, or still booting)", ErrNoInstance)
		}
		c.interrupt(now, in, warning)
		return nil
	})
}

// Vanish kills instance id at once, with no notice: its process group is SIGKILLed and it
// leaves its group at once (the group launches a replacement, as for a failed host).
func (c *Cloud) Vanish(ctx context.Context, id string) error {
	return c.control(ctx, "vanish "+id, func(now time.Time) error {
		in := c.find(id)
		if in == nil {
			return ErrNoInstance
		}
		c.vanish(in, "vanished with no notice")
		return nil
	})
}

// SetOutage makes every call of the groups' providers fail with ErrOutage while on.
func (c *Cloud) SetOutage(ctx context.Context, on bool) error {
	return c.control(ctx, "set outage", func(time.Time) error { c.w.outage = on; return nil })
}

// SetDenied makes the providers refuse their mutating calls (SetDesired, Replace,
// CompleteNotice, the writes of Claim and Unclaim) while on, as a cloud without the permission does: the errors wrap
// providers.ErrRefused.
func (c *Cloud) SetDenied(ctx context.Context, on bool) error {
	return c.control(ctx, "set denied", func(time.Time) error { c.w.denied = on; return nil })
}

// SetStalled makes every provider call hang until its context ends while on, as an API that
// stops answering does.
func (c *Cloud) SetStalled(ctx context.Context, on bool) error {
	return c.control(ctx, "set stalled", func(time.Time) error { c.w.stalled = on; return nil })
}

// Instances lists every instance of every group, booting and terminating ones included, in
// launch order.
func (c *Cloud) Instances(ctx context.Context) ([]Instance, error) {
	var out []Instance
	err := c.control(ctx, "list instances", func(time.Time) error {
		for _, g := range c.w.groups {
			for _, in := range g.insts {
				i := Instance{Host: c.host(in), Group: g.cfg.Name, State: in.state, ReclaimAt: in.reclaimAt}
				if in.proc != nil {
					i.PID = in.proc.PID()
				}
				out = append(out, i)
			}
		}
		return nil
	})
	slices.SortStableFunc(out, func(a, b Instance) int { return a.Launched.Compare(b.Launched) })
	return out, err
}

func (c *Cloud) control(ctx context.Context, what string, fn func(now time.Time) error) error {
	var err error
	if e := c.do(ctx, func(now time.Time) { err = fn(now) }); e != nil {
		return fmt.Errorf("sim: %s: %w", what, e)
	}
	if err != nil {
		return fmt.Errorf("sim: %s: %w", what, err)
	}
	return nil
}

// loop owns the world: it runs requests, takes process exits, and reconciles the groups
// after each and whenever something falls due.
func (c *Cloud) loop(ctx context.Context) {
	defer close(c.done)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			c.shutdown()
			return
		case r := <-c.reqs:
			r.fn(time.Now())
			close(r.done)
		case in := <-c.exits:
			c.exited(in)
		case <-timer.C:
		}
		now := time.Now()
		timer.Reset(c.reconcile(now).Sub(now))
	}
}

// reconcile does what is due at now and returns when it must run next.
func (c *Cloud) reconcile(now time.Time) time.Time {
	w := &c.w
	next := now.Add(time.Second) // a backstop: every deadline below also sets next
	due := func(t time.Time) bool {
		if t.IsZero() {
			return false
		}
		if !now.Before(t) {
			return true
		}
		if t.Before(next) {
			next = t
		}
		return false
	}
	for w.step < len(c.cfg.Scenario) && due(w.start.Add(c.cfg.Scenario[w.step].After)) {
		c.runStep(now, c.cfg.Scenario[w.step])
		w.step++
	}
	for _, g := range w.groups {
		for _, in := range slices.Clone(g.insts) {
			switch {
			case in.state == Pending:
				if due(in.bootAt) {
					c.boot(now, in)
				}
			case due(in.reclaimAt):
				c.vanish(in, "reclaimed at the end of its interruption notice")
			case in.state == Terminating && !in.termSent && (due(in.hookUntil) || in.hookUntil.IsZero()):
				c.sigterm(now, in)
			case in.termSent && !in.killSent && due(in.killAt):
				c.log.Warn("sim: the instance outlived its grace; killing it", "host", in.id, "grace", c.cfg.TerminateGrace)
				in.proc.Signal(syscall.SIGKILL)
				in.killSent = true
			}
		}
	}
	c.enforceSpotCapacity(now)
	for _, g := range w.groups {
		c.scale(now, g)
		if active(g) < g.desired {
			due(g.retryAt)
		}
	}
	return next
}

// active counts the members that count towards the desired size.
func active(g *group) int {
	n := 0
	for _, in := range g.insts {
		if in.state != Terminating {
			n++
		}
	}
	return n
}

// scale brings the group to its desired size: newest first out, and launches when its last
// failure is LaunchRetry behind.
func (c *Cloud) scale(now time.Time, g *group) {
	for n := active(g); n > g.desired; n-- {
		var newest *instance
		for _, in := range g.insts {
			if in.state != Terminating {
				newest = in // insts are in launch order
			}
		}
		c.terminate(now, newest, "the group is above its desired size")
	}
	if now.Before(g.retryAt) {
		return
	}
	for n := active(g); n < g.desired; n++ {
		if g.cfg.Spot && c.w.spotCap >= 0 && c.spotHeld() >= c.w.spotCap {
			c.fail(now, g, "InsufficientInstanceCapacity", "Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot capacity available that matches your request. Launching EC2 instance failed.")
			return
		}
		addrN := c.freeAddr()
		if addrN == 0 {
			c.fail(now, g, "InsufficientFreeAddressesInSubnet", fmt.Sprintf("There are not enough free addresses in subnet 127.0.0.0/24 to satisfy the requested number of instances (%d instances at most).", MaxInstances))
			return
		}
		g.seq++
		in := &instance{
			id: fmt.Sprintf("sim-%s-%04d", g.cfg.Name, g.seq), addrN: addrN, g: g,
			launched: now, state: Pending, bootAt: now.Add(c.cfg.LaunchDelay),
		}
		c.w.addrs[addrN], c.w.lastAddr = true, addrN
		g.insts = append(g.insts, in)
		c.log.Info("sim: launching an instance", "group", g.cfg.Name, "host", in.id, "addr", in.addr(), "boots_in", c.cfg.LaunchDelay)
	}
}

// freeAddr picks the next free N of 127.0.0.N after the last one given, so that an address
// is not given again at once; 0 when none is free.
func (c *Cloud) freeAddr() int {
	for i := range MaxInstances {
		n := (c.w.lastAddr-2+1+i)%MaxInstances + 2
		if !c.w.addrs[n] {
			return n
		}
	}
	return 0
}

// spotHeld counts the spot instances that hold capacity and have no notice to give it back.
func (c *Cloud) spotHeld() int {
	return len(c.spotHolders())
}

// spotHolders are the spot instances that hold capacity (booting or running, no notice),
// oldest first.
func (c *Cloud) spotHolders() []*instance {
	var hs []*instance
	for _, g := range c.w.groups {
		if !g.cfg.Spot {
			continue
		}
		for _, in := range g.insts {
			if in.state == Pending || in.state == Running {
				hs = append(hs, in)
			}
		}
	}
	slices.SortStableFunc(hs, func(a, b *instance) int {
		return cmp.Or(a.launched.Compare(b.launched), cmp.Compare(a.id, b.id))
	})
	return hs
}

func (c *Cloud) setSpotCapacity(now time.Time, n int) {
	if n < 0 {
		n = Unlimited
	}
	c.log.Info("sim: spot capacity changes", "from", capacityString(c.w.spotCap), "to", capacityString(n))
	c.w.spotCap = n
	c.enforceSpotCapacity(now)
}

func capacityString(n int) string {
	if n < 0 {
		return "unlimited"
	}
	return strconv.Itoa(n)
}

// enforceSpotCapacity takes back the newest spot instances beyond the capacity: those booting
// fail to launch, those running get an interruption notice.
func (c *Cloud) enforceSpotCapacity(now time.Time) {
	if c.w.spotCap < 0 {
		return
	}
	hs := c.spotHolders()
	for i := len(hs) - 1; i >= c.w.spotCap; i-- {
		in := hs[i]
		if in.state == Pending {
			c.remove(in)
			c.fail(now, in.g, "InsufficientInstanceCapacity", "Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot capacity available that matches your request. Launching EC2 instance failed.")
			continue
		}
		c.interrupt(now, in, 0)
	}
}

// fail records a failed launch attempt of g and holds its launches for LaunchRetry.
func (c *Cloud) fail(now time.Time, g *group, code, message string) {
	c.w.failSeq++
	f := providers.LaunchFailure{
		ID: fmt.Sprintf("sim-launch-%06d", c.w.failSeq), At: now, Kind: providers.Classify(code, message),
		Code: code, Message: message, Zone: g.cfg.Zone,
	}
	g.failures = append(g.failures, f)
	if len(g.failures) > maxFailures {
		g.failures = slices.Clone(g.failures[len(g.failures)-maxFailures:])
	}
	g.retryAt = now.Add(c.cfg.LaunchRetry)
	c.log.Warn("sim: launch failed", "group", g.cfg.Name, "code", code, "kind", f.Kind, "retry_in", c.cfg.LaunchRetry)
}

// boot starts a pending instance's process.
func (c *Cloud) boot(now time.Time, in *instance) {
	g := in.g
	args := append(slices.Clone(c.cfg.Agent[1:]),
		"--driver", c.cfg.DriverURL, "--agent-secret-file", c.cfg.SecretFile, "--host-id", in.id,
		"--addr", in.addr(), "--slots", strconv.Itoa(g.cfg.Slots), "--metadata", "none")
	cmd := exec.Command(c.cfg.Agent[0], args...)
	cmd.Env = append(os.Environ(), c.cfg.Env...)
	cmd.SysProcAttr = proc.GroupAttr()
	var out io.Writer
	if c.out != nil {
		out = proc.NewPrefixWriter(c.out, "["+in.id+"] ")
	}
	p, err := proc.StartGroup(cmd, out, out)
	if err != nil {
		c.remove(in)
		c.fail(now, g, "InstanceStartFailed", fmt.Sprintf("start %s on instance %s: %v", c.cfg.Agent[0], in.id, err))
		return
	}
	in.proc, in.state = p, Running
	c.w.running[in] = true
	c.procs.Add(1)
	go func() {
		defer c.procs.Done()
		p.Reap(nil)
		c.exits <- in // the loop takes exits until every process has reported
	}()
	c.log.Info("sim: instance running", "group", g.cfg.Name, "host", in.id, "addr", in.addr(), "pid", p.PID())
}

// interrupt gives a running instance an interruption notice.
func (c *Cloud) interrupt(now time.Time, in *instance, warning time.Duration) {
	if !in.reclaimAt.IsZero() {
		return
	}
	if warning <= 0 {
		warning = c.cfg.InterruptWarning
	}
	in.reclaimAt = now.Add(warning)
	if in.state == Running {
		in.state = Interrupted
	}
	c.w.noticeSeq++
	n := providers.Notice{
		ID: fmt.Sprintf("sim-notice-%06d", c.w.noticeSeq), HostID: in.id, Kind: providers.Interruption,
		Deadline: in.reclaimAt,
		Detail:   fmt.Sprintf("spot interruption: the cloud takes %s back at %s", in.id, in.reclaimAt.Format(time.TimeOnly)),
	}
	in.notices = append(in.notices, n)
	c.log.Info("sim: interruption notice", "group", in.g.cfg.Name, "host", in.id, "reclaim_in", warning)
}

// terminate starts the group's removal of an instance: one still booting goes at once; one
// running is held by the lifecycle hook, if any, then gets SIGTERM.
func (c *Cloud) terminate(now time.Time, in *instance, why string) {
	if in.state == Pending {
		c.remove(in)
		c.log.Info("sim: launch cancelled", "group", in.g.cfg.Name, "host", in.id, "why", why)
		return
	}
	in.state = Terminating
	c.log.Info("sim: terminating an instance", "group", in.g.cfg.Name, "host", in.id, "why", why)
	if c.cfg.LifecycleHook > 0 {
		in.hookUntil = now.Add(c.cfg.LifecycleHook)
		c.w.noticeSeq++
		in.notices = append(in.notices, providers.Notice{
			ID: fmt.Sprintf("sim-notice-%06d", c.w.noticeSeq), HostID: in.id, Kind: providers.ScaleIn,
			Deadline: in.hookUntil, Token: in.id,
			Detail: fmt.Sprintf("scale-in: the group terminates %s once the notice is completed, or at %s (%s)", in.id, in.hookUntil.Format(time.TimeOnly), why),
		})
		return
	}
	c.sigterm(now, in)
}

func (c *Cloud) sigterm(now time.Time, in *instance) {
	in.notices = slices.DeleteFunc(in.notices, func(n providers.Notice) bool { return n.Kind == providers.ScaleIn })
	in.termSent, in.killAt = true, now.Add(c.cfg.TerminateGrace)
	in.proc.Signal(syscall.SIGTERM)
}

// vanish takes an instance at once: its process group is SIGKILLed and it leaves its group
// (its address stays held until the process is reaped).
func (c *Cloud) vanish(in *instance, why string) {
	if in.proc != nil {
		in.proc.Signal(syscall.SIGKILL)
		in.killSent = true
	}
	c.log.Info("sim: instance gone", "group", in.g.cfg.Name, "host", in.id, "why", why)
	c.remove(in)
}

// remove takes an instance out of its group; its address is freed once it has no process.
func (c *Cloud) remove(in *instance) {
	if in.gone {
		return
	}
	in.gone = true
	in.g.insts = slices.DeleteFunc(in.g.insts, func(x *instance) bool { return x == in })
	if in.proc == nil || !c.w.running[in] {
		c.w.addrs[in.addrN] = false
	}
}

// exited takes the report of a reaped process.
func (c *Cloud) exited(in *instance) {
	delete(c.w.running, in)
	c.w.addrs[in.addrN] = false
	if in.gone {
		return
	}
	if in.state == Terminating {
		c.log.Info("sim: instance terminated", "group", in.g.cfg.Name, "host", in.id, "status", in.proc.Status())
	} else {
		c.log.Warn("sim: the instance's process exited on its own; the group replaces the instance", "group", in.g.cfg.Name, "host", in.id, "status", in.proc.Status())
	}
	c.remove(in)
}

// shutdown stops every process (SIGTERM, SIGKILL after TerminateGrace) and returns once each
// has been reaped. Requests are refused from its start.
func (c *Cloud) shutdown() {
	close(c.quit)
	for in := range c.w.running {
		in.proc.Signal(syscall.SIGTERM)
	}
	grace := time.NewTimer(c.cfg.TerminateGrace)
	defer grace.Stop()
	for len(c.w.running) > 0 {
		select {
		case in := <-c.exits:
			delete(c.w.running, in)
		case <-grace.C:
			for in := range c.w.running {
				in.proc.Signal(syscall.SIGKILL)
			}
		}
	}
	c.log.Info("sim: the cloud is closed")
}

// find is the member instance called id, or nil.
func (c *Cloud) find(id string) *instance {
	for _, g := range c.w.groups {
		for _, in := range g.insts {
			if in.id == id {
				return in
			}
		}
	}
	return nil
}

// host is an instance as its provider lists it.
func (c *Cloud) host(in *instance) providers.Host {
	return providers.Host{
		ID: in.id, Addr: in.addr(), Slots: in.g.cfg.Slots, Zone: in.g.cfg.Zone, Spot: in.g.cfg.Spot,
		Type: in.g.cfg.Type, Launched: in.launched, Leaving: in.state == Terminating,
	}
}

// runStep runs one scenario step.
func (c *Cloud) runStep(now time.Time, s Step) {
	c.log.Info("sim: scenario step", "line", s.Line, "step", s.String())
	switch s.Action {
	case ActionSpotCapacity:
		c.setSpotCapacity(now, s.N)
	case ActionInterrupt:
		if in := c.pick(s.Target, func(in *instance) bool { return in.state == Running }); in != nil {
			c.interrupt(now, in, s.Warning)
		} else {
			c.log.Warn("sim: scenario step: no running instance without a notice to interrupt", "line", s.Line, "target", s.Target)
		}
	case ActionVanish:
		if in := c.pick(s.Target, func(in *instance) bool { return in.proc != nil }); in != nil {
			c.vanish(in, "vanished (scenario)")
		} else {
			c.log.Warn("sim: scenario step: no running instance to vanish", "line", s.Line, "target", s.Target)
		}
	case ActionDesired:
		for _, g := range c.w.groups {
			if g.cfg.Name == s.Target {
				g.desired, g.min = s.N, min(g.min, s.N)
			}
		}
	case ActionOutage:
		c.w.outage = s.On
	case ActionDeny:
		c.w.denied = s.On
	case ActionStall:
		c.w.stalled = s.On
	}
}

// pick is the instance a step names: the instance of that ID, or the group's newest member
// that ok accepts.
func (c *Cloud) pick(target string, ok func(*instance) bool) *instance {
	for _, g := range c.w.groups {
		if g.cfg.Name != target {
			continue
		}
		for i := len(g.insts) - 1; i >= 0; i-- {
			if ok(g.insts[i]) {
				return g.insts[i]
			}
		}
		return nil
	}
	if in := c.find(target); in != nil && ok(in) {
		return in
	}
	return nil
}
