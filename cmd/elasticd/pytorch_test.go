package main_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver"
)

// Restart mode end to end: examples/pytorch/train_ddp.py, an ordinary torchrun-style script
// (init_process_group from the environment, DDP, a checkpoint every few steps, resume from it
// on start, a checkpoint on SIGTERM), run unmodified by the real binary on real torch with
// gloo on loopback. The tests run one after the other: each job is 4 Python processes
// importing torch, on a 2-core machine.

// torchPython is an interpreter that imports torch: Debian's /usr/bin/python3 with
// python3-torch (scripts/install-test-deps.sh installs it), since a python3 earlier on PATH
// may lack torch. Without one the tests skip, or fail where CI is set.
func torchPython(t *testing.T) string {
	t.Helper()
	py := findTorchPython(t)
	// gloo would otherwise use the address this machine's hostname resolves to: keep the
	// tests' traffic on loopback.
	t.Setenv("GLOO_SOCKET_IFNAME", "lo")
	return py
}

// findTorchPython is torchPython for a parallel test, which cannot set the environment: it
// sets GLOO_SOCKET_IFNAME for its workers itself.
func findTorchPython(t *testing.T) string {
	t.Helper()
	for _, py := range []string{os.Getenv("ELASTICD_TEST_PYTHON"), "/usr/bin/python3", "python3"} {
		if py == "" {
			continue
		}
		if err := exec.Command(py, "-c", "import torch.distributed").Run(); err == nil {
			return py
		}
	}
	msg := "no Python with torch: install Debian's python3-torch (scripts/install-test-deps.sh) or set ELASTICD_TEST_PYTHON"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

func repoPath(t *testing.T, rel string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// ddpArgs is the command after --: the script with a checkpoint in a fresh directory.
func ddpArgs(t *testing.T, py string, extra ...string) (args []string, ckpt string) {
	ckpt = filepath.Join(t.TempDir(), "ckpt.pt")
	return append([]string{"--", py, repoPath(t, "examples/pytorch/train_ddp.py"), "--checkpoint", ckpt, "--hidden", "64"}, extra...), ckpt
}

var stepRe = regexp.MustCompile(`(?m)^\[0\] step (\d+) t=\S+ world=(\d+)`)

// rank0Steps lists rank 0's completed steps and the world size of each, in output order.
func rank0Steps(out string) (nums, worlds []int) {
	for _, m := range stepRe.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		w, _ := strconv.Atoi(m[2])
		nums, worlds = append(nums, n), append(worlds, w)
	}
	return nums, worlds
}

var resumedRe = regexp.MustCompile(`(?m)^\[0\] resumed from step (\d+)`)

func resumes(out string) []int {
	var r []int
	for _, m := range resumedRe.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		r = append(r, n)
	}
	return r
}

// checkSteps checks that every step up to total was completed, in a run where each restart
// resumed from a checkpoint: the steps after a resume continue from the resume point.
func checkSteps(t *testing.T, out string, total int) {
	t.Helper()
	nums, _ := rank0Steps(out)
	seen := map[int]bool{}
	for _, n := range nums {
		seen[n] = true
	}
	for s := 1; s <= total; s++ {
		if !seen[s] {
			t.Fatalf("step %d never completed (steps seen: %v)", s, nums)
		}
	}
	if !strings.Contains(out, fmt.Sprintf("[0] done step %d", total)) {
		t.Fatalf("no \"done step %d\" from rank 0", total)
	}
}

// A worker SIGKILLed mid-training: the whole group restarts from the script's checkpoint,
// the job finishes with exit 0 at the right step, the killed slot alone is blamed, and the
// job's last line gives the steps the restart threw away. --start-timeout is far shorter
// than the job: a script that never registers is not failed for it.
func TestPyTorchRestartSurvivesSIGKILL(t *testing.T) {
	py := torchPython(t)
	cmd, _ := ddpArgs(t, py, "--steps", "60", "--checkpoint-every", "10", "--step-delay", "0.05", "--die-at-step", "25", "--die-rank", "1")
	j := startJob(t, append([]string{"run", "-np", "4", "--min-np", "2", "--start-timeout", "1s", "--blacklist-cooldown-range", "1m,2m"}, cmd...)...)
	if code := j.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out := j.output()
	checkSteps(t, out, 60)
	if r := resumes(out); !slices.Equal(r, []int{20}) {
		t.Fatalf("resumed from %v, want once from the checkpoint at step 20", r)
	}
	if n := strings.Count(out, "its slot is blacklisted"); n != 1 || !strings.Contains(out, `worker failed; its slot is blacklisted" rank=1`) {
		t.Fatalf("%d slots blacklisted: want only the killed rank 1's (its peers' exits are not failures)", n)
	}
	if _, worlds := rank0Steps(out); worlds[len(worlds)-1] != 3 {
		t.Fatalf("final world size %d, want 3", worlds[len(worlds)-1])
	}
	if !strings.Contains(out, "resets 1 of which 1 after failures") {
		t.Fatal("summary does not count one failure restart")
	}
	if !regexp.MustCompile(`rollbacks threw away [1-9]\d* steps`).MatchString(out) {
		t.Fatal("the summary does not give the steps since the checkpoint that the restart threw away")
	}
}

