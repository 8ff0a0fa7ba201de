package gcp_test

import (
	"slices"
	"testing"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/providertest"
)

// TestEndToEndCheck runs the real binary, `elasticd check --provider gcp`, against the fake
// Compute Engine and Resource Manager (both at --endpoint, as behind a private endpoint).
// elasticd finds its credentials with Application Default Credentials: the child is given
// a service-account key (GOOGLE_APPLICATION_CREDENTIALS) whose token_uri is the fake's, and a
// HOME with no gcloud file, so that nothing leaves loopback.
func TestEndToEndCheck(t *testing.T) {
	bin := providertest.BuildElasticd(t)
	secret := providertest.AgentSecretFile(t)
	clean := providertest.EnvWithout("GOOGLE_", "GCE_METADATA", "CLOUDSDK_", "ELASTICD_", "HOME=")

	// env is the child's: a key for f's service account, a HOME of its own.
	env := func(t *testing.T, f *fakeCompute) []string {
		t.Helper()
		key := f.serviceAccountKey(t, t.TempDir())
		return slices.Concat(clean, []string{"HOME=" + t.TempDir(), "GOOGLE_APPLICATION_CREDENTIALS=" + key})
	}
	// args are the flags of a job on f's MIG mig.
	args := func(f *fakeCompute, mig string) []string {
		return []string{"--provider", "gcp", "--mig", mig, "--zone", f.zone, "--project", f.project,
			"--endpoint", f.srv.URL, "--manage-capacity", "--agent-secret-file", secret, "--listen", "127.0.0.1:0",
			"-np", "2", "--", "./train"}
	}
	unchanged := func(t *testing.T, f *fakeCompute) {
		t.Helper()
		if n, m := f.calls(epResize), f.calls(epRecreate); n+m != 0 {
			t.Errorf("elasticd check made %d resizes and %d recreateInstances; it must change nothing", n, m)
		}
	}
	check := func(t *testing.T, f *fakeCompute, mig string) (int, providers.Checks) {
		t.Helper()
		code, cs := providertest.RunCheckJSON(t, bin, env(t, f), t.TempDir(), args(f, mig)...)
		unchanged(t, f)
		return code, cs
	}

	t.Run("all fine", func(t *testing.T) {
		f := newFake(t, "zonal")
		code, cs := check(t, f, f.mig)
		if code != 0 {
			t.Fatalf("exit %d; want 0", code)
		}
		for _, name := range []string{"credentials", "project", "location", "group",
			"permission " + permGet, "permission " + permList, "permission " + permUpdate, "permission " + permZoneOps} {
			providertest.WantLine(t, cs, name, providers.CheckOK)
		}
		providertest.Contains(t, "credentials", providertest.CheckLine(t, cs, "credentials").Detail,
			"service account "+testAccount, "from GOOGLE_APPLICATION_CREDENTIALS")
		providertest.Contains(t, "group", providertest.CheckLine(t, cs, "group").Detail, `MIG "gpu-mig"`, "a3-highgpu-8g, SPOT", "no autoscaler")
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
		code, cs := check(t, f, f.mig)
		if code != 1 {
			t.Fatalf("exit %d; want 1", code)
		}
		l := providertest.WantLine(t, cs, "permission "+permUpdate, providers.CheckFail)
		providertest.Contains(t, "fix", l.Fix, "grant "+permUpdate, "roles/compute.instanceAdmin.v1", "--member serviceAccount:"+testAccount)

		// The same, as a person reads it: the line names the permission, its fix below it.
		out, _, code := providertest.RunCheck(t, bin, env(t, f), t.TempDir(), args(f, f.mig)...)
		unchanged(t, f)
		if code != 1 {
			t.Errorf("exit %d; want 1", code)
		}
		providertest.Contains(t, "output", out, "✘ permission "+permUpdate+": not held on project", "\n  fix: grant "+permUpdate,
			"✔ permission "+permGet+": held on project")
	})

	t.Run("a missing group", func(t *testing.T) {
		f := newFake(t, "zonal")
		code, cs := check(t, f, "gpu-mig-old")
		if code != 1 {
			t.Fatalf("exit %d; want 1", code)
		}
		l := providertest.WantLine(t, cs, "group", providers.CheckFail)
		providertest.Contains(t, "group", l.Detail, `MIG "gpu-mig-old"`, "was not found (HTTP 404)")
		providertest.Contains(t, "group fix", l.Fix, "--mig", "--zone", "--region", "--project")
	})
}
