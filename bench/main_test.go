package bench_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// The harness runs the elasticd binary as its children (ranks, peer, jobs, agents), and the
// demo trainer in the jobs; both are built once by TestMain.
var binary, trainer string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "elasticd-bench-test-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "elasticd")
	trainer = filepath.Join(dir, "train")
	for _, b := range []struct{ out, pkg string }{{binary, "../cmd/elasticd"}, {trainer, "../examples/train"}} {
		build := exec.Command("go", "build", "-o", b.out, b.pkg)
		build.Stderr = os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n", b.pkg, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// bounded is a context that ends after the time the CLI tests gave one command; a benchmark
// still running then fails the test.
func bounded(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(func() {
		if ctx.Err() != nil {
			t.Errorf("the benchmark did not finish in time")
		}
		cancel()
	})
	return ctx
}

// syncBuffer collects the children's stderr for the test's log.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func near(a, b float64) bool { return a > 0 && b > 0 && a/b > 0.999 && a/b < 1.001 }
