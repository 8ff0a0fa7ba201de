package terraform_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

var update = flag.Bool("update", false, "rewrite the generated tables of docs/deploy-*.md")

// permissionWhy says why the driver needs each permission the permission tables name; the
// generated tables of docs/deploy-*.md show it, and a permission without a reason fails.
var permissionWhy = map[string]string{
	"autoscaling:DescribeAutoScalingGroups":                          "the group's instances and their lifecycle states (every discovery)",
	"autoscaling:CompleteLifecycleAction":                            "lets a scaled-in instance go once its workers have left",
	"autoscaling:RecordLifecycleActionHeartbeat":                     "keeps a scaled-in instance waiting while its workers leave",
	"ec2:DescribeInstances":                                          "private IPs, types, zones, spot or on-demand",
	"ec2:DescribeInstanceTypes":                                      "GPU count of each instance type (slots per host)",
	"ec2:DescribeSpotPriceHistory":                                   "current spot prices of the types in use, for the cost and savings",
	"sqs:ReceiveMessage":                                             "reads the notices EventBridge puts in the queue",
	"sqs:DeleteMessage":                                              "removes handled notices (also authorizes DeleteMessageBatch)",
	"sqs:ChangeMessageVisibility":                                    "hands a notice back to the queue",
	"sqs:GetQueueUrl":                                                "finds the queue by name",
	"compute.instanceGroupManagers.get":                              "the group and its managed instances (listManagedInstances is authorized by get)",
	"compute.instances.list":                                         "the VMs' internal IPs, machine types and provisioning model",
	"compute.instances.get":                                          "one VM's details",
	"Microsoft.Compute/virtualMachineScaleSets/read":                 "the scale set (its SKU: slots, Spot priority)",
	"Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read": "the scale set's VMs and their states",
	"Microsoft.Network/networkInterfaces/read":                       "the VMs' private IPs, from their network interfaces",
	"is/instanceGroupId/Viewer":                                      "the instance group and its memberships",
	"is/instanceId/Viewer":                                           "the instances' primary IPs, profiles, zones and availability class",
	// elasticd check: read-only questions about the driver's own access.
	"iam:GetRole":                              "`elasticd check`: the driver's role, whose permissions it asks IAM about (this role only)",
	"iam:SimulatePrincipalPolicy":              "`elasticd check`: asks IAM whether the role may make each call the job needs, without making it (this role only)",
	"sqs:GetQueueAttributes":                   "`elasticd check`: the notice queue's ARN and policy (may EventBridge send to it?)",
	"events:ListRuleNamesByTarget":             "`elasticd check`: the EventBridge rules that send to the notice queue",
	"events:DescribeRule":                      "`elasticd check`: each such rule's pattern and state (does it match spot interruption warnings?)",
	"Microsoft.Authorization/permissions/read": "`elasticd check`: the driver's own permissions on the scale set, asked without acting",
	// Steering the group: granted only with --manage-capacity.
	"autoscaling:SetDesiredCapacity":                          "with `--manage-capacity`: sets the group's size, on the job's groups only (the spot group, and the fallback group with `on_demand_fallback`)",
	"autoscaling:UpdateAutoScalingGroup":                      "with `--manage-capacity`: lowers the group's minimum to set a size below it (0 when the job ends), on the job's groups only",
	"autoscaling:TerminateInstanceInAutoScalingGroup":         "with `--manage-capacity`: hands a broken instance back for a replacement, keeping the size, on the job's groups only",
	"autoscaling:DescribeScalingActivities":                   "with `--manage-capacity`: the group's failed launches (a spot stockout)",
	"autoscaling:CreateOrUpdateTags":                          "with `--manage-capacity`: writes and refreshes the driver's claim on the group, its `elasticd-driver` tag, so that a second driver refuses to steer it",
	"autoscaling:DeleteTags":                                  "with `--manage-capacity`: removes the driver's claim, the group's `elasticd-driver` tag, at the job's end",
	"compute.instanceGroupManagers.update":                    "with `--manage-capacity`: resizes the group and recreates a broken VM",
	"compute.zoneOperations.get":                              "with `--manage-capacity`: follows a zonal group's resize or recreate to its end",
	"compute.regionOperations.get":                            "with `--manage-capacity`: follows a regional group's resize or recreate to its end",
	"compute.autoscalers.get":                                 "with `--manage-capacity`: an autoscaler attached to the group, whose size the driver does not fight",
	"Microsoft.Compute/virtualMachineScaleSets/write":         "with `--manage-capacity`: sets the scale set's capacity, on this scale set only",
	"Microsoft.Compute/virtualMachineScaleSets/delete/action": "with `--manage-capacity`: deletes a broken VM of the scale set, which then makes a new one",
	"is/instanceGroupId/Editor":                               "with `--manage-capacity`: sets the group's membership count (turning an autoscale manager off) and deletes a broken member, on this group only",
	"is/instanceId/Editor":                                    "with `--manage-capacity`: deletes the instance of a member it replaces",
}

