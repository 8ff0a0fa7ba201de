package terraform_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"go.yaml.in/yaml/v3"
)

// TestCloudsLeaveTheJobToTheSharedModule: what the four clouds share lives once, in
// modules/elasticd-job. A cloud module that validates a job setting again, repeats one of the
// shared module's checks, writes the job's flags, quotes a command line for sh, or carries or
// renders a template of its own copy, fails here.
func TestCloudsLeaveTheJobToTheSharedModule(t *testing.T) {
	shared, err := loadModule(sharedModule)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range clouds {
		t.Run(c.name, func(t *testing.T) {
			m, err := loadModule(c.name)
			if err != nil {
				t.Fatal(err)
			}
			for _, msg := range checkShared(m, shared) {
				t.Error(msg)
			}
		})
	}
}

// checkShared reports what module m (a cloud's) does that belongs to the shared module.
func checkShared(m, shared *module) []string {
	var bad []string
	call, err := callOf(m, shared)
	if err != nil {
		return []string{err.Error()}
	}

	// The job's settings: declared by the cloud for its callers, validated by the shared
	// module only, and passed to it.
	for _, name := range sortedKeys(shared.variables) {
		v := m.variables[name]
		if v == nil || !hasValidation(shared.variables[name]) {
			continue
		}
		if hasValidation(v) {
			bad = append(bad, fmt.Sprintf("%s: variable %q re-declares a validation: %s validates it for every cloud", v.DefRange(), name, shared.dir))
		}
		if !slices.ContainsFunc(m.feeds(name), func(f feed) bool { return f.call == call && f.arg == name }) {
			bad = append(bad, fmt.Sprintf("%s: variable %q is not passed to module %q as %s: %s validates it for every cloud", v.DefRange(), name, call, name, shared.dir))
		}
	}

	// The shared module's checks (validations, pre- and postconditions), by condition and by
	// message.
	theirs := checksOf(shared)
	for _, c := range checksOf(m) {
		for _, s := range theirs {
			if c.condition == s.condition || c.message == s.message {
				bad = append(bad, fmt.Sprintf("%s: this check repeats %s's at %s (%q)", c.where, shared.dir, s.where, s.message))
			}
		}
	}

	// The rendering: the job's flags, the quoting for sh, the templates.
	flags := map[string]bool{}
	if a := shared.locals["driver_args"]; a != nil {
		for _, s := range literalStrings(a.Expr) {
			if len(s) > 2 && (strings.HasPrefix(s, "-") || strings.HasPrefix(s, "/")) {
				flags[s] = true
			}
		}
	}
	if len(flags) == 0 {
		bad = append(bad, fmt.Sprintf("%s has no local driver_args with the job's flags to compare with", shared.dir))
	}
	templates := map[string][]byte{}
	if names, err := filepath.Glob(filepath.Join(shared.dir, "templates", "*")); err == nil {
		for _, n := range names {
			if src, err := os.ReadFile(n); err == nil {
				templates[filepath.Base(n)] = src
			}
		}
	}
	if len(templates) == 0 {
		bad = append(bad, fmt.Sprintf("%s has no templates to compare with", shared.dir))
	}
	for _, base := range sortedKeys(m.bodies) {
		hclsyntax.VisitAll(m.bodies[base], func(n hclsyntax.Node) hcl.Diagnostics {
			switch n := n.(type) {
			case *hclsyntax.LiteralValueExpr:
				if n.Val.Type() == cty.String && flags[n.Val.AsString()] {
					bad = append(bad, fmt.Sprintf("%s: %q is one of the job's flags of `elasticd run`, which %s writes", n.SrcRange, n.Val.AsString(), shared.dir))
				}
			case *hclsyntax.FunctionCallExpr:
				if n.Name == "replace" && slices.ContainsFunc(n.Args, func(e hclsyntax.Expression) bool { return slices.Contains(literalStrings(e), `'\''`) }) {
					bad = append(bad, fmt.Sprintf("%s: quotes a command line for sh, which %s does", n.Range(), shared.dir))
				}
				if n.Name == "templatefile" && len(n.Args) > 0 {
					if p, ok := modulePath(n.Args[0]); ok && templates[filepath.Base(p)] != nil {
						bad = append(bad, fmt.Sprintf("%s: renders %s, which %s renders", n.Range(), p, shared.dir))
					}
				}
			}
			return nil
		})
	}
	own, _ := filepath.Glob(filepath.Join(m.dir, "templates", "*"))
	for _, n := range own {
		src, err := os.ReadFile(n)
		if err != nil {
			continue
		}
		for _, name := range sortedKeys(templates) {
			if filepath.Base(n) == name || bytes.Equal(src, templates[name]) {
				bad = append(bad, fmt.Sprintf("%s is a copy of %s/templates/%s", n, shared.dir, name))
			}
		}
	}
	return bad
}

