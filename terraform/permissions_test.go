package terraform_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
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
	policy   func(*module) (granted, steering []string, err error)
	steering []string // the SDK operations the provider calls only to steer its group (--manage-capacity)
	wantArgs []string // the driver's command line, flags and fixed values, in order
}

// manageCapacity is the shared module's output that says driver_flags has --manage-capacity,
// as each cloud module reads it: a grant whose count or for_each depends on it is made only
// for a driver that steers its group.
const manageCapacity = "module.job.manage_capacity"

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
		// Steering the group (--manage-capacity). UpdateAutoScalingGroup only lowers MinSize
		// and sets DesiredCapacity: no launch template or role changes, so neither
		// ec2:RunInstances nor iam:PassRole.
		"autoscaling.SetDesiredCapacity":                  {"autoscaling:SetDesiredCapacity"},
		"autoscaling.UpdateAutoScalingGroup":              {"autoscaling:UpdateAutoScalingGroup"},
		"autoscaling.TerminateInstanceInAutoScalingGroup": {"autoscaling:TerminateInstanceInAutoScalingGroup"},
		"autoscaling.DescribeScalingActivities":           {"autoscaling:DescribeScalingActivities"},
		// The driver's claim on its group (providers.Claimer): one tag of the group, written
		// and removed; its read is DescribeAutoScalingGroups, which brings the group's tags.
		"autoscaling.CreateOrUpdateTags": {"autoscaling:CreateOrUpdateTags"},
		"autoscaling.DeleteTags":         {"autoscaling:DeleteTags"},
		// elasticd check (providers/aws/check.go), read-only: who the caller is (which needs
		// no permission), its role and its permissions asked of IAM, the notice queue's ARN and
		// policy, and the EventBridge rules that send to it.
		"sts.GetCallerIdentity":             {},
		"iam.GetRole":                       {"iam:GetRole"},
		"iam.SimulatePrincipalPolicy":       {"iam:SimulatePrincipalPolicy"},
		"sqs.GetQueueAttributes":            {"sqs:GetQueueAttributes"},
		"eventbridge.ListRuleNamesByTarget": {"events:ListRuleNamesByTarget"},
		"eventbridge.DescribeRule":          {"events:DescribeRule"},
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
		// Steering the group (--manage-capacity). resize and recreateInstances return an
		// operation that the provider polls (op.Poll, zoneOperations.get or
		// regionOperations.get, which the collector does not see as a call of its own):
		// reading it needs its own permission, which the call that started it brings.
		"compute.InstanceGroupManagersClient.Resize":                  {"compute.instanceGroupManagers.update", "compute.zoneOperations.get"},
		"compute.RegionInstanceGroupManagersClient.Resize":            {"compute.instanceGroupManagers.update", "compute.regionOperations.get"},
		"compute.InstanceGroupManagersClient.RecreateInstances":       {"compute.instanceGroupManagers.update", "compute.zoneOperations.get"},
		"compute.RegionInstanceGroupManagersClient.RecreateInstances": {"compute.instanceGroupManagers.update", "compute.regionOperations.get"},
		// listErrors, like listManagedInstances, is authorized by the group's get.
		"compute.InstanceGroupManagersClient.ListErrors":       {"compute.instanceGroupManagers.get"},
		"compute.RegionInstanceGroupManagersClient.ListErrors": {"compute.instanceGroupManagers.get"},
		// Regional autoscalers have no permissions of their own: compute.autoscalers.* covers both.
		"compute.AutoscalersClient.Get":         {"compute.autoscalers.get"},
		"compute.RegionAutoscalersClient.Get":   {"compute.autoscalers.get"},
		"compute.AutoscalersClient.Close":       {},
		"compute.RegionAutoscalersClient.Close": {},
	}
	azurePerms = map[string][]string{
		"armcompute.VirtualMachineScaleSetsClient.Get":            {"Microsoft.Compute/virtualMachineScaleSets/read"},
		"armcompute.VirtualMachineScaleSetVMsClient.NewListPager": {"Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read"},
		"armcompute.VirtualMachineScaleSetVMsClient.Get":          {"Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read"},
		// The scale set's NICs, listed under the scale set; docs/providers/azure.md names the action.
		"armnetwork.InterfacesClient.NewListVirtualMachineScaleSetNetworkInterfacesPager":   {"Microsoft.Network/networkInterfaces/read"},
		"armnetwork.InterfacesClient.NewListVirtualMachineScaleSetVMNetworkInterfacesPager": {"Microsoft.Network/networkInterfaces/read"},
		// elasticd check: the caller's own permissions on the scale set (Permissions - List For
		// Resource), which Reader and every built-in role include.
		"armauthorization.PermissionsClient.NewListForResourcePager": {"Microsoft.Authorization/permissions/read"},
		// Steering the scale set (--manage-capacity): the capacity, and the driver's claim on
		// the set (one of its tags), are PATCHes of the scale set (its write); deleting instances is the scale set's delete/action ("Deletes the
		// instances"), not the VMs' delete. Their long-running operations are read by the
		// caller that started them, without an action of their own (docs/providers/azure.md).
		"armcompute.VirtualMachineScaleSetsClient.BeginUpdate":          {"Microsoft.Compute/virtualMachineScaleSets/write"},
		"armcompute.VirtualMachineScaleSetsClient.BeginDeleteInstances": {"Microsoft.Compute/virtualMachineScaleSets/delete/action"},
	}
	// IBM Cloud IAM grants roles, not single actions, on resource types of a service: a
	// permission here is service/resource-type attribute/role, as a trusted profile policy
	// states it. Reads need the Viewer role; the changes of --manage-capacity the Editor role.
	ibmPerms = map[string][]string{
		"vpcv1.ListInstanceGroupsWithContext":           {"is/instanceGroupId/Viewer"},
		"vpcv1.GetInstanceGroupWithContext":             {"is/instanceGroupId/Viewer"},
		"vpcv1.ListInstanceGroupMembershipsWithContext": {"is/instanceGroupId/Viewer"},
		"vpcv1.ListInstanceGroupManagersWithContext":    {"is/instanceGroupId/Viewer"},
		"vpcv1.ListInstancesWithContext":                {"is/instanceId/Viewer"},
		"vpcv1.GetInstanceWithContext":                  {"is/instanceId/Viewer"},
		// The group's managers and memberships are parts of the group: IBM lists one action,
		// is.instance-group.instance-group.update, for changing any of them (Editor).
		"vpcv1.UpdateInstanceGroupWithContext":        {"is/instanceGroupId/Editor"},
		"vpcv1.UpdateInstanceGroupManagerWithContext": {"is/instanceGroupId/Editor"},
		// Deleting a membership deletes its instance too (delete_instance_on_membership_delete),
		// which docs/providers/ibm.md says needs Editor on the instance as well.
		"vpcv1.DeleteInstanceGroupMembershipWithContext": {"is/instanceGroupId/Editor", "is/instanceId/Editor"},
	}
)