// A slot added by discovery grows the world, in one restart after --scale-up-interval.
func TestPyTorchRestartGrowsWhenAHostIsAdded(t *testing.T) {
	py := torchPython(t)
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts")
	os.WriteFile(hosts, []byte("127.0.0.1:2\n"), 0o644)
	script := filepath.Join(dir, "discover.sh")
	os.WriteFile(script, []byte("#!/bin/sh\ncat "+hosts+"\n"), 0o755)
	cmd, _ := ddpArgs(t, py, "--steps", "80", "--checkpoint-every", "5", "--step-delay", "0.05")
	j := startJob(t, append([]string{"run", "-np", "2", "--max-np", "3", "--host-discovery-script", script,
		"--discovery-interval", "200ms", "--scale-up-interval", "1s"}, cmd...)...)
	j.waitFor(`\[0\] step 5 `, 90*time.Second)
	os.WriteFile(hosts, []byte("127.0.0.1:3\n"), 0o644)
	j.waitFor(`\[0\] step \d+ t=\S+ world=3`, 90*time.Second)
	if code := j.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out := j.output()
	checkSteps(t, out, 80)
	if !strings.Contains(out, "resets 1 of which 0 after failures") {
		t.Fatal("growing should be one restart, not a failure")
	}
}

// A notice (here the operator's `elasticd ctl remove-host`; the clouds' notices take the same
// path) SIGTERMs every worker at once: the script's handler writes a checkpoint of its last
// completed step, and the group resumes from it without the host: no step is lost.
func TestPyTorchRestartNoticeLosesNoStep(t *testing.T) {
	py := torchPython(t)
	secret := writeSecret(t)
	cmd, _ := ddpArgs(t, py, "--steps", "80", "--checkpoint-every", "1000", "--step-delay", "0.05")
	j := startJob(t, append([]string{"run", "-np", "4", "--min-np", "2", "--admin-secret-file", secret, "--listen", "127.0.0.1:0"}, cmd...)...)
	j.waitFor(`\[0\] step 20 `, 90*time.Second)
	env := []string{"ELASTICD_DRIVER=" + driverURL(j), "ELASTICD_ADMIN_SECRET_FILE=" + secret}
	if _, stderr, code := elasticd(t, env, "ctl", "remove-host", "local-3"); code != 0 {
		t.Fatalf("ctl remove-host: exit %d: %s", code, stderr)
	}
	if code := j.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out := j.output()
	checkSteps(t, out, 80)
	r := resumes(out)
	if len(r) != 1 {
		t.Fatalf("resumed %v times, want once", r)
	}
	// The resume point is the last step completed before the restart: none redone.
	nums, worlds := rank0Steps(out)
	i := slices.IndexFunc(worlds, func(w int) bool { return w == 3 })
	if i < 1 || nums[i-1] != r[0] || nums[i] != r[0]+1 {
		t.Fatalf("last step before the restart %d, resumed from %d, next step %d: a step was lost or redone", nums[i-1], r[0], nums[i])
	}
	if !strings.Contains(out, "rollbacks threw away 0 steps") || strings.Contains(out, "unknown amount") {
		t.Fatal("the summary should say that the notice threw away no step")
	}
}

// Two jobs on one machine at once: each generation's MASTER_PORT is found free on rank 0's
// host, so neither job's ranks meet the other's store, and both finish.
func TestPyTorchRestartTwoJobsOnOneMachine(t *testing.T) {
	py := torchPython(t)
	var jobs []*job
	for range 2 {
		cmd, _ := ddpArgs(t, py, "--steps", "30", "--checkpoint-every", "10", "--step-delay", "0.02")
		jobs = append(jobs, startJob(t, append([]string{"run", "-np", "2"}, cmd...)...))
	}
	ports := map[string]bool{}
	for i, j := range jobs {
		if code := j.wait(3 * time.Minute); code != 0 {
			t.Fatalf("job %d: exit %d", i, code)
		}
		checkSteps(t, j.output(), 30)
		for _, m := range regexp.MustCompile(`env: .*MASTER_PORT=(\d+)`).FindAllStringSubmatch(j.output(), -1) {
			ports[fmt.Sprintf("%d:%s", i, m[1])] = true
		}
	}
	if len(ports) != 2 {
		t.Fatalf("MASTER_PORTs %v: want one per job, different", ports)
	}
}

// A script whose rank 0 fails on every start: each restart blacklists the failing slot, and
// --reset-limit ends the job with a line that names the limit and the last failure.
func TestPyTorchRestartResetLimit(t *testing.T) {
	py := torchPython(t)
	cmd, _ := ddpArgs(t, py, "--steps", "30")
	wrapper := filepath.Join(t.TempDir(), "w.sh")
	os.WriteFile(wrapper, []byte("#!/bin/sh\nif [ \"$RANK\" = 0 ]; then echo 'rank 0: cannot read the data set' >&2; exit 1; fi\nexec \"$@\"\n"), 0o755)
	args := append([]string{"run", "-np", "4", "--min-np", "1", "--reset-limit", "2", "--", wrapper}, cmd[1:]...)
	j := startJob(t, args...)
	if code := j.wait(2 * time.Minute); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if !regexp.MustCompile(`job failed: reset limit reached: 3 restarts caused by failures, --reset-limit 2; last failure: rank 0 \(local-\d/0\) exit 1`).MatchString(j.output()) {
		t.Fatal("no clear last line naming the reset limit and the failure")
	}
}

