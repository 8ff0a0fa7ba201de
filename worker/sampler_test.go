package worker

// This file is an internal test: it drives the real State (Register, Step, Restore, Sync)
// with workers that hold only a communicator, so the sampler is tested through the same
// commit/restore path as in a job, without a rendezvous server.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/allreduce"
)

func TestSamplerShardsPartitionTheRemainder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for iter := range 200 {
		n := 1 + rng.IntN(300)
		s, err := NewSampler(n, uint64(iter), 1+rng.IntN(40))
		if err != nil {
			t.Fatal(err)
		}
		left := map[int]bool{}
		for i := range n {
			if rng.IntN(3) == 0 {
				s.done[i/64] |= 1 << (i % 64)
			} else {
				left[i] = true
			}
		}
		size := 1 + rng.IntN(9)
		seen := map[int]bool{}
		lo, hi := n, 0
		for r := range size {
			sh := s.Shard(r, size)
			lo, hi = min(lo, len(sh)), max(hi, len(sh))
			for _, i := range sh {
				if seen[i] || !left[i] {
					t.Fatalf("iter %d: index %d dealt twice or already processed", iter, i)
				}
				seen[i] = true
			}
		}
		if len(seen) != len(left) {
			t.Fatalf("iter %d: dealt %d of the %d unprocessed indices", iter, len(seen), len(left))
		}
		if hi-lo > 1 {
			t.Fatalf("iter %d: shares over %d ranks range from %d to %d, want within 1", iter, size, lo, hi)
		}
		// After a reset to this world, each rank's first step is the head of its share, and
		// the step's batch is split within 1.
		step := 0
		lo, hi = n, 0
		for r := range size {
			next := s.Next(fakeComm{rank: r, size: size, gen: uint64(iter)})
			if sh := s.Shard(r, size); len(next) > len(sh) || !slices.Equal(next, sh[:len(next)]) {
				t.Fatalf("iter %d: rank %d's first step %v is not the head of its share %v", iter, r, next, sh)
			}
			s.cur = nil // as if another process
			step += len(next)
			lo, hi = min(lo, len(next)), max(hi, len(next))
		}
		if step != min(s.batch, len(left)) || hi-lo > 1 {
			t.Fatalf("iter %d: the first step takes %d indices split %d..%d, want %d split within 1", iter, step, lo, hi, min(s.batch, len(left)))
		}
	}
}

func TestSamplerRejectsBadConfigAndForeignState(t *testing.T) {
	if _, err := NewSampler(0, 1, 1); err == nil {
		t.Fatal("a data set of 0 was accepted")
	}
	if _, err := NewSampler(10, 1, 0); err == nil {
		t.Fatal("a batch of 0 was accepted")
	}
	a, _ := NewSampler(10, 1, 2)
	b, _ := NewSampler(11, 1, 2)
	saved, _ := a.MarshalBinary()
	if err := b.UnmarshalBinary(saved); err == nil {
		t.Fatal("a state for another data set size was accepted")
	}
	if err := a.UnmarshalBinary([]byte("nonsense")); err == nil {
		t.Fatal("garbage was accepted")
	}
	if err := a.Record(t.Context(), soloComm{}); err == nil {
		t.Fatal("Record without Next was accepted")
	}
}

// fakeComm names a place in a world; it cannot gather.
type fakeComm struct {
	rank, size int
	gen        uint64
}

func (c fakeComm) Rank() int          { return c.rank }
func (c fakeComm) Size() int          { return c.size }
func (c fakeComm) Generation() uint64 { return c.gen }
func (fakeComm) Allgather(context.Context, []byte) ([][]byte, error) {
	return nil, errors.New("fakeComm cannot gather")
}

// soloComm is a world of one.
type soloComm struct{}

func (soloComm) Rank() int          { return 0 }
func (soloComm) Size() int          { return 1 }
func (soloComm) Generation() uint64 { return 1 }
func (soloComm) Allgather(_ context.Context, b []byte) ([][]byte, error) {
	return [][]byte{slices.Clone(b)}, nil
}

