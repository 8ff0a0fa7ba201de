package main_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/admin"
)

// TestCtlAddRemoveHosts runs the real binaries: a job of two workers on 127.0.0.2 (local
// launcher, loopback addresses as hosts) with the admin API on, and `elasticd ctl` against
// it. A host added at runtime grows the job to four; removed, its workers leave at the next
// commit without rollback (the committed steps stay contiguous) and it is kept as stopped;
// the refusals (below --min-np, unknown host, host already there) exit 1 with the driver's
// reason; added back, the stopped host's workers return under the same IDs; the job
// completes.
func TestCtlAddRemoveHosts(t *testing.T) {
	const total = 1000
	secret := writeSecret(t)
	drv := startJob(t, append([]string{"run", "-np", "2", "--min-np", "2", "--max-np", "4", "-H", "127.0.0.2:2",
		"--admin-secret-file", secret, "--listen", "127.0.0.1:0", "--discovery-interval", "200ms"},
		trainArgs("--steps", fmt.Sprint(total), "--step-delay", "5ms", "--events")...)...)
	env := []string{"ELASTICD_DRIVER=" + driverURL(drv), "ELASTICD_ADMIN_SECRET_FILE=" + secret}
	ctl := func(args ...string) (string, string, int) {
		t.Helper()
		return elasticd(t, env, append([]string{"ctl"}, args...)...)
	}
	mustCtl := func(want string, args ...string) {
		t.Helper()
		stdout, stderr, code := ctl(args...)
		if code != 0 || !strings.Contains(stdout, want) {
			t.Fatalf("ctl %v: exit %d, stdout %q, stderr %q; want exit 0 and %q", args, code, stdout, stderr, want)
		}
	}
	refused := func(want string, args ...string) {
		t.Helper()
		_, stderr, code := ctl(args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if code != 1 || len(lines) != 1 || !strings.Contains(stderr, want) {
			t.Fatalf("ctl %v: exit %d, stderr %q; want exit 1 and one line with %q", args, code, stderr, want)
		}
	}
	// status polls `ctl status --json` until ok holds (the status follows the job's steps).
	status := func(what string, ok func(admin.Status) bool) admin.Status {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			stdout, stderr, code := ctl("status", "--json")
			var s admin.Status
			if code != 0 {
				t.Fatalf("ctl status --json: exit %d, %s", code, stderr)
			}
			if err := json.Unmarshal([]byte(stdout), &s); err != nil {
				t.Fatalf("ctl status --json: %v\n%s", err, stdout)
			}
			if ok(s) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("status never showed %s; last:\n%s", what, stdout)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	hostState := func(s admin.Status, id string) (string, int) {
		for _, h := range s.Hosts {
			if h.ID == id {
				return h.State, len(h.Workers)
			}
		}
		return "absent", 0
	}
	running := func(s admin.Status) int {
		n := 0
		for _, h := range s.Hosts {
			for _, w := range h.Workers {
				if w.State == "running" && w.Rank >= 0 {
					n++
				}
			}
		}
		return n
	}

	drv.waitFor(`generation 1: world size 2`, 30*time.Second)
	mustCtl("added host 127.0.0.3 (2 slots)", "add-host", "127.0.0.3:2")
	drv.waitFor(`generation 2: world size 4`, 30*time.Second)
	status("both hosts active with 4 workers", func(s admin.Status) bool {
		a, na := hostState(s, "127.0.0.2")
		b, nb := hostState(s, "127.0.0.3")
		return s.WorldSize == 4 && a == admin.StateActive && b == admin.StateActive && na == 2 && nb == 2 && running(s) == 4
	})
	table, _, _ := ctl("status")
	for _, want := range []string{"generation 2, world size 4", "127.0.0.3  127.0.0.3  2      active (added)", "3     127.0.0.3/1"} {
		if !strings.Contains(table, want) {
			t.Fatalf("ctl status lacks %q:\n%s", want, table)
		}
	}

	mustCtl("removed host 127.0.0.3 (2 slots)", "remove-host", "127.0.0.3")
	drv.waitFor(`generation 3: world size 2`, 30*time.Second)
	status("127.0.0.3 stopped, its workers gone", func(s admin.Status) bool {
		st, n := hostState(s, "127.0.0.3")
		return s.WorldSize == 2 && st == admin.StateStopped && n == 0 && running(s) == 2
	})

	refused("elasticd: remove-host 127.0.0.2: would leave 0 usable slots, fewer than --min-np 2: use --force", "remove-host", "127.0.0.2")
	refused(`elasticd: remove-host 10.9.9.9: unknown host "10.9.9.9": the job's hosts are 127.0.0.2; stopped: 127.0.0.3`, "remove-host", "10.9.9.9")
	refused("elasticd: add-host 127.0.0.2: host 127.0.0.2 is already part of the job", "add-host", "127.0.0.2")
	refused("elasticd: remove-host 127.0.0.3: host 127.0.0.3 is already stopped", "remove-host", "127.0.0.3")

	mustCtl("host 127.0.0.3 is back (2 slots)", "add-host", "127.0.0.3")
	drv.waitFor(`generation 4: world size 4`, 30*time.Second)

	if code := drv.wait(2 * time.Minute); code != 0 {
		t.Fatalf("job exit %d, want 0", code)
	}
	out := drv.output()
	t.Logf("generations (world size, resumed at step): %v", generations(out))
	s := steps(out)
	for i := 1; i < len(s); i++ {
		if s[i] != s[i-1]+1 {
			t.Fatalf("committed steps not contiguous at %d → %d: a step was lost or rolled back", s[i-1], s[i])
		}
	}
	if len(s) == 0 || s[len(s)-1] != total {
		t.Fatalf("last committed step %v, want %d", s[len(s)-1:], total)
	}
	// The stopped host came back under the same worker IDs, and no reset was a failure.
	for _, want := range []string{`launched worker" worker=127.0.0.3/0 rank=2 generation=4`, `launched worker" worker=127.0.0.3/1 rank=3 generation=4`,
		"all 4 workers of generation 4 finished", "resets 3 of which 0 after failures"} {
		if !strings.Contains(out, want) {
			t.Fatalf("driver output lacks %q", want)
		}
	}
}

// What the operator changed survives a restart of the driver on its --state-dir: a host
// removed with ctl remove-host stays out of the job, one added stays in, and ctl, asked
// right after the restart, waits for the driver's first discovery instead of failing.
func TestCtlHostsSurviveADriverRestart(t *testing.T) {
	secret, state, addr := writeSecret(t), t.TempDir(), freeAddr(t)
	args := append([]string{"run", "-np", "3", "--min-np", "2", "--max-np", "4", "-H", "127.0.0.2:1,127.0.0.3:1,127.0.0.4:1",
		"--admin-secret-file", secret, "--listen", addr, "--state-dir", state, "--discovery-interval", "200ms"},
		trainArgs("--steps", "100000", "--step-delay", "10ms", "--events")...)
	env := []string{"ELASTICD_DRIVER=http://" + addr, "ELASTICD_ADMIN_SECRET_FILE=" + secret}
	mustCtl := func(want string, args ...string) {
		t.Helper()
		stdout, stderr, code := elasticd(t, env, append([]string{"ctl"}, args...)...)
		if code != 0 || !strings.Contains(stdout, want) {
			t.Fatalf("ctl %v: exit %d, stdout %q, stderr %q; want exit 0 and %q", args, code, stdout, stderr, want)
		}
	}
	drv := startJob(t, args...)
	drv.waitFor(`event step=\d+ world=3 `, time.Minute)
	mustCtl("removed host 127.0.0.4 (1 slot)", "remove-host", "127.0.0.4")
	mustCtl("added host 127.0.0.5 (1 slot)", "add-host", "127.0.0.5:1")
	drv.waitFor(`world=3 [^\n]*\n(?s:.*)generation \d+: world size 3`, 30*time.Second) // .4 out, .5 in
	syscall.Kill(drv.cmd.Process.Pid, syscall.SIGKILL)
	drv.wait(10 * time.Second)

	again := startJob(t, args...)
	driverURL(again) // listening
	// At once: the driver may not have listed its hosts yet; ctl waits for it, then hears the
	// host is still stopped.
	if _, stderr, code := elasticd(t, env, "ctl", "remove-host", "127.0.0.4"); code != 1 || !strings.Contains(stderr, "host 127.0.0.4 is already stopped") {
		t.Fatalf("ctl remove-host 127.0.0.4 right after the restart: exit %d, %q; want 1, already stopped", code, stderr)
	}
	again.waitFor(`event step=\d+ world=3 `, time.Minute)
	time.Sleep(time.Second) // discovery polls every 200 ms: .4 would be back by now
	stdout, _, _ := elasticd(t, env, "ctl", "status", "--json")
	var st admin.Status
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("ctl status --json: %v\n%s", err, stdout)
	}
	states := map[string]string{}
	for _, h := range st.Hosts {
		states[h.ID] = h.State
	}
	if states["127.0.0.4"] != admin.StateStopped || states["127.0.0.5"] != admin.StateActive || st.WorldSize != 3 {
		t.Fatalf("after the restart: hosts %v, world size %d; want 127.0.0.4 stopped, 127.0.0.5 active, 3 workers", states, st.WorldSize)
	}
	if strings.Contains(again.output(), `worker=127.0.0.4/0`) {
		t.Fatal("the restarted driver launched a worker on the host the operator had removed")
	}
	mustCtl("host 127.0.0.4 is back (1 slot)", "add-host", "127.0.0.4")
	again.waitFor(`generation \d+: world size 4`, 30*time.Second)
	elasticd(t, env, "ctl", "stop", "test done")
	if code := again.wait(time.Minute); code == -1 {
		t.Fatal("the job did not end after ctl stop")
	}
}

// Under --launcher agent, a driver started again on its --state-dir lists its provider's
// hosts before their agents have come back to it: ctl remove-host, asked at once, takes the
// host out (it used to be refused as unknown, the job having "no hosts" yet). The job lets it
// go once the adoption is over.
func TestCtlRemoveHostRightAfterAnAgentDriverRestart(t *testing.T) {
	secret, admins, state, addr := writeSecret(t), writeSecret(t), t.TempDir(), freeAddr(t)
	hosts := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}
	args := append([]string{"run", "-np", "3", "--min-np", "2", "--launcher", "agent", "--agent-secret-file", secret,
		"-H", "127.0.0.2:1,127.0.0.3:1,127.0.0.4:1", "--admin-secret-file", admins, "--listen", addr, "--state-dir", state,
		"--discovery-interval", "200ms"},
		trainArgs("--steps", "100000", "--step-delay", "10ms", "--events")...)
	drv := startJob(t, args...)
	for _, h := range hosts {
		a := startAgent(t, "--driver", "http://"+addr, "--agent-secret-file", secret, "--addr", h, "--slots", "1", "--host-id", h)
		t.Cleanup(func() { a.stop(t) })
	}
	drv.waitFor(`event step=\d+ world=3 `, time.Minute)
	syscall.Kill(drv.cmd.Process.Pid, syscall.SIGTERM) // the job goes on without a driver
	if code := drv.wait(10 * time.Second); code != 0 {
		t.Fatalf("the driver exited %d on SIGTERM, want 0 (it leaves the job running)", code)
	}
	again := startJob(t, args...)
	driverURL(again)
	env := []string{"ELASTICD_DRIVER=http://" + addr, "ELASTICD_ADMIN_SECRET_FILE=" + admins}
	if stdout, stderr, code := elasticd(t, env, "ctl", "remove-host", "127.0.0.4"); code != 0 || !strings.Contains(stdout, "removed host 127.0.0.4") {
		t.Fatalf("ctl remove-host right after the restart: exit %d, %q %q; want the host removed", code, stdout, stderr)
	}
	// The job lets the host go once the adoption is over (up to a minute: it waits for
	// discovery to list every adopted worker's host); meanwhile it is stopped for the job.
	stdout, _, _ := elasticd(t, env, "ctl", "status", "--json")
	var st admin.Status
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("ctl status --json: %v\n%s", err, stdout)
	}
	if i := slices.IndexFunc(st.Hosts, func(h admin.Host) bool { return h.ID == "127.0.0.4" }); i < 0 || st.Hosts[i].State != admin.StateStopped {
		t.Fatalf("127.0.0.4 after ctl remove-host: %+v, want stopped", st.Hosts)
	}
	elasticd(t, env, "ctl", "stop", "test done")
	if code := again.wait(time.Minute); code == -1 {
		t.Fatal("the job did not end after ctl stop")
	}
}

