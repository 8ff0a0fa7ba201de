package main_test

import (
	"bytes"
	"context"
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

// TestMain builds elasticd and the example trainer once. ELASTICD_TEST_BIN and
// ELASTICD_TEST_TRAIN name prebuilt ones instead: a machine without Go (a GPU machine that runs
// the PyTorch tests under its own torch, scripts/gpu-check.sh) runs the compiled test binary.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "elasticd-cli-test-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, b := range []struct {
		path *string
		env  string
		name string
		pkg  string
	}{{&binary, "ELASTICD_TEST_BIN", "elasticd", "."}, {&trainer, "ELASTICD_TEST_TRAIN", "train", "../../examples/train"}} {
		if *b.path = os.Getenv(b.env); *b.path != "" {
			continue
		}
		*b.path = filepath.Join(dir, b.name)
		build := exec.Command("go", "build", "-o", *b.path, b.pkg)
		build.Stderr = os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n", b.name, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
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

// The product's usage line, flags straight after elasticd, runs a job as `run` does.
func TestRootFlagsRunAJob(t *testing.T) {
	_, stderr, code := elasticd(t, nil, "-np", "2", "--", "true")
	if code != 0 {
		t.Fatalf("elasticd -np 2 -- true: exit %d, want 0 as with run:\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "generation") {
		t.Errorf("stderr does not show a job running:\n%s", stderr)
	}
	out, _, code := elasticd(t, nil, "--version")
	if code != 0 || !strings.HasPrefix(out, "elasticd ") {
		t.Errorf("--version: exit %d, output %q; want the version command's", code, out)
	}
}

// A training command that cannot start ends the job with a last line that says why, not only
// "exit 127".
func TestMissingCommandNamedInLastLine(t *testing.T) {
	_, stderr, code := elasticd(t, nil, "run", "-np", "2", "--elastic-timeout", "2s", "--", "/nonexistent/elasticd-train")
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	last := lines[len(lines)-1]
	if !strings.Contains(last, "could not start: ") || !strings.Contains(last, "/nonexistent/elasticd-train: no such file or directory") {
		t.Errorf("last line %q does not name the cause", last)
	}
}

// The version and commit stamped by the linker (make build) show where Go's VCS stamping is off.
func TestVersionStampedByLinker(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "elasticd")
	build := exec.Command("go", "build", "-buildvcs=false", "-ldflags", "-X main.version=v0.0.0-test -X main.commit=0123abcd", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(out), "elasticd v0.0.0-test\ncommit 0123abcd\n") {
		t.Errorf("version printed %q; want the stamped version and commit", out)
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
		{args: []string{"agent", "--np", "4"}, want: "--np is a flag of 'elasticd run'"},
		{args: []string{"run", "-np", "2", "--resetlimit", "3", "--", "true"}, want: "(did you mean --reset-limit?)"},
		{args: []string{"bench", "allreduce", "--zzz"}, want: "(see 'elasticd bench allreduce --help')"},
		{args: []string{"--provider", "nope", "-np", "1", "--", "true"}, want: `--provider: "nope": use one of`},
		{args: []string{"bench", "allreduce"}, env: []string{"ELASTICD_NP=100"}, want: "--np: 100 ranks"},
		{args: []string{"bench", "allreduce", "--netns-hosts", "h1"}, want: `--netns-hosts: "h1": want NAMESPACE=IP`},
		{args: []string{"bench", "allreduce", "--np", "3"}, env: []string{"ELASTICD_NETNS_HOSTS=h1=10.0.0.1,h2=10.0.0.2"}, want: "--netns-hosts: 3 ranks do not divide among 2 hosts"},
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
