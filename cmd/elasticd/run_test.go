package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
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

// job is a real `elasticd run` process whose combined output the test watches.
type job struct {
	t    *testing.T
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
	err  error
}

type lockedWriter struct{ j *job }

func (w lockedWriter) Write(p []byte) (int, error) {
	w.j.mu.Lock()
	defer w.j.mu.Unlock()
	return w.j.out.Write(p)
}

// startJob runs elasticd with args; every job is bounded and killed (by PID) at cleanup.
func startJob(t *testing.T, args ...string) *job {
	t.Helper()
	j := &job{t: t, done: make(chan struct{})}
	j.cmd = exec.Command(binary, args...)
	j.cmd.Stdout, j.cmd.Stderr = lockedWriter{j}, lockedWriter{j}
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { j.err = j.cmd.Wait(); close(j.done) }()
	t.Cleanup(func() {
		j.cmd.Process.Kill()
		<-j.done
		if t.Failed() {
			t.Logf("elasticd output:\n%s", j.output())
		}
	})
	return j
}

func (j *job) output() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.out.String()
}

// waitFor waits until the output matches re, and returns the submatches of the first match.
func (j *job) waitFor(re string, timeout time.Duration) []string {
	j.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.After(timeout)
	for {
		if m := rx.FindStringSubmatch(j.output()); m != nil {
			return m
		}
		select {
		case <-deadline:
			j.t.Fatalf("no %q in the output within %v", re, timeout)
		case <-j.done:
			if m := rx.FindStringSubmatch(j.output()); m != nil {
				return m
			}
			j.t.Fatalf("elasticd exited (%v) without printing %q", j.err, re)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// wait waits for the job to end and returns its exit code.
func (j *job) wait(timeout time.Duration) int {
	j.t.Helper()
	select {
	case <-j.done:
	case <-time.After(timeout):
		j.t.Fatalf("elasticd still running after %v", timeout)
	}
	var ee *exec.ExitError
	if errors.As(j.err, &ee) {
		return ee.ExitCode()
	}
	if j.err != nil {
		j.t.Fatal(j.err)
	}
	return 0
}

// workerPIDs reads the PIDs the driver logged for its workers.
func (j *job) workerPIDs() map[string]int {
	pids := map[string]int{}
	for _, m := range regexp.MustCompile(`launched worker" worker=(\S+) rank=\d+ generation=\d+ pid=(\d+)`).FindAllStringSubmatch(j.output(), -1) {
		pid, _ := strconv.Atoi(m[2])
		pids[m[1]] = pid
	}
	return pids
}

// killAllWorkers SIGKILLs every worker the job has launched so far, all at once; there must be n.
func (j *job) killAllWorkers(n int) {
	j.t.Helper()
	pids := j.workerPIDs()
	if len(pids) != n {
		j.t.Fatalf("worker pids %v, want %d", pids, n)
	}
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGKILL)
	}
}

func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	// A zombie still answers kill(0); it is not running.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return err == nil && !strings.Contains(string(b), ") Z ")
}

