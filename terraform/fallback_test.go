package terraform_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// The AWS module's on-demand fallback group (on_demand_fallback): what the job falls back on
// while spot is out (`elasticd run --manage-capacity --fallback-asg NAME`).

// fallbackSwitch is the AWS module's variable that creates the fallback group: the group's
// count, the driver's --fallback-asg and the grants on the group depend on it.
const fallbackSwitch = "var.on_demand_fallback"

// awsFallbackOps are the calls the driver makes on its fallback group that IAM scopes to a
// group: the fallback's provider is providers/aws itself (cmd/elasticd buildFallback) without
// the notice queue, so no CompleteLifecycleAction, and its scaling activities are not read
// (only the spot group's). It steers the group, and claims it as it claims the spot group
// (cmd/elasticd claimGroups: the elasticd-driver tag). Its Describe* calls are unscoped,
// granted on "*" already.
var awsFallbackOps = []string{
	"autoscaling.SetDesiredCapacity", "autoscaling.UpdateAutoScalingGroup", "autoscaling.TerminateInstanceInAutoScalingGroup",
	"autoscaling.CreateOrUpdateTags", "autoscaling.DeleteTags",
}

const (
	spotGroup     = "aws_autoscaling_group.gpu"
	fallbackGroup = "aws_autoscaling_group.fallback"
)

// checkFallbackGroup reports where the AWS module's fallback group is not what the job can
// fall back on: made only with on_demand_fallback, on-demand, at zero, with the spot group's
// launch template, instance types and subnets, and without a lifecycle hook nobody completes.
// (That it leaves its size to the driver is checkGroupSizes', for every group.)
func checkFallbackGroup(m *module) []string {
	spot, fb := m.resources[spotGroup], m.resources[fallbackGroup]
	if spot == nil || fb == nil {
		return []string{fmt.Sprintf("%s: want the spot group %s and the fallback group %s", m.dir, spotGroup, fallbackGroup)}
	}
	var bad []string
	where := fb.DefRange().String()
	if !switchedCount(fb.Body.Attributes["count"]) {
		bad = append(bad, fmt.Sprintf("%s: the fallback group is not made only with on_demand_fallback (want count = %s ? 1 : 0)", where, fallbackSwitch))
	}
	attr := func(b *hclsyntax.Body, name string) string {
		if a := b.Attributes[name]; a != nil {
			return m.src(a.Expr)
		}
		return ""
	}
	if n := attr(fb.Body, "name"); n == "" || n == attr(spot.Body, "name") {
		bad = append(bad, fmt.Sprintf("%s: the fallback group's name %q must be its own", where, n))
	}
	for _, a := range []string{"min_size", "desired_capacity"} {
		if v := attr(fb.Body, a); v != "0" {
			bad = append(bad, fmt.Sprintf("%s: the fallback group does not start at zero: %s = %q, want 0 (the driver grows it while spot is out)", where, a, v))
		}
	}
	if got, want := attr(fb.Body, "vpc_zone_identifier"), attr(spot.Body, "vpc_zone_identifier"); got != want {
		bad = append(bad, fmt.Sprintf("%s: the fallback group's subnets are %q, the spot group's %q: want the same", where, got, want))
	}
	if v := attr(fb.Body, "capacity_rebalance"); v != "" && v != "false" {
		bad = append(bad, fmt.Sprintf("%s: capacity_rebalance is for spot instances", where))
	}
	if block(fb.Body, "initial_lifecycle_hook") != nil {
		bad = append(bad, fmt.Sprintf("%s: the fallback group has a terminate lifecycle hook, which nothing completes (the driver reads no notice queue for it): each instance would wait out its heartbeat", where))
	}

	// On-demand: the mixed instances policy's distribution, and a launch template without
	// market options (which would make both groups spot).
	spotLT := block(block(block(spot.Body, "mixed_instances_policy"), "launch_template"), "launch_template_specification")
	mip := block(fb.Body, "mixed_instances_policy")
	dist := block(mip, "instances_distribution")
	lt := block(block(mip, "launch_template"), "launch_template_specification")
	if spotLT == nil || mip == nil || dist == nil || lt == nil {
		return append(bad, fmt.Sprintf("%s: want a mixed_instances_policy with an instances_distribution and a launch_template_specification in both groups: the launch template has no instance type, the groups' overrides give them", where))
	}
	if v := attr(dist, "on_demand_percentage_above_base_capacity"); v != "100" {
		bad = append(bad, fmt.Sprintf("%s: the fallback group is not on-demand: on_demand_percentage_above_base_capacity = %q, want 100", where, v))
	}
	for _, name := range sortedKeys(dist.Attributes) {
		if strings.HasPrefix(name, "spot_") {
			bad = append(bad, fmt.Sprintf("%s: the fallback group sets %s: it launches no spot instances", dist.Attributes[name].SrcRange, name))
		}
	}
	for _, a := range []string{"launch_template_id", "version"} {
		if got, want := attr(lt, a), attr(spotLT, a); got == "" || got != want {
			bad = append(bad, fmt.Sprintf("%s: the fallback group's %s is %q, the spot group's %q: want the same launch template, so that its hosts run the agent and join the job", where, a, got, want))
		}
	}
	overrides := func(g *hclsyntax.Block) string {
		for _, d := range block(block(g.Body, "mixed_instances_policy"), "launch_template").Blocks {
			if d.Type == "dynamic" && len(d.Labels) == 1 && d.Labels[0] == "override" {
				return attr(d.Body, "for_each")
			}
		}
		return ""
	}
	if got, want := overrides(fb), overrides(spot); got != want {
		bad = append(bad, fmt.Sprintf("%s: the fallback group's instance types are %q, the spot group's %q: want the same", where, got, want))
	}
	if t := m.resources["aws_launch_template.gpu"]; t == nil || block(t.Body, "instance_market_options") != nil {
		bad = append(bad, fmt.Sprintf("%s: aws_launch_template.gpu is missing or has instance_market_options: the fallback group would not be on-demand", m.dir))
	}
	return bad
}