// permissionTable renders the table of what the driver of cloud c may do, from the operations
// its provider package calls (the collector of TestPermissionsMatchCode) and the permission
// table, and adds what the module grants the hosts to read an uploaded release.
func permissionTable(c cloud, m *module) (string, error) {
	ops, err := sdkOperations(filepath.Join("..", c.pkg), c.sdks)
	if err != nil {
		return "", err
	}
	if len(ops) == 0 {
		return "", fmt.Errorf("%s: no SDK call found", c.pkg)
	}
	callers := map[string][]string{} // permission -> operations
	files := map[string][]string{}   // permission -> files
	for _, op := range sortedKeys(ops) {
		perms, ok := c.perms[op]
		if !ok {
			return "", fmt.Errorf("%s calls %s, which the permission table does not know", c.pkg, op)
		}
		for _, p := range perms {
			callers[p] = append(callers[p], op)
			for _, at := range ops[op] {
				f, _, _ := strings.Cut(at, ":")
				files[p] = append(files[p], c.pkg+"/"+f)
			}
		}
	}
	var sb strings.Builder
	sb.WriteString("| permission | why | SDK calls | in |\n|---|---|---|---|\n")
	for _, p := range sortedKeys(callers) {
		why, ok := permissionWhy[p]
		if !ok {
			return "", fmt.Errorf("permission %s has no reason in permissionWhy (terraform/docs_test.go)", p)
		}
		fs := slices.Compact(slices.Sorted(slices.Values(files[p])))
		fmt.Fprintf(&sb, "| `%s` | %s | %s | %s |\n", p, why, codeList(callers[p]), codeList(fs))
	}
	if grant := releaseGrant(c.name, m); grant != "" {
		fmt.Fprintf(&sb, "| %s | only with `elasticd_release_path`: the driver and the GPU hosts read the uploaded release, that object only | none: `install-elasticd` (curl) | `terraform/%s/main.tf` |\n", grant, c.name)
	}
	return sb.String(), nil
}

func codeList(items []string) string {
	out := make([]string, len(items))
	for i, s := range items {
		out[i] = "`" + s + "`"
	}
	return strings.Join(out, ", ")
}

// releaseGrant reads from module m what it grants the hosts to read an uploaded release.
func releaseGrant(cloudName string, m *module) string {
	switch cloudName {
	case "aws":
		if d := m.data["aws_iam_policy_document.release"]; d != nil {
			for _, s := range d.Body.Blocks {
				if acts, err := attrStrings(s.Body, "actions"); err == nil {
					return codeList(acts)
				}
			}
		}
	case "gcp":
		if b := m.resources["google_storage_bucket_iam_member.release"]; b != nil {
			if role, err := attrString(b.Body, "role"); err == nil {
				return "`" + role + "`"
			}
		}
	case "azure":
		if b := m.resources["azurerm_role_assignment.release"]; b != nil {
			if role, err := attrString(b.Body, "role_definition_name"); err == nil {
				return "`" + role + "`"
			}
		}
	}
	return ""
}

