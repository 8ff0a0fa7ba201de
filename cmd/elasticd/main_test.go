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
	"strings"
	"testing"
	"time"
)

var binary, trainer string // built once by TestMain

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "elasticd-cli-test-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "elasticd")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build elasticd:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	trainer = filepath.Join(dir, "train")
	build = exec.Command("go", "build", "-o", trainer, "../../examples/train")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build train:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// elasticd runs the binary with a time bound and returns stdout, stderr and the exit code.
func elasticd(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	code := 0
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run elasticd %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("elasticd %v did not finish in time", args)
	}
	return stdout.String(), stderr.String(), code
}

func TestHelpTeaches(t *testing.T) {
	out, _, code := elasticd(t, nil, "--help")
	if code != 0 {
		t.Fatalf("--help exited %d", code)
	}
	for _, want := range []string{"bench", "version", "ELASTICD_"} {
		if !strings.Contains(out, want) {
			t.Errorf("--help does not mention %q:\n%s", want, out)
		}
	}
	out, _, _ = elasticd(t, nil, "bench", "allreduce", "--help")
	for _, want := range []string{"--np", "--sizes", "--json", "busbw", "ELASTICD_NP"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench allreduce --help does not mention %q:\n%s", want, out)
		}
	}
}

func TestVersion(t *testing.T) {
	out, _, code := elasticd(t, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "elasticd ") || !strings.Contains(out, "go1.") {
		t.Fatalf("version: exit %d, output %q", code, out)
	}
}

// Bad input gets exit code 2 and one line that names the flag and what is allowed.
func TestBadFlagsExit2WithOneLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  []string
		want string
	}{
		{args: []string{"bench", "allreduce", "--np", "0"}, want: "--np: 0 ranks: must be between 1 and 64"},
		{args: []string{"bench", "allreduce", "--np", "65"}, want: "--np: 65 ranks"},
		{args: []string{"bench", "allreduce", "--sizes", "4XB"}, want: `--sizes: "4XB" is not a size`},
		{args: []string{"bench", "allreduce", "--sizes", "1001"}, want: "not a multiple of 4 bytes"},
		{args: []string{"bench", "allreduce", "--sizes", ","}, want: "--sizes: "},
		{args: []string{"bench", "allreduce", "--chunk-bytes", "3"}, want: "--chunk-bytes: 3"},
		{args: []string{"bench", "allreduce", "--timeout", "-1s"}, want: "--timeout: "},
		{args: []string{"bench", "allreduce", "--np", "two"}, want: `invalid value "two" for flag --np`},
		{args: []string{"bench", "allreduce", "extra"}, want: "takes no arguments"},
		{args: []string{"bench", "allreduce", "--nope"}, want: "flag provided but not defined: --nope"},
		{args: []string{"bogus"}, want: `unknown command "bogus"`},
		{args: []string{"bench", "allreduce"}, env: []string{"ELASTICD_NP=100"}, want: "--np: 100 ranks"},
		{args: []string{"run", "-np", "2", "--flap-limit", "0", "--", "true"}, want: "--flap-limit: 0: must be at least 1"},
		{args: []string{"run", "-np", "2", "--checkpoint-every", "0", "--", "true"}, want: "--checkpoint-every: 0: must be at least 1"},
		{args: []string{"run", "-np", "2", "--mode", "restart", "--checkpoint-dir", "ckpt", "--", "true"}, want: "--checkpoint-dir: only for in-process workers"},
		{args: []string{"run", "-np", "2", "--state-dir", "/dev/null/state", "--", "true"}, want: "--state-dir: mkdir /dev/null: not a directory"},
		{args: []string{"run", "-np", "2", "--state-dir", "testdata/badstate", "--", "true"}, want: "is not a job state this elasticd can read"},
		{args: []string{"bench", "recovery", "--fault", "pause"}, want: `--fault: "pause": want kill or stop`},
	} {
		t.Run(strings.Join(append(tc.env, tc.args...), " "), func(t *testing.T) {
			_, stderr, code := elasticd(t, tc.env, tc.args...)
			if code != 2 {
				t.Errorf("exit code %d, want 2 (stderr %q)", code, stderr)
			}
			if lines := strings.Count(strings.TrimSpace(stderr), "\n") + 1; lines != 1 {
				t.Errorf("stderr has %d lines, want one:\n%s", lines, stderr)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr %q does not contain %q", stderr, tc.want)
			}
		})
	}
}

