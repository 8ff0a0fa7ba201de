package aws_test

import (
	"strings"
	"testing"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/providertest"
)

// TestEndToEndCheck runs the real binary, `elasticd check --json --provider aws`, with the
// flags of a job that steers its group and reads notices, against the fake: a setup with
// nothing wrong exits 0 with every AWS line verified; a denied permission, a missing group
// and a queue that no rule feeds each exit 1 with the failing line naming what to fix.
func TestEndToEndCheck(t *testing.T) {
	bin := providertest.BuildElasticd(t)
	dir := t.TempDir()
	secret := providertest.AgentSecretFile(t)
	// TestMain left dummy credentials, no config files and no instance metadata.
	env := append(providertest.EnvWithout("ELASTICD_"), "AWS_EC2_METADATA_DISABLED=true")

	// args are the flags of a job on f's group.
	args := func(f *fakeAWS) []string {
		return []string{"--provider", "aws", "--asg", fakeGroup, "--region", "us-east-1",
			"--endpoint", f.srv.URL, "--sqs-queue-url", f.queueURL, "--manage-capacity",
			"--agent-secret-file", secret, "--listen", "127.0.0.1:0", "-np", "2", "--", "./train"}
	}
	run := func(t *testing.T, f *fakeAWS, wantCode int) providers.Checks {
		t.Helper()
		code, cs := providertest.RunCheckJSON(t, bin, env, dir, args(f)...)
		assertNothingChanged(t, f)
		if code != wantCode {
			t.Errorf("exit %d; want %d", code, wantCode)
		}
		return cs
	}
	// onlyFailure: the one failed line is name's, and its fix holds each of fix.
	onlyFailure := func(t *testing.T, cs providers.Checks, name string, fix ...string) {
		t.Helper()
		for _, c := range cs {
			if c.Status == providers.CheckFail && c.Name != name {
				t.Errorf("%s failed too: %s", c.Name, c)
			}
		}
		want(t, cs, name, providers.CheckFail, prefixed("fix:", fix)...)
	}

	insts := func() []*fakeInst {
		a, b := inst(1), inst(2)
		a.Spot, b.Spot = true, true
		return []*fakeInst{a, b}
	}

	t.Run("all fine", func(t *testing.T) {
		f := newFake(t, insts()...)
		cs := run(t, f, 0)
		for _, name := range []string{"credentials", "region", "group", "permission autoscaling:DescribeAutoScalingGroups",
			"permission ec2:DescribeInstances", "permission autoscaling:SetDesiredCapacity", "permission sqs:DeleteMessage",
			"permission autoscaling:CreateOrUpdateTags", "notice queue", "notice queue policy", "notice rules"} {
			want(t, cs, name, providers.CheckOK)
		}
		want(t, cs, "permission ec2:DescribeSpotPriceHistory", providers.CheckOK) // the aws provider reads spot prices
		want(t, cs, "hosts", providers.CheckOK, "2 hosts")
	})
	t.Run("denied permission", func(t *testing.T) {
		f := newFake(t, insts()...)
		f.grant("autoscaling:SetDesiredCapacity", fakeGrant{Decision: "implicitDeny"})
		cs := run(t, f, 1)
		onlyFailure(t, cs, "permission autoscaling:SetDesiredCapacity", "grant autoscaling:SetDesiredCapacity on "+groupARN+" to "+fakeRoleARN)
		// The same, as a person reads it.
		out, _, code := providertest.RunCheck(t, bin, env, dir, args(f)...)
		assertNothingChanged(t, f)
		if code != 1 || !strings.Contains(out, "✘ permission autoscaling:SetDesiredCapacity: not allowed on "+groupARN) ||
			!strings.Contains(out, "\n  fix: grant autoscaling:SetDesiredCapacity on "+groupARN) ||
			!strings.Contains(out, "✔ credentials: from the environment") {
			t.Errorf("exit %d; want 1, with the ✘ line, its fix and the ✔ lines", code)
		}
	})
	t.Run("missing group", func(t *testing.T) {
		f := newFake(t, insts()...)
		f.change(func() { f.exists = false })
		cs := run(t, f, 1)
		onlyFailure(t, cs, "group", "--asg", "--region")
		want(t, cs, "group", providers.CheckFail, `no Auto Scaling group "gpu-workers" in us-east-1`)
		want(t, cs, "permission autoscaling:SetDesiredCapacity", providers.CheckSkipped)
	})
	t.Run("queue with no rule", func(t *testing.T) {
		f := newFake(t, insts()...)
		f.set(func() { f.rules = nil })
		cs := run(t, f, 1)
		onlyFailure(t, cs, "notice rules", "aws events put-rule", "terraform/aws")
		want(t, cs, "notice rules", providers.CheckFail, "no spot notice will arrive")
		want(t, cs, "hosts", providers.CheckOK) // a rule missing does not keep the hosts from being listed
	})
}

func prefixed(p string, ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = p + s
	}
	return out
}
