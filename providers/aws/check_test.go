package aws_test

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/aws"
	"github.com/elasticd/elasticd/providers/providertest"
)

// everything is a job that steers its group, accounts its cost and reads notices.
var everything = providers.CheckNeeds{ManageCapacity: true, Prices: true}

// runCheck checks the fake's group (with its queue unless cfg says otherwise) and logs the lines.
func runCheck(t *testing.T, f *fakeAWS, cfg aws.Config, needs providers.CheckNeeds) providers.Checks {
	t.Helper()
	p := newProvider(t, f, cfg)
	cs := providers.Checks(p.Check(pollCtx(t), needs))
	for _, c := range cs {
		t.Logf("%s", c)
	}
	assertNothingChanged(t, f)
	return cs
}

// withQueue is the fake's group and its queue.
func withQueue(f *fakeAWS) aws.Config { return aws.Config{SQSQueueURL: f.queueURL} }

// want checks one line's status and that its detail and fix hold each of the strings given
// (a string in fix only: prefix it with "fix:").
func want(t *testing.T, cs providers.Checks, name string, status providers.CheckStatus, has ...string) providers.Check {
	t.Helper()
	c := providertest.WantLine(t, cs, name, status)
	for _, h := range has {
		if fix, ok := strings.CutPrefix(h, "fix:"); ok {
			if !strings.Contains(c.Fix, fix) {
				t.Errorf("%s: fix %q lacks %q", name, c.Fix, fix)
			}
		} else if !strings.Contains(c.Detail, h) {
			t.Errorf("%s: detail %q lacks %q", name, c.Detail, h)
		}
	}
	if status == providers.CheckFail && c.Fix == "" {
		t.Errorf("%s failed without a fix", name)
	}
	return c
}

// assertNothingChanged: a check makes no call that changes anything or consumes a message.
func assertNothingChanged(t *testing.T, f *fakeAWS) {
	t.Helper()
	for _, op := range []string{"SetDesiredCapacity", "UpdateAutoScalingGroup", "TerminateInstanceInAutoScalingGroup",
		"CreateOrUpdateTags", "DeleteTags", "CompleteLifecycleAction", "ReceiveMessage", "DeleteMessageBatch"} {
		if n := f.count(op); n != 0 {
			t.Errorf("the check called %s %d times; it must change nothing", op, n)
		}
	}
}

const groupARN = fakeGroupARN + fakeGroup