// waitGone waits until none of pids runs.
func waitGone(t *testing.T, pids []int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var left []int
		for _, p := range pids {
			if alive(p) {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, p := range left {
				syscall.Kill(p, syscall.SIGKILL)
			}
			t.Fatalf("worker processes %v outlived the driver", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var resumeRe = regexp.MustCompile(`generation (\d+): world size (\d+), resuming at step (\d+)`)

// generations lists (world size, resume step) per generation rank 0 printed.
func generations(out string) [][2]int {
	var g [][2]int
	for _, m := range resumeRe.FindAllStringSubmatch(out, -1) {
		size, _ := strconv.Atoi(m[2])
		step, _ := strconv.Atoi(m[3])
		g = append(g, [2]int{size, step})
	}
	return g
}

func trainArgs(extra ...string) []string {
	return append([]string{"--", trainer, "--log-every", "1000"}, extra...)
}

// SIGKILL of one of four workers: the job continues with three from the last commit (no
// step lost), grows back to four when the slot's cooldown ends, and succeeds.
func TestRunSurvivesSIGKILLAndGrowsBack(t *testing.T) {
	args := append([]string{"run", "-np", "4", "--min-np", "2", "--blacklist-cooldown-range", "2s,10s"},
		trainArgs("--steps", "600", "--step-delay", "5ms", "--die-at-step", "100", "--die-rank", "2")...)
	j := startJob(t, args...)
	if code := j.wait(2 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out := j.output()
	gens := generations(out)
	if len(gens) != 3 {
		t.Fatalf("generations %v, want 4 workers, then 3, then 4 again", gens)
	}
	if gens[0] != [2]int{4, 0} || gens[1] != [2]int{3, 100} || gens[2][0] != 4 || gens[2][1] < 100 {
		t.Fatalf("generations (size, resumed at) %v: want (4,0) (3,100) (4,>=100)", gens)
	}
	if !strings.Contains(out, "killed by SIGKILL") || !strings.Contains(out, "resets 2 of which 1 after failures") {
		t.Fatalf("output lacks the kill or the reset count")
	}
	if m := regexp.MustCompile(`test accuracy (\d+\.\d+)%`).FindStringSubmatch(out); m == nil {
		t.Fatal("no final accuracy")
	} else if acc, _ := strconv.ParseFloat(m[1], 64); acc < 90 {
		t.Fatalf("test accuracy %.2f%%, want > 90%%", acc)
	}
}

// A hung worker (SIGSTOP): its neighbour finds it silent after --comm-timeout and says so
// with its READY; the driver fails it within HungWindow, without waiting out --barrier-timeout
// (a minute here) or a grace that a stopped process cannot answer, and the others go on.
func TestRunHungWorkerIsFailed(t *testing.T) {
	args := append([]string{"run", "-np", "3", "--min-np", "2", "--comm-timeout", "1s", "--barrier-timeout", "1m", "--stop-grace", "30s"},
		trainArgs("--steps", "100000", "--step-delay", "5ms")...)
	j := startJob(t, args...)
	j.waitFor(`generation 1: world size 3`, 30*time.Second)
	time.Sleep(300 * time.Millisecond) // let training run (the scenario, not a synchronisation)
	pids := j.workerPIDs()
	victim := pids["local-1/0"]
	if victim == 0 {
		t.Fatalf("no pid for local-1/0 in %v", pids)
	}
	stoppedAt := time.Now()
	syscall.Kill(victim, syscall.SIGSTOP)
	defer syscall.Kill(victim, syscall.SIGKILL)
	j.waitFor(`generation 2: world size 2`, 40*time.Second)
	t.Logf("went on %v after the SIGSTOP (comm timeout 1s; the hung window %v is cut short when it is the only one missing)", time.Since(stoppedAt).Round(time.Millisecond), driver.HungWindow)
	if !strings.Contains(j.output(), "after a peer found a rank silent") {
		t.Errorf("the hung worker was not failed as silent")
	}
	waitGone(t, []int{victim}, 10*time.Second) // killed at once: no 30 s grace
	syscall.Kill(j.cmd.Process.Pid, syscall.SIGTERM)
	j.wait(30 * time.Second)
}

// A new worker hung as it starts (SIGSTOPped before it ever registers): its peers wait for it
// as their generation forms, for --comm-timeout, then reset saying that a peer went silent,
// and the driver fails the one that never registered at once. The peers do not exit on the
// formation's timeout (they are never launched again), and the job goes on without it.
func TestRunMemberHungWhileTheGroupForms(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "stop-at-start")
	script := fmt.Sprintf(`test -e %q && kill -STOP $$; exec "$0" "$@"`, marker)
	j := startJob(t, "run", "-np", "3", "--min-np", "2", "--comm-timeout", "2s", "--barrier-timeout", "1m",
		"--blacklist-cooldown-range", "1s,1s", "--stop-grace", "30s",
		"--", "/bin/sh", "-c", script, trainer, "--log-every", "1000", "--steps", "100000", "--step-delay", "5ms")
	j.waitFor(`generation 1: world size 3`, 30*time.Second)
	victim := j.workerPIDs()["local-2/0"]
	if victim == 0 {
		t.Fatalf("no pid for local-2/0 in %v", j.workerPIDs())
	}
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(victim, syscall.SIGKILL)
	// Its slot returns after the cooldown, and the worker launched there stops itself.
	j.waitFor(`never registered for the generation its peers waited for`, 60*time.Second)
	failed := time.Now()
	hung := j.workerPIDs()["local-2/0"]
	if hung == victim || hung == 0 {
		t.Fatalf("no second worker on local-2 (pids %v)", j.workerPIDs())
	}
	defer syscall.Kill(hung, syscall.SIGKILL)
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	j.waitFor(`never registered for the generation[^\n]*\n(?s:.*)generation \d+: world size 2`, 30*time.Second)
	t.Logf("went on with 2 workers %v after the hung one was failed", time.Since(failed).Round(time.Millisecond))
	waitGone(t, []int{hung}, 10*time.Second) // killed at once: no 30 s grace
	out := j.output()
	for _, w := range []string{"local-0/0", "local-1/0"} {
		if n := strings.Count(out, `launched worker" worker=`+w+" "); n != 1 {
			t.Errorf("%s launched %d times, want once: it exited on the formation timeout\n%s", w, n, tail(out, 30))
		}
	}
	syscall.Kill(j.cmd.Process.Pid, syscall.SIGTERM)
	j.wait(30 * time.Second)
}

// SIGTERM to the driver: every worker is stopped and none survives it.
func TestRunSIGTERMLeavesNoOrphans(t *testing.T) {
	args := append([]string{"run", "-np", "3", "--stop-grace", "2s"}, trainArgs("--steps", "1000000", "--step-delay", "5ms")...)
	j := startJob(t, args...)
	j.waitFor(`generation 1: world size 3`, 30*time.Second)
	pids := j.workerPIDs()
	if len(pids) != 3 {
		t.Fatalf("pids %v", pids)
	}
	syscall.Kill(j.cmd.Process.Pid, syscall.SIGTERM)
	if code := j.wait(30 * time.Second); code != 130 {
		t.Errorf("exit %d, want 130 (interrupted)", code)
	}
	var list []int
	for _, p := range pids {
		list = append(list, p)
	}
	waitGone(t, list, 5*time.Second)
	if !strings.Contains(j.output(), "interrupted") {
		t.Errorf("no reason printed")
	}
}

// All workers failing ends the job with a non-zero exit and the reason.
func TestRunAllWorkersFail(t *testing.T) {
	j := startJob(t, "run", "-np", "3", "--", "sh", "-c", "exit 3")
	if code := j.wait(time.Minute); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if !regexp.MustCompile(`all 3 workers of generation 1 failed; last failure: rank \d \(local-\d/0\) exit 3`).MatchString(j.output()) {
		t.Fatal("reason missing")
	}
}

// The reset limit counts failure resets (not scale-ups) and ends the job when passed: one
// slot fails each time it is launched, and comes back after a 1 s cooldown.
func TestRunResetLimit(t *testing.T) {
	script := filepath.Join(t.TempDir(), "w.sh")
	os.WriteFile(script, []byte("#!/bin/sh\nif [ \"$ELASTICD_WORKER_ID\" = local-1/0 ]; then sleep 0.3; exit 1; fi\nexec "+trainer+" --steps 1000000 --step-delay 5ms --log-every 1000\n"), 0o755)
	// A slot failing 0.3 s after each return would be flapping, which the limit leaves to
	// quarantine (below): here the window is shorter, so every failure counts.
	j := startJob(t, "run", "-np", "3", "--min-np", "1", "--reset-limit", "1", "--blacklist-cooldown-range", "1s,1s", "--flap-window", "100ms", "--", script)
	if code := j.wait(time.Minute); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if !strings.Contains(j.output(), "reset limit reached: 2 resets caused by failures, --reset-limit 1") {
		t.Fatal("reason missing")
	}
}

// A slot that fails every time it returns is flapping: its failures do not use up
// --reset-limit, after --flap-limit returns it is quarantined and the healthy workers finish
// the job; `elasticd ctl add-host` of its host takes it back.
func TestRunFlappingSlotIsQuarantined(t *testing.T) {
	script := filepath.Join(t.TempDir(), "w.sh")
	os.WriteFile(script, []byte("#!/bin/sh\nif [ \"$ELASTICD_WORKER_ID\" = local-1/0 ]; then sleep 0.3; exit 1; fi\nexec "+trainer+" --steps 3000 --step-delay 5ms --log-every 1000\n"), 0o755)
	secret := writeSecret(t)
	j := startJob(t, "run", "-np", "3", "--min-np", "1", "--reset-limit", "2", "--blacklist-cooldown-range", "1s,1s",
		"--flap-limit", "2", "--admin-secret-file", secret, "--listen", "127.0.0.1:0", "--", script)
	j.waitFor(`slot local-1/0 is flapping`, time.Minute)
	env := []string{"ELASTICD_DRIVER=" + driverURL(j), "ELASTICD_ADMIN_SECRET_FILE=" + secret}
	out, stderr, code := elasticd(t, env, "ctl", "add-host", "local-1")
	if code != 0 || !strings.Contains(out, "1 quarantined slot back in the job") {
		t.Fatalf("ctl add-host: exit %d: %s%s", code, out, stderr)
	}
	j.waitFor(`quarantined slots released by the operator(?s:.*)launched worker" worker=local-1/0`, 30*time.Second)
	if code := j.wait(2 * time.Minute); code != 0 {
		t.Fatalf("exit %d: one bad slot must not end a healthy job", code)
	}
	// Said once per quarantine: before the release, and again after it (the slot is as bad).
	if n := strings.Count(j.output(), "msg=\"slot local-1/0 is flapping"); n != 2 {
		t.Fatalf("flapping said %d times in the log, want 2", n)
	}
}

// Fewer than --min-np usable slots for longer than --elastic-timeout fails the job.
func TestRunBelowMinNPPastElasticTimeout(t *testing.T) {
	hosts := filepath.Join(t.TempDir(), "hosts")
	os.WriteFile(hosts, []byte("127.0.0.1:1\n"), 0o644)
	script := filepath.Join(t.TempDir(), "discover.sh")
	os.WriteFile(script, []byte("#!/bin/sh\ncat "+hosts+"\n"), 0o755)
	start := time.Now()
	j := startJob(t, "run", "-np", "2", "--host-discovery-script", script, "--elastic-timeout", "2s", "--", "sleep", "60")
	if code := j.wait(time.Minute); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if !strings.Contains(j.output(), "only 1 usable slots, fewer than --min-np 2, for longer than --elastic-timeout 2s") {
		t.Fatal("reason missing")
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("took %v", d)
	}
}

// A host dropped by discovery: its worker is stopped and the job goes on without it.
func TestRunHostDroppedByDiscovery(t *testing.T) {
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts")
	os.WriteFile(hosts, []byte("127.0.0.1:1\n127.0.0.2:1\n127.0.0.3:1\n"), 0o644)
	script := filepath.Join(dir, "discover.sh")
	os.WriteFile(script, []byte("#!/bin/sh\ncat "+hosts+"\n"), 0o755)
	args := append([]string{"run", "-np", "3", "--min-np", "2", "--host-discovery-script", script, "--discovery-interval", "200ms"},
		trainArgs("--steps", "400", "--step-delay", "10ms")...)
	j := startJob(t, args...)
	j.waitFor(`generation 1: world size 3`, 30*time.Second)
	os.WriteFile(hosts, []byte("127.0.0.1:1\n127.0.0.2:1\n"), 0o644)
	j.waitFor(`generation 2: world size 2`, 30*time.Second)
	if code := j.wait(2 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(j.output(), `stopping worker" worker=127.0.0.3/0`) {
		t.Fatal("the dropped host's worker was not stopped")
	}
}

// Bad discovery output on the first poll is fatal, with the line quoted.
func TestRunBadDiscoveryOutput(t *testing.T) {
	script := filepath.Join(t.TempDir(), "discover.sh")
	os.WriteFile(script, []byte("#!/bin/sh\necho 'gpu1:two'\n"), 0o755)
	j := startJob(t, "run", "-np", "1", "--host-discovery-script", script, "--", "true")
	if code := j.wait(time.Minute); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if !strings.Contains(j.output(), "gpu1:two") {
		t.Fatal("the malformed line is not quoted")
	}
}

func TestRunUsageErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--", "true"}, "--np: required"},
		{[]string{"run", "-np", "2"}, "no command"},
		{[]string{"run", "-np", "2", "--min-np", "3", "--", "true"}, "--min-np 3"},
		{[]string{"run", "-np", "2", "--launcher", "rsh", "--", "true"}, `--launcher: "rsh"`},
		{[]string{"run", "-np", "2", "--blacklist-cooldown-range", "5m,1s", "--", "true"}, "--blacklist-cooldown-range"},
		{[]string{"run", "-np", "2", "-H", "a:x", "--", "true"}, "--hosts"},
		{[]string{"run", "-np", "2", "--host-discovery-script", "/nonexistent", "--", "true"}, "not an executable file"},
		// A cloud's hosts are other machines: the agent launcher by default, which needs its secret.
		{[]string{"run", "--provider", "gcp", "--project", "my-project-1", "--zone", "us-central1-a", "--mig", "m", "-np", "2", "--", "true"}, "--agent-secret-file: --provider gcp runs the workers on the group's hosts"},
		// The local launcher never runs another machine's workers here.
		{[]string{"run", "-np", "2", "-H", "10.1.2.3:2", "--", "true"}, "--launcher local runs every worker on this machine, but --provider fixed lists host 10.1.2.3 at 10.1.2.3, which is not this machine"},
		{[]string{"run", "-np", "2", "-H", "10.1.2.3:2", "--launcher", "local", "--", "true"}, "use --launcher agent (elasticd agent on each host) or --launcher ssh"},
		{[]string{"run", "-np", "2", "--agent-lease", "10s", "--", "true"}, "--agent-lease: only used with --launcher agent"},
		{[]string{"run", "-np", "2", "--launcher", "agent", "--agent-secret-file", writeSecret(t), "--agent-lease", "500ms", "--", "true"}, "--agent-lease: 500ms: at least 1s"},
	} {
		cmd := exec.CommandContext(ctx, binary, tc.args...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), tc.want) {
			t.Errorf("%v: %v, %q; want exit 2 mentioning %q", tc.args, err, out, tc.want)
		}
	}
	// horovodrun's two-argument form is accepted.
	out, err := exec.CommandContext(ctx, binary, "run", "-np", "1", "--blacklist-cooldown-range", "10", "100", "--", "true").CombinedOutput()
	if err != nil {
		t.Errorf("--blacklist-cooldown-range 10 100: %v\n%s", err, out)
	}
}

// --output-dir keeps each worker's output per worker and generation, beside the terminal.
func TestRunOutputDir(t *testing.T) {
	dir := t.TempDir()
	j := startJob(t, append([]string{"run", "-np", "2", "--output-dir", dir}, trainArgs("--steps", "20")...)...)
	if code := j.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	b, err := os.ReadFile(filepath.Join(dir, "local-0_0", "gen-1.stdout"))
	if err != nil || !strings.Contains(string(b), "generation 1: world size 2") || !strings.Contains(string(b), "test accuracy") {
		t.Fatalf("rank 0's stdout file: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "local-1_0", "gen-1.stderr")); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(j.output(), "[0] generation 1: world size 2") {
		t.Fatal("the terminal lacks rank 0's prefixed line")
	}

	// The post-mortem: report.html with the final status in it, named in the last lines, and
	// no temporary file left beside it.
	report := filepath.Join(dir, "report.html")
	if !strings.Contains(j.output(), "elasticd: report at "+report+" (") {
		t.Errorf("the last lines do not name %s:\n%s", report, j.output())
	}
	b, err = os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`<script type="application/json" id="final-status">(.*?)</script>`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("report.html has no final status")
	}
	var final driver.Status
	if err := json.Unmarshal(m[1], &final); err != nil {
		t.Fatalf("report.html's final status: %v", err)
	}
	if final.Finished == nil || final.Finished.Code != 0 || final.Progress.Step != 20 || final.Progress.TotalSteps != 20 || final.Progress.Loss == nil || len(final.ProgressHistory) == 0 {
		t.Errorf("report.html's status: finished %+v, progress %+v, %d history points; want exit 0 at step 20 of 20 with a loss", final.Finished, final.Progress, len(final.ProgressHistory))
	}
	if tmp, _ := filepath.Glob(filepath.Join(dir, ".report-*")); len(tmp) != 0 {
		t.Errorf("temporary files left: %v", tmp)
	}
}

// --slot-policy roundrobin spreads a job over hosts that offer more slots than it needs;
// packed (the default) fills the first host.
func TestRunSlotPolicy(t *testing.T) {
	for _, tc := range []struct {
		policy string
		want   []string
	}{
		{"roundrobin", []string{"127.0.0.2/0", "127.0.0.3/0"}},
		{"packed", []string{"127.0.0.2/0", "127.0.0.2/1"}},
	} {
		j := startJob(t, append([]string{"run", "-np", "2", "-H", "127.0.0.2:2,127.0.0.3:2", "--slot-policy", tc.policy},
			trainArgs("--steps", "20")...)...)
		if code := j.wait(time.Minute); code != 0 {
			t.Fatalf("%s: exit %d", tc.policy, code)
		}
		var got []string
		for w := range j.workerPIDs() {
			got = append(got, w)
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("--slot-policy %s launched %v, want %v", tc.policy, got, tc.want)
		}
	}
}

// With ELASTICD_STATE_TRANSFER=peers, the worker that joins after its cooldown fetches the
// committed state from the survivors' peerstate servers instead of a broadcast; training
// carries on from where it was and the model still converges.
func TestRunJoinerFetchesStateFromPeers(t *testing.T) {
	t.Setenv("ELASTICD_STATE_TRANSFER", "peers")
	args := append([]string{"run", "-np", "3", "--min-np", "2", "--blacklist-cooldown-range", "1s,10s"},
		trainArgs("--steps", "500", "--step-delay", "5ms", "--die-at-step", "100", "--die-rank", "2")...)
	j := startJob(t, args...)
	if code := j.wait(2 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out := j.output()
	gens := generations(out)
	if len(gens) != 3 || gens[1] != [2]int{2, 100} || gens[2][0] != 3 || gens[2][1] < 100 {
		t.Fatalf("generations (size, resumed at) %v: want (3,0) (2,100) (3,>=100)", gens)
	}
	if m := regexp.MustCompile(`test accuracy (\d+\.\d+)%`).FindStringSubmatch(out); m == nil {
		t.Fatal("no final accuracy")
	} else if acc, _ := strconv.ParseFloat(m[1], 64); acc < 90 {
		t.Fatalf("test accuracy %.2f%%, want > 90%%: the joiner's state was wrong", acc)
	}
}

// The job ID, shown on the unauthenticated status page, in /metrics and in every log line, is
// random and gives nothing of the job secret away.
func TestRunJobIDIsNotFromTheSecret(t *testing.T) {
	ids := map[string]bool{}
	for range 2 {
		j := startJob(t, "run", "-np", "1", "--", "sh", "-c", `echo "id=$ELASTICD_JOB_ID secret=$ELASTICD_SECRET"`)
		if code := j.wait(time.Minute); code != 0 {
			t.Fatalf("exit %d", code)
		}
		m := regexp.MustCompile(`id=([0-9a-f]+) secret=([0-9a-f]+)`).FindStringSubmatch(j.output())
		if m == nil {
			t.Fatalf("no id and secret in the worker's output")
		}
		if strings.Contains(m[2], m[1]) {
			t.Fatalf("job ID %s is part of the secret %s", m[1], m[2])
		}
		ids[m[1]] = true
	}
	if len(ids) != 2 {
		t.Fatal("two jobs got the same ID")
	}
}

// Flags reach the workers' environment: --comm-transport, which the Go runtime hands to
// allreduce (worker.ConfigFromEnv), auto when not given; and ELASTICD_LOAD_EVERY=0s, no
// step-time reports, unless --slot-policy loadaware reads them (sparing the driver a request
// per worker every few seconds). A bad transport is a usage error.
func TestRunWorkerEnvironment(t *testing.T) {
	for _, tc := range []struct {
		flags      []string
		name, want string
	}{
		{nil, "ELASTICD_COMM_TRANSPORT", "auto"},
		{[]string{"--comm-transport", "tcp"}, "ELASTICD_COMM_TRANSPORT", "tcp"},
		{nil, "ELASTICD_LOAD_EVERY", "0s"},
		{[]string{"--slot-policy", "loadaware"}, "ELASTICD_LOAD_EVERY", ""},
	} {
		args := append(append([]string{"run", "-np", "1"}, tc.flags...), "--", "sh", "-c", `echo "`+tc.name+`=[$`+tc.name+`]"`)
		j := startJob(t, args...)
		if code := j.wait(time.Minute); code != 0 {
			t.Fatalf("%v: exit %d", tc.flags, code)
		}
		if !strings.Contains(j.output(), tc.name+"=["+tc.want+"]\n") {
			t.Fatalf("%v: the worker did not see %s=%q\n%s", tc.flags, tc.name, tc.want, tail(j.output(), 10))
		}
	}
	j := startJob(t, "run", "-np", "1", "--comm-transport", "shm", "--", "true")
	if code := j.wait(time.Minute); code != 2 || !strings.Contains(j.output(), `--comm-transport: "shm": use auto or tcp`) {
		t.Fatalf("--comm-transport shm: exit %d, want 2 naming the flag and the values", code)
	}
}

// Every worker SIGKILLed at once: with --checkpoint-dir the job is not over. Rank 0 wrote its
// commit every 5 commits; the slots come back after their cooldown, the new rank 0 resumes
// from the newest checkpoint, and the job finishes at its last step.
func TestRunTotalLossResumesFromCheckpoint(t *testing.T) {
	dir := t.TempDir()
	args := append([]string{"run", "-np", "3", "--min-np", "2", "--checkpoint-dir", dir, "--checkpoint-every", "5",
		"--blacklist-cooldown-range", "1s,1s"}, trainArgs("--steps", "1500", "--step-delay", "10ms", "--log-every", "100")...)
	j := startJob(t, args...)
	j.waitFor(`\[0\] step +300 `, time.Minute)
	j.killAllWorkers(3)
	j.waitFor(`starts over from the newest checkpoint`, 30*time.Second)
	if code := j.wait(2 * time.Minute); code != 0 {
		t.Fatalf("exit %d: a total loss with checkpoints must not end the job", code)
	}
	out := j.output()
	gens := generations(out)
	// Killed after step 300 was printed; the newest checkpoint is at most 5 commits older.
	if len(gens) < 2 || gens[1][1] < 250 {
		t.Fatalf("generations (size, resumed at) %v: want the one after the loss to resume from a checkpoint near step 300", gens)
	}
	if !strings.Contains(out, "resumed from a checkpoint") || !strings.Contains(out, "test accuracy") {
		t.Fatal("no resume from the checkpoint, or no end of training")
	}
	files, _ := filepath.Glob(filepath.Join(dir, "state-*.ckpt"))
	if len(files) == 0 || len(files) > 2 {
		t.Fatalf("checkpoint files %v: want the newest one or two", files)
	}
}

// The driver SIGKILLed mid-training (the local launcher's workers die with it), then started
// again with the same --checkpoint-dir: the job resumes from the last checkpoint instead of
// step 0 and finishes.
func TestRunDriverRestartResumesFromCheckpoint(t *testing.T) {
	dir, state := t.TempDir(), t.TempDir()
	args := append([]string{"run", "-np", "2", "--checkpoint-dir", dir, "--checkpoint-every", "5", "--state-dir", state},
		trainArgs("--steps", "1200", "--step-delay", "10ms", "--log-every", "100")...)
	j := startJob(t, args...)
	j.waitFor(`\[0\] step +300 `, time.Minute)
	pids := j.workerPIDs()
	syscall.Kill(j.cmd.Process.Pid, syscall.SIGKILL)
	j.wait(10 * time.Second)
	var list []int
	for _, p := range pids {
		list = append(list, p)
	}
	waitGone(t, list, 10*time.Second) // no orphan: they died with the driver
	again := startJob(t, args...)
	if code := again.wait(2 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	gens := generations(again.output())
	if len(gens) == 0 || gens[0][1] < 250 {
		t.Fatalf("generations (size, resumed at) %v: want the restarted job to resume near step 300", gens)
	}
	if !strings.Contains(again.output(), "done: 1200 steps") {
		t.Fatal("the restarted job did not finish its steps")
	}
	// The same job, taken up from --state-dir: its ID, and generations counted on.
	jobRe := regexp.MustCompile(`live page at \S+ \(also /v1/status and /metrics\)" job=(\w+)`)
	id1, id2 := jobRe.FindStringSubmatch(j.output()), jobRe.FindStringSubmatch(again.output())
	if id1 == nil || id2 == nil || id1[1] != id2[1] {
		t.Fatalf("job IDs %v and %v: want the same job", id1, id2)
	}
	if m := resumeRe.FindStringSubmatch(again.output()); m == nil || m[1] != "2" {
		t.Fatalf("the restarted driver's first generation: %v, want generation 2", m)
	}
}

// SIGTERM stops the job's workers and keeps its state, marked so; the job started again on
// the directory is the same job (its ID), and once it ends its state is gone.
func TestRunStateDirKeptWhenInterrupted(t *testing.T) {
	state := t.TempDir()
	j := startJob(t, append([]string{"run", "-np", "2", "--state-dir", state}, trainArgs("--steps", "100000", "--step-delay", "10ms", "--log-every", "100")...)...)
	j.waitFor(`\[0\] step +100 `, time.Minute)
	var pids []int
	for _, p := range j.workerPIDs() {
		pids = append(pids, p)
	}
	syscall.Kill(j.cmd.Process.Pid, syscall.SIGTERM)
	if code := j.wait(30 * time.Second); code != 130 {
		t.Fatalf("exit %d after SIGTERM, want 130", code)
	}
	waitGone(t, pids, 10*time.Second)
	b, err := os.ReadFile(filepath.Join(state, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		JobID          string `json:"job_id"`
		Generation     int    `json:"generation"`
		WorkersStopped bool   `json:"workers_stopped"`
		Workers        []any  `json:"workers"`
	}
	if err := json.Unmarshal(b, &st); err != nil || !st.WorkersStopped || len(st.Workers) != 0 || st.Generation != 1 || st.JobID == "" {
		t.Fatalf("state after SIGTERM %s (%v)", b, err)
	}
	again := startJob(t, append([]string{"run", "-np", "2", "--state-dir", state}, trainArgs("--steps", "50")...)...)
	if code := again.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(again.output(), "job="+st.JobID) {
		t.Fatalf("the job started again is not job %s", st.JobID)
	}
	if _, err := os.Stat(filepath.Join(state, "state.json")); !os.IsNotExist(err) {
		t.Fatalf("the finished job left its state: %v", err)
	}
}