// callOf returns the name of m's one call to module shared.
func callOf(m, shared *module) (string, error) {
	want, err := filepath.Abs(shared.dir)
	if err != nil {
		return "", err
	}
	var names []string
	for _, name := range sortedKeys(m.modules) {
		target, err := m.called(name)
		if err != nil {
			continue
		}
		if got, err := filepath.Abs(target.dir); err == nil && got == want {
			names = append(names, name)
		}
	}
	if len(names) != 1 {
		return "", fmt.Errorf("%s calls %s %d times, want once", m.dir, shared.dir, len(names))
	}
	return names[0], nil
}

// check is one validation, precondition or postcondition: its condition without spaces and,
// in a validation, with its variable's name taken out; and its message.
type check struct {
	where, condition, message string
}

func checksOf(m *module) []check {
	var out []check
	var visit func(body *hclsyntax.Body, base, variable string)
	visit = func(body *hclsyntax.Body, base, variable string) {
		for _, b := range body.Blocks {
			switch b.Type {
			case "variable":
				visit(b.Body, base, b.Labels[0])
			case "validation", "precondition", "postcondition":
				c := check{where: b.DefRange().String()}
				if a := b.Body.Attributes["condition"]; a != nil {
					r := a.Expr.Range()
					src := string(m.files[base][r.Start.Byte:r.End.Byte])
					if variable != "" {
						src = regexp.MustCompile(`\bvar\.`+regexp.QuoteMeta(variable)+`\b`).ReplaceAllString(src, "var._")
					}
					c.condition = strings.Join(strings.Fields(src), "")
				}
				if a := b.Body.Attributes["error_message"]; a != nil {
					if v, diags := a.Expr.Value(nil); !diags.HasErrors() && v.Type() == cty.String {
						c.message = v.AsString()
					}
				}
				out = append(out, c)
			default:
				visit(b.Body, base, variable)
			}
		}
	}
	for _, base := range sortedKeys(m.bodies) {
		visit(m.bodies[base], base, "")
	}
	return out
}

// literalStrings returns every literal string in e.
func literalStrings(e hclsyntax.Expression) []string {
	var out []string
	hclsyntax.VisitAll(e, func(n hclsyntax.Node) hcl.Diagnostics {
		if l, ok := n.(*hclsyntax.LiteralValueExpr); ok && l.Val.Type() == cty.String {
			out = append(out, l.Val.AsString())
		}
		return nil
	})
	return out
}