// A real run: rank processes over loopback, JSON out, with the fields users track.
func TestBenchAllreduceJSON(t *testing.T) {
	out, stderr, code := elasticd(t, nil, "bench", "allreduce", "--np", "3", "--sizes", "4KB,1048580", "--iters", "3", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 JSON lines, got %d:\n%s", len(lines), out)
	}
	for i, line := range lines {
		var r map[string]float64
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("line %d %q: %v", i, line, err)
		}
		wantSize := []float64{4096, 1048580}[i]
		if r["size_bytes"] != wantSize || r["ranks"] != 3 || r["iters"] != 3 {
			t.Errorf("line %d: %v", i, r)
		}
		for _, k := range []string{"median_s", "algbw_gbps", "busbw_gbps", "memcpy_gbps", "tcp_gbps", "rtt_s", "busbw_vs_tcp"} {
			if !(r[k] > 0) {
				t.Errorf("line %d: %s = %v, want > 0", i, k, r[k])
			}
		}
		if got, want := r["algbw_gbps"], r["size_bytes"]/r["median_s"]/1e9; !near(got, want) {
			t.Errorf("algbw %v, want size/median = %v", got, want)
		}
		if got, want := r["busbw_gbps"], r["algbw_gbps"]*2*2/3; !near(got, want) {
			t.Errorf("busbw %v, want algbw*2(n-1)/n = %v", got, want)
		}
		if got, want := r["busbw_vs_tcp"], r["busbw_gbps"]/r["tcp_gbps"]; !near(got, want) {
			t.Errorf("busbw_vs_tcp %v, want %v", got, want)
		}
	}
}

func TestBenchAllreduceTableOneRank(t *testing.T) {
	out, stderr, code := elasticd(t, nil, "bench", "allreduce", "--np", "1", "--sizes", "4KB", "--iters", "2", "--no-baseline")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(out, "1 rank processes") || !strings.Contains(out, "4KB") {
		t.Fatalf("table:\n%s", out)
	}
}

func near(a, b float64) bool { return a > 0 && b > 0 && a/b > 0.999 && a/b < 1.001 }

// bench report takes medians over rounds per implementation and divides them.
func TestBenchReportMediansAndSpeedup(t *testing.T) {
	in := filepath.Join(t.TempDir(), "lines.jsonl")
	lines := `[baselines] a log line that is not JSON
{"impl":"elasticd","size_bytes":4096,"ranks":2,"median_s":0.00001}
{"impl":"elasticd","size_bytes":4096,"ranks":2,"median_s":0.00003}
{"impl":"elasticd","size_bytes":4096,"ranks":2,"median_s":0.00002}
{"impl":"gloo","size_bytes":4096,"ranks":2,"median_s":0.00008}
{"impl":"mpi","size_bytes":4096,"ranks":2,"median_s":0.00001}
{"size_bytes":67108864,"ranks":4,"median_s":0.05}
{"impl":"gloo","size_bytes":67108864,"ranks":4,"median_s":0.1}
`
	if err := os.WriteFile(in, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := elasticd(t, nil, "bench", "report", in)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	rows := strings.Split(strings.TrimSpace(out), "\n")
	if len(rows) != 4 {
		t.Fatalf("want title, header and 2 rows:\n%s", out)
	}
	for _, want := range []string{"20µs", "4.00x", "0.50x", "3"} { // median 20µs; gloo 80/20; mpi 10/20; 3 rounds
		if !strings.Contains(rows[2], want) {
			t.Errorf("4KB row lacks %q: %q", want, rows[2])
		}
	}
	if !strings.Contains(rows[3], "64MB") || !strings.Contains(rows[3], "2.00x") || !strings.Contains(rows[3], "-") {
		t.Errorf("64MB row: %q", rows[3])
	}
	if _, stderr, code := elasticd(t, nil, "bench", "report", filepath.Join(t.TempDir(), "missing")); code != 2 || !strings.Contains(stderr, "no such file") {
		t.Errorf("missing file: exit %d, %q", code, stderr)
	}
}

// bench recovery measures a real job: cold start, recovery and join are positive and bounded,
// and no committed step is lost.
func TestBenchRecoveryJSON(t *testing.T) {
	out, stderr, code := elasticd(t, nil, "bench", "recovery", "--np", "3", "--runs", "1", "--trainer", trainer, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var r map[string]float64
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	for _, k := range []string{"cold_start_s", "recovery_s", "join_s"} {
		if !(r[k] > 0 && r[k] < 30) {
			t.Errorf("%s = %v, want within (0, 30) s", k, r[k])
		}
	}
	if r["steps_lost"] < 0 || r["steps_lost"] > 1 {
		t.Errorf("steps_lost = %v, want 0 or 1 (at most the step in progress)", r["steps_lost"])
	}
	if r["np"] != 3 || r["runs"] != 1 {
		t.Errorf("np/runs: %v", r)
	}
}

func TestBenchNoticeJSON(t *testing.T) {
	out, stderr, code := elasticd(t, nil, "bench", "notice", "--runs", "1", "--trainer", trainer, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var r map[string]float64
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	for _, k := range []string{"detect_s", "move_s", "total_s"} {
		if !(r[k] > 0 && r[k] < 30) {
			t.Errorf("%s = %v, want within (0, 30) s: well inside a 30 s warning", k, r[k])
		}
	}
	if r["steps_lost"] != 0 {
		t.Errorf("steps_lost = %v, want 0: a notice moves the job without rollback", r["steps_lost"])
	}
	if r["runs"] != 1 || r["total_s"] < r["detect_s"] {
		t.Errorf("runs/total: %v", r)
	}
}
