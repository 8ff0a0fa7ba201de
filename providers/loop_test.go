package providers_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/throttle"
)

// fakeClock is a settable clock; its After fires at once, recording the wait asked for,
// unless block is set, when it calls block and never fires.
type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	waits []time.Duration
	block func()
}

func newClock() *fakeClock { return &fakeClock{now: time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	c.waits = append(c.waits, d)
	c.now = c.now.Add(d)
	block := c.block
	c.mu.Unlock()
	if block != nil {
		block()
		return nil
	}
	ch := make(chan time.Time, 1)
	ch <- c.Now()
	return ch
}

func (c *fakeClock) Waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}

var (
	errBusy = errors.New("busy: try later")
	errHour = errors.New("busy: come back in an hour")
)

// scriptDriver answers each request from errs in turn (nil: success), through the Loop's
// Call, and classifies errBusy as retryable.
type scriptDriver struct {
	l         *providers.Loop
	mu        sync.Mutex
	errs      []error
	requests  int
	notices   [][]providers.Notice
	answered  []string
	answerErr error
}

func (d *scriptDriver) ListHosts(ctx context.Context) ([]providers.Host, error) {
	err := d.l.Call(ctx, "list", func(context.Context) error {
		d.mu.Lock()
		defer d.mu.Unlock()
		i := d.requests
		d.requests++
		if i < len(d.errs) {
			return d.errs[i]
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return []providers.Host{{ID: "h1", Addr: "10.0.0.1", Slots: 1}}, nil
}

func (d *scriptDriver) Classify(err error) providers.Verdict {
	if errors.Is(err, errBusy) {
		return providers.Verdict{Rest: true, Retry: true, After: -1}
	}
	if errors.Is(err, errHour) {
		return providers.Verdict{Rest: true, Retry: true, After: time.Hour}
	}
	return providers.Permanent
}

func (d *scriptDriver) ListNotices(context.Context) ([]providers.Notice, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.notices) == 0 {
		return nil, nil
	}
	ns := d.notices[0]
	d.notices = d.notices[1:]
	return ns, nil
}

func (d *scriptDriver) AnswerNotice(_ context.Context, n providers.Notice) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.answered = append(d.answered, n.ID)
	return d.answerErr
}

func (d *scriptDriver) Requests() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.requests
}

func newLoop(cfg providers.LoopConfig, d *scriptDriver, c *fakeClock) *providers.Loop {
	cfg.Name = "test"
	cfg.Where = func() string { return `group "g"` }
	cfg.Now = c.Now
	cfg.Gates = throttle.Config{Now: c.Now, After: c.After}
	d.l = providers.NewLoop(cfg, d)
	return d.l
}

