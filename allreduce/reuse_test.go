package allreduce_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/allreduce"
)

// member says how one member enters a generation.
type member struct {
	id     string
	noPrev bool // a restarted or joining worker: no previous communicator
	noID   bool // an old-style worker: no identity, no reuse
}

// nextGeneration builds generation gen of the members (rank = index), each carrying over
// from its communicator in prev unless told otherwise, then closes every communicator of
// prev, as the worker's reset does. It returns the new communicators in rank order.
func nextGeneration(t testing.TB, store allreduce.Store, gen uint64, members []member, prev map[string]*allreduce.Comm, tweak func(*allreduce.Config)) []*allreduce.Comm {
	t.Helper()
	comms := newWorld(t, len(members), gen, store, func(c *allreduce.Config) {
		m := members[c.Rank]
		if !m.noID {
			c.ID = m.id
		}
		if !m.noPrev {
			c.Previous = prev[m.id]
		}
		if tweak != nil {
			tweak(c)
		}
	})
	for _, c := range prev {
		c.Close()
	}
	return comms
}

func ids(names ...string) []member {
	ms := make([]member, len(names))
	for i, n := range names {
		ms[i] = member{id: n}
	}
	return ms
}

func byID(members []member, comms []*allreduce.Comm) map[string]*allreduce.Comm {
	m := map[string]*allreduce.Comm{}
	for r, c := range comms {
		m[members[r].id] = c
	}
	return m
}

// wantStats is what each rank of the new generation must report: a connection is reused
// exactly when its two members were neighbours in the old generation and both carry over.
// carries(m) says whether member m offers its old connections (it had an ID and a healthy
// previous communicator, and has both now).
func wantStats(old, next []member, carries func(m member) bool) []allreduce.Stats {
	adj := map[[2]string]bool{}
	for r := range old {
		for _, q := range allreduce.Neighbours(r, len(old)) {
			adj[[2]string{old[r].id, old[q].id}] = true
		}
	}
	want := make([]allreduce.Stats, len(next))
	for r, m := range next {
		for _, q := range allreduce.Neighbours(r, len(next)) {
			o := next[q]
			if carries(m) && carries(o) && adj[[2]string{m.id, o.id}] {
				want[r].Reused++
			} else {
				want[r].Fresh++
			}
		}
	}
	return want
}

func checkStats(t *testing.T, comms []*allreduce.Comm, want []allreduce.Stats) (reused, fresh int) {
	t.Helper()
	for r, c := range comms {
		want[r].SharedMemory = sameHostShm(want[r].Reused + want[r].Fresh)
		want[r].Hosts, want[r].HostRanks = 1, len(comms) // one machine, no HostID set
		allreduce.SetMachineRules(&want[r], len(comms))
		if got := c.Stats(); got != want[r] {
			t.Errorf("rank %d: %+v, want %+v", r, got, want[r])
		}
		reused += want[r].Reused
		fresh += want[r].Fresh
	}
	return reused, fresh
}

// checkCollectives runs a small (recursive doubling) and a large (ring) allreduce and a
// broadcast and checks them against the reference.
func checkCollectives(t *testing.T, comms []*allreduce.Comm) {
	t.Helper()
	checkAllreduce[float32](t, comms, 1000, allreduce.Sum)
	checkAllreduce[float64](t, comms, 100003, allreduce.Max)
	bufs := make([][]byte, len(comms))
	for r := range bufs {
		bufs[r] = make([]byte, 70000)
		if r == len(comms)-1 {
			for i := range bufs[r] {
				bufs[r][i] = byte(i * 7)
			}
		}
	}
	mustAll(t, onAll(comms, func(r int, c *allreduce.Comm) error {
		return c.Broadcast(t.Context(), bufs[r], len(comms)-1)
	}))
	sameBytes(t, bufs)
}

// A second generation of the same members in the same order reuses every connection, and
// so does a third built from the second; the collectives stay correct, and the retired
// communicators refuse collectives.
func TestReuseSameWorld(t *testing.T) {
	for _, secret := range []string{"", "job secret"} {
		t.Run(fmt.Sprintf("secret=%t", secret != ""), func(t *testing.T) {
			store := allreduce.NewMemStore()
			tweak := func(c *allreduce.Config) { c.Secret = []byte(secret) }
			ms := ids("a", "b", "c", "d")
			g1 := nextGeneration(t, store, 1, ms, nil, tweak)
			checkAllreduce[float32](t, g1, 1000, allreduce.Sum)
			for r, c := range g1 {
				if got := c.Stats(); got.Reused != 0 || got.Fresh != 3 {
					t.Fatalf("generation 1, rank %d: %+v, want 3 fresh connections", r, got)
				}
			}

			g2 := newWorld(t, 4, 2, store, func(c *allreduce.Config) {
				tweak(c)
				c.ID, c.Previous = ms[c.Rank].id, g1[c.Rank]
			})
			for r, c := range g2 {
				want := allreduce.Stats{Reused: 3, SharedMemory: sameHostShm(3), Hosts: 1, HostRanks: 4}
				allreduce.SetMachineRules(&want, 4)
				if got := c.Stats(); got != want {
					t.Errorf("generation 2, rank %d: %+v, want all 3 connections reused", r, got)
				}
			}
			// The retired communicators refuse work (their connections are gone) and close
			// without touching the connections handed over.
			for r, c := range g1 {
				if err := c.Barrier(t.Context()); !errors.Is(err, allreduce.ErrClosed) {
					t.Fatalf("generation 1, rank %d, after the hand-over: Barrier: %v, want ErrClosed", r, err)
				}
				c.Close()
			}
			checkCollectives(t, g2)

			g3 := nextGeneration(t, store, 3, ms, byID(ms, g2), tweak)
			checkStats(t, g3, wantStats(ms, ms, func(member) bool { return true }))
			checkCollectives(t, g3)
		})
	}
}

