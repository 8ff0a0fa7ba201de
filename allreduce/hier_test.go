package allreduce_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/allreduce"
)

// onHosts makes ranks of this process look like ranks of separate hosts: rank r's HostID is
// the letter spec[r], so "AAAB" is three ranks on one host and one on another. Ranks of one
// letter use shared memory with each other (where the OS has it), the others TCP.
func onHosts(spec string) func(*allreduce.Config) {
	return func(c *allreduce.Config) { c.HostID = "host " + spec[c.Rank:c.Rank+1] }
}

func hostCount(spec string) int {
	seen := map[rune]bool{}
	for _, h := range spec {
		seen[h] = true
	}
	return len(seen)
}

// topologies are the host layouts the hierarchical allreduce is tested on: uneven hosts,
// hosts of one rank, hosts whose ranks are not consecutive.
var topologies = []struct{ name, spec string }{
	{"3+1", "AAAB"},
	{"1+3", "ABBB"},
	{"2+2", "AABB"},
	{"2+2/interleaved", "ABAB"},
	{"2+2+2", "AABBCC"},
	{"4+4", "AAAABBBB"},
	{"3+2+1/scattered", "ABCABA"},
	{"2+1+1+1", "AABCD"},
}

// TestHierarchical runs exact allreduces of every dtype, op and awkward size on every
// topology, checks the result and that all ranks hold the same bits, and that the
// hierarchical path really ran (Stats) whenever the size is past the doubling threshold.
func TestHierarchical(t *testing.T) {
	paths := []struct {
		name  string
		tweak func(*allreduce.Config)
		sizes []int
	}{
		// SmallBytes 1: every size with at least one element per rank goes hierarchical,
		// so slices and ring pieces of zero and one element are covered.
		{"small1", func(c *allreduce.Config) { c.SmallBytes = 1 }, []int{0, 1, 7, 8, 13, 1000, 10007}},
		// 64-byte chunks: many chunks per slice in every phase.
		{"chunk64", func(c *allreduce.Config) { c.SmallBytes = 1; c.ChunkBytes = 64 }, []int{9, 1001, 10007}},
	}
	for _, topo := range topologies {
		n := len(topo.spec)
		for _, path := range paths {
			t.Run(topo.name+"/"+path.name, func(t *testing.T) {
				comms := newWorld(t, n, 1, nil, func(c *allreduce.Config) {
					onHosts(topo.spec)(c)
					path.tweak(c)
				})
				for r, c := range comms {
					s := c.Stats()
					local := strings.Count(topo.spec, topo.spec[r:r+1])
					if s.Hosts != hostCount(topo.spec) || s.HostRanks != local {
						t.Fatalf("rank %d: %+v, want Hosts %d, HostRanks %d", r, s, hostCount(topo.spec), local)
					}
					if want := sameHostShm(local - 1); s.SharedMemory != want {
						t.Fatalf("rank %d: %d peers over shared memory, want its %d host peers", r, s.SharedMemory, want)
					}
				}
				for _, size := range path.sizes {
					for _, dt := range []string{"float32", "float64", "int64"} {
						for _, op := range []allreduce.Op{allreduce.Sum, allreduce.Max, allreduce.Min} {
							t.Run(fmt.Sprintf("%s/%s/size=%d", dt, op, size), func(t *testing.T) {
								before := comms[0].Stats().Hierarchical
								checkAllreduceOf(t, dt, comms, size, op)
								hier := size >= n // fewer elements than ranks: recursive doubling
								for r, c := range comms {
									if got := c.Stats().Hierarchical - before; got != map[bool]uint64{true: 1}[hier] {
										t.Fatalf("rank %d: %d hierarchical allreduces, want %d of one with %d elements", r, got, map[bool]uint64{true: 1}[hier], size)
									}
								}
							})
						}
					}
				}
			})
		}
	}
}

// TestHierarchicalDefault runs the default configuration with a large odd size on each
// topology: the default chunk and threshold, several chunks per slice.
func TestHierarchicalDefault(t *testing.T) {
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			comms := newWorld(t, len(topo.spec), 1, nil, onHosts(topo.spec))
			checkAllreduce[float32](t, comms, large, allreduce.Sum)
			checkAllreduce[int64](t, comms, 300007, allreduce.Max)
			checkAllreduce[float64](t, comms, 1000, allreduce.Min) // small: doubling
			for r, c := range comms {
				if got := c.Stats().Hierarchical; got != 2 {
					t.Fatalf("rank %d: %d hierarchical allreduces, want the 2 large ones", r, got)
				}
			}
		})
	}
}

