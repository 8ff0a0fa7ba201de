package ibm_test

import (
	"slices"
	"testing"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/providertest"
)

// TestEndToEndCheck runs the real binary, `elasticd check --json --provider ibm`, against the
// fake VPC API and a fake IAM token service. The credentials reach it as a user's would: the
// command line cannot point elasticd at another IAM, but the SDK's VPC_AUTH_URL can, with
// VPC_AUTH_TYPE=iam and VPC_APIKEY (IBMCLOUD_API_KEY always goes to iam.cloud.ibm.com).
func TestEndToEndCheck(t *testing.T) {
	bin := providertest.BuildElasticd(t)
	secret := providertest.AgentSecretFile(t)
	iam := newIAM(t)
	// Without the credentials and elasticd settings that would change what the child finds.
	clean := providertest.EnvWithout("VPC_", "IBMCLOUD_", "ELASTICD_", "IC_API_KEY=", "VCAP_SERVICES=", "IBM_CREDENTIALS_FILE=", "HOME=")

	// check runs elasticd check on the group with the API key, and returns its exit status
	// and its lines.
	check := func(t *testing.T, f *fakeVPC, group, key string) (int, providers.Checks) {
		t.Helper()
		env := slices.Concat(clean, []string{"HOME=" + t.TempDir(), "IBM_CREDENTIALS_FILE=/nonexistent/ibm-credentials.env",
			"VPC_AUTH_TYPE=iam", "VPC_APIKEY=" + key, "VPC_AUTH_URL=" + iam.URL})
		code, cs := providertest.RunCheckJSON(t, bin, env, t.TempDir(), "--provider", "ibm", "--instance-group", group, "--region", "us-south",
			"--endpoint", f.base, "--manage-capacity", "--agent-secret-file", secret, "--listen", "127.0.0.1:0",
			"-np", "2", "--", "./train")
		for _, ep := range []string{epUpdateGroup, epUpdateManager, epDeleteMembership} {
			if n := f.count(ep); n != 0 {
				t.Errorf("elasticd check made %d %s requests; it must change nothing", n, ep)
			}
		}
		return code, cs
	}

	t.Run("AllFine", func(t *testing.T) {
		f := newFake(t, instances(2)...)
		f.update(func(f *fakeVPC) { f.managers = []fakeManager{autoscaler(1, 8)} })
		code, cs := check(t, f, groupName, "good-key")
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
		code, cs := check(t, f, "gpu-spto", "good-key")
		if code != 1 {
			t.Errorf("exit status %d; want 1", code)
		}
		wantCheck(t, cs, "group", providers.CheckFail, `"gpu-spto"`, "not found", "--instance-group", "--region")
	})
	t.Run("RefusedCredentials", func(t *testing.T) {
		f := newFake(t, instances(2)...)
		code, cs := check(t, f, groupName, "not-a-key")
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
