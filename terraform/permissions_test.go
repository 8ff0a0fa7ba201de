package terraform_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// cloud ties a provider package to its Terraform module: which SDK packages count as the
// cloud's API, what each SDK call needs, and how to read the module's grant.
type cloud struct {
	name     string
	pkg      string   // provider package, relative to the repository root
	sdks     []string // import-path prefixes of the SDK packages whose calls are API calls
	perms    map[string][]string
	policy   func(*module) ([]string, error)
	wantArgs []string // the driver's command line, flags and fixed values, in order
}

// The permission tables: SDK operation (as sdkOperations names it) -> what it needs. An entry
// with no permissions is a call that makes no request (Close). Operations the providers do not
// call yet may be listed; an operation they call must be.
var (
	awsPerms = map[string][]string{
		"autoscaling.DescribeAutoScalingGroups":      {"autoscaling:DescribeAutoScalingGroups"},
		"autoscaling.CompleteLifecycleAction":        {"autoscaling:CompleteLifecycleAction"},
		"autoscaling.RecordLifecycleActionHeartbeat": {"autoscaling:RecordLifecycleActionHeartbeat"},
		"ec2.DescribeInstances":                      {"ec2:DescribeInstances"},
		"ec2.DescribeInstanceTypes":                  {"ec2:DescribeInstanceTypes"},
		"ec2.DescribeSpotPriceHistory":               {"ec2:DescribeSpotPriceHistory"},
		"sqs.ReceiveMessage":                         {"sqs:ReceiveMessage"},
		"sqs.DeleteMessage":                          {"sqs:DeleteMessage"},
		// IAM has no action of its own for the batch call: DeleteMessage authorizes it.
		"sqs.DeleteMessageBatch":      {"sqs:DeleteMessage"},
		"sqs.ChangeMessageVisibility": {"sqs:ChangeMessageVisibility"},
		"sqs.GetQueueUrl":             {"sqs:GetQueueUrl"},
	}
	gcpPerms = map[string][]string{
		// listManagedInstances, zonal and regional, is authorized by the group's get.
		"compute.InstanceGroupManagersClient.ListManagedInstances":       {"compute.instanceGroupManagers.get"},
		"compute.RegionInstanceGroupManagersClient.ListManagedInstances": {"compute.instanceGroupManagers.get"},
		"compute.InstanceGroupManagersClient.Get":                        {"compute.instanceGroupManagers.get"},
		"compute.RegionInstanceGroupManagersClient.Get":                  {"compute.instanceGroupManagers.get"},
		"compute.InstancesClient.List":                                   {"compute.instances.list"},
		"compute.InstancesClient.AggregatedList":                         {"compute.instances.list"},
		"compute.InstancesClient.Get":                                    {"compute.instances.get"},
		"compute.InstanceGroupManagersClient.Close":                      {},
		"compute.RegionInstanceGroupManagersClient.Close":                {},
		"compute.InstancesClient.Close":                                  {},
	}
	azurePerms = map[string][]string{
		"armcompute.VirtualMachineScaleSetsClient.Get":            {"Microsoft.Compute/virtualMachineScaleSets/read"},
		"armcompute.VirtualMachineScaleSetVMsClient.NewListPager": {"Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read"},
		"armcompute.VirtualMachineScaleSetVMsClient.Get":          {"Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read"},
		// The scale set's NICs, listed under the scale set; docs/providers/azure.md names the action.
		"armnetwork.InterfacesClient.NewListVirtualMachineScaleSetNetworkInterfacesPager":   {"Microsoft.Network/networkInterfaces/read"},
		"armnetwork.InterfacesClient.NewListVirtualMachineScaleSetVMNetworkInterfacesPager": {"Microsoft.Network/networkInterfaces/read"},
	}
	// IBM Cloud IAM grants roles, not single actions, on resource types of a service: a
	// permission here is service/resource-type attribute/role, as a trusted profile policy
	// states it. Every call the provider makes is a read, which the Viewer role allows.
	ibmPerms = map[string][]string{
		"vpcv1.ListInstanceGroupsWithContext":           {"is/instanceGroupId/Viewer"},
		"vpcv1.GetInstanceGroupWithContext":             {"is/instanceGroupId/Viewer"},
		"vpcv1.ListInstanceGroupMembershipsWithContext": {"is/instanceGroupId/Viewer"},
		"vpcv1.ListInstancesWithContext":                {"is/instanceId/Viewer"},
		"vpcv1.GetInstanceWithContext":                  {"is/instanceId/Viewer"},
	}
)

