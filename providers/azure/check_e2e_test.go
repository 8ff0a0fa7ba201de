package azure_test

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

// TestEndToEndCheck runs the real binary, `elasticd check --provider azure`, against the
// fake ARM. elasticd makes its credential with azidentity's DefaultAzureCredential, which
// cannot be handed a test credential from the command line; the child's chain is narrowed to
// the Azure CLI (AZURE_TOKEN_CREDENTIALS=AzureCLICredential) and a stand-in az on its PATH
// hands out the token, so that nothing leaves loopback.
func TestEndToEndCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs elasticd")
	}
	bin := filepath.Join(t.TempDir(), "elasticd")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/elasticd/elasticd/cmd/elasticd").CombinedOutput(); err != nil {
		t.Fatalf("go build elasticd: %v\n%s", err, out)
	}
	az := fakeAz(t, jwt(map[string]any{"upn": "alice@contoso.com", "appid": "04b07795-8ddb-461a-bbee-02f9e1bf7b46",
		"idtyp": "user", "oid": testOID, "tid": testTenant}))
	secret := filepath.Join(t.TempDir(), "agent-secret")
	if err := os.WriteFile(secret, []byte("c2VjcmV0LXNoYXJlZC13aXRoLWV2ZXJ5LWFnZW50Cg==\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AZURE_") && !strings.HasPrefix(kv, "ELASTICD_") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	env = append(env, "AZURE_TOKEN_CREDENTIALS=AzureCLICredential", "PATH="+az+string(os.PathListSeparator)+os.Getenv("PATH"))

	check := func(t *testing.T, f *fakeARM, vmss string, asJSON bool) (string, int) {
		t.Helper()
		args := []string{"check", "--provider", "azure", "--subscription", f.sub, "--resource-group", f.rg, "--vmss", vmss,
			"--endpoint", f.srv.URL, "--manage-capacity", "--agent-secret-file", secret, "--listen", "127.0.0.1:0",
			"-np", "2", "--", "./train"}
		if asJSON {
			args = append([]string{"check", "--json"}, args[1:]...)
		}
		cmd := exec.Command(bin, args...)
		cmd.Dir, cmd.Env = t.TempDir(), env
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
		if n, m := f.count(epUpdate), f.count(epDelete); n+m != 0 {
			t.Errorf("elasticd check made %d PATCHes and %d POSTs …/delete; it must change nothing", n, m)
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

	t.Run("all fine", func(t *testing.T) {
		f := newFake(t, vm("0", "10.0.0.4"), vm("1", "10.0.0.5"))
		out, code := check(t, f, f.vmss, true)
		ok, cs := report(t, out)
		if code != 0 || !ok || cs.Failed() {
			t.Fatalf("exit %d, ok %v; want 0 and true", code, ok)
		}
		for _, name := range []string{"credentials", "subscription", "resource group", "group", "claim",
			"permission " + permRead, "permission " + permVMs, "permission " + permNICs, "permission " + permWrite, "permission " + permDelete} {
			if l := line(t, cs, name); l.Status != providers.CheckOK {
				t.Errorf("%v; want ok", l)
			}
		}
		contains(t, "credentials", line(t, cs, "credentials").Detail, "from the Azure CLI", "as alice@contoso.com")
		contains(t, "group", line(t, cs, "group").Detail, "Standard_ND96asr_v4", "capacity 2", "Spot priority")
		if f.count(epPerms) == 0 {
			t.Error("the permissions were not asked of the fake")
		}
	})

	t.Run("a denied permission", func(t *testing.T) {
		f := newFake(t, vm("0", "10.0.0.4"), vm("1", "10.0.0.5"))
		f.setPermissions([]fakePerm{{Actions: []string{"*/read"}}})
		out, code := check(t, f, f.vmss, true)
		ok, cs := report(t, out)
		if code != 1 || ok {
			t.Fatalf("exit %d, ok %v; want 1 and false", code, ok)
		}
		l := line(t, cs, "permission "+permWrite)
		if l.Status != providers.CheckFail {
			t.Fatalf("%v; want failed", l)
		}
		contains(t, "fix", l.Fix, "grant "+permWrite, "Virtual Machine Contributor", "--assignee "+testOID)

		// The same, as a person reads it: the line names the action, its fix below it.
		out, code = check(t, f, f.vmss, false)
		if code != 1 {
			t.Errorf("exit %d; want 1", code)
		}
		contains(t, "output", out, "✘ permission "+permWrite+": not granted on scale set gpus", "\n  fix: grant "+permWrite,
			"✔ permission "+permRead+": granted")
	})

	t.Run("a missing group", func(t *testing.T) {
		f := newFake(t, vm("0", "10.0.0.4"))
		out, code := check(t, f, "gpus-old", true)
		ok, cs := report(t, out)
		if code != 1 || ok {
			t.Fatalf("exit %d, ok %v; want 1 and false", code, ok)
		}
		l := line(t, cs, "group")
		if l.Status != providers.CheckFail {
			t.Fatalf("%v; want failed", l)
		}
		contains(t, "group", l.Detail, `scale set "gpus-old" not found`)
		contains(t, "group fix", l.Fix, "--vmss")
		if l := line(t, cs, "permissions"); l.Status != providers.CheckSkipped {
			t.Errorf("%v; want skipped", l)
		}
	})
}
