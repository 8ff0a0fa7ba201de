package worker

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/gob"
	"errors"
	"fmt"
	"math"
	"reflect"
	"time"

	"github.com/elasticd/elasticd/allreduce"
	"github.com/elasticd/elasticd/protocol"
)

// State is the training state every rank holds: tensors ([]float32, []float64, []int64 whose
// contents change in place) and Go values (pointers to anything gob can encode: step, epoch,
// sampler position). It follows the FSM contract: Commit is a fast in-memory snapshot,
// Restore discards everything since the last commit, Sync makes every rank equal to rank 0.
type State struct {
	w *Worker
	// CommitEvery and CheckEvery are in steps (see Step); 0 means every step. They must be
	// the same on every rank.
	CommitEvery, CheckEvery int
	// TotalSteps is how many steps (Step calls) the job makes in all, when the program knows:
	// rank 0 reports it, and the driver shows "step X of N" and the time to go. 0: unknown.
	TotalSteps uint64

	entries []*entry
	step    int
	// version counts this rank's commits; holds is whether it has one (a joiner has none
	// until its first Sync). Ranks with rank 0's version hold rank 0's commit.
	version uint64
	holds   bool
	// lastStep is when Step last ended, for the worker's step time.
	lastStep time.Time
	// total counts the job's steps (Step calls) since it began, on every rank alike: it is
	// committed, restored and synced from rank 0 with the state. saved is its value at the
	// last commit, made at savedAt.
	total, saved uint64
	savedAt      time.Time
	// loss is SetLoss's value, valid when hasLoss.
	loss    float64
	hasLoss bool
}

type entry struct {
	name  string
	live  any // []float32, []float64, []int64, or a pointer
	saved any // snapshot: a slice copy, or gob bytes
}

// NewState returns an empty state for w. Register what it holds, in the same order on every
// rank, before Run.
func NewState(w *Worker) *State { return &State{w: w} }

// Register adds v under name: a []float32, []float64 or []int64 (its contents are the state;
// its length must not change), or a non-nil pointer to a value gob can encode.
func (s *State) Register(name string, v any) error {
	switch v.(type) {
	case []float32, []float64, []int64:
	default:
		if rv := reflect.ValueOf(v); rv.Kind() != reflect.Pointer || rv.IsNil() {
			return fmt.Errorf("state %q: %T: want []float32, []float64, []int64 or a non-nil pointer", name, v)
		}
	}
	for _, e := range s.entries {
		if e.name == name {
			return fmt.Errorf("state %q registered twice", name)
		}
	}
	e := &entry{name: name, live: v}
	s.entries = append(s.entries, e)
	return e.save()
}

func (e *entry) save() error {
	switch l := e.live.(type) { // tensor snapshots reuse their buffer: committing them allocates nothing
	case []float32:
		saved, _ := e.saved.([]float32)
		e.saved = append(saved[:0], l...)
	case []float64:
		saved, _ := e.saved.([]float64)
		e.saved = append(saved[:0], l...)
	case []int64:
		saved, _ := e.saved.([]int64)
		e.saved = append(saved[:0], l...)
	default:
		b, err := e.encode()
		if err != nil {
			return err
		}
		e.saved = b
	}
	return nil
}

func (e *entry) restore() error {
	switch l := e.live.(type) {
	case []float32:
		copy(l, e.saved.([]float32))
	case []float64:
		copy(l, e.saved.([]float64))
	case []int64:
		copy(l, e.saved.([]int64))
	default:
		return e.decode(e.saved.([]byte))
	}
	return nil
}

// encode is the gob encoding of a value's entry.
func (e *entry) encode() ([]byte, error) {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(e.live); err != nil {
		return nil, fmt.Errorf("state %q: encode: %w", e.name, err)
	}
	return b.Bytes(), nil
}

// decode puts gob bytes from encode into a value's entry.
func (e *entry) decode(b []byte) error {
	if err := gob.NewDecoder(bytes.NewReader(b)).Decode(e.live); err != nil {
		return fmt.Errorf("state %q: decode: %w", e.name, err)
	}
	return nil
}

// Save snapshots the live state (the local half of Commit).
func (s *State) Save() error {
	if err := s.save(); err != nil {
		return err
	}
	s.version++
	s.holds = true
	s.committedNow(time.Now())
	s.checkpoint()
	return nil
}

// checkpoint writes rank 0's commit to the checkpoint directory every ckptEvery commits. A
// failed write is logged, not fatal: the in-memory commit stands.
func (s *State) checkpoint() {
	if s.w.ckptDir == "" || s.version%uint64(s.w.ckptEvery) != 0 {
		return
	}
	s.writeCheckpoint()
}

// writeCheckpoint writes rank 0's commit to the checkpoint directory, if there is one.
func (s *State) writeCheckpoint() {
	w := s.w
	if w.ckptDir == "" || w.comm == nil || w.comm.Rank() != 0 {
		return
	}
	if err := writeCheckpoint(w.ckptDir, s.version, s.total, s.blob()); err != nil {
		w.log.Warn("could not write a checkpoint; training goes on from the in-memory commit", "err", err)
	}
}

// resume loads the newest valid checkpoint as this rank's commit, when there is one. Rank 0
// calls it when it holds no commit: every worker is new, the job having lost them all.
func (s *State) resume() error {
	c := newestCheckpoint(s.w.ckptDir, func(path string, err error) {
		s.w.log.Warn("checkpoint skipped", "file", path, "reason", err.Error())
	})
	if c == nil {
		return nil
	}
	if err := s.load(c.payload); err != nil {
		return fmt.Errorf("checkpoint %s does not fit this job's state: %w", c.path, err)
	}
	if err := s.save(); err != nil {
		return err
	}
	s.version, s.holds, s.total = c.version, true, c.total
	s.committedNow(time.Now())
	s.w.log.Warn("resumed from a checkpoint: the job had lost every worker", "file", c.path, "step", c.total)
	return nil
}

