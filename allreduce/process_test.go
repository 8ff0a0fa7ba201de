package allreduce_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/elasticd/elasticd/allreduce"
)

// The multi-process tests re-execute this test binary as rank processes. TestMain turns the
// binary into a rank when childEnv names a scenario; the rank reads its part from the other
// ELASTICD_TEST_* variables, reports on stdout one line per event, and exits.
const (
	childEnv     = "ELASTICD_TEST_CHILD"
	childRank    = "ELASTICD_TEST_RANK"
	childSize    = "ELASTICD_TEST_SIZE"
	childDir     = "ELASTICD_TEST_STORE"
	childTimeout = "ELASTICD_TEST_TIMEOUT"
	childTransp  = "ELASTICD_TEST_TRANSPORT"
	childHosts   = "ELASTICD_TEST_HOSTS"
	childListen  = "ELASTICD_TEST_LISTEN"
	childDirect  = "ELASTICD_TEST_DIRECT_BYTES"
	childDeny    = "ELASTICD_TEST_DENY_READS" // "1": a seccomp filter denies process_vm_readv
)

// transports are the two data paths between rank processes on one machine.
var transports = []string{allreduce.TransportAuto, allreduce.TransportTCP}

// procMode is how the rank processes of a test reach each other: over transport, on one
// machine, or, when hosts is set, as ranks of the hosts it spells ("AABB" is two hosts of
// two ranks), which makes large allreduces hierarchical. The hosts are simulated with
// Config.HostID (onHosts), or, with netns, are network namespaces that the test makes and
// joins with a veth pair: the ranks then find their hosts by themselves.
//
// With direct, allreduces above SmallBytes read the peers' buffers (Config.DirectBytes 1)
// where the world allows it; deny names ranks (by index, "1" or "02") that a seccomp filter
// forbids to read any other process's memory, which keeps the whole world on the rings.
type procMode struct {
	transport, hosts string
	netns            bool
	rate             string // with netns: the link's rate each way (tc tbf), "" unlimited
	cc               string // with netns: both namespaces' TCP congestion control, "" the machine's
	direct           bool
	deny             string
}

func (m procMode) String() string {
	s := m.transport
	switch {
	case m.netns:
		s += "/netns=" + m.hosts
		if m.cc != "" {
			s += "/" + m.cc
		}
	case m.hosts != "":
		s += "/hosts=" + m.hosts
	}
	if m.direct {
		s += "/direct"
	}
	if m.deny != "" {
		s += "/deny=" + m.deny
	}
	return s
}

// faultModes are the worlds the fault tests kill or stop a rank of: 4 ranks on one machine
// over each transport, and 2+2 ranks on two hosts, simulated or network namespaces.
var faultModes = []procMode{
	{transport: allreduce.TransportAuto}, {transport: allreduce.TransportTCP}, {transport: allreduce.TransportAuto, direct: true},
	{transport: allreduce.TransportAuto, hosts: "AABB"}, {transport: allreduce.TransportAuto, hosts: "AABB", netns: true},
}

func TestMain(m *testing.M) {
	if scenario := os.Getenv(childEnv); scenario != "" {
		os.Exit(childMain(scenario))
	}
	os.Exit(m.Run())
}