// TestSharedChecksCanFail runs checkShared on a cloud module that does, once each, what
// belongs to the shared module, and on one that does not call it.
func TestSharedChecksCanFail(t *testing.T) {
	shared, err := loadModule(sharedModule)
	if err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(sharedModule)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cloud := filepath.Join(dir, "cloud")
	src, err := filepath.Rel(cloud, abs)
	if err != nil {
		t.Fatal(err)
	}
	agent, err := os.ReadFile(filepath.Join(sharedModule, "templates", "agent.yaml.tftpl"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(cloud, "templates"), "driver.yaml.tftpl", "${name}\n")
	write(t, filepath.Join(cloud, "templates"), "mine.tftpl", string(agent))
	write(t, cloud, "main.tf", `module "job" {
  source = "`+src+`"
  np     = var.np
}

variable "np" {
  description = "np"
  type        = number

  validation {
    condition     = var.np >= 1
    error_message = "np must be 1 or more."
  }
}

variable "max_np" {
  description = "max_np"
  type        = number
}

variable "workers" {
  description = "workers"
  type        = number

  validation {
    condition     = var.workers >= 1 && floor(var.workers) == var.workers
    error_message = "workers: a whole number."
  }
}

locals {
  args = ["--state-dir", "/var/lib/elasticd/state", var.max_np, var.workers]
  cmd  = join(" ", [for a in local.args : "'${replace(a, "'", "'\\''")}'"])
  ud   = templatefile("${path.module}/templates/driver.yaml.tftpl", { name = local.cmd })
}

resource "null_resource" "driver" {
  triggers = { ud = local.ud }

  lifecycle {
    precondition {
      condition     = true
      error_message = "Need min_np <= np <= max_np."
    }
  }
}
`)
	m, err := loadModule(cloud)
	if err != nil {
		t.Fatal(err)
	}
	got := checkShared(m, shared)
	for _, want := range []string{
		`variable "np" re-declares a validation`,
		`variable "max_np" is not passed to module "job"`,
		`repeats ` + sharedModule + `'s at ` + sharedModule + `/variables.tf`, // the workers condition, np's
		`("Need min_np <= np <= max_np.")`,
		`"--state-dir" is one of the job's flags`,
		`"/var/lib/elasticd/state" is one of the job's flags`,
		"quotes a command line for sh",
		"renders templates/driver.yaml.tftpl",
		"templates/driver.yaml.tftpl is a copy of",
		"templates/mine.tftpl is a copy of " + sharedModule + "/templates/agent.yaml.tftpl",
	} {
		if !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, want) }) {
			t.Errorf("no problem reported containing %q; got:\n%s", want, strings.Join(got, "\n"))
		}
	}

	lone := filepath.Join(dir, "lone")
	write(t, lone, "main.tf", "output \"x\" {\n  description = \"x\"\n  value       = 1\n}\n")
	lm, err := loadModule(lone)
	if err != nil {
		t.Fatal(err)
	}
	if got := checkShared(lm, shared); len(got) != 1 || !strings.Contains(got[0], "calls "+sharedModule+" 0 times") {
		t.Errorf("a module that does not call the shared one: got %q", got)
	}
}

// TestSharedReadme: the shared module's README lists every input and output.
func TestSharedReadme(t *testing.T) {
	m, err := loadModule(sharedModule)
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(sharedModule, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, names := range [][]string{sortedKeys(m.variables), sortedKeys(m.outputs)} {
		for _, n := range names {
			if !strings.Contains(string(readme), "| `"+n+"` |") {
				t.Errorf("%s/README.md has no table row for `%s`", sharedModule, n)
			}
		}
	}
}

// jobInputs are valid inputs of the shared module, as HCL expressions.
var jobInputs = map[string]string{
	"name":                    `"demo"`,
	"provider_args":           `["--provider", "aws", "--asg", "demo-gpu", "--region", "us-east-1"]`,
	"np":                      `4`,
	"min_np":                  `2`,
	"max_np":                  `8`,
	"training_command":        `["python3", "-c", "print('it is')", "$HOME", "a b"]`,
	"worker_setup_commands":   `["echo setup", "touch /tmp/ready"]`,
	"elasticd_release_url":    `"https://example.com/elasticd.tar.gz"`,
	"elasticd_release_sha256": `"` + strings.Repeat("0a", 32) + `"`,
	"agent_secret":            `"0123456789abcdef0123456789abcdef"`,
	"driver_environment":      `{ AWS_REGION = "us-east-1" }`,
	"driver_ip":               `"10.0.0.5"`,
	"agent_metadata":          `"aws"`,
	"driver_flags":            `["--reset-limit", "5", "--prices=/etc/elasticd/prices.yaml", "-v"]`,
	"driver_files":            `{ "/etc/elasticd/prices.yaml" = "currency: USD\n", "/var/lib/elasticd/admin/secret" = "s3cret" }`,
}

// jobCall writes a module block calling the shared module (linked as ./job) with jobInputs,
// changed by with.
func jobCall(name string, with map[string]string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "module %q {\n  source = \"./job\"\n", name)
	inputs := maps.Clone(jobInputs)
	maps.Copy(inputs, with)
	for _, k := range sortedKeys(inputs) {
		fmt.Fprintf(&sb, "  %s = %s\n", k, inputs[k])
	}
	sb.WriteString("}\n")
	return sb.String()
}

