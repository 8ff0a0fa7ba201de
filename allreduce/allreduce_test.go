package allreduce_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/elasticd/elasticd/allreduce"
)

// sizes are the element counts every collective is tested with: empty, one, odd, a few
// chunks, and a large odd size that does not divide by any world size.
var sizes = []int{0, 1, 7, 1000, 1<<20 + 3}

const large = 1<<20 + 3

type elem interface{ float32 | float64 | int64 }

// exactValue is rank r's element i. Floats are small multiples of 1/4 and int64s need 44
// bits, so sums, maxima and minima over up to 8 ranks are exact in every dtype: any
// reduction order must give the reference bits.
func exactValue[T elem](r, i int) T {
	k := (r*7+i*13+3)%17 - 8
	var z T
	if _, ok := any(z).(int64); ok {
		return T(int64(k)<<40 + int64(r*3+i%7))
	}
	return T(float64(k) / 4)
}

func exactInput[T elem](r, size int) []T {
	s := make([]T, size)
	for i := range s {
		s[i] = exactValue[T](r, i)
	}
	return s
}

// reference is the straightforward reduction of exactInput over n ranks.
func reference[T elem](n, size int, op allreduce.Op) []T {
	out := exactInput[T](0, size)
	for r := 1; r < n; r++ {
		for i := range out {
			v := exactValue[T](r, i)
			switch op {
			case allreduce.Sum:
				out[i] += v
			case allreduce.Max:
				out[i] = max(out[i], v)
			case allreduce.Min:
				out[i] = min(out[i], v)
			}
		}
	}
	return out
}

// raw views a slice as its bytes, for byte-for-byte comparison across ranks.
func raw[T elem](s []T) []byte {
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

// sameBytes fails t unless every rank's buffer is byte-identical to rank 0's.
func sameBytes(t testing.TB, bufs [][]byte) {
	t.Helper()
	for r := 1; r < len(bufs); r++ {
		if !bytes.Equal(bufs[r], bufs[0]) {
			if len(bufs[r]) != len(bufs[0]) {
				t.Fatalf("rank %d holds %d bytes, rank 0 holds %d", r, len(bufs[r]), len(bufs[0]))
			}
			i := 0
			for bufs[r][i] == bufs[0][i] {
				i++
			}
			t.Fatalf("rank %d differs from rank 0 at byte %d: %#x vs %#x", r, i, bufs[r][i], bufs[0][i])
		}
	}
}

// checkAllreduce runs one exact Allreduce on every rank and compares with the reference
// element by element, and every rank with rank 0 byte for byte.
// checkAllreduceOf is checkAllreduce for the element type named dt.
func checkAllreduceOf(t *testing.T, dt string, comms []*allreduce.Comm, size int, op allreduce.Op) {
	t.Helper()
	switch dt {
	case "float32":
		checkAllreduce[float32](t, comms, size, op)
	case "float64":
		checkAllreduce[float64](t, comms, size, op)
	case "int64":
		checkAllreduce[int64](t, comms, size, op)
	default:
		t.Fatalf("no element type %q", dt)
	}
}

func checkAllreduce[T elem](t *testing.T, comms []*allreduce.Comm, size int, op allreduce.Op) {
	t.Helper()
	n := len(comms)
	bufs := make([][]T, n)
	for r := range n {
		bufs[r] = exactInput[T](r, size)
	}
	mustAll(t, onAll(comms, func(r int, c *allreduce.Comm) error {
		return c.Allreduce(t.Context(), bufs[r], op)
	}))
	want := reference[T](n, size, op)
	for i, w := range want {
		if bufs[0][i] != w {
			t.Fatalf("rank 0 [%d] = %v, want %v", i, bufs[0][i], w)
		}
	}
	all := make([][]byte, n)
	for r := range n {
		all[r] = raw(bufs[r])
	}
	sameBytes(t, all)
}

// allreducePaths pin the algorithm: the default choice, the ring for everything the ring
// can take, recursive doubling for everything, and the ring with 64-byte chunks so that
// many chunks are in flight at once. In worlds of 4 and 8 ranks, "ring" and "chunk64" run
// recursive halving and doubling instead, which takes every size above SmallBytes there.
var allreducePaths = []struct {
	name  string
	tweak func(*allreduce.Config)
	sizes []int
	// large reports whether (n, dtype, op) also runs the large size; the full matrix at
	// 1<<20+3 elements is too slow under -race, so the large size covers every world size
	// for float32 sums and every dtype and op for a few world sizes.
	large func(n int, dt string, op allreduce.Op) bool
}{
	{"default", nil, sizes, func(n int, dt string, op allreduce.Op) bool {
		return (dt == "float32" && op == allreduce.Sum) || n == 3 || n == 8
	}},
	{"ring", func(c *allreduce.Config) { c.SmallBytes = 1 }, sizes, func(n int, dt string, op allreduce.Op) bool {
		return n == 5 && op == allreduce.Min
	}},
	// The paths above run over shared memory where the OS has it (ranks of one process share
	// a machine); these pin TCP, and a world where rank 1 alone insists on TCP, so that its
	// pairs use TCP and the others shared memory. The reference is exact: every transport
	// gives the same bits.
	{"tcp", func(c *allreduce.Config) { c.Transport = allreduce.TransportTCP }, sizes, func(n int, dt string, op allreduce.Op) bool {
		return (dt == "float32" && op == allreduce.Sum && n <= 4) || (n == 3 && op == allreduce.Max)
	}},
	{"tcp-ring", func(c *allreduce.Config) { c.Transport = allreduce.TransportTCP; c.SmallBytes = 1 }, sizes, func(n int, dt string, op allreduce.Op) bool {
		return n == 4 && op == allreduce.Min
	}},
	{"mixed", func(c *allreduce.Config) {
		if c.Rank == 1 {
			c.Transport = allreduce.TransportTCP
		}
	}, sizes, func(n int, dt string, op allreduce.Op) bool {
		return (dt == "float64" && op == allreduce.Sum && n <= 5) || (n == 4 && dt == "int64")
	}},
	{"doubling", func(c *allreduce.Config) { c.SmallBytes = 1 << 30 }, sizes, func(n int, dt string, op allreduce.Op) bool {
		return (dt == "float32" && op == allreduce.Sum) || (n == 6 && op == allreduce.Max)
	}},
	{"chunk64", func(c *allreduce.Config) { c.SmallBytes = 1; c.ChunkBytes = 64 }, []int{0, 1, 7, 1000, 10007}, func(int, string, allreduce.Op) bool {
		return true
	}},
	// Ranks reading each other's buffers (process_vm_readv, here within one process: the
	// kernel's path is the same), from just above SmallBytes; then from 8 bytes per rank on,
	// so that segments of one element and empty ones are read too; then a world where rank 1
	// will not, which keeps every rank on the rings. From n=5 on no world reads directly.
	{"direct", func(c *allreduce.Config) { c.DirectBytes = 1 }, []int{0, 7, 1000, 16385, 100003, large}, func(n int, dt string, op allreduce.Op) bool {
		return n <= 4 && (op == allreduce.Sum || dt == "int64")
	}},
	{"direct-small", func(c *allreduce.Config) { c.DirectBytes = 1; c.SmallBytes = 1 }, []int{0, 1, 2, 3, 4, 5, 7, 1000, 10007}, func(int, string, allreduce.Op) bool {
		return false
	}},
	{"direct-refused", func(c *allreduce.Config) {
		c.DirectBytes = 1
		if c.Rank == 1 {
			c.DirectBytes = -1
		}
	}, []int{0, 7, 100003}, func(int, string, allreduce.Op) bool { return false }},
	// Ranks made to look like ranks of separate hosts (Config.HostID): alternate ranks on
	// two hosts, and hosts of three consecutive ranks; from n=3 on the world is uneven and
	// large messages take the hierarchical allreduce (hier_test.go covers it in depth).
	{"hosts=2", func(c *allreduce.Config) { c.HostID = fmt.Sprint("host ", c.Rank%2) }, sizes, func(n int, dt string, op allreduce.Op) bool {
		return (dt == "float32" && op == allreduce.Sum && n >= 3) || (n == 7 && op == allreduce.Max)
	}},
	{"hosts=n/3", func(c *allreduce.Config) { c.HostID = fmt.Sprint("host ", c.Rank/3); c.SmallBytes = 1 }, sizes, func(n int, dt string, op allreduce.Op) bool {
		return n == 8 && dt == "int64"
	}},
}

func TestAllreduce(t *testing.T) {
	for _, path := range allreducePaths {
		t.Run(path.name, func(t *testing.T) {
			for n := 1; n <= 8; n++ {
				t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
					// One world per n: the sub-tests also check that many operations of
					// every kind run in sequence on the same communicators.
					comms := newWorld(t, n, 1, nil, path.tweak)
					for _, size := range path.sizes {
						for _, dt := range []string{"float32", "float64", "int64"} {
							for _, op := range []allreduce.Op{allreduce.Sum, allreduce.Max, allreduce.Min} {
								if size == large && !path.large(n, dt, op) {
									continue
								}
								t.Run(fmt.Sprintf("%s/%s/size=%d", dt, op, size), func(t *testing.T) {
									checkAllreduceOf(t, dt, comms, size, op)
								})
							}
						}
					}
				})
			}
		})
	}
}