// childMain runs one rank. Exit status: 0 when the scenario went as the rank expected, 1
// otherwise, 2 when the parent went away.
func childMain(scenario string) int {
	// Never outlive the test: the parent holds our stdin open, and its death closes it.
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(2)
	}()
	time.AfterFunc(2*time.Minute, func() { os.Exit(3) })

	rank, _ := strconv.Atoi(os.Getenv(childRank))
	size, _ := strconv.Atoi(os.Getenv(childSize))
	timeout, _ := time.ParseDuration(os.Getenv(childTimeout))
	ctx := context.Background() // a rank process is its own main
	cfg := allreduce.Config{
		Rank: rank, Size: size, Generation: 1, Timeout: timeout,
		Store:     &allreduce.FileStore{Dir: os.Getenv(childDir)},
		Transport: os.Getenv(childTransp),
	}
	if hosts := os.Getenv(childHosts); hosts != "" {
		onHosts(hosts)(&cfg)
	}
	if addr := os.Getenv(childListen); addr != "" {
		cfg.ListenAddr = addr
	}
	cfg.DirectBytes, _ = strconv.Atoi(os.Getenv(childDirect))
	if os.Getenv(childDeny) == "1" {
		if err := denyMemoryReads(); err != nil {
			fmt.Printf("FAIL deny reads: %v\n", err)
			return 1
		}
	}
	c, err := allreduce.New(ctx, cfg)
	if err != nil {
		fmt.Printf("FAIL New: %v\n", err)
		return 1
	}
	defer c.Close()
	fmt.Printf("ready shm=%d hosts=%d sndbuf=%d direct=%d\n", c.Stats().SharedMemory, c.Stats().Hosts, c.Stats().TCPSendBuffers, c.Stats().DirectFrom)
	switch scenario {
	case "correct":
		if err := childCorrect(ctx, c); err != nil {
			fmt.Printf("FAIL %v\n", err)
			return 1
		}
		fmt.Println("ok")
		return 0
	case "loop":
		return childLoop(ctx, c)
	case "timings":
		if err := childTimings(ctx, c); err != nil {
			fmt.Printf("FAIL %v\n", err)
			return 1
		}
		return 0
	}
	fmt.Printf("FAIL unknown scenario %q\n", scenario)
	return 1
}

// childCorrect runs a few collectives of every kind, each checked against the reference.
func childCorrect(ctx context.Context, c *allreduce.Comm) error {
	n, r := c.Size(), c.Rank()
	check := func(what string, got, want []byte) error {
		if !bytes.Equal(got, want) {
			return fmt.Errorf("%s: wrong result", what)
		}
		return nil
	}
	f32 := exactInput[float32](r, large)
	if err := c.Allreduce(ctx, f32, allreduce.Sum); err != nil {
		return err
	}
	if err := check("float32 sum", raw(f32), raw(reference[float32](n, large, allreduce.Sum))); err != nil {
		return err
	}
	i64 := exactInput[int64](r, 7)
	if err := c.Allreduce(ctx, i64, allreduce.Max); err != nil {
		return err
	}
	if err := check("int64 max", raw(i64), raw(reference[int64](n, 7, allreduce.Max))); err != nil {
		return err
	}
	f64 := exactInput[float64](r, 1000)
	if err := c.Allreduce(ctx, f64, allreduce.Min); err != nil {
		return err
	}
	if err := check("float64 min", raw(f64), raw(reference[float64](n, 1000, allreduce.Min))); err != nil {
		return err
	}
	empty := []float32{}
	if err := c.Allreduce(ctx, empty, allreduce.Sum); err != nil {
		return err
	}
	root := n - 1
	b := patterned(r, 300007)
	if err := c.Broadcast(ctx, b, root); err != nil {
		return err
	}
	if err := check("broadcast", b, patterned(root, 300007)); err != nil {
		return err
	}
	size := func(q int) int { return []int{0, 1000, 7, 300001, 1}[q%5] }
	out, err := c.Allgather(ctx, patterned(r, size(r)))
	if err != nil {
		return err
	}
	for q := range n {
		if err := check(fmt.Sprintf("allgather block %d", q), out[q], patterned(q, size(q))); err != nil {
			return err
		}
	}
	return c.Barrier(ctx)
}

// childLoop runs 4 MiB float32 sums until one fails, printing "iter N" after each; the
// failure is reported as "lost peerlost=<bool> rank=<culprit> via=<rank> silent=<bool>
// err=<quoted> direct=<direct allreduces so far> hier=<hierarchical ones>".
func childLoop(ctx context.Context, c *allreduce.Comm) int {
	buf := make([]float32, 1<<20)
	for i := range 100000 {
		for j := range buf {
			buf[j] = float32(c.Rank() + j%3)
		}
		if err := c.Allreduce(ctx, buf, allreduce.Sum); err != nil {
			culprit, via := -1, -1
			if pe, ok := errors.AsType[*allreduce.PeerError](err); ok {
				culprit, via = pe.Rank, pe.Via
			}
			st := c.Stats()
			fmt.Printf("lost peerlost=%t rank=%d via=%d silent=%t err=%q direct=%d hier=%d\n", errors.Is(err, allreduce.ErrPeerLost), culprit, via, errors.Is(err, allreduce.ErrPeerSilent), err.Error(), st.DirectAllreduces, st.Hierarchical)
			return 0
		}
		fmt.Printf("iter %d\n", i)
	}
	fmt.Println("FAIL no failure after 100000 iterations")
	return 1
}

