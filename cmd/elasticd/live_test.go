package main_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver"
	"github.com/elasticd/elasticd/internal/browsertest"
)

func getStatus(t *testing.T, base string) driver.Status {
	t.Helper()
	resp, err := http.Get(base + "/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /v1/status: %s %q: %s", resp.Status, resp.Header.Get("Content-Type"), body)
	}
	var s driver.Status
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatalf("GET /v1/status: %v: %s", err, body)
	}
	return s
}

// waitStatus polls /v1/status until cond holds.
func waitStatus(t *testing.T, base string, what string, cond func(driver.Status) bool) driver.Status {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		s := getStatus(t, base)
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last status: generation %d, world %d, step %d, phase %s", what, s.Generation, s.WorldSize, s.Progress.Step, s.Phase)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var digits = regexp.MustCompile(`[^0-9]`)

// A real job on this machine, watched three ways: the live page in headless Chromium, the
// status API, `elasticd status`, and /metrics; they must agree. One worker is killed, so the
// job has a failure, a rollback and a scale-up to show. With $ELASTICD_SCREENSHOT set, the
// page is saved there (docs/live-page.png).
func TestLivePageShowsTheRunningJob(t *testing.T) {
	prices, err := filepath.Abs("../../examples/prices.yaml")
	if err != nil {
		t.Fatal(err)
	}
	j := startJob(t, append([]string{"run", "-np", "4", "--min-np", "2", "--blacklist-cooldown-range", "2s,30s",
		"--local-spot", "--prices", prices},
		trainArgs("--steps", "1000000", "--step-delay", "20ms", "--commit-every", "10", "--die-at-step", "45")...)...)
	base := j.waitFor(`live page at (http://127\.0\.0\.1:\d+)/`, 30*time.Second)[1]

	// The killed worker's slot comes back after its cooldown: generation 3, 4 workers again.
	s0 := waitStatus(t, base, "the job to grow back after the failure", func(s driver.Status) bool {
		return s.Generation >= 3 && s.WorldSize == 4 && s.Phase == "running" && s.Progress.StepsPerSecond > 0
	})
	if s0.ResetsByCause["failure"] != 1 || s0.ResetsByCause["scale-up"] != 1 || s0.Progress.RolledBackSteps == 0 {
		t.Fatalf("resets %v, rolled back %d steps: want one failure and one scale-up, and the steps since the last commit rolled back", s0.ResetsByCause, s0.Progress.RolledBackSteps)
	}
	if s0.Cost == nil || s0.Cost.Total <= 0 || s0.Cost.Savings <= 0 || len(s0.Cost.Unpriced) != 0 || s0.Cost.RolledBack <= 0 {
		t.Fatalf("cost %+v: want a positive total, savings and rollback cost, all priced", s0.Cost)
	}

	ctx := browsertest.New(t)
	if err := browsertest.Navigate(ctx, base+"/"); err != nil {
		t.Fatal(err)
	}
	if err := browsertest.Wait(ctx, `document.body.dataset.ready === "1"`); err != nil {
		t.Fatal(err)
	}
	// The page updates live: it catches up with a step the API already reported.
	s1 := getStatus(t, base)
	if err := browsertest.Wait(ctx, `Number(document.getElementById("step").textContent.replace(/[^0-9]/g, "")) >= `+strconv.FormatUint(s1.Progress.Step, 10)); err != nil {
		t.Fatalf("the page never showed step %d: %v", s1.Progress.Step, err)
	}
	var shown struct{ World, Step, Generation, Hosts, Failures, Cost string }
	shown.World, _ = browsertest.Text(ctx, "#world-size")
	shown.Step, _ = browsertest.Text(ctx, "#step")
	shown.Generation, _ = browsertest.Text(ctx, "#generation")
	shown.Cost, _ = browsertest.Text(ctx, "#cost-total")
	hosts, err := browsertest.Eval[int](ctx, `document.querySelectorAll("#hosts tr[data-host-id]").length`)
	if err != nil {
		t.Fatal(err)
	}
	failures, err := browsertest.Eval[int](ctx, `document.querySelectorAll('#events li[data-kind="failure"]').length`)
	if err != nil {
		t.Fatal(err)
	}
	s2 := getStatus(t, base)
	if shown.Generation != strconv.FormatUint(s2.Generation, 10) || shown.World != strconv.Itoa(s2.WorldSize) {
		t.Errorf("page shows generation %q world size %q; /v1/status says %d and %d", shown.Generation, shown.World, s2.Generation, s2.WorldSize)
	}
	step, _ := strconv.ParseUint(digits.ReplaceAllString(shown.Step, ""), 10, 64)
	if step < s1.Progress.Step || step > s2.Progress.Step {
		t.Errorf("page shows step %d; /v1/status said %d before and %d after", step, s1.Progress.Step, s2.Progress.Step)
	}
	if hosts != len(s2.Hosts) || hosts != 4 {
		t.Errorf("page lists %d hosts; /v1/status has %d", hosts, len(s2.Hosts))
	}
	if failures != 1 {
		t.Errorf("page lists %d failure events, want the one kill", failures)
	}
	if !strings.Contains(shown.Cost, "$") {
		t.Errorf("cost shown as %q", shown.Cost)
	}
	if problems, _ := browsertest.Problems(ctx); len(problems) > 0 {
		t.Errorf("the page had problems: %q", problems)
	}
	if path := os.Getenv("ELASTICD_SCREENSHOT"); path != "" {
		if err := browsertest.Screenshot(ctx, path); err != nil {
			t.Fatal(err)
		}
	}

	// `elasticd status` reads the same.
	out, stderr, code := elasticd(t, nil, "status", "--driver", base)
	if code != 0 {
		t.Fatalf("elasticd status: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"job " + s2.JobID + ": running", "world size 4 (np 4, min 2, max 4)", "resets: 2 (failure 1, scale-up 1, removal 0, notice 0)", "local-3  127.0.0.1", "spot", "saved"} {
		if !strings.Contains(out, want) {
			t.Errorf("elasticd status lacks %q:\n%s", want, out)
		}
	}
	out, _, code = elasticd(t, nil, "status", "--driver", base, "--json")
	var js driver.Status
	if code != 0 || json.Unmarshal([]byte(out), &js) != nil || js.JobID != s2.JobID {
		t.Errorf("elasticd status --json: exit %d, %q", code, out)
	}

	// /metrics agrees.
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"elasticd_world_size 4\n", `elasticd_resets_total{cause="failure"} 1` + "\n", `elasticd_hosts{state="active"} 4` + "\n", "elasticd_rendezvous_seconds_count 3\n"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// The job's last line gives the cost.
	syscall.Kill(j.cmd.Process.Pid, syscall.SIGINT)
	if code := j.wait(30 * time.Second); code != 130 {
		t.Errorf("exit %d after SIGINT, want 130", code)
	}
	if m := regexp.MustCompile(`elasticd: cost \$?[0-9.]+ USD for [0-9.]+ instance-hours .*saved [0-9.]+ USD \(\d+%\) against .*rollbacks threw away \d+ steps`).FindString(j.output()); m == "" {
		t.Errorf("no cost line at the end")
	}
}

// Bad input to `elasticd status` and to the cost flags of `run` names the flag and exits 2.
func TestStatusAndPricesUsageErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "prices.yaml")
	if err := os.WriteFile(bad, []byte("types:\n  g5.xlarge: {ondemand: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"status"}, "--driver: required", 2},
		{[]string{"status", "--driver", "127.0.0.1:1"}, `--driver: "127.0.0.1:1": want http://HOST:PORT`, 2},
		{[]string{"status", "http://127.0.0.1:1"}, "the driver's URL goes in --driver", 2},
		{[]string{"status", "--driver", "http://127.0.0.1:1", "--timeout", "2s"}, "cannot reach the driver", 1},
		{[]string{"run", "-np", "1", "--prices", bad, "--", "true"}, "--prices: " + bad + ": not a price file", 2},
		{[]string{"run", "-np", "1", "--prices", bad + ".none", "--", "true"}, "--prices: open " + bad + ".none", 2},
		{[]string{"run", "-np", "1", "-H", "a", "--local-spot", "--", "true"}, "--local-spot: only used with --provider local", 2},
	} {
		_, stderr, code := elasticd(t, nil, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("elasticd %q: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr, tc.code, tc.want)
		}
	}
}