// The driver killed (SIGKILL: no chance to clean up) leaves no worker behind, nor any of
// the processes a worker started.
func TestPyTorchRestartDriverKilledLeavesNoOrphan(t *testing.T) {
	py := torchPython(t)
	cmd, _ := ddpArgs(t, py, "--steps", "100000", "--step-delay", "0.05")
	j := startJob(t, append([]string{"run", "-np", "3"}, cmd...)...)
	j.waitFor(`\[0\] step 3 `, 90*time.Second)
	var pids []int
	for _, pid := range j.workerPIDs() {
		pids = append(pids, pid)
	}
	if len(pids) != 3 {
		t.Fatalf("worker PIDs %v", pids)
	}
	j.cmd.Process.Signal(syscall.SIGKILL)
	<-j.done
	waitGone(t, pids, 15*time.Second)
}

// A cloud's spot notice, through the agents (their fake IMDS), in restart mode: every worker
// gets SIGTERM at once, the script checkpoints its last completed step, and the group resumes
// from it on the other host with no step lost, before the notice's deadline. MASTER_PORT
// comes from the agent of rank 0's host.
func TestPyTorchRestartSpotNoticeThroughAgents(t *testing.T) {
	py := torchPython(t)
	// A CPU job, also on a GPU machine: the agents offer no GPUs, and their workers see none.
	t.Setenv("CUDA_VISIBLE_DEVICES", "")
	secret := writeSecret(t)
	cmd, _ := ddpArgs(t, py, "--steps", "80", "--checkpoint-every", "1000", "--step-delay", "0.05")
	drv := startJob(t, append([]string{"run", "-np", "4", "--min-np", "2", "--launcher", "agent",
		"--agent-secret-file", secret, "--listen", "127.0.0.1:0"}, cmd...)...)
	url := driverURL(drv)
	imds := map[string]*fakeIMDS{}
	agentsByAddr := map[string]agentProc{}
	for _, addr := range []string{"127.0.0.2", "127.0.0.3"} {
		imds[addr] = newFakeIMDS(t, "i-"+strings.ReplaceAll(addr, ".", ""))
		agentsByAddr[addr] = startAgent(t, "--driver", url, "--agent-secret-file", secret, "--addr", addr, "--slots", "2",
			"--metadata", "aws", "--metadata-url", imds[addr].srv.URL)
	}
	rank0 := drv.waitFor(`launched worker" worker=(i-\S+)/\d+ rank=0 `, 60*time.Second)[1]
	doomed := "127.0.0.2"
	if rank0 == "i-127002" {
		doomed = "127.0.0.3"
	}
	drv.waitFor(`\[0\] step 20 `, 90*time.Second)
	warned := time.Now()
	imds[doomed].interrupt(warned.Add(2 * time.Minute))
	drv.waitFor(`\[0\] step \d+ t=\S+ world=2`, 90*time.Second)
	t.Logf("spot notice on %s: training went on with 2 workers after %v", doomed, time.Since(warned).Round(time.Millisecond))
	if code := drv.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out := drv.output()
	checkSteps(t, out, 80)
	nums, worlds := rank0Steps(out)
	r := resumes(out)
	i := slices.IndexFunc(worlds, func(w int) bool { return w == 2 })
	if len(r) != 1 || i < 1 || nums[i-1] != r[0] || nums[i] != r[0]+1 {
		t.Fatalf("resumed from %v; steps around the restart %v: a step was lost or redone", r, nums[max(0, i-2):min(len(nums), i+2)])
	}
	if !strings.Contains(out, "resets 1 of which 0 after failures") || !strings.Contains(out, "rollbacks threw away 0 steps") {
		t.Fatal("the notice should be one restart, not a failure, and throw away no step")
	}
	if !regexp.MustCompile(`env: RANK=0 .*MASTER_PORT=\d+`).MatchString(out) {
		t.Fatal("no MASTER_PORT")
	}
	for _, a := range agentsByAddr {
		if !strings.Contains(a.output(), "CUDA_VISIBLE_DEVICES is empty: offering no GPUs") {
			t.Error("an agent started with CUDA_VISIBLE_DEVICES empty did not say it offers no GPUs")
		}
		a.stop(t)
	}
}

var hvdStepRe = regexp.MustCompile(`(?m)^\[0\] step (\d+) t=\S+ world=(\d+) pid=(\d+)`)

// inProcessSteps reads rank 0's committed steps from an in-process job's output, failing the test
// if rank 0 changed process (survivors keep theirs) or a step went back by more than the one
// of a rollback. A commit whose host check raised HostsUpdatedInterrupt is not printed, so a
// step may be missing from the lines: one skipped step is allowed.
func inProcessSteps(t *testing.T, out string) []int {
	t.Helper()
	var steps []int
	pid0 := 0
	for _, m := range hvdStepRe.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		steps = append(steps, n)
		p, _ := strconv.Atoi(m[3])
		if pid0 == 0 {
			pid0 = p
		} else if p != pid0 {
			t.Fatalf("rank 0 changed process (%d → %d)", pid0, p)
		}
	}
	for i := 1; i < len(steps); i++ {
		if steps[i] > steps[i-1]+2 || steps[i] < steps[i-1]-1 {
			t.Fatalf("committed steps jump %d → %d: more than one step lost or skipped", steps[i-1], steps[i])
		}
	}
	return steps
}

