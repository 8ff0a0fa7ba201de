package bench

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/elasticd/elasticd/internal/lan"
)

// The fault kinds of the soak's nemesis, in the order a seed's shuffle starts from.
const (
	FaultWorkerKill = "worker-kill"     // SIGKILL of a worker
	FaultWorkerStop = "worker-stop"     // SIGSTOP of a worker: the job must kill it within --comm-timeout + 1 s
	FaultAgentKill  = "agent-kill"      // SIGKILL of an agent (the host is lost), started again 2–4 s later
	FaultNotice     = "notice"          // elasticd ctl remove-host, then add-host 2–4 s later
	FaultFlap       = "flap"            // a worker SIGKILLed, and the same slot's next worker as soon as it starts
	FaultDriverKill = "driver-kill"     // SIGKILL of the driver, started again 1–2 s later on its --state-dir
	FaultDriverTerm = "driver-term"     // SIGTERM of the driver (it leaves the job running), started again 1–2 s later
	FaultDouble     = "double-kill"     // two workers of two hosts SIGKILLed at once
	FaultAgentStop  = "agent-stop"      // SIGSTOP of an agent for 2–4 s (a host frozen, within its lease), then SIGCONT
	FaultDriverStop = "driver-stop"     // SIGSTOP of the driver for 2–4 s, then SIGCONT
	FaultDiscErr    = "discovery-error" // the discovery script fails (exit 1) for 3–6 s
	FaultDiscHang   = "discovery-hang"  // the discovery script hangs past --discovery-timeout for 3–6 s
	FaultDriverAway = "driver-away"     // SIGKILL of the driver, then of a worker while it is down; the driver started again 1–2 s later

	// With Netns (hosts in network namespaces):
	FaultCutPeers  = "cut-peers"   // a host cut off from the other hosts, both ways, not from the driver, for 3–6 s
	FaultCutDriver = "cut-driver"  // a host cut off from the driver, both ways, not from its peers, for 3–6 s
	FaultCutOneWay = "cut-one-way" // a host's packets to the other hosts dropped, theirs still arriving, for 3–6 s
	FaultSlowLink  = "slow-link"   // a host's link throttled (64 kbit/s, packets queued past 5 ms dropped) for 3–6 s
)

// SoakFaultKinds are every kind the nemesis applies without Netns.
var SoakFaultKinds = []string{FaultWorkerKill, FaultWorkerStop, FaultAgentKill, FaultNotice, FaultFlap, FaultDriverKill, FaultDriverTerm, FaultDouble,
	FaultAgentStop, FaultDriverStop, FaultDiscErr, FaultDiscHang, FaultDriverAway}

// SoakNetFaultKinds are the kinds it adds with Netns.
var SoakNetFaultKinds = []string{FaultCutPeers, FaultCutDriver, FaultCutOneWay, FaultSlowLink}

// The programs a soak can train: the demo trainer (Go, worker.State), or
// bench/pytorch/soak_train.py (PyTorch, elasticd.torch in-process, gloo).
const (
	ProgramGo    = "go"
	ProgramTorch = "torch"
)

//go:embed pytorch/soak_train.py
var soakTorchScript []byte

// SoakBounds are the longest stall each fault kind may cause (CheckSoak's Bounds), for a
// job of program with commTimeout: a reset on this kind of machine (2 cores, 6 workers) is
// allowed resetAllowance, or torchResetAllowance for PyTorch workers (a new one imports torch
// before it joins); "" is a stall with no fault in the 20 s before it.
func SoakBounds(program string, commTimeout time.Duration) map[string]time.Duration {
	r, quiet, hung := resetAllowance, 2*time.Second, commTimeout+time.Second
	if program == ProgramTorch {
		// A worker stopped as it starts is waited for until the formation timeout.
		r, quiet, hung = torchResetAllowance, 3*time.Second, max(hung, torchFormation)
	}
	return map[string]time.Duration{
		"":              quiet,
		FaultWorkerKill: r,
		FaultDouble:     r,
		FaultNotice:     r,
		FaultFlap:       2 * r,                           // two failures of the slot, a rollback each
		FaultWorkerStop: hung + r,                        // found silent (or missing at the formation), killed, then the reset
		FaultAgentKill:  r + 4*time.Second,               // the host's workers lost; it returns 2–4 s later: a reset to let it in
		FaultDriverKill: r + 2*time.Second + restartSlow, // training goes on meanwhile; the new driver adopts the workers
		FaultDriverTerm: r + 2*time.Second + restartSlow,
		FaultDriverAway: r + 2*time.Second + restartSlow, // the survivors wait for the new driver to reset
		FaultAgentStop:  r + 4*time.Second,               // the workers train on; were their output to block on the frozen agent, up to 4 s
		FaultDriverStop: r + 4*time.Second,
		FaultDiscErr:    r, // the hosts stay as they were: nothing should stall
		FaultDiscHang:   r,
		// The cut host's workers are found cut off after --comm-timeout and a probe and
		// failed; after the heal (up to 6 s) the host returns with a reset.
		FaultCutPeers:  commTimeout + time.Second + r + 6*time.Second,
		FaultCutOneWay: commTimeout + time.Second + r + 6*time.Second,
		FaultCutDriver: r + 6*time.Second, // within the agent's lease: its workers train on
		FaultSlowLink:  r + 6*time.Second, // the job crawls; were a collective to time out, a reset
	}
}

const (
	resetAllowance      = 5 * time.Second
	torchResetAllowance = 15 * time.Second
	restartSlow         = 3 * time.Second // a driver's start on a loaded 2-core machine
	// torchFormation is the PyTorch workers' ELASTICD_FORMATION_TIMEOUT: a new one here
	// imports torch and builds its model within seconds, even on a loaded 2-core machine.
	torchFormation = 15 * time.Second
	soakDatasetSz  = 4096
	soakBatch      = 64
	soakCommit     = 5
)

