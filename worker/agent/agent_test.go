package agent_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/agents"
	"github.com/elasticd/elasticd/proc"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/worker/agent"
	"github.com/elasticd/elasticd/worker/agent/gpu"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

// logBuf is a buffer safe for concurrent writes: a component's log (see logger), or a
// worker's output as the driver receives it.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func logger(t *testing.T, name string) (*slog.Logger, *logBuf) {
	b := &logBuf{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s log:\n%s", name, b.String())
		}
	})
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}

// driverSide is a registry served on a loopback address the test can stop and restart.
type driverSide struct {
	t    *testing.T
	addr string
	reg  *agents.Registry
	srv  *http.Server
	done chan struct{}
	log  *logBuf
	ln   *trackingListener
}

// trackingListener keeps the connections it accepted, so that a test's driver can cut them
// all as a crash would: the server's Close leaves the session streams it handed over.
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

// cut closes every connection accepted.
func (l *trackingListener) cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}

// startDriver serves a registry for jobID on addr; setup runs before it serves.
func startDriver(t *testing.T, addr, jobID string, setup ...func(*agents.Registry)) *driverSide {
	t.Helper()
	return startDriverLoads(t, addr, jobID, true, setup...)
}

// startDriverLoads is startDriver with a driver that reads the agents' GPU busy fractions
// (--slot-policy loadaware), or not.
func startDriverLoads(t *testing.T, addr, jobID string, loads bool, setup ...func(*agents.Registry)) *driverSide {
	t.Helper()
	lg, lb := logger(t, "driver "+jobID)
	reg, err := agents.New(agents.Config{Secret: secret, JobID: jobID, PollWait: 300 * time.Millisecond, Lease: 2 * time.Second, Logger: lg, Loads: loads})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range setup {
		f(reg)
	}
	var ln net.Listener
	for range 50 { // the address of a stopped driver may take a moment to be free again
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(protocol.AgentPathPrefix, reg)
	reg.SetHandler(mux) // the agents' session streams
	hs := &http.Server{Handler: mux, Protocols: new(http.Protocols)}
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true) // for agents without a stream
	d := &driverSide{t: t, addr: ln.Addr().String(), reg: reg, srv: hs, done: make(chan struct{}), log: lb, ln: &trackingListener{Listener: ln}}
	go func() { defer close(d.done); d.srv.Serve(d.ln) }()
	t.Cleanup(d.stop)
	return d
}

func (d *driverSide) url() string { return "http://" + d.addr }

// stop ends the driver as a crash would: connections cut, nothing said.
func (d *driverSide) stop() {
	d.srv.Close()
	d.ln.cut()
	<-d.done
	d.reg.Close()
}

// waitAgents waits until n agents are connected.
func (d *driverSide) waitAgents(n int) []agents.AgentInfo {
	d.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if a := d.reg.Agents(); len(a) == n {
			return a
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("%d agents connected, want %d", len(d.reg.Agents()), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// runAgent runs an agent until the test ends (or stop is called); stop waits for Run.
func runAgent(t *testing.T, cfg agent.Config) (stop func(), log *logBuf) {
	t.Helper()
	if cfg.Secret == nil {
		cfg.Secret = secret
	}
	if cfg.HostID == "" {
		cfg.HostID = "host-a"
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.2"
	}
	cfg.MaxBackoff = cmp.Or(cfg.MaxBackoff, 200*time.Millisecond)
	cfg.StopGrace = cmp.Or(cfg.StopGrace, 2*time.Second)
	cfg.Logger, log = logger(t, "agent "+cfg.HostID)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx, cfg) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("agent.Run: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Error("agent.Run did not return within 15s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop, log
}

func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return err == nil && !strings.Contains(string(b), ") Z ")
}

func waitFor(t *testing.T, what string, timeout time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fakeGPUs is a host's GPUs: inventory, and faults the test injects.
type fakeGPUs struct {
	gpus   []gpu.GPU
	faults chan gpu.Event
}

func (f *fakeGPUs) GPUs() []gpu.GPU { return f.gpus }

func (f *fakeGPUs) Watch(ctx context.Context, out chan<- gpu.Event) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-f.faults:
			select {
			case out <- ev:
			case <-ctx.Done():
				return nil
			}
		}
	}
}

