package terraform_test

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// src is the source text of an expression of module m.
func (m *module) src(e hclsyntax.Expression) string {
	r := e.Range()
	return string(m.files[filepath.Base(r.Filename)][r.Start.Byte:r.End.Byte])
}

// refersTo lists the blocks ("type.name" of resources and data sources) whose bodies refer to
// the resource or data source target.
func (m *module) refersTo(target string) []string {
	var out []string
	for _, set := range []map[string]*hclsyntax.Block{m.resources, m.data} {
		for _, key := range sortedKeys(set) {
			found := false
			hclsyntax.VisitAll(set[key].Body, func(n hclsyntax.Node) hcl.Diagnostics {
				if e, ok := n.(*hclsyntax.ScopeTraversalExpr); ok {
					s := traversalString(e.Traversal)
					if s == target || strings.HasPrefix(s, target+".") || strings.HasPrefix(s, target+"[") || strings.HasPrefix(s, "data."+target) {
						found = true
					}
				}
				return nil
			})
			if found {
				out = append(out, key)
			}
		}
	}
	return out
}

// gated reports whether block b exists only with elasticd_release_path (its count or
// for_each reads var.elasticd_release_path, directly or through locals).
func (m *module) gated(b *hclsyntax.Block) bool {
	for _, meta := range []string{"count", "for_each"} {
		if a := b.Body.Attributes[meta]; a != nil && m.reads(a.Expr, "elasticd_release_path", map[string]bool{}) {
			return true
		}
	}
	return false
}

// releaseFetch is the fetch method each cloud module passes for an uploaded release ("" for a
// cloud that takes a URL only).
var releaseFetch = map[string]string{"aws": "s3", "gcp": "gcs", "azure": "azure-blob", "ibm": ""}

