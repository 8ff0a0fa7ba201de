package rendezvous_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/allreduce"
	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/protocol"
)

func TestNewServerValidates(t *testing.T) {
	for _, tc := range []struct {
		cfg rendezvous.ServerConfig
		msg string
	}{
		{rendezvous.ServerConfig{}, "Secret of 0 bytes"},
		{rendezvous.ServerConfig{Secret: []byte("short")}, "Secret of 5 bytes"},
		{rendezvous.ServerConfig{Secret: secret, MaxBody: -1}, "MaxBody"},
		{rendezvous.ServerConfig{Secret: secret, ReplayWindow: time.Millisecond}, "ReplayWindow"},
		{rendezvous.ServerConfig{Secret: secret, PollTimeout: -time.Second}, "PollTimeout"},
	} {
		if _, err := rendezvous.NewServer(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("NewServer(%+v) = %v; want an error about %s", tc.cfg, err, tc.msg)
		}
	}
}

type result[T any] struct {
	v   T
	err error
}

// TestAssignmentLongPoll: a worker long-polls (re-polling through several empty answers),
// and Publish wakes it at once with its place; a worker outside the plan is told it is
// removed; a worker that already holds generation 1 waits for 2.
func TestAssignmentLongPoll(t *testing.T) {
	e := newEnv(t, func(c *rendezvous.ServerConfig) { c.PollTimeout = 50 * time.Millisecond })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	in, out := wid("node-a", 1), wid("node-b", 0)
	got := make(chan result[protocol.Assignment], 2)
	for _, id := range []protocol.WorkerID{in, out} {
		go func() {
			a, err := e.client(id).Assignment(ctx, 0)
			got <- result[protocol.Assignment]{a, err}
		}()
	}
	waitFor(t, 5*time.Second, "two assignment polls", func() bool { return e.srv.Stats().AssignmentPolls == 2 })
	before := e.reqs.Load()
	time.Sleep(200 * time.Millisecond) // several poll timeouts: the clients must re-poll
	if n := e.reqs.Load() - before; n < 4 {
		t.Fatalf("%d requests in 200ms with a 50ms poll timeout; want re-polls", n)
	}
	select {
	case r := <-got:
		t.Fatalf("Assignment returned before Publish: %+v, %v", r.v, r.err)
	default:
	}

	want := protocol.Assignment{Rank: 3, Size: 4, LocalRank: 1, LocalSize: 2, CrossRank: 1, CrossSize: 2}
	start := time.Now()
	e.srv.Publish(1, map[protocol.WorkerID]protocol.Assignment{in: want})
	want.Generation = 1
	byRemoved := map[bool]protocol.Assignment{}
	for range 2 {
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		byRemoved[r.v.Removed] = r.v
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Publish took %v to reach the workers", d)
	}
	if byRemoved[false] != want {
		t.Errorf("worker in the plan got %+v; want %+v", byRemoved[false], want)
	}
	if r := byRemoved[true]; r != (protocol.Assignment{Generation: 1, Removed: true}) {
		t.Errorf("worker outside the plan got %+v; want removed in generation 1", r)
	}

	// Holding generation 1, the worker waits for the next one.
	next := make(chan result[protocol.Assignment], 1)
	go func() {
		a, err := e.client(in).Assignment(ctx, 1)
		next <- result[protocol.Assignment]{a, err}
	}()
	select {
	case r := <-next:
		t.Fatalf("Assignment(after=1) returned while 1 is current: %+v, %v", r.v, r.err)
	case <-time.After(150 * time.Millisecond):
	}
	e.srv.Publish(2, map[protocol.WorkerID]protocol.Assignment{in: {Rank: 0, Size: 1, LocalSize: 1, CrossSize: 1}})
	r := <-next
	if r.err != nil || r.v.Generation != 2 || r.v.Removed || r.v.Size != 1 {
		t.Fatalf("after generation 2: %+v, %v", r.v, r.err)
	}

	// A worker asking after an old generation is answered at once, from the current one.
	a, err := e.client(out).Assignment(ctx, 0)
	if err != nil || a != (protocol.Assignment{Generation: 2, Removed: true}) {
		t.Fatalf("late worker: %+v, %v", a, err)
	}
}

func TestPublishIgnoresOlderGeneration(t *testing.T) {
	e := newEnv(t, nil)
	id := wid("h", 0)
	e.srv.Publish(5, map[protocol.WorkerID]protocol.Assignment{id: {Rank: 0, Size: 1}})
	e.srv.Publish(4, nil)
	e.srv.Publish(5, nil)
	a, err := e.client(id).Assignment(t.Context(), 0)
	if err != nil || a.Generation != 5 || a.Removed {
		t.Fatalf("got %+v, %v; want generation 5 unchanged", a, err)
	}
}

