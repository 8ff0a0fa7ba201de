package worker

import (
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/allreduce"
	"github.com/elasticd/elasticd/worker/peerstate"
)

// syncRank is one rank of a Sync test: a Worker with a communicator, and its state.
type syncRank struct {
	w      *Worker
	s      *State
	tensor []float32
	step   *int
}

func newSyncRank(t *testing.T, n int) *syncRank {
	t.Helper()
	w := &Worker{log: slog.New(slog.DiscardHandler), hostAddr: "127.0.0.1", secret: []byte("0123456789abcdef0123456789abcdef")}
	t.Cleanup(func() {
		if w.peers != nil {
			w.peers.Close()
		}
	})
	r := &syncRank{w: w, s: NewState(w), tensor: make([]float32, n), step: new(int)}
	if err := r.s.Register("weights", r.tensor); err != nil {
		t.Fatal(err)
	}
	if err := r.s.Register("step", r.step); err != nil {
		t.Fatal(err)
	}
	return r
}

// train makes the rank hold a commit: the tensor filled with v, step k, k commits.
func (r *syncRank) train(t *testing.T, v float32, k int) {
	t.Helper()
	for i := range r.tensor {
		r.tensor[i] = v + float32(i%7)
	}
	*r.step = k
	for range k {
		if err := r.s.Save(); err != nil {
			t.Fatal(err)
		}
	}
}

// syncAll runs Sync on every rank over one generation's communicators.
func syncAll(t *testing.T, ranks []*syncRank) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	store := allreduce.NewMemStore()
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		wg.Go(func() {
			c, err := allreduce.New(ctx, allreduce.Config{Rank: i, Size: len(ranks), Generation: 1, Store: store, Timeout: 5 * time.Second})
			if err != nil {
				errs[i] = err
				return
			}
			defer c.Close()
			r.w.comm = c
			errs[i] = r.s.Sync(ctx)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
}

// Joiners get rank 0's commit whichever way it travels; in peers mode it comes from every
// holder's peerstate server, not from a collective.
func TestSyncBringsJoinersUpToDate(t *testing.T) {
	for _, mode := range []string{TransferPeers, TransferBroadcast} {
		t.Run(mode, func(t *testing.T) {
			t.Setenv(EnvStateTransfer, mode)
			const n = 3 << 20 // 12 MiB of float32: several peerstate chunks
			ranks := []*syncRank{newSyncRank(t, n), newSyncRank(t, n), newSyncRank(t, n), newSyncRank(t, n)}
			ranks[0].train(t, 1, 5)
			ranks[1].train(t, 1, 5)
			ranks[2].train(t, 9, 4) // a commit behind: must take rank 0's
			// ranks[3] joined: nothing committed
			syncAll(t, ranks)
			for i, r := range ranks {
				if !slices.Equal(r.tensor, ranks[0].tensor) || *r.step != 5 || r.s.version != 5 {
					t.Fatalf("rank %d after Sync: step %d, version %d, tensor equal %v; want rank 0's commit (step 5, version 5)",
						i, *r.step, r.s.version, slices.Equal(r.tensor, ranks[0].tensor))
				}
			}
			// A holder counts a chunk once its write returns, which may be after the
			// joiner has read it: wait for the count rather than read it once.
			var served int64
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				served = 0
				for _, r := range ranks[:2] {
					if r.w.peers != nil {
						served += r.w.peers.Stats().Chunks
					}
				}
				if served > 0 || mode != TransferPeers || time.Now().After(deadline) {
					break
				}
			}
			if mode == TransferPeers && (served == 0 || ranks[0].w.peers == nil || ranks[1].w.peers == nil) {
				t.Fatalf("peers mode: holders served %d chunks, want the joiners' chunks from the holders", served)
			}
			if mode == TransferBroadcast && (ranks[0].w.peers != nil || served != 0) {
				t.Fatal("broadcast mode started a peerstate server")
			}
			if mode == TransferPeers {
				// The fetches are over: the holders keep no copy of the state.
				f, err := peerstate.NewFetcher(peerstate.FetcherConfig{Secret: ranks[0].w.secret})
				if err != nil {
					t.Fatal(err)
				}
				if _, _, err := f.Fetch(t.Context(), 5, []peerstate.Holder{{Addr: ranks[0].w.peers.Addr()}}); !errors.Is(err, peerstate.ErrNoHolder) {
					t.Fatalf("fetch from a holder after Sync: %v, want ErrNoHolder", err)
				}
			}
		})
	}
}