// checkRelease reports what in cloud module m grants more than reading the one uploaded
// release, exists without elasticd_release_path, or passes the shared module a wrong fetch.
func checkRelease(cloudName string, m *module) []string {
	var bad []string
	if releaseFetch[cloudName] == "" {
		if v := m.variables["elasticd_release_path"]; v != nil {
			bad = append(bad, fmt.Sprintf("%s: %s uploads no release, so it must not take elasticd_release_path", v.DefRange(), cloudName))
		}
		if v := m.variables["elasticd_release_url"]; v == nil || v.Body.Attributes["default"] != nil {
			bad = append(bad, fmt.Sprintf("%s: elasticd_release_url must be required: it is the only way to give %s a release", m.dir, cloudName))
		}
		return bad
	}
	if m.variables["elasticd_release_path"] == nil {
		return []string{fmt.Sprintf("%s has no variable elasticd_release_path", m.dir)}
	}
	// Every resource that serves the upload exists only with it.
	for _, set := range []map[string]*hclsyntax.Block{m.resources, m.data} {
		for _, key := range sortedKeys(set) {
			if strings.HasSuffix(key, ".release") || strings.HasSuffix(key, "_release") || key == "aws_iam_role.gpu" || key == "aws_iam_instance_profile.gpu" {
				if !m.gated(set[key]) {
					bad = append(bad, fmt.Sprintf("%s: %s exists without elasticd_release_path", set[key].DefRange(), key))
				}
			}
		}
	}
	// The object the shared module is told about.
	call := ""
	for _, name := range sortedKeys(m.modules) {
		if m.modules[name].Body.Attributes["elasticd_release_object"] != nil {
			call = name
		}
	}
	if call == "" {
		bad = append(bad, fmt.Sprintf("%s passes no elasticd_release_object", m.dir))
	} else if src := m.src(m.modules[call].Body.Attributes["elasticd_release_object"].Expr); !regexp.MustCompile(`\bfetch\s*=\s*"` + releaseFetch[cloudName] + `"`).MatchString(src) {
		bad = append(bad, fmt.Sprintf("%s: elasticd_release_object must fetch %q: %s", m.dir, releaseFetch[cloudName], src))
	}

	switch cloudName {
	case "aws":
		doc := m.data["aws_iam_policy_document.release"]
		if doc == nil {
			return append(bad, fmt.Sprintf(`%s: no data "aws_iam_policy_document" "release"`, m.dir))
		}
		for _, s := range doc.Body.Blocks {
			if s.Type != "statement" {
				continue
			}
			acts, err := attrStrings(s.Body, "actions")
			if err != nil || !slices.Equal(acts, []string{"s3:GetObject"}) {
				bad = append(bad, fmt.Sprintf("%s: the release's policy grants %q (%v), want only s3:GetObject", s.DefRange(), acts, err))
			}
			for _, a := range []string{"not_actions", "not_resources", "effect", "principals"} {
				if s.Body.Attributes[a] != nil {
					bad = append(bad, fmt.Sprintf("%s: the release's statement must not set %s", s.DefRange(), a))
				}
			}
			res := s.Body.Attributes["resources"]
			if res == nil {
				bad = append(bad, fmt.Sprintf("%s: the release's statement names no resource", s.DefRange()))
				continue
			}
			tup, ok := res.Expr.(*hclsyntax.TupleConsExpr)
			if src := m.src(res.Expr); !ok || len(tup.Exprs) != 1 || strings.Contains(src, "*") || !strings.Contains(src, "aws_s3_object.release[0].key") {
				bad = append(bad, fmt.Sprintf("%s: the release's statement must name the one object (bucket ARN/object key), not %s", res.SrcRange, src))
			}
		}
		// Only the two role policies use it, and the GPU role has nothing else.
		if got := m.refersTo("aws_iam_policy_document.release"); !slices.Equal(got, []string{"aws_iam_role_policy.driver_release", "aws_iam_role_policy.gpu_release"}) {
			bad = append(bad, fmt.Sprintf("%s: the release's policy is used by %v, want the driver's and the GPU role's policies", m.dir, got))
		}
		for _, key := range m.refersTo("aws_iam_role.gpu") {
			if key != "aws_iam_role_policy.gpu_release" && key != "aws_iam_instance_profile.gpu" {
				bad = append(bad, fmt.Sprintf("%s: %s refers to the GPU role, which may only read the release", m.dir, key))
			}
		}
	case "gcp":
		n := 0
		for _, key := range sortedKeys(m.resources) {
			b := m.resources[key]
			switch {
			case strings.HasPrefix(key, "google_storage_bucket_iam_") || strings.HasPrefix(key, "google_storage_object_"):
				n++
				role, err := attrString(b.Body, "role")
				if err != nil || role != "roles/storage.legacyObjectReader" {
					bad = append(bad, fmt.Sprintf("%s: %s grants %q, want roles/storage.legacyObjectReader (storage.objects.get only)", b.DefRange(), key, role))
				}
				if a := b.Body.Attributes["bucket"]; a == nil || m.src(a.Expr) != "google_storage_bucket.release[0].name" {
					bad = append(bad, fmt.Sprintf("%s: %s must be on the release's bucket", b.DefRange(), key))
				}
				if typ, _, _ := strings.Cut(key, "."); !strings.HasSuffix(typ, "_member") {
					bad = append(bad, fmt.Sprintf("%s: %s: use _member, which adds to the bucket's policy instead of replacing it", b.DefRange(), key))
				}
			case strings.HasPrefix(key, "google_project_iam_member.") && !drivesRole(m, b):
				bad = append(bad, fmt.Sprintf("%s: %s grants a project role beyond the driver's", b.DefRange(), key))
			}
		}
		if n == 0 {
			bad = append(bad, fmt.Sprintf("%s: nothing lets the VMs read the release", m.dir))
		}
	case "azure":
		ra := m.resources["azurerm_role_assignment.release"]
		if ra == nil {
			return append(bad, fmt.Sprintf(`%s: no resource "azurerm_role_assignment" "release"`, m.dir))
		}
		if role, err := attrString(ra.Body, "role_definition_name"); err != nil || role != "Storage Blob Data Reader" {
			bad = append(bad, fmt.Sprintf("%s: the release's role is %q, want Storage Blob Data Reader", ra.DefRange(), role))
		}
		if a := ra.Body.Attributes["scope"]; a == nil || m.src(a.Expr) != "azurerm_storage_container.release[0].id" {
			bad = append(bad, fmt.Sprintf("%s: the release's role must be assigned on its container", ra.DefRange()))
		}
		for _, key := range m.refersTo("azurerm_user_assigned_identity.release") {
			if key != "azurerm_role_assignment.release" && key != "azurerm_linux_virtual_machine.driver" && key != "azurerm_linux_virtual_machine_scale_set.gpu" {
				bad = append(bad, fmt.Sprintf("%s: %s refers to the release's identity, which may only read the release", m.dir, key))
			}
		}
	}
	return bad
}

// TestReleaseUpload: each cloud module that uploads elasticd_release_path lets the hosts read
// that object and nothing more, only when the path is given, and tells the shared module how
// to fetch it; IBM takes a URL only.
func TestReleaseUpload(t *testing.T) {
	for _, c := range clouds {
		t.Run(c.name, func(t *testing.T) {
			m, err := loadModule(c.name)
			if err != nil {
				t.Fatal(err)
			}
			for _, msg := range checkRelease(c.name, m) {
				t.Error(msg)
			}
		})
	}
}

