package allreduce_test

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/allreduce"
)

// openFDs counts this process's open file descriptors, or returns -1 where /proc is missing.
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

type usage struct {
	goroutines, fds int
	heap            uint64
}

func measure() usage {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return usage{runtime.NumGoroutine(), openFDs(), ms.HeapAlloc}
}

// TestRebuildNoLeak builds and closes a 4-rank world generation after generation, as an
// elastic job does on every reset: a quarter of the rounds fail their collective, a few fail
// in New; half of them over TCP, half over shared memory. Goroutines and file descriptors
// must return to where they started, and closed communicators, though still reachable,
// must not pin their buffers.
func TestRebuildNoLeak(t *testing.T) {
	const n, rounds = 4, 100
	store := allreduce.NewMemStore()
	var closed []*allreduce.Comm // kept reachable on purpose
	round := func(gen int) {
		if gen%20 == 7 {
			// New fails: rank 3 has another secret.
			errs := make([]error, n)
			var wg sync.WaitGroup
			for r := range n {
				wg.Go(func() {
					secret := []byte("secret")
					if r == 3 {
						secret = []byte("other!")
					}
					var c *allreduce.Comm
					c, errs[r] = allreduce.New(t.Context(), allreduce.Config{
						Rank: r, Size: n, Generation: uint64(gen), Store: store,
						Timeout: 300 * time.Millisecond, Secret: secret,
					})
					if c != nil {
						c.Close()
					}
				})
			}
			wg.Wait()
			for r, err := range errs {
				if err == nil {
					t.Fatalf("generation %d: rank %d: New succeeded with a mismatched secret", gen, r)
				}
			}
			return
		}
		comms := newWorld(t, n, uint64(gen), store, func(c *allreduce.Config) {
			if gen%8 >= 4 { // every case over TCP too (its wake-up eventfd)
				c.Transport = allreduce.TransportTCP
			}
		})
		var errs []error
		switch gen % 4 {
		case 0: // a ring allreduce large enough to need scratch space
			errs = onAll(comms, func(r int, c *allreduce.Comm) error {
				return c.Allreduce(t.Context(), make([]float32, 1<<18), allreduce.Sum)
			})
			mustAll(t, errs)
		case 1: // mismatched lengths
			errs = onAll(comms, func(r int, c *allreduce.Comm) error {
				return c.Allreduce(t.Context(), make([]float64, 100+r/3), allreduce.Max)
			})
		case 2: // a rank closes instead of joining
			comms[3].Close()
			errs = onAll(comms[:3], func(r int, c *allreduce.Comm) error { return c.Barrier(t.Context()) })
		case 3:
			mustAll(t, onAll(comms, func(r int, c *allreduce.Comm) error {
				return c.Broadcast(t.Context(), make([]byte, 100000), gen%n)
			}))
		}
		if gen%4 == 1 || gen%4 == 2 {
			for r, err := range errs {
				if !errors.Is(err, allreduce.ErrPeerLost) && !errors.Is(err, allreduce.ErrProtocol) {
					t.Fatalf("generation %d: rank %d: %v, want a failure", gen, r, err)
				}
			}
		}
		for _, c := range comms {
			if err := c.Close(); err != nil {
				t.Fatalf("generation %d: Close: %v", gen, err)
			}
		}
		closed = append(closed, comms...)
	}

	// Warm up: the first world starts what the runtime keeps for good (netpoller, timers).
	round(1000)
	base := measure()
	for gen := range rounds {
		round(gen + 1)
	}
	var now usage
	deadline := time.Now().Add(10 * time.Second)
	for {
		now = measure()
		if now.goroutines <= base.goroutines && now.fds <= base.fds {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("after %d generations: %d goroutines (baseline %d), %d fds (baseline %d); goroutines:\n%s",
				rounds, now.goroutines, base.goroutines, now.fds, base.fds, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond) // polling the runtime, which has no signal to wait on
	}
	// Each of the 25 ring rounds had 4 ranks with 256 KiB of scratch: 25 MiB if Close kept it.
	if grown := int64(now.heap) - int64(base.heap); grown > 8<<20 {
		t.Errorf("heap grew by %d MiB over %d generations, with %d closed communicators reachable",
			grown>>20, rounds, len(closed))
	}
	t.Logf("%d generations: goroutines %d→%d, fds %d→%d, heap %s→%s",
		rounds, base.goroutines, now.goroutines, base.fds, now.fds, mib(base.heap), mib(now.heap))
	runtime.KeepAlive(closed)
}

func mib(b uint64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }
