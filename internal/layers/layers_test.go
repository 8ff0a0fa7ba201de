package layers

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/elasticd/elasticd"

// rank is each area's layer, lowest first: a package may import packages of a lower layer and
// of its own area, nothing else. worker and driver share a layer, so neither imports the
// other; they meet in protocol.
var rank = map[string]int{
	"internal": 0, "protocol": 0, "proc": 0, "allreduce": 0, "python": 0, "dashboards": 0,
	"providers": 1,
	"worker":    2, "driver": 2,
	"bench": 3,
	"cmd":   4, "examples": 4, "terraform": 4,
}

// area is the top-level folder of a package path inside the module.
func area(pkg string) string {
	a, _, _ := strings.Cut(strings.TrimPrefix(pkg, module+"/"), "/")
	return a
}

// violation says why from must not import to, or "" when it may.
func violation(from, to string) string {
	fa, ta := area(from), area(to)
	fr, ok := rank[fa]
	if !ok {
		return fmt.Sprintf("%s is in folder %q, which has no layer: add it to rank in internal/layers and to docs/architecture.md", from, fa)
	}
	tr, ok := rank[ta]
	if !ok {
		return fmt.Sprintf("%s is in folder %q, which has no layer: add it to rank in internal/layers and to docs/architecture.md", to, ta)
	}
	rel := func(p string) string { return strings.TrimPrefix(p, module+"/") }
	switch {
	case fa == ta:
		// Inside driver/, the subpackages are below the driver's core (package driver), except
		// the admin API, which serves it.
		if fa == "driver" && rel(to) == "driver" && rel(from) != "driver/admin" {
			return fmt.Sprintf("%s imports the driver's core %s: subpackages sit below it (only driver/admin, its API, sits above)", rel(from), rel(to))
		}
		return ""
	case tr < fr:
		return ""
	case tr == fr:
		return fmt.Sprintf("%s imports %s: %s/ and %s/ are siblings in one layer and meet only in package protocol", rel(from), rel(to), fa, ta)
	default:
		return fmt.Sprintf("%s imports %s: layer %d (%s/) must not import layer %d (%s/)", rel(from), rel(to), fr, fa, tr, ta)
	}
}

// TestImportLayers checks every import between the module's packages (tests' own imports
// excepted: a driver test may drive a real worker client) against the layers.
func TestImportLayers(t *testing.T) {
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	cmd := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...")
	cmd.Dir = filepath.Clean(strings.TrimSpace(string(root)))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./...: %v", err)
	}
	var edges, bad int
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], module+"/") {
			continue
		}
		for _, to := range f[1:] {
			if !strings.HasPrefix(to, module+"/") {
				continue
			}
			edges++
			if v := violation(f[0], to); v != "" {
				bad++
				t.Error(v)
			}
		}
	}
	if edges < 50 {
		t.Fatalf("only %d imports between the module's packages: go list did not see the module", edges)
	}
	t.Logf("%d imports between the module's packages, %d against the layers", edges, bad)
}

// The rules themselves catch what they are for.
func TestViolation(t *testing.T) {
	p := func(s string) string { return module + "/" + s }
	for _, tc := range []struct {
		from, to string
		bad      bool
	}{
		{"worker", "protocol", false},
		{"worker/agent", "proc", false},
		{"driver", "driver/rendezvous", false},
		{"driver/admin", "driver", false},
		{"cmd/elasticd", "driver", false},
		{"providers/aws", "providers", false},
		{"worker", "driver/rendezvous", true},
		{"worker/agent", "driver/launch", true},
		{"driver", "worker", true},
		{"driver/rendezvous", "driver", true},
		{"protocol", "driver/rendezvous", true},
		{"providers/gcp", "worker/agent", true},
		{"driver", "cmd/elasticd", true},
		{"newfolder/x", "protocol", true},
	} {
		got := violation(p(tc.from), p(tc.to))
		if (got != "") != tc.bad {
			t.Errorf("%s → %s: %q, want a violation: %t", tc.from, tc.to, got, tc.bad)
		}
	}
	if a := area(p("driver/hosts")); a != "driver" {
		t.Errorf("area(driver/hosts) = %q, want driver", a)
	}
}
