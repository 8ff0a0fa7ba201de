package providers

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// blockingDriver answers Hosts polls only when released, and counts them.
type blockingDriver struct {
	entered chan struct{}
	release chan struct{}
	calls   atomic.Int32
}

func (d *blockingDriver) ListHosts(ctx context.Context) ([]Host, error) {
	d.calls.Add(1)
	d.entered <- struct{}{}
	select {
	case <-d.release:
		return []Host{{ID: "h1", Addr: "10.0.0.1", Slots: 1}}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (d *blockingDriver) Classify(error) Verdict { return Permanent }

// Callers that arrive while a poll is in progress share it: with no MinInterval at all,
// eight callers make one request.
func TestLoopConcurrentCallersShareOnePoll(t *testing.T) {
	d := &blockingDriver{entered: make(chan struct{}, 8), release: make(chan struct{})}
	l := NewLoop(LoopConfig{Name: "test"}, d)
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	got := make([][]Host, n)
	wg.Go(func() { got[0], errs[0] = l.Hosts(t.Context()) })
	<-d.entered
	for i := 1; i < n; i++ {
		wg.Go(func() { got[i], errs[i] = l.Hosts(t.Context()) })
	}
	// Wait (bounded) until every later caller waits for the poll in progress.
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		w := l.waiters
		l.mu.Unlock()
		if w == n-1 {
			break
		}
		if time.Now().After(deadline) {
			close(d.release)
			wg.Wait()
			t.Fatalf("%d callers wait for the poll in progress; want %d", w, n-1)
		}
		time.Sleep(time.Millisecond)
	}
	close(d.release)
	wg.Wait()
	if c := d.calls.Load(); c != 1 {
		t.Errorf("%d polls for %d concurrent callers; want 1 shared", c, n)
	}
	for i := range n {
		if errs[i] != nil || len(got[i]) != 1 || got[i][0].ID != "h1" {
			t.Errorf("caller %d: %v, %v; want the one host", i, got[i], errs[i])
		}
	}
	got[1][0].ID = "changed"
	if got[2][0].ID != "h1" {
		t.Error("callers that shared a poll share its slice; each must own its own")
	}
}
