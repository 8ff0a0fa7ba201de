package bench_test

import (
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/bench"
)

// A hand-made history: samples of step s are positions [(s-1)·batch, s·batch) of an
// identity permutation of dataset samples, dealt round-robin over the ranks; every step
// takes stepTime.
const (
	dataset  = 8
	batch    = 4
	stepTime = 10 * time.Millisecond
)

var t0 = time.Unix(1_700_000_000, 0)

type hist struct {
	ev  []bench.SoakEvent
	now time.Time
}

// gen appends a generation of size ranks resuming at from (its Sync's commit) and training
// steps from+1..to, committing every commitEvery steps (0: never).
func (h *hist) gen(g uint64, size int, from, to int64, commitEvery int) {
	if h.now.IsZero() {
		h.now = t0
	}
	for r := range size {
		h.ev = append(h.ev, bench.SoakEvent{Kind: "start", Gen: g, Rank: r, Size: size, Step: from, T: h.now})
	}
	for s := from + 1; s <= to; s++ {
		h.now = h.now.Add(stepTime)
		pos := int(s-1) * batch
		for r := range size {
			var samples []int32
			for p := pos + r; p < pos+batch; p += size {
				samples = append(samples, int32(p%dataset))
			}
			h.ev = append(h.ev, bench.SoakEvent{Kind: "step", Gen: g, Rank: r, Size: size, Step: s, Epoch: pos / dataset, T: h.now, Samples: samples})
			if commitEvery > 0 && int(s-from)%commitEvery == 0 {
				h.ev = append(h.ev, bench.SoakEvent{Kind: "commit", Gen: g, Rank: r, Step: s, T: h.now})
			}
		}
	}
}

func obs() bench.SoakObservations {
	return bench.SoakObservations{DatasetSize: dataset, Bounds: map[string]time.Duration{"": time.Second, bench.FaultWorkerKill: 3 * time.Second}, FDSlack: 4, RSSGrowth: 1024, GoroutineSlack: 8}
}

func invariants(c bench.SoakCheck) string {
	var s []string
	for _, v := range c.Violations {
		s = append(s, v.Invariant)
	}
	return strings.Join(s, ",")
}

func TestSoakCheck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(h *hist, o *bench.SoakObservations)
		want  string // the violated invariants, sorted
		steps int64
	}{
		{"clean", func(h *hist, o *bench.SoakObservations) { h.gen(1, 2, 0, 6, 1) }, "", 6},
		{"rollback of uncommitted steps", func(h *hist, o *bench.SoakObservations) {
			h.gen(1, 3, 0, 5, 2) // commits 2 and 4; step 5 rolled back
			h.gen(2, 2, 4, 8, 2)
		}, "", 8},
		{"steps after the last commit do not count", func(h *hist, o *bench.SoakObservations) { h.gen(1, 2, 0, 7, 2) }, "", 6},
		{"committed steps redone", func(h *hist, o *bench.SoakObservations) {
			h.gen(1, 2, 0, 6, 2)
			h.gen(2, 2, 2, 8, 2)
		}, "committed-steps-kept", 8},
		{"a generation resumes beyond what was trained", func(h *hist, o *bench.SoakObservations) {
			h.gen(1, 2, 0, 4, 1)
			h.gen(2, 2, 6, 8, 1)
		}, "lineage-contiguous", 4},
		{"a step missing in a generation", func(h *hist, o *bench.SoakObservations) {
			h.gen(1, 2, 0, 6, 1)
			var kept []bench.SoakEvent
			for _, e := range h.ev {
				if e.Step != 3 || e.Kind != "step" {
					kept = append(kept, e)
				}
			}
			h.ev = kept
		}, "lineage-contiguous", 2},
		{"a rank's line missing", func(h *hist, o *bench.SoakObservations) {
			h.gen(1, 2, 0, 4, 1)
			var kept []bench.SoakEvent
			for _, e := range h.ev {
				if e.Kind != "step" || e.Step != 1 || e.Rank != 1 {
					kept = append(kept, e)
				}
			}
			h.ev = kept
		}, "every-rank,samples-once", 4},
		{"samples repeated", func(h *hist, o *bench.SoakObservations) {
			h.gen(1, 2, 0, 4, 1)
			for i, e := range h.ev {
				if e.Kind == "step" && e.Step == 2 {
					h.ev[i].Samples = []int32{int32(e.Rank), int32(e.Rank + 2)} // step 1's samples again
				}
			}
		}, "samples-once,samples-once", 4},
		{"epochs go back", func(h *hist, o *bench.SoakObservations) {
			h.gen(1, 1, 0, 4, 1)
			for i, e := range h.ev {
				if e.Kind == "step" && e.Step == 4 {
					h.ev[i].Epoch = 0 // step 4, of epoch 1, says 0
				}
			}
		}, "epochs-forward,samples-once", 4},
		{"stall within its fault's bound", func(h *hist, o *bench.SoakObservations) {
			h.gen(1, 2, 0, 2, 1)
			o.Faults = []bench.SoakFault{{Kind: bench.FaultWorkerKill, At: h.now}}
			h.now = h.now.Add(2 * time.Second)
			h.gen(2, 2, 2, 4, 1)
		}, "", 4},
		{"stall beyond its fault's bound", func(h *hist, o *bench.SoakObservations) {
			h.gen(1, 2, 0, 2, 1)
			o.Faults = []bench.SoakFault{{Kind: bench.FaultWorkerKill, At: h.now}}
			h.now = h.now.Add(4 * time.Second)
			h.gen(2, 2, 2, 4, 1)
		}, "stall-bounded", 4},
		{"stall with no fault", func(h *hist, o *bench.SoakObservations) {
			h.gen(1, 2, 0, 2, 1)
			h.now = h.now.Add(2 * time.Second)
			h.gen(2, 2, 2, 4, 1)
		}, "stall-bounded", 4},
		{"epoch-end padding", func(h *hist, o *bench.SoakObservations) {
			o.Padding = true
			h.gen(1, 3, 0, 4, 1) // epoch 1 is steps 3 and 4
			padStep(h, 4, 0, 1)  // its last step repeats two of step 3's samples: size - 1
		}, "", 4},
		{"padding beyond the world size - 1", func(h *hist, o *bench.SoakObservations) {
			o.Padding = true
			h.gen(1, 3, 0, 4, 1)
			padStep(h, 4, 0, 1, 2)
		}, "samples-once", 4},
		{"padding before an epoch's last step", func(h *hist, o *bench.SoakObservations) {
			o.Padding = true
			h.gen(1, 3, 0, 4, 1)
			padStep(h, 3, 1)
		}, "samples-once", 4},
		{"padding where the sampler pads nothing", func(h *hist, o *bench.SoakObservations) {
			h.gen(1, 3, 0, 4, 1)
			padStep(h, 4, 0, 1)
		}, "samples-once", 4},
		{"orphan, exit, descriptors and memory", func(h *hist, o *bench.SoakObservations) {
			h.gen(1, 2, 0, 2, 1)
			o.Orphans = []string{"pid 42 (train)"}
			o.ExitCode, o.WantExit = 1, 130
			o.Resources = []bench.SoakResources{{Role: "driver", FDsAt0: 10, FDs: 15, RSSKiBAt0: 1000, RSSKiB: 3100}, {Role: "host-2", FDsAt0: 10, FDs: 14, RSSKiBAt0: 1000, RSSKiB: 3000}}
		}, "driver-exit,fds-flat,no-orphans,rss-bounded", 2},
		{"goroutines grown, or not told", func(h *hist, o *bench.SoakObservations) {
			h.gen(1, 2, 0, 2, 1)
			o.Resources = []bench.SoakResources{
				{Role: "driver", GoroutinesAt0: 20, Goroutines: 49}, // over 2 × 20 + 8
				{Role: "host-2", GoroutinesAt0: 20, Goroutines: 48}, // within
				{Role: "host-3", GoroutinesAt0: -1, Goroutines: 5},  // no answer at the start
			}
		}, "goroutines-flat,goroutines-flat", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h hist
			o := obs()
			tc.build(&h, &o)
			c := bench.CheckSoak(h.ev, o)
			if got := invariants(c); got != tc.want {
				t.Errorf("violations %q, want %q: %+v", got, tc.want, c.Violations)
			}
			if c.Steps != tc.steps {
				t.Errorf("steps %d, want %d", c.Steps, tc.steps)
			}
		})
	}
}

