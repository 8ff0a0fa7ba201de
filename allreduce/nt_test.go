package allreduce_test

import (
	"context"
	"testing"

	"github.com/elasticd/elasticd/allreduce"
)

// Whether copies into shared memory use non-temporal stores is decided per communicator from
// ELASTICD_SHM_NONTEMPORAL and the machine's caches (Stats.NonTemporalFrom), and per
// collective from its size; the data is the same either way.
func TestNonTemporalChoice(t *testing.T) {
	for _, setting := range []string{"0", "1", "auto"} {
		t.Run(setting, func(t *testing.T) {
			defer allreduce.SetNonTemporal(setting)()
			comms := newWorld(t, 2, 1, nil, nil)
			if comms[0].Stats().SharedMemory == 0 {
				t.Skip("no shared memory between ranks here")
			}
			from := allreduce.NonTemporalFor(2)
			switch {
			case setting == "0" && from != -1, setting == "1" && from > 0:
				t.Fatalf("ELASTICD_SHM_NONTEMPORAL=%s gives NonTemporalFrom %d", setting, from)
			}
			for r, c := range comms {
				if got := c.Stats().NonTemporalFrom; got != from {
					t.Fatalf("rank %d: Stats.NonTemporalFrom = %d, want %d", r, got, from)
				}
			}
			sizes := []int{4 << 10, 1 << 20}
			if from > 1<<20 && from <= 64<<20 {
				sizes = append(sizes, int(from+3)/4*4) // the first whole float32 size that takes them
			}
			for _, size := range sizes {
				bufs := make([][]float32, 2)
				errs := make(chan error, 2)
				for r := range bufs {
					bufs[r] = make([]float32, size/4)
					for i := range bufs[r] {
						bufs[r][i] = float32(r + i%7)
					}
					go func() { errs <- comms[r].Allreduce(context.Background(), bufs[r], allreduce.Sum) }()
				}
				for range bufs {
					if err := <-errs; err != nil {
						t.Fatal(err)
					}
				}
				for r := range bufs {
					for i, v := range bufs[r] {
						if want := float32(1 + 2*(i%7)); v != want {
							t.Fatalf("%d bytes: rank %d element %d = %v, want %v", size, r, i, v, want)
						}
					}
					want := from >= 0 && int64(size) >= from
					if got := allreduce.NonTemporalNow(comms[r]); got != want {
						t.Errorf("%d bytes, NonTemporalFrom %d: rank %d non-temporal %t, want %t", size, from, r, got, want)
					}
				}
			}
		})
	}
}
