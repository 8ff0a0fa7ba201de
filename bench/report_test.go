package bench_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
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

// Every implementation run.sh runs gets a column under a name that says what it is, and a
// ratio to elasticd, in IMPLS order.
func TestReportNamesEveryBaseline(t *testing.T) {
	// Two rounds each: the medians are the means of the two. elasticd 10µs; the others 2, 4, 1
	// and 0.5 times that.
	lines := `{"impl":"elasticd","size_bytes":4096,"ranks":2,"median_s":0.000008}
{"impl":"gloo","size_bytes":4096,"ranks":2,"median_s":0.00002}
{"impl":"torch-gloo","size_bytes":4096,"ranks":2,"median_s":0.00004}
{"impl":"mpi","size_bytes":4096,"ranks":2,"median_s":0.00001}
{"impl":"mpi-shm","size_bytes":4096,"ranks":2,"median_s":0.000005}
{"impl":"elasticd","size_bytes":4096,"ranks":2,"median_s":0.000012}
{"impl":"gloo","size_bytes":4096,"ranks":2,"median_s":0.00002}
{"impl":"torch-gloo","size_bytes":4096,"ranks":2,"median_s":0.00004}
{"impl":"mpi","size_bytes":4096,"ranks":2,"median_s":0.00001}
{"impl":"mpi-shm","size_bytes":4096,"ranks":2,"median_s":0.000005}
{"impl":"elasticd-tcp","size_bytes":4096,"ranks":2,"median_s":0.00003}
`
	var out bytes.Buffer
	if err := bench.Report(bench.ReportOptions{Stdin: strings.NewReader(lines), Out: &out}); err != nil {
		t.Fatal(err)
	}
	rows := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(rows) != 3 {
		t.Fatalf("want title, header and 1 row:\n%s", out.String())
	}
	if !strings.Contains(rows[0], "elasticd's time") {
		t.Errorf("title does not say what the ratios are: %q", rows[0])
	}
	// Column titles, in this order: the medians, then the ratios.
	at := 0
	for _, title := range []string{"elasticd", "Gloo", "torch Gloo", "Open MPI TCP", "Open MPI shm", "elasticd TCP",
		"vs Gloo", "vs torch Gloo", "vs Open MPI TCP", "vs Open MPI shm", "vs elasticd TCP"} {
		i := strings.Index(rows[1][at:], title)
		if i < 0 {
			t.Fatalf("header lacks %q after column %d: %q", title, at, rows[1])
		}
		at += i + len(title)
	}
	if strings.Contains(rows[1], "mpi") || strings.Contains(rows[1], "torch-gloo") || strings.Contains(rows[1], "elasticd-tcp") {
		t.Errorf("header has a raw impl name: %q", rows[1])
	}
	var ratios []string
	for _, f := range strings.Fields(rows[2]) {
		if strings.HasSuffix(f, "x") {
			ratios = append(ratios, f)
		}
	}
	if want := []string{"2.00x", "4.00x", "1.00x", "0.50x", "3.00x"}; !slices.Equal(ratios, want) {
		t.Errorf("ratios %v, want %v (gloo, torch-gloo, mpi, mpi-shm, elasticd-tcp over elasticd) in %q", ratios, want, rows[2])
	}
	for _, want := range []string{"10µs", "2"} { // elasticd's median of 8 and 12µs; 2 rounds
		if !strings.Contains(rows[2], want) {
			t.Errorf("row lacks %q: %q", want, rows[2])
		}
	}
}

