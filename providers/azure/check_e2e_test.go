package azure_test

import (
	"os"
	"testing"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/providertest"
)

// TestEndToEndCheck runs the real binary, `elasticd check --provider azure`, against the
// fake ARM. elasticd makes its credential with azidentity's DefaultAzureCredential, which
// cannot be handed a test credential from the command line; the child's chain is narrowed to
// the Azure CLI (AZURE_TOKEN_CREDENTIALS=AzureCLICredential) and a stand-in az on its PATH
// hands out the token, so that nothing leaves loopback.
func TestEndToEndCheck(t *testing.T) {
	bin := providertest.BuildElasticd(t)
	az := fakeAz(t, jwt(map[string]any{"upn": "alice@contoso.com", "appid": "04b07795-8ddb-461a-bbee-02f9e1bf7b46",
		"idtyp": "user", "oid": testOID, "tid": testTenant}))
	secret := providertest.AgentSecretFile(t)
	env := append(providertest.EnvWithout("AZURE_", "ELASTICD_", "PATH="),
		"AZURE_TOKEN_CREDENTIALS=AzureCLICredential", "PATH="+az+string(os.PathListSeparator)+os.Getenv("PATH"))

	// args are the flags of a job on f's scale set vmss.
	args := func(f *fakeARM, vmss string) []string {
		return []string{"--provider", "azure", "--subscription", f.sub, "--resource-group", f.rg, "--vmss", vmss,
			"--endpoint", f.srv.URL, "--manage-capacity", "--agent-secret-file", secret, "--listen", "127.0.0.1:0",
			"-np", "2", "--", "./train"}
	}
	unchanged := func(t *testing.T, f *fakeARM) {
		t.Helper()
		if n, m := f.count(epUpdate), f.count(epDelete); n+m != 0 {
			t.Errorf("elasticd check made %d PATCHes and %d POSTs …/delete; it must change nothing", n, m)
		}
	}
	check := func(t *testing.T, f *fakeARM, vmss string) (int, providers.Checks) {
		t.Helper()
		code, cs := providertest.RunCheckJSON(t, bin, env, t.TempDir(), args(f, vmss)...)
		unchanged(t, f)
		return code, cs
	}

	t.Run("all fine", func(t *testing.T) {
		f := newFake(t, vm("0", "10.0.0.4"), vm("1", "10.0.0.5"))
		code, cs := check(t, f, f.vmss)
		if code != 0 {
			t.Fatalf("exit %d; want 0", code)
		}
		for _, name := range []string{"credentials", "subscription", "resource group", "group", "claim",
			"permission " + permRead, "permission " + permVMs, "permission " + permNICs, "permission " + permWrite, "permission " + permDelete} {
			providertest.WantLine(t, cs, name, providers.CheckOK)
		}
		providertest.Contains(t, "credentials", providertest.CheckLine(t, cs, "credentials").Detail, "from the Azure CLI", "as alice@contoso.com")
		providertest.Contains(t, "group", providertest.CheckLine(t, cs, "group").Detail, "Standard_ND96asr_v4", "capacity 2", "Spot priority")
		if f.count(epPerms) == 0 {
			t.Error("the permissions were not asked of the fake")
		}
	})

	t.Run("a denied permission", func(t *testing.T) {
		f := newFake(t, vm("0", "10.0.0.4"), vm("1", "10.0.0.5"))
		f.setPermissions([]fakePerm{{Actions: []string{"*/read"}}})
		code, cs := check(t, f, f.vmss)
		if code != 1 {
			t.Fatalf("exit %d; want 1", code)
		}
		l := providertest.WantLine(t, cs, "permission "+permWrite, providers.CheckFail)
		providertest.Contains(t, "fix", l.Fix, "grant "+permWrite, "Virtual Machine Contributor", "--assignee "+testOID)

		// The same, as a person reads it: the line names the action, its fix below it.
		out, _, code := providertest.RunCheck(t, bin, env, t.TempDir(), args(f, f.vmss)...)
		unchanged(t, f)
		if code != 1 {
			t.Errorf("exit %d; want 1", code)
		}
		providertest.Contains(t, "output", out, "✘ permission "+permWrite+": not granted on scale set gpus", "\n  fix: grant "+permWrite,
			"✔ permission "+permRead+": granted")
	})

	t.Run("a missing group", func(t *testing.T) {
		f := newFake(t, vm("0", "10.0.0.4"))
		code, cs := check(t, f, "gpus-old")
		if code != 1 {
			t.Fatalf("exit %d; want 1", code)
		}
		l := providertest.WantLine(t, cs, "group", providers.CheckFail)
		providertest.Contains(t, "group", l.Detail, `scale set "gpus-old" not found`)
		providertest.Contains(t, "group fix", l.Fix, "--vmss")
		providertest.WantLine(t, cs, "permissions", providers.CheckSkipped)
	})
}
