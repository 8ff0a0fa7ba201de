package bench_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/elasticd/elasticd/bench"
)

// Report takes medians over rounds per implementation and divides them.
func TestReportMediansAndSpeedup(t *testing.T) {
	in := filepath.Join(t.TempDir(), "lines.jsonl")
	lines := `[baselines] a log line that is not JSON
{"impl":"elasticd","size_bytes":4096,"ranks":2,"median_s":0.00001}
{"impl":"elasticd","size_bytes":4096,"ranks":2,"median_s":0.00003}
{"impl":"elasticd","size_bytes":4096,"ranks":2,"median_s":0.00002}
{"impl":"gloo","size_bytes":4096,"ranks":2,"median_s":0.00008}
{"impl":"mpi","size_bytes":4096,"ranks":2,"median_s":0.00001}
{"size_bytes":67108864,"ranks":4,"median_s":0.05}
{"impl":"gloo","size_bytes":67108864,"ranks":4,"median_s":0.1}
`
	if err := os.WriteFile(in, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := bench.Report(bench.ReportOptions{Files: []string{in}, Out: &out}); err != nil {
		t.Fatal(err)
	}
	rows := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(rows) != 4 {
		t.Fatalf("want title, header and 2 rows:\n%s", out.String())
	}
	for _, want := range []string{"20µs", "4.00x", "0.50x", "3"} { // median 20µs; gloo 80/20; mpi 10/20; 3 rounds
		if !strings.Contains(rows[2], want) {
			t.Errorf("4KB row lacks %q: %q", want, rows[2])
		}
	}
	if !strings.Contains(rows[3], "64MB") || !strings.Contains(rows[3], "2.00x") || !strings.Contains(rows[3], "-") {
		t.Errorf("64MB row: %q", rows[3])
	}

	// The same lines on stdin, when there are no files.
	var fromStdin bytes.Buffer
	if err := bench.Report(bench.ReportOptions{Stdin: strings.NewReader(lines), Out: &fromStdin}); err != nil || fromStdin.String() != out.String() {
		t.Errorf("from stdin: %v\n%s\nwant\n%s", err, fromStdin.String(), out.String())
	}

	// A missing file and an input without results are usage errors (elasticd exits 2).
	var ue *bench.UsageError
	if err := bench.Report(bench.ReportOptions{Files: []string{filepath.Join(t.TempDir(), "missing")}}); !errors.As(err, &ue) || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: %v", err)
	}
	if err := bench.Report(bench.ReportOptions{Stdin: strings.NewReader("not JSON\n")}); !errors.As(err, &ue) || !strings.Contains(err.Error(), "no JSON result lines") {
		t.Errorf("no result lines: %v", err)
	}
}