// SoakOptions configure Soak; the flags of `elasticd bench soak`.
type SoakOptions struct {
	Exe         string        // the elasticd binary the job, its agents and ctl run as ("": this process's)
	Program     string        // ProgramGo ("" too) or ProgramTorch
	Trainer     string        // the demo trainer ("": train beside Exe), with ProgramGo
	Python      string        // an interpreter that imports torch, with ProgramTorch ("": /usr/bin/python3, then python3)
	Seed        uint64        // the nemesis's schedule
	Duration    time.Duration // how long faults are applied, 10 s to 24 h
	Hosts       int           // agents on 127.0.0.2 up, 3 to 8
	Slots       int           // slots per host, 1 to 4
	CommTimeout time.Duration // the job's --comm-timeout
	// Netns runs the driver and each agent in its own network namespace, joined by a bridge
	// (Linux, root, iproute2, tc), and adds SoakNetFaultKinds.
	Netns bool
	// Faults are the kinds the nemesis draws from (nil: all it can apply).
	Faults []string
	LogDir string // where the children's output goes ("": discarded)
	JSON   bool
	Out    io.Writer // the summary
	Err    io.Writer // the seed and one line per fault unless JSON
}

// SoakResult is what Soak found: `elasticd bench soak --json`.
type SoakResult struct {
	Seed              uint64          `json:"seed"`
	Program           string          `json:"program"`
	DurationS         float64         `json:"duration_s"`
	Faults            map[string]int  `json:"faults"`
	Schedule          []SoakFault     `json:"schedule"`
	Steps             int64           `json:"steps"`
	Epochs            int             `json:"epochs"`
	Generations       int             `json:"generations"`
	StepsLost         int64           `json:"steps_lost"`
	StepsRolledBack   int64           `json:"steps_rolled_back"`
	DuplicateSamples  int             `json:"duplicate_samples"`
	PaddedSamples     int             `json:"padded_samples"`
	MissingSamples    int             `json:"missing_samples"`
	LongestStallS     float64         `json:"longest_stall_s"`
	LongestStallCause string          `json:"longest_stall_cause"`
	Orphans           []string        `json:"orphans"`
	Resources         []SoakResources `json:"resources"`
	DriverExit        int             `json:"driver_exit"`
	// Interrupted: the soak was stopped (SIGINT, SIGTERM) before its --duration; the job was
	// still ended, and the history so far checked (Resources, left empty, were not).
	Interrupted bool            `json:"interrupted"`
	Violations  []SoakViolation `json:"violations"`
}

// ErrSoakViolation is returned (wrapped) by Soak when an invariant broke.
var ErrSoakViolation = errors.New("soak: invariants broken")

// ErrSoakInterrupted is returned (wrapped) by Soak, when no invariant broke, if it was
// stopped before its duration.
var ErrSoakInterrupted = errors.New("soak: interrupted")

// Soak runs a job of Hosts agents on loopback addresses under `elasticd run --launcher
// agent --state-dir`, the demo trainer logging its history, and applies faults drawn from
// Seed for Duration, one at a time, each healed before the next; then it stops the job and
// everything it started, by PID, and checks the invariants (CheckSoak).
func Soak(ctx context.Context, o SoakOptions) (SoakResult, error) {
	switch {
	case o.Duration < 10*time.Second || o.Duration > 24*time.Hour:
		return SoakResult{}, usageError("duration", "%v: must be from 10s to 24h", o.Duration)
	case o.Hosts < 3 || o.Hosts > 8:
		return SoakResult{}, usageError("hosts", "%d: must be from 3 to 8", o.Hosts)
	case o.Slots < 1 || o.Slots > 4:
		return SoakResult{}, usageError("slots", "%d: must be from 1 to 4", o.Slots)
	case o.CommTimeout < 500*time.Millisecond || o.CommTimeout > time.Minute:
		return SoakResult{}, usageError("comm-timeout", "%v: must be from 500ms to 1m", o.CommTimeout)
	}
	for _, k := range o.Faults {
		switch {
		case slices.Contains(SoakNetFaultKinds, k) && !o.Netns:
			return SoakResult{}, usageError("faults", "%s needs --netns (hosts in network namespaces)", k)
		case !slices.Contains(SoakFaultKinds, k) && !slices.Contains(SoakNetFaultKinds, k):
			return SoakResult{}, usageError("faults", "%q is no fault kind: use %s (and with --netns %s)", k, strings.Join(SoakFaultKinds, ", "), strings.Join(SoakNetFaultKinds, ", "))
		}
	}
	if o.LogDir != "" {
		// Logs lost to a missing directory are what a failing run needs most.
		if err := os.MkdirAll(o.LogDir, 0o755); err != nil {
			return SoakResult{}, usageError("log-dir", "%v", err)
		}
	}
	self, err := executable(o.Exe)
	if err != nil {
		return SoakResult{}, err
	}
	var trainer string
	switch o.Program {
	case "", ProgramGo:
		o.Program = ProgramGo
		trainer, err = demoTrainer(o.Trainer, self)
	case ProgramTorch:
		trainer, err = torchPython(o.Python)
	default:
		err = usageError("program", "%q: use %s (the demo trainer) or %s (PyTorch, elasticd.torch)", o.Program, ProgramGo, ProgramTorch)
	}
	if err != nil {
		return SoakResult{}, err
	}
	out, errw := writers(o.Out, o.Err)
	if o.JSON {
		errw = io.Discard
	}
	s, err := newSoak(self, trainer, o, errw)
	if err != nil {
		return SoakResult{}, err
	}
	defer s.close()
	res, err := s.run(ctx)
	if err != nil {
		return res, err
	}
	if o.JSON {
		if err := json.NewEncoder(out).Encode(res); err != nil {
			return res, err
		}
	} else {
		printSoak(out, res)
	}
	if len(res.Violations) > 0 {
		return res, fmt.Errorf("%w: %d (seed %d)", ErrSoakViolation, len(res.Violations), o.Seed)
	}
	if res.Interrupted {
		return res, fmt.Errorf("%w after %.0f s of %v (seed %d): the history so far holds", ErrSoakInterrupted, res.DurationS, o.Duration, o.Seed)
	}
	return res, nil
}