// committedNow records a commit of the live state made at now.
func (s *State) committedNow(now time.Time) {
	s.saved, s.savedAt = s.total, now
	s.noteProgress(now)
}

// SetLoss records the training loss of the step under way (or just ended): rank 0 sends the
// latest with its next progress report, and the driver's status and live page show it. Call
// it on rank 0 at least (other ranks' are not sent), before or after Step. A NaN or infinite
// loss is not recorded (JSON cannot carry it): the last finite one stays.
func (s *State) SetLoss(loss float64) {
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return
	}
	s.loss, s.hasLoss = loss, true
}

// noteProgress hands the worker the counts, the loss and the total as of now.
func (s *State) noteProgress(now time.Time) {
	p := protocol.ProgressReport{Step: s.total, Committed: s.saved, TotalSteps: s.TotalSteps}
	if s.hasLoss {
		l := s.loss
		p.Loss = &l
	}
	s.w.noteProgress(now, p)
}

func (s *State) save() error {
	for _, e := range s.entries {
		if err := e.save(); err != nil {
			return err
		}
	}
	return nil
}

// Restore puts the last snapshot back. The steps since it are the work rolled back, which
// the worker tells the driver when it next reports READY.
func (s *State) Restore() error {
	for _, e := range s.entries {
		if err := e.restore(); err != nil {
			return err
		}
	}
	// The seconds count even when no whole step is lost: the step under way, and the wait
	// for the peer that failed, are work thrown away too.
	s.w.rollback.Steps += s.total - s.saved
	if !s.savedAt.IsZero() {
		s.w.rollback.Seconds += time.Since(s.savedAt).Seconds()
	}
	s.total = s.saved
	s.noteProgress(time.Now())
	return nil
}

// Commit saves the state, then checks for host updates; it returns ErrHostsUpdated when the
// ranks agree (one small allreduce) that the hosts changed, all at this same step.
//
// A commit at which the ranks agree on a host change is where a planned change takes the job
// (a notice, a scale-in, the job stopping for its --max-cost): rank 0 also writes it to the
// checkpoint directory then, whatever --checkpoint-every, so that a job ended there resumes
// from it.
func (s *State) Commit(ctx context.Context) error {
	if err := s.Save(); err != nil {
		return err
	}
	err := s.CheckHosts(ctx)
	if errors.Is(err, ErrHostsUpdated) && s.w.ckptDir != "" && s.version%uint64(s.w.ckptEvery) != 0 {
		s.writeCheckpoint()
	}
	return err
}

// CheckHosts returns ErrHostsUpdated when any rank has heard of a host change. Every rank
// contributes its own flag to an allreduce(max), so they all raise it at the same step (a
// broadcast from rank 0, as Horovod does, deadlocks when rank 0 has not heard yet: #3494).
func (s *State) CheckHosts(ctx context.Context) error {
	flag := []int64{0}
	if s.w.latest.Load() > s.w.seen {
		flag[0] = 1
	}
	if err := s.w.comm.Allreduce(ctx, flag, allreduce.Max); err != nil {
		return err
	}
	if flag[0] > 0 {
		return ErrHostsUpdated
	}
	return nil
}

// Step ends one training step: it commits every CommitEvery steps and checks for host
// updates every CheckEvery steps, counted on every rank from the last Sync.
func (s *State) Step(ctx context.Context) error {
	s.step++
	s.total++
	now := time.Now()
	if !s.lastStep.IsZero() {
		s.w.observeStep(now.Sub(s.lastStep))
	}
	s.lastStep = now
	if s.CommitEvery <= 1 || s.step%s.CommitEvery == 0 {
		if err := s.Save(); err != nil {
			return err
		}
	} else {
		s.noteProgress(now)
	}
	if s.CheckEvery <= 1 || s.step%s.CheckEvery == 0 {
		return s.CheckHosts(ctx)
	}
	return nil
}

// broadcast makes every rank's live state equal to root's, entry by entry.
func (s *State) broadcast(ctx context.Context, root int) error {
	c := s.w.comm
	for _, e := range s.entries {
		switch l := e.live.(type) {
		case []float32, []float64, []int64:
			if err := c.Broadcast(ctx, l, root); err != nil {
				return fmt.Errorf("sync %q: %w", e.name, err)
			}
		default:
			var buf []byte
			if c.Rank() == root {
				var err error
				if buf, err = e.encode(); err != nil {
					return fmt.Errorf("sync: %w", err)
				}
			}
			n := make([]byte, 8)
			binary.LittleEndian.PutUint64(n, uint64(len(buf)))
			if err := c.Broadcast(ctx, n, root); err != nil {
				return fmt.Errorf("sync %q: %w", e.name, err)
			}
			size := binary.LittleEndian.Uint64(n)
			if size > 1<<30 {
				return fmt.Errorf("sync %q: rank %d sent %d bytes", e.name, root, size)
			}
			if c.Rank() != root {
				buf = make([]byte, size)
			}
			if err := c.Broadcast(ctx, buf, root); err != nil {
				return fmt.Errorf("sync %q: %w", e.name, err)
			}
			if c.Rank() != root {
				if err := e.decode(buf); err != nil {
					return fmt.Errorf("sync: %w", err)
				}
			}
		}
	}
	return nil
}