func TestSamplerEpochsUseNewPermutations(t *testing.T) {
	s, _ := NewSampler(50, 9, 7)
	var epochs [3][]int
	for s.Epoch() < 3 {
		e := s.Epoch()
		epochs[e] = append(epochs[e], s.Next(soloComm{})...)
		if err := s.Record(t.Context(), soloComm{}); err != nil {
			t.Fatal(err)
		}
	}
	for e, got := range epochs {
		if sorted := slices.Sorted(slices.Values(got)); len(got) != 50 || sorted[0] != 0 || sorted[49] != 49 || len(slices.Compact(sorted)) != 50 {
			t.Fatalf("epoch %d: %d indices, not a permutation of 0..49", e, len(got))
		}
	}
	if slices.Equal(epochs[0], epochs[1]) {
		t.Fatal("epochs 0 and 1 used the same order")
	}
}

// simRank is one worker process of the simulation.
type simRank struct {
	w     *Worker
	st    *State
	s     *Sampler
	model []int64 // model[e*n+i]: how often index i went into the model in epoch e
	name  string
}

const (
	simN      = 157
	simBatch  = 12
	simEpochs = 3
)

func newSimRank(t *testing.T, name string, commitEvery int) *simRank {
	s, err := NewSampler(simN, 42, simBatch)
	if err != nil {
		t.Fatal(err)
	}
	w := &Worker{log: slog.New(slog.DiscardHandler), hostAddr: "127.0.0.1", secret: []byte("0123456789abcdef")}
	t.Cleanup(func() {
		if w.peers != nil {
			w.peers.Close()
		}
	})
	m := &simRank{w: w, s: s, model: make([]int64, simEpochs*simN), name: name}
	m.st = NewState(m.w)
	m.st.CommitEvery = commitEvery
	if err := m.st.Register("model", m.model); err != nil {
		t.Fatal(err)
	}
	if err := m.st.Register("sampler", s); err != nil {
		t.Fatal(err)
	}
	return m
}

var errKilled = errors.New("killed")

// event is what happens to one generation: at step `at` (counted from the generation's
// start) rank `who` dies (kill, at a phase of the step) or hears of a host change.
type event struct {
	kill      bool
	who, at   int
	phase     int // kill: 0 before Next, 1 after the update, 2 after Record, 3 during the allreduce
	leave     bool
	joinCount int
}

