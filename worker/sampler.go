package worker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
)

// Sampler chooses each rank's samples so that every index of the data set is trained on
// exactly once per epoch, counting only committed steps, however often the world changes
// size (seed 000, "Data Access": partitioning that survives resets).
//
// Each epoch has its own permutation of [0, N), drawn from the seed and the epoch number.
// The indices of the epoch not yet processed, in permutation order, are dealt round-robin
// over the ranks (rank r takes positions r, r+size, …: shares balanced within one), and each
// step consumes the next global batch of them: positions [c, c+batch) of that list, of which
// each rank trains on its own. Record, called by every rank after the step's update, gathers
// what every rank processed (one Allgather) and marks it processed; when all N are, the
// epoch ends and the next one begins with a new permutation.
//
// The processed set and the epoch are the sampler's committed state: register the sampler in
// the State (State.Register("sampler", s)) and they are saved with every commit, put back by
// Restore and sent from rank 0 by Sync. So a restore after a failure rolls the sampler back to
// the last commit together with the model (the steps since then are trained again), while a
// reset for ErrHostsUpdated keeps it. The deal is redone over the new world whenever the
// communicator's generation, rank or size changes, or the state is restored or synced; no
// reset callback is needed.
//
// Use, on every rank, in the same order:
//
//	for step < steps {
//		idx := s.Next(w.Comm())        // this rank's indices of this step
//		… gradient over idx, allreduce, update …
//		s.Record(ctx, w.Comm())        // every rank, after the update
//		st.Step(ctx)                   // commit: the sampler is saved with the model
//	}
//
// The committed state is N/8 bytes plus a small header. A Sampler is not safe for
// concurrent use.
type Sampler struct {
	n     int
	seed  uint64
	batch int

	// Committed state.
	epoch uint64
	done  []uint64 // bitmap over [0, n) of the indices processed this epoch
	nDone int

	perm      []int32 // permutation of permEpoch; nil if not built
	permEpoch uint64

	dealt     bool    // remaining and cursor are valid for key
	key       dealKey // the world they were dealt for
	remaining []int32 // not-yet-processed indices of the epoch at the deal, permutation order
	cursor    int     // positions of remaining consumed by recorded steps since the deal

	cur []int // what Next returned for the step not yet recorded; nil if none
}

type dealKey struct {
	rank, size int
	gen        uint64
}

// SamplerComm is the part of a communicator the sampler uses; *allreduce.Comm (Worker.Comm)
// has it.
type SamplerComm interface {
	Rank() int
	Size() int
	Generation() uint64
	Allgather(ctx context.Context, data []byte) ([][]byte, error)
}

// NewSampler returns a sampler over the indices [0, n) whose epoch e uses the permutation of
// seed and e, and whose every step takes batch indices in all (the global batch, split over
// the ranks; the last step of an epoch takes what is left). n, seed and batch must be the same
// on every rank.
func NewSampler(n int, seed uint64, batch int) (*Sampler, error) {
	switch {
	case n < 1 || n > 1<<31-1:
		return nil, fmt.Errorf("sampler: data set size %d: must be from 1 to %d", n, 1<<31-1)
	case batch < 1:
		return nil, fmt.Errorf("sampler: global batch %d: must be at least 1", batch)
	}
	return &Sampler{n: n, seed: seed, batch: batch, done: make([]uint64, (n+63)/64)}, nil
}

// Epoch is the current epoch, from 0.
func (s *Sampler) Epoch() int { return int(s.epoch) }

// Processed is how many indices of the current epoch have been recorded.
func (s *Sampler) Processed() int { return s.nDone }

// Len is the size of the data set.
func (s *Sampler) Len() int { return s.n }

// Next returns this rank's indices for the current step (empty when the step's batch has
// fewer indices than there are ranks and none is left for this one). Until Record, it
// returns the same indices again.
func (s *Sampler) Next(c SamplerComm) []int {
	s.deal(dealKey{c.Rank(), c.Size(), c.Generation()})
	if s.cur == nil {
		s.cur = s.share(s.key.rank, s.key.size)
	}
	return slices.Clone(s.cur)
}

// share returns rank's positions of the current step's global batch.
func (s *Sampler) share(rank, size int) []int {
	end := min(s.cursor+s.batch, len(s.remaining))
	out := []int{}
	first := s.cursor + ((rank-s.cursor)%size+size)%size // first position ≡ rank mod size
	for p := first; p < end; p += size {
		out = append(out, int(s.remaining[p]))
	}
	return out
}

