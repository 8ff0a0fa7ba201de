package bench_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
