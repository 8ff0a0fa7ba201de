package allreduce_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/allreduce"
)

// A rank waiting in New for peers that have moved on returns as soon as the generation is
// abandoned, long before its Timeout, with an error wrapping ErrPeerLost.
func TestAbandonEndsNew(t *testing.T) {
	store := allreduce.NewMemStore()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		c, err := allreduce.New(context.Background(), allreduce.Config{Rank: 1, Size: 3, Generation: 7, Store: store, Timeout: 30 * time.Second})
		if c != nil {
			c.Close()
		}
		done <- err
	}()
	// Another generation's abandonment does not disturb it.
	if err := allreduce.Abandon(context.Background(), store, 6, "rank 0 reset"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("New returned on another generation's abandonment: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := allreduce.Abandon(context.Background(), store, 7, "rank 0 reset: peer lost"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, allreduce.ErrPeerLost) {
			t.Fatalf("New: %v, want ErrPeerLost", err)
		}
		if want := "rank 0 reset: peer lost"; !strings.Contains(err.Error(), want) {
			t.Fatalf("New: %v, want the reason %q", err, want)
		}
		t.Logf("New returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(10 * time.Second):
		t.Fatal("New still waiting 10s after the generation was abandoned")
	}
}

// A rank whose peer never comes (hung, stopped or never started) fails New after Timeout
// with an error that wraps ErrPeerLost and ErrPeerSilent, as a silent peer in a collective
// does, so that the worker resets and says so instead of exiting; and the deadline too.
func TestNewTimeoutIsASilentPeer(t *testing.T) {
	store := allreduce.NewMemStore()
	start := time.Now()
	c, err := allreduce.New(t.Context(), allreduce.Config{Rank: 0, Size: 2, Generation: 1, Store: store, Timeout: 300 * time.Millisecond})
	if c != nil {
		c.Close()
		t.Fatal("New succeeded without its peer")
	}
	for _, target := range []error{allreduce.ErrPeerLost, allreduce.ErrPeerSilent, context.DeadlineExceeded} {
		if !errors.Is(err, target) {
			t.Errorf("New: %v, want it to wrap %v", err, target)
		}
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("New returned after %v, want about its 300ms timeout", took)
	}
	// The caller's own context ending is not a peer's fault.
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	c, err = allreduce.New(ctx, allreduce.Config{Rank: 0, Size: 2, Generation: 2, Store: store, Timeout: 30 * time.Second})
	if c != nil {
		c.Close()
		t.Fatal("New succeeded without its peer")
	}
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, allreduce.ErrPeerSilent) {
		t.Errorf("New under a caller's deadline: %v, want the deadline and no silent peer", err)
	}
}

// blockingSetStore is a store whose Set waits for its context to end, as a request to a
// driver that is slow to answer does.
type blockingSetStore struct{ allreduce.Store }

func (s blockingSetStore) Set(ctx context.Context, key string, value []byte) error {
	<-ctx.Done()
	return ctx.Err()
}

// A rank still publishing its address when its generation is abandoned (a peer died as the
// generation formed) fails New with an error wrapping ErrPeerLost, as a rank waiting for its
// peers does: the worker then asks for the next generation instead of exiting. Found by the
// 2-hour Go soak: a healthy worker exited 1 on "publish address: context canceled", and its
// slot was blacklisted.
func TestAbandonWhilePublishing(t *testing.T) {
	mem := allreduce.NewMemStore()
	done := make(chan error, 1)
	go func() {
		c, err := allreduce.New(t.Context(), allreduce.Config{Rank: 1, Size: 2, Generation: 5, Store: blockingSetStore{mem}, Timeout: 30 * time.Second})
		if c != nil {
			c.Close()
		}
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := allreduce.Abandon(t.Context(), mem, 5, "rank 0 reset"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, allreduce.ErrPeerLost) || !strings.Contains(err.Error(), "publish address") {
			t.Fatalf("New: %v, want ErrPeerLost from publishing the address", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("New still publishing 10s after the generation was abandoned")
	}
	// And a publish that outlasts the timeout is a peer that never came, as any wait is.
	_, err := allreduce.New(t.Context(), allreduce.Config{Rank: 1, Size: 2, Generation: 6, Store: blockingSetStore{mem}, Timeout: 200 * time.Millisecond})
	if !errors.Is(err, allreduce.ErrPeerSilent) {
		t.Fatalf("New: %v, want ErrPeerSilent", err)
	}
}