// TestAllreduceRandomFloat32 uses inputs whose sums round: the result depends on the order
// of additions, so it is only required to be bit-identical across ranks and close to the
// float64 reference.
func TestAllreduceRandomFloat32(t *testing.T) {
	for _, path := range allreducePaths {
		for _, n := range []int{2, 3, 5, 8} {
			for _, size := range []int{1000, 1<<18 + 5} {
				if path.name == "chunk64" && size > 1000 {
					size = 10007
				}
				t.Run(fmt.Sprintf("%s/n=%d/size=%d", path.name, n, size), func(t *testing.T) {
					comms := newWorld(t, n, 1, nil, path.tweak)
					rng := rand.New(rand.NewPCG(uint64(n), uint64(size)))
					bufs := make([][]float32, n)
					ref := make([]float64, size)
					mag := make([]float64, size)
					for r := range n {
						bufs[r] = make([]float32, size)
						for i := range bufs[r] {
							v := float32(rng.NormFloat64() * math.Exp2(float64(rng.IntN(20)-10)))
							bufs[r][i] = v
							ref[i] += float64(v)
							mag[i] += math.Abs(float64(v))
						}
					}
					mustAll(t, onAll(comms, func(r int, c *allreduce.Comm) error {
						return c.Allreduce(t.Context(), bufs[r], allreduce.Sum)
					}))
					all := make([][]byte, n)
					for r := range n {
						all[r] = raw(bufs[r])
					}
					sameBytes(t, all)
					// n-1 float32 additions, each off by at most half an ulp of a partial
					// sum bounded by the sum of magnitudes.
					for i, got := range bufs[0] {
						if tol := float64(n) * 0x1p-24 * mag[i]; math.Abs(float64(got)-ref[i]) > tol {
							t.Fatalf("[%d] = %v, float64 reference %v (tolerance %g)", i, got, ref[i], tol)
						}
					}
				})
			}
		}
	}
}

// TestAllreduceNaNPayloads: where two NaNs meet, the first operand's payload survives, so
// the ranks of an exchange must reduce in the same operand order to hold the same bits
// (recursive doubling: the lower rank's first). Every path, sums, maxima and minima of
// inputs a quarter NaN with distinct payloads and signs.
func TestAllreduceNaNPayloads(t *testing.T) {
	for _, path := range allreducePaths {
		for _, n := range []int{2, 3, 4, 5} {
			for _, op := range []allreduce.Op{allreduce.Sum, allreduce.Max, allreduce.Min} {
				t.Run(fmt.Sprintf("%s/n=%d/%s", path.name, n, op), func(t *testing.T) {
					comms := newWorld(t, n, 1, nil, path.tweak)
					rng := rand.New(rand.NewPCG(uint64(n), uint64(op)))
					for _, size := range []int{1000, 40000} {
						bufs := make([][]float32, n)
						for r := range n {
							bufs[r] = make([]float32, size)
							for i := range bufs[r] {
								bufs[r][i] = float32(rng.NormFloat64())
								if rng.IntN(4) == 0 {
									bufs[r][i] = math.Float32frombits(0x7fc00000 | uint32(rng.IntN(1<<22)) | uint32(rng.IntN(2))<<31)
								}
							}
						}
						mustAll(t, onAll(comms, func(r int, c *allreduce.Comm) error {
							return c.Allreduce(t.Context(), bufs[r], op)
						}))
						all := make([][]byte, n)
						for r := range n {
							all[r] = raw(bufs[r])
						}
						sameBytes(t, all)
					}
				})
			}
		}
	}
}

