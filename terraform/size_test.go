package terraform_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// sizeAttrs are, for each resource type of a cloud's GPU group, the attributes that the cloud
// changes once the group exists (interruptions, replacements) and that the driver sets with
// --manage-capacity: Terraform gives the group its first size and must not put it back on the
// next apply. The AWS group's minimum too, which the driver lowers to go below it; IBM's
// instance group manager's switch, which the driver turns off to set the membership count.
var sizeAttrs = map[string][]string{
	"aws_autoscaling_group":                          {"desired_capacity", "min_size"},
	"google_compute_instance_group_manager":          {"target_size"},
	"google_compute_region_instance_group_manager":   {"target_size"},
	"azurerm_linux_virtual_machine_scale_set":        {"instances"},
	"azurerm_windows_virtual_machine_scale_set":      {"instances"},
	"azurerm_orchestrated_virtual_machine_scale_set": {"instances"},
	"ibm_is_instance_group":                          {"instance_count"},
	"ibm_is_instance_group_manager":                  {"enable_manager"},
}

// checkGroupSizes reports each group resource of m whose lifecycle does not ignore the
// changes of its size attributes, and a module without a group.
func checkGroupSizes(m *module) []string {
	var bad []string
	groups := 0
	for _, key := range sortedKeys(m.resources) {
		typ, _, _ := strings.Cut(key, ".")
		want := sizeAttrs[typ]
		if want == nil {
			continue
		}
		groups++
		b := m.resources[key]
		ignored, err := ignoredChanges(b)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		for _, a := range want {
			if !slices.Contains(ignored, a) {
				bad = append(bad, fmt.Sprintf("%s: %s does not ignore changes of %s, which the driver sets: the next apply would put it back (lifecycle { ignore_changes = [%s] })",
					b.DefRange(), key, a, strings.Join(want, ", ")))
			}
		}
	}
	if groups == 0 {
		bad = append(bad, fmt.Sprintf("%s has no GPU group resource (%v)", m.dir, sortedKeys(sizeAttrs)))
	}
	return bad
}

// ignoredChanges reads the attribute names of b's lifecycle { ignore_changes = [...] }.
// `all` is refused: it would also keep a new launch template or image from the group.
func ignoredChanges(b *hclsyntax.Block) ([]string, error) {
	var out []string
	for _, l := range b.Body.Blocks {
		if l.Type != "lifecycle" {
			continue
		}
		a := l.Body.Attributes["ignore_changes"]
		if a == nil {
			continue
		}
		if hcl.ExprAsKeyword(a.Expr) == "all" {
			return nil, fmt.Errorf("%s: ignore_changes = all also ignores the group's template: name the size's attributes", a.SrcRange)
		}
		exprs, diags := hcl.ExprList(a.Expr)
		if diags.HasErrors() {
			return nil, fmt.Errorf("%s: ignore_changes must be a list of attribute names", a.SrcRange)
		}
		for _, e := range exprs {
			if name := hcl.ExprAsKeyword(e); name != "" {
				out = append(out, name)
			}
		}
	}
	return out, nil
}

// TestGroupsLeaveTheirSizeToTheDriver: each cloud's GPU group ignores the changes of its size,
// so that `terraform apply` neither reports drift nor resets what the driver set.
func TestGroupsLeaveTheirSizeToTheDriver(t *testing.T) {
	for _, c := range clouds {
		t.Run(c.name, func(t *testing.T) {
			m, err := loadModule(c.name)
			if err != nil {
				t.Fatal(err)
			}
			for _, msg := range checkGroupSizes(m) {
				t.Error(msg)
			}
		})
	}
}

// TestGroupSizeCheckCanFail: a group that ignores nothing, one that ignores part of its size,
// one that ignores all, and a module without a group are each reported; a group that ignores
// its size and more is not.
func TestGroupSizeCheckCanFail(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "main.tf", `resource "aws_autoscaling_group" "none" {
  min_size = 0
}

resource "aws_autoscaling_group" "part" {
  lifecycle {
    ignore_changes = [desired_capacity]
  }
}

resource "google_compute_instance_group_manager" "all" {
  lifecycle {
    ignore_changes = all
  }
}

resource "ibm_is_instance_group" "right" {
  lifecycle {
    ignore_changes = [tags, instance_count]
  }
}
`)
	m, err := loadModule(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := checkGroupSizes(m)
	for _, want := range []string{
		"aws_autoscaling_group.none does not ignore changes of desired_capacity",
		"aws_autoscaling_group.none does not ignore changes of min_size",
		"aws_autoscaling_group.part does not ignore changes of min_size",
		"ignore_changes = all also ignores",
	} {
		if !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, want) }) {
			t.Errorf("no problem reported containing %q; got:\n%s", want, strings.Join(got, "\n"))
		}
	}
	if len(got) != 4 {
		t.Errorf("%d problems, want 4:\n%s", len(got), strings.Join(got, "\n"))
	}

	empty := t.TempDir()
	write(t, empty, "main.tf", "resource \"aws_instance\" \"driver\" {}\n")
	if m, err = loadModule(empty); err != nil {
		t.Fatal(err)
	}
	if got := checkGroupSizes(m); len(got) != 1 || !strings.Contains(got[0], "has no GPU group resource") {
		t.Errorf("a module without a group: %q", got)
	}
}