// padStep adds samples to rank 0's line of step.
func padStep(h *hist, step int64, samples ...int32) {
	for i, e := range h.ev {
		if e.Kind == "step" && e.Step == step && e.Rank == 0 {
			h.ev[i].Samples = append(h.ev[i].Samples, samples...)
		}
	}
}

func TestSoakCheckCounts(t *testing.T) {
	var h hist
	h.gen(1, 3, 0, 5, 2) // commits at 2 and 4: step 5 is rolled back
	o := obs()
	o.Faults = []bench.SoakFault{{Kind: bench.FaultWorkerKill, At: h.now, Target: "pid 7"}}
	h.now = h.now.Add(1500 * time.Millisecond)
	h.gen(2, 2, 4, 8, 2)
	c := bench.CheckSoak(h.ev, o)
	if len(c.Violations) != 0 || c.StepsRolledBack != 1 || c.StepsLost != 0 || c.Epochs != 4 || c.Generations != 2 {
		t.Fatalf("%+v", c)
	}
	if c.LongestStall != 1500*time.Millisecond+2*stepTime || c.StallCause != "worker-kill pid 7" {
		t.Fatalf("longest stall %v after %q", c.LongestStall, c.StallCause)
	}
}

func TestParseSoakHistory(t *testing.T) {
	in := "start gen=2 rank=1 size=2 step=5 pid=99 t=1000\n" +
		"step gen=2 rank=1 size=2 step=6 epoch=3 t=2000 samples=4,7\n" +
		"step gen=2 rank=1 size=2 step=7 epoch=3 t=3000 samples=\n" +
		"commit gen=2 rank=1 step=7 t=4000\n" +
		"step gen=2 rank=1 size=2 step=8 epoch=3 t=5000 sam" // cut short by a SIGKILL
	ev, err := bench.ParseSoakHistory(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(ev) != 4 || ev[0].PID != 99 || ev[0].Step != 5 || ev[1].Epoch != 3 || len(ev[1].Samples) != 2 || ev[1].Samples[1] != 7 ||
		len(ev[2].Samples) != 0 || ev[3].Kind != "commit" || ev[3].Step != 7 || !ev[3].T.Equal(time.Unix(0, 4000)) {
		t.Fatalf("%+v", ev)
	}
	if _, err := bench.ParseSoakHistory(strings.NewReader("bogus line\n")); err == nil {
		t.Fatal("a bogus line parsed")
	}
}