// A worker started through the agent runs with the job secret the agent derived (the
// driver's copy is never sent), its slot's GPU, and its output and exit code come back.
func TestStartThroughAgent(t *testing.T) {
	d := startDriver(t, "127.0.0.1:0", "job-1")
	g := &fakeGPUs{gpus: []gpu.GPU{{Index: 0, UUID: "GPU-aaa"}, {Index: 1, UUID: "GPU-bbb"}}, faults: make(chan gpu.Event)}
	runAgent(t, agent.Config{DriverURL: d.url(), GPUs: g})
	info := d.waitAgents(1)
	if info[0].Slots != 2 || len(info[0].GPUs) != 2 {
		t.Fatalf("agent registered with %d slots and %d GPUs, want one slot per GPU (2)", info[0].Slots, len(info[0].GPUs))
	}
	var out, errw logBuf
	p, err := d.reg.Launcher().Start(t.Context(), proc.Spec{
		Name: "rank 1", Host: "127.0.0.2", Slot: 1,
		Command: []string{"sh", "-c", `echo "secret=$ELASTICD_SECRET gpu=$CUDA_VISIBLE_DEVICES"; echo oops >&2; exit 3`},
		Env:     []string{"ELASTICD_SECRET=the-drivers-copy", "ELASTICD_WORKER_ID=host-a/1"},
		Stdout:  &out, Stderr: &errw,
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait()
	if err != nil || st.Code != 3 {
		t.Fatalf("Wait = %v, %v; want exit 3", st, err)
	}
	want := fmt.Sprintf("secret=%s gpu=GPU-bbb\n", hex.EncodeToString(protocol.JobSecret(secret, "job-1")))
	if out.String() != want {
		t.Errorf("stdout %q, want %q", out.String(), want)
	}
	if errw.String() != "oops\n" {
		t.Errorf("stderr %q, want %q", errw.String(), "oops\n")
	}
	if p.PID() == 0 {
		t.Error("PID still 0 after the worker ran")
	}

	// Scripts written for torchrun or Horovod pick their GPU with set_device(LOCAL_RANK): the
	// worker's own GPU is listed at that position, the host's others around it.
	for _, tc := range []struct {
		slot int
		env  string
		want string
	}{
		{1, "LOCAL_RANK=1", "GPU-aaa,GPU-bbb"},
		{1, "LOCAL_RANK=0", "GPU-bbb,GPU-aaa"},
		{0, "LOCAL_RANK=1", "GPU-bbb,GPU-aaa"},
		{3, "LOCAL_RANK=0", "GPU-bbb,GPU-aaa"}, // slot 3 of 2 GPUs: GPU 1
		{1, "LOCAL_RANK=2", "GPU-bbb"},         // more local ranks than GPUs: its own alone
		{1, "LOCAL_RANK=x", "GPU-bbb"},
		{1, "HOROVOD_RANK=0", "GPU-bbb"},
		{1, "CUDA_VISIBLE_DEVICES=7", "7"}, // the job's own setting wins
	} {
		var out logBuf
		p, err := d.reg.Launcher().Start(t.Context(), proc.Spec{
			Name: "rank 1", Host: "127.0.0.2", Slot: tc.slot,
			Command: []string{"sh", "-c", `echo "$CUDA_VISIBLE_DEVICES"`},
			Env:     []string{tc.env}, Stdout: &out,
		})
		if err != nil {
			t.Fatal(err)
		}
		if st, err := p.Wait(); err != nil || st.Code != 0 {
			t.Fatalf("Wait = %v, %v", st, err)
		}
		if got := strings.TrimSpace(out.String()); got != tc.want {
			t.Errorf("slot %d, %s: CUDA_VISIBLE_DEVICES=%q, want %q", tc.slot, tc.env, got, tc.want)
		}
	}

	// A command the agent cannot start exits 127 with the reason on stderr.
	errw = logBuf{}
	p, err = d.reg.Launcher().Start(t.Context(), proc.Spec{Name: "rank 0", Host: "127.0.0.2", Command: []string{"/no/such/program"}, Stderr: &errw})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := p.Wait(); st.Code != 127 || !strings.Contains(errw.String(), "/no/such/program") {
		t.Fatalf("missing program: %v, stderr %q; want exit 127 naming it", st, errw.String())
	}
}

// The driver asks an agent for a port free on its host (the MASTER_PORT of a restart-mode
// generation whose rank 0 is there); a host without an agent is an error, not a guess.
func TestFreePortThroughAgent(t *testing.T) {
	d := startDriver(t, "127.0.0.1:0", "job-1")
	runAgent(t, agent.Config{DriverURL: d.url(), GPUs: &fakeGPUs{faults: make(chan gpu.Event)}})
	d.waitAgents(1)
	f, ok := d.reg.Launcher().(proc.PortFinder)
	if !ok {
		t.Fatal("the agent launcher finds no ports")
	}
	port, err := f.FreePort(t.Context(), "127.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("port %d from the agent is not free: %v", port, err)
	}
	ln.Close()
	if _, err := f.FreePort(t.Context(), "host-without-agent"); err == nil || !strings.Contains(err.Error(), "no agent is connected") {
		t.Fatalf("FreePort on a host without agent: %v", err)
	}
}

// Stop reaches the worker through the agent: SIGTERM, and the exit comes back.
func TestStopThroughAgent(t *testing.T) {
	d := startDriver(t, "127.0.0.1:0", "job-1")
	runAgent(t, agent.Config{DriverURL: d.url()})
	d.waitAgents(1)
	// The worker says when its trap is set: a SIGTERM before that would kill the shell
	// outright, and the test would fail for the wrong reason.
	ready := filepath.Join(t.TempDir(), "trap-set")
	p, err := d.reg.Launcher().Start(t.Context(), proc.Spec{Name: "w", Host: "host-a",
		Command: []string{"sh", "-c", `trap "exit 7" TERM; : > "$1"; sleep 60 & wait`, "worker", ready}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the worker's PID", 10*time.Second, func() bool { return p.PID() != 0 })
	waitFor(t, "the worker's trap", 10*time.Second, func() bool { _, err := os.Stat(ready); return err == nil })
	pid := p.PID()
	p.Stop(5 * time.Second)
	st, err := p.Wait()
	if err != nil || st.Code != 7 {
		t.Fatalf("after Stop: %v, %v; want the worker's TERM trap's exit 7", st, err)
	}
	if alive(pid) {
		t.Fatalf("worker %d still runs after Stop returned", pid)
	}
}

// Stopping the agent stops its workers; the driver hears that they exited.
func TestAgentLeavesNoOrphans(t *testing.T) {
	d := startDriver(t, "127.0.0.1:0", "job-1")
	stop, _ := runAgent(t, agent.Config{DriverURL: d.url()})
	d.waitAgents(1)
	var ps []proc.Process
	for i := range 2 {
		p, err := d.reg.Launcher().Start(t.Context(), proc.Spec{Name: strconv.Itoa(i), Host: "127.0.0.2", Command: []string{"sleep", "60"}})
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	var pids []int
	for _, p := range ps {
		waitFor(t, "the worker's PID", 10*time.Second, func() bool { return p.PID() != 0 })
		pids = append(pids, p.PID())
	}
	stop()
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("worker %d outlived its agent", pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for _, p := range ps {
		done := make(chan struct{})
		go func() { p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the driver did not hear that the stopped agent's worker exited")
		}
	}
}

// A driver that restarts is a new job: the agent registers with it and stops the workers it
// started for the old one.
func TestDriverRestart(t *testing.T) {
	d1 := startDriver(t, "127.0.0.1:0", "job-1")
	_, log := runAgent(t, agent.Config{DriverURL: d1.url(), DriverTimeout: time.Minute})
	d1.waitAgents(1)
	p, err := d1.reg.Launcher().Start(t.Context(), proc.Spec{Name: "old", Host: "127.0.0.2", Command: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the worker's PID", 10*time.Second, func() bool { return p.PID() != 0 })
	pid := p.PID()
	d1.stop()
	d2 := startDriver(t, d1.addr, "job-2")
	d2.waitAgents(1)
	waitFor(t, "the old job's worker stopped", 10*time.Second, func() bool { return !alive(pid) })
	if !strings.Contains(log.String(), "registering again") {
		t.Errorf("the agent did not say why it registered again")
	}
	// The new job's workers get the new job's secret.
	var out logBuf
	p2, err := d2.reg.Launcher().Start(t.Context(), proc.Spec{Name: "new", Host: "127.0.0.2", Command: []string{"sh", "-c", `echo $ELASTICD_SECRET`}, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	p2.Wait()
	if want := hex.EncodeToString(protocol.JobSecret(secret, "job-2")) + "\n"; out.String() != want {
		t.Fatalf("new job's worker got secret %q, want %q", out.String(), want)
	}
}

// A driver restarted on its --state-dir takes the job up: the agent keeps its workers running
// while the driver is away, lists them when it registers again, and the new driver adopts the
// one it expects, with the output it wrote meanwhile; the agent stops the one it did not.
func TestRestartedDriverAdoptsWorkers(t *testing.T) {
	d1 := startDriver(t, "127.0.0.1:0", "job-1")
	_, log := runAgent(t, agent.Config{DriverURL: d1.url(), DriverTimeout: time.Minute})
	d1.waitAgents(1)
	var out1 logBuf
	ticker := []string{"sh", "-c", `i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.02; done`}
	kept, err := d1.reg.Launcher().Start(t.Context(), proc.Spec{Name: "rank 0", Host: "127.0.0.2", Command: ticker, Env: []string{"ELASTICD_WORKER_ID=host-a/0"}, Stdout: &out1})
	if err != nil {
		t.Fatal(err)
	}
	dropped, err := d1.reg.Launcher().Start(t.Context(), proc.Spec{Name: "rank 1", Host: "127.0.0.2", Slot: 1, Command: []string{"sleep", "60"}, Env: []string{"ELASTICD_WORKER_ID=host-a/1"}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the workers' PIDs", 10*time.Second, func() bool { return kept.PID() != 0 && dropped.PID() != 0 })
	pid, pid2 := kept.PID(), dropped.PID()
	waitFor(t, "output", 10*time.Second, func() bool { return strings.Contains(out1.String(), "tick 5\n") })
	d1.stop()
	time.Sleep(300 * time.Millisecond) // the worker writes on with no driver
	if !alive(pid) || !alive(pid2) {
		t.Fatal("the agent stopped its workers when the driver went away")
	}
	var out2 logBuf
	var adopted <-chan struct{}
	var p proc.Process
	d2 := startDriver(t, d1.addr, "job-1", func(reg *agents.Registry) {
		p, adopted = reg.Adopt("host-a/0", proc.Spec{Name: "rank 0", Host: "127.0.0.2", Stdout: &out2}, 10*time.Second)
	})
	d2.waitAgents(1)
	select {
	case <-adopted:
	case <-time.After(10 * time.Second):
		t.Fatalf("not adopted\n%s", log.String())
	}
	if p.PID() != pid {
		t.Fatalf("adopted PID %d, want the running worker's %d", p.PID(), pid)
	}
	waitFor(t, "the worker the new driver did not adopt stopped", 10*time.Second, func() bool { return !alive(pid2) })
	// Not a tick lost: the new driver's output goes on from the old one's.
	waitFor(t, "output to the new driver", 10*time.Second, func() bool { return strings.Count(out2.String(), "tick") > 20 })
	last1 := strings.Count(out1.String(), "tick ") - 1
	first2 := -1
	fmt.Sscanf(out2.String(), "tick %d", &first2)
	if first2 < 0 || first2 > last1+1 {
		t.Fatalf("the old driver heard ticks up to %d, the new one from %d: output was lost\n%q", last1, first2, out2.String()[:min(200, len(out2.String()))])
	}
	p.Stop(2 * time.Second)
	if st, _ := p.Wait(); st.Signal == "" && st.Code == 0 {
		t.Fatalf("stopped worker: %v", st)
	}
	if alive(pid) {
		t.Fatal("the adopted worker still runs after Stop")
	}
}

// A driver gone for longer than DriverTimeout: the agent stops its workers and keeps trying
// to register, with bounded pauses.
func TestDriverGoneStopsWorkers(t *testing.T) {
	d := startDriver(t, "127.0.0.1:0", "job-1")
	_, log := runAgent(t, agent.Config{DriverURL: d.url(), DriverTimeout: 500 * time.Millisecond})
	d.waitAgents(1)
	p, err := d.reg.Launcher().Start(t.Context(), proc.Spec{Name: "w", Host: "127.0.0.2", Command: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the worker's PID", 10*time.Second, func() bool { return p.PID() != 0 })
	pid := p.PID()
	d.stop()
	waitFor(t, "the orphaned worker stopped", 10*time.Second, func() bool { return !alive(pid) })
	waitFor(t, "registration retries", 10*time.Second, func() bool {
		return strings.Count(log.String(), "cannot register with the driver") >= 3
	})
	if !strings.Contains(log.String(), "driver unreachable") {
		t.Errorf("the agent's log does not say the driver is unreachable")
	}
}

// A wrong secret is refused; the agent says so clearly and keeps retrying, with backoff.
func TestBadSecret(t *testing.T) {
	d := startDriver(t, "127.0.0.1:0", "job-1")
	start := time.Now()
	_, log := runAgent(t, agent.Config{DriverURL: d.url(), Secret: []byte("another-secret-of-32-bytes......"), MaxBackoff: 400 * time.Millisecond})
	waitFor(t, "refusals", 10*time.Second, func() bool { return strings.Count(log.String(), "refused the agent's signature") >= 3 })
	took := time.Since(start)
	if n := len(d.reg.Agents()); n != 0 {
		t.Fatalf("%d agents registered with a wrong secret", n)
	}
	// Three attempts take at least the first two pauses (0.5 s and 0.4 s capped, each less up to 20%).
	if took < 600*time.Millisecond {
		t.Fatalf("three refused attempts in %v: the agent does not back off", took)
	}
	if !strings.Contains(log.String(), "--agent-secret-file") {
		t.Error("the refusal does not point at --agent-secret-file")
	}
}

// fakeNotices is a metadata watcher the test arms; it records completions.
type fakeNotices struct {
	mu        sync.Mutex
	notice    *providers.Notice
	fail      int // the next calls that fail
	completed []string
}

func (f *fakeNotices) Notices(context.Context) ([]providers.Notice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail > 0 {
		f.fail--
		return nil, fmt.Errorf("metadata answered garbage: %q", "<html>")
	}
	if f.notice == nil {
		return nil, nil
	}
	return []providers.Notice{*f.notice}, nil
}

func (f *fakeNotices) CompleteNotice(_ context.Context, n providers.Notice) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.completed = append(f.completed, n.ID)
	return nil
}

// A notice on the host's metadata reaches the driver once, named by the provider's host ID;
// completing it reaches the watcher (Azure's StartRequests). A metadata service that fails is
// retried. A new session (here, with a restarted driver) hears of the notice again.
// (driver/agents' TestNotices checks that the same driver takes a re-sent notice once.)
func TestNoticeReachesDriver(t *testing.T) {
	d := startDriver(t, "127.0.0.1:0", "job-1")
	fn := &fakeNotices{fail: 2}
	_, log := runAgent(t, agent.Config{DriverURL: d.url(), HostID: "vm-7", Addr: "127.0.0.7", Notices: fn, Metadata: "azure", NoticeInterval: 20 * time.Millisecond})
	d.waitAgents(1)
	prov := d.reg.Wrap(providers.NewFixed([]providers.Host{{ID: "i-777", Addr: "127.0.0.7", Slots: 1}}))
	hs, err := prov.Hosts(t.Context())
	if err != nil || len(hs) != 1 || hs[0].ID != "i-777" {
		t.Fatalf("hosts %v, %v; want the provider's host matched to the agent by address", hs, err)
	}
	deadline := time.Now().Add(2 * time.Minute).Truncate(time.Second).UTC()
	fn.mu.Lock()
	fn.notice = &providers.Notice{ID: "ev-1", Kind: providers.Interruption, Deadline: deadline, Detail: "Preempt"}
	fn.mu.Unlock()
	var n providers.Notice
	select {
	case n = <-d.reg.Notices():
	case <-time.After(10 * time.Second):
		t.Fatal("no notice reached the driver")
	}
	if n.HostID != "i-777" || n.Kind != providers.Interruption || !n.Deadline.Equal(deadline) {
		t.Fatalf("notice %+v: want host i-777, interruption, deadline %v", n, deadline)
	}
	if !strings.Contains(log.String(), "cannot read interruption notices") {
		t.Error("the metadata failures were not logged")
	}
	select {
	case again := <-d.reg.Notices():
		t.Fatalf("notice delivered twice: %+v", again)
	case <-time.After(200 * time.Millisecond):
	}
	if err := prov.(providers.NoticeCompleter).CompleteNotice(t.Context(), n); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the notice completed on the host", 10*time.Second, func() bool {
		fn.mu.Lock()
		defer fn.mu.Unlock()
		return len(fn.completed) == 1 && fn.completed[0] == "ev-1"
	})

	d.stop()
	d2 := startDriver(t, d.addr, "job-1")
	select {
	case n := <-d2.reg.Notices():
		if n.ID != "agent:ev-1" {
			t.Fatalf("notice %+v sent to the new session, want agent:ev-1", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not send its standing notice to its new session")
	}
}

// A GPU fault reaches the driver as the slots that use the GPU.
func TestGPUFaultReachesDriver(t *testing.T) {
	d := startDriver(t, "127.0.0.1:0", "job-1")
	g := &fakeGPUs{gpus: []gpu.GPU{{Index: 0, UUID: "GPU-0"}, {Index: 1, UUID: "GPU-1"}}, faults: make(chan gpu.Event)}
	runAgent(t, agent.Config{DriverURL: d.url(), GPUs: g})
	d.waitAgents(1)
	g.faults <- gpu.Event{GPU: 1, UUID: "GPU-1", Kind: gpu.KindXID, XID: 79, Detail: "XID 79: GPU has fallen off the bus"}
	select {
	case f := <-d.reg.Faults():
		if f.HostID != "host-a" || len(f.Slots) != 1 || f.Slots[0] != 1 || !strings.Contains(f.Reason, "XID 79") {
			t.Fatalf("fault %+v: want host-a slot 1, XID 79", f)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no fault reached the driver")
	}
}

// busyGPUs are fakeGPUs that also report utilization, as gpu.Monitor does.
type busyGPUs struct {
	fakeGPUs
	busy []float64
}

func (b *busyGPUs) Utilization() ([]float64, error) { return b.busy, nil }

// The hosts' GPU busy fraction reaches the driver, an input of --slot-policy loadaware.
func TestGPUBusyReachesDriver(t *testing.T) {
	d := startDriver(t, "127.0.0.1:0", "job-1")
	g := &busyGPUs{fakeGPUs: fakeGPUs{gpus: []gpu.GPU{{Index: 0}, {Index: 1}}, faults: make(chan gpu.Event)}, busy: []float64{0.5, 1}}
	runAgent(t, agent.Config{DriverURL: d.url(), GPUs: g, LoadEvery: 20 * time.Millisecond})
	d.waitAgents(1)
	waitFor(t, "the GPU busy fraction", 10*time.Second, func() bool { return d.reg.GPUBusy()["host-a"] == 0.75 })
}

// A driver that reads no GPU busy fractions (its slot policy is not loadaware) tells its
// agents so when they register, and they send none: a request per host every few seconds
// spared at thousands of hosts.
func TestNoGPUBusyForADriverThatReadsNone(t *testing.T) {
	d := startDriverLoads(t, "127.0.0.1:0", "job-1", false)
	g := &busyGPUs{fakeGPUs: fakeGPUs{gpus: []gpu.GPU{{Index: 0}}, faults: make(chan gpu.Event)}, busy: []float64{0.5}}
	runAgent(t, agent.Config{DriverURL: d.url(), GPUs: g, LoadEvery: 20 * time.Millisecond})
	d.waitAgents(1)
	time.Sleep(300 * time.Millisecond) // fifteen of the agent's load periods
	if b, ok := d.reg.GPUBusy()["host-a"]; ok {
		t.Fatalf("the driver heard a GPU busy fraction of %v, having asked for none", b)
	}
}