// train runs one rank for one generation, as the body of worker.Run does.
func (m *simRank) train(ctx context.Context, ev event) error {
	if err := m.st.Sync(ctx); err != nil {
		return err
	}
	c := m.w.comm
	grad := make([]int64, len(m.model))
	for step := 0; m.s.Epoch() < simEpochs; step++ {
		mine := ev.who == c.Rank() && ev.at == step
		if mine && ev.kill && ev.phase == 0 {
			c.Close()
			return errKilled
		}
		if mine && !ev.kill {
			m.w.latest.Add(1) // this rank hears of a host change; CheckHosts spreads it
		}
		e := m.s.Epoch()
		clear(grad)
		for _, i := range m.s.Next(c) {
			grad[e*simN+i]++
		}
		var killer sync.WaitGroup
		if mine && ev.kill && ev.phase == 3 {
			killer.Go(func() { time.Sleep(time.Duration(ev.at%5) * 100 * time.Microsecond); c.Close() })
		}
		err := c.Allreduce(ctx, grad, allreduce.Sum)
		killer.Wait()
		if mine && ev.kill && ev.phase == 3 {
			return errKilled
		}
		if err != nil {
			return err
		}
		for i, g := range grad {
			m.model[i] += g
		}
		if mine && ev.kill && ev.phase == 1 {
			c.Close()
			return errKilled
		}
		if err := m.s.Record(ctx, c); err != nil {
			return err
		}
		if mine && ev.kill && ev.phase == 2 {
			c.Close()
			return errKilled
		}
		if err := m.st.Step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// The elastic simulation: ranks die at random points of a step and new ones join, in
// random generations; at the end every index went into the model exactly once per epoch,
// whichever way Sync moves the state to the joiners.
func TestSamplerExactlyOnceAcrossKillsAndJoins(t *testing.T) {
	for _, mode := range []string{TransferAuto, TransferPeers} {
		for seed := range uint64(8) {
			t.Run(fmt.Sprint(mode, "/seed", seed), func(t *testing.T) {
				t.Setenv(EnvStateTransfer, mode)
				simulate(t, seed)
			})
		}
	}
}

func simulate(t *testing.T, seed uint64) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(seed, 99))
	commitEvery := 1 + int(seed%3)
	store := allreduce.NewMemStore()
	var members []*simRank
	joined := 0
	join := func(k int) {
		for range k {
			members = append(members, newSimRank(t, fmt.Sprintf("w%d", joined), commitEvery))
			joined++
		}
	}
	join(3)
	kills, resets := 0, 0
	for gen := uint64(1); ; gen++ {
		if gen > 40 {
			t.Fatalf("not done after %d generations", gen-1)
		}
		comms := make([]*allreduce.Comm, len(members))
		errs := make([]error, len(members))
		var wg sync.WaitGroup
		for r := range members {
			wg.Go(func() {
				comms[r], errs[r] = allreduce.New(ctx, allreduce.Config{Rank: r, Size: len(members), Generation: gen, Store: store, Timeout: 5 * time.Second})
			})
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("generation %d rank %d: %v", gen, r, err)
			}
			members[r].w.comm = comms[r]
			members[r].w.seen = members[r].w.latest.Load()
		}
		ev := event{who: rng.IntN(len(members)), at: rng.IntN(12), phase: rng.IntN(4), joinCount: rng.IntN(3)}
		ev.kill = len(members) > 1 && rng.IntN(3) > 0
		ev.leave = !ev.kill && len(members) > 1 && rng.IntN(2) == 0
		for r, m := range members {
			wg.Go(func() { errs[r] = m.train(ctx, ev) })
		}
		wg.Wait()
		for _, c := range comms {
			c.Close()
		}
		if !slices.ContainsFunc(errs, func(err error) bool { return err != nil }) {
			break // trained to the end
		}
		var next []*simRank
		for r, m := range members {
			err := errs[r]
			switch {
			case ev.kill && r == ev.who:
				if !errors.Is(err, errKilled) {
					t.Fatalf("generation %d: the victim ended with %v", gen, err)
				}
				kills++
				continue
			case ev.kill:
				if !commError(err) {
					t.Fatalf("generation %d rank %d: %v, want a lost peer", gen, r, err)
				}
				if err := m.st.Restore(); err != nil {
					t.Fatal(err)
				}
			case !errors.Is(err, ErrHostsUpdated):
				t.Fatalf("generation %d rank %d: %v, want ErrHostsUpdated", gen, r, err)
			case ev.leave && r == ev.who:
				continue // its host was removed at this commit: it leaves without rollback
			}
			next = append(next, m)
		}
		resets++
		members = next
		join(min(ev.joinCount, 5-len(members)))
		if len(members) == 0 {
			join(1)
		}
	}
	t.Logf("%d generations, %d kills, commit every %d", resets+1, kills, commitEvery)
	for _, m := range members {
		if !slices.Equal(m.model, members[0].model) {
			t.Fatalf("%s's model differs from rank 0's", m.name)
		}
	}
	for e := range simEpochs {
		for i := range simN {
			if got := members[0].model[e*simN+i]; got != 1 {
				t.Errorf("epoch %d: index %d went into the model %d times, want exactly once", e, i, got)
			}
		}
	}
	if resets == 0 {
		t.Fatal("no reset happened: the simulation tested nothing elastic")
	}
}