// TestReleaseUploadCanFail: a broader AWS grant, a GCP role with list, an Azure role on the
// account, an upload without the path, and an IBM module taking a path are each reported.
func TestReleaseUploadCanFail(t *testing.T) {
	cases := map[string]struct {
		cloud, main string
		want        []string
	}{
		"aws": {"aws", `variable "elasticd_release_path" {}
variable "elasticd_release_url" {}
module "job" {
  source                  = "../job"
  elasticd_release_object = var.elasticd_release_path != null ? { fetch = "gcs", url = "x" } : null
}
resource "aws_s3_bucket" "release" {}
data "aws_iam_policy_document" "release" {
  count = var.elasticd_release_path != null ? 1 : 0
  statement {
    actions   = ["s3:GetObject", "s3:ListBucket"]
    resources = ["*"]
  }
}
resource "aws_iam_role_policy" "driver_release" { policy = data.aws_iam_policy_document.release[0].json }
resource "aws_iam_role_policy_attachment" "gpu_admin" { role = aws_iam_role.gpu[0].name }
`, []string{`aws_s3_bucket.release exists without elasticd_release_path`, `must fetch "s3"`, `want only s3:GetObject`,
			`must name the one object`, `the release's policy is used by [aws_iam_role_policy.driver_release]`, `aws_iam_role_policy_attachment.gpu_admin refers to the GPU role`}},
		"gcp": {"gcp", `variable "elasticd_release_path" {}
module "job" {
  source                  = "../job"
  elasticd_release_object = { fetch = "gcs", url = "x" }
}
resource "google_storage_bucket_iam_binding" "release" {
  count  = var.elasticd_release_path != null ? 1 : 0
  bucket = google_storage_bucket.release[0].name
  role   = "roles/storage.objectViewer"
}
resource "google_project_iam_member" "gpu" {}
`, []string{`grants "roles/storage.objectViewer"`, `use _member`, `google_project_iam_member.gpu grants a project role`}},
		"azure": {"azure", `variable "elasticd_release_path" {}
module "job" {
  source                  = "../job"
  elasticd_release_object = { fetch = "azure-blob", url = "x" }
}
resource "azurerm_role_assignment" "release" {
  count                = var.elasticd_release_path != null ? 1 : 0
  scope                = azurerm_storage_account.release[0].id
  role_definition_name = "Storage Blob Data Contributor"
  principal_id         = azurerm_user_assigned_identity.release[0].principal_id
}
resource "azurerm_role_assignment" "other" { principal_id = azurerm_user_assigned_identity.release[0].principal_id }
`, []string{`want Storage Blob Data Reader`, `must be assigned on its container`, `azurerm_role_assignment.other refers to the release's identity`}},
		"ibm": {"ibm", `variable "elasticd_release_path" {}
variable "elasticd_release_url" { default = null }
`, []string{`must not take elasticd_release_path`, `elasticd_release_url must be required`}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, "main.tf", c.main)
			m, err := loadModule(dir)
			if err != nil {
				t.Fatal(err)
			}
			got := checkRelease(c.cloud, m)
			for _, want := range c.want {
				if !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, want) }) {
					t.Errorf("no problem reported containing %q; got:\n%s", want, strings.Join(got, "\n"))
				}
			}
		})
	}
}

// TestCloudsTakeEveryJobInput: each cloud module declares, for its callers, every input of the
// shared module that is the user's (not the ones the cloud module fills in itself), and
// live_page_cidrs; IBM alone lacks elasticd_release_path (TestReleaseUpload says why).
func TestCloudsTakeEveryJobInput(t *testing.T) {
	shared, err := loadModule(sharedModule)
	if err != nil {
		t.Fatal(err)
	}
	own := []string{"name", "provider_args", "fallback_args", "driver_environment", "driver_ip", "agent_metadata", "elasticd_release_object"}
	for _, c := range clouds {
		m, err := loadModule(c.name)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range append(sortedKeys(shared.variables), "live_page_cidrs") {
			if slices.Contains(own, v) || (v == "elasticd_release_path" && releaseFetch[c.name] == "") {
				continue
			}
			if m.variables[v] == nil {
				t.Errorf("terraform/%s does not take %s", c.name, v)
			}
		}
	}
}

// drivesRole reports whether the project binding b gives the driver's service account one of
// the module's custom roles (the driver's own, or the one for --manage-capacity).
func drivesRole(m *module, b *hclsyntax.Block) bool {
	role, member := b.Body.Attributes["role"], b.Body.Attributes["member"]
	return role != nil && member != nil &&
		strings.HasPrefix(m.src(role.Expr), "google_project_iam_custom_role.") &&
		strings.Contains(m.src(member.Expr), "google_service_account.driver.email")
}