// sdkOperations collects the SDK operations the non-test Go files of dir call, through its
// seam: a call X.f.M(...) where the struct field f is either an interface of the package whose
// method M takes an SDK type (AWS, IBM: "autoscaling.DescribeAutoScalingGroups"), or an SDK
// client type itself (GCP, Azure: "compute.InstancesClient.List"). sdks are the import-path
// prefixes of the SDK packages. It returns each operation with the places that call it.
func sdkOperations(dir string, sdks []string) (map[string][]string, error) {
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no Go files", dir)
	}
	isSDK := func(f *ast.File, local string) bool {
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			name := filepath.Base(path)
			if imp.Name != nil {
				name = imp.Name.Name
			} else if strings.HasPrefix(name, "v") && strings.Trim(name[1:], "0123456789") == "" {
				name = filepath.Base(filepath.Dir(path)) // a major-version suffix
			} else if name == "apiv1" {
				name = filepath.Base(filepath.Dir(path))
			}
			if name != local {
				continue
			}
			for _, p := range sdks {
				if strings.HasPrefix(path, p) {
					return true
				}
			}
		}
		return false
	}
	// The seam: interfaces whose methods take an SDK type (method -> "pkg"), then the struct
	// fields whose type is such an interface or an SDK type.
	seams := map[string]map[string]string{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			it, ok := ts.Type.(*ast.InterfaceType)
			if !ok {
				return true
			}
			for _, m := range it.Methods.List {
				ft, ok := m.Type.(*ast.FuncType)
				if !ok || len(m.Names) == 0 {
					continue
				}
				for _, p := range ft.Params.List {
					if sel, ok := deref(p.Type).(*ast.SelectorExpr); ok {
						if x, ok := sel.X.(*ast.Ident); ok && isSDK(f, x.Name) {
							if seams[ts.Name.Name] == nil {
								seams[ts.Name.Name] = map[string]string{}
							}
							seams[ts.Name.Name][m.Names[0].Name] = x.Name
						}
					}
				}
			}
			return true
		})
	}
	fields := map[string]string{} // field name -> "iface:Name" or "sdk:pkg.Type"
	var conflict []string
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			st, ok := n.(*ast.StructType)
			if !ok {
				return true
			}
			for _, fld := range st.Fields.List {
				var kind string
				switch t := deref(fld.Type).(type) {
				case *ast.Ident:
					if seams[t.Name] != nil {
						kind = "iface:" + t.Name
					}
				case *ast.SelectorExpr:
					if x, ok := t.X.(*ast.Ident); ok && isSDK(f, x.Name) {
						kind = "sdk:" + x.Name + "." + t.Sel.Name
					}
				}
				if kind == "" {
					continue
				}
				for _, name := range fld.Names {
					if old, ok := fields[name.Name]; ok && old != kind {
						conflict = append(conflict, name.Name)
					}
					fields[name.Name] = kind
				}
			}
			return true
		})
	}
	if len(conflict) > 0 {
		return nil, fmt.Errorf("%s: struct fields %v have different types in different structs; the collector cannot tell their calls apart", dir, conflict)
	}

	ops := map[string][]string{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			method, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			field, ok := method.X.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			kind := fields[field.Sel.Name]
			op := ""
			switch {
			case strings.HasPrefix(kind, "sdk:"):
				op = strings.TrimPrefix(kind, "sdk:") + "." + method.Sel.Name
			case strings.HasPrefix(kind, "iface:"):
				if pkg, ok := seams[strings.TrimPrefix(kind, "iface:")][method.Sel.Name]; ok {
					op = pkg + "." + method.Sel.Name
				}
			}
			if op != "" {
				pos := fset.Position(call.Pos())
				ops[op] = append(ops[op], fmt.Sprintf("%s:%d", filepath.Base(pos.Filename), pos.Line))
			}
			return true
		})
	}
	return ops, nil
}

