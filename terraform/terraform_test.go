package terraform_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2/hclsyntax"
)

var clouds = []cloud{
	{
		name: "aws", pkg: "providers/aws", sdks: []string{"github.com/aws/aws-sdk-go-v2/service/"},
		perms: awsPerms, policy: awsPolicy, steering: awsSteering,
		wantArgs: []string{"/usr/local/bin/elasticd", "run", "--provider", "aws", "--asg", "--region", "--sqs-queue-url",
			"--launcher", "agent", "--listen", "--agent-secret-file", "/etc/elasticd/agent-secret", "--state-dir", "/var/lib/elasticd/state", "-np", "--min-np", "--max-np", "--"},
	},
	{
		name: "gcp", pkg: "providers/gcp", sdks: []string{"cloud.google.com/go/compute/apiv1"},
		perms: gcpPerms, policy: gcpPolicy, steering: gcpSteering,
		wantArgs: []string{"/usr/local/bin/elasticd", "run", "--provider", "gcp", "--project", "--mig",
			"--launcher", "agent", "--listen", "--agent-secret-file", "/etc/elasticd/agent-secret", "--state-dir", "/var/lib/elasticd/state", "-np", "--min-np", "--max-np", "--"},
	},
	{
		name: "azure", pkg: "providers/azure", sdks: []string{"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/"},
		perms: azurePerms, policy: azurePolicy, steering: azureSteering,
		wantArgs: []string{"/usr/local/bin/elasticd", "run", "--provider", "azure", "--subscription", "--resource-group", "--vmss",
			"--launcher", "agent", "--listen", "--agent-secret-file", "/etc/elasticd/agent-secret", "--state-dir", "/var/lib/elasticd/state", "-np", "--min-np", "--max-np", "--"},
	},
	{
		name: "ibm", pkg: "providers/ibm", sdks: []string{"github.com/IBM/vpc-go-sdk/vpcv1"},
		perms: ibmPerms, policy: ibmPolicy, steering: ibmSteering,
		wantArgs: []string{"/usr/local/bin/elasticd", "run", "--provider", "ibm", "--region", "--instance-group",
			"--launcher", "agent", "--listen", "--agent-secret-file", "/etc/elasticd/agent-secret", "--state-dir", "/var/lib/elasticd/state", "-np", "--min-np", "--max-np", "--"},
	},
}