func TestLoopReusesAnswerWithinMinInterval(t *testing.T) {
	c := newClock()
	d := &scriptDriver{}
	l := newLoop(providers.LoopConfig{MinInterval: 5 * time.Second}, d, c)
	for range 3 {
		if _, err := l.Hosts(t.Context()); err != nil {
			t.Fatal(err)
		}
		c.Advance(time.Second)
	}
	if n := d.Requests(); n != 1 {
		t.Errorf("3 polls within MinInterval: %d requests; want 1", n)
	}
	c.Advance(2 * time.Second) // 5 s after the first poll began
	if _, err := l.Hosts(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := d.Requests(); n != 2 {
		t.Errorf("a poll MinInterval after the first: %d requests; want 2", n)
	}
	l.Forget()
	if _, err := l.Hosts(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := d.Requests(); n != 3 {
		t.Errorf("a poll after Forget: %d requests; want 3", n)
	}
}

// A failure is reused within MinInterval only with KeepErrors.
func TestLoopKeepErrors(t *testing.T) {
	denied := errors.New("denied")
	for _, keep := range []bool{false, true} {
		c := newClock()
		d := &scriptDriver{errs: []error{denied}}
		l := newLoop(providers.LoopConfig{MinInterval: 5 * time.Second, KeepErrors: keep}, d, c)
		_, err1 := l.Hosts(t.Context())
		_, err2 := l.Hosts(t.Context())
		if !errors.Is(err1, denied) {
			t.Fatalf("KeepErrors=%v: first poll %v; want denied", keep, err1)
		}
		want, wantErr := 2, false
		if keep {
			want, wantErr = 1, true
		}
		if n := d.Requests(); n != want || (err2 != nil) != wantErr {
			t.Errorf("KeepErrors=%v: second poll %v after %d requests; want %d requests, error %v", keep, err2, n, want, wantErr)
		}
	}
}

func TestLoopRetriesRetryableErrorsBounded(t *testing.T) {
	c := newClock()
	d := &scriptDriver{errs: []error{errBusy, errBusy}}
	l := newLoop(providers.LoopConfig{Gates: throttle.Config{}}, d, c)
	hosts, err := l.Hosts(t.Context())
	if err != nil || len(hosts) != 1 {
		t.Fatalf("after two busy answers: %v, %v; want the host", hosts, err)
	}
	if n := d.Requests(); n != 3 {
		t.Errorf("%d requests; want 3 (two busy, then the answer)", n)
	}
	if w := c.Waits(); len(w) != 2 || w[1] <= w[0] {
		t.Errorf("waits before the retries %v; want two, growing", w)
	}

	c = newClock()
	d = &scriptDriver{errs: []error{errBusy, errBusy, errBusy, errBusy, errBusy}}
	l = newLoop(providers.LoopConfig{Tries: 3}, d, c)
	_, err = l.Hosts(t.Context())
	if n := d.Requests(); n != 3 {
		t.Errorf("persistently busy: %d requests; want 3 (Tries)", n)
	}
	var re *providers.RetryError
	if !errors.Is(err, errBusy) || !errors.As(err, &re) || re.Tries != 3 {
		t.Errorf("persistently busy: %v; want a RetryError of 3 tries wrapping the last answer", err)
	}
	if !strings.HasPrefix(err.Error(), `test: group "g": list: 3 tries`) {
		t.Errorf("error %q; want the prefix, then the endpoint and the tries", err)
	}
	// The endpoint now rests: the next poll waits it out before it asks again.
	before := len(c.Waits())
	if _, err := l.Hosts(t.Context()); err == nil {
		t.Fatal("still busy: no error")
	}
	if w := c.Waits(); len(w) <= before {
		t.Error("the next poll did not wait out the endpoint's rest")
	}
}

func TestLoopPermanentErrorAtOnce(t *testing.T) {
	c := newClock()
	bad := errors.New("InvalidParameter: no such group")
	d := &scriptDriver{errs: []error{bad}}
	l := newLoop(providers.LoopConfig{}, d, c)
	_, err := l.Hosts(t.Context())
	if !errors.Is(err, bad) {
		t.Fatalf("error %v; want one wrapping %v", err, bad)
	}
	if want := `test: group "g": InvalidParameter: no such group`; err.Error() != want {
		t.Errorf("error %q; want %q (the prefix, once)", err, want)
	}
	if n, w := d.Requests(), len(c.Waits()); n != 1 || w != 0 {
		t.Errorf("%d requests, %d waits; want 1 and none", n, w)
	}
}

// Cancelling the context while a retry waits stops the retries with ctx's error.
func TestLoopCancelStopsRetries(t *testing.T) {
	c := newClock()
	d := &scriptDriver{errs: []error{errBusy, errBusy, errBusy}}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	c.block = cancel // the wait for the retry begins: cancel, and the wait never ends on its own
	l := newLoop(providers.LoopConfig{}, d, c)
	_, err := l.Hosts(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v; want one wrapping context.Canceled", err)
	}
	if !strings.HasPrefix(err.Error(), "test: ") {
		t.Errorf("error %q; want the prefix", err)
	}
	if n := d.Requests(); n != 1 {
		t.Errorf("%d requests; want 1 (the retry was cancelled)", n)
	}
	// An ended context makes no request at all.
	if _, err := l.Hosts(ctx); !errors.Is(err, context.Canceled) || d.Requests() != 1 {
		t.Errorf("poll with an ended context: %v after %d requests; want context.Canceled and no request", err, d.Requests())
	}
}

// A rest longer than a poll may wait is not waited: the poll fails at once, not calling.
func TestLoopRestLongerThanPollFailsAtOnce(t *testing.T) {
	c := newClock()
	d := &scriptDriver{errs: []error{errHour}}
	l := newLoop(providers.LoopConfig{}, d, c)
	_, err := l.Hosts(t.Context())
	if !errors.Is(err, errHour) || !errors.Is(err, throttle.ErrThrottled) {
		t.Fatalf("first poll: %v; want the answer, and that the hour's rest is not waited", err)
	}
	_, err = l.Hosts(t.Context())
	if !errors.Is(err, throttle.ErrThrottled) || d.Requests() != 1 || len(c.Waits()) != 0 {
		t.Errorf("poll within the rest: %v after %d requests, waits %v; want ErrThrottled, no request, no wait",
			err, d.Requests(), c.Waits())
	}
}

func TestLoopNotices(t *testing.T) {
	c := newClock()
	a := providers.Notice{ID: "a", HostID: "h1", Kind: providers.Interruption}
	b := providers.Notice{ID: "b", HostID: "h2", Kind: providers.ScaleIn}
	d := &scriptDriver{notices: [][]providers.Notice{{a, a, b}, nil}}
	l := newLoop(providers.LoopConfig{MinInterval: time.Hour}, d, c)
	if _, err := l.Hosts(t.Context()); err != nil {
		t.Fatal(err)
	}
	ns, err := l.Notices(t.Context())
	if err != nil || len(ns) != 2 || ns[0].ID != "a" || ns[1].ID != "b" {
		t.Fatalf("notices %v, %v; want a and b once each", ns, err)
	}
	if _, err := l.Hosts(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := d.Requests(); n != 2 {
		t.Errorf("Hosts after notices: %d requests; want 2 (the notices made it ask again)", n)
	}
	if ns, err := l.Notices(t.Context()); err != nil || len(ns) != 0 {
		t.Errorf("empty answer: %v, %v; want none", ns, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := l.Notices(ctx); !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "test: ") {
		t.Errorf("Notices with an ended context: %v; want a prefixed context.Canceled", err)
	}
}

func TestLoopCompleteNotice(t *testing.T) {
	c := newClock()
	d := &scriptDriver{}
	l := newLoop(providers.LoopConfig{}, d, c)
	n := providers.Notice{ID: "a", HostID: "h1", Kind: providers.ScaleIn}
	if err := l.CompleteNotice(t.Context(), n); err != nil {
		t.Fatal(err)
	}
	d.answerErr = errors.New("AccessDenied")
	err := l.CompleteNotice(t.Context(), n)
	if err == nil || !strings.HasPrefix(err.Error(), `test: group "g": AccessDenied`) {
		t.Errorf("failed answer: %v; want it prefixed", err)
	}
	d.answerErr = nil
	if err := l.CompleteNotice(t.Context(), n); err != nil || len(d.answered) != 3 {
		t.Errorf("after a failed answer: %v, answered %v; want a answered each time", err, d.answered)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := l.CompleteNotice(ctx, n); !errors.Is(err, context.Canceled) || len(d.answered) != 3 {
		t.Errorf("with an ended context: %v, answered %v; want context.Canceled and no call", err, d.answered)
	}
}