// childTimings times 16 MiB float32 sums three ways, interleaved (the hierarchical
// allreduce with slices, with one leader per host, the flat ring), each after a barrier, and
// prints "timings sliced=<median> leader=<median> flat=<median>".
func childTimings(ctx context.Context, c *allreduce.Comm) error {
	buf := make([]float32, 4<<20)
	ways := []func(*allreduce.Comm) func(){nil, allreduce.Leaders, allreduce.Flatten}
	times := make([][]time.Duration, len(ways))
	for round := range 12 {
		for i, hook := range ways {
			restore := func() {}
			if hook != nil {
				restore = hook(c)
			}
			err := c.Barrier(ctx)
			start := time.Now()
			if err == nil {
				err = c.Allreduce(ctx, buf, allreduce.Sum)
			}
			if round > 0 { // the first round warms every path up
				times[i] = append(times[i], time.Since(start))
			}
			restore()
			if err != nil {
				return err
			}
		}
	}
	fmt.Printf("timings sliced=%v leader=%v flat=%v hier=%d\n", median(times[0]), median(times[1]), median(times[2]), c.Stats().Hierarchical)
	return nil
}

// line is one line a child printed, with the time the parent read it.
type line struct {
	text string
	at   time.Time
}

// child is one rank process seen from the test.
type child struct {
	rank int
	cmd  *exec.Cmd
	done chan struct{} // closed once the process is reaped

	mu      sync.Mutex
	lines   []line
	waitErr error
}

// procWorld is a set of rank processes; changed is signalled on every line and every exit.
type procWorld struct {
	t       *testing.T
	kids    []*child
	changed chan struct{}
	cc      string // with netns: the namespaces' TCP congestion control
}

// startProcs starts n rank processes of scenario; every one is killed by PID and reaped
// when the test ends.
func startProcs(t *testing.T, scenario string, mode procMode, n int, timeout time.Duration) *procWorld {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	w := &procWorld{t: t, changed: make(chan struct{}, 1)}
	dir := t.TempDir()
	var hosts map[byte]netnsHost
	if mode.netns {
		hosts, w.cc = makeNetnsHosts(t, mode.hosts, mode.rate, mode.cc)
	}
	for r := range n {
		env := append(os.Environ(),
			childEnv+"="+scenario,
			childRank+"="+strconv.Itoa(r),
			childSize+"="+strconv.Itoa(n),
			childDir+"="+dir,
			childTimeout+"="+timeout.String(),
			childTransp+"="+mode.transport,
		)
		if mode.direct {
			env = append(env, childDirect+"=1")
		}
		if strings.Contains(mode.deny, strconv.Itoa(r)) {
			env = append(env, childDeny+"=1")
		}
		cmd := exec.Command(exe)
		if mode.netns {
			// ip netns exec enters the namespace and execs the rank: its PID is the rank's.
			h := hosts[mode.hosts[r]]
			cmd = exec.Command("ip", "netns", "exec", h.name, exe)
			env = append(env, childListen+"="+h.addr+":0")
		} else {
			env = append(env, childHosts+"="+mode.hosts)
		}
		cmd.Env = env
		setParentDeathSignal(cmd)
		stdin, err := cmd.StdinPipe() // held open: the child exits when it closes
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c := &child{rank: r, cmd: cmd, done: make(chan struct{})}
		w.kids = append(w.kids, c)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				c.mu.Lock()
				c.lines = append(c.lines, line{sc.Text(), time.Now()})
				c.mu.Unlock()
				w.signal()
			}
			io.Copy(io.Discard, stdout)
			err := cmd.Wait() // after the last read, as exec requires
			c.mu.Lock()
			c.waitErr = err
			c.mu.Unlock()
			close(c.done)
			w.signal()
		}()
		t.Cleanup(func() {
			cmd.Process.Kill() // by PID; harmless once it has exited
			select {
			case <-c.done:
			case <-time.After(10 * time.Second):
				t.Errorf("rank %d (pid %d) was not reaped 10s after SIGKILL", r, cmd.Process.Pid)
			}
			stdin.Close()
			if stderr.Len() > 0 {
				t.Logf("rank %d stderr:\n%s", r, stderr.String())
			}
		})
	}
	return w
}