// moduleDirs lists every directory under terraform/ that holds .tf files.
func moduleDirs(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != "." {
			return filepath.SkipDir // .terraform and the like
		}
		if !d.IsDir() && strings.HasSuffix(path, ".tf") && !slices.Contains(dirs, filepath.Dir(path)) {
			dirs = append(dirs, filepath.Dir(path))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// TestEveryCloudHasAModule: the four modules and at least one example each exist.
func TestEveryCloudHasAModule(t *testing.T) {
	dirs := moduleDirs(t)
	for _, c := range clouds {
		for _, f := range []string{"main.tf", "variables.tf", "outputs.tf", "versions.tf", "README.md"} {
			if _, err := os.Stat(filepath.Join(c.name, f)); err != nil {
				t.Errorf("module %s: %v", c.name, err)
			}
		}
		if !slices.ContainsFunc(dirs, func(d string) bool { return strings.HasPrefix(d, filepath.Join(c.name, "examples")+"/") }) {
			t.Errorf("module %s has no example under %s/examples/", c.name, c.name)
		}
	}
}

// TestParseAndFormat: every .tf file parses and is as `terraform fmt` leaves it.
func TestParseAndFormat(t *testing.T) {
	for _, dir := range moduleDirs(t) {
		m, err := loadModule(dir)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		for _, name := range sortedKeys(m.files) {
			if msg := checkFormat(filepath.Join(dir, name), m.files[name]); msg != "" {
				t.Error(msg)
			}
		}
	}
}

// TestModules: references, variables, validations, templates and module calls of every module
// and example.
func TestModules(t *testing.T) {
	for _, dir := range moduleDirs(t) {
		t.Run(dir, func(t *testing.T) {
			m, err := loadModule(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, check := range []func() []string{m.checkReferences, m.checkVariables, m.checkValidations, m.checkTemplates, m.checkModuleCalls} {
				for _, msg := range check() {
					t.Error(msg)
				}
			}
			if strings.Contains(dir, "examples") && len(m.modules) == 0 {
				t.Errorf("example %s calls no module", dir)
			}
		})
	}
}

// TestPermissionsMatchCode: each module grants the driver exactly what its provider's SDK
// calls need, no more and no less, when driver_flags has --manage-capacity; and what only
// steering the group needs, only then.
func TestPermissionsMatchCode(t *testing.T) {
	for _, c := range clouds {
		t.Run(c.name, func(t *testing.T) {
			ops, err := sdkOperations(filepath.Join("..", c.pkg), c.sdks)
			if err != nil {
				t.Fatal(err)
			}
			if len(ops) == 0 {
				t.Fatalf("found no SDK call in %s: the collector no longer understands its seam", c.pkg)
			}
			t.Logf("%s calls %v", c.pkg, sortedKeys(ops))
			m, err := loadModule(c.name)
			if err != nil {
				t.Fatal(err)
			}
			granted, steering, err := c.policy(m)
			if err != nil {
				t.Fatal(err)
			}
			missing, extra, unknown := comparePermissions(ops, c.perms, granted)
			for _, u := range unknown {
				t.Errorf("%s calls %s, which the permission table in terraform/permissions_test.go does not know: add what it needs", c.pkg, u)
			}
			for _, p := range missing {
				t.Errorf("terraform/%s does not grant %s", c.name, p)
			}
			for _, p := range extra {
				t.Errorf("terraform/%s grants %s, which no SDK call of %s needs", c.name, p, c.pkg)
			}
			for _, msg := range compareSteering(ops, c.perms, c.steering, steering) {
				t.Errorf("terraform/%s: %s", c.name, msg)
			}
		})
	}
}

// TestPermissionCheckCanFail: the comparison reports a permission taken away, one added, an
// operation the table does not know, and a grant made with --manage-capacity or without it
// where it should not be.
func TestPermissionCheckCanFail(t *testing.T) {
	ops, err := sdkOperations("../providers/aws", clouds[0].sdks)
	if err != nil {
		t.Fatal(err)
	}
	m, err := loadModule("aws")
	if err != nil {
		t.Fatal(err)
	}
	granted, steering, err := awsPolicy(m)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.Index(granted, "sqs:DeleteMessage")
	if i < 0 {
		t.Fatalf("the AWS policy %v lacks sqs:DeleteMessage", granted)
	}
	less := slices.Delete(slices.Clone(granted), i, i+1)
	missing, extra, _ := comparePermissions(ops, awsPerms, less)
	if len(missing) != 1 || !strings.HasPrefix(missing[0], "sqs:DeleteMessage (needed by sqs.DeleteMessageBatch") || len(extra) != 0 {
		t.Errorf("without sqs:DeleteMessage: missing %q, extra %q; want only sqs:DeleteMessage missing", missing, extra)
	}
	more := append(slices.Clone(granted), "ec2:TerminateInstances")
	missing, extra, _ = comparePermissions(ops, awsPerms, more)
	if len(missing) != 0 || !slices.Equal(extra, []string{"ec2:TerminateInstances"}) {
		t.Errorf("with ec2:TerminateInstances: missing %q, extra %q; want only ec2:TerminateInstances extra", missing, extra)
	}
	// A steering grant made always, and a grant discovery needs made only with the flag.
	if bad := compareSteering(ops, awsPerms, awsSteering, steering); len(bad) != 0 {
		t.Fatalf("the AWS module's steering grants: %q", bad)
	}
	if !slices.Contains(steering, "autoscaling:SetDesiredCapacity") {
		t.Fatalf("the AWS policy grants %v with --manage-capacity, without autoscaling:SetDesiredCapacity", steering)
	}
	// Every grant of it (on the spot group, and on the fallback group) made always.
	always := slices.DeleteFunc(slices.Clone(steering), func(p string) bool { return p == "autoscaling:SetDesiredCapacity" })
	bad := compareSteering(ops, awsPerms, awsSteering, append(always, "ec2:DescribeInstances"))
	if len(bad) != 2 || !strings.Contains(bad[0], "grants autoscaling:SetDesiredCapacity always") ||
		!strings.Contains(bad[1], "grants ec2:DescribeInstances only with --manage-capacity") {
		t.Errorf("SetDesiredCapacity made always, DescribeInstances only with --manage-capacity: %q", bad)
	}
	bad = compareSteering(ops, awsPerms, append(slices.Clone(awsSteering), "autoscaling.SetInstanceHealth"), steering)
	if len(bad) != 1 || !strings.Contains(bad[0], "autoscaling.SetInstanceHealth is listed as a steering call, but the provider does not call it") {
		t.Errorf("a steering call the provider does not make: %q", bad)
	}

	ops["ec2.TerminateInstances"] = []string{"x.go:1"}
	_, _, unknown := comparePermissions(ops, awsPerms, granted)
	if len(unknown) != 1 || !strings.HasPrefix(unknown[0], "ec2.TerminateInstances") {
		t.Errorf("an unknown operation: unknown %q, want ec2.TerminateInstances", unknown)
	}
}

// TestCollectorFindsSeamCalls runs the collector on a small package with both kinds of seam,
// a non-SDK interface, a method that is declared but not called, and a test file.
func TestCollectorFindsSeamCalls(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "seam.go", `package p

import (
	"context"

	"example.com/sdk/service/queue"
	compute "example.com/sdk/compute/apiv1"
	other "example.com/notsdk"
)

type queueAPI interface {
	Receive(context.Context, *queue.ReceiveInput) (*queue.ReceiveOutput, error)
	Purge(context.Context, *queue.PurgeInput) (*queue.PurgeOutput, error)
}

type local interface{ Next(context.Context) error }

type P struct {
	q   queueAPI
	vms *compute.InstancesClient
	it  local
	o   *other.Client
}

func (p *P) poll(ctx context.Context) {
	p.q.Receive(ctx, nil)
	p.vms.List(ctx, nil).InternalFetch(1, "")
	p.it.Next(ctx)
	p.o.Delete(ctx)
}
`)
	write(t, dir, "seam_test.go", `package p

func (p *P) fake() { p.q.Purge(nil, nil) }
`)
	ops, err := sdkOperations(dir, []string{"example.com/sdk/"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := sortedKeys(ops), []string{"compute.InstancesClient.List", "queue.Receive"}; !slices.Equal(got, want) {
		t.Errorf("operations %v, want %v", got, want)
	}
}

// TestModuleChecksCanFail runs the HCL checks on a broken module and expects each problem.
func TestModuleChecksCanFail(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "templates"), "x.tftpl", "${a} ${b}\n")
	write(t, dir, "main.tf", `variable "used" {
  description = "used"
  type        = number
}

variable "unused" {
  type = string
}

variable "release_url" {
  description = "no validation"
  type        = string
}

locals {
  x = var.used + var.undeclared + var.release_url
  t = templatefile("${path.module}/templates/x.tftpl", { a = 1, c = 2 })
}

resource "null_resource" "r" {
  triggers = { x = each.key }
}

output "o" {
  description = "o"
  value       = [local.x, local.nope, null_resource.r.id, null_resource.gone.id, data.d.x.y]
}
`)
	write(t, dir, "ugly.tf", "output \"p\" {\n  description = \"p\"\n  value = 1\n}\n")
	m, err := loadModule(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, check := range []func() []string{m.checkReferences, m.checkVariables, m.checkValidations, m.checkTemplates} {
		got = append(got, check()...)
	}
	got = append(got, checkFormat("ugly.tf", m.files["ugly.tf"]))
	for _, want := range []string{
		"undeclared variable var.undeclared",
		"undeclared local local.nope",
		"undeclared resource null_resource.gone",
		"undeclared data source data.d.x",
		"each outside a block that defines it",
		`variable "unused" is declared`,
		`variable "unused" has no description`,
		`variable "used" (`, // a number without validation
		`variable "release_url" (`,
		"uses ${b}, which the templatefile call",
		`passes "c", which templates/x.tftpl never uses`,
		"ugly.tf is not formatted (terraform fmt would change line 3)",
	} {
		if !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, want) }) {
			t.Errorf("no problem reported containing %q; got:\n%s", want, strings.Join(got, "\n"))
		}
	}

	// An example that passes an undeclared variable, omits a required one and reads a
	// missing output.
	ex := filepath.Join(dir, "examples", "e")
	write(t, ex, "main.tf", `module "c" {
  source = "../.."
  used   = 1
  bogus  = 2
}

output "x" {
  description = "x"
  value       = module.c.missing
}
`)
	em, err := loadModule(ex)
	if err != nil {
		t.Fatal(err)
	}
	got = em.checkModuleCalls()
	for _, want := range []string{`passes "bogus"`, `does not pass "unused"`, `reads output "missing"`} {
		if !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, want) }) {
			t.Errorf("no problem reported containing %q; got:\n%s", want, strings.Join(got, "\n"))
		}
	}
}

