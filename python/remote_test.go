package python_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/elasticd/elasticd/python"
)

// runRemote runs the RemoteInstall snippet in /bin/sh, as the ssh wrapper does, then a Python
// interpreter that imports the package from the PYTHONPATH the snippet set.
func runRemote(t *testing.T, cache string, extra ...string) (string, error) {
	t.Helper()
	snippet, err := python.RemoteInstall()
	if err != nil {
		t.Fatal(err)
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	cmd := exec.Command("/bin/sh", "-c", snippet+`exec "$0" -c 'import elasticd, elasticd._rendezvous, os; print(os.path.dirname(elasticd.__file__))'`)
	cmd.Args = append(cmd.Args, py)
	cmd.Dir = t.TempDir() // not python/, which Python would import the package from
	cmd.Env = append(append(os.Environ(), "ELASTICD_CACHE_DIR="+cache, "PYTHONPATH=/somewhere/else"), extra...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The snippet writes the package out once, under the cache directory, and every worker on the
// host imports it from there, even when several start at once.
func TestRemoteInstallWritesThePackageOnce(t *testing.T) {
	cache := t.TempDir()
	var wg sync.WaitGroup
	outs := make([]string, 4)
	for i := range outs {
		wg.Go(func() {
			out, err := runRemote(t, cache)
			if err != nil {
				t.Errorf("worker %d: %v: %s", i, err, out)
			}
			outs[i] = strings.TrimSpace(out)
		})
	}
	wg.Wait()
	entries, _ := os.ReadDir(cache)
	if len(entries) != 1 || !strings.HasPrefix(entries[0].Name(), "python-") {
		t.Fatalf("cache holds %v, want one python-<hash> directory (no temporary ones left)", entries)
	}
	want := filepath.Join(cache, entries[0].Name(), "elasticd")
	for i, out := range outs {
		if out != want {
			t.Errorf("worker %d imported elasticd from %q, want %q", i, out, want)
		}
	}
	root, err := python.Install(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(root) != entries[0].Name() {
		t.Errorf("remote copy %s, local copy %s: the same content must have the same name", entries[0].Name(), filepath.Base(root))
	}
	for _, f := range []string{"__init__.py", "_rendezvous.py", "torch/__init__.py", "torch/elastic.py", "torch/_runtime.py", "common/exceptions.py"} {
		local, _ := os.ReadFile(filepath.Join(root, "elasticd", f))
		remote, err := os.ReadFile(filepath.Join(want, f))
		if err != nil || string(local) != string(remote) {
			t.Errorf("%s differs between the local and the remote copy (%v)", f, err)
		}
	}
	if out, err := runRemote(t, cache); err != nil || strings.TrimSpace(out) != want { // reused
		t.Fatalf("second run: %v: %s", err, out)
	}
}

// Where the package cannot be written, the worker is told why and still starts.
func TestRemoteInstallUnwritableSaysSo(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	out, err := runRemote(t, filepath.Join(file, "sub")) // not a directory, even for root
	if err == nil || !strings.Contains(out, "could not write the Python package") || !strings.Contains(out, "No module named 'elasticd'") {
		t.Fatalf("%v: %s", err, out)
	}
}