// In-process mode end to end (examples/pytorch/elastic_hvd.py, an Elastic Horovod script with
// its import changed to elasticd.torch): a worker SIGKILLed; the survivors keep their
// processes and roll back at most one step (it commits every step), the killed slot returns
// after its cooldown and the world grows back at a commit, the new rank gets the state, and the
// job ends with exit 0 at the step the data set and world sizes give.
func TestPyTorchInProcessSurvivorsKeepTheirProcesses(t *testing.T) {
	py := torchPython(t)
	j := startJob(t, "run", "-np", "4", "--min-np", "2", "--comm-timeout", "5s", "--blacklist-cooldown-range", "10s,20s", "--",
		py, repoPath(t, "examples/pytorch/elastic_hvd.py"), "--epochs", "6", "--samples", "2048", "--batch-size", "16", "--hidden", "64", "--step-delay", "0.05")
	j.waitFor(`\[0\] step 20 `, 90*time.Second)
	before := map[string]int{}
	for _, m := range regexp.MustCompile(`\[(\d)\] worker pid=(\d+) rank=\d size=4`).FindAllStringSubmatch(j.output(), -1) {
		pid, _ := strconv.Atoi(m[2])
		before[m[1]] = pid
	}
	if len(before) != 4 {
		t.Fatalf("worker PIDs %v", before)
	}
	victim := before["2"]
	syscall.Kill(victim, syscall.SIGKILL)
	j.waitFor(`\[0\] step \d+ t=\S+ world=3 `, 60*time.Second)
	j.waitFor(`world=3 [^\n]*\n(?s:.*)\[0\] step \d+ t=\S+ world=4 `, 60*time.Second) // grown back, after the world of 3
	if code := j.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out := j.output()
	// Survivors kept their processes: no launch of their slots after generation 1.
	for _, m := range regexp.MustCompile(`launched worker" worker=(\S+) rank=\d+ generation=(\d+) pid=(\d+)`).FindAllStringSubmatch(out, -1) {
		if m[2] != "1" && m[1] != "local-2/0" {
			t.Fatalf("%s was launched again in generation %s: survivors must keep their processes", m[1], m[2])
		}
	}
	steps := inProcessSteps(t, out)
	m := regexp.MustCompile(`\[0\] done step (\d+)`).FindStringSubmatch(out)
	if m == nil || steps[len(steps)-1] != atoi(m[1]) {
		t.Fatalf("no done line, or it disagrees with the last commit %d", steps[len(steps)-1])
	}
	if !regexp.MustCompile(`rollbacks threw away [01] steps`).MatchString(out) {
		t.Fatal("the summary should give at most one step rolled back")
	}
}

// In-process mode, a member that dies while its generation forms (a slot whose next worker is
// killed as it starts, as the soak's flap does): the survivors wait for it at the generation's
// store, learn within a second that the driver abandoned the generation (a reset began) and
// move on without it. Were they to wait in init_process_group for the formation timeout
// (a minute), the driver's --barrier-timeout (20 s here) would fail them all and the job.
func TestPyTorchInProcessMemberDiesWhileTheGroupForms(t *testing.T) {
	j, _ := formationFaultJob(t, "exit 3", "", "--comm-timeout", "5s", "--barrier-timeout", "20s")
	// Its slot returns after the cooldown; the new worker exits at once, in the generation
	// that took it in, and the survivors give that generation up.
	j.waitFor(`did not form \(the driver gave this generation up`, 60*time.Second)
	j.waitFor(`did not form [^\n]*\n(?s:.*)\[0\] step \d+ t=\S+ world=2 `, 30*time.Second)
	if code := j.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit %d: the survivors did not go on without the member that died", code)
	}
	inProcessSteps(t, j.output())
}

// formationFaultJob runs examples/pytorch/elastic_hvd.py on 3 workers with flags, each worker
// started through sh, with ELASTICD_FORMATION_TIMEOUT=formation unless that is ""; once
// training is under way it makes
// the returned marker file, after which a worker that starts runs atStart first (exit 3:
// dies as it starts; kill -STOP $$: hangs), and SIGKILLs rank 2, whose slot returns after a
// 1 s cooldown to start such a worker.
func formationFaultJob(t *testing.T, atStart, formation string, flags ...string) (*job, string) {
	py := torchPython(t)
	marker := filepath.Join(t.TempDir(), "fault-at-start")
	env := ""
	if formation != "" {
		env = "env ELASTICD_FORMATION_TIMEOUT=" + formation
	}
	script := fmt.Sprintf(`test -e %q && %s; exec %s "$0" "$@"`, marker, atStart, env)
	args := append([]string{"run", "-np", "3", "--min-np", "2", "--blacklist-cooldown-range", "1s,1s"}, flags...)
	j := startJob(t, append(args, "--", "sh", "-c", script,
		py, repoPath(t, "examples/pytorch/elastic_hvd.py"), "--epochs", "4", "--samples", "1024", "--batch-size", "16", "--hidden", "64", "--step-delay", "0.05")...)
	j.waitFor(`\[0\] step 10 `, 90*time.Second)
	victim := workerPID(t, j.output(), 2, 3)
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(victim, syscall.SIGKILL)
	return j, marker
}