func (w *procWorld) signal() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// await waits until cond holds, re-checking on every line and exit, for at most d.
func (w *procWorld) await(d time.Duration, what string, cond func() bool) {
	w.t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-w.changed:
		case <-deadline.C:
			w.dump()
			w.t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}

// last returns child r's last line that starts with prefix.
func (w *procWorld) last(r int, prefix string) (line, bool) {
	c := w.kids[r]
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(c.lines[i].text, prefix) {
			return c.lines[i], true
		}
	}
	return line{}, false
}

func (w *procWorld) exited(r int) (bool, error) {
	c := w.kids[r]
	select {
	case <-c.done:
		c.mu.Lock()
		defer c.mu.Unlock()
		return true, c.waitErr
	default:
		return false, nil
	}
}

func (w *procWorld) iterations(r int) int {
	l, ok := w.last(r, "iter ")
	if !ok {
		return 0
	}
	i, _ := strconv.Atoi(strings.TrimPrefix(l.text, "iter "))
	return i + 1
}

func (w *procWorld) dump() {
	for _, c := range w.kids {
		c.mu.Lock()
		var tail []string
		for _, l := range c.lines[max(0, len(c.lines)-3):] {
			tail = append(tail, l.text)
		}
		c.mu.Unlock()
		w.t.Logf("rank %d (pid %d): last lines %q", c.rank, c.cmd.Process.Pid, tail)
	}
}

// checkTransport checks, from the ready lines, that every rank reached its peers over the
// transport asked for: shared memory with all of them (auto, where the OS has it) or none,
// or, on simulated hosts, with those of its host; that it saw the hosts there are; and
// that it set the send buffer of its TCP connections where, and only where, they run over
// veth (hosts that are network namespaces: Config.TCPSendBuffer's default).
func (w *procWorld) checkTransport(mode procMode) {
	w.t.Helper()
	for r := range w.kids {
		l, ok := w.last(r, "ready ")
		if !ok {
			w.t.Fatalf("rank %d never said ready", r)
		}
		var shm, hosts, sndbuf int
		var direct int64
		if _, err := fmt.Sscanf(l.text, "ready shm=%d hosts=%d sndbuf=%d direct=%d", &shm, &hosts, &sndbuf, &direct); err != nil {
			w.t.Fatalf("rank %d: %q: %v", r, l.text, err)
		}
		// Direct reads where asked for, in worlds of 2 to 4 ranks on one machine over shared
		// memory, unless a rank may not read: then on no rank. Otherwise, the machine decides.
		if mode.direct || mode.deny != "" {
			can := mode.direct && mode.deny == "" && mode.hosts == "" && mode.transport == allreduce.TransportAuto && allreduce.ShmSupported && len(w.kids) <= 4
			if can != (direct >= 0) {
				w.t.Fatalf("rank %d, %v: %q: want direct reads %t", r, mode, l.text, can)
			}
		}
		// Bounded by default only across veth, and there only under BBR.
		bbr := strings.HasPrefix(w.cc, "bbr")
		if bound := mode.netns && hostCount(mode.hosts) > 1 && bbr; bound != (sndbuf > 0) {
			w.t.Fatalf("rank %d, %v: %q: send buffers set on %d TCP connections, want some only across veth under BBR (here %q)", r, mode, l.text, sndbuf, w.cc)
		}
		// On one machine: every connection over shared memory, or none. On hosts: exactly
		// the rank's host peers, all of which it connects to.
		okShm := func(shm int) bool { return shm > 0 }
		wantHosts := 1
		if mode.hosts != "" {
			peers := strings.Count(mode.hosts, mode.hosts[r:r+1]) - 1
			okShm = func(shm int) bool { return shm == peers }
			wantHosts = hostCount(mode.hosts)
		}
		if mode.transport != allreduce.TransportAuto || !allreduce.ShmSupported {
			okShm = func(shm int) bool { return shm == 0 }
		}
		if mode.transport == allreduce.TransportTCP {
			wantHosts = len(w.kids) // no host published: each rank is a host of its own
		}
		if !okShm(shm) || hosts != wantHosts {
			w.t.Fatalf("rank %d, %v: %q: wrong number of peers over shared memory, or of hosts (want %d)", r, mode, l.text, wantHosts)
		}
	}
}

