package allreduce_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/allreduce"
)

// misuseTimeout is Config.Timeout in tests where a rank must fail fast: detection must come
// from the protocol, well before a peer could be declared silent.
const misuseTimeout = 10 * time.Second

// prompt is how quickly an operation must return once its failure is detectable.
const prompt = 2 * time.Second

// timed runs fn and returns how long it took and its error.
func timed(fn func() error) (time.Duration, error) {
	start := time.Now()
	err := fn()
	return time.Since(start), err
}

func mustPeerLost(t testing.TB, who string, err error, culprit int) {
	t.Helper()
	var pe *allreduce.PeerError
	switch {
	case !errors.Is(err, allreduce.ErrPeerLost):
		t.Fatalf("%s: error %v does not wrap ErrPeerLost", who, err)
	case !errors.As(err, &pe):
		t.Fatalf("%s: error %v carries no *PeerError", who, err)
	case pe.Rank != culprit:
		t.Fatalf("%s: error %v blames rank %d, want rank %d", who, err, pe.Rank, culprit)
	}
}

func TestMismatchedLengths(t *testing.T) {
	cases := []struct {
		name  string
		elems []int // float32 elements on each rank
		tweak func(*allreduce.Config)
	}{
		{"n=2/doubling", []int{10, 11}, nil},
		{"n=4/doubling", []int{1000, 1000, 1000, 1001}, nil},
		{"n=3/ring", []int{100000, 100000, 100001}, nil},
		{"n=5/ring/fold", []int{1 << 18, 1 << 18, 1 << 18, 1 << 18, 1<<18 - 1}, nil},
		{"n=4/doubling-vs-ring", []int{10, 10, 10, 1 << 20}, nil},
		{"n=5/ring-vs-doubling", []int{1 << 18, 1 << 18, 16, 1 << 18, 1 << 18}, nil},
		{"n=8/empty-on-one", []int{7, 7, 7, 7, 7, 7, 7, 0}, nil},
		{"n=3/chunk64", []int{1000, 999, 1000}, func(c *allreduce.Config) { c.ChunkBytes = 64; c.SmallBytes = 1 }},
		// Hierarchical (hosts of several ranks): sizes that differ, or send some ranks down
		// another algorithm, fail promptly with a protocol error too.
		{"hosts=AABB/one-longer", []int{100000, 100000, 100000, 100001}, onHosts("AABB")},
		{"hosts=AAAB/doubling-vs-hier", []int{1 << 18, 16, 1 << 18, 1 << 18}, onHosts("AAAB")},
		{"hosts=AABBCC/empty-on-one", []int{1 << 17, 1 << 17, 1 << 17, 0, 1 << 17, 1 << 17}, onHosts("AABBCC")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := len(tc.elems)
			comms := newWorld(t, n, 1, nil, func(c *allreduce.Config) {
				c.Timeout = misuseTimeout
				if tc.tweak != nil {
					tc.tweak(c)
				}
			})
			durs := make([]time.Duration, n)
			errs := onAll(comms, func(r int, c *allreduce.Comm) error {
				d, err := timed(func() error {
					return c.Allreduce(t.Context(), make([]float32, tc.elems[r]), allreduce.Sum)
				})
				durs[r] = d
				return err
			})
			checkMisuse(t, comms, errs, durs, "different sizes")
			// A failed communicator stays failed, and says why.
			for r, c := range comms {
				err := c.Barrier(t.Context())
				if err == nil || !strings.Contains(err.Error(), "failed earlier") {
					t.Errorf("rank %d: Barrier after a failed collective: %v, want a 'failed earlier' error", r, err)
				}
			}
		})
	}
}

// checkMisuse requires every rank to fail promptly with ErrProtocol or ErrPeerLost, and at
// least one rank to have seen the violation itself and to say what it was. A rank that got
// everything it needed from ranks that agreed with it may complete (a Broadcast needs
// nothing from the rank before its root); its next collective must then fail.
func checkMisuse(t *testing.T, comms []*allreduce.Comm, errs []error, durs []time.Duration, want string) {
	t.Helper()
	saw := false
	var finished []int
	for r, err := range errs {
		t.Logf("rank %d (%v): %v", r, durs[r].Round(time.Millisecond), err)
		switch {
		case err == nil:
			finished = append(finished, r)
		case errors.Is(err, allreduce.ErrProtocol):
			if strings.Contains(err.Error(), want) {
				saw = true
			}
		case errors.Is(err, allreduce.ErrPeerLost):
		default:
			t.Errorf("rank %d: %v wraps neither ErrProtocol nor ErrPeerLost", r, err)
		}
		if durs[r] > prompt {
			t.Errorf("rank %d: took %v to fail (timeout %v): want it detected, not timed out", r, durs[r], misuseTimeout)
		}
	}
	if !saw {
		t.Errorf("no rank reported an ErrProtocol mentioning %q", want)
	}
	if len(finished) == len(errs) {
		t.Fatal("every rank completed the mismatched collectives")
	}
	next := onSome(comms, finished, func(_ int, c *allreduce.Comm) error { return c.Barrier(t.Context()) })
	for _, r := range finished {
		if err := next[r]; !errors.Is(err, allreduce.ErrPeerLost) && !errors.Is(err, allreduce.ErrProtocol) {
			t.Errorf("rank %d completed the mismatched collective, then its next one returned %v", r, err)
		}
	}
}