// When every rank already holds rank 0's commit (a reset among survivors), Sync moves
// nothing: each rank keeps its memory untouched.
func TestSyncAmongSurvivorsMovesNothing(t *testing.T) {
	t.Setenv(EnvStateTransfer, TransferPeers)
	ranks := []*syncRank{newSyncRank(t, 1024), newSyncRank(t, 1024), newSyncRank(t, 1024)}
	for _, r := range ranks {
		r.train(t, 2, 3)
	}
	ranks[1].tensor[0] = -1 // uncommitted on rank 1 only: Sync must not overwrite it (no transfer)
	syncAll(t, ranks)
	if ranks[1].tensor[0] != -1 {
		t.Fatal("Sync moved state among ranks that all hold the same commit")
	}
	for i, r := range ranks {
		if r.w.peers != nil && r.w.peers.Stats().Chunks != 0 {
			t.Fatalf("rank %d served chunks", i)
		}
	}
}

func TestBlobRoundTrip(t *testing.T) {
	a, b := newSyncRank(t, 100), newSyncRank(t, 100)
	a.train(t, 3, 2)
	if err := b.s.load(a.s.blob()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.tensor, b.tensor) || *b.step != 2 {
		t.Fatal("blob did not round-trip")
	}
	short := newSyncRank(t, 50)
	if err := short.s.load(a.s.blob()); err == nil || !strings.Contains(err.Error(), "registered different shapes") {
		t.Fatalf("a blob for another shape: %v, want an error naming the shapes", err)
	}
}

// Joiners get rank 0's state as it is at the reset, whichever way it travels: after
// ErrHostsUpdated at a step that did not commit (CheckEvery < CommitEvery), the survivors'
// state is ahead of their last commit, and they keep it; a joiner given the older commit
// would train on a different model.
func TestSyncGivesJoinersTheSurvivorsState(t *testing.T) {
	for _, mode := range []string{TransferPeers, TransferBroadcast} {
		t.Run(mode, func(t *testing.T) {
			t.Setenv(EnvStateTransfer, mode)
			ranks := []*syncRank{newSyncRank(t, 1<<16), newSyncRank(t, 1<<16), newSyncRank(t, 1<<16)}
			for _, r := range ranks[:2] {
				r.train(t, 1, 3)
				r.tensor[0], *r.step = 42, 4 // a step since the commit, the same on both
			}
			syncAll(t, ranks)
			for i, r := range ranks {
				if !slices.Equal(r.tensor, ranks[0].tensor) || r.tensor[0] != 42 || *r.step != 4 {
					t.Fatalf("rank %d after Sync: tensor[0] %v, step %d; want the survivors' 42, 4", i, r.tensor[0], *r.step)
				}
			}
		})
	}
}

// A holder whose peerstate server cannot start serves nothing and fetches nothing; the
// joiners fetch from the other holders.
func TestSyncHolderWithoutServer(t *testing.T) {
	t.Setenv(EnvStateTransfer, TransferPeers)
	ranks := []*syncRank{newSyncRank(t, 1<<16), newSyncRank(t, 1<<16), newSyncRank(t, 1<<16)}
	ranks[0].train(t, 1, 3)
	ranks[1].train(t, 1, 3)
	ranks[1].w.secret = nil // its server refuses to start without the job secret
	syncAll(t, ranks)
	if ranks[1].w.peers != nil {
		t.Fatal("a server started without the job secret")
	}
	for i, r := range ranks {
		if !slices.Equal(r.tensor, ranks[0].tensor) || *r.step != 3 {
			t.Fatalf("rank %d after Sync: step %d; want rank 0's commit", i, *r.step)
		}
	}
	if ranks[0].w.peers.Stats().Requests == 0 {
		t.Fatal("the joiner did not fetch from rank 0")
	}
}