// In-process mode, a member hung while its generation forms (a new worker SIGSTOPped as it
// starts, before it ever reaches the driver): the survivors wait for it at the generation's
// store for the formation timeout (ELASTICD_FORMATION_TIMEOUT, 5 s here), then report that a
// peer went silent, and the driver kills the hung one at once instead of waiting out
// --barrier-timeout (a minute here) for it: the job goes on without it seconds later.
func TestPyTorchInProcessMemberHungWhileTheGroupForms(t *testing.T) {
	j, marker := formationFaultJob(t, "kill -STOP $$", "5s", "--comm-timeout", "2s", "--barrier-timeout", "1m")
	// Its slot returns after the cooldown; the new worker stops itself at once, in the
	// generation that took it in.
	j.waitFor(`did not form \(2 of 3 members reached the group before its formation timeout`, 60*time.Second)
	formed := time.Now()
	j.waitFor(`did not form [^\n]*\n(?s:.*)\[0\] step \d+ t=\S+ world=2 `, 30*time.Second)
	d := time.Since(formed)
	if d > 15*time.Second {
		t.Fatalf("the job went on %v after the formation timeout: the hung member was waited for at the barrier", d)
	}
	if !strings.Contains(j.output(), "never registered for the generation its peers waited for") {
		t.Fatal("the hung member was not the one failed")
	}
	t.Logf("the job went on with 2 workers %v after the formation timeout", d.Round(time.Millisecond))
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	if code := j.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	inProcessSteps(t, j.output())
}

// In-process mode, a new worker that reaches the state sync seconds after the survivors (a
// process that took long to build its model, as one does under load): the survivors wait for
// it at the generation's store, not in the sync's first collective, whose --comm-timeout (2 s)
// would otherwise run out and take the late worker for a hung one, reset after reset, each
// new worker late in turn. torch before 2.3 forms groups under the collectives' timeout.
func TestPyTorchInProcessLateJoinerDoesNotResetTheGroup(t *testing.T) {
	py := torchPython(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "late")
	wrapper := filepath.Join(dir, "late.py")
	// After hvd.init() (the group is built), a worker started once the marker exists sleeps
	// 5 s before the script goes on to its state sync.
	code := fmt.Sprintf(`import os, runpy, sys, time
import elasticd.torch as hvd
init = hvd.init
def late_init(*a, **k):
    init(*a, **k)
    if os.path.exists(%q):
        time.sleep(5)
hvd.init = late_init
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
`, marker)
	if err := os.WriteFile(wrapper, []byte(code), 0o600); err != nil {
		t.Fatal(err)
	}
	j := startJob(t, "run", "-np", "3", "--min-np", "2", "--comm-timeout", "2s",
		"--blacklist-cooldown-range", "1s,1s", "--",
		py, wrapper, repoPath(t, "examples/pytorch/elastic_hvd.py"), "--epochs", "4", "--samples", "1024", "--batch-size", "16", "--hidden", "64", "--step-delay", "0.05")
	j.waitFor(`\[0\] step 10 `, 90*time.Second)
	victim := workerPID(t, j.output(), 2, 3)
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(victim, syscall.SIGKILL)
	j.waitFor(`\[0\] step \d+ t=\S+ world=2 [^\n]*\n(?s:.*)\[0\] step \d+ t=\S+ world=3 `, 90*time.Second)
	if code := j.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out := j.output()
	inProcessSteps(t, out)
	m := regexp.MustCompile(`resets \d+ of which (\d+) after failures`).FindStringSubmatch(out)
	if m == nil || m[1] != "1" {
		t.Fatalf("resets after failures: %v, want 1 (the kill): the late worker was taken for a hung one", m)
	}
}

// workerPID is the PID that the in-process worker printed as rank `rank` of a world of size, in
// out (elastic_hvd.py's and sampler_log.py's "worker pid=P rank=R size=S" line).
func workerPID(t *testing.T, out string, rank, size int) int {
	t.Helper()
	m := regexp.MustCompile(fmt.Sprintf(`\[%d\] worker pid=(\d+) rank=\d+ size=%d`, rank, size)).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no pid for worker %d of %d", rank, size)
	}
	return atoi(m[1])
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// In-process mode, a hung worker and the sampler (cmd/elasticd/testdata/sampler_log.py, an
// Elastic Horovod-style loop over a DataLoader with ElasticSampler and record_batch): one
// worker is SIGSTOPped; the survivors' gradient allreduce times out after --comm-timeout, they
// tell the driver a peer went silent, and it kills the stopped one at once rather than after
// --barrier-timeout (a minute here); its slot returns after the cooldown and the world grows
// back at a commit. Across both resets every sample is trained on exactly once per epoch
// (apart from the padding that keeps ranks in step), judged from what each rank logged.
func TestPyTorchInProcessHungWorkerAndExactlyOnceSampler(t *testing.T) {
	py := torchPython(t)
	logs := t.TempDir()
	const samples, epochs = 2000, 3
	j := startJob(t, "run", "-np", "4", "--min-np", "2", "--comm-timeout", "3s", "--barrier-timeout", "1m", "--stop-grace", "30s",
		"--blacklist-cooldown-range", "2s,10s", "--",
		py, repoPath(t, "cmd/elasticd/testdata/sampler_log.py"), "--log-dir", logs, "--samples", strconv.Itoa(samples), "--epochs", strconv.Itoa(epochs))
	j.waitFor(`\[0\] step 20 `, 90*time.Second)
	victim := workerPID(t, j.output(), 2, 4)
	stoppedAt := time.Now()
	syscall.Kill(victim, syscall.SIGSTOP)
	defer syscall.Kill(victim, syscall.SIGKILL)
	j.waitFor(`\[0\] step \d+ t=\S+ world=3 `, 45*time.Second)
	t.Logf("training went on %v after the SIGSTOP (comm timeout 3s; the hung window %v is cut short when it is the only one missing)", time.Since(stoppedAt).Round(10*time.Millisecond), driver.HungWindow)
	if !strings.Contains(j.output(), "after a peer found a rank silent") {
		t.Fatal("the stopped worker was not failed as silent")
	}
	j.waitFor(`world=3 [^\n]*\n(?s:.*)\[0\] step \d+ t=\S+ world=4 `, 60*time.Second)
	if code := j.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	checkExactlyOnce(t, logs, samples, epochs)
}