// The operations each provider calls only to steer its group (--manage-capacity), read from
// providers/<cloud>/capacity.go and the providers' docs: what they need that no other call
// needs is granted only when driver_flags has --manage-capacity.
var (
	awsSteering = []string{
		"autoscaling.SetDesiredCapacity", "autoscaling.UpdateAutoScalingGroup",
		"autoscaling.TerminateInstanceInAutoScalingGroup", "autoscaling.DescribeScalingActivities",
		"autoscaling.CreateOrUpdateTags", "autoscaling.DeleteTags",
	}
	gcpSteering = []string{
		"compute.InstanceGroupManagersClient.Resize", "compute.RegionInstanceGroupManagersClient.Resize",
		"compute.InstanceGroupManagersClient.RecreateInstances", "compute.RegionInstanceGroupManagersClient.RecreateInstances",
		"compute.InstanceGroupManagersClient.ListErrors", "compute.RegionInstanceGroupManagersClient.ListErrors",
		"compute.AutoscalersClient.Get", "compute.RegionAutoscalersClient.Get",
	}
	azureSteering = []string{
		"armcompute.VirtualMachineScaleSetsClient.BeginUpdate", "armcompute.VirtualMachineScaleSetsClient.BeginDeleteInstances",
	}
	ibmSteering = []string{
		"vpcv1.GetInstanceGroupWithContext", "vpcv1.ListInstanceGroupManagersWithContext", "vpcv1.UpdateInstanceGroupWithContext",
		"vpcv1.UpdateInstanceGroupManagerWithContext", "vpcv1.DeleteInstanceGroupMembershipWithContext",
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
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
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
		// A request the code makes itself, as the SDK would, says so: "//elasticd:sdkcall
		// pkg.Method" where it is made (providers/ibm/instances.go).
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				if rest, ok := strings.CutPrefix(c.Text, "//elasticd:sdkcall "); ok {
					op, _, _ := strings.Cut(strings.TrimSpace(rest), " ")
					pos := fset.Position(c.Pos())
					ops[op] = append(ops[op], fmt.Sprintf("%s:%d", filepath.Base(pos.Filename), pos.Line))
				}
			}
		}
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