// Without elasticd there is nothing to divide by: medians only, and no ratio against
// whichever baseline came first.
func TestReportWithoutElasticd(t *testing.T) {
	lines := `{"impl":"torch-gloo","size_bytes":1048576,"ranks":2,"median_s":0.002}
{"impl":"mpi-shm","size_bytes":1048576,"ranks":2,"median_s":0.001}
`
	var out bytes.Buffer
	if err := bench.Report(bench.ReportOptions{Stdin: strings.NewReader(lines), Out: &out}); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); strings.Contains(s, "vs ") || strings.Contains(s, "x ") || strings.HasSuffix(strings.TrimSpace(s), "x") ||
		!strings.Contains(s, "torch Gloo") || !strings.Contains(s, "Open MPI shm") || !strings.Contains(s, "2ms") {
		t.Errorf("report without elasticd:\n%s", s)
	}
}

// Lines with hosts (run.sh's HOSTS mode) make their own table, after the one-machine table,
// by host count and ranks per host; Open MPI's shared memory there is shm+TCP.
func TestReportAcrossHosts(t *testing.T) {
	lines := `{"impl":"elasticd","size_bytes":4096,"ranks":2,"median_s":0.00001}
{"impl":"mpi","size_bytes":4096,"ranks":2,"median_s":0.00002}
{"impl":"elasticd","size_bytes":4096,"ranks":4,"median_s":0.0001,"hosts":2,"per_host":2,"shm_peers":1,"tcp_peers":2,"rank_shm_peers":[1,1,1,1],"rank_tcp_peers":[2,2,2,2]}
{"impl":"mpi","hosts":2,"per_host":2,"size_bytes":4096,"ranks":4,"median_s":0.0003}
{"impl":"mpi-shm","hosts":2,"per_host":2,"size_bytes":4096,"ranks":4,"median_s":0.00005}
{"impl":"elasticd","size_bytes":1048576,"ranks":2,"median_s":0.001,"hosts":2,"per_host":1}
{"impl":"mpi","hosts":2,"per_host":1,"size_bytes":1048576,"ranks":2,"median_s":0.004}
{"impl":"elasticd","size_bytes":4096,"ranks":2,"median_s":0.00003,"hosts":2,"per_host":1}
{"impl":"mpi","hosts":2,"per_host":1,"size_bytes":4096,"ranks":2,"median_s":0.00003}
`
	var out bytes.Buffer
	if err := bench.Report(bench.ReportOptions{Stdin: strings.NewReader(lines), Out: &out}); err != nil {
		t.Fatal(err)
	}
	tables := strings.Split(strings.TrimSpace(out.String()), "\n\n")
	if len(tables) != 2 {
		t.Fatalf("want a one-machine table and an across-hosts table:\n%s", out.String())
	}
	local := strings.Split(tables[0], "\n")
	if len(local) != 3 || strings.Contains(tables[0], "hosts") || !strings.Contains(local[2], "2.00x") {
		t.Errorf("one-machine table has the cross-host lines or the wrong ratio:\n%s", tables[0])
	}
	rows := strings.Split(tables[1], "\n")
	if len(rows) != 5 {
		t.Fatalf("want title, header and 3 rows (2x1 4KB, 2x1 1MB, 2x2 4KB):\n%s", tables[1])
	}
	if !strings.Contains(rows[0], "across hosts") || !strings.Contains(rows[1], "per host") ||
		!strings.Contains(rows[1], "Open MPI shm+TCP") || strings.Contains(rows[1], "Open MPI shm ") {
		t.Errorf("title and header:\n%s\n%s", rows[0], rows[1])
	}
	for i, want := range []struct{ prefix, ratios string }{
		{"2 1 4KB 1", "1.00x"},
		{"2 1 1MB 1", "4.00x"},
		{"2 2 4KB 1", "3.00x 0.50x"},
	} {
		f := strings.Fields(rows[2+i])
		var ratios []string
		for _, c := range f {
			if strings.HasSuffix(c, "x") {
				ratios = append(ratios, c)
			}
		}
		if got := strings.Join(f[:4], " "); got != want.prefix || strings.Join(ratios, " ") != want.ratios {
			t.Errorf("row %d: %q, want it to start %q with ratios %q", i, rows[2+i], want.prefix, want.ratios)
		}
	}
}