func TestProcessesCorrect(t *testing.T) {
	for _, tr := range transports {
		for _, n := range []int{2, 5} {
			t.Run(fmt.Sprintf("%s/n=%d", tr, n), func(t *testing.T) { processesCorrect(t, procMode{transport: tr}, n) })
		}
	}
	for _, m := range []procMode{{transport: allreduce.TransportAuto, hosts: "AABBA"}, {transport: allreduce.TransportAuto, hosts: "AABBA", netns: true}} {
		t.Run(m.String(), func(t *testing.T) { processesCorrect(t, m, len(m.hosts)) })
	}
	// Across veth, whichever congestion control the machine has: the send buffers are
	// bounded under BBR only (Reno is always there; BBR where the kernel has it).
	for _, cc := range []string{"reno", "bbr"} {
		m := procMode{transport: allreduce.TransportAuto, hosts: "AB", netns: true, cc: cc}
		t.Run(m.String(), func(t *testing.T) { processesCorrect(t, m, len(m.hosts)) })
	}
	// Reading the peers' buffers, with 2, 3 and 4 ranks; and with one rank that may not
	// read the others' memory (seccomp), which keeps all of them on the rings.
	for _, n := range []int{2, 3, 4} {
		m := procMode{transport: allreduce.TransportAuto, direct: true}
		t.Run(fmt.Sprintf("%v/n=%d", m, n), func(t *testing.T) { processesCorrect(t, m, n) })
	}
	t.Run("denied", func(t *testing.T) {
		if runtime.GOOS != "linux" || (runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64") {
			t.Skipf("the test's seccomp filter is for Linux on amd64 and arm64, not %s/%s", runtime.GOOS, runtime.GOARCH)
		}
		processesCorrect(t, procMode{transport: allreduce.TransportAuto, direct: true, deny: "1"}, 3)
	})
}

func processesCorrect(t *testing.T, mode procMode, n int) {
	w := startProcs(t, "correct", mode, n, 10*time.Second)
	w.await(60*time.Second, "every rank to exit", func() bool {
		for r := range n {
			if done, _ := w.exited(r); !done {
				return false
			}
		}
		return true
	})
	for r := range n {
		_, err := w.exited(r)
		_, ok := w.last(r, "ok")
		if err != nil || !ok {
			w.dump()
			t.Fatalf("rank %d: exit %v", r, err)
		}
	}
	w.checkTransport(mode)
}

// shmFiles lists /dev/shm entries that elasticd could have made (other programs' are left out).
func shmFiles() []string {
	ents, _ := os.ReadDir("/dev/shm")
	var out []string
	for _, e := range ents {
		// Open MPI's segments (vader_segment.<hostname>...) name the benchmark's hosts,
		// elasticd-xh-*, when make bench-compare-hosts runs alongside: not ours.
		if n := strings.ToLower(e.Name()); strings.Contains(n, "elasticd") && !strings.HasPrefix(n, "vader_segment.") {
			out = append(out, e.Name())
		}
	}
	return out
}

// faultWorld starts n ranks looping a 4 MiB Allreduce and waits until every rank has done
// at least three iterations.
func faultWorld(t *testing.T, mode procMode, n int, timeout time.Duration) *procWorld {
	w := startProcs(t, "loop", mode, n, timeout)
	w.await(60*time.Second, "three iterations on every rank", func() bool {
		for r := range n {
			if w.iterations(r) < 3 {
				if done, err := w.exited(r); done {
					w.dump()
					t.Fatalf("rank %d exited early: %v", r, err)
				}
				return false
			}
		}
		return true
	})
	w.checkTransport(mode)
	return w
}