// compareSteering checks which grants wait for --manage-capacity: exactly the permissions
// that only the steering operations need. One that another call needs too must not wait for
// the flag (discovery would be refused without it); one that only steering needs must.
func compareSteering(ops map[string][]string, table map[string][]string, steeringOps, steering []string) []string {
	var bad []string
	other, only := map[string]bool{}, map[string][]string{}
	for _, op := range steeringOps {
		if ops[op] == nil {
			bad = append(bad, fmt.Sprintf("%s is listed as a steering call, but the provider does not call it", op))
		}
	}
	for _, op := range sortedKeys(ops) {
		if !slices.Contains(steeringOps, op) {
			for _, p := range table[op] {
				other[p] = true
			}
		}
	}
	for _, op := range steeringOps {
		for _, p := range table[op] {
			if !other[p] {
				only[p] = append(only[p], op)
			}
		}
	}
	for _, p := range sortedKeys(only) {
		if !slices.Contains(steering, p) {
			bad = append(bad, fmt.Sprintf("grants %s always, which only --manage-capacity needs (%s): make it depend on %s", p, strings.Join(only[p], ", "), manageCapacity))
		}
	}
	for _, p := range slices.Compact(slices.Sorted(slices.Values(steering))) {
		if other[p] {
			bad = append(bad, fmt.Sprintf("grants %s only with --manage-capacity, but the driver needs it without", p))
		}
	}
	return bad
}

// The policies, read from the modules. Each returns every permission granted to the driver
// when driver_flags has --manage-capacity (granted), and those of them granted only then
// (steering): the grants whose count or for_each depends on module.job.manage_capacity.

// onlyWhenSteering reports whether a grant's count or for_each depends on manageCapacity, and
// refuses one that depends on anything else: the test could not tell when it is made.
func onlyWhenSteering(b *hclsyntax.Block, attr string) (bool, error) {
	a := b.Body.Attributes[attr]
	if a == nil {
		return false, nil
	}
	steering := false
	for _, v := range a.Expr.Variables() {
		switch ref := traversalString(v); {
		case strings.HasPrefix(ref, manageCapacity):
			steering = true
		case ref == "local.profile" || ref == "local.release_upload":
		case ref == fallbackSwitch:
			// A grant on the AWS fallback group: checkFallbackGrants (fallback_test.go) checks
			// that it is made on that group only, with --manage-capacity too.
		default:
			return false, fmt.Errorf("%s: %s depends on %s: a grant is made always or with %s only", a.SrcRange, attr, ref, manageCapacity)
		}
	}
	return steering, nil
}

// awsPolicy reads the actions of data "aws_iam_policy_document" "driver": its statements, and
// its dynamic statements made with --manage-capacity.
func awsPolicy(m *module) (granted, steering []string, err error) {
	b := m.data["aws_iam_policy_document.driver"]
	if b == nil {
		return nil, nil, fmt.Errorf(`%s: no data "aws_iam_policy_document" "driver"`, m.dir)
	}
	for _, s := range b.Body.Blocks {
		body, when := s.Body, false
		switch {
		case s.Type == "statement":
		case s.Type == "dynamic" && len(s.Labels) == 1 && s.Labels[0] == "statement":
			if when, err = onlyWhenSteering(s, "for_each"); err != nil {
				return nil, nil, err
			}
			if !when {
				return nil, nil, fmt.Errorf("%s: a dynamic statement that does not depend on %s", s.DefRange(), manageCapacity)
			}
			body = nil
			for _, c := range s.Body.Blocks {
				if c.Type == "content" {
					body = c.Body
				}
			}
			if body == nil {
				return nil, nil, fmt.Errorf("%s: a dynamic statement without content", s.DefRange())
			}
		default:
			continue
		}
		if e, err := attrString(body, "effect"); err != nil || (e != "" && e != "Allow") {
			return nil, nil, fmt.Errorf("%s: only Allow statements are expected (effect %q, %v)", s.DefRange(), e, err)
		}
		if body.Attributes["not_actions"] != nil {
			return nil, nil, fmt.Errorf("%s: not_actions grants everything else", s.DefRange())
		}
		acts, err := attrStrings(body, "actions")
		if err != nil {
			return nil, nil, err
		}
		for _, a := range acts {
			if strings.Contains(a, "*") {
				return nil, nil, fmt.Errorf("%s: wildcard action %q", s.DefRange(), a)
			}
		}
		granted = append(granted, acts...)
		if when {
			steering = append(steering, acts...)
		}
	}
	return granted, steering, nil
}

