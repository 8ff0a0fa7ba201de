package main_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The bench commands' wiring: flags into package bench's options, its hidden rank command,
// and its usage errors as exit code 2. What the benchmarks measure is tested in bench/.

func TestBenchAllreduceTableOneRank(t *testing.T) {
	out, stderr, code := elasticd(t, nil, "bench", "allreduce", "--np", "1", "--sizes", "4KB", "--iters", "2", "--no-baseline")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(out, "1 rank processes") || !strings.Contains(out, "4KB") {
		t.Fatalf("table:\n%s", out)
	}
}

func TestBenchReportFilesAndExit2(t *testing.T) {
	in := filepath.Join(t.TempDir(), "lines.jsonl")
	if err := os.WriteFile(in, []byte(`{"impl":"elasticd","size_bytes":4096,"ranks":2,"median_s":0.00002}`+"\n"+`{"impl":"gloo","size_bytes":4096,"ranks":2,"median_s":0.00008}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := elasticd(t, nil, "bench", "report", in)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if rows := strings.Split(strings.TrimSpace(out), "\n"); len(rows) != 3 || !strings.Contains(rows[2], "4.00x") {
		t.Errorf("want title, header and a row with 4.00x:\n%s", out)
	}
	if _, stderr, code := elasticd(t, nil, "bench", "report", filepath.Join(t.TempDir(), "missing")); code != 2 || !strings.Contains(stderr, "no such file") {
		t.Errorf("missing file: exit %d, %q", code, stderr)
	}
}
