package ibm_test

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

// TestEndToEndCheck runs the real binary, `elasticd check --json --provider ibm`, against the
// fake VPC API and a fake IAM token service. The credentials reach it as a user's would: the
// command line cannot point elasticd at another IAM, but the SDK's VPC_AUTH_URL can, with
// VPC_AUTH_TYPE=iam and VPC_APIKEY (IBMCLOUD_API_KEY always goes to iam.cloud.ibm.com).
func TestEndToEndCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs elasticd")
	}
	bin := filepath.Join(t.TempDir(), "elasticd")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/elasticd/elasticd/cmd/elasticd").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/elasticd: %v\n%s", err, out)
	}
	secret := filepath.Join(t.TempDir(), "agent-secret")
	if err := os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	iam := newIAM(t)

	type result struct {
		OK     bool              `json:"ok"`
		Checks []providers.Check `json:"checks"`
	}
	// check runs elasticd check on the group with the API key, and returns its exit status
	// and its JSON.
	check := func(t *testing.T, f *fakeVPC, group, key string) (int, result, map[string]providers.Check) {
		t.Helper()
		cmd := exec.Command(bin, "check", "--json", "--provider", "ibm", "--instance-group", group, "--region", "us-south",
			"--endpoint", f.base, "--manage-capacity", "--agent-secret-file", secret, "--listen", "127.0.0.1:0",
			"-np", "2", "--", "./train")
		cmd.Dir = t.TempDir()
		cmd.Env = append(cleanEnv(),
			"HOME="+t.TempDir(), "IBM_CREDENTIALS_FILE=/nonexistent/ibm-credentials.env",
			"VPC_AUTH_TYPE=iam", "VPC_APIKEY="+key, "VPC_AUTH_URL="+iam.URL)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("elasticd check: %v", err)
		}
		t.Logf("elasticd check exited %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
		var r result
		if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
			t.Fatalf("stdout is not the JSON object: %v", err)
		}
		byName := make(map[string]providers.Check)
		for _, c := range r.Checks {
			byName[c.Name] = c
		}
		if r.OK != (code == 0) || r.OK == providers.Checks(r.Checks).Failed() {
			t.Errorf(`"ok": %v with exit status %d and a failed check: %v`, r.OK, code, providers.Checks(r.Checks).Failed())
		}
		for _, ep := range []string{epUpdateGroup, epUpdateManager, epDeleteMembership} {
			if n := f.count(ep); n != 0 {
				t.Errorf("elasticd check made %d %s requests; it must change nothing", n, ep)
			}
		}
		return code, r, byName
	}

	t.Run("AllFine", func(t *testing.T) {
		f := newFake(t, instances(2)...)
		f.update(func(f *fakeVPC) { f.managers = []fakeManager{autoscaler(1, 8)} })
		code, _, cs := check(t, f, groupName, "good-key")
		if code != 0 {
			t.Errorf("exit status %d; want 0", code)
		}
		for _, name := range checkNames {
			wantCheck(t, cs, name, providers.CheckOK)
		}
		wantCheck(t, cs, "credentials", providers.CheckOK, "the environment (VPC_AUTH_TYPE, VPC_APIKEY, VPC_AUTH_URL)", "token from "+iam.URL)
		wantCheck(t, cs, "group", providers.CheckOK, `"gpu-spot" found by name`, "membership_count 2")
		wantCheck(t, cs, "group managers", providers.CheckOK, `autoscale manager "gpu-autoscaler" enabled (min 1, max 8)`, "elasticd disables it")
		for _, name := range changeNames {
			wantCheck(t, cs, name, providers.CheckSkipped, "IBM Cloud has no call", "the Editor role on Auto Scale for VPC")
		}
		f.update(func(f *fakeVPC) {
			if !f.managers[0].Enabled {
				t.Error("elasticd check disabled the autoscale manager")
			}
		})
	})
	t.Run("MissingGroup", func(t *testing.T) {
		f := newFake(t, instances(2)...)
		code, _, cs := check(t, f, "gpu-spto", "good-key")
		if code != 1 {
			t.Errorf("exit status %d; want 1", code)
		}
		wantCheck(t, cs, "group", providers.CheckFail, `"gpu-spto"`, "not found", "--instance-group", "--region")
	})
	t.Run("RefusedCredentials", func(t *testing.T) {
		f := newFake(t, instances(2)...)
		code, _, cs := check(t, f, groupName, "not-a-key")
		if code != 1 {
			t.Errorf("exit status %d; want 1", code)
		}
		wantCheck(t, cs, "credentials", providers.CheckFail, "Provided API key could not be found", "check the API key")
		wantCheck(t, cs, "group", providers.CheckSkipped, "no credentials")
		if n := f.total(); n != 0 {
			t.Errorf("%d VPC API requests without a token", n)
		}
	})
}

// cleanEnv is this process's environment without the credentials and elasticd settings that
// would change what the child finds.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "VPC_") || strings.HasPrefix(k, "IBMCLOUD_") || strings.HasPrefix(k, "ELASTICD_") ||
			k == "IC_API_KEY" || k == "VCAP_SERVICES" || k == "IBM_CREDENTIALS_FILE" || k == "HOME" {
			continue
		}
		out = append(out, kv)
	}
	return out
}
