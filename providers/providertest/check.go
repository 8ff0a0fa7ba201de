package providertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
)

// The pieces of a provider's end-to-end test of `elasticd check`: the real binary is built,
// run against the package's fake with that cloud's credentials and flags, and its JSON
// report read back. What the cloud needs (the fake, the credentials, the flags, what must
// not have changed) stays in the provider's package.

// checkTimeout bounds one `elasticd check`: it asks a fake on loopback, so minutes mean a hang.
const checkTimeout = 2 * time.Minute

// BuildElasticd builds cmd/elasticd into a directory of the test's and returns the binary's
// path; it skips the test under -short, and fails it with go build's output.
func BuildElasticd(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs elasticd")
	}
	bin := filepath.Join(t.TempDir(), "elasticd")
	const pkg = "github.com/elasticd/elasticd/cmd/elasticd"
	if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// AgentSecretFile writes a secret fit for --agent-secret-file (long enough, readable by its
// owner alone) and returns its path.
func AgentSecretFile(t testing.TB) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "agent-secret")
	if err := os.WriteFile(file, []byte("c2VjcmV0LXNoYXJlZC13aXRoLWV2ZXJ5LWFnZW50Cg==\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// EnvWithout is this process's environment less the variables that start with any of
// prefixes, so that the child finds only the credentials and settings its test gives it. A
// prefix is matched against "NAME=value": "HOME=" names one variable, "AWS_" a family.
func EnvWithout(prefixes ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !hasAnyPrefix(kv, prefixes) {
			out = append(out, kv)
		}
	}
	return out
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// RunCheck runs `bin check args...` in dir with env (nil: this process's), for at most two
// minutes, logs its output, and returns it with the exit status. A binary that cannot be
// started or does not finish in time fails the test.
func RunCheck(t testing.TB, bin string, env []string, dir string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), checkTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"check"}, args...)...)
	cmd.Dir, cmd.Env = dir, env
	cmd.WaitDelay = 10 * time.Second // a child that leaves our pipes open does not hold the test
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	}
	t.Logf("elasticd check %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out.String(), errOut.String())
	switch {
	case ctx.Err() != nil:
		t.Fatalf("elasticd check did not finish in %v", checkTimeout)
	case err != nil && exit == nil:
		t.Fatalf("elasticd check: %v", err)
	}
	return out.String(), errOut.String(), code
}

// ParseCheckJSON reads what `elasticd check --json` printed, {"ok": bool, "checks": [...]},
// and fails the test unless it is that object.
func ParseCheckJSON(t testing.TB, stdout string) (ok bool, cs providers.Checks) {
	t.Helper()
	var r struct {
		OK     *bool            `json:"ok"`
		Checks providers.Checks `json:"checks"`
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("--json printed %q: %v", stdout, err)
	}
	if r.OK == nil || r.Checks == nil {
		t.Fatalf(`--json printed %q; want "ok" and "checks"`, stdout)
	}
	return *r.OK, r.Checks
}

// RunCheckJSON runs `bin check --json args...` (see RunCheck) and returns its exit status and
// its lines. The test fails unless "ok" agrees with both: true exactly when it exits 0 and
// when no line failed.
func RunCheckJSON(t testing.TB, bin string, env []string, dir string, args ...string) (code int, cs providers.Checks) {
	t.Helper()
	stdout, _, code := RunCheck(t, bin, env, dir, append([]string{"--json"}, args...)...)
	ok, cs := ParseCheckJSON(t, stdout)
	if ok != (code == 0) || ok == cs.Failed() {
		t.Errorf(`"ok": %v with exit status %d and a failed line: %v`, ok, code, cs.Failed())
	}
	return code, cs
}

// CheckLine is the line named name; the test fails, listing the names there are, without one.
func CheckLine(t testing.TB, cs providers.Checks, name string) providers.Check {
	t.Helper()
	c, ok := cs.Find(name)
	if !ok {
		t.Fatalf("no check %q in %q", name, cs.Names())
	}
	return c
}

// Contains fails the test unless s, the text of what, holds each of parts.
func Contains(t testing.TB, what, s string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(s, p) {
			t.Errorf("%s %q does not say %q", what, s, p)
		}
	}
}

// WantLine is CheckLine's line, and the test fails unless it has status.
func WantLine(t testing.TB, cs providers.Checks, name string, status providers.CheckStatus) providers.Check {
	t.Helper()
	c := CheckLine(t, cs, name)
	if c.Status != status {
		t.Errorf("%v; want %s", c, status)
	}
	return c
}
