package allreduce_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/allreduce"
)

// newWorld builds n communicators of one generation in this process: over shared memory
// where the OS has it, unless tweak sets Config.Transport, else over loopback TCP.
func newWorld(t testing.TB, n int, gen uint64, store allreduce.Store, tweak func(*allreduce.Config)) []*allreduce.Comm {
	t.Helper()
	if store == nil {
		store = allreduce.NewMemStore()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	comms := make([]*allreduce.Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			cfg := allreduce.Config{Rank: r, Size: n, Generation: gen, Store: store, Timeout: 10 * time.Second}
			if tweak != nil {
				tweak(&cfg)
			}
			comms[r], errs[r] = allreduce.New(ctx, cfg)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: New: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}

// onAll runs fn on every rank concurrently and returns each rank's error.
func onAll(comms []*allreduce.Comm, fn func(r int, c *allreduce.Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = fn(r, c) })
	}
	wg.Wait()
	return errs
}

func mustAll(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// sameHostShm is how many of n peers on this machine a communicator reaches over shared
// memory by default: all of them where the OS has the transport.
func sameHostShm(n int) int {
	if allreduce.ShmSupported {
		return n
	}
	return 0
}