// TestFlatTopologies: one host, or one rank per host, keeps the flat algorithms and
// connects exactly the flat neighbours.
func TestFlatTopologies(t *testing.T) {
	for _, spec := range []string{"AAAA", "ABCD", "ABCDE", "A"} {
		t.Run(spec, func(t *testing.T) {
			n := len(spec)
			comms := newWorld(t, n, 1, nil, onHosts(spec))
			checkAllreduce[float32](t, comms, 100003, allreduce.Sum)
			for r, c := range comms {
				s := c.Stats()
				if s.Hierarchical != 0 || s.Fresh != len(allreduce.Neighbours(r, n)) || s.Hosts != hostCount(spec) {
					t.Fatalf("rank %d: %+v, want the flat ring, %d connections, %d hosts", r, s, len(allreduce.Neighbours(r, n)), hostCount(spec))
				}
			}
		})
	}
}

// TestHierarchicalConnections: the hierarchical world adds to the flat neighbours only the
// rank's host and its slices' ring partners, far from a full mesh: for 4+4+4+4, at most 3
// host peers and 2 ring partners on top of the flat set.
func TestHierarchicalConnections(t *testing.T) {
	spec := "AAAABBBBCCCCDDDD"
	n := len(spec)
	comms := newWorld(t, n, 1, nil, onHosts(spec))
	for r, c := range comms {
		s := c.Stats()
		if limit := len(allreduce.Neighbours(r, n)) + 3 + 2; s.Fresh > limit || s.Fresh < 4 {
			t.Errorf("rank %d: %d connections, want between its 3 host peers + 1 and %d", r, s.Fresh, limit)
		}
		if s.SharedMemory != sameHostShm(3) {
			t.Errorf("rank %d: %d over shared memory, want its 3 host peers", r, s.SharedMemory)
		}
	}
	checkAllreduce[float32](t, comms, 100003, allreduce.Sum)
}

// TestHierarchicalClosed: a rank of one host closes in the middle of a run of allreduces;
// every rank of every host fails promptly with a PeerError naming it, including ranks that
// exchange data only with their own host and ring partners on other hosts.
func TestHierarchicalClosed(t *testing.T) {
	for _, tc := range []struct {
		spec   string
		victim int
	}{{"AABBCC", 5}, {"AAAB", 3}, {"AAAB", 1}} {
		t.Run(fmt.Sprintf("%s/victim=%d", tc.spec, tc.victim), func(t *testing.T) {
			n := len(tc.spec)
			comms := newWorld(t, n, 1, nil, func(c *allreduce.Config) {
				onHosts(tc.spec)(c)
				c.Timeout = misuseTimeout
				c.ChunkBytes = 4096 // many chunks in flight when the close lands
			})
			var closedAt time.Time
			type result struct {
				err error
				at  time.Time
			}
			res := make([]result, n)
			onAll(comms, func(r int, c *allreduce.Comm) error {
				buf := make([]float32, 1<<18)
				for i := 0; ; i++ {
					if err := c.Allreduce(t.Context(), buf, allreduce.Sum); err != nil {
						res[r] = result{err, time.Now()}
						return nil
					}
					if r == tc.victim && i == 3 {
						closedAt = time.Now()
						go c.Close()
					}
				}
			})
			for r, x := range res {
				if r == tc.victim {
					if !errors.Is(x.err, allreduce.ErrClosed) {
						t.Errorf("victim: %v, want ErrClosed", x.err)
					}
					continue
				}
				mustPeerLost(t, fmt.Sprintf("rank %d", r), x.err, tc.victim)
				if d := x.at.Sub(closedAt); d > prompt {
					t.Errorf("rank %d failed %v after the close", r, d)
				}
			}
		})
	}
}

// TestHierarchicalReuse: a second generation of the same members on the same hosts carries
// every connection over, the hierarchical ones included, and still reduces hierarchically.
func TestHierarchicalReuse(t *testing.T) {
	spec := "AAABBC"
	n := len(spec)
	store := allreduce.NewMemStore()
	tweak := func(prev []*allreduce.Comm) func(*allreduce.Config) {
		return func(c *allreduce.Config) {
			onHosts(spec)(c)
			c.ID = fmt.Sprintf("%c/%d", spec[c.Rank], c.Rank)
			if prev != nil {
				c.Previous = prev[c.Rank]
			}
		}
	}
	g1 := newWorld(t, n, 1, store, tweak(nil))
	checkAllreduce[float32](t, g1, 100003, allreduce.Sum)
	g2 := newWorld(t, n, 2, store, tweak(g1))
	for r, c := range g2 {
		s1, s2 := g1[r].Stats(), c.Stats()
		if s2.Fresh != 0 || s2.Reused != s1.Fresh {
			t.Errorf("rank %d: generation 2 %+v after generation 1 %+v: want every connection reused", r, s2, s1)
		}
		if s2.SharedMemory != s1.SharedMemory {
			t.Errorf("rank %d: %d peers over shared memory, was %d", r, s2.SharedMemory, s1.SharedMemory)
		}
	}
	checkAllreduce[float32](t, g2, 100003, allreduce.Sum)
	for r, c := range g2 {
		if c.Stats().Hierarchical != 1 {
			t.Errorf("rank %d: %+v, want one hierarchical allreduce", r, c.Stats())
		}
	}
}
