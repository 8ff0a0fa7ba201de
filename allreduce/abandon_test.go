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