// awaitSurvivors waits for every rank but victim to report its failure and exit, and
// returns each one's report.
func awaitSurvivors(t *testing.T, w *procWorld, victim int, since time.Time, d time.Duration) map[int]line {
	t.Helper()
	reports := map[int]line{}
	w.await(d, "every survivor to report the failure and exit", func() bool {
		for r := range w.kids {
			if r == victim {
				continue
			}
			l, ok := w.last(r, "lost ")
			if !ok {
				return false
			}
			reports[r] = l
			if done, _ := w.exited(r); !done {
				return false
			}
		}
		return true
	})
	for r, l := range reports {
		if _, err := w.exited(r); err != nil {
			t.Errorf("rank %d exited with %v", r, err)
		}
		t.Logf("rank %d, %v after the signal: %s", r, l.at.Sub(since).Round(time.Millisecond), l.text)
	}
	return reports
}

// checkDirect checks, where the ranks read each other's buffers, that the survivors'
// allreduces before the failure did (faultWorld waited for three on every rank), so that
// the failure hit that path.
func checkDirect(t *testing.T, mode procMode, reports map[int]line) {
	t.Helper()
	if !mode.direct {
		return
	}
	for r, l := range reports {
		var n int
		i := strings.LastIndex(l.text, " direct=")
		if _, err := fmt.Sscanf(l.text[max(i, 0):], " direct=%d", &n); i < 0 || err != nil || n < 3 {
			t.Errorf("rank %d: %s; want at least 3 direct allreduces before the failure", r, l.text)
		}
	}
}

// checkHierarchical checks, on simulated hosts, that the survivors' allreduces before the
// failure took the hierarchical path (faultWorld waited for three on every rank), so that
// the failure hit that path and not the flat ring.
func checkHierarchical(t *testing.T, mode procMode, reports map[int]line) {
	t.Helper()
	if mode.hosts == "" {
		return
	}
	for r, l := range reports {
		i := strings.LastIndex(l.text, " hier=")
		if n, err := strconv.Atoi(l.text[i+len(" hier="):]); i < 0 || err != nil || n < 3 {
			t.Errorf("rank %d: %s; want at least 3 hierarchical allreduces before the failure", r, l.text)
		}
	}
}

// TestProcessKilled: SIGKILL one rank mid-run; every survivor reports ErrPeerLost naming it
// within 2s. Timeout is 20s, so the detection cannot come from the timeout. Two ranks too:
// over shared memory both of a rank's ring neighbours are then the same link, on which it
// waits for room and for data at once.
func TestProcessKilled(t *testing.T) {
	for _, m := range faultModes {
		t.Run(m.String(), func(t *testing.T) { processKilled(t, m, 4, 2) })
	}
	t.Run("auto/n=2", func(t *testing.T) { processKilled(t, procMode{transport: allreduce.TransportAuto}, 2, 1) })
	t.Run("auto/direct/n=2", func(t *testing.T) { processKilled(t, procMode{transport: allreduce.TransportAuto, direct: true}, 2, 1) })
}