// onSome is onAll for the given ranks only; the others' errors are nil.
func onSome(comms []*allreduce.Comm, ranks []int, fn func(r int, c *allreduce.Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for _, r := range ranks {
		wg.Go(func() { errs[r] = fn(r, comms[r]) })
	}
	wg.Wait()
	return errs
}

// checkAbandoned checks the other ranks' outcome of a collective that rank `culprit`
// abandoned (cancelled or closed) part-way. A rank fails with ErrPeerLost naming the
// culprit, or — when it had already received everything it needed, which no protocol can
// take back — completes with the right result, and then its next collective fails naming
// the culprit.
func checkAbandoned(t *testing.T, comms []*allreduce.Comm, culprit int, errs []error, bufs [][]float32, want []float32) {
	t.Helper()
	var finished []int
	for r, err := range errs {
		if r == culprit {
			continue
		}
		if err != nil {
			mustPeerLost(t, fmt.Sprintf("rank %d", r), err, culprit)
			continue
		}
		finished = append(finished, r)
		if !bytes.Equal(raw(bufs[r]), raw(want)) {
			t.Errorf("rank %d completed the collective with a wrong result", r)
		}
	}
	t.Logf("ranks that completed before the failure reached them: %v", finished)
	next := onSome(comms, finished, func(_ int, c *allreduce.Comm) error {
		d, err := timed(func() error { return c.Barrier(t.Context()) })
		if d > prompt {
			t.Errorf("rank %d: next collective took %v to fail", c.Rank(), d)
		}
		return err
	})
	for _, r := range finished {
		mustPeerLost(t, fmt.Sprintf("rank %d, next collective", r), next[r], culprit)
	}
}

func TestMismatchedCollectives(t *testing.T) {
	f32 := func(n int) []float32 { return make([]float32, n) }
	allreduceF32 := func(op allreduce.Op) func(context.Context, *allreduce.Comm) error {
		return func(ctx context.Context, c *allreduce.Comm) error { return c.Allreduce(ctx, f32(4), op) }
	}
	cases := []struct {
		name   string
		n      int
		odd    int                                          // the rank that calls oddOne
		others func(context.Context, *allreduce.Comm) error // every other rank
		oddOne func(context.Context, *allreduce.Comm) error
		want   string
	}{
		{"broadcast-vs-allreduce", 4, 1, allreduceF32(allreduce.Sum),
			func(ctx context.Context, c *allreduce.Comm) error { return c.Broadcast(ctx, f32(4), 0) },
			"different collectives"},
		{"barrier-vs-allreduce-max", 3, 0,
			func(ctx context.Context, c *allreduce.Comm) error {
				return c.Allreduce(ctx, make([]int64, 1), allreduce.Max)
			},
			func(ctx context.Context, c *allreduce.Comm) error { return c.Barrier(ctx) },
			"different collectives"},
		{"max-vs-sum", 4, 2, allreduceF32(allreduce.Sum), allreduceF32(allreduce.Max), "different collectives"},
		{"float64-vs-float32-same-bytes", 2, 1, allreduceF32(allreduce.Sum),
			func(ctx context.Context, c *allreduce.Comm) error {
				return c.Allreduce(ctx, make([]float64, 2), allreduce.Sum)
			},
			"different collectives"},
		{"allgather-vs-broadcast", 4, 3,
			func(ctx context.Context, c *allreduce.Comm) error { return c.Broadcast(ctx, make([]byte, 32), 0) },
			func(ctx context.Context, c *allreduce.Comm) error {
				_, err := c.Allgather(ctx, make([]byte, 32))
				return err
			},
			"different collectives"},
		{"skipped-a-collective", 3, 0,
			func(ctx context.Context, c *allreduce.Comm) error {
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				return c.Allreduce(ctx, f32(4), allreduce.Sum)
			},
			allreduceF32(allreduce.Sum),
			"different collectives"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			comms := newWorld(t, tc.n, 1, nil, func(c *allreduce.Config) { c.Timeout = misuseTimeout })
			durs := make([]time.Duration, tc.n)
			errs := onAll(comms, func(r int, c *allreduce.Comm) error {
				fn := tc.others
				if r == tc.odd {
					fn = tc.oddOne
				}
				d, err := timed(func() error { return fn(t.Context(), c) })
				durs[r] = d
				return err
			})
			checkMisuse(t, comms, errs, durs, tc.want)
		})
	}
}

