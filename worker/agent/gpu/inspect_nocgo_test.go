//go:build !(linux && cgo)

package gpu_test

import (
	"strings"
	"testing"

	"github.com/elasticd/elasticd/worker/agent/gpu"
)

// This build says plainly that it cannot read GPUs.
func TestInspectWithoutCgo(t *testing.T) {
	inv := gpu.Inspect("")
	if inv.Loaded || !inv.Unsupported || len(inv.Devices) != 0 || !strings.Contains(inv.Why, "without cgo") {
		t.Fatalf("Inspect = %+v, want unsupported, saying why", inv)
	}
}