// patterned is rank r's buffer for Broadcast and Allgather: distinct on every rank, so a
// rank that kept its own bytes is caught.
func patterned(r, size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(r*31 + i*7 + i>>8)
	}
	return b
}

func TestBroadcast(t *testing.T) {
	worlds := []struct {
		name  string
		tweak func(*allreduce.Config)
		sizes []int
	}{
		// ChunkBytes 64: every size above 64 bytes is pipelined in several chunks.
		{"chunk64", func(c *allreduce.Config) { c.ChunkBytes = 64 }, []int{0, 1, 7, 64, 65, 1000}},
		{"default", nil, []int{0, 1, 1000, 300007}}, // 300007 > ChunkBytes (256 KiB)
	}
	for _, w := range worlds {
		for _, n := range []int{1, 2, 3, 4, 5, 8} {
			t.Run(fmt.Sprintf("%s/n=%d", w.name, n), func(t *testing.T) {
				comms := newWorld(t, n, 1, nil, w.tweak)
				for root := range n {
					for _, size := range w.sizes {
						t.Run(fmt.Sprintf("root=%d/bytes/size=%d", root, size), func(t *testing.T) {
							bufs := make([][]byte, n)
							for r := range n {
								bufs[r] = patterned(r, size)
							}
							mustAll(t, onAll(comms, func(r int, c *allreduce.Comm) error {
								return c.Broadcast(t.Context(), bufs[r], root)
							}))
							if want := patterned(root, size); !bytes.Equal(bufs[root], want) {
								t.Fatalf("root %d's own data changed", root)
							}
							sameBytes(t, bufs)
						})
					}
					// The typed buffers travel as their bytes.
					t.Run(fmt.Sprintf("root=%d/typed", root), func(t *testing.T) {
						f32 := make([][]float32, n)
						f64 := make([][]float64, n)
						i64 := make([][]int64, n)
						for r := range n {
							f32[r] = exactInput[float32](r, 1001)
							f64[r] = exactInput[float64](r, 77)
							i64[r] = exactInput[int64](r, 3)
						}
						mustAll(t, onAll(comms, func(r int, c *allreduce.Comm) error {
							if err := c.Broadcast(t.Context(), f32[r], root); err != nil {
								return err
							}
							if err := c.Broadcast(t.Context(), f64[r], root); err != nil {
								return err
							}
							return c.Broadcast(t.Context(), i64[r], root)
						}))
						for r := range n {
							for _, pair := range [][2][]byte{
								{raw(f32[r]), raw(exactInput[float32](root, 1001))},
								{raw(f64[r]), raw(exactInput[float64](root, 77))},
								{raw(i64[r]), raw(exactInput[int64](root, 3))},
							} {
								if !bytes.Equal(pair[0], pair[1]) {
									t.Fatalf("rank %d does not hold root %d's data", r, root)
								}
							}
						}
					})
				}
			})
		}
	}
}

// TestBroadcastThenClose: every rank closes its communicator as soon as its Broadcast
// returns, as a program that ends after sharing its state does. The root is done first and
// closes while the ranks after it still forward; they must not take that for its death.
func TestBroadcastThenClose(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		for _, size := range []int{1000, 262144, 3 << 20} {
			t.Run(fmt.Sprintf("n=%d/size=%d", n, size), func(t *testing.T) {
				comms := newWorld(t, n, 1, nil, nil)
				errs := onAll(comms, func(r int, c *allreduce.Comm) error {
					buf := patterned(r, size)
					err := c.Broadcast(t.Context(), buf, 0)
					c.Close()
					if err == nil && !bytes.Equal(buf, patterned(0, size)) {
						err = errors.New("not root's bytes")
					}
					return err
				})
				mustAll(t, errs)
			})
		}
	}
}