// Members leave, join, swap ranks, restart or come without an identity: connections between
// members that are neighbours again and both carry over are reused, all others are made
// afresh, nothing hangs, and the collectives stay correct.
func TestReuseChangedWorld(t *testing.T) {
	eight := ids("a", "b", "c", "d", "e", "f", "g", "h")
	reversed := slices.Clone(eight)
	slices.Reverse(reversed)
	rotated := append(slices.Clone(eight[3:]), eight[:3]...)
	swapped := slices.Clone(eight)
	swapped[1], swapped[4] = swapped[4], swapped[1]
	joined := append(slices.Clone(eight[:4]), member{id: "new", noPrev: true})
	restarted := slices.Clone(eight)
	restarted[2].noPrev = true
	anonymous := slices.Clone(eight)
	anonymous[5].noID = true
	for _, tc := range []struct {
		name      string
		old, next []member
		mixed     bool // both reused and fresh connections expected
	}{
		{"4 to 3, last leaves", ids("a", "b", "c", "d"), ids("a", "b", "c"), false},
		{"4 to 3, second leaves", ids("a", "b", "c", "d"), ids("a", "c", "d"), false},
		{"8 to 7, a middle one leaves", eight, append(slices.Clone(eight[:3]), eight[4:]...), true},
		{"8 to 5, three leave", eight, ids("a", "c", "e", "g", "h"), true},
		{"same members reversed", eight, reversed, false}, // r → 7-r keeps every pair
		{"two members swap ranks", eight, swapped, true},
		{"same members rotated", eight, rotated, true},
		{"4 to 5, one joins", eight[:4], joined, true},
		{"a member restarted", eight, restarted, true},
		{"a member without ID", eight, anonymous, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := allreduce.NewMemStore()
			g1 := nextGeneration(t, store, 1, tc.old, nil, nil)
			checkAllreduce[int64](t, g1, 77, allreduce.Sum)
			g2 := nextGeneration(t, store, 2, tc.next, byID(tc.old, g1), nil)
			reused, fresh := checkStats(t, g2, wantStats(tc.old, tc.next, func(m member) bool { return !m.noPrev && !m.noID }))
			t.Logf("%d connection ends reused, %d fresh", reused, fresh)
			if reused == 0 || (tc.mixed && fresh == 0) {
				t.Fatalf("scenario reuses %d and makes %d afresh: it tests nothing", reused, fresh)
			}
			checkCollectives(t, g2)
		})
	}
}

// A member that ran ahead in the old generation left frames its neighbour never read (here
// the root of a broadcast the others never joined). They must be discarded, not delivered
// to the new generation, and the connection is still reused.
func TestReuseDiscardsStaleFrames(t *testing.T) {
	store := allreduce.NewMemStore()
	ms := ids("a", "b", "c", "d")
	g1 := nextGeneration(t, store, 1, ms, nil, func(c *allreduce.Config) { c.ChunkBytes = 4096 })
	data := make([]byte, 20000)
	for range 3 {
		if err := g1[0].Broadcast(t.Context(), data, 0); err != nil {
			t.Fatalf("rank 0 alone: Broadcast: %v", err)
		}
	}
	g2 := nextGeneration(t, store, 2, ms, byID(ms, g1), nil)
	checkStats(t, g2, wantStats(ms, ms, func(member) bool { return true }))
	checkCollectives(t, g2)
}

// A communicator whose collective failed, here with a write cut off mid-frame when its
// context ended, carries nothing over; its neighbours still reuse what links them.
func TestReuseNeverCarriesBrokenConnections(t *testing.T) {
	store := allreduce.NewMemStore()
	ms := ids("a", "b", "c", "d")
	g1 := nextGeneration(t, store, 1, ms, nil, nil)
	// Rank 0 alone starts a 16 MiB ring allreduce: its first 1 MiB chunk fills the socket
	// buffers of neighbours that never read, and the write stops mid-frame at the deadline. The
	// deadline leaves a loaded machine (-race, a busy CI runner) time to start writing at all: a
	// deadline that passes before the first byte leaves the connections whole, and reusable.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	err := g1[0].Allreduce(ctx, make([]float32, 4<<20), allreduce.Sum)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("rank 0 alone: Allreduce: %v, want the context's deadline", err)
	}
	g2 := nextGeneration(t, store, 2, ms, byID(ms, g1), nil)
	reused, fresh := checkStats(t, g2, wantStats(ms, ms, func(m member) bool { return m.id != "a" }))
	if reused == 0 || fresh == 0 {
		t.Fatalf("reused %d, fresh %d: want both", reused, fresh)
	}
	checkCollectives(t, g2)
}