func processKilled(t *testing.T, mode procMode, n, victim int) {
	before := shmFiles()
	w := faultWorld(t, mode, n, 20*time.Second)
	// The segments are memfds, in no file system; a named segment would have to be unlinked
	// by a process that may be the one killed.
	defer func() {
		for _, f := range shmFiles() {
			if !slices.Contains(before, f) {
				t.Errorf("/dev/shm/%s appeared during the test and is still there", f)
			}
		}
	}()
	killed := time.Now()
	if err := w.kids[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	reports := awaitSurvivors(t, w, victim, killed, 10*time.Second)
	checkHierarchical(t, mode, reports)
	checkDirect(t, mode, reports)
	for r, l := range reports {
		if d := l.at.Sub(killed); d > 2*time.Second {
			t.Errorf("rank %d reported the loss %v after the kill", r, d)
		}
		want := fmt.Sprintf("lost peerlost=true rank=%d ", victim)
		if !strings.HasPrefix(l.text, want) {
			t.Errorf("rank %d: %s; want an ErrPeerLost naming rank %d", r, l.text, victim)
		}
		if strings.Contains(l.text, "silent=true") {
			t.Errorf("rank %d: %s; a killed peer is lost, not silent", r, l.text)
		}
	}
}

// TestProcessStopped: SIGSTOP one rank mid-run; with Timeout 1s every survivor returns
// within a few seconds with ErrPeerLost. Then the stopped rank is resumed, killed and reaped.
func TestProcessStopped(t *testing.T) {
	for _, m := range faultModes {
		t.Run(m.String(), func(t *testing.T) { processStopped(t, m) })
	}
}

func processStopped(t *testing.T, mode procMode) {
	const victim = 2
	timeout := time.Second
	if mode.hosts != "" {
		// A rank of the hierarchical allreduce can wait on one peer for a whole phase (the
		// last phase waits for the rings across hosts), not one chunk as in the flat ring:
		// under -race on a loaded machine a healthy wait came close to 1s.
		timeout = 2 * time.Second
	}
	w := faultWorld(t, mode, 4, timeout)
	p := w.kids[victim].cmd.Process
	stopped := time.Now()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	reports := awaitSurvivors(t, w, victim, stopped, 20*time.Second)
	checkHierarchical(t, mode, reports)
	checkDirect(t, mode, reports)
	for r, l := range reports {
		if d := l.at.Sub(stopped); d > timeout+3*time.Second {
			t.Errorf("rank %d reported the loss %v after the stop (timeout %v)", r, d, timeout)
		}
		if !strings.HasPrefix(l.text, "lost peerlost=true ") {
			t.Errorf("rank %d: %s; want an ErrPeerLost", r, l.text)
		}
		// Only the rank that reads from the stopped one can tell it from a rank that is
		// waiting too: the ranks after it in the ring go silent at the same moment, and
		// their own timeouts race with the abort naming the stopped rank. Blaming a waiting
		// rank is a known limitation (no keepalives while waiting); see the report.
		if r == (victim+1)%len(w.kids) && !strings.HasPrefix(l.text, fmt.Sprintf("lost peerlost=true rank=%d via=%d silent=true ", victim, victim)) {
			t.Errorf("rank %d reads from rank %d: %s; want it to name rank %d as silent (ErrPeerSilent)", r, victim, l.text, victim)
		}
	}
	if done, _ := w.exited(victim); done {
		t.Fatalf("rank %d exited while stopped", victim)
	}
	p.Signal(syscall.SIGCONT)
	p.Signal(syscall.SIGKILL)
	select {
	case <-w.kids[victim].done:
	case <-time.After(10 * time.Second):
		t.Fatalf("stopped rank %d not reaped after SIGCONT and SIGKILL", victim)
	}
}

// netnsHost is a network namespace standing for a host, and its address on the veth link.
type netnsHost struct{ name, addr string }

// makeNetnsHosts makes one network namespace per host letter of spec (two of them), joined
// by a veth pair limited to rate (tc's syntax, "" for none), with TCP congestion control cc
// in both ("" leaves the machine's), and deletes them when the test ends. It returns the
// hosts and the congestion control their connections get. It skips the test where
// namespaces cannot be made (not root, no ip(8), not Linux), or cc cannot be set.
func makeNetnsHosts(t *testing.T, spec, rate, cc string) (map[byte]netnsHost, string) {
	t.Helper()
	var letters []byte
	for i := range len(spec) {
		if !slices.Contains(letters, spec[i]) {
			letters = append(letters, spec[i])
		}
	}
	if len(letters) != 2 {
		t.Fatalf("hosts %q: the veth link joins exactly two namespaces", spec)
	}
	ip := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
		return nil
	}
	// Names unique to this test process, so parallel test runs do not collide.
	id := os.Getpid() % 1000000
	hosts := map[byte]netnsHost{}
	for i, l := range letters {
		h := netnsHost{fmt.Sprintf("elar%d%c", id, 'a'+i), fmt.Sprintf("10.231.%d.%d", id%250, i+1)}
		if err := ip("netns", "add", h.name); err != nil {
			t.Skipf("cannot make network namespaces here: %v", err)
		}
		t.Cleanup(func() {
			if err := ip("netns", "del", h.name); err != nil {
				t.Error(err)
			}
		})
		hosts[l] = h
	}
	a, b := hosts[letters[0]], hosts[letters[1]]
	va, vb := fmt.Sprintf("ea%d", id), fmt.Sprintf("eb%d", id)
	for _, args := range [][]string{
		{"link", "add", va, "netns", a.name, "type", "veth", "peer", "name", vb, "netns", b.name},
		{"-n", a.name, "addr", "add", a.addr + "/24", "dev", va},
		{"-n", b.name, "addr", "add", b.addr + "/24", "dev", vb},
		{"-n", a.name, "link", "set", va, "up"},
		{"-n", b.name, "link", "set", vb, "up"},
		{"-n", a.name, "link", "set", "lo", "up"},
		{"-n", b.name, "link", "set", "lo", "up"},
	} {
		if err := ip(args...); err != nil {
			t.Fatal(err)
		}
	}
	for _, end := range []struct{ ns, dev string }{{a.name, va}, {b.name, vb}} {
		if rate == "" {
			break
		}
		out, err := exec.Command("ip", "netns", "exec", end.ns, "tc", "qdisc", "add", "dev", end.dev, "root",
			"tbf", "rate", rate, "burst", "1mb", "latency", "100ms").CombinedOutput()
		if err != nil {
			t.Skipf("cannot limit the link's rate: tc: %v: %s", err, bytes.TrimSpace(out))
		}
	}
	// The namespaces' sockets get their namespace's default, which a new one copies from
	// the machine's; set where asked for, then read back.
	const ccFile = "/proc/sys/net/ipv4/tcp_congestion_control"
	got := ""
	for _, h := range []netnsHost{a, b} {
		if cc != "" {
			out, err := exec.Command("ip", "netns", "exec", h.name, "sh", "-c", "echo "+cc+" > "+ccFile).CombinedOutput()
			if err != nil {
				avail, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_available_congestion_control")
				t.Skipf("cannot set TCP congestion control %s in a namespace: %v: %s (available: %s)", cc, err, bytes.TrimSpace(out), bytes.TrimSpace(avail))
			}
		}
		out, err := exec.Command("ip", "netns", "exec", h.name, "cat", ccFile).Output()
		if err != nil {
			t.Fatalf("ip netns exec %s cat %s: %v", h.name, ccFile, err)
		}
		got = string(bytes.TrimSpace(out))
		if cc != "" && got != cc {
			t.Fatalf("namespace %s: congestion control %q after setting %q", h.name, got, cc)
		}
	}
	return hosts, got
}