// After Sync every rank counts CommitEvery and CheckEvery from the same step, the joiner
// too: else they commit at different steps (and the same commit counter no longer means the
// same commit), and CheckHosts's allreduce meets another rank's training collective.
func TestSyncAlignsCommitSteps(t *testing.T) {
	ranks := []*syncRank{newSyncRank(t, 16), newSyncRank(t, 16)}
	ranks[0].train(t, 1, 3)
	ranks[0].s.step = 1 // a step since the process started (the joiner has taken none)
	syncAll(t, ranks)
	for _, r := range ranks {
		r.s.CommitEvery, r.s.CheckEvery = 2, 1000 // no CheckHosts: no communicator needed
		for range 3 {
			if err := r.s.Step(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if ranks[0].s.version != ranks[1].s.version {
		t.Fatalf("after Sync and 3 steps committing every 2: versions %d and %d, want equal", ranks[0].s.version, ranks[1].s.version)
	}
}

// The job's step count is committed and restored with the state, the steps a restore throws
// away are told with the next READY, and Sync gives joiners rank 0's count.
func TestStepCountFollowsTheState(t *testing.T) {
	ranks := []*syncRank{newSyncRank(t, 4), newSyncRank(t, 4)}
	s := ranks[0].s
	s.CommitEvery, s.CheckEvery = 5, 1000 // no host check: no communicator needed yet
	for range 7 {
		if err := s.Step(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if s.total != 7 || s.saved != 5 {
		t.Fatalf("after 7 steps committing every 5: total %d, committed %d", s.total, s.saved)
	}
	time.Sleep(20 * time.Millisecond)
	if err := s.Restore(); err != nil {
		t.Fatal(err)
	}
	rb := ranks[0].w.rollback
	if s.total != 5 || rb.Steps != 2 || rb.Seconds < 0.02 {
		t.Fatalf("after Restore: total %d, rollback %+v; want 5 and 2 steps over at least 20ms", s.total, rb)
	}
	for range 3 {
		s.Step(t.Context())
	}
	syncAll(t, ranks) // rank 1 joins with nothing
	for i, r := range ranks {
		if r.s.total != 8 || r.s.saved != 8 || r.w.last.Step != 8 || r.w.last.Committed != 8 {
			t.Fatalf("rank %d after Sync: total %d, committed %d (worker %d/%d); want rank 0's 8, committed", i, r.s.total, r.s.saved, r.w.last.Step, r.w.last.Committed)
		}
	}
}

// A Sync whose transfer fails part-way (here a joiner gone after the allgather, which the
// others' broadcast must pass through) must leave every holder of rank 0's version with the
// same commit: the live state they share, which is ahead of the last commit when the hosts
// changed at a step that did not commit. Were some to commit it and others restore the older
// commit, both at one version, the next Sync would see one version everywhere and leave the
// ranks apart (the soak found it: ranks resuming one generation at different steps).
func TestSyncThatFailsLeavesHoldersAlike(t *testing.T) {
	t.Setenv(EnvStateTransfer, TransferBroadcast)
	const n, joiner = 4, 1 // the joiner relays the broadcast to the ranks after it
	ranks := make([]*syncRank, n)
	for i := range n {
		if i == joiner {
			continue
		}
		r := newSyncRank(t, 1<<16)
		r.train(t, 3, 5)
		// Two steps past the commit on every rank, in lockstep: the hosts changed there.
		*r.step = 7
		r.tensor[0] = 70
		r.s.total = 7
		ranks[i] = r
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	store := allreduce.NewMemStore()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c, err := allreduce.New(ctx, allreduce.Config{Rank: i, Size: n, Generation: 1, Store: store, Timeout: 2 * time.Second})
			if err != nil {
				errs[i] = err
				return
			}
			defer c.Close()
			if i == joiner { // it tells what it holds (nothing), then dies
				var buf bytes.Buffer
				gob.NewEncoder(&buf).Encode(syncInfo{})
				_, errs[i] = c.Allgather(ctx, buf.Bytes())
				return
			}
			ranks[i].w.comm = c
			errs[i] = ranks[i].s.Sync(ctx)
		})
	}
	wg.Wait()
	if errs[joiner] != nil {
		t.Fatalf("the joiner's allgather: %v", errs[joiner])
	}
	failed := 0
	for i, r := range ranks {
		if r == nil || errs[i] == nil {
			continue // its part of the transfer was over before the joiner went
		}
		failed++
		if err := r.s.Restore(); err != nil { // what the worker does after a failed reset
			t.Fatal(err)
		}
	}
	if failed == 0 {
		t.Fatalf("no holder's Sync failed (%v): the test did not cut the transfer", errs)
	}
	for i, r := range ranks {
		if r != nil && (*r.step != 7 || r.tensor[0] != 70 || r.s.version != 5 || r.s.total != 7) {
			t.Errorf("rank %d after the failed Sync (err %v) and its restore: step %d, tensor[0] %v, version %d, total %d; want the live state every holder shared (7, 70) committed at version 5",
				i, errs[i], *r.step, r.tensor[0], r.s.version, r.s.total)
		}
	}
}

// A collective that fails on some ranks and completes on others splits them: those it failed
// restore their commit, those it completed may have heard that the hosts changed, and reset
// one step ahead of it without restoring. Both still hold the same commit counter, so the
// counter alone cannot tell that their live states differ: Sync must leave every rank with
// the state of the ranks ahead, whichever side rank 0 is on.
func TestSyncAfterASplitStep(t *testing.T) {
	for _, mode := range []string{TransferPeers, TransferBroadcast} {
		for name, ahead := range map[string][]int{"rank0-ahead": {0}, "rank0-restored": {1, 2}, "last-rank-ahead": {2}} {
			t.Run(mode+"/"+name, func(t *testing.T) {
				t.Setenv(EnvStateTransfer, mode)
				ranks := make([]*syncRank, 3)
				for i := range ranks {
					r := newSyncRank(t, 1<<10)
					r.train(t, 3, 5)
					r.s.total, r.s.saved = 5, 5
					// Step 6 trained everywhere; the ranks ahead heard of a host change there,
					// the rest saw the check's allreduce fail and restore.
					*r.step, r.tensor[0], r.s.total = 6, 60, 6
					if !slices.Contains(ahead, i) {
						if err := r.s.Restore(); err != nil {
							t.Fatal(err)
						}
					}
					ranks[i] = r
				}
				syncAll(t, ranks)
				// Every rank takes the state of the ranks ahead: whole, since their collectives
				// completed; rank 0's, when it restored, would train step 6 again.
				want, wantT := 6, float32(60)
				for i, r := range ranks {
					if *r.step != want || r.tensor[0] != wantT || r.s.total != uint64(want) {
						t.Errorf("rank %d after Sync: step %d, tensor[0] %v, total %d; want the most advanced rank's step %d, tensor[0] %v",
							i, *r.step, r.tensor[0], r.s.total, want, wantT)
					}
					if err := r.s.Restore(); err != nil { // Sync ended in a commit of that state
						t.Fatal(err)
					}
					if *r.step != want || r.tensor[0] != wantT {
						t.Errorf("rank %d: its commit after Sync is step %d, tensor[0] %v; want %d, %v", i, *r.step, r.tensor[0], want, wantT)
					}
				}
			})
		}
	}
}