// checkFallbackFlags reports where the driver's command line does not name the fallback group:
// the job call's fallback_args must be, with on_demand_fallback only, --fallback-asg and the
// group's own name, and --fallback-after var.fallback_after.
func checkFallbackFlags(m *module) []string {
	job := m.modules["job"]
	fb := m.resources[fallbackGroup]
	if job == nil || fb == nil || fb.Body.Attributes["name"] == nil {
		return []string{fmt.Sprintf(`%s: want module "job" and %s with a name`, m.dir, fallbackGroup)}
	}
	a := job.Body.Attributes["fallback_args"]
	if a == nil {
		return []string{fmt.Sprintf(`%s: module "job" gets no fallback_args: the driver would not know the fallback group`, job.DefRange())}
	}
	c, ok := a.Expr.(*hclsyntax.ConditionalExpr)
	if !ok || traversalOf(c.Condition) != fallbackSwitch {
		return []string{fmt.Sprintf("%s: want fallback_args = %s ? [...] : []", a.SrcRange, fallbackSwitch)}
	}
	var bad []string
	if no, ok := c.FalseResult.(*hclsyntax.TupleConsExpr); !ok || len(no.Exprs) != 0 {
		bad = append(bad, fmt.Sprintf("%s: fallback_args without on_demand_fallback must be []", a.SrcRange))
	}
	yes, ok := c.TrueResult.(*hclsyntax.TupleConsExpr)
	if !ok {
		return append(bad, fmt.Sprintf("%s: fallback_args with on_demand_fallback must be a list", a.SrcRange))
	}
	want := map[string]string{"--fallback-asg": m.src(fb.Body.Attributes["name"].Expr), "--fallback-after": "var.fallback_after"}
	got := map[string]string{}
	for i := 0; i+1 < len(yes.Exprs); i += 2 {
		if v, diags := yes.Exprs[i].Value(nil); !diags.HasErrors() && v.Type() == cty.String {
			got[v.AsString()] = m.src(yes.Exprs[i+1])
		}
	}
	for _, f := range sortedKeys(want) {
		if got[f] != want[f] {
			bad = append(bad, fmt.Sprintf("%s: fallback_args gives %s %q, want %s (the fallback group's name is %s)", a.SrcRange, f, got[f], want[f], want["--fallback-asg"]))
		}
	}
	if len(yes.Exprs) != 2*len(want) {
		bad = append(bad, fmt.Sprintf("%s: fallback_args has %d elements, want %d", a.SrcRange, len(yes.Exprs), 2*len(want)))
	}
	return bad
}

// statement is one statement of the driver's policy document: its actions, its resources as
// written, and what it is made with.
type statement struct {
	where              string
	actions, resources []string
	steering, fallback bool
}