// TestHierarchicalNetnsTimings logs how long a 16 MiB sum takes on 2+2 ranks in two network
// namespaces joined by a veth pair, unlimited and limited to 1 Gbit/s each way: with the
// slices, with one leader per host, and over the flat ring. It asserts nothing about time
// (the machine is shared); set ELASTICD_TEST_TIMINGS=1 to run it.
func TestHierarchicalNetnsTimings(t *testing.T) {
	if os.Getenv("ELASTICD_TEST_TIMINGS") == "" {
		t.Skip("timings only: set ELASTICD_TEST_TIMINGS=1")
	}
	for _, rate := range []string{"", "1gbit"} {
		t.Run("rate="+rate, func(t *testing.T) {
			const spec = "AABB"
			w := startProcs(t, "timings", procMode{transport: allreduce.TransportAuto, hosts: spec, netns: true, rate: rate}, len(spec), 30*time.Second)
			w.await(5*time.Minute, "every rank to exit", func() bool {
				for r := range w.kids {
					if done, _ := w.exited(r); !done {
						return false
					}
				}
				return true
			})
			for r := range w.kids {
				l, ok := w.last(r, "timings ")
				if _, err := w.exited(r); err != nil || !ok {
					w.dump()
					t.Fatalf("rank %d: exit %v", r, err)
				}
				t.Logf("rank %d: %s", r, l.text)
			}
		})
	}
}