// terraformRoot makes a root module in a new directory that links the shared module as ./job,
// and returns a function that runs terraform there.
func terraformRoot(t *testing.T, tf, main string) (dir string, run func(args ...string) ([]byte, error)) {
	t.Helper()
	abs, err := filepath.Abs(sharedModule)
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	if err := os.Symlink(abs, filepath.Join(dir, "job")); err != nil {
		t.Fatal(err)
	}
	write(t, dir, "main.tf", main)
	write(t, dir, "terraformrc", "")
	env := append(os.Environ(), "CHECKPOINT_DISABLE=1", "TF_IN_AUTOMATION=1", "TF_INPUT=0",
		"TF_CLI_CONFIG_FILE="+filepath.Join(dir, "terraformrc"), "TF_DATA_DIR="+filepath.Join(dir, ".terraform"))
	run = func(args ...string) ([]byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, tf, args...)
		cmd.Dir = dir
		cmd.Env = env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return out, fmt.Errorf("terraform %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.Bytes())
		}
		return out, nil
	}
	if _, err := run("init", "-no-color", "-input=false", "-backend=false"); err != nil {
		t.Fatal(err)
	}
	return dir, run
}

// TestSharedModuleWithTerraform runs the shared module with the terraform binary (it needs no
// provider, so no network): what it renders, and what it refuses.
func TestSharedModuleWithTerraform(t *testing.T) {
	tf, err := exec.LookPath("terraform")
	if err != nil {
		t.Skip("terraform is not on PATH: the shared module is checked offline only (TestModules, TestCloudsLeaveTheJobToTheSharedModule)")
	}

	t.Run("renders", func(t *testing.T) {
		main := jobCall("job", nil)
		for _, o := range []string{"driver_port", "driver_args", "driver_command"} {
			main += fmt.Sprintf("output %q {\n  value = module.job.%s\n}\n", o, o)
		}
		for _, o := range []string{"driver_user_data", "agent_user_data"} {
			main += fmt.Sprintf("output %q {\n  value     = module.job.%s\n  sensitive = true\n}\n", o, o)
		}
		dir, run := terraformRoot(t, tf, main)
		if _, err := run("apply", "-no-color", "-input=false", "-auto-approve", "-lock=false", "-state="+filepath.Join(dir, "state")); err != nil {
			t.Fatal(err)
		}
		raw, err := run("output", "-json", "-state="+filepath.Join(dir, "state"))
		if err != nil {
			t.Fatal(err)
		}
		var outs map[string]struct{ Value json.RawMessage }
		if err := json.Unmarshal(raw, &outs); err != nil {
			t.Fatalf("terraform output -json: %v\n%s", err, raw)
		}
		var port int
		var args []string
		var command, driverUD, agentUD string
		for name, into := range map[string]any{"driver_port": &port, "driver_args": &args, "driver_command": &command, "driver_user_data": &driverUD, "agent_user_data": &agentUD} {
			if err := json.Unmarshal(outs[name].Value, into); err != nil {
				t.Fatalf("output %s: %v", name, err)
			}
		}

		wantArgs := []string{"/usr/local/bin/elasticd", "run", "--provider", "aws", "--asg", "demo-gpu", "--region", "us-east-1",
			"--launcher", "agent", "--listen", "0.0.0.0:29400", "--agent-secret-file", "/etc/elasticd/agent-secret",
			"--state-dir", "/var/lib/elasticd/state", "-np", "4", "--min-np", "2", "--max-np", "8",
			"--reset-limit", "5", "--prices=/etc/elasticd/prices.yaml", "-v",
			"--", "python3", "-c", "print('it is')", "$HOME", "a b"}
		if port != 29400 || !slices.Equal(args, wantArgs) {
			t.Errorf("driver_port %d, driver_args\n  %q\nwant 29400,\n  %q", port, args, wantArgs)
		}
		// sh reads the command line back into the same arguments.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "sh", "-c", `eval "set -- $1"; printf '%s\0' "$@"`, "sh", command).Output()
		if err != nil {
			t.Fatalf("sh on %s: %v", command, err)
		}
		if got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00"); !slices.Equal(got, wantArgs) {
			t.Errorf("sh splits driver_command %s into\n  %q\nwant\n  %q", command, got, wantArgs)
		}

		driver := cloudConfigFiles(t, driverUD)
		agent := cloudConfigFiles(t, agentUD)
		for _, files := range []map[string]string{driver, agent} {
			if got := files["/etc/elasticd/agent-secret"]; got != "0123456789abcdef0123456789abcdef" {
				t.Errorf("agent-secret %q", got)
			}
			install := files["/usr/local/sbin/install-elasticd"]
			if !strings.Contains(install, "url='https://example.com/elasticd.tar.gz'") || !strings.Contains(install, "sum='"+strings.Repeat("0a", 32)+"'") ||
				!strings.Contains(install, "fetch='https'") {
				t.Errorf("install-elasticd lacks the URL or the checksum:\n%s", install)
			}
		}
		if got, want := driver["/usr/local/sbin/elasticd-driver"], "#!/bin/sh\nexec "+command+"\n"; got != want {
			t.Errorf("elasticd-driver is\n%s\nwant\n%s", got, want)
		}
		if got := driver["/etc/elasticd/prices.yaml"]; got != "currency: USD\n" {
			t.Errorf("driver_files: prices.yaml %q", got)
		}
		if got := driver["/var/lib/elasticd/admin/secret"]; got != "s3cret" {
			t.Errorf("driver_files: admin/secret %q", got)
		}
		if _, ok := agent["/etc/elasticd/prices.yaml"]; ok {
			t.Error("driver_files are written on the GPU hosts too")
		}
		if got := driver["/etc/elasticd/driver.env"]; got != "AWS_REGION=us-east-1\n" {
			t.Errorf("driver.env %q", got)
		}
		if unit := driver["/etc/systemd/system/elasticd-driver.service"]; !strings.Contains(unit, "ExecStart=/usr/local/sbin/elasticd-driver\n") ||
			!strings.Contains(unit, "EnvironmentFile=/etc/elasticd/driver.env\n") || !strings.Contains(unit, "Restart=on-abnormal\n") {
			t.Errorf("elasticd-driver.service:\n%s", unit)
		}
		if got := agent["/usr/local/sbin/elasticd-worker-setup"]; got != "#!/bin/sh\nset -eu\necho setup\ntouch /tmp/ready\n" {
			t.Errorf("elasticd-worker-setup %q", got)
		}
		if unit := agent["/etc/systemd/system/elasticd-agent.service"]; !strings.Contains(unit,
			"ExecStart=/usr/local/bin/elasticd agent --driver http://10.0.0.5:29400 --agent-secret-file /etc/elasticd/agent-secret --metadata aws\n") {
			t.Errorf("elasticd-agent.service:\n%s", unit)
		}
	})

	t.Run("uploaded release", func(t *testing.T) {
		// elasticd_release_path: the cloud module uploaded it and says where; the checksum is
		// the file's, computed by the module. The install script Terraform renders then runs
		// against a fake S3 that checks the signature, and installs the tarball's elasticd.
		const binary = "#!/bin/sh\necho uploaded\n"
		tarball, sum := releaseTarball(t, binary)
		path := filepath.Join(t.TempDir(), "elasticd-v9.9.9-linux-amd64.tar.gz")
		if err := os.WriteFile(path, tarball, 0o644); err != nil {
			t.Fatal(err)
		}
		srv := fakeCloud(t, tarball, fakeSecret)
		url := srv.URL + "/bucket/releases/elasticd.tar.gz"
		main := jobCall("job", map[string]string{
			"elasticd_release_url":    "null",
			"elasticd_release_sha256": "null",
			"elasticd_release_path":   strconv.Quote(path),
			"elasticd_release_object": `{ fetch = "s3", url = "` + url + `", region = "eu-west-1" }`,
		})
		main += "output \"agent_user_data\" {\n  value     = module.job.agent_user_data\n  sensitive = true\n}\n"
		dir, run := terraformRoot(t, tf, main)
		if _, err := run("apply", "-no-color", "-input=false", "-auto-approve", "-lock=false", "-state="+filepath.Join(dir, "state")); err != nil {
			t.Fatal(err)
		}
		raw, err := run("output", "-raw", "-state="+filepath.Join(dir, "state"), "agent_user_data")
		if err != nil {
			t.Fatal(err)
		}
		install := cloudConfigFiles(t, string(raw))["/usr/local/sbin/install-elasticd"]
		for _, want := range []string{"url='" + url + "'", "sum='" + sum + "'", "fetch='s3'", "region='eu-west-1'"} {
			if !strings.Contains(install, want) {
				t.Errorf("install-elasticd lacks %s:\n%s", want, install)
			}
		}
		bindir, out, err := runInstall(t, install, srv.URL)
		if err != nil {
			t.Fatalf("install-elasticd: %v\n%s", err, out)
		}
		if got, err := os.ReadFile(filepath.Join(bindir, "elasticd")); err != nil || string(got) != binary {
			t.Errorf("installed elasticd %q (%v), want the uploaded tarball's", got, err)
		}
	})

	t.Run("refuses", func(t *testing.T) {
		// One call per bad input, each otherwise valid: terraform plan reports them all.
		cases := map[string]struct{ with, want string }{
			"np":                      {`0`, "np must be a whole number, 1 or more."},
			"min_np":                  {`1.5`, "min_np must be a whole number, 1 or more."},
			"max_np":                  {`-2`, "max_np must be a whole number, 1 or more."},
			"training_command":        {`[""]`, "training_command must name a program"},
			"elasticd_release_url":    {`"http://example.com/elasticd"`, "elasticd_release_url must be an https:// URL without spaces or quotes."},
			"elasticd_release_sha256": {`"ABC"`, "elasticd_release_sha256 must be 64 lower-case hex digits, or null."},
			"elasticd_release_object": {`{ fetch = "ftp", url = "https://x/y" }`, "elasticd_release_object.fetch must be s3, gcs or azure-blob."},
			"elasticd_release_path":   {`"/nonexistent/elasticd.tar.gz"`, "elasticd_release_path must name an existing file"},
			"agent_secret":            {`"short"`, "agent_secret must be at least 32 characters on one line, or null to generate one."},
			"agent_metadata":          {`"oracle"`, "agent_metadata must be aws, gcp, azure or none."},
			"provider_args":           {`["--asg", "demo-gpu"]`, "provider_args must start with --provider and the provider's name."},
			"fallback_args":           {`["--asg", "demo-gpu-ondemand"]`, "fallback_args must be pairs of a --fallback-* flag and its value"},
			"driver_files":            {`{ "/etc/passwd" = "x" }`, "driver_files: each path must be absolute"},
		}
		main := jobCall("fine", nil)
		var want []string
		for _, name := range sortedKeys(cases) {
			main += jobCall("bad_"+name, map[string]string{name: cases[name].with})
			want = append(want, "Invalid value for variable: "+cases[name].want)
		}
		// driver_flags: each of its checks, and the ways a flag is spelt.
		flags := map[string]struct{ with, want string }{
			"listen":      {`["--listen", "0.0.0.0:1"]`, "driver_flags must not set what the module sets itself"},
			"np_equals":   {`["-np=3"]`, "driver_flags must not set what the module sets itself"},
			"asg":         {`["--reset-limit", "3", "-asg", "other"]`, "driver_flags must not set what the module sets itself"},
			"dashes":      {`["--", "./train"]`, "driver_flags must not set what the module sets itself"},
			"fallback":    {`["--manage-capacity", "--fallback-asg", "od"]`, "driver_flags must not set what the module sets itself"},
			"other_group": {`["--manage-capacity", "--fallback-mig=od"]`, "driver_flags must not name a fallback group"},
			"unknown":     {`["--no-such-flag"]`, "driver_flags names a flag that `elasticd run` does not have"},
			"two_lines":   {`["--output-dir", "/var/lib/elasticd/out\nExecStart=/bin/sh"]`, "driver_flags: each element must be one line."},
			"object_url":  {`{ fetch = "s3", url = "https://x/y'; reboot; '" }`, "elasticd_release_object: url without quotes"},
			"file_in_dir": {`{ "/etc/elasticd/../passwd" = "x" }`, "driver_files: each path must be absolute"},
			"state":       {`{ "/var/lib/elasticd/state/job" = "x" }`, "driver_files: each path must be absolute"},
			"secret":      {`{ "/etc/elasticd/agent-secret" = "x" }`, "driver_files: each path must be absolute"},
		}
		for _, name := range sortedKeys(flags) {
			arg := "driver_flags"
			if strings.HasPrefix(name, "object") {
				arg = "elasticd_release_object"
			} else if strings.HasPrefix(flags[name].with, "{") {
				arg = "driver_files"
			}
			main += jobCall("bad_flags_"+name, map[string]string{arg: flags[name].with})
			want = append(want, "Invalid value for variable: "+flags[name].want)
		}
		// A file whose name cannot be an object key as it is.
		odd := filepath.Join(t.TempDir(), "elasticd v1 (copy).tar.gz")
		if err := os.WriteFile(odd, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		main += jobCall("bad_path_name", map[string]string{"elasticd_release_url": "null", "elasticd_release_path": strconv.Quote(odd),
			"elasticd_release_object": `{ fetch = "s3", url = "https://x/y" }`})
		want = append(want, "Invalid value for variable: elasticd_release_path: the file's name must be")
		checkPlanErrors(t, tf, main, nil, want)

		// Each input valid, but not together: the preconditions, checked once the values
		// are (a plan with invalid variables stops before it).
		dir := t.TempDir()
		path := filepath.Join(dir, "elasticd.tar.gz")
		if err := os.WriteFile(path, []byte("not really"), 0o644); err != nil {
			t.Fatal(err)
		}
		object := `{ fetch = "gcs", url = "https://storage.googleapis.com/storage/v1/b/b/o/e?alt=media" }`
		uploaded := map[string]string{"elasticd_release_url": "null", "elasticd_release_sha256": "null", "elasticd_release_path": strconv.Quote(path), "elasticd_release_object": object}
		with := func(changes map[string]string) map[string]string {
			out := maps.Clone(uploaded)
			maps.Copy(out, changes)
			return out
		}
		fallback := map[string]string{"fallback_args": `["--fallback-asg", "demo-gpu-ondemand", "--fallback-after", "10m"]`}
		checkPlanErrors(t, tf, jobCall("fine", nil)+jobCall("fine_uploaded", uploaded)+
			jobCall("fine_fallback", map[string]string{"fallback_args": fallback["fallback_args"], "driver_flags": `["--manage-capacity"]`})+
			jobCall("bad_fallback", fallback)+
			jobCall("bad_order", map[string]string{"min_np": `5`})+
			jobCall("bad_both", with(map[string]string{"elasticd_release_url": `"https://example.com/e.tar.gz"`}))+
			jobCall("bad_neither", map[string]string{"elasticd_release_url": "null"})+
			jobCall("bad_no_object", with(map[string]string{"elasticd_release_object": "null"}))+
			jobCall("bad_sum", with(map[string]string{"elasticd_release_sha256": `"` + strings.Repeat("0a", 32) + `"`})),
			[]string{"fine", "fine_uploaded", "fine_fallback"},
			[]string{
				"Module output value precondition failed: An on-demand fallback group (on_demand_fallback) needs \"--manage-capacity\" in driver_flags",
				"Module output value precondition failed: Need min_np <= np <= max_np.",
				"Module output value precondition failed: Set exactly one of elasticd_release_url",
				"Module output value precondition failed: Set exactly one of elasticd_release_url",
				"Module output value precondition failed: elasticd_release_path is uploaded by the cloud module",
				"Module output value precondition failed: elasticd_release_sha256 does not match the file at elasticd_release_path",
			})
	})
}