// awsStatements reads the statements of data "aws_iam_policy_document" "driver", static and
// dynamic, and what each dynamic one's for_each depends on.
func awsStatements(m *module) ([]statement, error) {
	b := m.data["aws_iam_policy_document.driver"]
	if b == nil {
		return nil, fmt.Errorf(`%s: no data "aws_iam_policy_document" "driver"`, m.dir)
	}
	var out []statement
	for _, s := range b.Body.Blocks {
		st := statement{where: s.DefRange().String()}
		body := s.Body
		switch {
		case s.Type == "statement":
		case s.Type == "dynamic" && len(s.Labels) == 1 && s.Labels[0] == "statement":
			if a := s.Body.Attributes["for_each"]; a != nil {
				for _, v := range a.Expr.Variables() {
					ref := traversalString(v)
					st.steering = st.steering || strings.HasPrefix(ref, manageCapacity)
					st.fallback = st.fallback || ref == fallbackSwitch
				}
			}
			if body = block(s.Body, "content"); body == nil {
				return nil, fmt.Errorf("%s: a dynamic statement without content", st.where)
			}
		default:
			continue
		}
		acts, err := attrStrings(body, "actions")
		if err != nil {
			return nil, err
		}
		st.actions = acts
		a := body.Attributes["resources"]
		if a == nil {
			return nil, fmt.Errorf("%s: a statement without resources", st.where)
		}
		list, ok := a.Expr.(*hclsyntax.TupleConsExpr)
		if !ok {
			return nil, fmt.Errorf("%s: resources must be a list", a.SrcRange)
		}
		for _, e := range list.Exprs {
			st.resources = append(st.resources, m.src(e))
		}
		out = append(out, st)
	}
	return out, nil
}

// groupARN returns the reference (local.x) of the local that holds the ARN of the group whose
// name is the expression nameSrc: "...:autoScalingGroupName/${<nameSrc>}".
func groupARN(m *module, nameSrc string) string {
	for _, name := range sortedKeys(m.locals) {
		t, ok := m.locals[name].Expr.(*hclsyntax.TemplateExpr)
		if !ok || len(t.Parts) < 2 {
			continue
		}
		last, prev := t.Parts[len(t.Parts)-1], t.Parts[len(t.Parts)-2]
		v, diags := prev.Value(nil)
		if !diags.HasErrors() && v.Type() == cty.String && strings.HasSuffix(v.AsString(), ":autoScalingGroupName/") && m.src(last) == nameSrc {
			return "local." + name
		}
	}
	return ""
}

// checkFallbackGrants reports where the driver's grants on the fallback group differ from what
// it calls there: the permissions of awsFallbackOps, on the fallback group's ARN alone, made
// only with on_demand_fallback and --manage-capacity, and granted on the spot group too; with
// the fallback off, nothing on it. ops are the SDK operations providers/aws calls.
func checkFallbackGrants(m *module, ops map[string][]string) []string {
	spot, fb := m.resources[spotGroup], m.resources[fallbackGroup]
	if spot == nil || fb == nil || spot.Body.Attributes["name"] == nil || fb.Body.Attributes["name"] == nil {
		return []string{fmt.Sprintf("%s: want the groups %s and %s, with names", m.dir, spotGroup, fallbackGroup)}
	}
	spotARN, fbARN := groupARN(m, m.src(spot.Body.Attributes["name"].Expr)), groupARN(m, m.src(fb.Body.Attributes["name"].Expr))
	if spotARN == "" || fbARN == "" {
		return []string{fmt.Sprintf("%s: want a local holding each group's ARN (...:autoScalingGroupName/${name}); found %q for the spot group, %q for the fallback", m.dir, spotARN, fbARN)}
	}
	statements, err := awsStatements(m)
	if err != nil {
		return []string{err.Error()}
	}
	var bad []string
	var want []string
	for _, op := range awsFallbackOps {
		if ops[op] == nil || !slices.Contains(awsSteering, op) {
			bad = append(bad, fmt.Sprintf("%s is listed as a call on the fallback group, but providers/aws does not make it to steer its group", op))
		}
		want = append(want, awsPerms[op]...)
	}
	onFallback, onSpot := map[string]bool{}, map[string]bool{}
	for _, st := range statements {
		names := func(arn string) bool {
			return slices.ContainsFunc(st.resources, func(r string) bool { return r == arn })
		}
		if names(fbARN) && (!st.fallback || !st.steering) {
			bad = append(bad, fmt.Sprintf("%s: grants %v on the fallback group without on_demand_fallback and --manage-capacity: its for_each must depend on both", st.where, st.actions))
		}
		if st.fallback {
			if others := slices.DeleteFunc(slices.Clone(st.resources), func(r string) bool { return r == fbARN }); len(others) > 0 {
				bad = append(bad, fmt.Sprintf("%s: a grant made with on_demand_fallback on %v, which is not the fallback group %s", st.where, others, fbARN))
			}
		}
		for _, a := range st.actions {
			if names(fbARN) && st.fallback && st.steering {
				onFallback[a] = true
			}
			if names(spotARN) && st.steering && !st.fallback {
				onSpot[a] = true
			}
		}
	}
	for _, p := range slices.Compact(slices.Sorted(slices.Values(want))) {
		if !onFallback[p] {
			bad = append(bad, fmt.Sprintf("does not grant %s on the fallback group (%s) with on_demand_fallback: the driver calls it there", p, fbARN))
		}
		if !onSpot[p] {
			bad = append(bad, fmt.Sprintf("does not grant %s on the spot group (%s) with --manage-capacity: the driver calls it there", p, spotARN))
		}
	}
	for _, p := range sortedKeys(onFallback) {
		if !slices.Contains(want, p) {
			bad = append(bad, fmt.Sprintf("grants %s on the fallback group, which the driver does not call there", p))
		}
	}
	return bad
}