// checkExactlyOnce reads sampler_log.py's logs and checks that the steps that count (those
// of each generation that trained, up to where the next one started from) are contiguous,
// were taken by every rank of their generation, and used every sample of each epoch once,
// repeating at most the padding each split of an epoch adds (world size - 1).
func checkExactlyOnce(t *testing.T, dir string, samples, epochs int) {
	t.Helper()
	type batch struct {
		gen, step, epoch int
		idx              []int
	}
	starts := map[int]int{} // generation -> the step it started from
	sizes := map[int]int{}
	var batches []batch
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			fs := strings.Fields(line)
			switch {
			case len(fs) == 5 && fs[0] == "start":
				g, s := atoi(fs[1]), atoi(fs[2])
				if old, ok := starts[g]; ok && old != s {
					t.Fatalf("generation %d started from steps %d and %d on different ranks", g, old, s)
				}
				starts[g], sizes[g] = s, atoi(fs[4])
			case len(fs) == 5 && fs[0] == "batch":
				bt := batch{gen: atoi(fs[1]), step: atoi(fs[2]), epoch: atoi(fs[3])}
				for _, i := range strings.Split(fs[4], ",") {
					bt.idx = append(bt.idx, atoi(i))
				}
				batches = append(batches, bt)
			} // anything else: a line cut short by a kill
		}
	}
	gens := make([]int, 0, len(starts))
	for g := range starts {
		gens = append(gens, g)
	}
	slices.Sort(gens)
	if len(gens) < 3 {
		t.Fatalf("generations that trained: %v; want at least 3 (two resets)", gens)
	}
	upto := map[int]int{} // generation -> the last step of it that counts
	for i, g := range gens {
		upto[g] = 1 << 30
		if i+1 < len(gens) {
			upto[g] = starts[gens[i+1]]
		}
	}
	byStep := map[int][]batch{}
	for _, b := range batches {
		if b.step > starts[b.gen] && b.step <= upto[b.gen] {
			byStep[b.step] = append(byStep[b.step], b)
		}
	}
	counts := make([]map[int]int, epochs)
	splits := make([]int, epochs) // padding allowed per epoch: (size - 1) per generation that split it
	seenSplit := map[[2]int]bool{}
	for s := 1; s <= len(byStep); s++ {
		bs := byStep[s]
		if len(bs) == 0 {
			t.Fatalf("step %d was never taken (steps that count: %d)", s, len(byStep))
		}
		if g := bs[0].gen; len(bs) != sizes[g] {
			t.Fatalf("step %d counts from generation %d, logged by %d of its %d ranks", s, g, len(bs), sizes[g])
		}
		for _, b := range bs {
			if counts[b.epoch] == nil {
				counts[b.epoch] = map[int]int{}
			}
			for _, i := range b.idx {
				counts[b.epoch][i]++
			}
			if k := [2]int{b.gen, b.epoch}; !seenSplit[k] {
				seenSplit[k] = true
				splits[b.epoch] += sizes[b.gen] - 1
			}
		}
	}
	for e := range epochs {
		dups := 0
		for i := range samples {
			switch c := counts[e][i]; {
			case c == 0:
				t.Fatalf("epoch %d: sample %d was never trained on", e, i)
			case c > 1:
				dups += c - 1
			}
		}
		if dups > splits[e] {
			t.Fatalf("epoch %d: %d repeated samples, more than the %d that padding allows", e, dups, splits[e])
		}
		t.Logf("epoch %d: %d samples once each, %d repeated by padding (at most %d)", e, samples, dups, splits[e])
	}
}

