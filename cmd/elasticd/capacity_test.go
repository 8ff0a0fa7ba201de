package main_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// simPIDs are the PIDs of the simulated cloud's instances, from its log.
func simPIDs(out string) []int {
	var pids []int
	for _, m := range regexp.MustCompile(`sim: instance running.* pid=(\d+)`).FindAllStringSubmatch(out, -1) {
		pid, _ := strconv.Atoi(m[1])
		pids = append(pids, pid)
	}
	return pids
}

func writeScenario(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "scenario")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSimManagedJob runs a whole job on the simulated cloud with --manage-capacity: real
// agents on 127.0.0.N, a spot host reclaimed after a notice when spot runs short (the job
// moves off it at a commit, no step lost), the group filled again when spot returns, and at the
// end the group set to zero: the last line says so, and no instance is left running.
func TestSimManagedJob(t *testing.T) {
	scenario := writeScenario(t, "3s spot-capacity 1\n10s spot-capacity unlimited\n")
	j := startJob(t, append([]string{"run", "--provider", "sim", "-np", "4", "--min-np", "2", "--slots-per-host", "2",
		"--manage-capacity", "--sim-interrupt-warning", "4s", "--sim-scenario", scenario},
		trainArgs("--steps", "5000", "--step-delay", "5ms", "--events")...)...)
	j.waitFor(`generation 1: world size 4`, 60*time.Second)
	j.waitFor(`moving off the host before the cloud takes it`, 30*time.Second)
	j.waitFor(`generation \d+: world size 2`, 30*time.Second)
	j.waitFor(`generation \d+: world size 4`, 60*time.Second)
	if code := j.wait(2 * time.Minute); code != 0 {
		t.Fatalf("job exit %d, want 0\n%s", code, j.output())
	}
	out := j.output()
	s := steps(out)
	for i := 1; i < len(s); i++ {
		if s[i] != s[i-1]+1 {
			t.Fatalf("committed steps not contiguous at %d → %d: a step was lost or rolled back", s[i-1], s[i])
		}
	}
	if !strings.Contains(out, "elasticd: sim group spot: 2 → 0") {
		t.Errorf("the job's last lines do not say the group went to zero:\n%s", tail(out, 6))
	}
	if !strings.Contains(out, "resets 2 of which 0 after failures") {
		t.Errorf("want two planned resets (the notice, the growth):\n%s", tail(out, 6))
	}
	pids := simPIDs(out)
	if len(pids) < 3 {
		t.Fatalf("instance PIDs %v: want the two first instances and the one after spot returned", pids)
	}
	waitGone(t, pids, 10*time.Second)
}

// A job under --max-cost on the simulated cloud stops before the budget with exit status 3,
// and its managed group goes to zero.
func TestSimMaxCost(t *testing.T) {
	// Two hosts at 1.20 USD an hour: 0.0013 USD in two seconds.
	j := startJob(t, append([]string{"run", "--provider", "sim", "-np", "2", "--manage-capacity", "--max-cost", "0.004"},
		trainArgs("--steps", "100000", "--step-delay", "10ms")...)...)
	if code := j.wait(2 * time.Minute); code != 3 {
		t.Fatalf("exit %d, want 3 (--max-cost)\n%s", code, tail(j.output(), 10))
	}
	out := j.output()
	for _, want := range []string{"--max-cost 0.0040 USD reached", "sim group spot: 2 → 0"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, tail(out, 10))
		}
	}
	waitGone(t, simPIDs(out), 10*time.Second)
}

