package bench_test

import (
	"archive/tar"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// run.sh checks its settings before it installs, builds or runs anything: on a machine with no
// package index (PREBUILT=1) a missing benchmark binary is named, and the Open MPI settings it
// inherits are removed and named first, so that a machine's image cannot change what is run.
func TestBaselinesRunChecksFirst(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	for _, tc := range []struct {
		name string
		env  []string
		want []string
	}{
		{"prebuilt binary missing", []string{"PREBUILT=1", "IMPLS=mpi", "OMPI_MCA_plm=isolated", "PMIX_MCA_gds=hash"},
			[]string{"removing inherited Open MPI settings (KEEP_MPI_ENV=1 keeps them): OMPI_MCA_plm PMIX_MCA_gds",
				"PREBUILT=1: " + filepath.Join("BUILD", "mpi_allreduce") + " is missing"}},
		{"kept settings", []string{"PREBUILT=1", "IMPLS=mpi-shm", "KEEP_MPI_ENV=1", "OMPI_MCA_plm=isolated"},
			[]string{"PREBUILT=1: " + filepath.Join("BUILD", "mpi_allreduce") + " is missing"}},
		{"bad PREBUILT", []string{"PREBUILT=yes", "IMPLS=mpi"}, []string{"PREBUILT must be 0 or 1"}},
		{"bad KEEP_MPI_ENV", []string{"KEEP_MPI_ENV=sometimes", "IMPLS=mpi"}, []string{"KEEP_MPI_ENV must be 0 or 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			build := t.TempDir()
			cmd := exec.CommandContext(bounded(t), "bash", filepath.Join("baselines", "run.sh"))
			cmd.Env = append(os.Environ(), "BUILD_DIR="+build, "NPS=2", "SIZES=4096")
			cmd.Env = append(cmd.Env, tc.env...)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("want a non-zero exit, got %v:\n%s", err, out)
			}
			text := strings.ReplaceAll(string(out), build, "BUILD")
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("output lacks %q:\n%s", w, text)
				}
			}
			if tc.name == "kept settings" && strings.Contains(text, "removing inherited") {
				t.Errorf("KEEP_MPI_ENV=1 still removed settings:\n%s", text)
			}
		})
	}
}

// with-bundle.sh shows the command the bundle's files in place of the machine's, passes its
// exit status on, and leaves nothing behind: the empty files and folders it made as mount
// points where the machine had none are gone once the command has ended.
func TestWithBundleLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("with-bundle.sh mounts: root only")
	}
	for _, tool := range []string{"bash", "unshare", "tar", "awk"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s", tool)
		}
	}
	fresh := fmt.Sprintf("/usr/lib/elasticd-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() { os.RemoveAll(fresh) }) // only if the script failed to
	_, optErr := os.Stat("/opt/elasticd-baselines")
	bundle := filepath.Join(t.TempDir(), "bundle.tar")
	writeTar(t, bundle, map[string]string{
		"opt/elasticd-baselines/bin/hello":             "from the bundle's bin\n",
		strings.TrimPrefix(fresh, "/") + "/sub/lib.so": "a library the machine lacks\n",
	})
	script := filepath.Join("baselines", "with-bundle.sh")
	cmd := exec.CommandContext(bounded(t), "bash", script, bundle, "sh", "-c",
		"cat /opt/elasticd-baselines/bin/hello "+fresh+"/sub/lib.so; exit 3")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("want the command's exit status 3, got %v:\n%s", err, out)
	}
	if want := "from the bundle's bin\na library the machine lacks\n"; string(out) != want {
		t.Errorf("the command saw %q, want %q", out, want)
	}
	if _, err := os.Lstat(fresh); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s is still there after the command (%v)", fresh, err)
	}
	if _, err := os.Stat("/opt/elasticd-baselines"); errors.Is(optErr, os.ErrNotExist) && !errors.Is(err, os.ErrNotExist) {
		t.Errorf("/opt/elasticd-baselines was made as a mount point and is still there (%v)", err)
	}
}

// writeTar writes a tar archive of files (path: content) to name.
func writeTar(t *testing.T, name string, files map[string]string) {
	t.Helper()
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for path, content := range files {
		if err := tw.WriteHeader(&tar.Header{Name: path, Mode: 0o755, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}
