package driver

import (
	"slices"
	"sync"
	"time"
)

// maxProgressPoints bounds the progress history: a job of days keeps as many points as one of
// minutes, each standing for a longer time.
const maxProgressPoints = 500

// progressHistory is the job's progress over time at an even spacing that doubles whenever the
// points reach maxProgressPoints: then each pair of neighbours is merged into one, and points
// closer than the spacing are not taken. So it always covers the whole job, with between
// maxProgressPoints/2 and maxProgressPoints points once full, and its memory is bounded. A leaf
// cache that the sampler writes and the status readers copy: safe for concurrent use.
type progressHistory struct {
	mu    sync.Mutex
	pts   []ProgressPoint
	every time.Duration // the spacing: 0 takes every point until the first merge
}

// add appends p, unless it is closer than the spacing to the last point (or not after it).
func (h *progressHistory) add(p ProgressPoint) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := len(h.pts); n > 0 && p.T.Sub(h.pts[n-1].T) < max(h.every, time.Nanosecond) {
		return
	}
	if len(h.pts) == maxProgressPoints {
		h.halve()
	}
	h.pts = append(h.pts, p)
}

// halve merges each pair of neighbours after the first point, which stays as it is so that
// the history still starts with the job, and doubles the spacing (from the mean one, the
// first time). A last point without a pair stays too.
func (h *progressHistory) halve() {
	n := len(h.pts)
	if h.every == 0 && n > 1 {
		h.every = h.pts[n-1].T.Sub(h.pts[0].T) / time.Duration(n-1)
	}
	h.every = max(2*h.every, time.Millisecond)
	out := h.pts[:1]
	i := 1
	for ; i+1 < n; i += 2 {
		out = append(out, merge(h.pts[i], h.pts[i+1]))
	}
	if i < n {
		out = append(out, h.pts[i])
	}
	clear(h.pts[len(out):])
	h.pts = out
}

// merge is one point for a and the later b: b's time, step and cost (they accumulate), the
// mean of their rates, and the mean of their losses (or the one that has one).
func merge(a, b ProgressPoint) ProgressPoint {
	m := b
	m.StepsPerSecond = (a.StepsPerSecond + b.StepsPerSecond) / 2
	switch {
	case a.Loss != nil && b.Loss != nil:
		m.Loss = new((*a.Loss + *b.Loss) / 2)
	case a.Loss != nil:
		m.Loss = a.Loss
	}
	if m.Cost == nil {
		m.Cost = a.Cost
	}
	return m
}

// points returns a copy of the history, oldest first.
func (h *progressHistory) points() []ProgressPoint {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.pts)
}

// restore puts back a saved history (SavedState.Progress), before the first point is added;
// points beyond the bound keep the newest.
func (h *progressHistory) restore(pts []ProgressPoint) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pts = slices.Clone(pts[max(0, len(pts)-maxProgressPoints):])
}
