package releasetest

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// make release's script builds a tarball with the stamped binary, the Python package, the price
// example and the README, and a SHA256SUMS that matches it.
func TestReleaseTarball(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("no tar")
	}
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	out := t.TempDir()
	cmd := exec.Command("sh", "scripts/release.sh")
	cmd.Dir = strings.TrimSpace(string(root))
	cmd.Env = append(os.Environ(), "ARCHES=amd64", "OUT="+out, "VERSION=v0.0.0-releasetest", "COMMIT=0123456789abcdef")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("release.sh: %v\n%s", err, b)
	}
	name := "elasticd-v0.0.0-releasetest-linux-amd64"
	tarball := filepath.Join(out, name+".tar.gz")
	data, err := os.ReadFile(tarball)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	sums, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	if want := hex.EncodeToString(sum[:]) + "  " + name + ".tar.gz\n"; string(sums) != want {
		t.Errorf("SHA256SUMS = %q, want %q", sums, want)
	}

	gz, err := gzip.NewReader(strings.NewReader(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	files := map[string]bool{}
	dir := t.TempDir()
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = true
		if h.Name == name+"/elasticd" {
			if h.Mode&0o111 == 0 {
				t.Errorf("elasticd in the tarball is not executable: mode %o", h.Mode)
			}
			f, err := os.OpenFile(filepath.Join(dir, "elasticd"), os.O_CREATE|os.O_WRONLY, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
	for _, f := range []string{"elasticd", "README.md", "prices.yaml", "python/pyproject.toml", "python/elasticd/__init__.py", "python/elasticd/torch/__init__.py"} {
		if !files[name+"/"+f] {
			t.Errorf("the tarball has no %s", f)
		}
	}
	for f := range files {
		if strings.Contains(f, "__pycache__") || strings.HasSuffix(f, "_test.go") || strings.Contains(f, "/tests/") {
			t.Errorf("the tarball carries %s", f)
		}
	}
	v, err := exec.Command(filepath.Join(dir, "elasticd"), "version").Output()
	if err != nil {
		t.Fatalf("the released binary: %v", err)
	}
	if !strings.HasPrefix(string(v), "elasticd v0.0.0-releasetest\ncommit 0123456789abcdef\n") {
		t.Errorf("the released binary says %q; want the stamped version and commit", v)
	}
}