func deref(e ast.Expr) ast.Expr {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		default:
			return e
		}
	}
}

// comparePermissions compares what the code's operations need (through table) with what the
// policy grants. Each problem names the permission, and for a missing one the calls needing it.
func comparePermissions(ops map[string][]string, table map[string][]string, granted []string) (missing, extra, unknown []string) {
	need := map[string][]string{} // permission -> operations
	for _, op := range sortedKeys(ops) {
		perms, ok := table[op]
		if !ok {
			unknown = append(unknown, fmt.Sprintf("%s (called at %s)", op, strings.Join(ops[op], ", ")))
			continue
		}
		for _, p := range perms {
			need[p] = append(need[p], op)
		}
	}
	have := map[string]bool{}
	for _, p := range granted {
		have[p] = true
	}
	for _, p := range sortedKeys(need) {
		if !have[p] {
			missing = append(missing, fmt.Sprintf("%s (needed by %s)", p, strings.Join(need[p], ", ")))
		}
	}
	for _, p := range sortedKeys(have) {
		if need[p] == nil {
			extra = append(extra, p)
		}
	}
	return missing, extra, unknown
}

// The policies, read from the modules.

// awsPolicy reads the actions of data "aws_iam_policy_document" "driver".
func awsPolicy(m *module) ([]string, error) {
	b := m.data["aws_iam_policy_document.driver"]
	if b == nil {
		return nil, fmt.Errorf(`%s: no data "aws_iam_policy_document" "driver"`, m.dir)
	}
	var out []string
	for _, s := range b.Body.Blocks {
		if s.Type != "statement" {
			continue
		}
		if e, err := attrString(s.Body, "effect"); err != nil || (e != "" && e != "Allow") {
			return nil, fmt.Errorf("%s: only Allow statements are expected (effect %q, %v)", s.DefRange(), e, err)
		}
		if s.Body.Attributes["not_actions"] != nil {
			return nil, fmt.Errorf("%s: not_actions grants everything else", s.DefRange())
		}
		acts, err := attrStrings(s.Body, "actions")
		if err != nil {
			return nil, err
		}
		for _, a := range acts {
			if strings.Contains(a, "*") {
				return nil, fmt.Errorf("%s: wildcard action %q", s.DefRange(), a)
			}
		}
		out = append(out, acts...)
	}
	return out, nil
}

// gcpPolicy reads the permissions of resource "google_project_iam_custom_role" "driver".
func gcpPolicy(m *module) ([]string, error) {
	b := m.resources["google_project_iam_custom_role.driver"]
	if b == nil {
		return nil, fmt.Errorf(`%s: no resource "google_project_iam_custom_role" "driver"`, m.dir)
	}
	return attrStrings(b.Body, "permissions")
}

// azurePolicy reads the actions of resource "azurerm_role_definition" "driver".
func azurePolicy(m *module) ([]string, error) {
	b := m.resources["azurerm_role_definition.driver"]
	if b == nil {
		return nil, fmt.Errorf(`%s: no resource "azurerm_role_definition" "driver"`, m.dir)
	}
	var out []string
	for _, p := range b.Body.Blocks {
		if p.Type != "permissions" {
			continue
		}
		for _, name := range []string{"data_actions", "not_actions", "not_data_actions"} {
			if p.Body.Attributes[name] != nil {
				return nil, fmt.Errorf("%s: the driver's role needs no %s", p.DefRange(), name)
			}
		}
		acts, err := attrStrings(p.Body, "actions")
		if err != nil {
			return nil, err
		}
		out = append(out, acts...)
	}
	return out, nil
}