// Record marks the current step's indices of every rank as processed. It gathers them from
// all ranks (one Allgather on c), so every rank must call it, after Next and after the step's
// update, before the step is committed. On an error (a lost peer) nothing is marked: restore
// and reset as usual.
func (s *Sampler) Record(ctx context.Context, c SamplerComm) error {
	k := dealKey{c.Rank(), c.Size(), c.Generation()}
	if s.cur == nil || !s.dealt || s.key != k {
		return fmt.Errorf("sampler: Record without Next on this communicator (rank %d of %d, generation %d): call Next at the start of every step", k.rank, k.size, k.gen)
	}
	var msg []byte
	msg = binary.AppendUvarint(msg, s.epoch)
	msg = binary.AppendUvarint(msg, uint64(s.cursor))
	for _, i := range s.cur {
		msg = binary.AppendUvarint(msg, uint64(i))
	}
	all, err := c.Allgather(ctx, msg)
	if err != nil {
		return fmt.Errorf("sampler: gather the step's indices: %w", err)
	}
	if len(all) != k.size {
		return fmt.Errorf("sampler: gathered %d ranks' indices, want %d", len(all), k.size)
	}
	for q, b := range all {
		idx, err := decodeRecord(b, s.epoch, s.cursor)
		if err != nil {
			return fmt.Errorf("sampler: rank %d: %w: every rank must register the sampler in its State and call Next and Record at every step", q, err)
		}
		if want := s.share(q, k.size); !slices.Equal(idx, want) {
			return fmt.Errorf("sampler: rank %d processed %d indices that are not its share of the step: ranks disagree (same data set size, seed and batch on every rank?)", q, len(idx))
		}
	}
	// Every rank processed its share: together, positions [cursor, end) of the deal.
	end := min(s.cursor+s.batch, len(s.remaining))
	for _, i := range s.remaining[s.cursor:end] {
		s.done[i/64] |= 1 << (i % 64)
	}
	s.nDone += end - s.cursor
	s.cursor = end
	s.cur = nil
	if s.nDone >= s.n {
		s.epoch++
		clear(s.done)
		s.nDone = 0
		s.dealt = false
	}
	return nil
}

func decodeRecord(b []byte, epoch uint64, cursor int) ([]int, error) {
	e, n := binary.Uvarint(b)
	if n <= 0 || e != epoch {
		return nil, fmt.Errorf("it is in epoch %d, this rank in %d", e, epoch)
	}
	b = b[n:]
	c, n := binary.Uvarint(b)
	if n <= 0 || c != uint64(cursor) {
		return nil, fmt.Errorf("it is at position %d of the epoch, this rank at %d", c, cursor)
	}
	b = b[n:]
	out := []int{}
	for len(b) > 0 {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return nil, errors.New("malformed record")
		}
		out = append(out, int(v))
		b = b[n:]
	}
	return out, nil
}

// Shard returns rank's share, at world size size, of the indices of the epoch not yet
// processed, in the order Next hands them out: what the deal after a reset gives the rank.
func (s *Sampler) Shard(rank, size int) []int {
	if size < 1 || rank < 0 || rank >= size {
		return nil
	}
	var out []int
	left := s.unprocessed(nil)
	for k := rank; k < len(left); k += size {
		out = append(out, int(left[k]))
	}
	return out
}

// deal lays out the not-yet-processed indices of the epoch for the world k, unless that is
// already done.
func (s *Sampler) deal(k dealKey) {
	if s.dealt && s.key == k {
		return
	}
	s.remaining = s.unprocessed(s.remaining[:0])
	s.key, s.dealt, s.cursor, s.cur = k, true, 0, nil
}

// unprocessed appends the indices of the epoch not yet processed, in permutation order.
func (s *Sampler) unprocessed(dst []int32) []int32 {
	for _, i := range s.epochPerm() {
		if s.done[i/64]&(1<<(i%64)) == 0 {
			dst = append(dst, i)
		}
	}
	return dst
}

func (s *Sampler) epochPerm() []int32 {
	if s.perm != nil && s.permEpoch == s.epoch {
		return s.perm
	}
	if s.perm == nil {
		s.perm = make([]int32, s.n)
	}
	for i := range s.perm {
		s.perm[i] = int32(i)
	}
	rng := rand.New(rand.NewPCG(s.seed, s.epoch))
	rng.Shuffle(s.n, func(i, j int) { s.perm[i], s.perm[j] = s.perm[j], s.perm[i] })
	s.permEpoch = s.epoch
	return s.perm
}

const samplerMagic = "esm1"

// MarshalBinary encodes the committed state: the epoch and the processed indices (State
// calls it, through gob, at every commit).
func (s *Sampler) MarshalBinary() ([]byte, error) {
	b := make([]byte, 0, len(samplerMagic)+3*8+8*len(s.done))
	b = append(b, samplerMagic...)
	b = binary.LittleEndian.AppendUint64(b, uint64(s.n))
	b = binary.LittleEndian.AppendUint64(b, s.seed)
	b = binary.LittleEndian.AppendUint64(b, s.epoch)
	for _, w := range s.done {
		b = binary.LittleEndian.AppendUint64(b, w)
	}
	return b, nil
}

// UnmarshalBinary puts back a state from MarshalBinary (State's Restore and Sync); the next
// Next deals the unprocessed indices again.
func (s *Sampler) UnmarshalBinary(b []byte) error {
	if len(b) < len(samplerMagic)+24 || string(b[:len(samplerMagic)]) != samplerMagic {
		return errors.New("sampler: the saved state is not a sampler's")
	}
	b = b[len(samplerMagic):]
	n, seed, epoch := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:]), binary.LittleEndian.Uint64(b[16:])
	b = b[24:]
	if n != uint64(s.n) || seed != s.seed {
		return fmt.Errorf("sampler: the saved state is for %d indices with seed %d, this sampler has %d with seed %d: give every rank the same data set size and seed", n, seed, s.n, s.seed)
	}
	if len(b) != 8*len(s.done) {
		return fmt.Errorf("sampler: the saved state has %d bytes of processed indices, want %d", len(b), 8*len(s.done))
	}
	nDone := 0
	for i := range s.done {
		s.done[i] = binary.LittleEndian.Uint64(b[8*i:])
		nDone += bits.OnesCount64(s.done[i])
	}
	s.epoch, s.nDone, s.dealt, s.cur = epoch, nDone, false, nil
	return nil
}