// TestCheckAllFine: a job with every need, whose role may do everything and whose queue is
// fed by an enabled spot rule, passes every check; IAM is asked about each action on what it is
// granted on, as the driver's role (its ARN with its path), through pages of results.
func TestCheckAllFine(t *testing.T) {
	f := newFake(t, inst(1), inst(2))
	f.setSize(0, 2, 8)
	f.set(func() { f.simPage = 3 })
	cs := runCheck(t, f, withQueue(f), everything)

	wantNames := []string{"credentials", "region", "group"}
	for _, pm := range aws.Permissions(everything, true) {
		wantNames = append(wantNames, "permission "+pm.Action)
	}
	wantNames = append(wantNames, "notice queue", "notice queue policy", "notice rules")
	if got := cs.Names(); !slices.Equal(got, wantNames) {
		t.Errorf("checks %q, want %q", got, wantNames)
	}
	for _, c := range cs {
		if c.Status != providers.CheckOK {
			t.Errorf("%s: %s, want ok", c.Name, c)
		}
	}
	want(t, cs, "credentials", providers.CheckOK, "from the environment (AWS_ACCESS_KEY_ID)", fakeCaller, "account "+fakeAccount)
	want(t, cs, "region", providers.CheckOK, "us-east-1, from --region", f.srv.URL)
	want(t, cs, "group", providers.CheckOK, `"gpu-workers"`, "desired 2 (min 0, max 8), 2 instances")
	want(t, cs, "permission autoscaling:SetDesiredCapacity", providers.CheckOK, "allowed on "+groupARN)
	want(t, cs, "permission ec2:DescribeInstances", providers.CheckOK, "allowed on *")
	want(t, cs, "permission sqs:DeleteMessage", providers.CheckOK, "allowed on "+fakeQueueARN)
	want(t, cs, "notice queue", providers.CheckOK, fakeQueueARN)
	want(t, cs, "notice queue policy", providers.CheckOK, "rule "+fakeSpotRule)
	want(t, cs, "notice rules", providers.CheckOK, "spot interruption warnings from rule "+fakeSpotRule,
		"rebalance recommendations from "+fakeSpotRule)

	// One simulation per resource, as the role, each action on what it is granted on.
	asked := map[string]string{} // action -> resource
	for _, in := range f.inputs["SimulatePrincipalPolicy"] {
		if src := in.Get("PolicySourceArn"); src != fakeRoleARN {
			t.Errorf("simulated as %q, want the role's ARN %q", src, fakeRoleARN)
		}
		for i := 1; in.Has("ActionNames.member." + strconv.Itoa(i)); i++ {
			asked[in.Get("ActionNames.member."+strconv.Itoa(i))] = in.Get("ResourceArns.member.1")
		}
	}
	for _, pm := range aws.Permissions(everything, true) {
		res := map[string]string{aws.OnAny: "*", aws.OnGroup: groupARN, aws.OnQueue: fakeQueueARN}[pm.On]
		if asked[pm.Action] != res {
			t.Errorf("%s simulated on %q, want %q", pm.Action, asked[pm.Action], res)
		}
	}
	if got := len(f.inputs["SimulatePrincipalPolicy"]); got < 4 {
		t.Errorf("%d SimulatePrincipalPolicy calls; with 3 results a page, the 13 actions take at least 4", got)
	}
	if n := f.count("DescribeInstances"); n != 0 {
		t.Errorf("DescribeInstances called %d times: with the simulator, nothing needs a DryRun", n)
	}
	if got := f.inputs["ListRuleNamesByTarget"]; len(got) != 1 || got[0].Get("TargetArn") != fakeQueueARN || got[0].Get("EventBusName") != "" {
		t.Errorf("ListRuleNamesByTarget inputs %v, want one for %s on the default bus", got, fakeQueueARN)
	}
	// Every service through the one --endpoint, each signed for its own service.
	for op, svc := range map[string]string{"GetCallerIdentity": "sts", "GetRole": "iam", "SimulatePrincipalPolicy": "iam",
		"GetQueueAttributes": "sqs", "ListRuleNamesByTarget": "events", "DescribeRule": "events"} {
		f.mu.Lock()
		scopes := f.signed[op]
		f.mu.Unlock()
		if len(scopes) == 0 || !strings.HasSuffix(scopes[0], "/"+svc) {
			t.Errorf("%s signed for %v, want the service %s", op, scopes, svc)
		}
	}
}

// TestCheckWithoutQueue: no queue, no queue permissions, and a line that says what is lost.
func TestCheckWithoutQueue(t *testing.T) {
	f := newFake(t, inst(1))
	cs := runCheck(t, f, aws.Config{}, providers.CheckNeeds{})
	want(t, cs, "notice queue", providers.CheckSkipped, "no --sqs-queue-url", "fix:--sqs-queue-url")
	for _, c := range cs {
		if strings.Contains(c.Name, "sqs:") || strings.Contains(c.Name, "CompleteLifecycleAction") || c.Name == "notice rules" {
			t.Errorf("without a queue, checked %s", c.Name)
		}
	}
	if cs.Failed() {
		t.Error("a check failed")
	}
	if got := cs.Names(); !slices.Contains(got, "permission ec2:DescribeInstances") || slices.Contains(got, "permission ec2:DescribeSpotPriceHistory") ||
		slices.Contains(got, "permission autoscaling:SetDesiredCapacity") {
		t.Errorf("without --manage-capacity or prices, checked %q", got)
	}
}