func printSoak(w io.Writer, r SoakResult) {
	fmt.Fprintf(w, "soak: %s program, seed %d, %.0f s, %d faults", r.Program, r.Seed, r.DurationS, len(r.Schedule))
	for _, k := range slices.Concat(SoakFaultKinds, SoakNetFaultKinds) {
		if r.Faults[k] > 0 {
			fmt.Fprintf(w, ", %s %d", k, r.Faults[k])
		}
	}
	fmt.Fprintf(w, "\n  steps %d (%d epochs, %d generations), committed steps lost %d, uncommitted rolled back %d\n", r.Steps, r.Epochs, r.Generations, r.StepsLost, r.StepsRolledBack)
	fmt.Fprintf(w, "  duplicate samples %d, missing %d, epoch-end padding %d\n  longest stall %s after %s\n  driver exit %d, orphans %d\n",
		r.DuplicateSamples, r.MissingSamples, r.PaddedSamples, fmtDur(r.LongestStallS), r.LongestStallCause, r.DriverExit, len(r.Orphans))
	for _, x := range r.Resources {
		fmt.Fprintf(w, "  %-8s RSS %6d → %6d KiB, fds %3d → %3d, goroutines %3d → %3d\n", x.Role, x.RSSKiBAt0, x.RSSKiB, x.FDsAt0, x.FDs, x.GoroutinesAt0, x.Goroutines)
	}
	if r.Interrupted {
		fmt.Fprintln(w, "  interrupted before its duration: the job was ended and the history so far checked (not its resources)")
	}
	if len(r.Violations) == 0 {
		fmt.Fprintln(w, "  no violation")
	}
	for _, v := range r.Violations {
		fmt.Fprintf(w, "  VIOLATION %s: %s\n", v.Invariant, v.Detail)
	}
}

// torchPython is python, or the first of /usr/bin/python3 (Debian's, with python3-torch) and
// python3 that imports torch.distributed.
func torchPython(python string) (string, error) {
	cands := []string{python}
	if python == "" {
		cands = []string{"/usr/bin/python3", "python3"}
	}
	for _, py := range cands {
		if exec.Command(py, "-c", "import torch.distributed").Run() == nil {
			return py, nil
		}
	}
	if python != "" {
		return "", usageError("python", "%s cannot import torch.distributed: name an interpreter that can (Debian: apt-get install python3-torch, then /usr/bin/python3)", python)
	}
	return "", usageError("python", "neither /usr/bin/python3 nor python3 imports torch.distributed: install Debian's python3-torch (scripts/install-test-deps.sh) or name one with --python")
}

// soak is one run: its processes, and what their output said.
type soak struct {
	o                  SoakOptions
	self, trainer, dir string // trainer: the demo trainer, or with ProgramTorch the Python
	agentSecret, admin string
	stateDir, ckptDir  string
	history, addr      string
	lan                *lan.LAN // with Netns: the driver's and the hosts' namespaces
	discovery          string   // the discovery script; discoveryMode is the file that makes it fail or hang
	discoveryMode      string
	stopFile           string // created at the end: the job ends at its next commit, exit 0
	torchScript        string // bench/pytorch/soak_train.py, written out, with ProgramTorch
	errw               io.Writer
	start              time.Time
	procs              sync.WaitGroup // every child's Wait and output copier

	// mu guards what the output readers learn; the nemesis reads it.
	mu        sync.Mutex
	lastEvent time.Time      // the last step event
	world     int            // its world size
	workers   map[string]int // worker PID → host ID, as the agents logged them
	// workerStart is each worker's start time (/proc/PID/stat) when its agent logged it: a
	// PID is this worker only while it has that start time (the PID may go to any process).
	workerStart map[int]string
	allPIDs     []int // every process of the run: agents, drivers, workers
	logs        []io.Closer
}

// child is a process of the run.
type child struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once it has exited

	mu         sync.Mutex
	stats      int // "runtime stats" lines read from its output
	goroutines int // in the last of them
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// goroutinesNow asks the process (a driver or an agent) for its runtime figures with
// SIGUSR1 and returns the goroutines it logs, or -1 if it says nothing within d.
func (c *child) goroutinesNow(d time.Duration) int {
	c.mu.Lock()
	seen := c.stats
	c.mu.Unlock()
	if c.exited() || syscall.Kill(c.pid(), syscall.SIGUSR1) != nil {
		return -1
	}
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		c.mu.Lock()
		n, g := c.stats, c.goroutines
		c.mu.Unlock()
		if n > seen {
			return g
		}
	}
	return -1
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// wait waits up to d for the exit; its status, or -1.
func (c *child) wait(d time.Duration) int {
	select {
	case <-c.done:
		return c.cmd.ProcessState.ExitCode()
	case <-time.After(d):
		return -1
	}
}

var (
	soakEvent   = regexp.MustCompile(`event step=(\d+) world=(\d+) gen=\d+ t=(\d+)`)
	soakStarted = regexp.MustCompile(`started worker.* pid=(\d+)`)
	soakStats   = regexp.MustCompile(`msg="runtime stats" goroutines=(\d+)`)
)

