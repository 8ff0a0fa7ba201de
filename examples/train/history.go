package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/elasticd/elasticd/worker"
)

// The bugs --mutation plants, for elasticd bench soak's checker to find (bench/soakcheck.go).
const (
	// mutSkipSamplerCommit commits the sampler's state of the first commit over and over, not
	// its position: a restore sends the sampler back to the start, and samples repeat.
	mutSkipSamplerCommit = "skip-sampler-commit"
	// mutDropCommit drops every other commit, yet reports it in the history: a restore goes
	// back past a step reported committed.
	mutDropCommit = "drop-commit"
)

// staleSampler is the sampler under skip-sampler-commit: its saved state is always the first
// one saved.
type staleSampler struct {
	*worker.Sampler
	first []byte
}

func (s *staleSampler) MarshalBinary() ([]byte, error) {
	if s.first == nil {
		b, err := s.Sampler.MarshalBinary()
		if err != nil {
			return nil, err
		}
		s.first = b
	}
	return s.first, nil
}

// history is --history: this process's lines in DIR/pid-PID.log, for elasticd bench soak.
// Each line is one write to a file opened for appending, so a SIGKILL leaves whole lines.
// A nil history writes nothing.
type history struct{ f *os.File }

func openHistory(dir string) (*history, error) {
	if dir == "" {
		return nil, nil
	}
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("pid-%d.log", os.Getpid())), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--history: %w", err)
	}
	return &history{f: f}, nil
}

func (h *history) close() {
	if h != nil {
		h.f.Close()
	}
}

func (h *history) write(line string) {
	if h != nil {
		h.f.WriteString(line) // best effort: a history that lacks lines fails the check
	}
}

// start: a generation begins, resuming at step (committed by the Sync).
func (h *history) start(w *worker.Worker, step int64) {
	h.write(fmt.Sprintf("start gen=%d rank=%d size=%d step=%d pid=%d t=%d\n", w.Generation(), w.Rank(), w.Size(), step, os.Getpid(), time.Now().UnixNano()))
}

// step: this rank trains step (the step-th of the job) on samples, of epoch.
func (h *history) step(w *worker.Worker, step int64, epoch int, samples []int) {
	if h == nil {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "step gen=%d rank=%d size=%d step=%d epoch=%d t=%d samples=", w.Generation(), w.Rank(), w.Size(), step, epoch, time.Now().UnixNano())
	for k, i := range samples {
		if k > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(i))
	}
	b.WriteByte('\n')
	h.write(b.String())
}

// commit: this rank committed the state after step.
func (h *history) commit(w *worker.Worker, step int64) {
	h.write(fmt.Sprintf("commit gen=%d rank=%d step=%d t=%d\n", w.Generation(), w.Rank(), step, time.Now().UnixNano()))
}