// TestUnsupportedArguments: arguments refused before anything is sent give a plain error
// and leave the communicator working.
func TestUnsupportedArguments(t *testing.T) {
	comms := newWorld(t, 3, 1, nil, nil)
	ctx := t.Context()
	c := comms[0]
	cases := []struct {
		name string
		call func() error
		want string
	}{
		{"allreduce int32", func() error { return c.Allreduce(ctx, []int32{1}, allreduce.Sum) }, "unsupported buffer type"},
		{"allreduce bytes", func() error { return c.Allreduce(ctx, []byte{1}, allreduce.Sum) }, "unsupported buffer type"},
		{"allreduce nil", func() error { return c.Allreduce(ctx, nil, allreduce.Sum) }, "unsupported buffer type"},
		{"allreduce op 0", func() error { return c.Allreduce(ctx, []float32{1}, allreduce.Op(0)) }, "unsupported reduction"},
		{"allreduce op 7", func() error { return c.Allreduce(ctx, []float64{1}, allreduce.Op(7)) }, "unsupported reduction"},
		{"broadcast root -1", func() error { return c.Broadcast(ctx, []byte{1}, -1) }, "root -1"},
		{"broadcast root n", func() error { return c.Broadcast(ctx, []byte{1}, 3) }, "root 3"},
		{"broadcast strings", func() error { return c.Broadcast(ctx, []string{"x"}, 0) }, "unsupported buffer type"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			switch {
			case err == nil:
				t.Fatal("no error")
			case errors.Is(err, allreduce.ErrProtocol), errors.Is(err, allreduce.ErrPeerLost), errors.Is(err, allreduce.ErrClosed):
				t.Fatalf("%v: a caller's mistake must not look like a peer's failure", err)
			case !strings.Contains(err.Error(), tc.want):
				t.Fatalf("%v: want it to mention %q", err, tc.want)
			}
		})
	}
	// Nothing was sent: the next collective works on every rank.
	checkAllreduce[float32](t, comms, 1000, allreduce.Sum)
}

func TestClosed(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			comms := newWorld(t, n, 1, nil, nil)
			for r, c := range comms {
				if err := c.Close(); err != nil {
					t.Fatalf("rank %d: Close: %v", r, err)
				}
				if err := c.Close(); err != nil {
					t.Fatalf("rank %d: second Close: %v", r, err)
				}
				ctx := t.Context()
				out, gerr := c.Allgather(ctx, []byte{1})
				for name, err := range map[string]error{
					"Allreduce": c.Allreduce(ctx, []float32{1}, allreduce.Sum),
					"Broadcast": c.Broadcast(ctx, []byte{1}, 0),
					"Allgather": gerr,
					"Barrier":   c.Barrier(ctx),
				} {
					if !errors.Is(err, allreduce.ErrClosed) {
						t.Errorf("rank %d: %s after Close: %v, want ErrClosed", r, name, err)
					}
				}
				if out != nil {
					t.Errorf("rank %d: Allgather after Close returned data", r)
				}
			}
		})
	}
}

// enteredCtx reports, by closing entered, the first time a collective subscribes to its
// cancellation: from then on the collective is under way on this rank, so a cancel or a
// Close interrupts it rather than preventing it.
type enteredCtx struct {
	context.Context
	once    sync.Once
	entered chan struct{}
}

func newEnteredCtx(ctx context.Context) *enteredCtx {
	return &enteredCtx{Context: ctx, entered: make(chan struct{})}
}

func (c *enteredCtx) Done() <-chan struct{} {
	c.once.Do(func() { close(c.entered) })
	return c.Context.Done()
}

func waitEntered(t *testing.T, c *enteredCtx) {
	t.Helper()
	select {
	case <-c.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the collective never subscribed to its context")
	}
}