// In-process mode, a notice (the operator's `elasticd ctl remove-host`; the clouds' notices
// take the same path): the ranks agree on the change at their next step and reset without a
// rollback, though they commit only every 5 steps: no step is lost or redone, and it is not
// counted as a failure.
func TestPyTorchInProcessNoticeLosesNoStep(t *testing.T) {
	py := torchPython(t)
	secret := writeSecret(t)
	j := startJob(t, "run", "-np", "4", "--min-np", "2", "--admin-secret-file", secret, "--listen", "127.0.0.1:0", "--",
		py, repoPath(t, "examples/pytorch/elastic_hvd.py"), "--epochs", "2", "--samples", "1024", "--batch-size", "16", "--hidden", "64",
		"--step-delay", "0.05", "--commit-every", "5")
	j.waitFor(`\[0\] step 12 `, 90*time.Second)
	env := []string{"ELASTICD_DRIVER=" + driverURL(j), "ELASTICD_ADMIN_SECRET_FILE=" + secret}
	if _, stderr, code := elasticd(t, env, "ctl", "remove-host", "local-3"); code != 0 {
		t.Fatalf("ctl remove-host: exit %d: %s", code, stderr)
	}
	j.waitFor(`\[0\] step \d+ t=\S+ world=3 `, 60*time.Second)
	if code := j.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out := j.output()
	var steps []int
	for _, m := range hvdStepRe.FindAllStringSubmatch(out, -1) {
		steps = append(steps, atoi(m[1]))
	}
	// Every step once, in order; the step whose host check raised HostsUpdatedInterrupt is
	// kept but not printed, so one gap of one step is allowed.
	gaps := 0
	for i := 1; i < len(steps); i++ {
		switch d := steps[i] - steps[i-1]; {
		case d == 2:
			gaps++
		case d != 1:
			t.Fatalf("steps %d → %d: a step was lost or redone", steps[i-1], steps[i])
		}
	}
	if gaps > 1 {
		t.Fatalf("%d steps missing from rank 0's lines, want at most the one that saw the change", gaps)
	}
	if !strings.Contains(out, "rollbacks threw away 0 steps") || strings.Contains(out, "restoring the last commit") {
		t.Fatal("the notice rolled work back")
	}
	if !strings.Contains(out, "resets 1 of which 0 after failures") {
		t.Fatal("the notice should be one reset, not a failure")
	}
}

// In-process mode, every worker SIGKILLed at once: with --checkpoint-dir, TorchState's rank 0
// wrote its commit every 5 commits; the slots come back, the new rank 0 resumes from the
// newest checkpoint, and the job finishes (exit 0) without starting over from step 0.
func TestPyTorchInProcessTotalLossResumesFromCheckpoint(t *testing.T) {
	py := torchPython(t)
	dir := t.TempDir()
	j := startJob(t, "run", "-np", "3", "--min-np", "2", "--checkpoint-dir", dir, "--checkpoint-every", "5",
		"--blacklist-cooldown-range", "1s,1s", "--",
		py, repoPath(t, "examples/pytorch/elastic_hvd.py"), "--epochs", "2", "--samples", "1536", "--batch-size", "16", "--hidden", "64", "--step-delay", "0.05")
	j.waitFor(`\[0\] step 20 `, 90*time.Second)
	j.killAllWorkers(3)
	j.waitFor(`starts over from the newest checkpoint`, 30*time.Second)
	m := j.waitFor(`resumed from checkpoint \S+ \(step (\d+)\)`, 90*time.Second)
	// Killed once step 20 was printed, with a checkpoint every 5 commits: not from the start,
	// and not from a step the workers never reached before the kill.
	if at := atoi(m[1]); at < 15 || at > 40 {
		t.Fatalf("resumed at step %d; want the checkpoint near step 20 (one every 5 commits)", at)
	}
	if code := j.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !regexp.MustCompile(`\[0\] done step \d+`).MatchString(j.output()) {
		t.Fatal("no done line")
	}
}

// In-process PyTorch through agents, and the driver SIGKILLed mid-training and started again
// on its --state-dir: the agents keep the workers (examples/pytorch/elastic_hvd.py) training
// through the outage and hand them to the new driver. No worker process is replaced, and
// rank 0's committed steps run on without a step lost or redone.
func TestPyTorchInProcessDriverRestartAdoptsWorkers(t *testing.T) {
	py := torchPython(t)
	secret := writeSecret(t)
	state := t.TempDir()
	addr := freeAddr(t)
	args := []string{"run", "-np", "2", "--launcher", "agent", "--agent-secret-file", secret, "--listen", addr, "--state-dir", state, "--comm-timeout", "10s", "--",
		py, repoPath(t, "examples/pytorch/elastic_hvd.py"), "--epochs", "3", "--samples", "2048", "--batch-size", "16", "--hidden", "64", "--step-delay", "0.05"}
	drv := startJob(t, args...)
	url := driverURL(drv)
	var agents []agentProc
	for _, a := range []string{"127.0.0.2", "127.0.0.3"} {
		agents = append(agents, startAgent(t, "--driver", url, "--agent-secret-file", secret, "--addr", a, "--slots", "1", "--host-id", "host-"+a))
	}
	drv.waitFor(`\[0\] step 30 `, 90*time.Second)
	syscall.Kill(drv.cmd.Process.Pid, syscall.SIGKILL)
	drv.wait(10 * time.Second)
	time.Sleep(time.Second) // the workers train on without a driver
	again := startJob(t, args...)
	if code := again.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out := again.output()
	for _, a := range agents {
		if n := len(a.workerPIDs()); n != 1 {
			t.Fatalf("agent started %d workers: want 1, kept through the driver's restart\n%s", n, a.output())
		}
	}
	var steps []int
	pids := map[string]bool{}
	after := 0 // steps the restarted driver heard of
	last := ""
	for i, o := range []string{drv.output(), out} {
		for _, m := range hvdStepRe.FindAllStringSubmatch(o, -1) {
			// Output reaches the drivers at least once: a line the agent sent as the first
			// driver was killed comes again to the second, the same line to the microsecond
			// (a step redone would print a later time).
			if m[0] == last {
				continue
			}
			last = m[0]
			steps = append(steps, atoi(m[1]))
			pids[m[3]] = true
			after += i
		}
	}
	t.Logf("%d steps, %d of them heard by the restarted driver", len(steps), after)
	if after == 0 || after == len(steps) {
		t.Fatal("the steps should be heard by both drivers")
	}
	if len(pids) != 1 {
		t.Fatalf("rank 0 ran as processes %v: want one, kept through the restart", pids)
	}
	for i := 1; i < len(steps); i++ {
		if steps[i] != steps[i-1]+1 {
			t.Fatalf("rank 0's steps go %d → %d across the driver's restart: want every step once, in order", steps[i-1], steps[i])
		}
	}
	m := regexp.MustCompile(`\[0\] done step (\d+)`).FindStringSubmatch(out)
	if m == nil || steps[len(steps)-1] != atoi(m[1]) {
		t.Fatalf("no done line from the restarted driver, or it disagrees with the last step %d", steps[len(steps)-1])
	}
	if !strings.Contains(out, "resets 0 of which 0") {
		t.Fatal("the restart should cost no reset")
	}
	for _, a := range agents {
		a.stop(t)
	}
}