// sharedModule is the module every cloud's module calls for the job: it validates the job's
// settings and renders the driver's command line and the hosts' cloud-init.
const sharedModule = "modules/elasticd-job"

// TestDriverCommandLine: each module's driver runs `elasticd run` with the flags of the CLI
// contract, in order, followed by the training command. The shared module writes the command
// line as concat([elasticd run], var.provider_args, var.fallback_args, [the job's flags...],
// var.driver_flags, ["--"], var.training_command), and each cloud passes its provider_args, its
// driver_flags and its training_command (and the AWS module its fallback group's flags, which
// TestFallbackGroup checks).
func TestDriverCommandLine(t *testing.T) {
	shared, err := loadModule(sharedModule)
	if err != nil {
		t.Fatal(err)
	}
	a := shared.locals["driver_args"]
	if a == nil {
		t.Fatalf("%s has no local driver_args", sharedModule)
	}
	call, ok := a.Expr.(*hclsyntax.FunctionCallExpr)
	if !ok || call.Name != "concat" || len(call.Args) != 7 {
		t.Fatalf("%s: driver_args must be concat([elasticd run], var.provider_args, var.fallback_args, [the job's args...], var.driver_flags, [\"--\"], var.training_command)", a.SrcRange)
	}
	for i, want := range map[int]string{1: "var.provider_args", 2: "var.fallback_args", 4: "var.driver_flags", 6: "var.training_command"} {
		if got := traversalOf(call.Args[i]); got != want {
			t.Errorf("driver_args's part %d is %q, want %s", i+1, got, want)
		}
	}
	head, err := stringLiterals(call.Args[0])
	if err != nil {
		t.Fatalf("%s: %v", a.SrcRange, err)
	}
	job, err := stringLiterals(call.Args[3])
	if err != nil {
		t.Fatalf("%s: %v", a.SrcRange, err)
	}
	dashes, err := stringLiterals(call.Args[5])
	if err != nil || !slices.Equal(dashes, []string{"--"}) {
		t.Fatalf("%s: the sixth part of driver_args must be [\"--\"], the end of the flags (%v)", a.SrcRange, err)
	}
	job = append(job, dashes...)
	for _, c := range clouds {
		t.Run(c.name, func(t *testing.T) {
			m, err := loadModule(c.name)
			if err != nil {
				t.Fatal(err)
			}
			b := m.modules[sharedCall(t, m)]
			for _, arg := range []string{"training_command", "driver_flags"} {
				if got := traversalOf(argExpr(b, arg)); got != "var."+arg {
					t.Errorf("the module passes %s = %q, want var.%s", arg, got, arg)
				}
			}
			pa := b.Body.Attributes["provider_args"]
			if pa == nil {
				t.Fatal("the module passes no provider_args")
			}
			provider, err := stringLiterals(pa.Expr)
			if err != nil {
				t.Fatalf("%s: %v", pa.SrcRange, err)
			}
			literals := slices.Concat(head, provider, job)
			if !slices.Equal(literals, c.wantArgs) {
				t.Errorf("the driver's fixed arguments are\n  %q\nwant\n  %q", literals, c.wantArgs)
			}
			o := m.outputs["driver_command"]
			if o == nil {
				t.Fatal(`no output "driver_command"`)
			}
			if got, want := traversalOf(o.Body.Attributes["value"].Expr), "module."+b.Labels[0]+".driver_command"; got != want {
				t.Errorf(`output "driver_command" is %q, want %s: the command line the driver runs`, got, want)
			}
		})
	}
}

