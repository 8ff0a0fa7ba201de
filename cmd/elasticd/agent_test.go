package main_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver"
)

// fakeIMDS speaks EC2's instance metadata service (IMDSv2) for one instance: a session token,
// the instance ID, and a spot instance-action the test arms.
type fakeIMDS struct {
	srv *httptest.Server
	id  string

	mu     sync.Mutex
	action string // the spot/instance-action document; "" answers 404
}

func newFakeIMDS(t *testing.T, id string) *fakeIMDS {
	f := &fakeIMDS{id: id}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.URL.Path == "/latest/api/token" {
			if r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds") == "" {
				http.Error(w, "missing TTL", http.StatusBadRequest)
				return
			}
			w.Write([]byte("token-" + id))
			return
		}
		if r.Header.Get("X-aws-ec2-metadata-token") != "token-"+id {
			http.Error(w, "", http.StatusUnauthorized)
			return
		}
		f.mu.Lock()
		action := f.action
		f.mu.Unlock()
		switch r.URL.Path {
		case "/latest/meta-data/instance-id":
			w.Write([]byte(id))
		case "/latest/meta-data/spot/instance-action":
			if action == "" {
				http.NotFound(w, r)
				return
			}
			w.Write([]byte(action))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// interrupt arms a spot interruption at deadline.
func (f *fakeIMDS) interrupt(deadline time.Time) {
	b, _ := json.Marshal(map[string]string{"action": "terminate", "time": deadline.UTC().Format(time.RFC3339)})
	f.mu.Lock()
	f.action = string(b)
	f.mu.Unlock()
}

// agentProc is a real `elasticd agent` process.
type agentProc struct{ *job }

func startAgent(t *testing.T, args ...string) agentProc {
	t.Helper()
	return agentProc{startJob(t, append([]string{"agent"}, args...)...)}
}

// workerPIDs are the PIDs of the workers the agent started.
func (a agentProc) workerPIDs() []int {
	var pids []int
	for _, m := range regexp.MustCompile(`started worker.* pid=(\d+)`).FindAllStringSubmatch(a.output(), -1) {
		pid, _ := strconv.Atoi(m[1])
		pids = append(pids, pid)
	}
	return pids
}

// stop sends SIGTERM and expects a clean exit with no worker left.
func (a agentProc) stop(t *testing.T) {
	t.Helper()
	pids := a.workerPIDs()
	a.cmd.Process.Signal(syscall.SIGTERM)
	if code := a.wait(15 * time.Second); code != 0 {
		t.Errorf("agent exited %d after SIGTERM, want 0", code)
	}
	waitGone(t, pids, 5*time.Second)
}

func writeSecret(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "agent-secret")
	if err := os.WriteFile(path, []byte("c2VjcmV0LXNoYXJlZC1ieS1kcml2ZXItYW5kLWFnZW50cw==\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// freeAddr is a loopback address nothing listens on now, for a driver that must be started
// again on the same --listen.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// driverURL waits for the driver to say where it listens.
func driverURL(j *job) string {
	return "http://" + j.waitFor(`rendezvous listening" addr=(\S+)`, 30*time.Second)[1]
}

var eventRe = regexp.MustCompile(`event step=(\d+) world=(\d+) gen=(\d+)`)

// steps lists the steps rank 0 committed, in the order printed.
func steps(out string) []int {
	var s []int
	for _, m := range eventRe.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		s = append(s, n)
	}
	return s
}

// TestAgentSpotNotice runs the real binaries: a driver with --launcher agent and two agents,
// each its own host on a loopback address (127.0.0.2, 127.0.0.3) with two slots and a fake
// EC2 metadata service. A 4-worker job trains; a spot interruption then appears on the
// metadata of the host that does not hold rank 0. That host must leave at the next commit,
// before the deadline, without rollback: the committed steps stay contiguous, and the job
// completes with the other host's two workers.
func TestAgentSpotNotice(t *testing.T) {
	secret := writeSecret(t)
	drv := startJob(t, append([]string{"run", "-np", "4", "--min-np", "2", "--launcher", "agent",
		"--agent-secret-file", secret, "--listen", "127.0.0.1:0"},
		trainArgs("--steps", "1500", "--step-delay", "5ms", "--events")...)...)
	url := driverURL(drv)
	imds := map[string]*fakeIMDS{}
	agentsByAddr := map[string]agentProc{}
	for _, addr := range []string{"127.0.0.2", "127.0.0.3"} {
		imds[addr] = newFakeIMDS(t, "i-"+strings.ReplaceAll(addr, ".", ""))
		agentsByAddr[addr] = startAgent(t, "--driver", url, "--agent-secret-file", secret, "--addr", addr, "--slots", "2",
			"--metadata", "aws", "--metadata-url", imds[addr].srv.URL)
	}
	drv.waitFor(`generation 1: world size 4`, 60*time.Second)
	// The host of rank 0 keeps training; the other one is interrupted.
	rank0 := drv.waitFor(`launched worker" worker=(i-\S+)/\d+ rank=0 `, 10*time.Second)[1]
	doomed := "127.0.0.2"
	if rank0 == "i-127002" {
		doomed = "127.0.0.3"
	}
	waitSteps := func(n int) {
		deadline := time.Now().Add(60 * time.Second)
		for s := steps(drv.output()); len(s) == 0 || s[len(s)-1] < n; s = steps(drv.output()) {
			if time.Now().After(deadline) {
				t.Fatalf("rank 0 did not reach step %d", n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitSteps(50)
	warned := time.Now()
	deadline := warned.Add(2 * time.Minute)
	imds[doomed].interrupt(deadline)
	m := drv.waitFor(`generation (\d+): world size 2, resuming at step (\d+)`, 60*time.Second)
	took := time.Since(warned)
	t.Logf("spot notice on %s: training went on with 2 workers after %v (generation %s, step %s)", doomed, took.Round(time.Millisecond), m[1], m[2])
	if took > 30*time.Second {
		t.Errorf("moving off the interrupted host took %v; GCP and Azure warn only 30 s ahead", took)
	}
	if code := drv.wait(2 * time.Minute); code != 0 {
		t.Fatalf("job exit %d, want 0", code)
	}
	out := drv.output()
	s := steps(out)
	for i := 1; i < len(s); i++ {
		if s[i] != s[i-1]+1 {
			t.Fatalf("committed steps not contiguous at %d → %d: a step was lost or rolled back", s[i-1], s[i])
		}
	}
	if len(s) == 0 || s[len(s)-1] != 1500 {
		t.Fatalf("last committed step %v, want 1500", s[len(s)-1:])
	}
	if !strings.Contains(out, "all 2 workers of generation 2 finished") || !strings.Contains(out, "resets 1 of which 0 after failures") {
		t.Fatalf("job did not end with the two survivors after one non-failure reset")
	}
	if !strings.Contains(agentsByAddr[doomed].output(), "interruption notice") {
		t.Error("the interrupted host's agent did not log the notice")
	}
	for _, a := range agentsByAddr {
		a.stop(t)
	}
}

// Bad input to `elasticd agent` and `elasticd run --launcher agent` exits 2 and names the
// flag; an unreachable driver is retried, not fatal.
func TestAgentUsageErrors(t *testing.T) {
	secret := writeSecret(t)
	short := filepath.Join(t.TempDir(), "short")
	os.WriteFile(short, []byte("tiny\n"), 0o600)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"agent", "--agent-secret-file", secret}, "--driver: required"},
		{[]string{"agent", "--driver", "http://127.0.0.1:1"}, "--agent-secret-file: required"},
		{[]string{"agent", "--driver", "http://127.0.0.1:1", "--agent-secret-file", short}, "--agent-secret-file: " + short + " holds 4 bytes"},
		{[]string{"agent", "--driver", "http://127.0.0.1:1", "--agent-secret-file", secret, "--metadata", "oracle"}, `--metadata: "oracle": use auto, aws, gcp, azure or none`},
		{[]string{"agent", "--driver", "127.0.0.1:29400", "--agent-secret-file", secret, "--metadata", "none"}, "--driver \"127.0.0.1:29400\": want the driver's http(s) URL"},
		{[]string{"agent", "--driver", "http://127.0.0.1:1", "--agent-secret-file", secret, "--metadata", "none", "--slots", "-1"}, "--slots: -1: must not be negative"},
		{[]string{"run", "-np", "2", "--launcher", "agent", "--", "true"}, "--agent-secret-file: --launcher agent needs the secret"},
		{[]string{"run", "-np", "2", "--agent-secret-file", secret, "--", "true"}, "--agent-secret-file: only used with --launcher agent"},
		{[]string{"run", "-np", "2", "--provider", "agents", "--", "true"}, "--provider: agents: needs --launcher agent"},
		{[]string{"run", "-np", "2", "--launcher", "agent", "--agent-secret-file", secret, "--listen", "nowhere", "--", "true"}, `--listen: "nowhere": want HOST:PORT`},
	} {
		_, stderr, code := elasticd(t, nil, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("elasticd %v: exit %d, stderr %q; want exit 2 and %q", tc.args, code, stderr, tc.want)
		}
	}

	// No driver there: the agent logs and retries until stopped.
	a := startAgent(t, "--driver", "http://127.0.0.1:1", "--agent-secret-file", secret, "--metadata", "none")
	a.waitFor(`cannot register with the driver; retrying.*driver unreachable`, 10*time.Second)
	a.stop(t)
}

// The agent's help teaches what it does and how to start it.
func TestAgentHelp(t *testing.T) {
	stdout, _, code := elasticd(t, nil, "agent", "--help")
	for _, want := range []string{"--driver", "--agent-secret-file", "CUDA_VISIBLE_DEVICES", "interruption notices", "elasticd agent --driver http://"} {
		if code != 0 || !strings.Contains(stdout, want) {
			t.Errorf("agent --help lacks %q (exit %d)", want, code)
		}
	}
}

// The driver SIGKILLed under the agent launcher, then started again on the same address and
// --checkpoint-dir: the agents find it again and register anew (their old sessions, and the
// workers of the lost job, are gone), and the new job's rank 0 resumes from the checkpoint.
// A driver that re-adopts running workers is not built yet (docs/reliability.md).
func TestAgentsDriverRestartResumesFromCheckpoint(t *testing.T) {
	secret := writeSecret(t)
	ckpt := t.TempDir()
	addr := freeAddr(t)
	args := append([]string{"run", "-np", "2", "--launcher", "agent", "--agent-secret-file", secret, "--listen", addr,
		"--checkpoint-dir", ckpt, "--checkpoint-every", "5"}, trainArgs("--steps", "1200", "--step-delay", "10ms", "--log-every", "100")...)
	drv := startJob(t, args...)
	url := driverURL(drv)
	var agents []agentProc
	for _, a := range []string{"127.0.0.2", "127.0.0.3"} {
		agents = append(agents, startAgent(t, "--driver", url, "--agent-secret-file", secret, "--addr", a, "--slots", "1", "--host-id", "host-"+a))
	}
	drv.waitFor(`\[0\] step +300 `, time.Minute)
	syscall.Kill(drv.cmd.Process.Pid, syscall.SIGKILL)
	drv.wait(10 * time.Second)
	again := startJob(t, args...)
	if code := again.wait(2 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	gens := generations(again.output())
	if len(gens) == 0 || gens[0][1] < 250 {
		t.Fatalf("generations (size, resumed at) %v: want the new job to resume near step 300", gens)
	}
	if !strings.Contains(again.output(), "done: 1200 steps") {
		t.Fatal("the new job did not finish its steps")
	}
	for _, a := range agents {
		a.stop(t)
	}
}

// The driver is SIGKILLed mid-training and started again on its --state-dir: the agents keep
// their workers training through the outage and hand them to the new driver, which takes the
// generation up. No worker restarts, and the steps run on without a gap to the end.
func TestAgentsDriverRestartAdoptsWorkers(t *testing.T) {
	// A crash, and a SIGTERM (systemd stopping the driver for a reboot), which under
	// --launcher agent with --state-dir leaves the job running the same way.
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) { driverRestartAdoptsWorkers(t, sig) })
	}
}

func driverRestartAdoptsWorkers(t *testing.T, sig syscall.Signal) {
	secret := writeSecret(t)
	state := t.TempDir()
	addr := freeAddr(t)
	const steps = 1500
	args := append([]string{"run", "-np", "2", "--launcher", "agent", "--agent-secret-file", secret, "--listen", addr, "--state-dir", state},
		trainArgs("--steps", strconv.Itoa(steps), "--step-delay", "10ms", "--events")...)
	drv := startJob(t, args...)
	url := driverURL(drv)
	var agents []agentProc
	for _, a := range []string{"127.0.0.2", "127.0.0.3"} {
		agents = append(agents, startAgent(t, "--driver", url, "--agent-secret-file", secret, "--addr", a, "--slots", "1", "--host-id", "host-"+a))
	}
	drv.waitFor(`event step=300 `, time.Minute)
	syscall.Kill(drv.cmd.Process.Pid, sig)
	select {
	case <-drv.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the driver still runs 10 s after %v:\n%s", sig, tail(drv.output(), 3000))
	}
	code := drv.wait(time.Second) // it has exited
	if sig == syscall.SIGTERM {
		if code != 0 || !strings.Contains(drv.output(), "the job goes on") {
			t.Fatalf("after SIGTERM the driver exited %d; want 0, saying the job goes on\n%s", code, tail(drv.output(), 3000))
		}
		if strings.Contains(drv.output(), "stopping worker") {
			t.Fatal("the driver stopped workers on SIGTERM")
		}
	}
	if _, err := os.Stat(filepath.Join(state, "state.json")); err != nil {
		t.Fatalf("no state after the %v: %v", sig, err)
	}
	time.Sleep(time.Second) // the workers train on without a driver
	restarted := time.Now()
	again := startJob(t, args...)
	// The restarted driver's status goes on from the job's past, not its own start.
	st := getStatus(t, driverURL(again))
	if !st.StartedAt.Before(restarted.Add(-time.Second)) {
		t.Errorf("the restarted driver says the job started at %v, after the first driver was stopped (%v)", st.StartedAt, restarted)
	}
	if !slices.ContainsFunc(st.Events, func(e driver.JobEvent) bool { return e.At.Before(restarted) && e.Kind == driver.EventHostAdded }) {
		t.Errorf("the restarted driver's events lost the first driver's: %+v", st.Events)
	}
	if sig == syscall.SIGTERM && (len(st.ProgressHistory) == 0 || !st.ProgressHistory[0].T.Before(restarted)) {
		t.Errorf("after a SIGTERM the progress history starts afresh: %d points", len(st.ProgressHistory))
	}
	if code := again.wait(2 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out := again.output()
	if !strings.Contains(out, fmt.Sprintf("done: %d steps", steps)) {
		t.Fatal("the job did not finish its steps")
	}
	if g := generations(out); len(g) != 0 {
		t.Fatalf("the restarted driver started generations %v: it should have taken up the running one", g)
	}
	for _, a := range agents {
		if n := len(a.workerPIDs()); n != 1 {
			t.Fatalf("agent started %d workers: want 1, kept through the driver's restart\n%s", n, a.output())
		}
	}
	// Every step ran, once, in order, across the two drivers' output.
	seen := map[int]bool{}
	first := 0
	for i, o := range []string{drv.output(), out} {
		for _, m := range regexp.MustCompile(`event step=(\d+) `).FindAllStringSubmatch(o, -1) {
			n, _ := strconv.Atoi(m[1])
			seen[n] = true
			if i == 1 && first == 0 {
				first = n
			}
		}
	}
	if first <= 300 {
		t.Fatalf("the restarted driver first heard of step %d: the workers did not train on", first)
	}
	for n := 1; n <= steps; n++ {
		if !seen[n] {
			t.Fatalf("step %d is missing from the output", n)
		}
	}
	if _, err := os.Stat(filepath.Join(state, "state.json")); !os.IsNotExist(err) {
		t.Fatalf("the finished job left its state behind: %v", err)
	}
	for _, a := range agents {
		a.stop(t)
	}
}

// A second fault while the driver is away: the driver is SIGKILLed, then a worker, while no
// driver answers. Its peers' collective fails and they must reset, which needs a driver:
// they keep asking (ELASTICD_DRIVER_WAIT, the agents' --driver-timeout) instead of giving up
// and exiting, and the driver started again takes the generation up, finds the worker gone
// and goes on with the survivors' state: no checkpoint, nothing trained again but the one
// uncommitted step, and the job finishes.
func TestAgentsWorkerFailsWhileTheDriverIsAway(t *testing.T) {
	secret := writeSecret(t)
	state := t.TempDir()
	addr := freeAddr(t)
	const steps = 1200
	args := append([]string{"run", "-np", "3", "--min-np", "2", "--launcher", "agent", "--agent-secret-file", secret, "--listen", addr,
		"--state-dir", state, "--comm-timeout", "2s", "--blacklist-cooldown-range", "1s,1s"},
		trainArgs("--steps", strconv.Itoa(steps), "--step-delay", "10ms", "--events")...)
	drv := startJob(t, args...)
	url := driverURL(drv)
	var agents []agentProc
	for _, a := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		agents = append(agents, startAgent(t, "--driver", url, "--agent-secret-file", secret, "--addr", a, "--slots", "1", "--host-id", "host-"+a))
	}
	drv.waitFor(`event step=200 `, time.Minute)
	syscall.Kill(drv.cmd.Process.Pid, syscall.SIGKILL)
	drv.wait(10 * time.Second)
	pids := agents[2].workerPIDs()
	if len(pids) != 1 {
		t.Fatalf("agent 3 runs workers %v, want 1", pids)
	}
	syscall.Kill(pids[0], syscall.SIGKILL)
	time.Sleep(3 * time.Second) // the survivors' collective fails; they wait for a driver to reset with
	again := startJob(t, args...)
	if code := again.wait(2 * time.Minute); code != 0 {
		t.Fatalf("exit %d\n%s", code, tail(again.output(), 4000))
	}
	out := again.output()
	if !strings.Contains(out, fmt.Sprintf("done: %d steps", steps)) {
		t.Fatal("the job did not finish its steps")
	}
	if strings.Contains(out, "resumed from a checkpoint") || strings.Contains(out, "job starts again") {
		t.Fatalf("the job started over instead of going on with the survivors:\n%s", tail(out, 4000))
	}
	// The dead worker's agent tells the new driver of the exit it never heard, so nobody
	// waits out the adoption or the reset barrier for it.
	if !strings.Contains(out, "adopted a worker that exited while the driver was away") || strings.Contains(out, "did not reach the reset barrier") {
		t.Fatalf("the restarted driver did not learn at once that the worker had exited:\n%s", tail(out, 4000))
	}
	// The survivors went on from where they were: the new driver's first step follows the
	// last one the first driver heard of, give or take the uncommitted step and what was
	// trained unheard meanwhile (nothing: the collective failed at once).
	last, first := 0, 0
	for _, m := range regexp.MustCompile(`event step=(\d+) `).FindAllStringSubmatch(drv.output(), -1) {
		last, _ = strconv.Atoi(m[1])
	}
	if m := regexp.MustCompile(`event step=(\d+) `).FindStringSubmatch(out); m != nil {
		first, _ = strconv.Atoi(m[1])
	}
	if first < last-1 || first > last+50 {
		t.Fatalf("the first driver heard up to step %d, the restarted one first of step %d", last, first)
	}
	for _, a := range agents[:2] {
		if n := len(a.workerPIDs()); n != 1 {
			t.Fatalf("an agent started %d workers: want 1, a survivor kept through the driver's absence\n%s", n, a.output())
		}
	}
	for _, a := range agents {
		a.stop(t)
	}
}

// Two agents claiming one host ID (here both default to this machine's hostname) take the
// host's session from each other; they must pause between registrations and say why, not
// register against each other as fast as the driver answers.
func TestAgentsWithOneHostIDDoNotSpin(t *testing.T) {
	secret := writeSecret(t)
	drv := startJob(t, "run", "-np", "2", "--launcher", "agent", "--agent-secret-file", secret, "--listen", "127.0.0.1:0", "--", "sleep", "60")
	url := driverURL(drv)
	var agents []agentProc
	for _, a := range []string{"127.0.0.2", "127.0.0.3"} {
		agents = append(agents, startAgent(t, "--driver", url, "--agent-secret-file", secret, "--addr", a))
	}
	agents[0].waitFor(`is another agent running with the same --host-id`, 30*time.Second)
	time.Sleep(3 * time.Second) // the scenario: let them fight for a while
	n := 0
	for _, a := range agents {
		n += strings.Count(a.output(), "registered with the driver")
	}
	if n > 40 {
		t.Fatalf("%d registrations in a few seconds: the agents spin", n)
	}
	t.Logf("%d registrations", n)
	for _, a := range agents {
		a.stop(t)
	}
}

// TestAgentHostVanishes: a host dies at once, without a notice (a spot instance reclaimed
// with no warning, a kernel panic): its agent and workers are SIGKILLed together. The
// survivors must go on as soon as the agent's connection closes, not after the agent's 30 s
// lease, and the job completes on the other host.
func TestAgentHostVanishes(t *testing.T) {
	secret := writeSecret(t)
	drv := startJob(t, append([]string{"run", "-np", "4", "--min-np", "2", "--launcher", "agent",
		"--agent-secret-file", secret, "--listen", "127.0.0.1:0"},
		trainArgs("--steps", "1500", "--step-delay", "5ms", "--events")...)...)
	url := driverURL(drv)
	agentsByAddr := map[string]agentProc{}
	for _, addr := range []string{"127.0.0.2", "127.0.0.3"} {
		agentsByAddr[addr] = startAgent(t, "--driver", url, "--agent-secret-file", secret, "--addr", addr, "--slots", "2",
			"--metadata", "none", "--host-id", "host-"+addr)
	}
	drv.waitFor(`generation 1: world size 4`, 60*time.Second)
	rank0 := drv.waitFor(`launched worker" worker=(host-\S+)/\d+ rank=0 `, 10*time.Second)[1]
	doomed := "127.0.0.2"
	if rank0 == "host-127.0.0.2" {
		doomed = "127.0.0.3"
	}
	deadline := time.Now().Add(60 * time.Second)
	for s := steps(drv.output()); len(s) == 0 || s[len(s)-1] < 50; s = steps(drv.output()) {
		if time.Now().After(deadline) {
			t.Fatal("rank 0 did not reach step 50")
		}
		time.Sleep(20 * time.Millisecond)
	}
	a := agentsByAddr[doomed]
	pids := a.workerPIDs()
	killed := time.Now()
	a.cmd.Process.Kill()
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	a.wait(10 * time.Second)
	waitGone(t, pids, 5*time.Second)
	m := drv.waitFor(`generation (\d+): world size 2, resuming at step (\d+)`, 60*time.Second)
	took := time.Since(killed)
	t.Logf("host %s vanished: training went on with 2 workers after %v (generation %s, step %s)", doomed, took.Round(time.Millisecond), m[1], m[2])
	if took > 15*time.Second {
		t.Errorf("the job took %v to go on without a vanished host; its agent's connection closed at once", took)
	}
	if code := drv.wait(2 * time.Minute); code != 0 {
		t.Fatalf("job exit %d, want 0", code)
	}
	if !strings.Contains(drv.output(), "its connection closed") {
		t.Error("the driver did not say the vanished agent's connection closed")
	}
	for addr, a := range agentsByAddr {
		if addr != doomed {
			a.stop(t)
		}
	}
}

// SIGINT still ends a job that a SIGTERM would leave running (--launcher agent with
// --state-dir): the workers are stopped, the exit is 130, and the state says they were.
func TestAgentsSIGINTEndsALeavableJob(t *testing.T) {
	secret := writeSecret(t)
	state := t.TempDir()
	drv := startJob(t, append([]string{"run", "-np", "1", "--launcher", "agent", "--agent-secret-file", secret, "--listen", "127.0.0.1:0", "--state-dir", state},
		trainArgs("--steps", "100000", "--step-delay", "10ms", "--events")...)...)
	a := startAgent(t, "--driver", driverURL(drv), "--agent-secret-file", secret, "--addr", "127.0.0.2", "--slots", "1", "--host-id", "host-a")
	drv.waitFor(`event step=50 `, time.Minute)
	pids := a.workerPIDs()
	syscall.Kill(drv.cmd.Process.Pid, syscall.SIGINT)
	if code := drv.wait(30 * time.Second); code != 130 {
		t.Fatalf("exit %d after SIGINT, want 130\n%s", code, tail(drv.output(), 2000))
	}
	if strings.Contains(drv.output(), "the job goes on") {
		t.Fatal("SIGINT left the job running")
	}
	waitGone(t, pids, 10*time.Second)
	a.stop(t)
}