// A neighbour that agreed to carry over a connection but never sends its rehello (hung)
// fails New within Config.Timeout; an abandoned generation ends the wait at once.
func TestReuseHungPeer(t *testing.T) {
	for _, abandon := range []bool{false, true} {
		t.Run(fmt.Sprintf("abandon=%t", abandon), func(t *testing.T) {
			store := allreduce.NewMemStore()
			ms := ids("a", "b")
			g1 := nextGeneration(t, store, 1, ms, nil, nil)
			// b publishes that it keeps its connection to a, then never calls New.
			rec := `{"addr":"127.0.0.1:9","id":"b","prev":1,"keep":["a"]}`
			if err := store.Set(t.Context(), "allreduce/g2/addr/1", []byte(rec)); err != nil {
				t.Fatal(err)
			}
			timeout := 500 * time.Millisecond
			if abandon {
				timeout = 30 * time.Second
				time.AfterFunc(100*time.Millisecond, func() {
					allreduce.Abandon(context.Background(), store, 2, "b reset")
				})
			}
			start := time.Now()
			c, err := allreduce.New(t.Context(), allreduce.Config{
				Rank: 0, Size: 2, Generation: 2, Store: store, Timeout: timeout, ID: "a", Previous: g1[0],
			})
			took := time.Since(start)
			if c != nil {
				c.Close()
			}
			if err == nil {
				t.Fatal("New succeeded without the peer's rehello")
			}
			if abandon && !errors.Is(err, allreduce.ErrPeerLost) {
				t.Fatalf("New: %v, want ErrPeerLost", err)
			}
			if limit := min(timeout, 5*time.Second) + 2*time.Second; took > limit {
				t.Fatalf("New returned after %v, want within %v: %v", took, limit, err)
			}
			t.Logf("New returned after %v: %v", took.Round(time.Millisecond), err)
		})
	}
}

func TestReuseConfig(t *testing.T) {
	store := allreduce.NewMemStore()
	g := newWorld(t, 2, 5, store, nil)
	_, err := allreduce.New(t.Context(), allreduce.Config{Rank: 0, Size: 2, Generation: 5, Store: store, ID: "a", Previous: g[0]})
	if err == nil || !strings.Contains(err.Error(), "Previous is generation 5") {
		t.Fatalf("New with a Previous of the same generation: %v, want a config error", err)
	}
}

// TestReuseNoLeak runs 50 generations with reuse, members leaving, joining and changing
// ranks, and a failed collective now and then: goroutines and file descriptors must return
// to where they started.
func TestReuseNoLeak(t *testing.T) {
	const rounds = 50
	store := allreduce.NewMemStore()
	pool := ids("a", "b", "c", "d", "e", "f")
	rng := rand.New(rand.NewPCG(1, 2))
	var prev map[string]*allreduce.Comm
	var members []member
	totalReused := 0
	round := func(gen uint64) {
		members = slices.Clone(pool)
		rng.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
		members = members[:3+rng.IntN(4)]
		comms := nextGeneration(t, store, gen, members, prev, nil)
		for _, c := range comms {
			totalReused += c.Stats().Reused
		}
		if gen%10 == 3 { // mismatched lengths: every rank fails, nothing carries over
			errs := onAll(comms, func(r int, c *allreduce.Comm) error {
				return c.Allreduce(t.Context(), make([]float32, 100+r%2), allreduce.Sum)
			})
			for r, err := range errs {
				if err == nil {
					t.Fatalf("generation %d: rank %d: mismatched Allreduce succeeded", gen, r)
				}
			}
		} else {
			mustAll(t, onAll(comms, func(r int, c *allreduce.Comm) error {
				return c.Allreduce(t.Context(), make([]float32, 1<<15), allreduce.Sum)
			}))
		}
		prev = byID(members, comms)
	}
	round(1000) // warm up
	for _, c := range prev {
		c.Close()
	}
	prev = nil
	base := measure()
	for gen := range uint64(rounds) {
		round(gen + 1)
	}
	for _, c := range prev {
		c.Close()
	}
	if totalReused == 0 {
		t.Fatal("no connection was reused in 50 generations")
	}
	var now usage
	deadline := time.Now().Add(10 * time.Second)
	for {
		now = measure()
		if now.goroutines <= base.goroutines && now.fds <= base.fds {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("after %d generations: %d goroutines (baseline %d), %d fds (baseline %d); goroutines:\n%s",
				rounds, now.goroutines, base.goroutines, now.fds, base.fds, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond) // polling the runtime, which has no signal to wait on
	}
	t.Logf("%d generations, %d connection ends reused: goroutines %d→%d, fds %d→%d",
		rounds, totalReused, base.goroutines, now.goroutines, base.fds, now.fds)
}