// Restart mode (an unmodified torchrun-style script) through agents, and the driver SIGKILLed
// and started again on its --state-dir: the script never talks to elasticd, so nothing in it
// notices; the new driver adopts its processes and the group is not restarted (no step
// redone from the checkpoint, which is only written at the end here).
func TestPyTorchRestartDriverRestartAdoptsWorkers(t *testing.T) {
	py := torchPython(t)
	secret := writeSecret(t)
	state := t.TempDir()
	addr := freeAddr(t)
	cmd, _ := ddpArgs(t, py, "--steps", "120", "--checkpoint-every", "1000", "--step-delay", "0.05")
	args := append([]string{"run", "-np", "2", "--mode", "restart", "--launcher", "agent", "--agent-secret-file", secret, "--listen", addr, "--state-dir", state}, cmd...)
	drv := startJob(t, args...)
	url := driverURL(drv)
	var agents []agentProc
	for _, a := range []string{"127.0.0.2", "127.0.0.3"} {
		agents = append(agents, startAgent(t, "--driver", url, "--agent-secret-file", secret, "--addr", a, "--slots", "1", "--host-id", "host-"+a))
	}
	drv.waitFor(`\[0\] step 30 `, 90*time.Second)
	syscall.Kill(drv.cmd.Process.Pid, syscall.SIGKILL)
	drv.wait(10 * time.Second)
	time.Sleep(time.Second)
	again := startJob(t, args...)
	if code := again.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	both := drv.output() + again.output()
	checkSteps(t, both, 120)
	if r := resumes(both); len(r) != 0 {
		t.Fatalf("the group resumed from its checkpoint at %v: it should have been adopted, not restarted", r)
	}
	for _, a := range agents {
		if n := len(a.workerPIDs()); n != 1 {
			t.Fatalf("agent started %d workers: want 1, kept through the driver's restart\n%s", n, a.output())
		}
	}
	for _, a := range agents {
		a.stop(t)
	}
}

// TestPyTorchInProcessFallsBackAndReturns: a script written for Elastic Horovod
// (elastic_hvd.py, in-process) on the simulated cloud with --manage-capacity and an
// on-demand fallback group: spot runs short (a host reclaimed after its notice), the job falls
// back on an on-demand host, and moves back to spot when it returns, at a commit. Rank 0
// keeps its process throughout, no committed step goes back by more than the one a reclaim
// may cost, and the groups end at zero.
func TestPyTorchInProcessFallsBackAndReturns(t *testing.T) {
	py := torchPython(t)
	scenario := filepath.Join(t.TempDir(), "scenario")
	if err := os.WriteFile(scenario, []byte("20s spot-capacity 1\n55s spot-capacity unlimited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	j := startJob(t, "run", "--provider", "sim", "-np", "4", "--min-np", "2", "--slots-per-host", "2", "--comm-timeout", "5s",
		"--manage-capacity", "--sim-fallback", "--fallback-after", "4s", "--sim-interrupt-warning", "3s", "--sim-scenario", scenario, "--",
		py, repoPath(t, "examples/pytorch/elastic_hvd.py"), "--epochs", "25", "--samples", "2048", "--batch-size", "16", "--hidden", "64", "--step-delay", "0.1")
	j.waitFor(`setting the group's desired size" group="sim group ondemand" from=0 to=1`, 2*time.Minute)
	j.waitFor(`spot capacity is back: moving off the on-demand fallback hosts`, 2*time.Minute)
	if code := j.wait(4 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out := j.output()
	inProcessSteps(t, out)
	if !regexp.MustCompile(`sim group spot: 2 → 0; fallback sim group ondemand: 0 → 1, 1 → 0 \(kept the job going`).MatchString(out) {
		t.Errorf("the last lines do not say what the fallback did")
	}
	if !regexp.MustCompile(`rollbacks threw away [01] steps`).MatchString(out) {
		t.Error("the summary should give at most one step rolled back")
	}
}
