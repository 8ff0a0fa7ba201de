package allreduce_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/elasticd/elasticd/allreduce"
)

// BenchmarkAllreduce measures an in-process float32 Sum over shared memory (where the OS has
// it) and over loopback TCP; MB/s is bytes of the buffer reduced per second on each rank.
func BenchmarkAllreduce(b *testing.B) {
	for _, tr := range []string{allreduce.TransportAuto, allreduce.TransportTCP} {
		for _, n := range []int{2, 4} {
			for _, size := range []struct {
				name  string
				bytes int
			}{{"4KB", 4 << 10}, {"1MB", 1 << 20}, {"64MB", 64 << 20}} {
				b.Run(fmt.Sprintf("%s/n=%d/%s", tr, n, size.name), func(b *testing.B) {
					benchAllreduce(b, tr, n, size.bytes)
				})
			}
		}
	}
}

func benchAllreduce(b *testing.B, transport string, n, bytes int) {
	comms := newWorld(b, n, 1, nil, func(c *allreduce.Config) { c.Transport = transport })
	bufs := make([][]float32, n)
	for r := range bufs {
		bufs[r] = make([]float32, bytes/4)
	}
	b.SetBytes(int64(bytes))
	b.ReportAllocs()
	b.ResetTimer()
	errs := onAll(comms, func(r int, c *allreduce.Comm) error {
		for range b.N {
			if err := c.Allreduce(b.Context(), bufs[r], allreduce.Sum); err != nil {
				return err
			}
		}
		return nil
	})
	b.StopTimer()
	mustAll(b, errs)
}

// BenchmarkHierarchical compares, on one world of simulated hosts (Config.HostID: ranks of
// one letter share memory, the others talk loopback TCP), three ways of one float32 Sum on
// the same connections: the hierarchical allreduce with a slice per local rank, the same
// with one leader per host, and the flat ring. They alternate within one run, so all three
// see the same machine load; the medians are reported side by side with their ratios
// (above 1: the slices are faster). An op is one of each, hence SetBytes of three buffers.
func BenchmarkHierarchical(b *testing.B) {
	for _, spec := range []string{"AABB", "AAAB", "AAAABBBB"} {
		for _, size := range []struct {
			name  string
			bytes int
		}{{"1MB", 1 << 20}, {"16MB", 16 << 20}} {
			b.Run(fmt.Sprintf("hosts=%s/%s", spec, size.name), func(b *testing.B) {
				n := len(spec)
				comms := newWorld(b, n, 1, nil, onHosts(spec))
				bufs := make([][]float32, n)
				for r := range bufs {
					bufs[r] = make([]float32, size.bytes/4)
				}
				// run times one allreduce on every rank, with each rank's comm set up by
				// hook (Flatten, Leaders, or nil for the default) and restored after.
				run := func(hook func(*allreduce.Comm) func()) time.Duration {
					if hook != nil {
						for _, c := range comms {
							defer hook(c)()
						}
					}
					start := time.Now()
					mustAll(b, onAll(comms, func(r int, c *allreduce.Comm) error {
						return c.Allreduce(b.Context(), bufs[r], allreduce.Sum)
					}))
					return time.Since(start)
				}
				// Warm up every path: buffers, scratch space, page faults.
				run(nil)
				run(allreduce.Leaders)
				run(allreduce.Flatten)
				var sliced, leader, flat []time.Duration
				b.SetBytes(3 * int64(size.bytes))
				b.ResetTimer()
				for range b.N {
					sliced = append(sliced, run(nil))
					leader = append(leader, run(allreduce.Leaders))
					flat = append(flat, run(allreduce.Flatten))
				}
				b.StopTimer()
				if got := comms[0].Stats().Hierarchical; got != 2*uint64(b.N)+2 {
					b.Fatalf("%d hierarchical allreduces, want %d", got, 2*b.N+2)
				}
				ms, ml, mf := median(sliced), median(leader), median(flat)
				b.ReportMetric(float64(ms.Microseconds()), "µs/sliced")
				b.ReportMetric(float64(ml.Microseconds()), "µs/leader")
				b.ReportMetric(float64(mf.Microseconds()), "µs/flat")
				b.ReportMetric(float64(mf)/float64(ms), "flat/sliced")
				b.ReportMetric(float64(ml)/float64(ms), "leader/sliced")
			})
		}
	}
}

// BenchmarkReset measures a reset of n members on loopback, from the start of New on every
// rank to the previous generation closed on every rank: once carrying connections over
// (New with ID and Previous, then Close of the previous communicator) and once as before
// (Close, then New from scratch), alternating within one run. The medians are reported side
// by side, with their ratio. The in-memory store costs nothing here; a real store's round
// trips (publish, look up) are the same with and without reuse.
func BenchmarkReset(b *testing.B) {
	for _, n := range []int{4, 8} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			store := allreduce.NewMemStore()
			ms := make([]member, n)
			for r := range ms {
				ms[r] = member{id: fmt.Sprintf("host%d/0", r)}
			}
			gen := uint64(0)
			// build makes a generation of every member; with IDs, carrying over from prev.
			build := func(prev []*allreduce.Comm, withIDs bool) []*allreduce.Comm {
				gen++
				return newWorld(b, n, gen, store, func(c *allreduce.Config) {
					if withIDs {
						c.ID = ms[c.Rank].id
					}
					if prev != nil {
						c.Previous = prev[c.Rank]
					}
				})
			}
			closeAll := func(comms []*allreduce.Comm) {
				for _, c := range comms {
					c.Close()
				}
			}
			var reuse, fresh []time.Duration
			cur := build(nil, true)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				next := build(cur, true)
				closeAll(cur)
				reuse = append(reuse, time.Since(start))
				for r, c := range next {
					if s := c.Stats(); s.Fresh != 0 {
						b.Fatalf("rank %d: %+v, want every connection reused", r, s)
					}
				}

				start = time.Now()
				closeAll(next)
				scratch := build(nil, false)
				fresh = append(fresh, time.Since(start))

				b.StopTimer() // the next reuse needs a previous generation with IDs
				closeAll(scratch)
				cur = build(nil, true)
				b.StartTimer()
			}
			b.StopTimer()
			closeAll(cur)
			mr, mf := median(reuse), median(fresh)
			b.ReportMetric(float64(mr.Microseconds()), "µs/reset-reuse")
			b.ReportMetric(float64(mf.Microseconds()), "µs/reset-fresh")
			b.ReportMetric(float64(mf)/float64(mr), "fresh/reuse")
		})
	}
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