func newSoak(self, trainer string, o SoakOptions, errw io.Writer) (*soak, error) {
	dir, err := os.MkdirTemp("", "elasticd-soak-*")
	if err != nil {
		return nil, err
	}
	s := &soak{o: o, self: self, trainer: trainer, dir: dir, errw: errw, workers: map[string]int{}, workerStart: map[int]string{}}
	fail := func(err error) (*soak, error) {
		s.close()
		return nil, err
	}
	if o.Netns {
		names := []string{"driver"}
		for i := range o.Hosts {
			names = append(names, hostID(i))
		}
		if s.lan, err = lan.New(fmt.Sprintf("edsoak-%d", os.Getpid()), "10.251.9", names...); err != nil {
			return fail(fmt.Errorf("--netns: %w", err))
		}
	}
	s.agentSecret, s.admin = filepath.Join(dir, "agent-secret"), filepath.Join(dir, "admin-secret")
	s.stateDir, s.ckptDir, s.history = filepath.Join(dir, "state"), filepath.Join(dir, "ckpt"), filepath.Join(dir, "history")
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, f := range []struct{ path, v string }{{s.agentSecret, tag + "-soak-agent-secret\n"}, {s.admin, tag + "-soak-admin-secret\n"}} {
		if err := os.WriteFile(f.path, []byte(f.v), 0o600); err != nil {
			return fail(err)
		}
	}
	for _, d := range []string{s.stateDir, s.ckptDir, s.history} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return fail(err)
		}
	}
	// Discovery lists the agents' addresses, unless the nemesis has it fail or hang (its
	// process group is killed at --discovery-timeout: exec keeps the sleep in it).
	s.discovery, s.discoveryMode, s.stopFile = filepath.Join(dir, "discover.sh"), filepath.Join(dir, "discovery-mode"), filepath.Join(dir, "stop")
	var hosts strings.Builder
	for i := range o.Hosts {
		fmt.Fprintf(&hosts, "%s:%d\n", s.hostAddr(i), o.Slots)
	}
	script := fmt.Sprintf(`#!/bin/sh
# elasticd bench soak's host discovery: the hosts file, unless the nemesis makes it fail or hang.
case "$(cat '%s' 2>/dev/null)" in
error) echo "soak: discovery fails (a fault)" >&2; exit 1 ;;
hang) exec sleep 3600 ;;
esac
exec cat '%s'
`, s.discoveryMode, filepath.Join(dir, "hosts"))
	files := []struct {
		path, body string
		mode       os.FileMode
	}{{filepath.Join(dir, "hosts"), hosts.String(), 0o600}, {s.discovery, script, 0o700}}
	if o.Program == ProgramTorch {
		s.torchScript = filepath.Join(dir, "soak_train.py")
		files = append(files, struct {
			path, body string
			mode       os.FileMode
		}{s.torchScript, string(soakTorchScript), 0o600})
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, []byte(f.body), f.mode); err != nil {
			return fail(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	s.addr = ln.Addr().String()
	ln.Close()
	if s.lan != nil { // the driver's namespace is the soak's alone: any port is free there
		s.addr = net.JoinHostPort(s.lan.Addr("driver"), "29400")
	}
	return s, nil
}

// close deletes the run's directory and its namespaces: every process of the run is gone.
func (s *soak) close() {
	os.RemoveAll(s.dir)
	if s.lan != nil {
		for _, ns := range s.lan.Namespaces() { // what the run missed: its own, by PID
			if pids, err := lan.Pids(ns); err == nil {
				for _, pid := range pids {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		if err := s.lan.Close(); err != nil {
			fmt.Fprintf(s.errw, "soak: %v\n", err)
		}
	}
}

// kinds are the fault kinds the nemesis draws from: Faults, or every kind it can apply.
func (s *soak) kinds() []string {
	if len(s.o.Faults) > 0 {
		return s.o.Faults
	}
	if s.lan != nil {
		return slices.Concat(SoakFaultKinds, SoakNetFaultKinds)
	}
	return SoakFaultKinds
}

// hostAddr is host i's address: 127.0.0.(i+2), or with Netns its namespace's.
func (s *soak) hostAddr(i int) string {
	if s.lan != nil {
		return s.lan.Addr(hostID(i))
	}
	return fmt.Sprintf("127.0.0.%d", i+2)
}

func (s *soak) say(format string, a ...any) {
	fmt.Fprintf(s.errw, "soak +%6.1fs ", time.Since(s.start).Seconds())
	fmt.Fprintf(s.errw, format+"\n", a...)
}

// spawn starts self with args, on machine ("driver" or a host ID; with Netns, in its
// namespace); its output goes to name's log and through each line to scan.
func (s *soak) spawn(ctx context.Context, machine, name string, scan func(string), args ...string) (*child, error) {
	var env []string
	if s.o.Program == ProgramTorch {
		// gloo's traffic on the hosts' own link, not on the address the hostname resolves to
		env = []string{"GLOO_SOCKET_IFNAME=lo", "ELASTICD_FORMATION_TIMEOUT=" + torchFormation.String()}
		if s.lan != nil {
			env[0] = "GLOO_SOCKET_IFNAME=eth0"
		}
	}
	prog := s.self
	if s.lan != nil {
		argv := s.lan.Command(machine, s.self, args...)
		prog, args = argv[0], argv[1:]
	}
	cmd, out, err := startChildEnv(ctx, &s.procs, env, prog, args...)
	if err != nil {
		return nil, err
	}
	var logw io.Writer = io.Discard
	if s.o.LogDir != "" {
		if f, err := os.OpenFile(filepath.Join(s.o.LogDir, name+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644); err == nil {
			s.mu.Lock()
			s.logs = append(s.logs, f)
			s.mu.Unlock()
			logw = f
		}
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	s.mu.Lock()
	s.allPIDs = append(s.allPIDs, cmd.Process.Pid)
	s.mu.Unlock()
	s.procs.Go(func() {
		defer close(c.done) // the output ends once the process has exited
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			fmt.Fprintln(logw, sc.Text())
			if m := soakStats.FindStringSubmatch(sc.Text()); m != nil {
				g, _ := strconv.Atoi(m[1])
				c.mu.Lock()
				c.stats, c.goroutines = c.stats+1, g
				c.mu.Unlock()
			}
			if scan != nil {
				scan(sc.Text())
			}
		}
		io.Copy(io.Discard, out)
	})
	return c, nil
}

func (s *soak) driverArgs() []string {
	np := s.o.Hosts * s.o.Slots
	args := []string{"run", "--launcher", "agent", "--agent-secret-file", s.agentSecret, "--admin-secret-file", s.admin,
		"--listen", s.addr, "--state-dir", s.stateDir, "--checkpoint-dir", s.ckptDir,
		"--host-discovery-script", s.discovery, "--discovery-timeout", "2s",
		"-np", strconv.Itoa(np), "--min-np", "2", "--max-np", strconv.Itoa(np),
		"--comm-timeout", s.o.CommTimeout.String(), "--blacklist-cooldown-range", "1s,1s", "--stop-grace", "1s",
		// A slot flaps when it fails within 1 s of its return (the flap fault's second kill).
		// With the default minute, the nemesis's kills, seconds apart, quarantine slot after
		// slot over an hour, and the job waits below --min-np: flap detection doing its
		// job, which is not what the soak checks.
		"--flap-window", "1s", "--"}
	common := []string{"--events", "--commit-every", strconv.Itoa(soakCommit), "--dataset-size", strconv.Itoa(soakDatasetSz),
		"--batch", strconv.Itoa(soakBatch), "--history", s.history, "--stop-file", s.stopFile}
	if s.o.Program == ProgramTorch {
		return append(append(args, s.trainer, "-u", s.torchScript, "--step-delay", "0.02"), common...)
	}
	return append(append(args, s.trainer, "--steps", "1000000000", "--step-delay", "20ms", "--log-every", "1000000000"), common...)
}

func (s *soak) startDriver(ctx context.Context, n int) (*child, error) {
	return s.spawn(ctx, "driver", fmt.Sprintf("driver-%d", n), func(line string) {
		if m := soakEvent.FindStringSubmatch(line); m != nil {
			w, _ := strconv.Atoi(m[2])
			s.mu.Lock()
			s.lastEvent, s.world = time.Now(), w
			s.mu.Unlock()
		}
	}, s.driverArgs()...)
}

func hostID(i int) string { return fmt.Sprintf("host-%d", i+2) }

func (s *soak) startAgent(ctx context.Context, i, n int) (*child, error) {
	id := hostID(i)
	return s.spawn(ctx, id, fmt.Sprintf("agent-%s-%d", id, n), func(line string) {
		if m := soakStarted.FindStringSubmatch(line); m != nil {
			pid, _ := strconv.Atoi(m[1])
			start := startTime(pid) // "" if it is gone already: never signalled then
			s.mu.Lock()
			s.workers[strconv.Itoa(pid)] = i
			s.workerStart[pid] = start
			s.allPIDs = append(s.allPIDs, pid)
			s.mu.Unlock()
		}
	}, "agent", "--driver", "http://"+s.addr, "--agent-secret-file", s.agentSecret, "--addr", s.hostAddr(i),
		"--host-id", id, "--slots", strconv.Itoa(s.o.Slots), "--metadata", "none")
}

// liveWorkers are the workers alive now, by host index.
func (s *soak) liveWorkers() map[int][]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int][]int{}
	for p, h := range s.workers {
		pid, _ := strconv.Atoi(p)
		if s.workerLocked(pid) {
			out[h] = append(out[h], pid)
		}
	}
	for h := range out {
		slices.Sort(out[h])
	}
	return out
}

// progress is the time and world size of the last step event.
func (s *soak) progress() (time.Time, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastEvent, s.world
}

// waitProgress waits, up to d, for a step event after since (with world size at least
// minWorld); whether one came.
func (s *soak) waitProgress(ctx context.Context, since time.Time, minWorld int, d time.Duration) bool {
	end := time.Now().Add(d)
	for time.Now().Before(end) && ctx.Err() == nil {
		if t, w := s.progress(); t.After(since) && w >= minWorld {
			return true
		}
		sleep(ctx, 50*time.Millisecond)
	}
	return false
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// freeze stops pid with SIGSTOP for d, then lets it go on with SIGCONT, whatever happens
// meanwhile: a frozen process is never left behind.
func freeze(pid int, d time.Duration) {
	syscall.Kill(pid, syscall.SIGSTOP)
	time.Sleep(d)
	syscall.Kill(pid, syscall.SIGCONT)
}

// ours is whether pid is a live process of this run: its command line names the run's
// directory (the driver's --state-dir, the agents' secret, the workers' --history, ctl's
// admin secret). A PID recorded earlier may since belong to another process, another
// soak's worker even: the nemesis signals, and the end counts as orphans, only its own.
func (s *soak) ours(pid int) bool {
	if !alive(pid) {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(cmdline), s.dir)
}

// isWorker is whether pid is still the worker an agent logged with that PID: alive, with the
// start time it had then. A worker gone, its PID may be given to any process, this run's
// agents and drivers too, whose command lines name the run's directory as well: one soak
// killed its own agent that way.
func (s *soak) isWorker(pid int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.workerLocked(pid)
}

func (s *soak) workerLocked(pid int) bool {
	start := s.workerStart[pid]
	return start != "" && alive(pid) && startTime(pid) == start
}

// startTime is field 22 of /proc/PID/stat, the process's start in clock ticks after boot:
// with the PID, it names one process. "" when there is none.
func startTime(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	if f := strings.Fields(rest); ok && len(f) > 19 {
		return f[19]
	}
	return ""
}

// alive is whether pid is a process that has not exited (a zombie has).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	return ok && !strings.HasPrefix(rest, "Z")
}

// resources reads a process's VmRSS (KiB) and its open descriptors.
func resources(pid int) (int64, int) {
	var rss int64
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				rss, _ = strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			}
		}
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return rss, len(fds)
}

func (s *soak) run(ctx context.Context) (SoakResult, error) {
	res := SoakResult{Seed: s.o.Seed, Program: s.o.Program, Faults: map[string]int{}}
	s.start = time.Now()
	where := "on loopback"
	if s.lan != nil {
		where = "in network namespaces"
	}
	s.say("seed %d, duration %v, %d hosts × %d slots %s, --comm-timeout %v, program %s, faults %s", s.o.Seed, s.o.Duration, s.o.Hosts, s.o.Slots, where, s.o.CommTimeout, s.o.Program, strings.Join(s.kinds(), " "))
	// Everything ends by then: the faults, the heal, the stop, the check.
	ctx, cancel := context.WithTimeout(ctx, s.o.Duration+3*time.Minute)
	var extra []SoakViolation
	violate := func(inv, format string, a ...any) {
		v := SoakViolation{inv, fmt.Sprintf(format, a...)}
		s.say("VIOLATION %s: %s", v.Invariant, v.Detail)
		extra = append(extra, v)
	}
	drivers, agents := 0, make([]int, s.o.Hosts)
	var driver *child
	agent := make([]*child, s.o.Hosts)
	defer func() {
		cancel()       // SIGTERM to whatever still runs, SIGKILL 10 s later
		s.procs.Wait() // every child reaped, every reader done
		s.mu.Lock()
		for _, l := range s.logs {
			l.Close()
		}
		s.mu.Unlock()
	}()

	var err error
	if driver, err = s.startDriver(ctx, drivers); err != nil {
		return res, err
	}
	for i := range agent {
		if agent[i], err = s.startAgent(ctx, i, agents[i]); err != nil {
			return res, err
		}
	}
	np := s.o.Hosts * s.o.Slots
	if !s.waitProgress(ctx, s.start, np, time.Minute) {
		return res, fmt.Errorf("the job did not train with %d workers within a minute (children's output: --log-dir)", np)
	}
	sample := func() []SoakResources {
		var r []SoakResources
		rss, fds := resources(driver.pid())
		r = append(r, SoakResources{Role: "driver", RSSKiB: rss, FDs: fds, Goroutines: driver.goroutinesNow(5 * time.Second)})
		for i, a := range agent {
			rss, fds := resources(a.pid())
			r = append(r, SoakResources{Role: hostID(i), RSSKiB: rss, FDs: fds, Goroutines: a.goroutinesNow(5 * time.Second)})
		}
		return r
	}
	sleep(ctx, 2*time.Second) // past the start's first resets
	res.Resources = sample()
	for i := range res.Resources {
		x := &res.Resources[i]
		x.RSSKiBAt0, x.FDsAt0, x.GoroutinesAt0 = x.RSSKiB, x.FDs, x.Goroutines
	}

	rng := mrand.New(mrand.NewPCG(s.o.Seed, 0x50a4))
	var queue []string
	record := func(kind, target string) {
		f := SoakFault{Kind: kind, At: time.Now(), Target: target}
		res.Schedule = append(res.Schedule, f)
		res.Faults[kind]++
		s.say("fault %s %s", kind, target)
	}
	pick := func(exclude int) (int, int, bool) { // a live worker: host, pid
		live := s.liveWorkers()
		var hosts []int
		for h := range s.o.Hosts {
			if h != exclude && len(live[h]) > 0 {
				hosts = append(hosts, h)
			}
		}
		if len(hosts) == 0 {
			return 0, 0, false
		}
		h := hosts[rng.IntN(len(hosts))]
		return h, live[h][rng.IntN(len(live[h]))], true
	}
	// restartDriver signals the driver, runs meanwhile (if any) once it is down, and starts
	// it again 1–2 s after it went.
	restartDriver := func(sig syscall.Signal, meanwhile func()) error {
		syscall.Kill(driver.pid(), sig)
		code := driver.wait(30 * time.Second)
		if sig == syscall.SIGTERM && code != 0 {
			violate("driver-term-leaves", "the driver exited %d after SIGTERM, want 0 (it leaves the job running)", code)
		}
		if code == -1 {
			syscall.Kill(driver.pid(), syscall.SIGKILL)
			driver.wait(10 * time.Second)
		}
		down := time.Now()
		if meanwhile != nil {
			sleep(ctx, 300*time.Millisecond+time.Duration(rng.IntN(500))*time.Millisecond)
			meanwhile()
		}
		sleep(ctx, time.Until(down.Add(time.Second+time.Duration(rng.IntN(1000))*time.Millisecond)))
		drivers++
		d, err := s.startDriver(ctx, drivers)
		if err == nil {
			driver = d
		}
		return err
	}
	ctl := func(args ...string) error {
		c, err := s.spawn(ctx, "driver", "ctl", nil, append([]string{"ctl", "--driver", "http://" + s.addr, "--admin-secret-file", s.admin}, args...)...)
		if err != nil {
			return err
		}
		if code := c.wait(30 * time.Second); code != 0 {
			return fmt.Errorf("elasticd ctl %s: exit %d", strings.Join(args, " "), code)
		}
		return nil
	}
	// A stopped worker must be gone within --comm-timeout + 1 s; a PyTorch worker stopped as
	// its generation forms is waited for until the formation timeout, and the soak cannot
	// tell the two apart, so it allows PyTorch the larger.
	stopBound := s.o.CommTimeout + time.Second
	if s.o.Program == ProgramTorch {
		stopBound = max(stopBound, torchFormation+time.Second)
	}

	end := s.start.Add(s.o.Duration)
	maxFaults := int(s.o.Duration/(2*time.Second)) + 1
	// startFailed: whether a process the nemesis starts again failed to start for the
	// interrupt (the loop then ends, as at its duration), or must fail the soak.
	startFailed := func(err error) bool { return err != nil && ctx.Err() == nil }
faults:
	for n := 0; n < maxFaults && time.Now().Before(end) && ctx.Err() == nil; n++ {
		sleep(ctx, 2*time.Second+time.Duration(rng.IntN(4000))*time.Millisecond)
		if !time.Now().Before(end) {
			break
		}
		// Each fault on a job that trains: the last one healed, a step done since.
		if !s.waitProgress(ctx, time.Now().Add(-500*time.Millisecond), 2, time.Minute) {
			if ctx.Err() == nil { // not the wait cut short by an interrupt
				violate("progress", "no step for a minute before fault %d", n+1)
			}
			break
		}
		if len(queue) == 0 {
			kinds := s.kinds()
			for _, i := range rng.Perm(len(kinds)) {
				queue = append(queue, kinds[i])
			}
		}
		kind := queue[0]
		queue = queue[1:]
		switch kind {
		case FaultWorkerKill:
			if h, pid, ok := pick(-1); ok {
				record(kind, fmt.Sprintf("%s pid %d", hostID(h), pid))
				syscall.Kill(pid, syscall.SIGKILL)
			}
		case FaultDouble:
			h1, p1, ok1 := pick(-1)
			_, p2, ok2 := pick(h1)
			if ok1 && ok2 {
				record(kind, fmt.Sprintf("pids %d and %d", p1, p2))
				syscall.Kill(p1, syscall.SIGKILL)
				syscall.Kill(p2, syscall.SIGKILL)
			}
		case FaultWorkerStop:
			if h, pid, ok := pick(-1); ok {
				record(kind, fmt.Sprintf("%s pid %d", hostID(h), pid))
				at := time.Now()
				syscall.Kill(pid, syscall.SIGSTOP)
				for s.isWorker(pid) && time.Since(at) < 3*stopBound {
					sleep(ctx, 20*time.Millisecond)
				}
				if took := time.Since(at); s.isWorker(pid) || took > stopBound {
					violate("stopped-worker-killed", "worker %d SIGSTOPped: still alive %v later (bound %v)", pid, took.Round(time.Millisecond), stopBound)
					if s.isWorker(pid) {
						syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			}
		case FaultFlap:
			if h, pid, ok := pick(-1); ok {
				record(kind, fmt.Sprintf("%s pid %d, then its slot's next worker", hostID(h), pid))
				before := s.liveWorkers()[h]
				syscall.Kill(pid, syscall.SIGKILL)
				var next int
				for t0 := time.Now(); next == 0 && time.Since(t0) < 20*time.Second && ctx.Err() == nil; sleep(ctx, 10*time.Millisecond) {
					for _, p := range s.liveWorkers()[h] {
						if !slices.Contains(before, p) {
							next = p
						}
					}
				}
				if next != 0 {
					syscall.Kill(next, syscall.SIGKILL)
					s.say("      flap: killed pid %d as it returned", next)
				} else {
					s.say("      flap: the slot did not return within 20 s")
				}
			}
		case FaultAgentKill:
			h := rng.IntN(s.o.Hosts)
			record(kind, fmt.Sprintf("%s agent pid %d", hostID(h), agent[h].pid()))
			syscall.Kill(agent[h].pid(), syscall.SIGKILL)
			agent[h].wait(10 * time.Second)
			sleep(ctx, 2*time.Second+time.Duration(rng.IntN(2000))*time.Millisecond)
			agents[h]++
			a, err := s.startAgent(ctx, h, agents[h])
			if startFailed(err) {
				return res, err
			} else if err != nil {
				break faults
			}
			agent[h] = a
		case FaultNotice:
			h := rng.IntN(s.o.Hosts)
			record(kind, hostID(h))
			if err := ctl("remove-host", s.hostAddr(h)); err != nil && ctx.Err() == nil {
				violate("ctl", "%v", err)
			}
			sleep(ctx, 2*time.Second+time.Duration(rng.IntN(2000))*time.Millisecond)
			if err := ctl("add-host", fmt.Sprintf("%s:%d", s.hostAddr(h), s.o.Slots)); err != nil && ctx.Err() == nil {
				violate("ctl", "%v", err)
			}
		case FaultAgentStop:
			h := rng.IntN(s.o.Hosts)
			record(kind, fmt.Sprintf("%s agent pid %d", hostID(h), agent[h].pid()))
			freeze(agent[h].pid(), 2*time.Second+time.Duration(rng.IntN(2000))*time.Millisecond)
		case FaultDriverStop:
			record(kind, fmt.Sprintf("driver pid %d", driver.pid()))
			freeze(driver.pid(), 2*time.Second+time.Duration(rng.IntN(2000))*time.Millisecond)
		case FaultDiscErr, FaultDiscHang:
			record(kind, "the discovery script")
			mode := map[string]string{FaultDiscErr: "error", FaultDiscHang: "hang"}[kind]
			if err := os.WriteFile(s.discoveryMode, []byte(mode), 0o600); err != nil {
				return res, err
			}
			sleep(ctx, 3*time.Second+time.Duration(rng.IntN(3000))*time.Millisecond)
			if err := os.WriteFile(s.discoveryMode, nil, 0o600); err != nil {
				return res, err
			}
		case FaultDriverKill, FaultDriverTerm:
			sig := map[string]syscall.Signal{FaultDriverKill: syscall.SIGKILL, FaultDriverTerm: syscall.SIGTERM}[kind]
			record(kind, fmt.Sprintf("driver pid %d", driver.pid()))
			if err := restartDriver(sig, nil); startFailed(err) {
				return res, err
			} else if err != nil {
				break faults
			}
		case FaultCutPeers, FaultCutOneWay, FaultCutDriver, FaultSlowLink:
			h := rng.IntN(s.o.Hosts)
			id := hostID(h)
			record(kind, id)
			var errs []error
			switch kind {
			case FaultCutPeers, FaultCutOneWay:
				for o := range s.o.Hosts {
					if o != h {
						errs = append(errs, s.lan.Blackhole(id, hostID(o)))
						if kind == FaultCutPeers {
							errs = append(errs, s.lan.Blackhole(hostID(o), id))
						}
					}
				}
			case FaultCutDriver:
				errs = append(errs, s.lan.Blackhole(id, "driver"), s.lan.Blackhole("driver", id))
			case FaultSlowLink:
				errs = append(errs, s.lan.Throttle(id, "64kbit", "2kb", "5ms"))
			}
			if errors.Join(errs...) == nil {
				sleep(ctx, 3*time.Second+time.Duration(rng.IntN(3000))*time.Millisecond)
			}
			if kind == FaultSlowLink {
				errs = append(errs, s.lan.Unthrottle(id))
			} else {
				errs = append(errs, s.lan.Heal())
			}
			if err := errors.Join(errs...); err != nil {
				return res, err
			}
		case FaultDriverAway:
			h, pid, ok := pick(-1)
			if !ok {
				break
			}
			record(kind, fmt.Sprintf("driver pid %d, then %s pid %d while it is down", driver.pid(), hostID(h), pid))
			if err := restartDriver(syscall.SIGKILL, func() {
				if s.isWorker(pid) { // still the worker picked, not a stranger given its PID
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}); startFailed(err) {
				return res, err
			} else if err != nil {
				break faults
			}
		}
		if driver.exited() {
			violate("driver-runs", "the driver exited %d on its own after fault %d", driver.cmd.ProcessState.ExitCode(), n+1)
			break
		}
	}
	res.DurationS = time.Since(s.start).Seconds()
	res.Interrupted = ctx.Err() != nil

	// The end: the job back at full size, resources measured, the job stopped. An interrupt
	// has already sent every child SIGTERM: nothing is left to measure.
	if res.Interrupted {
		res.Resources = nil
	} else {
		if !s.waitProgress(ctx, time.Now(), np, time.Minute) {
			s.say("the job did not grow back to %d workers within a minute", np)
		}
		for i, r := range sample() {
			res.Resources[i].RSSKiB, res.Resources[i].FDs, res.Resources[i].Goroutines = r.RSSKiB, r.FDs, r.Goroutines
		}
	}
	// The job ends on its own: every rank sees the stop file at its next commit, training
	// returns, the workers exit 0, and so must the driver.
	exit := -1
	if !driver.exited() {
		if err := os.WriteFile(s.stopFile, nil, 0o600); err != nil {
			return res, err
		}
		if exit = driver.wait(time.Minute); exit == -1 {
			violate("driver-exit", "the job still runs a minute after its trainer was told to stop")
			if err := ctl("stop", "soak done"); err != nil {
				violate("ctl", "%v", err)
			}
			exit = driver.wait(time.Minute)
		}
	} else {
		exit = driver.cmd.ProcessState.ExitCode()
	}
	res.DriverExit = exit
	wantExit := 0
	if res.Interrupted { // the interrupt sent the driver SIGTERM, maybe while it started again
		wantExit = exit
	}
	for _, a := range agent {
		syscall.Kill(a.pid(), syscall.SIGTERM)
	}
	for _, a := range agent {
		if a.wait(20*time.Second) == -1 {
			syscall.Kill(a.pid(), syscall.SIGKILL)
		}
	}
	// Every process the run started, or its agents did, must be gone.
	s.mu.Lock()
	pids := slices.Clone(s.allPIDs)
	s.mu.Unlock()
	var orphans []string
	for t0 := time.Now(); time.Since(t0) < 5*time.Second; sleep(ctx, 100*time.Millisecond) {
		orphans = orphans[:0]
		for _, p := range pids {
			if s.ours(p) {
				orphans = append(orphans, strconv.Itoa(p))
			}
		}
		if len(orphans) == 0 {
			break
		}
	}
	for _, p := range orphans {
		pid, _ := strconv.Atoi(p)
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		res.Orphans = append(res.Orphans, fmt.Sprintf("pid %d (%s)", pid, strings.ReplaceAll(string(cmdline), "\x00", " ")))
		syscall.Kill(pid, syscall.SIGKILL)
	}

	events, err := ReadSoakHistory(s.history)
	if err != nil {
		return res, fmt.Errorf("read the history: %w", err)
	}
	c := CheckSoak(events, SoakObservations{
		DatasetSize: soakDatasetSz, Padding: s.o.Program == ProgramTorch, Faults: res.Schedule, Bounds: SoakBounds(s.o.Program, s.o.CommTimeout),
		Orphans: res.Orphans, Resources: res.Resources, ExitCode: exit, WantExit: wantExit,
		FDSlack: 8, RSSGrowth: 64 << 10, GoroutineSlack: 64, Extra: extra,
	})
	res.Steps, res.Epochs, res.Generations = c.Steps, c.Epochs, c.Generations
	res.StepsLost, res.StepsRolledBack = c.StepsLost, c.StepsRolledBack
	res.DuplicateSamples, res.MissingSamples, res.PaddedSamples = c.DuplicateSamples, c.MissingSamples, c.PaddedSamples
	res.LongestStallS, res.LongestStallCause = c.LongestStall.Seconds(), c.StallCause
	res.Violations = c.Violations
	if res.Orphans == nil {
		res.Orphans = []string{}
	}
	if res.Violations == nil {
		res.Violations = []SoakViolation{}
	}
	return res, nil
}
