package providers_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
)

func TestSeen(t *testing.T) {
	now := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	a := providers.Notice{ID: "a", HostID: "h1", Kind: providers.Interruption, Deadline: now.Add(time.Minute)}
	s := &providers.Seen{Memory: time.Hour, Max: 3}
	steps := []struct {
		what string
		n    providers.Notice
		at   time.Duration
		want bool
	}{
		{"first sight", a, 0, true},
		{"again", a, time.Second, false},
		{"a new Detail alone", func() providers.Notice { n := a; n.Detail = "x"; return n }(), 2 * time.Second, false},
		{"a moved deadline", func() providers.Notice { n := a; n.Deadline = now.Add(2 * time.Minute); return n }(), 3 * time.Second, true},
		{"no ID", providers.Notice{HostID: "h1"}, 4 * time.Second, true},
		{"no ID again", providers.Notice{HostID: "h1"}, 5 * time.Second, true},
	}
	for _, st := range steps {
		if got := s.New(st.n, now.Add(st.at)); got != st.want {
			t.Errorf("%s: New = %v; want %v", st.what, got, st.want)
		}
	}
	s.Forget("a")
	if !s.New(a, now.Add(6*time.Second)) {
		t.Error("after Forget: not new")
	}
	for _, id := range []string{"b", "c", "d"} {
		s.New(providers.Notice{ID: id}, now.Add(7*time.Second))
	}
	if s.Len() != 3 {
		t.Errorf("%d IDs remembered; want Max, 3", s.Len())
	}
	if !s.New(a, now.Add(8*time.Second)) {
		t.Error("the oldest ID past Max is still remembered")
	}
	if s.New(providers.Notice{ID: "d"}, now.Add(time.Hour)) {
		t.Error("d, seen within Memory, is new")
	}
	if !s.New(providers.Notice{ID: "c"}, now.Add(2*time.Hour)) {
		t.Error("c, last seen over Memory ago, is not new")
	}
}

// noticeScript answers scripted notice polls (an error, or notices), then cancels.
type noticeScript struct {
	mu     sync.Mutex
	polls  []any // error or []providers.Notice
	cancel context.CancelFunc
	calls  int
}

func (s *noticeScript) Notices(ctx context.Context) ([]providers.Notice, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.calls
	s.calls++
	if i >= len(s.polls) {
		s.cancel()
		return nil, ctx.Err()
	}
	switch p := s.polls[i].(type) {
	case error:
		return nil, p
	case []providers.Notice:
		return p, nil
	}
	return nil, nil
}

func TestWatchNotices(t *testing.T) {
	a := providers.Notice{ID: "a", HostID: "h1", Kind: providers.Interruption}
	b := providers.Notice{ID: "b", HostID: "h2", Kind: providers.ScaleIn}
	down := errors.New("metadata service down")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	src := &noticeScript{cancel: cancel, polls: []any{
		[]providers.Notice{a}, down, down, down, []providers.Notice{a, b}, []providers.Notice{b}, []providers.Notice(nil),
	}}
	c := newClock()
	var failed []int
	var recovered []int
	var got []string
	cfg := providers.WatchConfig{
		Interval: time.Second, MinBackoff: 2 * time.Second, MaxBackoff: 5 * time.Second,
		After: c.After, Now: c.Now,
		Failed:    func(_ error, n int, _ time.Duration) { failed = append(failed, n) },
		Recovered: func(n int) { recovered = append(recovered, n) },
	}
	err := providers.WatchNotices(ctx, src, cfg, func(_ context.Context, n providers.Notice) error {
		got = append(got, n.ID)
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("WatchNotices: %v; want context.Canceled when ctx ends", err)
	}
	if len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Errorf("emitted %v; want [a b], each once", got)
	}
	if len(failed) != 3 || failed[2] != 3 || len(recovered) != 1 || recovered[0] != 3 {
		t.Errorf("failed %v, recovered %v; want 1 2 3, then 3", failed, recovered)
	}
	// Pauses: after a good poll Interval; after failures 2 s, 4 s, 5 s (capped), ±20%.
	waits := c.Waits()
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, time.Second, time.Second, time.Second}
	if len(waits) != len(want) {
		t.Fatalf("pauses %v; want %d of them", waits, len(want))
	}
	for i, w := range want {
		lo, hi := w, w
		if i >= 1 && i <= 3 {
			lo, hi = w-w/5, w+w/5
		}
		if waits[i] < lo || waits[i] > hi {
			t.Errorf("pause %d: %v; want %v…%v", i, waits[i], lo, hi)
		}
	}
}

// An emit that fails ends the loop with its error.
func TestWatchNoticesEmitError(t *testing.T) {
	stop := errors.New("receiver gone")
	src := &noticeScript{cancel: func() {}, polls: []any{[]providers.Notice{{ID: "a"}}}}
	c := newClock()
	err := providers.WatchNotices(t.Context(), src, providers.WatchConfig{After: c.After, Now: c.Now},
		func(context.Context, providers.Notice) error { return stop })
	if !errors.Is(err, stop) {
		t.Fatalf("WatchNotices: %v; want emit's error", err)
	}
}