func TestHostsUpdatedLongPoll(t *testing.T) {
	e := newEnv(t, func(c *rendezvous.ServerConfig) { c.PollTimeout = 50 * time.Millisecond })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c := e.client(wid("h", 0))
	got := make(chan result[uint64], 1)
	go func() {
		v, err := c.HostsUpdated(ctx, 0)
		got <- result[uint64]{v, err}
	}()
	waitFor(t, 5*time.Second, "a hosts poll", func() bool { return e.srv.Stats().HostPolls == 1 })
	time.Sleep(120 * time.Millisecond)
	select {
	case r := <-got:
		t.Fatalf("HostsUpdated returned before any update: %v, %v", r.v, r.err)
	default:
	}
	if v := e.srv.NotifyHostsUpdated(); v != 1 {
		t.Fatalf("first NotifyHostsUpdated = %d", v)
	}
	if r := <-got; r.err != nil || r.v != 1 {
		t.Fatalf("HostsUpdated = %v, %v; want 1", r.v, r.err)
	}
	e.srv.NotifyHostsUpdated()
	e.srv.NotifyHostsUpdated()
	if v, err := c.HostsUpdated(ctx, 1); err != nil || v != 3 {
		t.Fatalf("HostsUpdated(after 1) = %v, %v; want 3 at once", v, err)
	}
}

// TestKV: set, get, a get that waits for its key, keys of any shape, generations: data of an
// older generation is gone (410, and a waiting get is woken with it), a future one refused.
func TestKV(t *testing.T) {
	e := newEnv(t, func(c *rendezvous.ServerConfig) { c.PollTimeout = 50 * time.Millisecond })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c := e.client(wid("h", 0))
	e.srv.Publish(1, nil)
	s1 := c.Store(1)

	keys := []string{"allreduce/g1/addr/0", "with space", "q?x=1&y#frag", "%2F..%2F", "ünïcødé", "../../etc", ".", "..", "a/..", "/"}
	for i, k := range keys {
		if err := s1.Set(ctx, k, []byte(fmt.Sprint(i))); err != nil {
			t.Fatalf("Set(%q): %v", k, err)
		}
	}
	for i, k := range keys {
		if v, err := s1.Get(ctx, k); err != nil || string(v) != fmt.Sprint(i) {
			t.Fatalf("Get(%q) = %q, %v; want %d", k, v, err, i)
		}
	}
	if err := s1.Set(ctx, "empty", nil); err != nil {
		t.Fatal(err)
	}
	if v, err := s1.Get(ctx, "empty"); err != nil || len(v) != 0 {
		t.Fatalf("empty value came back as %q, %v", v, err)
	}

	// A get that waits, through several poll timeouts, for a key set later.
	got := make(chan result[[]byte], 1)
	go func() {
		v, err := s1.Get(ctx, "late")
		got <- result[[]byte]{v, err}
	}()
	waitFor(t, 5*time.Second, "a key-value poll", func() bool { return e.srv.Stats().KVPolls == 1 })
	time.Sleep(120 * time.Millisecond)
	if err := s1.Set(ctx, "late", []byte("here")); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.err != nil || string(r.v) != "here" {
		t.Fatalf("waiting Get = %q, %v", r.v, r.err)
	}

	// A get waiting in generation 1 when generation 2 is published learns that 1 is gone.
	go func() {
		v, err := s1.Get(ctx, "never")
		got <- result[[]byte]{v, err}
	}()
	waitFor(t, 5*time.Second, "a key-value poll", func() bool { return e.srv.Stats().KVPolls == 1 })
	e.srv.Publish(2, nil)
	if r := <-got; !errors.Is(r.err, protocol.ErrGenerationGone) || !strings.Contains(r.err.Error(), "410") {
		t.Fatalf("Get in a dropped generation = %q, %v; want ErrGenerationGone (410)", r.v, r.err)
	}
	if _, err := s1.Get(ctx, keys[0]); !errors.Is(err, protocol.ErrGenerationGone) {
		t.Fatalf("Get of an old key = %v; want ErrGenerationGone", err)
	}
	if err := s1.Set(ctx, "x", []byte("y")); !errors.Is(err, protocol.ErrGenerationGone) {
		t.Fatalf("Set in an old generation = %v; want ErrGenerationGone", err)
	}
	if st := e.srv.Stats(); st.KVKeys != 0 {
		t.Fatalf("%d keys still held after the generation was dropped", st.KVKeys)
	}
	s2 := c.Store(2)
	if err := s2.Set(ctx, keys[0], []byte("new")); err != nil {
		t.Fatal(err)
	}
	if v, err := s2.Get(ctx, keys[0]); err != nil || string(v) != "new" {
		t.Fatalf("generation 2 Get = %q, %v", v, err)
	}
	err := c.Store(3).Set(ctx, "k", nil)
	if se, ok := errors.AsType[*protocol.StatusError](err); !ok || se.Code != http.StatusConflict || !strings.Contains(se.Message, "not published yet") {
		t.Fatalf("Set in an unpublished generation = %v; want 409 not published yet", err)
	}
}