// A driver started without --admin-secret-file has no admin API: ctl says so.
func TestCtlAdminAPIOff(t *testing.T) {
	secret := writeSecret(t)
	drv := startJob(t, append([]string{"run", "-np", "1", "--listen", "127.0.0.1:0"}, trainArgs("--steps", "100000", "--step-delay", "5ms")...)...)
	_, stderr, code := elasticd(t, nil, "ctl", "--driver", driverURL(drv), "--admin-secret-file", secret, "status")
	if code != 1 || !strings.Contains(stderr, "the admin API is off: start elasticd run with --admin-secret-file") {
		t.Fatalf("ctl against a driver without the admin API: exit %d, %q", code, stderr)
	}
	// A wrong secret is refused with a hint. (The API is off here: use a job that has it.)
	other := filepath.Join(t.TempDir(), "other")
	os.WriteFile(other, []byte("another-secret-of-enough-bytes\n"), 0o600)
	drv2 := startJob(t, append([]string{"run", "-np", "1", "--listen", "127.0.0.1:0", "--admin-secret-file", secret},
		trainArgs("--steps", "100000", "--step-delay", "5ms")...)...)
	_, stderr, code = elasticd(t, nil, "ctl", "--driver", driverURL(drv2), "--admin-secret-file", other, "status")
	if code != 1 || !strings.Contains(stderr, "refused the request's signature (bad signature): check that --admin-secret-file") {
		t.Fatalf("ctl with the wrong secret: exit %d, %q", code, stderr)
	}
	for _, j := range []*job{drv, drv2} {
		j.waitFor(`launched worker" worker=\S+ rank=0 generation=1 pid=\d+`, 30*time.Second)
		var pids []int
		for _, p := range j.workerPIDs() {
			pids = append(pids, p)
		}
		j.cmd.Process.Signal(syscall.SIGTERM)
		if code := j.wait(30 * time.Second); code != 130 {
			t.Errorf("driver exit %d after SIGTERM, want 130", code)
		}
		waitGone(t, pids, 5*time.Second)
	}
}