func TestAllgather(t *testing.T) {
	perRank := []int{0, 1000, 7, 300001, 0, 64, 1, 65}
	worlds := []struct {
		name  string
		tweak func(*allreduce.Config)
		limit int // largest per-rank size
	}{
		{"chunk64", func(c *allreduce.Config) { c.ChunkBytes = 64 }, 3001},
		{"default", nil, 300001},
	}
	for _, w := range worlds {
		for _, n := range []int{1, 2, 3, 4, 5, 8} {
			t.Run(fmt.Sprintf("%s/n=%d", w.name, n), func(t *testing.T) {
				comms := newWorld(t, n, 1, nil, w.tweak)
				for _, shape := range []string{"mixed", "empty", "rotated"} {
					t.Run(shape, func(t *testing.T) {
						size := func(r int) int {
							switch shape {
							case "empty":
								return 0
							case "rotated":
								return min(perRank[(r+3)%len(perRank)], w.limit)
							}
							return min(perRank[r], w.limit)
						}
						ins := make([][]byte, n)
						outs := make([][][]byte, n)
						for r := range n {
							ins[r] = patterned(r, size(r))
						}
						mustAll(t, onAll(comms, func(r int, c *allreduce.Comm) error {
							var err error
							outs[r], err = c.Allgather(t.Context(), ins[r])
							return err
						}))
						for r := range n {
							if len(outs[r]) != n {
								t.Fatalf("rank %d got %d blocks, want %d", r, len(outs[r]), n)
							}
							for q := range n {
								if !bytes.Equal(outs[r][q], patterned(q, size(q))) {
									t.Fatalf("rank %d: block of rank %d (%d bytes) differs from what rank %d sent (%d bytes)",
										r, q, len(outs[r][q]), q, size(q))
								}
							}
							// out[Rank()] is a copy: the caller may reuse its buffer.
							if len(ins[r]) > 0 {
								ins[r][0]++
								if outs[r][r][0] == ins[r][0] {
									t.Fatalf("rank %d: out[%d] aliases the input buffer", r, r)
								}
							}
						}
					})
				}
			})
		}
	}
}

// TestBarrier checks by timestamps that nobody leaves a barrier before the last rank enters
// it: each rank in turn enters late, after the others are already waiting.
func TestBarrier(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 5} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			comms := newWorld(t, n, 1, nil, nil)
			for late := range n {
				left := make([]time.Time, n)
				var lateEntered time.Time
				others := make(chan struct{}, n)
				mustAll(t, onAll(comms, func(r int, c *allreduce.Comm) error {
					if r == late {
						for range n - 1 {
							<-others
						}
						// Not a synchronisation: the others are about to block in Barrier;
						// the pause only makes a barrier that does not wait visibly wrong.
						time.Sleep(30 * time.Millisecond)
						lateEntered = time.Now()
					} else {
						others <- struct{}{}
					}
					err := c.Barrier(t.Context())
					left[r] = time.Now()
					return err
				}))
				for r, l := range left {
					if l.Before(lateEntered) {
						t.Fatalf("late rank %d: rank %d left the barrier %v before rank %d entered it",
							late, r, lateEntered.Sub(l), late)
					}
				}
			}
		})
	}
}

// TestMixedSequence runs a long sequence of different collectives on one world, each
// checked, with sizes on both sides of SmallBytes.
func TestMixedSequence(t *testing.T) {
	const n = 5
	comms := newWorld(t, n, 1, nil, func(c *allreduce.Config) {
		c.SmallBytes = 512
		c.ChunkBytes = 128
	})
	for i := range 60 {
		size := (i * 37) % 300
		switch i % 5 {
		case 0:
			checkAllreduce[float64](t, comms, size, allreduce.Sum)
		case 1:
			root := i % n
			bufs := make([][]byte, n)
			for r := range n {
				bufs[r] = patterned(r+i, size)
			}
			mustAll(t, onAll(comms, func(r int, c *allreduce.Comm) error {
				return c.Broadcast(t.Context(), bufs[r], root)
			}))
			sameBytes(t, bufs)
			if !bytes.Equal(bufs[0], patterned(root+i, size)) {
				t.Fatalf("op %d: broadcast from %d delivered the wrong bytes", i, root)
			}
		case 2:
			outs := make([][][]byte, n)
			mustAll(t, onAll(comms, func(r int, c *allreduce.Comm) error {
				var err error
				outs[r], err = c.Allgather(t.Context(), patterned(r, (size+r*50)%400))
				return err
			}))
			for r := range n {
				for q := range n {
					if !bytes.Equal(outs[r][q], patterned(q, (size+q*50)%400)) {
						t.Fatalf("op %d: rank %d holds a wrong block for rank %d", i, r, q)
					}
				}
			}
		case 3:
			mustAll(t, onAll(comms, func(_ int, c *allreduce.Comm) error { return c.Barrier(t.Context()) }))
		case 4:
			checkAllreduce[int64](t, comms, size, allreduce.Max)
			checkAllreduce[float32](t, comms, size/3, allreduce.Min)
		}
	}
}
