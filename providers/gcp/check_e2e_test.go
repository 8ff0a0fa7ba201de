package gcp_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/elasticd/elasticd/providers"
)

// TestEndToEndCheck runs the real binary, `elasticd check --provider gcp`, against the fake
// Compute Engine and Resource Manager (both at --endpoint, as behind a private endpoint).
// elasticd finds its credentials with Application Default Credentials: the child is given
// a service-account key (GOOGLE_APPLICATION_CREDENTIALS) whose token_uri is the fake's, and a
// HOME with no gcloud file, so that nothing leaves loopback.
func TestEndToEndCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs elasticd")
	}
	bin := filepath.Join(t.TempDir(), "elasticd")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/elasticd/elasticd/cmd/elasticd").CombinedOutput(); err != nil {
		t.Fatalf("go build elasticd: %v\n%s", err, out)
	}
	secret := filepath.Join(t.TempDir(), "agent-secret")
	if err := os.WriteFile(secret, []byte("c2VjcmV0LXNoYXJlZC13aXRoLWV2ZXJ5LWFnZW50Cg==\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		for _, p := range []string{"GOOGLE_", "GCE_METADATA", "CLOUDSDK_", "ELASTICD_", "HOME="} {
			if strings.HasPrefix(kv, p) {
				kv = ""
				break
			}
		}
		if kv != "" {
			env = append(env, kv)
		}
	}

	check := func(t *testing.T, f *fakeCompute, mig string, asJSON bool) (string, int) {
		t.Helper()
		key := f.serviceAccountKey(t, t.TempDir())
		args := []string{"check", "--provider", "gcp", "--mig", mig, "--zone", f.zone, "--project", f.project,
			"--endpoint", f.srv.URL, "--manage-capacity", "--agent-secret-file", secret, "--listen", "127.0.0.1:0",
			"-np", "2", "--", "./train"}
		if asJSON {
			args = append([]string{"check", "--json"}, args[1:]...)
		}
		cmd := exec.Command(bin, args...)
		cmd.Dir = t.TempDir()
		cmd.Env = append(env, "HOME="+t.TempDir(), "GOOGLE_APPLICATION_CREDENTIALS="+key)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("elasticd check: %v", err)
		}
		t.Logf("elasticd %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
		if n, m := f.calls(epResize), f.calls(epRecreate); n+m != 0 {
			t.Errorf("elasticd check made %d resizes and %d recreateInstances; it must change nothing", n, m)
		}
		return stdout.String(), code
	}
	report := func(t *testing.T, out string) (bool, providers.Checks) {
		t.Helper()
		var r struct {
			OK     bool             `json:"ok"`
			Checks providers.Checks `json:"checks"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("--json printed %q: %v", out, err)
		}
		return r.OK, r.Checks
	}
	line := func(t *testing.T, cs providers.Checks, name string) providers.Check {
		t.Helper()
		for _, c := range cs {
			if c.Name == name {
				return c
			}
		}
		t.Fatalf("no check %q in %q", name, names(cs))
		return providers.Check{}
	}
	contains := func(t *testing.T, what, s string, parts ...string) {
		t.Helper()
		for _, p := range parts {
			if !strings.Contains(s, p) {
				t.Errorf("%s %q: want %q in it", what, s, p)
			}
		}
	}

	t.Run("all fine", func(t *testing.T) {
		f := newFake(t, "zonal")
		out, code := check(t, f, f.mig, true)
		ok, cs := report(t, out)
		if code != 0 || !ok || cs.Failed() {
			t.Fatalf("exit %d, ok %v; want 0 and true", code, ok)
		}
		for _, name := range []string{"credentials", "project", "location", "group",
			"permission " + permGet, "permission " + permList, "permission " + permUpdate, "permission " + permZoneOps} {
			if l := line(t, cs, name); l.Status != providers.CheckOK {
				t.Errorf("%v; want ok", l)
			}
		}
		contains(t, "credentials", line(t, cs, "credentials").Detail, "service account "+testAccount, "from GOOGLE_APPLICATION_CREDENTIALS")
		contains(t, "group", line(t, cs, "group").Detail, `MIG "gpu-mig"`, "a3-highgpu-8g, SPOT", "no autoscaler")
		if got := f.testIAMAsked(t); len(got) != 1 {
			t.Errorf("testIamPermissions asked %d times at --endpoint; want once", len(got))
		}
		if f.tokens == 0 {
			t.Error("the key's token endpoint was never asked: the child did not use the key")
		}
	})

	t.Run("a denied permission", func(t *testing.T) {
		f := newFake(t, "zonal")
		f.grant(permUpdate)
		out, code := check(t, f, f.mig, true)
		ok, cs := report(t, out)
		if code != 1 || ok {
			t.Fatalf("exit %d, ok %v; want 1 and false", code, ok)
		}
		l := line(t, cs, "permission "+permUpdate)
		if l.Status != providers.CheckFail {
			t.Fatalf("%v; want failed", l)
		}
		contains(t, "fix", l.Fix, "grant "+permUpdate, "roles/compute.instanceAdmin.v1", "--member serviceAccount:"+testAccount)

		// The same, as a person reads it: the line names the permission, its fix below it.
		out, code = check(t, f, f.mig, false)
		if code != 1 {
			t.Errorf("exit %d; want 1", code)
		}
		contains(t, "output", out, "✘ permission "+permUpdate+": not held on project", "\n  fix: grant "+permUpdate,
			"✔ permission "+permGet+": held on project")
	})

	t.Run("a missing group", func(t *testing.T) {
		f := newFake(t, "zonal")
		out, code := check(t, f, "gpu-mig-old", true)
		ok, cs := report(t, out)
		if code != 1 || ok {
			t.Fatalf("exit %d, ok %v; want 1 and false", code, ok)
		}
		l := line(t, cs, "group")
		if l.Status != providers.CheckFail {
			t.Fatalf("%v; want failed", l)
		}
		contains(t, "group", l.Detail, `MIG "gpu-mig-old"`, "was not found (HTTP 404)")
		contains(t, "group fix", l.Fix, "--mig", "--zone", "--region", "--project")
	})
}