const (
	beginTable = "<!-- BEGIN permissions: generated by `go test ./terraform -run TestDeployDocs -update` from the provider's SDK calls; do not edit -->\n"
	endTable   = "<!-- END permissions -->\n"
)

// replaceTable puts table between the markers of doc.
func replaceTable(doc, table string) (string, error) {
	i := strings.Index(doc, beginTable)
	j := strings.Index(doc, endTable)
	if i < 0 || j < i {
		return "", fmt.Errorf("no %q ... %q markers", strings.TrimSpace(beginTable), strings.TrimSpace(endTable))
	}
	return doc[:i+len(beginTable)] + table + doc[j:], nil
}

var (
	fencedHCL   = regexp.MustCompile("(?s)```hcl\n(.*?)```")
	tfvarsPath  = regexp.MustCompile(`^# (terraform/[a-z]+/examples/[a-z]+)/[a-z.]*\.tfvars\n`)
	outputCmd   = regexp.MustCompile(`terraform output (?:-[a-z]+ )*([a-z_0-9]+)`)
	stringValue = regexp.MustCompile(`"([^"]*)"`)
)

// checkDeployDoc checks one deploy guide against the modules: every tfvars block names a root
// module and sets only its variables, every required one, with driver_flags it accepts; every
// `terraform output X` names an output of the guide's root module.
func checkDeployDoc(doc string, root string, refused, known []string) []string {
	var bad []string
	blocks := 0
	for _, fence := range fencedHCL.FindAllStringSubmatch(doc, -1) {
		head := tfvarsPath.FindStringSubmatch(fence[1])
		if head == nil {
			continue
		}
		blocks++
		dir, _ := filepath.Rel("terraform", head[1])
		if dir != root {
			bad = append(bad, fmt.Sprintf("a tfvars block is for %s, but the guide's commands run in terraform/%s", head[1], root))
		}
		m, err := loadModule(dir)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		f, diags := hclsyntax.ParseConfig([]byte(fence[1]), head[1]+".tfvars", hcl.InitialPos)
		if diags.HasErrors() {
			bad = append(bad, fmt.Sprintf("the tfvars block for %s does not parse: %s", head[1], diags.Error()))
			continue
		}
		attrs := f.Body.(*hclsyntax.Body).Attributes
		for _, name := range sortedKeys(attrs) {
			if m.variables[name] == nil {
				bad = append(bad, fmt.Sprintf("the tfvars block sets %s, which %s does not declare", name, head[1]))
			}
		}
		for _, name := range sortedKeys(m.variables) {
			if m.variables[name].Body.Attributes["default"] == nil && attrs[name] == nil {
				bad = append(bad, fmt.Sprintf("the tfvars block does not set %s, which %s requires", name, head[1]))
			}
		}
		if a := attrs["driver_flags"]; a != nil {
			r := a.Expr.Range()
			for _, v := range stringValue.FindAllStringSubmatch(fence[1][r.Start.Byte:r.End.Byte], -1) {
				if !strings.HasPrefix(v[1], "-") {
					continue
				}
				name := strings.TrimLeft(strings.SplitN(v[1], "=", 2)[0], "-")
				if !slices.Contains(known, name) || slices.Contains(refused, name) {
					bad = append(bad, fmt.Sprintf("the tfvars block's driver_flags has %s, which driver_flags refuses", v[1]))
				}
			}
		}
	}
	if blocks == 0 {
		bad = append(bad, "no tfvars block (```hcl starting with # terraform/<cloud>/examples/basic/terraform.tfvars)")
	}
	rm, err := loadModule(root)
	if err != nil {
		return append(bad, err.Error())
	}
	for _, o := range outputCmd.FindAllStringSubmatch(doc, -1) {
		if rm.outputs[o[1]] == nil {
			bad = append(bad, fmt.Sprintf("`%s`: terraform/%s has no output %s", o[0], root, o[1]))
		}
	}
	return bad
}