// switchedCount reports whether a is count = var.on_demand_fallback ? 1 : 0.
func switchedCount(a *hclsyntax.Attribute) bool {
	if a == nil {
		return false
	}
	c, ok := a.Expr.(*hclsyntax.ConditionalExpr)
	if !ok || traversalOf(c.Condition) != fallbackSwitch {
		return false
	}
	one, d1 := c.TrueResult.Value(nil)
	zero, d2 := c.FalseResult.Value(nil)
	return !d1.HasErrors() && !d2.HasErrors() && one.Type() == cty.Number && zero.Type() == cty.Number &&
		one.Equals(cty.NumberIntVal(1)).True() && zero.Equals(cty.NumberIntVal(0)).True()
}

// block returns the first block of type typ in body (nil-safe).
func block(body *hclsyntax.Body, typ string) *hclsyntax.Body {
	if body == nil {
		return nil
	}
	for _, b := range body.Blocks {
		if b.Type == typ {
			return b.Body
		}
	}
	return nil
}

// checkFallback runs every check of the fallback group on m.
func checkFallback(m *module, ops map[string][]string) []string {
	return slices.Concat(checkFallbackGroup(m), checkFallbackFlags(m), checkFallbackGrants(m, ops))
}

// TestFallbackGroup: the AWS module's on-demand fallback group exists only with
// on_demand_fallback, launches on-demand from the spot group's launch template, instance types
// and subnets, starts at zero (and leaves its size to the driver: TestGroupsLeaveTheirSizeToTheDriver);
// the driver's command line names it with --fallback-asg and --fallback-after; and the driver
// may steer it, with on_demand_fallback and --manage-capacity only, with exactly the calls it
// makes there, on that group alone, as on the spot group.
func TestFallbackGroup(t *testing.T) {
	ops, err := sdkOperations(filepath.Join("..", "providers", "aws"), clouds[0].sdks)
	if err != nil {
		t.Fatal(err)
	}
	m, err := loadModule("aws")
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range checkFallback(m, ops) {
		t.Error(msg)
	}
	for _, msg := range checkGroupSizes(m) {
		t.Error(msg)
	}
	// The example shows the fallback on, with the flag it needs.
	ex, err := os.ReadFile(filepath.Join("aws", "examples", "spot-with-fallback", "main.tf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"on_demand_fallback = true", `"--manage-capacity"`} {
		if !strings.Contains(strings.Join(strings.Fields(string(ex)), " "), want) {
			t.Errorf("aws/examples/spot-with-fallback/main.tf lacks %s", want)
		}
	}
}

// TestFallbackChecksCanFail runs the checks on copies of the AWS module, each changed in one
// way, and expects each change reported.
func TestFallbackChecksCanFail(t *testing.T) {
	ops, err := sdkOperations(filepath.Join("..", "providers", "aws"), clouds[0].sdks)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	names, err := filepath.Glob(filepath.Join("aws", "*.tf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		src, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(n)] = string(src)
	}
	const fbStart = `resource "aws_autoscaling_group" "fallback" {`
	const steerFallback = `for_each = module.job.manage_capacity && var.on_demand_fallback ? ["SteerFallback"] : []`
	cases := []struct {
		name     string
		after    string // the change applies after the first occurrence of this ("": anywhere)
		old, new string
		want     string
	}{
		{"made always", fbStart, "count = var.on_demand_fallback ? 1 : 0\n", "\n", "is not made only with on_demand_fallback"},
		{"spot", fbStart, "on_demand_percentage_above_base_capacity = 100", "on_demand_percentage_above_base_capacity = 0", "is not on-demand"},
		{"spot strategy", fbStart, `on_demand_allocation_strategy            = "prioritized"`, `spot_allocation_strategy = "lowest-price"`, "sets spot_allocation_strategy"},
		{"spot template", `resource "aws_launch_template" "gpu" {`, "  image_id ", "  instance_market_options {\n    market_type = \"spot\"\n  }\n  image_id ", "has instance_market_options"},
		{"not at zero", fbStart, "desired_capacity    = 0", "desired_capacity    = 2", "does not start at zero: desired_capacity"},
		{"other subnets", fbStart, "vpc_zone_identifier = var.gpu_subnet_ids", "vpc_zone_identifier = [var.gpu_subnet_ids[0]]", "the fallback group's subnets"},
		{"other template", fbStart, "version            = aws_launch_template.gpu.latest_version", `version            = "1"`, "the fallback group's version"},
		{"other types", fbStart, "for_each = var.gpu_instance_types", `for_each = ["p4d.24xlarge"]`, "the fallback group's instance types"},
		{"hook", fbStart, "  dynamic \"tag\" {", "  initial_lifecycle_hook {\n    name = \"x\"\n  }\n  dynamic \"tag\" {", "has a terminate lifecycle hook"},
		{"wrong name", "fallback_args", `"--fallback-asg", local.fallback_asg_name`, `"--fallback-asg", local.asg_name`, "fallback_args gives --fallback-asg \"local.asg_name\""},
		{"no after", "fallback_args", `"--fallback-after", var.fallback_after,`, "", "fallback_args gives --fallback-after \"\""},
		{"always flags", "fallback_args", "fallback_args = var.on_demand_fallback ? [", "fallback_args = true ? [", "want fallback_args = var.on_demand_fallback ?"},
		{"grant always", "", steerFallback, `for_each = module.job.manage_capacity ? ["SteerFallback"] : []`, "on the fallback group without on_demand_fallback and --manage-capacity"},
		{"grant wider", steerFallback, "resources = [local.fallback_asg_arn]", `resources = [local.fallback_asg_arn, "*"]`, `a grant made with on_demand_fallback on ["*"]`},
		{"claim less", `["ClaimFallback"]`, `"autoscaling:DeleteTags"`, `"autoscaling:DescribeTags"`, "does not grant autoscaling:DeleteTags on the fallback group"},
		{"grant less", steerFallback, "\"autoscaling:TerminateInstanceInAutoScalingGroup\",\n", "", "does not grant autoscaling:TerminateInstanceInAutoScalingGroup on the fallback group"},
		{"grant more", steerFallback, "\"autoscaling:SetDesiredCapacity\",\n", "\"autoscaling:SetDesiredCapacity\",\n        \"autoscaling:CompleteLifecycleAction\",\n", "grants autoscaling:CompleteLifecycleAction on the fallback group, which the driver does not call there"},
		{"spot grant gone", "", `for_each = module.job.manage_capacity ? ["SteerCapacity"] : []`, `for_each = module.job.manage_capacity && var.on_demand_fallback ? ["SteerCapacity"] : []`, "does not grant autoscaling:SetDesiredCapacity on the spot group"},
		{"other arn", "", "autoScalingGroupName/${local.fallback_asg_name}", "autoScalingGroupName/${local.asg_name}", "want a local holding each group's ARN"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			changed := false
			for name, src := range files {
				if !changed {
					from := 0
					if c.after != "" {
						from = strings.Index(src, c.after)
					}
					if from >= 0 {
						if i := strings.Index(src[from:], c.old); i >= 0 {
							src = src[:from+i] + c.new + src[from+i+len(c.old):]
							changed = true
						}
					}
				}
				write(t, dir, name, src)
			}
			if !changed {
				t.Fatalf("aws/*.tf has no %q after %q: the case no longer changes the module", c.old, c.after)
			}
			m, err := loadModule(dir)
			if err != nil {
				t.Fatal(err)
			}
			got := checkFallback(m, ops)
			if !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, c.want) }) {
				t.Errorf("no problem reported containing %q; got:\n%s", c.want, strings.Join(got, "\n"))
			}
		})
	}

	// A call listed on the fallback group that the provider does not make.
	m, err := loadModule("aws")
	if err != nil {
		t.Fatal(err)
	}
	saved := awsFallbackOps
	defer func() { awsFallbackOps = saved }()
	awsFallbackOps = append(slices.Clone(saved), "autoscaling.SetInstanceHealth")
	if got := checkFallbackGrants(m, ops); !slices.ContainsFunc(got, func(s string) bool {
		return strings.Contains(s, "autoscaling.SetInstanceHealth is listed as a call on the fallback group")
	}) {
		t.Errorf("a call on the fallback group the provider does not make: %q", got)
	}
}