// Bad input for the new flags exits 2 and names the flag.
func TestCapacityUsageErrors(t *testing.T) {
	bad := writeScenario(t, "10s spot-capacty 1\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "-np", "2", "--manage-capacity", "--", "true"}, "--manage-capacity: --provider local has no group to steer"},
		{[]string{"run", "-np", "2", "--replace-per-hour", "3", "--", "true"}, "--replace-per-hour: only used with --manage-capacity"},
		{[]string{"run", "-np", "2", "--max-cost", "-1", "--", "true"}, "--max-cost: -1: want a positive amount"},
		{[]string{"run", "-np", "2", "--max-cost", "10", "--", "true"}, "--max-cost: --provider local has no prices of its own: give --prices FILE"},
		{[]string{"run", "-np", "2", "--sim-scenario", bad, "--", "true"}, "--sim-scenario: only used with --provider sim"},
		{[]string{"run", "--provider", "sim", "-np", "2", "--sim-scenario", bad, "--", "true"}, `line 1: "spot-capacty"`},
		{[]string{"run", "--provider", "sim", "-np", "2", "--sim-spot-capacity", "lots", "--", "true"}, `--sim-spot-capacity: "lots"`},
		{[]string{"run", "--provider", "sim", "-np", "2", "--launcher", "ssh", "--", "true"}, "--launcher: --provider sim runs every instance as an elasticd agent"},
		{[]string{"discover", "--provider", "sim"}, "sim: a cloud on this machine that lives as long as its job"},
		{[]string{"run", "-np", "2", "--fallback-after", "1m", "--", "true"}, "--fallback-after: only used with --manage-capacity"},
		{[]string{"run", "--provider", "sim", "-np", "2", "--sim-fallback", "--", "true"}, "--sim-fallback: only used with --manage-capacity"},
		{[]string{"run", "--provider", "aws", "--asg", "g", "--region", "us-east-1", "-np", "2", "--manage-capacity", "--fallback-mig", "x", "--", "true"}, "--fallback-mig: not for --provider aws: use --fallback-asg"},
		{[]string{"run", "--provider", "aws", "--asg", "g", "--region", "us-east-1", "-np", "2", "--manage-capacity", "--fallback-asg", "g", "--", "true"}, `--fallback-asg: "g" is the spot group itself`},
		{[]string{"run", "--provider", "aws", "--asg", "g", "--region", "us-east-1", "-np", "2", "--manage-capacity", "--fallback-after", "1m", "--", "true"}, "--fallback-after: only used with a fallback group"},
	} {
		_, stderr, code := elasticd(t, nil, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("elasticd %v: exit %d, stderr %q; want exit 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestSimFallbackAndReturn: spot runs out on the simulated cloud (one of two spot hosts
// reclaimed after a notice, no spot left to launch); after --fallback-after the on-demand
// fallback group is grown by the one host missing; when spot returns, the job moves back to
// spot at a commit and the fallback group goes to zero. No committed step is lost or rolled
// back throughout, and at the end both groups are at zero and no instance runs.
func TestSimFallbackAndReturn(t *testing.T) {
	scenario := writeScenario(t, "3s spot-capacity 1\n22s spot-capacity unlimited\n")
	j := startJob(t, append([]string{"run", "--provider", "sim", "-np", "4", "--min-np", "2", "--slots-per-host", "2",
		"--manage-capacity", "--sim-fallback", "--fallback-after", "4s", "--sim-interrupt-warning", "3s", "--sim-scenario", scenario},
		trainArgs("--steps", "9000", "--step-delay", "5ms", "--events")...)...)
	j.waitFor(`generation 1: world size 4`, 60*time.Second)
	j.waitFor(`setting the group's desired size" group="sim group ondemand" from=0 to=1 reason="the job has had 2 of -np 4 slots on spot`, 60*time.Second)
	j.waitFor(`sim: instance running" provider=sim group=ondemand`, 30*time.Second)
	j.waitFor(`spot capacity is back: moving off the on-demand fallback hosts`, 60*time.Second)
	j.waitFor(`group="sim group ondemand" from=1 to=0`, 30*time.Second)
	if code := j.wait(3 * time.Minute); code != 0 {
		t.Fatalf("job exit %d, want 0\n%s", code, tail(j.output(), 20))
	}
	out := j.output()
	s := steps(out)
	for i := 1; i < len(s); i++ {
		if s[i] != s[i-1]+1 {
			t.Fatalf("committed steps not contiguous at %d → %d: a step was lost or rolled back", s[i-1], s[i])
		}
	}
	if len(s) == 0 || s[len(s)-1] != 9000 {
		t.Fatalf("last committed step %v, want 9000", s[len(s)-1:])
	}
	last := tail(out, 4)
	if !strings.Contains(last, "sim group spot: 2 → 0; fallback sim group ondemand: 0 → 1, 1 → 0 (kept the job going") {
		t.Errorf("the last lines do not say what the fallback did:\n%s", last)
	}
	if !strings.Contains(out, "of which 0 after failures") {
		t.Errorf("a failure reset:\n%s", last)
	}
	waitGone(t, simPIDs(out), 10*time.Second)
}

// `elasticd ctl stop` ends a job for good: its workers stop, it exits 130 with the operator's
// reason, and its managed group goes to zero.
func TestCtlStopEndsAManagedJob(t *testing.T) {
	secret := writeSecret(t)
	j := startJob(t, append([]string{"run", "--provider", "sim", "-np", "2", "--manage-capacity",
		"--admin-secret-file", secret, "--listen", "127.0.0.1:0"},
		trainArgs("--steps", "1000000", "--step-delay", "10ms")...)...)
	url := driverURL(j)
	j.waitFor(`generation started`, 60*time.Second)
	env := []string{"ELASTICD_DRIVER=" + url, "ELASTICD_ADMIN_SECRET_FILE=" + secret}
	stdout, stderr, code := elasticd(t, env, "ctl", "stop", "loss plateaued")
	if code != 0 || !strings.Contains(stdout, "stopping the job") {
		t.Fatalf("ctl stop: exit %d, %q %q", code, stdout, stderr)
	}
	if code := j.wait(time.Minute); code != 130 {
		t.Fatalf("job exit %d, want 130\n%s", code, tail(j.output(), 10))
	}
	out := j.output()
	for _, want := range []string{"stopped by the operator (elasticd ctl stop): loss plateaued", "sim group spot: 2 → 0"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, tail(out, 10))
		}
	}
	waitGone(t, simPIDs(out), 10*time.Second)
}

// TestSimHandsBackABrokenHost: every worker on one simulated host fails a second after it
// starts (a broken host the cloud calls healthy). Its slot flaps until it is quarantined; the
// host, every slot of it quarantined, is handed back to the group, which replaces it; the job
// grows back onto the new instance and completes.
func TestSimHandsBackABrokenHost(t *testing.T) {
	script := `case "$ELASTICD_WORKER_ID" in sim-spot-0002/*) sleep 1; exit 1 ;; esac; exec "$0" "$@"`
	j := startJob(t, "run", "--provider", "sim", "-np", "2", "--min-np", "1", "--manage-capacity",
		"--flap-window", "1m", "--flap-limit", "2", "--blacklist-cooldown-range", "1s,2s",
		"--", "/bin/sh", "-c", script, trainer, "--log-every", "1000", "--steps", "8000", "--step-delay", "5ms")
	j.waitFor(`handing a host back to the cloud for a replacement" group="sim group spot" host=sim-spot-0002 reason="all its 1 slots are quarantined`, 90*time.Second)
	j.waitFor(`sim: launching an instance" provider=sim group=spot host=sim-spot-0003`, 30*time.Second)
	j.waitFor(`generation started" generation=\d+ world_size=2`, 60*time.Second)
	if code := j.wait(2 * time.Minute); code != 0 {
		t.Fatalf("job exit %d, want 0\n%s", code, tail(j.output(), 20))
	}
	out := j.output()
	if n := strings.Count(out, "handing a host back to the cloud"); n != 1 {
		t.Errorf("%d hand-backs, want exactly one", n)
	}
	if !strings.Contains(out, "host sim-spot-0002 handed back to sim group spot for a replacement") && !strings.Contains(out, "host handed back for a replacement") {
		t.Errorf("the hand-back is not confirmed in the log")
	}
	waitGone(t, simPIDs(out), 10*time.Second)
}
