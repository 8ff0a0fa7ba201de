package allreduce

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"
)

// special values whose handling must not depend on the kernel.
var f64Specials = []float64{0, math.Copysign(0, -1), 1, -1, math.Inf(1), math.Inf(-1), math.NaN(), math.MaxFloat64, math.SmallestNonzeroFloat64}

func fill(rng *rand.Rand, b []byte, dt dtype) {
	switch dt {
	case dtFloat32:
		for i := range view[float32](b) {
			if rng.IntN(8) == 0 {
				view[float32](b)[i] = float32(f64Specials[rng.IntN(len(f64Specials))])
			} else {
				view[float32](b)[i] = float32(rng.NormFloat64() * 1e3)
			}
		}
	case dtFloat64:
		for i := range view[float64](b) {
			if rng.IntN(8) == 0 {
				view[float64](b)[i] = f64Specials[rng.IntN(len(f64Specials))]
			} else {
				view[float64](b)[i] = rng.NormFloat64() * 1e3
			}
		}
	case dtInt64:
		for i := range view[int64](b) {
			view[int64](b)[i] = int64(rng.Uint64()) // overflow wraps the same way in both kernels
		}
	}
}

// nanPayloads fills some elements with NaNs of distinct payloads and signs, so that a
// kernel that takes its operands in another order shows: of two NaNs, the first operand's
// payload is the result.
func nanPayloads(rng *rand.Rand, b []byte, dt dtype) {
	switch dt {
	case dtFloat32:
		for i := range view[float32](b) {
			if rng.IntN(4) == 0 {
				view[float32](b)[i] = math.Float32frombits(0x7fc00000 | uint32(rng.IntN(1<<22)) | uint32(rng.IntN(2))<<31)
			}
		}
	case dtFloat64:
		for i := range view[float64](b) {
			if rng.IntN(4) == 0 {
				view[float64](b)[i] = math.Float64frombits(0x7ff8000000000000 | uint64(rng.IntN(1<<50)) | uint64(rng.IntN(2))<<63)
			}
		}
	}
}

// TestSumOperandOrder: dst = src + dst (srcFirst) on one rank must give the bits that
// dst' = dst' + src' gives on the other, where dst' is the first's src and src' its dst: the
// two ranks of a recursive-doubling exchange. With both operands NaN the payload tells the
// order, in the vector kernel and in the Go loop alike.
func TestSumOperandOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	kernels := []bool{false}
	if useAVX2 {
		kernels = append(kernels, true)
	}
	saved := useAVX2
	defer func() { useAVX2 = saved }()
	for _, avx := range kernels {
		useAVX2 = avx
		for _, dt := range []dtype{dtFloat32, dtFloat64, dtInt64} {
			for _, n := range []int{1, 31, 32, 33, 1000, 4099} {
				lo, hi := make([]byte, n*dt.size()), make([]byte, n*dt.size())
				fill(rng, lo, dt)
				fill(rng, hi, dt)
				nanPayloads(rng, lo, dt)
				nanPayloads(rng, hi, dt)
				onLo, onHi := bytes.Clone(lo), bytes.Clone(hi)
				reduceInto(onLo, hi, dt, Sum, false) // lo + hi, on the lower rank
				reduceInto(onHi, lo, dt, Sum, true)  // lo + hi, on the higher rank
				if !bytes.Equal(onLo, onHi) {
					t.Fatalf("avx2=%v %s, %d elements: the two ranks' sums differ", avx, dt, n)
				}
			}
		}
	}
}

// TestSumKernelsAgree checks the vector kernel against the Go loop, bit for bit, for
// lengths around the 128-byte block edges and values that include NaN, ±0 and ±Inf.
func TestSumKernelsAgree(t *testing.T) {
	if !useAVX2 {
		t.Skip("this CPU has no AVX2: only the Go loop runs")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, dt := range []dtype{dtFloat32, dtFloat64, dtInt64} {
		for _, n := range []int{0, 1, 15, 16, 17, 31, 32, 33, 255, 1000, 4099} {
			size := n * dt.size()
			dst, src := make([]byte, size), make([]byte, size)
			fill(rng, dst, dt)
			fill(rng, src, dt)
			nanPayloads(rng, dst, dt)
			nanPayloads(rng, src, dt)
			for _, srcFirst := range []bool{false, true} {
				vec, scalar := bytes.Clone(dst), bytes.Clone(dst)
				reduceInto(vec, src, dt, Sum, srcFirst)
				useAVX2 = false
				reduceInto(scalar, src, dt, Sum, srcFirst)
				useAVX2 = true
				if !bytes.Equal(vec, scalar) {
					t.Fatalf("%s, %d elements, srcFirst=%v: vector and Go sums differ", dt, n, srcFirst)
				}
				if n > 16 && bytes.Equal(vec, dst) { // a short dst may be all NaN
					t.Fatalf("%s, %d elements: sum changed nothing", dt, n)
				}
			}
		}
	}
}

// BenchmarkReduceSum compares the kernels side by side on a 256 KiB chunk (in cache, unlike
// a whole message) and with copy, the memory-speed bound.
func BenchmarkReduceSum(b *testing.B) {
	const size = 256 << 10
	dst, src := make([]byte, size), make([]byte, size)
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			copy(dst, src)
		}
	})
	for _, k := range []struct {
		name string
		avx  bool
	}{{"go", false}, {"avx2", true}} {
		if k.avx && !useAVX2 {
			continue
		}
		b.Run("float32/"+k.name, func(b *testing.B) {
			saved := useAVX2
			useAVX2 = k.avx
			defer func() { useAVX2 = saved }()
			b.SetBytes(size)
			for b.Loop() {
				reduceInto(dst, src, dtFloat32, Sum, false)
			}
		})
	}
}