// sharedCall returns the name of m's one call to the shared module.
func sharedCall(t *testing.T, m *module) string {
	t.Helper()
	var names []string
	for _, name := range sortedKeys(m.modules) {
		if target, err := m.called(name); err == nil && filepath.Clean(target.dir) == filepath.Clean(sharedModule) {
			names = append(names, name)
		}
	}
	if len(names) != 1 {
		t.Fatalf("%s calls %s %d times, want once", m.dir, sharedModule, len(names))
	}
	return names[0]
}

func argExpr(b *hclsyntax.Block, name string) hclsyntax.Expression {
	if a := b.Body.Attributes[name]; a != nil {
		return a.Expr
	}
	return nil
}

// stringLiterals returns the literal strings of a list expression, in order, skipping the
// elements that are computed (references, interpolations).
func stringLiterals(e hclsyntax.Expression) ([]string, error) {
	list, ok := e.(*hclsyntax.TupleConsExpr)
	if !ok {
		return nil, fmt.Errorf("the arguments must be a list")
	}
	var literals []string
	for _, e := range list.Exprs {
		if v, diags := e.Value(nil); !diags.HasErrors() && v.Type().FriendlyName() == "string" {
			literals = append(literals, v.AsString())
		}
	}
	return literals, nil
}

func traversalOf(e hclsyntax.Expression) string {
	if st, ok := e.(*hclsyntax.ScopeTraversalExpr); ok {
		return traversalString(st.Traversal)
	}
	return ""
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestReadmes: each module's README lists every input and output, and shows what it creates.
func TestReadmes(t *testing.T) {
	for _, c := range clouds {
		m, err := loadModule(c.name)
		if err != nil {
			t.Fatal(err)
		}
		readme, err := os.ReadFile(filepath.Join(c.name, "README.md"))
		if err != nil {
			t.Fatal(err)
		}
		for _, names := range [][]string{sortedKeys(m.variables), sortedKeys(m.outputs)} {
			for _, n := range names {
				if !strings.Contains(string(readme), "| `"+n+"` |") {
					t.Errorf("%s/README.md has no table row for `%s`", c.name, n)
				}
			}
		}
		for _, want := range []string{"## What it creates", "```\n", "state", "examples/basic"} {
			if !strings.Contains(string(readme), want) {
				t.Errorf("%s/README.md lacks %q", c.name, want)
			}
		}
	}
}
