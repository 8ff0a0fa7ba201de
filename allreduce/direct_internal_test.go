package allreduce

import (
	"math"
	"runtime"
	"testing"
)

func TestDirectWish(t *testing.T) {
	for _, c := range []struct {
		p    policy
		cfg  int
		want int64
	}{
		{policyAuto, 0, directAuto}, {policyAuto, 1 << 20, 1 << 20}, {policyAuto, -1, -1},
		{policyAlways, 0, directAutoBytes}, {policyAlways, 5, 5}, {policyAlways, -1, -1},
		{policyNever, 0, -1}, {policyNever, 1 << 20, -1},
	} {
		if got := directWish(c.p, c.cfg); got != c.want {
			t.Errorf("directWish(%v, %d) = %d, want %d", c.p, c.cfg, got, c.want)
		}
	}
}

func TestDirectAgree(t *testing.T) {
	const fast, slow = directMinRatio, directMinRatio - 0.01
	for _, c := range []struct {
		name   string
		wishes []int64
		ratio  float64
		want   int64
	}{
		{"auto, fast machine", []int64{directAuto, directAuto}, fast, directAutoBytes},
		{"auto, slow machine", []int64{directAuto, directAuto, directAuto}, slow, -1},
		{"auto, unmeasured", []int64{directAuto, directAuto}, 0, -1},
		{"sizes: the largest", []int64{1 << 20, 3 << 20, 2 << 20}, 0, 3 << 20},
		{"sizes: the ratio is not asked", []int64{1 << 20, 3 << 20}, slow, 3 << 20},
		{"a size and auto, fast", []int64{1 << 20, directAuto}, fast, directAutoBytes},
		{"a large size and auto, fast", []int64{64 << 20, directAuto}, fast, 64 << 20},
		{"a size and auto, slow", []int64{64 << 20, directAuto}, slow, -1},
		{"one rank will not", []int64{1, -1, 1}, fast, -1},
		{"one rank will not, the rest auto and fast", []int64{directAuto, -1}, fast, -1},
	} {
		if got := directAgree(c.wishes, c.ratio); got != c.want {
			t.Errorf("%s: directAgree(%v, %v) = %d, want %d", c.name, c.wishes, c.ratio, got, c.want)
		}
	}
}

// TestMeasureReadRatio: on Linux the measure reads, and says something a machine can have.
func TestMeasureReadRatio(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("process_vm_readv is Linux's")
	}
	r := measureReadRatio()
	if !(r > 0.01 && r < 100) || math.IsNaN(r) {
		t.Fatalf("process_vm_readv at %v times copy's speed", r)
	}
	t.Logf("process_vm_readv at %.2f times copy's speed (auto reads directly from %.2f)", r, directMinRatio)
}
