package providers

import (
	"context"
	"math/rand/v2"
	"time"
)

// Seen de-duplicates notices across polls: a notice is new when its ID was not seen, or
// when it changed (another host, kind or deadline: a cloud may move a scheduled event);
// it is reported once until then, and again after Forget (it was completed). A notice
// without an ID is always new. Memory is bounded in time and count. Not safe for concurrent
// use: the one loop that watches owns it.
type Seen struct {
	// Memory is how long an ID is remembered after it was last seen (0: for ever, within Max).
	Memory time.Duration
	// Max bounds the IDs remembered; the oldest go first (0: 1024).
	Max int

	ids   map[string]seenNotice
	order []string // ids' keys, oldest first
}

type seenNotice struct {
	n  Notice
	at time.Time
}

// New reports whether n is to be reported: never seen, or changed since. It remembers n.
func (s *Seen) New(n Notice, now time.Time) bool {
	if n.ID == "" {
		return true
	}
	if s.ids == nil {
		s.ids = make(map[string]seenNotice)
	}
	s.expire(now)
	old, ok := s.ids[n.ID]
	if !ok {
		s.order = append(s.order, n.ID)
	}
	s.ids[n.ID] = seenNotice{n: n, at: now}
	s.bound()
	return !ok || old.n.HostID != n.HostID || old.n.Kind != n.Kind || !old.n.Deadline.Equal(n.Deadline)
}

// Forget makes the next sight of id new again (the notice was completed).
func (s *Seen) Forget(id string) {
	if _, ok := s.ids[id]; !ok {
		return
	}
	delete(s.ids, id)
	for i, k := range s.order {
		if k == id {
			s.order = append(s.order[:i], s.order[i+1:]...)
			break
		}
	}
}

// Len is how many IDs are remembered.
func (s *Seen) Len() int { return len(s.ids) }

// expire forgets the IDs not seen within Memory.
func (s *Seen) expire(now time.Time) {
	if s.Memory <= 0 {
		return
	}
	keep := s.order[:0]
	for _, id := range s.order {
		if now.Sub(s.ids[id].at) > s.Memory {
			delete(s.ids, id)
			continue
		}
		keep = append(keep, id)
	}
	s.order = keep
}

// bound forgets the oldest IDs past Max.
func (s *Seen) bound() {
	limit := s.Max
	if limit <= 0 {
		limit = 1024
	}
	for len(s.order) > limit {
		delete(s.ids, s.order[0])
		s.order = s.order[1:]
	}
}

// WatchConfig paces WatchNotices. Zero durations take their defaults.
type WatchConfig struct {
	// Interval is the pause after a good poll (default 1s).
	Interval time.Duration
	// Timeout bounds each poll (0: only ctx does).
	Timeout time.Duration
	// MinBackoff is the pause after the first failure in a row (default Interval); each
	// further failure doubles it, up to MaxBackoff (default 30s), drawn within ±20%.
	MinBackoff, MaxBackoff time.Duration
	// Seen de-duplicates across polls; nil: a fresh one, remembering an ID for an hour.
	Seen *Seen
	// Failed is told of each failed poll (for a log line), Recovered of the first good poll
	// after failures; nil: not told.
	Failed    func(err error, failures int, retryIn time.Duration)
	Recovered func(failures int)
	// After is the clock of the pauses, for tests; nil: time.After.
	After func(time.Duration) <-chan time.Time
	// Now is the clock of Seen; nil: time.Now.
	Now func() time.Time
}

// Backoff is the pause after the failures-th failure in a row (1, 2, …), before jitter.
func (c WatchConfig) Backoff(failures int) time.Duration {
	c = c.withDefaults()
	return min(c.MinBackoff<<min(max(failures-1, 0), 16), c.MaxBackoff)
}

func (c WatchConfig) withDefaults() WatchConfig {
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = c.Interval
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 30 * time.Second
	}
	c.MaxBackoff = max(c.MaxBackoff, c.MinBackoff)
	if c.After == nil {
		c.After = time.After
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// WatchNotices is the one notice loop (the driver's, over its provider; each agent's, over
// its host's metadata): it polls src until ctx ends, pausing Interval after a good poll and
// a bounded, growing backoff after failures, and hands each notice to emit once (see Seen).
// It returns ctx's error when ctx ends, or emit's error.
func WatchNotices(ctx context.Context, src Noticer, cfg WatchConfig, emit func(context.Context, Notice) error) error {
	cfg = cfg.withDefaults()
	seen := cfg.Seen
	if seen == nil {
		seen = &Seen{Memory: time.Hour}
	}
	failures := 0
	for {
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if cfg.Timeout > 0 {
			pctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		}
		ns, err := src.Notices(pctx)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		pause := cfg.Interval
		if err != nil {
			failures++
			pause = cfg.Backoff(failures)
			pause = pause - pause/5 + rand.N(2*(pause/5)+1)
			if cfg.Failed != nil {
				cfg.Failed(err, failures, pause)
			}
		} else {
			if failures > 0 && cfg.Recovered != nil {
				cfg.Recovered(failures)
			}
			failures = 0
			now := cfg.Now()
			for _, n := range ns {
				if !seen.New(n, now) {
					continue
				}
				if err := emit(ctx, n); err != nil {
					return err
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-cfg.After(pause):
		}
	}
}