// Bad input to `elasticd ctl` exits 2 and names the flag or the argument; an unreachable
// driver exits 1.
func TestCtlUsageErrors(t *testing.T) {
	secret := writeSecret(t)
	short := filepath.Join(t.TempDir(), "short")
	os.WriteFile(short, []byte("tiny\n"), 0o600)
	drv := []string{"--driver", "http://127.0.0.1:1", "--admin-secret-file", secret}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"ctl", "--admin-secret-file", secret, "status"}, "--driver: required"},
		{[]string{"ctl", "--driver", "127.0.0.1:29400", "--admin-secret-file", secret, "status"}, `--driver: "127.0.0.1:29400": want the driver's http(s) URL`},
		{[]string{"ctl", "--driver", "http://127.0.0.1:1", "status"}, "--admin-secret-file: required"},
		{[]string{"ctl", "--driver", "http://127.0.0.1:1", "--admin-secret-file", short, "status"}, "--admin-secret-file: " + short + " holds 4 bytes"},
		{append(append([]string{"ctl"}, drv...), "add-host"), "add-host: want one HOST[:SLOTS]"},
		{append(append([]string{"ctl"}, drv...), "add-host", "10.0.0.5:two"), `add-host 10.0.0.5:two: slots "two" is not a positive integer; want host[:slots]`},
		{append(append([]string{"ctl"}, drv...), "remove-host"), "remove-host: want one HOST"},
		{append(append([]string{"ctl"}, drv...), "remove-host", "a", "b"), "remove-host: want one HOST"},
		{append(append([]string{"ctl"}, drv...), "remove-host", "a", "--forced"), "remove-host: unknown flag --forced: only --force"},
		{append(append([]string{"ctl"}, drv...), "status", "now"), `status: unexpected argument "now"`},
		{append(append([]string{"ctl"}, drv...), "frobnicate"), `ctl: unknown command "frobnicate"`},
		{[]string{"ctl"}, "ctl: name a command: add-host, remove-host, status or stop"},
		{[]string{"run", "-np", "1", "--admin-secret-file", short, "--", "true"}, "--admin-secret-file: " + short + " holds 4 bytes"},
	} {
		_, stderr, code := elasticd(t, nil, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("elasticd %v: exit %d, stderr %q; want exit 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
	_, stderr, code := elasticd(t, nil, append(append([]string{"ctl"}, drv...), "remove-host", "10.0.0.5", "--force")...)
	if code != 1 || !strings.Contains(stderr, "elasticd: remove-host 10.0.0.5: driver unreachable at http://127.0.0.1:1") {
		t.Errorf("unreachable driver: exit %d, %q; want exit 1 naming the URL", code, stderr)
	}
}

// ctl's help teaches what it does and how to call it.
func TestCtlHelp(t *testing.T) {
	stdout, _, code := elasticd(t, nil, "ctl", "--help")
	for _, want := range []string{"add-host HOST[:SLOTS]", "remove-host HOST", "--force", "stopped", "--min-np", "--admin-secret-file", "ELASTICD_DRIVER", "elasticd ctl add-host 10.0.0.7:4"} {
		if code != 0 || !strings.Contains(stdout, want) {
			t.Errorf("ctl --help lacks %q (exit %d)", want, code)
		}
	}
	stdout, _, _ = elasticd(t, nil, "run", "--help")
	if !strings.Contains(stdout, "--admin-secret-file") {
		t.Error("run --help lacks --admin-secret-file")
	}
}
