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
	outDir := t.TempDir()
	j := startJob(t, append([]string{"run", "-np", "4", "--min-np", "2", "--blacklist-cooldown-range", "2s,30s",
		"--local-spot", "--prices", prices, "--output-dir", outDir},
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
	// The trainer reports its loss and its total steps (examples/train: State.SetLoss and
	// State.TotalSteps); the driver keeps a history of them, and each host's uptime,
	// heartbeat (the in-process workers' requests) and failures.
	s0 = waitStatus(t, base, "a progress history with a loss", func(s driver.Status) bool {
		n := 0
		for _, p := range s.ProgressHistory {
			if p.Loss != nil && p.Cost != nil && p.StepsPerSecond > 0 {
				n++
			}
		}
		return n >= 2
	})
	if p := s0.Progress; p.Loss == nil || !(*p.Loss > 0 && *p.Loss < 10) || p.TotalSteps != 1000000 || p.ETASeconds == nil || *p.ETASeconds <= 0 {
		t.Errorf("progress %+v: want a loss, 1000000 steps in all and a time to go", p)
	}
	failed := 0
	for _, h := range s0.Hosts {
		if h.UptimeSeconds <= 0 || h.LastHeartbeat == nil || *h.HeartbeatAgeSeconds > 30 {
			t.Errorf("host %s: uptime %v, heartbeat %v: want both, the heartbeat recent", h.ID, h.UptimeSeconds, h.HeartbeatAgeSeconds)
		}
		if h.Count > 0 {
			failed++
			if h.Count != 1 || h.Last == nil || !strings.Contains(h.Last.Cause, "SIGKILL") {
				t.Errorf("host %s: %d failures, last %+v; want the one SIGKILL", h.ID, h.Count, h.Last)
			}
		}
	}
	if failed != 1 {
		t.Errorf("%d hosts with failures, want the killed worker's", failed)
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
	// The new figures: step X of N with the time to go, the loss, the charts, the hosts'
	// uptime, heartbeat and failures, and links to the driver's other views.
	var page struct {
		StepOf, ETA, Loss string
		Rate, LossPts     int
		Cost              int
		Cells             []int
		Failures          []string
		Metrics           string
	}
	page.StepOf, _ = browsertest.Text(ctx, "#step-of")
	page.ETA, _ = browsertest.Text(ctx, "#eta")
	page.Loss, _ = browsertest.Text(ctx, "#loss")
	if err := browsertest.Wait(ctx, `document.getElementById('loss-chart').dataset.points >= 2`); err != nil {
		t.Error(err)
	}
	for _, c := range []struct {
		dst  *int
		expr string
	}{
		{&page.Rate, `Number(document.getElementById('rate-chart').dataset.points)`},
		{&page.LossPts, `Number(document.getElementById('loss-chart').dataset.points)`},
		{&page.Cost, `Number(document.getElementById('cost-chart').dataset.points)`},
	} {
		if *c.dst, err = browsertest.Eval[int](ctx, c.expr); err != nil {
			t.Fatal(err)
		}
	}
	if page.Cells, err = browsertest.Eval[[]int](ctx, `Array.from(document.querySelectorAll('#hosts tr[data-host-id]')).map(tr => tr.cells.length)`); err != nil {
		t.Fatal(err)
	}
	if page.Failures, err = browsertest.Eval[[]string](ctx, `Array.from(document.querySelectorAll('#hosts td.failures')).map(td => td.textContent)`); err != nil {
		t.Fatal(err)
	}
	if page.Metrics, err = browsertest.Eval[string](ctx, `document.querySelector('#links a[href="metrics"]').href`); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^step [\d,]+ of 1,000,000 \(\d+\.\d%\)$`).MatchString(page.StepOf) {
		t.Errorf("step-of %q, want step X of 1,000,000", page.StepOf)
	}
	if !regexp.MustCompile(`^\d+[dhms]`).MatchString(page.ETA) {
		t.Errorf("time to go %q, want a duration", page.ETA)
	}
	if _, err := strconv.ParseFloat(page.Loss, 64); err != nil {
		t.Errorf("loss %q, want a number", page.Loss)
	}
	if page.Rate < 2 || page.LossPts < 2 || page.Cost < 2 {
		t.Errorf("charts with %d rate, %d loss and %d cost points: want lines", page.Rate, page.LossPts, page.Cost)
	}
	killed := 0
	for i, n := range page.Cells {
		if n != 13 {
			t.Errorf("host row %d has %d cells, want 13 (uptime, heartbeat and failures included)", i, n)
		}
	}
	for _, f := range page.Failures {
		if strings.HasPrefix(f, "1") && strings.Contains(f, "SIGKILL") {
			killed++
		} else if f != "0" {
			t.Errorf("failures cell %q, want 0 or the one SIGKILL", f)
		}
	}
	if killed != 1 {
		t.Errorf("failure cells %q: want one host with the SIGKILL", page.Failures)
	}
	if page.Metrics != base+"/metrics" {
		t.Errorf("the page links %q for the metrics, want %s/metrics", page.Metrics, base)
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
	// A page of one host: the counts by state say how many there are, the rest are not listed.
	out, _, code = elasticd(t, nil, "status", "--driver", base, "--hosts", "1")
	hm := regexp.MustCompile(`(?m)^hosts: (\d+) \(active \d+`).FindStringSubmatch(out)
	if n, _ := strconv.Atoi(append(hm, "", "")[1]); code != 0 || hm == nil || n < 2 ||
		strings.Count(out, "  127.0.0.1  ") != 1 || !strings.Contains(out, "\n"+strconv.Itoa(n-1)+" more hosts not listed (--hosts N lists more") {
		t.Errorf("elasticd status --hosts 1: exit %d:\n%s\nwant the counts by state, one host listed and the others counted", code, out)
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

	// The last lines say where the post-mortem is; opened from file://, with the driver
	// gone, it shows the job's final state.
	m := regexp.MustCompile(`elasticd: report at (\S+) \(`).FindStringSubmatch(j.output())
	if m == nil || m[1] != filepath.Join(outDir, "report.html") {
		t.Fatalf("report line %q, want one naming %s", m, filepath.Join(outDir, "report.html"))
	}
	if err := browsertest.Navigate(ctx, "file://"+m[1]); err != nil {
		t.Fatal(err)
	}
	if err := browsertest.Wait(ctx, `document.body.dataset.report === "1"`); err != nil {
		t.Fatal(err)
	}
	title, _ := browsertest.Text(ctx, "#finished-title")
	stepShown, _ := browsertest.Text(ctx, "#step")
	hostsShown, _ := browsertest.Eval[int](ctx, `document.querySelectorAll("#hosts tr[data-host-id]").length`)
	lossPts, _ := browsertest.Eval[int](ctx, `Number(document.getElementById('loss-chart').dataset.points)`)
	if title != "Failed · exit code 130" || hostsShown != 4 || lossPts < 2 {
		t.Errorf("report shows %q, %d hosts, a loss chart of %d points: want the interrupted job's end (130), its 4 hosts and the loss", title, hostsShown, lossPts)
	}
	if n, _ := strconv.ParseUint(digits.ReplaceAllString(stepShown, ""), 10, 64); n < s2.Progress.Step {
		t.Errorf("report shows step %q, want at least %d", stepShown, s2.Progress.Step)
	}
	if problems, _ := browsertest.Problems(ctx); len(problems) > 0 {
		t.Errorf("the report had problems: %q", problems)
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
		{[]string{"status", "--driver", "http://127.0.0.1:1", "--hosts", "-1"}, "--hosts: -1: must be 0 or more", 2},
		{[]string{"status", "--driver", "http://127.0.0.1:1", "--state", "gone"}, `--state: "gone": want a host state, one of active, leaving, blacklisted, quarantined, idle`, 2},
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