// TestDeployDocs: each docs/deploy-<cloud>.md is true to its module: the table of the driver's
// permissions is the one generated from the provider's SDK calls (-update rewrites it), its
// tfvars set only declared variables, and its outputs exist.
func TestDeployDocs(t *testing.T) {
	shared, err := loadModule(sharedModule)
	if err != nil {
		t.Fatal(err)
	}
	lists, err := driverFlagLists(shared)
	if err != nil {
		t.Fatal(err)
	}
	refused, known := lists.refused(), lists.known
	for _, c := range clouds {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join("..", "docs", "deploy-"+c.name+".md")
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			m, err := loadModule(c.name)
			if err != nil {
				t.Fatal(err)
			}
			table, err := permissionTable(c, m)
			if err != nil {
				t.Fatal(err)
			}
			doc, err := replaceTable(string(raw), table)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if doc != string(raw) {
				if *update {
					if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
						t.Fatal(err)
					}
				} else {
					t.Errorf("%s: the permissions table is not the one the code needs; run go test ./terraform -run TestDeployDocs -update and review the diff. Want:\n%s", path, table)
				}
			}
			for _, msg := range checkDeployDoc(doc, filepath.Join(c.name, "examples", "basic"), refused, known) {
				t.Errorf("%s: %s", path, msg)
			}
			for _, from := range []string{filepath.Join("..", "docs", "terraform.md"), filepath.Join(c.name, "README.md")} {
				if text, err := os.ReadFile(from); err != nil || !strings.Contains(string(text), "deploy-"+c.name+".md") {
					t.Errorf("%s does not link deploy-%s.md (%v)", from, c.name, err)
				}
			}
		})
	}
}

// TestDeployDocsCanFail: a permission added to the code changes the table; a tfvars block with
// an undeclared variable, a missing required one or a refused flag, and an unknown output,
// are each reported.
func TestDeployDocsCanFail(t *testing.T) {
	c := clouds[0]
	m, err := loadModule(c.name)
	if err != nil {
		t.Fatal(err)
	}
	table, err := permissionTable(c, m)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table, "| `sqs:DeleteMessage` |") || !strings.Contains(table, "| `s3:GetObject` |") {
		t.Fatalf("the AWS table lacks sqs:DeleteMessage or the release's s3:GetObject:\n%s", table)
	}
	c.perms = map[string][]string{}
	for k, v := range awsPerms {
		c.perms[k] = v
	}
	c.perms["sqs.DeleteMessageBatch"] = []string{"sqs:PurgeQueue"}
	if _, err := permissionTable(c, m); err == nil || !strings.Contains(err.Error(), "sqs:PurgeQueue has no reason") {
		t.Errorf("a permission without a reason: %v", err)
	}
	permissionWhy["sqs:PurgeQueue"] = "test"
	defer delete(permissionWhy, "sqs:PurgeQueue")
	changed, err := permissionTable(c, m)
	if err != nil || changed == table || !strings.Contains(changed, "`sqs:PurgeQueue`") {
		t.Errorf("the table does not follow the permission table: %v\n%s", err, changed)
	}

	doc := beginTable + table + endTable + "```hcl\n# terraform/aws/examples/basic/terraform.tfvars\n" +
		"vpc_id = \"vpc-1\"\nno_such_variable = 1\ndriver_flags = [\"--listen\", \"0.0.0.0:1\", \"--reset-limit\", \"5\"]\n```\n" +
		"terraform output driver_private_ip\nterraform output -raw no_such_output\n"
	got := checkDeployDoc(doc, filepath.Join("aws", "examples", "basic"), []string{"listen"}, []string{"listen", "reset-limit"})
	for _, want := range []string{
		"sets no_such_variable, which terraform/aws/examples/basic does not declare",
		"does not set gpu_ami_id, which terraform/aws/examples/basic requires",
		"driver_flags has --listen",
		"has no output no_such_output",
	} {
		if !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, want) }) {
			t.Errorf("no problem reported containing %q; got:\n%s", want, strings.Join(got, "\n"))
		}
	}
	if slices.ContainsFunc(got, func(s string) bool {
		return strings.Contains(s, "driver_private_ip") || strings.Contains(s, "reset-limit")
	}) {
		t.Errorf("a problem reported about what is right:\n%s", strings.Join(got, "\n"))
	}
}