// gcpPolicy reads the permissions of every resource "google_project_iam_custom_role" (the
// driver's; its count says when it is made), each bound to the driver's service account.
func gcpPolicy(m *module) (granted, steering []string, err error) {
	for _, key := range sortedKeys(m.resources) {
		name, ok := strings.CutPrefix(key, "google_project_iam_custom_role.")
		if !ok {
			continue
		}
		b := m.resources[key]
		when, err := onlyWhenSteering(b, "count")
		if err != nil {
			return nil, nil, err
		}
		if !bindsRole(m, "google_project_iam_member", key) {
			return nil, nil, fmt.Errorf("%s: no google_project_iam_member binds the role %s", m.dir, name)
		}
		perms, err := attrStrings(b.Body, "permissions")
		if err != nil {
			return nil, nil, err
		}
		granted = append(granted, perms...)
		if when {
			steering = append(steering, perms...)
		}
	}
	if len(granted) == 0 {
		return nil, nil, fmt.Errorf(`%s: no resource "google_project_iam_custom_role"`, m.dir)
	}
	return granted, steering, nil
}

// bindsRole reports whether a resource of type kind in m refers to the role resource key.
func bindsRole(m *module, kind, key string) bool {
	for _, k := range sortedKeys(m.resources) {
		if !strings.HasPrefix(k, kind+".") {
			continue
		}
		for _, a := range m.resources[k].Body.Attributes {
			for _, v := range a.Expr.Variables() {
				if strings.HasPrefix(traversalString(v), key) {
					return true
				}
			}
		}
	}
	return false
}

// azurePolicy reads the actions of every resource "azurerm_role_definition" (its count says
// when it is made), each assigned to the driver's identity.
func azurePolicy(m *module) (granted, steering []string, err error) {
	for _, key := range sortedKeys(m.resources) {
		if !strings.HasPrefix(key, "azurerm_role_definition.") {
			continue
		}
		b := m.resources[key]
		when, err := onlyWhenSteering(b, "count")
		if err != nil {
			return nil, nil, err
		}
		if !bindsRole(m, "azurerm_role_assignment", key) {
			return nil, nil, fmt.Errorf("%s: no azurerm_role_assignment assigns %s", m.dir, key)
		}
		for _, p := range b.Body.Blocks {
			if p.Type != "permissions" {
				continue
			}
			for _, name := range []string{"data_actions", "not_actions", "not_data_actions"} {
				if p.Body.Attributes[name] != nil {
					return nil, nil, fmt.Errorf("%s: the driver's role needs no %s", p.DefRange(), name)
				}
			}
			acts, err := attrStrings(p.Body, "actions")
			if err != nil {
				return nil, nil, err
			}
			granted = append(granted, acts...)
			if when {
				steering = append(steering, acts...)
			}
		}
	}
	if len(granted) == 0 {
		return nil, nil, fmt.Errorf(`%s: no resource "azurerm_role_definition"`, m.dir)
	}
	return granted, steering, nil
}

// ibmPolicy reads every resource "ibm_iam_trusted_profile_policy": service/attribute/role for
// each role it grants on each resource-type attribute of its resources block.
func ibmPolicy(m *module) (granted, steering []string, err error) {
	for _, key := range sortedKeys(m.resources) {
		if !strings.HasPrefix(key, "ibm_iam_trusted_profile_policy.") {
			continue
		}
		b := m.resources[key]
		when, err := onlyWhenSteering(b, "count")
		if err != nil {
			return nil, nil, err
		}
		roles, err := attrStrings(b.Body, "roles")
		if err != nil {
			return nil, nil, err
		}
		for _, r := range b.Body.Blocks {
			if r.Type != "resources" {
				continue
			}
			svc, err := attrString(r.Body, "service")
			if err != nil {
				return nil, nil, err
			}
			var obj *hclsyntax.ObjectConsExpr
			if a := r.Body.Attributes["attributes"]; a != nil {
				obj, _ = a.Expr.(*hclsyntax.ObjectConsExpr)
			}
			if obj == nil || len(obj.Items) != 1 {
				return nil, nil, fmt.Errorf("%s: want attributes = { <resource type>Id = ... }, one resource type per policy", r.DefRange())
			}
			attr := hcl.ExprAsKeyword(obj.Items[0].KeyExpr)
			for _, role := range roles {
				granted = append(granted, svc+"/"+attr+"/"+role)
				if when {
					steering = append(steering, svc+"/"+attr+"/"+role)
				}
			}
		}
	}
	if len(granted) == 0 {
		return nil, nil, fmt.Errorf(`%s: no resource "ibm_iam_trusted_profile_policy"`, m.dir)
	}
	return granted, steering, nil
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