// TestCheckDeniedPermission: each way IAM can refuse an action is a failed line that names the
// action and what to change, and leaves the other lines as they are.
func TestCheckDeniedPermission(t *testing.T) {
	for _, tc := range []struct {
		name, action string
		grant        fakeGrant
		status       providers.CheckStatus
		has          []string
	}{
		{"implicit deny", "autoscaling:SetDesiredCapacity", fakeGrant{Decision: "implicitDeny"}, providers.CheckFail,
			[]string{"not allowed on " + groupARN, "no policy of " + fakeRoleARN,
				"fix:grant autoscaling:SetDesiredCapacity on " + groupARN + " to " + fakeRoleARN, "fix:docs/providers/aws.md"}},
		{"explicit deny", "autoscaling:TerminateInstanceInAutoScalingGroup", fakeGrant{Decision: "explicitDeny", Policy: "no-terminate"}, providers.CheckFail,
			[]string{"denied on " + groupARN + " by an explicit Deny in policy no-terminate",
				"fix:remove autoscaling:TerminateInstanceInAutoScalingGroup from the Deny statement of policy no-terminate"}},
		{"queue action", "sqs:ReceiveMessage", fakeGrant{Decision: "implicitDeny"}, providers.CheckFail,
			[]string{"not allowed on " + fakeQueueARN, "fix:grant sqs:ReceiveMessage on " + fakeQueueARN}},
		{"describe action", "ec2:DescribeSpotPriceHistory", fakeGrant{Decision: "explicitDeny"}, providers.CheckFail,
			[]string{"denied on * by an explicit Deny"}},
		{"permissions boundary", "autoscaling:DeleteTags", fakeGrant{Decision: "implicitDeny", By: "boundary"}, providers.CheckFail,
			[]string{"permissions boundary of " + fakeRoleARN, "fix:allow autoscaling:DeleteTags in the permissions boundary"}},
		{"organization", "autoscaling:UpdateAutoScalingGroup", fakeGrant{Decision: "implicitDeny", By: "organization"}, providers.CheckFail,
			[]string{"service control policy", "fix:allow autoscaling:UpdateAutoScalingGroup"}},
		{"condition the simulation cannot know", "autoscaling:CreateOrUpdateTags",
			fakeGrant{Decision: "implicitDeny", Missing: []string{"autoscaling:ResourceTag/team"}}, providers.CheckSkipped,
			[]string{"not verified", "autoscaling:ResourceTag/team", "fix:autoscaling:ResourceTag/team"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, inst(1))
			f.grant(tc.action, tc.grant)
			cs := runCheck(t, f, withQueue(f), everything)
			want(t, cs, "permission "+tc.action, tc.status, tc.has...)
			for _, c := range cs {
				if c.Name != "permission "+tc.action && c.Status != providers.CheckOK {
					t.Errorf("%s: %s; only %s should be refused", c.Name, c, tc.action)
				}
			}
			if got := cs.Failed(); got != (tc.status == providers.CheckFail) {
				t.Errorf("Failed() = %v", got)
			}
		})
	}
}

// TestCheckWithoutSimulator: credentials that may not call iam:SimulatePrincipalPolicy get one
// line that says so and how to fix it, then what can be tried without side effects: the
// group's read, DryRun calls of EC2 (one refused here), a read of the scaling activities (refused
// here); the queue's and the group's changes are skipped, saying why.
func TestCheckWithoutSimulator(t *testing.T) {
	f := newFake(t, inst(1))
	f.grant("iam:SimulatePrincipalPolicy", fakeGrant{Decision: "implicitDeny"})
	f.grant("ec2:DescribeInstances", fakeGrant{Decision: "implicitDeny"})
	f.grant("autoscaling:DescribeScalingActivities", fakeGrant{Decision: "explicitDeny"})
	cs := runCheck(t, f, withQueue(f), everything)

	want(t, cs, "permissions", providers.CheckSkipped, "may not call iam:SimulatePrincipalPolicy on "+fakeRoleARN,
		"fix:grant iam:SimulatePrincipalPolicy", "fix:docs/providers/aws.md")
	want(t, cs, "permission autoscaling:DescribeAutoScalingGroups", providers.CheckOK, "reading the group")
	want(t, cs, "permission ec2:DescribeInstances", providers.CheckFail, "DryRun DescribeInstances was refused",
		"fix:grant ec2:DescribeInstances on * to "+fakeRoleARN)
	want(t, cs, "permission ec2:DescribeSpotPriceHistory", providers.CheckOK, "DryRun DescribeSpotPriceHistory")
	want(t, cs, "permission autoscaling:DescribeScalingActivities", providers.CheckFail, "refused")
	want(t, cs, "permission autoscaling:SetDesiredCapacity", providers.CheckSkipped, "Auto Scaling has no dry run",
		"fix:autoscaling:SetDesiredCapacity is granted on "+groupARN)
	want(t, cs, "permission sqs:ReceiveMessage", providers.CheckSkipped, "SQS has no dry run")
	for _, op := range []string{"DescribeInstances", "DescribeSpotPriceHistory"} {
		for _, in := range f.inputs[op] {
			if in.Get("DryRun") != "true" {
				t.Errorf("%s called without DryRun: %v", op, in)
			}
		}
	}
	if got := len(slices.DeleteFunc(slices.Clone(cs), func(c providers.Check) bool { return c.Name != "permissions" })); got != 1 {
		t.Errorf("%d lines say the simulator may not be asked; want one", got)
	}
}

