package allreduce_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/elasticd/elasticd/allreduce"
)

// TestDirectAgreement: every rank of a world ends with the same Stats.DirectFrom, the largest
// size any rank asked for, or -1 where any rank will not or cannot read directly, or where
// the world is not 2 to 4 ranks on one host; and allreduces from that size on, alone, take
// the direct path.
func TestDirectAgreement(t *testing.T) {
	if !allreduce.ShmSupported {
		t.Skip("no shared memory between ranks here: nothing reads directly")
	}
	const small = 64<<10 + 1 // above the default SmallBytes: the smallest DirectFrom can be
	fixed := func(bytes ...int) func(*allreduce.Config) {
		return func(c *allreduce.Config) { c.DirectBytes = bytes[c.Rank%len(bytes)] }
	}
	for _, tc := range []struct {
		name  string
		n     int
		env   string
		tweak func(*allreduce.Config)
		want  int64
	}{
		{"2 ranks", 2, "", fixed(1), small},
		{"3 ranks", 3, "", fixed(1), small},
		{"4 ranks", 4, "", fixed(1), small},
		{"5 ranks: not every pair connected", 5, "", fixed(1), -1},
		{"the largest asked for", 3, "", fixed(1<<20, 3<<20, 2<<20), 3 << 20},
		{"one rank will not", 4, "", fixed(1, 1, -1, 1), -1},
		{"env never, whatever the config", 2, "0", fixed(1), -1},
		{"env always", 2, "1", nil, allreduce.DirectAutoBytes},
		{"auto: as the machine measures", 2, "", nil, allreduce.DirectAuto()},
		{"env auto, a size in the config", 2, "auto", fixed(8 << 20), 8 << 20},
		{"TCP", 2, "1", func(c *allreduce.Config) { c.Transport = allreduce.TransportTCP }, -1},
		{"two hosts", 4, "1", func(c *allreduce.Config) { c.HostID = fmt.Sprint("host ", c.Rank%2) }, -1},
		{"recursive doubling's sizes stay its own", 2, "", func(c *allreduce.Config) { c.DirectBytes = 1; c.SmallBytes = 1 << 20 }, 1<<20 + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer allreduce.SetDirect(tc.env)()
			comms := newWorld(t, tc.n, 1, nil, tc.tweak)
			for r, c := range comms {
				if got := c.Stats().DirectFrom; got != tc.want {
					t.Fatalf("rank %d: DirectFrom %d, want %d", r, got, tc.want)
				}
			}
			if tc.want < 0 || tc.want > 8<<20 {
				return
			}
			for _, elems := range []int{int(tc.want)/4 - 1, int(tc.want+3) / 4} {
				bufs := make([][]float32, tc.n)
				for r := range bufs {
					bufs[r] = make([]float32, elems)
				}
				before := comms[0].Stats().DirectAllreduces
				mustAll(t, onAll(comms, func(r int, c *allreduce.Comm) error { return c.Allreduce(t.Context(), bufs[r], allreduce.Sum) }))
				want := before
				if int64(elems*4) >= tc.want {
					want++
				}
				for r, c := range comms {
					if got := c.Stats().DirectAllreduces; got != want {
						t.Errorf("rank %d, %d bytes: %d direct allreduces, want %d", r, elems*4, got, want)
					}
				}
			}
		})
	}
}

// Direct reads need every rank connected to every other; New connects the ring's neighbours
// and the doubling partners, and in worlds up to DirectMaxRanks those are all the others (the
// reason for the limit, which New then need not check), while the next world size is not.
func TestDirectWorldsAreFullMesh(t *testing.T) {
	for n := 2; n <= allreduce.DirectMaxRanks+1; n++ {
		full := true
		for r := range n {
			full = full && len(allreduce.Neighbours(r, n)) == n-1
		}
		if want := n <= allreduce.DirectMaxRanks; full != want {
			t.Errorf("%d ranks: every rank connected to every other: %t, want %t", n, full, want)
		}
	}
}

// An ELASTICD_SHM_NONTEMPORAL or ELASTICD_SHM_DIRECT value that is not understood is read as
// auto and said once per process, not once per generation.
func TestUnknownSettingsWarnOnce(t *testing.T) {
	if !allreduce.ShmSupported {
		t.Skip("no shared memory between ranks here: neither variable is read")
	}
	defer allreduce.SetDirect("sometimes")()
	defer allreduce.SetNonTemporal("often")()
	allreduce.ForgetEnvWarnings()
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	store := allreduce.NewMemStore()
	for gen := uint64(1); gen <= 2; gen++ {
		comms := newWorld(t, 2, gen, store, func(c *allreduce.Config) { c.Logger = logger })
		for r, c := range comms {
			if got, want := c.Stats().DirectFrom, allreduce.DirectAuto(); got != want {
				t.Errorf("generation %d, rank %d: DirectFrom %d, want auto's %d", gen, r, got, want)
			}
		}
	}
	for _, v := range []string{"ELASTICD_SHM_DIRECT", "ELASTICD_SHM_NONTEMPORAL"} {
		if n := strings.Count(logs.String(), v+" not understood"); n != 1 {
			t.Errorf("%s warned %d times in two generations of two ranks, want once:\n%s", v, n, logs.String())
		}
	}
}

// syncBuffer is a bytes.Buffer that the ranks' goroutines may log to at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