// checkPlanErrors runs terraform plan on root module main and expects it to fail with the
// errors want (by the start of their summary and detail), as many times as listed, and no
// other; none of them may come from the module calls named in fine.
func checkPlanErrors(t *testing.T, tf, main string, fine, want []string) {
	t.Helper()
	_, run := terraformRoot(t, tf, main)
	out, err := run("plan", "-json", "-no-color", "-input=false", "-lock=false")
	if err == nil {
		t.Fatalf("terraform plan accepted every input:\n%s", out)
	}
	var errs []string
	for _, line := range strings.Split(string(out), "\n") {
		var msg struct {
			Type       string
			Diagnostic struct {
				Severity, Summary, Detail string
				Address                   string
			}
		}
		if json.Unmarshal([]byte(line), &msg) == nil && msg.Type == "diagnostic" && msg.Diagnostic.Severity == "error" {
			errs = append(errs, msg.Diagnostic.Summary+": "+msg.Diagnostic.Detail)
			for _, f := range fine {
				if strings.HasPrefix(msg.Diagnostic.Address, "module."+f+".") {
					t.Errorf("module %s, which is valid, was refused: %s", f, msg.Diagnostic.Detail)
				}
			}
		}
	}
	for _, w := range slices.Compact(slices.Sorted(slices.Values(want))) {
		n := len(slices.DeleteFunc(slices.Clone(errs), func(e string) bool { return !strings.HasPrefix(e, w) }))
		if m := len(slices.DeleteFunc(slices.Clone(want), func(e string) bool { return e != w })); n != m {
			t.Errorf("%d errors starting %q, want %d", n, w, m)
		}
	}
	if len(errs) != len(want) {
		t.Errorf("%d errors, want %d:\n%s", len(errs), len(want), strings.Join(errs, "\n"))
	}
}

// cloudConfigFiles reads the write_files of a cloud-config: path -> content, decoded.
func cloudConfigFiles(t *testing.T, doc string) map[string]string {
	t.Helper()
	if !strings.HasPrefix(doc, "#cloud-config\n") {
		t.Fatalf("not a cloud-config:\n%s", doc)
	}
	var cc struct {
		WriteFiles []struct{ Path, Encoding, Content string } `yaml:"write_files"`
		Runcmd     [][]string
	}
	if err := yaml.Unmarshal([]byte(doc), &cc); err != nil {
		t.Fatalf("cloud-config: %v\n%s", err, doc)
	}
	if len(cc.Runcmd) == 0 {
		t.Errorf("cloud-config runs nothing:\n%s", doc)
	}
	files := map[string]string{}
	for _, f := range cc.WriteFiles {
		content := f.Content
		if f.Encoding == "b64" {
			b, err := base64.StdEncoding.DecodeString(f.Content)
			if err != nil {
				t.Fatalf("%s: %v", f.Path, err)
			}
			content = string(b)
		}
		files[f.Path] = content
	}
	return files
}
