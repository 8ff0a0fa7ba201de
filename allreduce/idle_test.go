package allreduce_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/elasticd/elasticd/allreduce"
)

// TestIdleLongerThanTimeout: Timeout bounds waits inside a collective, not the time between
// collectives; a training step or a checkpoint may well take longer. Each pause follows a
// collective that wrote with a deadline (the ring, a broadcast) and precedes one that
// starts with a non-blocking write (recursive doubling), which once failed at once with a
// made-up "silent for 300ms" because the old deadline had passed.
func TestIdleLongerThanTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			comms := newWorld(t, n, 1, nil, func(c *allreduce.Config) {
				c.Timeout = timeout
				c.SmallBytes = 4096
			})
			barrier := func(t *testing.T) {
				mustAll(t, onAll(comms, func(_ int, c *allreduce.Comm) error { return c.Barrier(t.Context()) }))
			}
			steps := []struct {
				name  string
				pause bool
				run   func(*testing.T)
			}{
				{"ring allreduce", false, func(t *testing.T) { checkAllreduce[float32](t, comms, 100000, allreduce.Sum) }},
				{"doubling allreduce after a pause", true, func(t *testing.T) { checkAllreduce[int64](t, comms, 7, allreduce.Max) }},
				{"broadcast", false, func(t *testing.T) {
					mustAll(t, onAll(comms, func(_ int, c *allreduce.Comm) error {
						return c.Broadcast(t.Context(), make([]byte, 10000), n-1)
					}))
				}},
				{"barrier after a pause", true, barrier},
				{"ring allreduce after a pause", true, func(t *testing.T) { checkAllreduce[float64](t, comms, 100000, allreduce.Min) }},
			}
			for _, s := range steps {
				if s.pause {
					time.Sleep(timeout + 50*time.Millisecond) // the pause is the scenario, not a synchronisation
				}
				if !t.Run(s.name, s.run) {
					return
				}
			}
		})
	}
}
