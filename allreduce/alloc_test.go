package allreduce_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/elasticd/elasticd/allreduce"
)

// TestAllreduceAllocatesNothing: over shared memory and over TCP (Linux: one goroutine and
// non-blocking sockets), a collective on the same kind of buffer as the one before allocates
// nothing on any rank, so that a training loop reducing every bucket of every step gives the
// garbage collector no work (a collection every ~60 ms stole a core from small messages on 2
// vCPUs). Waits that sleep look at the peer's connection first, and that look allocates
// nothing either. Each size takes another algorithm: recursive doubling, the ring (2 ranks),
// recursive halving and doubling (4 ranks), reading the peers' buffers (2 to 4 ranks).
func TestAllreduceAllocatesNothing(t *testing.T) {
	for _, tc := range []struct {
		transport string
		n, elems  int
		direct    bool // reading the peers' buffers (Config.DirectBytes) from 256 KiB
	}{
		{allreduce.TransportAuto, 2, 1 << 18, true}, {allreduce.TransportAuto, 3, 1 << 18, true},
		{allreduce.TransportAuto, 4, 1<<18 + 1, true},
		{allreduce.TransportAuto, 2, 1 << 10, false}, {allreduce.TransportAuto, 2, 1 << 18, false},
		{allreduce.TransportAuto, 4, 1 << 10, false}, {allreduce.TransportAuto, 4, 1 << 16, false},
		{allreduce.TransportTCP, 2, 1 << 10, false}, {allreduce.TransportTCP, 2, 1 << 18, false},
		{allreduce.TransportTCP, 4, 1 << 10, false}, {allreduce.TransportTCP, 4, 1 << 16, false},
	} {
		name := fmt.Sprintf("%s/n=%d/%dKB", tc.transport, tc.n, tc.elems*4>>10)
		if tc.direct {
			name += "/direct"
		}
		t.Run(name, func(t *testing.T) {
			if tc.transport == allreduce.TransportTCP && runtime.GOOS != "linux" {
				t.Skipf("TCP exchanges run through goroutines on %s", runtime.GOOS)
			}
			comms := newWorld(t, tc.n, 1, nil, func(c *allreduce.Config) {
				c.Transport = tc.transport
				c.DirectBytes = -1
				if tc.direct {
					c.DirectBytes = 256 << 10
				}
			})
			if tc.transport == allreduce.TransportAuto && comms[0].Stats().SharedMemory == 0 {
				t.Skipf("no shared memory between ranks on %s", runtime.GOOS)
			}
			ctx, cancel := context.WithCancel(t.Context()) // watched: Done is not nil
			defer cancel()
			// Boxed once: passing a slice as `any` allocates its header, in the caller.
			bufs := make([]any, tc.n)
			for r := range bufs {
				bufs[r] = make([]float32, tc.elems)
			}
			// Ranks 1..n-1 run in goroutines of their own for the whole test, an operation
			// per token, so that the measured function starts no goroutine.
			start := make(chan struct{})
			done := make(chan error)
			for r := 1; r < tc.n; r++ {
				go func() {
					for range start {
						done <- comms[r].Allreduce(ctx, bufs[r], allreduce.Sum)
					}
				}()
			}
			defer close(start)
			var failed error
			op := func() {
				for range tc.n - 1 {
					start <- struct{}{}
				}
				if err := comms[0].Allreduce(ctx, bufs[0], allreduce.Sum); err != nil && failed == nil {
					failed = err
				}
				for range tc.n - 1 {
					if err := <-done; err != nil && failed == nil {
						failed = err
					}
				}
			}
			op() // the communicators' storage for this size
			allocs := testing.AllocsPerRun(50, op)
			if failed != nil {
				t.Fatal(failed)
			}
			if allocs != 0 {
				t.Errorf("%v allocations per allreduce of %d ranks, want 0", allocs, tc.n)
			}
			if got := comms[0].Stats().DirectAllreduces > 0; got != tc.direct {
				t.Errorf("read the peers' buffers directly: %t, want %t", got, tc.direct)
			}
		})
	}
}