// TestCheckMissingGroup: a group the region does not have fails with the flags to check; the
// permissions granted on it are not asked, the others are.
func TestCheckMissingGroup(t *testing.T) {
	f := newFake(t)
	cs := runCheck(t, f, aws.Config{ASG: "gpu-wrokers", SQSQueueURL: f.queueURL}, everything)
	want(t, cs, "group", providers.CheckFail, `no Auto Scaling group "gpu-wrokers" in us-east-1`, "fix:check --asg", "fix:--region")
	want(t, cs, "permission autoscaling:SetDesiredCapacity", providers.CheckSkipped, "the group was not read")
	want(t, cs, "permission autoscaling:DescribeAutoScalingGroups", providers.CheckOK, "allowed on *")
	want(t, cs, "notice rules", providers.CheckOK)
}

// TestCheckGroupUnreadable: a group the credentials may not read, and one whose maximum is 0.
func TestCheckGroupUnreadable(t *testing.T) {
	f := newFake(t, inst(1))
	f.grant("autoscaling:DescribeAutoScalingGroups", fakeGrant{Decision: "implicitDeny"})
	cs := runCheck(t, f, aws.Config{}, providers.CheckNeeds{})
	want(t, cs, "group", providers.CheckFail, "may not call autoscaling:DescribeAutoScalingGroups",
		"fix:grant autoscaling:DescribeAutoScalingGroups on * to "+fakeRoleARN)
	want(t, cs, "permission autoscaling:DescribeAutoScalingGroups", providers.CheckFail, "not allowed on *")

	f = newFake(t)
	f.setSize(0, 0, 0)
	cs = runCheck(t, f, aws.Config{}, providers.CheckNeeds{})
	want(t, cs, "group", providers.CheckFail, "maximum size is 0", "fix:--max-size")
}

// TestCheckNoCredentials: without credentials, one failed line says how to give them, and the
// checks that need them are skipped; nothing reaches AWS.
func TestCheckNoCredentials(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	os.Unsetenv("AWS_ACCESS_KEY_ID")
	os.Unsetenv("AWS_SECRET_ACCESS_KEY")
	f := newFake(t, inst(1))
	cs := runCheck(t, f, withQueue(f), everything)
	want(t, cs, "credentials", providers.CheckFail, "no usable AWS credentials",
		"fix:AWS_PROFILE", "fix:AWS_ACCESS_KEY_ID", "fix:instance profile")
	want(t, cs, "region", providers.CheckOK, "us-east-1")
	for _, name := range []string{"group", "permissions", "notice queue"} {
		want(t, cs, name, providers.CheckSkipped, "no usable AWS credentials")
	}
	if n := len(cs); n != 5 {
		t.Errorf("%d lines, want 5: no cascade", n)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) != 0 {
		t.Errorf("calls %v without credentials", f.calls)
	}
}

// TestCheckRejectedCredentials: credentials AWS does not know fail once, and the rest is skipped.
func TestCheckRejectedCredentials(t *testing.T) {
	f := newFake(t, inst(1))
	f.set(func() { f.rejectKey = "AKIDELASTICDTEST" })
	cs := runCheck(t, f, aws.Config{}, providers.CheckNeeds{})
	want(t, cs, "credentials", providers.CheckFail, "from the environment", "AWS rejected them", "InvalidClientTokenId",
		"fix:aws sts get-caller-identity")
	want(t, cs, "group", providers.CheckSkipped, "not accepted")
	if f.count("DescribeAutoScalingGroups") != 0 {
		t.Error("the group was read with rejected credentials")
	}
}

// TestCheckRegion: the region from the environment says so; none at all fails with the flag.
func TestCheckRegion(t *testing.T) {
	f := newFake(t, inst(1))
	t.Setenv("AWS_REGION", "us-east-1")
	p, err := aws.New(aws.Config{ASG: fakeGroup, Endpoint: f.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	cs := providers.Checks(p.Check(pollCtx(t), providers.CheckNeeds{}))
	want(t, cs, "region", providers.CheckOK, "us-east-1, from AWS_REGION")
	want(t, cs, "group", providers.CheckOK)

	os.Unsetenv("AWS_REGION")
	p, err = aws.New(aws.Config{ASG: fakeGroup, Endpoint: f.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	cs = providers.Checks(p.Check(pollCtx(t), providers.CheckNeeds{}))
	want(t, cs, "credentials", providers.CheckOK, "from the environment", "no region")
	want(t, cs, "region", providers.CheckFail, "none", "fix:--region")
	want(t, cs, "group", providers.CheckSkipped, "no region")
}

// TestCheckPrincipal: an assumed role's policies are simulated as the role: its ARN with its
// path from iam:GetRole, else made from its name; a user's as the user; the root user's not at
// all; a role IAM does not know leaves the simulator and tries what can be tried.
func TestCheckPrincipal(t *testing.T) {
	simulatedAs := func(f *fakeAWS) []string {
		var out []string
		for _, in := range f.inputs["SimulatePrincipalPolicy"] {
			if !slices.Contains(out, in.Get("PolicySourceArn")) {
				out = append(out, in.Get("PolicySourceArn"))
			}
		}
		return out
	}
	t.Run("assumed role", func(t *testing.T) {
		f := newFake(t, inst(1))
		cs := runCheck(t, f, aws.Config{}, providers.CheckNeeds{})
		if got := simulatedAs(f); !slices.Equal(got, []string{fakeRoleARN}) {
			t.Errorf("simulated as %q, want the role's ARN with its path %q", got, fakeRoleARN)
		}
		if got := f.inputs["GetRole"]; len(got) != 1 || got[0].Get("RoleName") != fakeRole {
			t.Errorf("GetRole inputs %v, want the role %s", got, fakeRole)
		}
		if cs.Failed() {
			t.Error("a check failed")
		}
	})
	t.Run("assumed role without GetRole", func(t *testing.T) {
		f := newFake(t, inst(1))
		f.grant("iam:GetRole", fakeGrant{Decision: "implicitDeny"})
		cs := runCheck(t, f, aws.Config{}, providers.CheckNeeds{})
		made := "arn:aws:iam::" + fakeAccount + ":role/" + fakeRole
		if got := simulatedAs(f); !slices.Equal(got, []string{made}) {
			t.Errorf("simulated as %q, want %q", got, made)
		}
		want(t, cs, "permission ec2:DescribeInstances", providers.CheckOK, "allowed")
	})
	t.Run("user", func(t *testing.T) {
		f := newFake(t, inst(1))
		user := "arn:aws:iam::" + fakeAccount + ":user/ops/alice"
		f.set(func() { f.caller, f.users = user, []string{"alice"} })
		cs := runCheck(t, f, aws.Config{}, providers.CheckNeeds{})
		if got := simulatedAs(f); !slices.Equal(got, []string{user}) {
			t.Errorf("simulated as %q, want %q", got, user)
		}
		if n := f.count("GetRole"); n != 0 {
			t.Errorf("GetRole called %d times for a user", n)
		}
		want(t, cs, "credentials", providers.CheckOK, user)
	})
	t.Run("root", func(t *testing.T) {
		f := newFake(t, inst(1))
		f.set(func() { f.caller = "arn:aws:iam::" + fakeAccount + ":root" })
		cs := runCheck(t, f, aws.Config{}, providers.CheckNeeds{})
		want(t, cs, "permissions", providers.CheckSkipped, "root user")
		if n := f.count("SimulatePrincipalPolicy"); n != 0 {
			t.Errorf("simulated the root user's policies %d times", n)
		}
	})
	t.Run("unknown role", func(t *testing.T) {
		f := newFake(t, inst(1))
		f.grant("iam:GetRole", fakeGrant{Decision: "implicitDeny"})
		f.set(func() { f.roles = map[string]string{} })
		cs := runCheck(t, f, aws.Config{}, providers.CheckNeeds{})
		want(t, cs, "permissions", providers.CheckSkipped, "IAM knows no principal arn:aws:iam::"+fakeAccount+":role/"+fakeRole, "fix:iam:GetRole")
		want(t, cs, "permission ec2:DescribeInstances", providers.CheckOK, "DryRun")
	})
}

// TestCheckNoticeRules: the rules that target the queue must include an enabled one that sends
// spot interruption warnings.
func TestCheckNoticeRules(t *testing.T) {
	const lifecycle = `{"source":["aws.autoscaling"],"detail-type":["EC2 Instance-terminate Lifecycle Action"],"detail":{"AutoScalingGroupName":["gpu-workers"]}}`
	const stateChange = `{"source":["aws.ec2"],"detail-type":["EC2 Instance State-change Notification"]}`
	rule := func(name, state, pattern string) fakeRule {
		return fakeRule{Name: name, State: state, Pattern: pattern, Targets: []string{fakeQueueARN}}
	}
	for _, tc := range []struct {
		name   string
		rules  []fakeRule
		status providers.CheckStatus
		has    []string
	}{
		{"no rule", nil, providers.CheckFail, []string{"the queue is fed by no EventBridge rule: no spot notice will arrive",
			"fix:aws events put-rule", "fix:aws events put-targets", "fix:Arn=" + fakeQueueARN, "fix:terraform/aws", "fix:The notice queue and its rules"}},
		{"a rule for another queue", []fakeRule{{Name: "other", State: "ENABLED", Pattern: fakeSpotPattern, Targets: []string{"arn:aws:sqs:us-east-1:" + fakeAccount + ":other"}}},
			providers.CheckFail, []string{"fed by no EventBridge rule"}},
		{"disabled", []fakeRule{rule(fakeSpotRule, "DISABLED", fakeSpotPattern)}, providers.CheckFail,
			[]string{fakeSpotRule + " would send spot interruption warnings but is DISABLED", "fix:aws events enable-rule --name " + fakeSpotRule}},
		{"no spot rule", []fakeRule{rule("elasticd-gpu-workers-state", "ENABLED", stateChange)}, providers.CheckFail,
			[]string{"none that is enabled matches EC2 Spot Instance Interruption Warning", "fix:put-rule"}},
		{"spot by prefix, lifecycle, pages", []fakeRule{
			rule("elasticd-gpu-workers-lifecycle", "ENABLED", lifecycle),
			rule("elasticd-gpu-workers-all", "ENABLED", `{"source":[{"prefix":"aws.ec"}]}`),
			rule("elasticd-gpu-workers-old", "DISABLED", fakeSpotPattern),
		}, providers.CheckOK, []string{"spot interruption warnings from rule elasticd-gpu-workers-all",
			"scale-in lifecycle actions from elasticd-gpu-workers-lifecycle", "disabled: elasticd-gpu-workers-old"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, inst(1))
			f.set(func() { f.rules, f.rulePage = tc.rules, 1 })
			cs := runCheck(t, f, withQueue(f), providers.CheckNeeds{})
			want(t, cs, "notice rules", tc.status, tc.has...)
			if got := f.count("ListRuleNamesByTarget"); got != max(1, len(tc.rules)) && tc.name != "a rule for another queue" {
				t.Errorf("%d ListRuleNamesByTarget calls for %d rules a page at a time", got, len(tc.rules))
			}
		})
	}
}

// TestCheckRulesUnreadable: credentials that may not list the rules skip that check, saying how
// to make it by hand.
func TestCheckRulesUnreadable(t *testing.T) {
	f := newFake(t, inst(1))
	f.grant("events:ListRuleNamesByTarget", fakeGrant{Decision: "implicitDeny"})
	cs := runCheck(t, f, withQueue(f), providers.CheckNeeds{})
	want(t, cs, "notice rules", providers.CheckSkipped, "may not call events:ListRuleNamesByTarget",
		"fix:aws events list-rule-names-by-target --target-arn "+fakeQueueARN)
	if cs.Failed() {
		t.Error("a check only this check needs failed the job")
	}
}

// TestCheckNoticeQueue: the queue's existence, encryption and policy.
func TestCheckNoticeQueue(t *testing.T) {
	eventsStatement := func(extra string) string {
		return `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"events.amazonaws.com"},` +
			`"Action":["sqs:SendMessage"],"Resource":"` + fakeQueueARN + `"` + extra + `}]}`
	}
	for _, tc := range []struct {
		name        string
		setup       func(f *fakeAWS)
		queue       string // --sqs-queue-url; empty: the fake's
		line        string
		status      providers.CheckStatus
		has         []string
		rulesStatus providers.CheckStatus
	}{
		{"no policy", func(f *fakeAWS) { f.queuePolicy = "" }, "", "notice queue policy", providers.CheckFail,
			[]string{"no access policy", "fix:events.amazonaws.com sqs:SendMessage on " + fakeQueueARN}, providers.CheckOK},
		{"policy for SNS only", func(f *fakeAWS) {
			f.queuePolicy = strings.Replace(eventsStatement(""), "events.amazonaws.com", "sns.amazonaws.com", 1)
		}, "", "notice queue policy", providers.CheckFail, []string{"does not let events.amazonaws.com send"}, providers.CheckOK},
		{"policy for another rule", func(f *fakeAWS) {
			f.queuePolicy = eventsStatement(`,"Condition":{"ArnEquals":{"aws:SourceArn":"arn:aws:events:us-east-1:` + fakeAccount + `:rule/other"}}`)
		}, "", "notice queue policy", providers.CheckFail, []string{"which rule " + fakeSpotRule + " (arn:aws:events:us-east-1:" + fakeAccount + ":rule/" + fakeSpotRule + ") is not",
			"fix:aws:SourceArn"}, providers.CheckOK},
		{"explicit deny", func(f *fakeAWS) {
			f.queuePolicy = `{"Version":"2012-10-17","Statement":[` +
				`{"Effect":"Allow","Principal":"*","Action":"sqs:*","Resource":"*"},` +
				`{"Sid":"NoEvents","Effect":"Deny","Principal":{"Service":["events.amazonaws.com"]},"Action":"sqs:SendMessage","Resource":"` + fakeQueueARN + `"}]}`
		}, "", "notice queue policy", providers.CheckFail, []string{"statement NoEvents denies"}, providers.CheckOK},
		{"policy for anyone", func(f *fakeAWS) {
			f.queuePolicy = `{"Statement":{"Sid":"All","Effect":"Allow","Principal":{"AWS":"*"},"Action":"SQS:Send*","Resource":"*"}}`
		}, "", "notice queue policy", providers.CheckOK, []string{"statement All"}, providers.CheckOK},
		{"policy with another condition", func(f *fakeAWS) {
			f.queuePolicy = eventsStatement(`,"Condition":{"StringEquals":{"aws:SourceAccount":"` + fakeAccount + `"}}`)
		}, "", "notice queue policy", providers.CheckOK, []string{"conditions this check does not evaluate"}, providers.CheckOK},
		{"AWS managed key", func(f *fakeAWS) { f.queueKMS = "alias/aws/sqs" }, "", "notice queue", providers.CheckFail,
			[]string{"alias/aws/sqs", "EventBridge may not use", "fix:SqsManagedSseEnabled"}, providers.CheckOK},
		{"customer managed key", func(f *fakeAWS) { f.queueKMS = "alias/elasticd" }, "", "notice queue", providers.CheckOK,
			[]string{"alias/elasticd", "kms:GenerateDataKey"}, providers.CheckOK},
		{"attributes denied", func(f *fakeAWS) { f.grants["sqs:GetQueueAttributes"] = fakeGrant{Decision: "implicitDeny"} }, "",
			"notice queue", providers.CheckSkipped, []string{"may not call sqs:GetQueueAttributes", "fix:grant sqs:GetQueueAttributes on " + fakeQueueARN},
			providers.CheckOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, inst(1))
			f.set(func() { tc.setup(f) })
			cs := runCheck(t, f, withQueue(f), providers.CheckNeeds{})
			want(t, cs, tc.line, tc.status, tc.has...)
			want(t, cs, "notice rules", tc.rulesStatus)
			if tc.name == "attributes denied" {
				want(t, cs, "notice queue policy", providers.CheckSkipped, "could not be read")
			}
		})
	}
}

// TestCheckMissingQueue: a queue URL with no queue behind it fails; its rules and permissions
// are not asked.
func TestCheckMissingQueue(t *testing.T) {
	f := newFake(t, inst(1))
	cs := runCheck(t, f, aws.Config{SQSQueueURL: f.srv.URL + "/" + fakeAccount + "/elasticd-notices-typo"}, providers.CheckNeeds{})
	want(t, cs, "notice queue", providers.CheckFail, "no queue at", "fix:--sqs-queue-url")
	want(t, cs, "notice rules", providers.CheckSkipped, "not found")
	want(t, cs, "permission sqs:ReceiveMessage", providers.CheckSkipped, "the queue's ARN is not known")
	if n := f.count("ListRuleNamesByTarget"); n != 0 {
		t.Errorf("listed the rules of a queue that does not exist %d times", n)
	}
}

// TestPermissionsFollowFlags: the permissions a job needs grow with its flags, and the docs'
// table names each.
func TestPermissionsFollowFlags(t *testing.T) {
	actions := func(needs providers.CheckNeeds, queue bool) []string {
		var out []string
		for _, pm := range aws.Permissions(needs, queue) {
			out = append(out, pm.Action)
		}
		return out
	}
	if got := actions(providers.CheckNeeds{}, false); !slices.Equal(got, []string{"autoscaling:DescribeAutoScalingGroups", "ec2:DescribeInstances"}) {
		t.Errorf("discovery needs %q", got)
	}
	all := actions(everything, true)
	for _, a := range []string{"ec2:DescribeSpotPriceHistory", "sqs:ReceiveMessage", "sqs:DeleteMessage", "autoscaling:CompleteLifecycleAction",
		"autoscaling:SetDesiredCapacity", "autoscaling:UpdateAutoScalingGroup", "autoscaling:TerminateInstanceInAutoScalingGroup",
		"autoscaling:DescribeScalingActivities", "autoscaling:CreateOrUpdateTags", "autoscaling:DeleteTags"} {
		if !slices.Contains(all, a) {
			t.Errorf("a job with every flag does not need %s", a)
		}
	}
	doc, err := os.ReadFile("../../docs/providers/aws.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, _ := strings.Cut(string(doc), "| action | for | needed |")
	table, _, _ = strings.Cut(table, "\n\n")
	for _, a := range all {
		if !strings.Contains(table, "`"+a+"`") {
			t.Errorf("docs/providers/aws.md's permission table does not name %s", a)
		}
	}
}

// TestCheckProfile: credentials and a region from a profile of the shared files say so; a
// profile that does not exist fails, naming AWS_PROFILE.
func TestCheckProfile(t *testing.T) {
	dir := t.TempDir()
	cfgFile, credFile := dir+"/config", dir+"/credentials"
	if err := os.WriteFile(cfgFile, []byte("[profile ops]\nregion = us-east-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(credFile, []byte("[ops]\naws_access_key_id = AKIDELASTICDOPS\naws_secret_access_key = ops-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_CONFIG_FILE", cfgFile)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", credFile)
	t.Setenv("AWS_PROFILE", "ops")
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	os.Unsetenv("AWS_ACCESS_KEY_ID")
	os.Unsetenv("AWS_SECRET_ACCESS_KEY")

	f := newFake(t, inst(1))
	p, err := aws.New(aws.Config{ASG: fakeGroup, Endpoint: f.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	cs := providers.Checks(p.Check(pollCtx(t), providers.CheckNeeds{}))
	want(t, cs, "credentials", providers.CheckOK, `from the shared credentials file `+credFile+`, profile "ops"`)
	want(t, cs, "region", providers.CheckOK, `us-east-1, from profile "ops" of `+cfgFile)
	if got := accessKeys(f); !slices.Equal(got, []string{"AKIDELASTICDOPS"}) {
		t.Errorf("signed with %q, want the profile's key", got)
	}

	t.Setenv("AWS_PROFILE", "nope")
	p, err = aws.New(aws.Config{ASG: fakeGroup, Endpoint: f.srv.URL, Region: "us-east-1"})
	if err != nil {
		t.Fatal(err)
	}
	cs = providers.Checks(p.Check(pollCtx(t), providers.CheckNeeds{}))
	want(t, cs, "credentials", providers.CheckFail, "nope", "fix:AWS_PROFILE")
	want(t, cs, "group", providers.CheckSkipped, "did not load")
}

// accessKeys are the access key IDs the fake's calls were signed with.
func accessKeys(f *fakeAWS) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.keys)
}

// TestCheckSTSUnreachable: STS answering an error that is not about the credentials fails the
// credentials line with the network path to check, once.
func TestCheckSTSUnreachable(t *testing.T) {
	f := newFake(t, inst(1))
	f.failAlways("GetCallerIdentity", fault{status: 400, code: "InvalidAction", msg: "The action GetCallerIdentity is not valid for this web service."})
	cs := runCheck(t, f, aws.Config{}, providers.CheckNeeds{})
	want(t, cs, "credentials", providers.CheckFail, "STS could not say whose they are", "InvalidAction", "fix:--endpoint")
	want(t, cs, "group", providers.CheckSkipped, "STS could not be asked")
}