// TestCloseDuringOp: Close interrupts a collective blocked on a peer that has not joined;
// both return promptly, and the peer learns that this rank is gone.
func TestCloseDuringOp(t *testing.T) {
	for _, tc := range []struct {
		elems     int
		transport string
	}{ // doubling, ring; over shared memory and over TCP
		{1000, allreduce.TransportAuto}, {1 << 20, allreduce.TransportAuto},
		{1000, allreduce.TransportTCP}, {1 << 20, allreduce.TransportTCP},
	} {
		elems := tc.elems
		t.Run(fmt.Sprintf("elems=%d/%s", elems, tc.transport), func(t *testing.T) {
			comms := newWorld(t, 2, 1, nil, func(c *allreduce.Config) {
				c.Timeout = misuseTimeout
				c.Transport = tc.transport
			})
			bufs := [][]float32{exactInput[float32](0, elems), exactInput[float32](1, elems)}
			ctx := newEnteredCtx(t.Context())
			type result struct {
				err error
				at  time.Time
			}
			opDone := make(chan result, 1)
			go func() {
				err := comms[0].Allreduce(ctx, bufs[0], allreduce.Sum)
				opDone <- result{err, time.Now()}
			}()
			waitEntered(t, ctx)
			// Entered is before the collective starts: give it time to send what it can and
			// to wait on the peer (asleep, past any spinning), which Close must wake.
			time.Sleep(200 * time.Millisecond)
			closeStart := time.Now()
			d, err := timed(comms[0].Close)
			if err != nil || d > prompt {
				t.Fatalf("Close during an operation: %v after %v", err, d)
			}
			select {
			case res := <-opDone:
				if !errors.Is(res.err, allreduce.ErrClosed) {
					t.Fatalf("interrupted operation: %v, want ErrClosed", res.err)
				}
				if d := res.at.Sub(closeStart); d > prompt {
					t.Fatalf("interrupted operation returned %v after Close", d)
				}
			case <-time.After(misuseTimeout):
				t.Fatal("the operation did not return after Close")
			}
			errs := make([]error, 2)
			d, errs[1] = timed(func() error { return comms[1].Allreduce(t.Context(), bufs[1], allreduce.Sum) })
			if d > prompt {
				t.Fatalf("rank 1 took %v to notice that rank 0 closed", d)
			}
			checkAbandoned(t, comms, 0, errs, bufs, reference[float32](2, elems, allreduce.Sum))
		})
	}
}

// TestCancelMidOp: cancelling one rank's context during a collective returns at once on that
// rank with the cause, and the others fail naming it. Rank n-1 joins only after rank 0 has
// returned, so the collective cannot complete on every rank.
func TestCancelMidOp(t *testing.T) {
	for _, elems := range []int{1000, 1 << 18} { // doubling, ring (hierarchical on hosts)
		for _, n := range []int{2, 4, 5} {
			for _, hosts := range []bool{false, true} {
				name := fmt.Sprintf("n=%d/elems=%d", n, elems)
				if hosts {
					name += "/hosts=2"
				}
				t.Run(name, func(t *testing.T) { cancelMidOp(t, n, elems, hosts) })
			}
		}
	}
}

// cancelMidOp is one case of TestCancelMidOp; with hosts, even and odd ranks are on two
// simulated hosts.
func cancelMidOp(t *testing.T, n, elems int, hosts bool) {
	comms := newWorld(t, n, 1, nil, func(c *allreduce.Config) {
		c.Timeout = misuseTimeout
		if hosts {
			c.HostID = fmt.Sprint("host ", c.Rank%2)
		}
	})
	bufs := make([][]float32, n)
	for r := range n {
		bufs[r] = exactInput[float32](r, elems)
	}
	cause := errors.New("test cancelled rank 0")
	base, cancel := context.WithCancelCause(t.Context())
	ctx := newEnteredCtx(base)
	errs := make([]error, n)
	ends := make([]time.Time, n)
	run := func(r int, ctx context.Context) {
		errs[r] = comms[r].Allreduce(ctx, bufs[r], allreduce.Sum)
		ends[r] = time.Now()
	}
	var wg sync.WaitGroup
	rank0 := make(chan struct{})
	go func() { defer close(rank0); run(0, ctx) }()
	for r := 1; r < n-1; r++ {
		wg.Go(func() { run(r, t.Context()) })
	}
	waitEntered(t, ctx)
	cancelled := time.Now()
	cancel(cause)
	select {
	case <-rank0:
	case <-time.After(misuseTimeout):
		t.Fatal("rank 0 did not return after its context was cancelled")
	}
	joined := time.Now()
	wg.Go(func() { run(n-1, t.Context()) })
	wg.Wait()
	if !errors.Is(errs[0], cause) {
		t.Errorf("rank 0: %v, want the cancellation cause", errs[0])
	}
	for r := range n {
		from := cancelled
		if r == n-1 {
			from = joined
		}
		if d := ends[r].Sub(from); d > prompt {
			t.Errorf("rank %d returned %v after the cancellation (or after joining)", r, d)
		}
	}
	checkAbandoned(t, comms, 0, errs, bufs, reference[float32](n, elems, allreduce.Sum))
}

// TestCancelledBeforeOp: a context that is already done sends nothing, so the communicator
// stays usable.
func TestCancelledBeforeOp(t *testing.T) {
	comms := newWorld(t, 3, 1, nil, nil)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := comms[1].Allreduce(ctx, make([]float32, 10), allreduce.Sum); !errors.Is(err, context.Canceled) {
		t.Fatalf("Allreduce with a cancelled context: %v", err)
	}
	checkAllreduce[float64](t, comms, 1000, allreduce.Max)
}