// ibmPolicy reads every resource "ibm_iam_trusted_profile_policy": service/attribute/role for
// each role it grants on each resource-type attribute of its resources block.
func ibmPolicy(m *module) ([]string, error) {
	var out []string
	for _, key := range sortedKeys(m.resources) {
		if !strings.HasPrefix(key, "ibm_iam_trusted_profile_policy.") {
			continue
		}
		b := m.resources[key]
		roles, err := attrStrings(b.Body, "roles")
		if err != nil {
			return nil, err
		}
		for _, r := range b.Body.Blocks {
			if r.Type != "resources" {
				continue
			}
			svc, err := attrString(r.Body, "service")
			if err != nil {
				return nil, err
			}
			var obj *hclsyntax.ObjectConsExpr
			if a := r.Body.Attributes["attributes"]; a != nil {
				obj, _ = a.Expr.(*hclsyntax.ObjectConsExpr)
			}
			if obj == nil || len(obj.Items) != 1 {
				return nil, fmt.Errorf("%s: want attributes = { <resource type>Id = ... }, one resource type per policy", r.DefRange())
			}
			attr := hcl.ExprAsKeyword(obj.Items[0].KeyExpr)
			for _, role := range roles {
				out = append(out, svc+"/"+attr+"/"+role)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf(`%s: no resource "ibm_iam_trusted_profile_policy"`, m.dir)
	}
	return out, nil
}

func attrString(b *hclsyntax.Body, name string) (string, error) {
	a := b.Attributes[name]
	if a == nil {
		return "", nil
	}
	v, diags := a.Expr.Value(nil)
	if diags.HasErrors() || v.Type() != cty.String || v.IsNull() {
		return "", fmt.Errorf("%s: %s must be a literal string", a.SrcRange, name)
	}
	return v.AsString(), nil
}

// TestAWSReadmeListsEveryGrantedAction: terraform/aws/README.md and docs/terraform.md name every
// action the module's policy grants the driver, so that the docs an operator reviews match.
func TestAWSReadmeListsEveryGrantedAction(t *testing.T) {
	main, err := os.ReadFile(filepath.Join("aws", "main.tf"))
	if err != nil {
		t.Fatal(err)
	}
	// The driver's role is its own section of main.tf; the queue's policy (EventBridge may send)
	// and the role's trust policy (EC2 may take it) grant others.
	_, section, ok := strings.Cut(string(main), "# --- The driver's IAM role")
	if !ok {
		t.Fatal("aws/main.tf has no section '# --- The driver's IAM role'")
	}
	if i := strings.Index(section, "\n# ---"); i >= 0 {
		section = section[:i]
	}
	var granted []string
	for _, m := range regexp.MustCompile(`actions\s*=\s*\[([^\]]*)\]`).FindAllStringSubmatch(section, -1) {
		for _, a := range regexp.MustCompile(`"([a-z0-9]+:[A-Za-z]+)"`).FindAllStringSubmatch(m[1], -1) {
			if a[1] != "sts:AssumeRole" {
				granted = append(granted, a[1])
			}
		}
	}
	if len(granted) < 5 {
		t.Fatalf("found %d granted actions in aws/main.tf (%v): the pattern no longer matches the policy", len(granted), granted)
	}
	for _, doc := range []string{filepath.Join("aws", "README.md"), filepath.Join("..", "docs", "terraform.md")} {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range granted {
			if !strings.Contains(string(text), "`"+a+"`") {
				t.Errorf("%s does not name %s, which aws/main.tf grants", doc, a)
			}
		}
	}
}