func TestKVKeyLimit(t *testing.T) {
	e := newEnv(t, func(c *rendezvous.ServerConfig) { c.MaxKeys = 3 })
	e.srv.Publish(1, nil)
	s := e.client(wid("h", 0)).Store(1)
	for i := range 3 {
		if err := s.Set(t.Context(), fmt.Sprint(i), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Set(t.Context(), "0", []byte("overwrite")); err != nil {
		t.Fatalf("overwriting a key at the limit: %v", err)
	}
	err := s.Set(t.Context(), "3", nil)
	if se, ok := errors.AsType[*protocol.StatusError](err); !ok || se.Code != http.StatusInsufficientStorage {
		t.Fatalf("fourth key: %v; want 507", err)
	}
}

// TestStoreServesAllreduce builds real allreduce worlds, one per generation, whose ranks find
// each other only through Client.Store over HTTP: three ranks, then two after a host leaves.
func TestStoreServesAllreduce(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	ids := []protocol.WorkerID{wid("10.0.0.1", 0), wid("10.0.0.2", 0), wid("10.0.0.3", 0)}
	for _, round := range []struct {
		gen uint64
		n   int
	}{{1, 3}, {2, 2}} {
		plan := map[protocol.WorkerID]protocol.Assignment{}
		for r := range round.n {
			plan[ids[r]] = protocol.Assignment{Rank: r, Size: round.n, LocalSize: 1, CrossRank: r, CrossSize: round.n}
		}
		e.srv.Publish(round.gen, plan)
		sums := make([][]float64, len(ids))
		errs := make([]error, len(ids))
		removed := make([]bool, len(ids))
		var wg sync.WaitGroup
		for i, id := range ids {
			wg.Go(func() {
				c := e.client(id)
				a, err := c.Assignment(ctx, round.gen-1)
				if err != nil {
					errs[i] = err
					return
				}
				if a.Removed {
					removed[i] = true
					return
				}
				comm, err := allreduce.New(ctx, allreduce.Config{
					Rank: a.Rank, Size: a.Size, Generation: a.Generation, Store: c.Store(a.Generation),
					Secret: secret, Timeout: 10 * time.Second, Logger: testLogger(t, slog.LevelInfo),
				})
				if err != nil {
					errs[i] = err
					return
				}
				defer comm.Close()
				buf := []float64{float64(a.Rank + 1), 10}
				errs[i] = comm.Allreduce(ctx, buf, allreduce.Sum)
				sums[i] = buf
			})
		}
		wg.Wait()
		wantSum := float64(round.n * (round.n + 1) / 2)
		for i := range ids {
			switch {
			case errs[i] != nil:
				t.Fatalf("generation %d, worker %v: %v", round.gen, ids[i], errs[i])
			case i >= round.n:
				if !removed[i] {
					t.Fatalf("generation %d: worker %v outside the plan was not removed", round.gen, ids[i])
				}
			case sums[i][0] != wantSum || sums[i][1] != float64(10*round.n):
				t.Fatalf("generation %d, worker %v: allreduce gave %v; want [%v %v]", round.gen, ids[i], sums[i], wantSum, 10*round.n)
			}
		}
	}
	// The addresses of generation 1 are gone: a rank of the old world cannot read them.
	if _, err := e.client(ids[0]).Store(1).Get(ctx, "allreduce/g1/addr/0"); !errors.Is(err, protocol.ErrGenerationGone) {
		t.Fatalf("generation 1 address after the reset: %v; want ErrGenerationGone", err)
	}
}

// TestAssignmentHostsVersion: an assignment carries the host-update version at Publish, so a
// worker joining the generation knows which updates the plan already reflects.
func TestAssignmentHostsVersion(t *testing.T) {
	e := newEnv(t, nil)
	e.srv.NotifyHostsUpdated()
	e.srv.NotifyHostsUpdated()
	in, out := wid("a", 0), wid("b", 0)
	e.srv.Publish(1, map[protocol.WorkerID]protocol.Assignment{in: {Size: 1, HostsVersion: 99}})
	e.srv.NotifyHostsUpdated() // after Publish: not reflected in generation 1
	for _, id := range []protocol.WorkerID{in, out} {
		a, err := e.client(id).Assignment(t.Context(), 0)
		if err != nil || a.HostsVersion != 2 || a.Removed != (id == out) {
			t.Fatalf("worker %v: %+v, %v; want hosts version 2", id, a, err)
		}
	}
}
