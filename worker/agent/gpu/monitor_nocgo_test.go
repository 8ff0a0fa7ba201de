//go:build !(linux && cgo)

package gpu_test

import (
	"context"
	"testing"
	"time"

	"github.com/elasticd/elasticd/worker/agent/gpu"
)

func TestOpenWithoutNVML(t *testing.T) {
	m, err := gpu.Open(testLogger(t))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if g := m.GPUs(); len(g) != 0 {
		t.Fatalf("GPUs = %v, want none", g)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := m.Watch(ctx, make(chan gpu.Event)); err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}
