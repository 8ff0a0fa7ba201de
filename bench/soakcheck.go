package bench

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SoakEvent is one line of the demo trainer's --history: a generation's start on a rank
// (Kind "start": Step is the step it resumed at, committed by the Sync), a step a rank trains
// (Kind "step": Step is that step's number, from 1, with its epoch and this rank's samples),
// or a commit (Kind "commit": the state after Step is saved).
type SoakEvent struct {
	Kind    string
	Gen     uint64
	Rank    int
	Size    int
	Step    int64
	Epoch   int
	PID     int
	T       time.Time
	Samples []int32
}

// SoakFault is one fault the soak's nemesis applied.
type SoakFault struct {
	Kind   string    `json:"kind"`
	At     time.Time `json:"at"`
	Target string    `json:"target"`
}

// SoakResources are a driver's or an agent's resident memory (KiB), open descriptors and
// goroutines (as it logs them on SIGUSR1; -1: it did not answer), at the soak's start and at
// its end (the process then may be a later one of the same role, started again after a fault).
type SoakResources struct {
	Role          string `json:"role"`
	RSSKiBAt0     int64  `json:"rss_kib_start"`
	RSSKiB        int64  `json:"rss_kib_end"`
	FDsAt0        int    `json:"fds_start"`
	FDs           int    `json:"fds_end"`
	GoroutinesAt0 int    `json:"goroutines_start"`
	Goroutines    int    `json:"goroutines_end"`
}

// SoakObservations are what the harness saw besides the history.
type SoakObservations struct {
	DatasetSize int // the trainer's --dataset-size
	// Padding: the sampler pads an epoch's last step so that every rank takes a share (as
	// torch's DistributedSampler and elasticd.torch's ElasticSampler): that step may repeat
	// up to its world size - 1 samples trained before in the epoch.
	Padding   bool
	Faults    []SoakFault              // in time order
	Bounds    map[string]time.Duration // the longest stall each fault kind may cause; "" when no fault came before
	Orphans   []string                 // processes of the run still alive at its end
	Resources []SoakResources
	ExitCode  int // the driver's exit status at the end
	WantExit  int // what it should be
	// FDSlack, RSSGrowth and GoroutineSlack bound the resource growth: end ≤ start + FDSlack
	// descriptors, end RSS ≤ 2 × start + RSSGrowth KiB, end goroutines ≤ 2 × start +
	// GoroutineSlack (long polls in flight come and go; a leak per fault does not).
	FDSlack        int
	RSSGrowth      int64
	GoroutineSlack int
	// Extra are violations the harness found itself (a SIGSTOPped worker not killed in time).
	Extra []SoakViolation
}

// SoakViolation is one broken invariant.
type SoakViolation struct {
	Invariant string `json:"invariant"`
	Detail    string `json:"detail"`
}

// SoakCheck is what CheckSoak found.
type SoakCheck struct {
	Steps            int64           // the final lineage: steps 1..Steps, up to its last commit
	Epochs           int             // epochs begun in the final lineage
	StepsLost        int64           // committed steps trained again
	StepsRolledBack  int64           // uncommitted steps trained again (a rollback after a failure: allowed)
	Generations      int             // generations with a history
	DuplicateSamples int             // samples trained more than once in an epoch of the final lineage
	PaddedSamples    int             // repeats allowed as an epoch's last step's padding (with Padding)
	MissingSamples   int             // samples of a finished epoch of the final lineage never trained
	LongestStall     time.Duration   // the longest time between consecutive steps of the final lineage
	StallCause       string          // the fault before it ("none")
	Violations       []SoakViolation // empty: every invariant holds
}

// ReadSoakHistory reads every file of the history directory (the trainer's --history).
func ReadSoakHistory(dir string) ([]SoakEvent, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		return nil, err
	}
	var all []SoakEvent
	for _, f := range files {
		r, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		ev, err := ParseSoakHistory(r)
		r.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		all = append(all, ev...)
	}
	return all, nil
}

// ParseSoakHistory parses history lines. A last line cut short (a rank killed while
// writing it) is skipped.
func ParseSoakHistory(r io.Reader) ([]SoakEvent, error) {
	var out []SoakEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<26)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		kind, rest, _ := strings.Cut(line, " ")
		if kind != "start" && kind != "step" && kind != "commit" {
			return nil, fmt.Errorf("line %d: unknown kind %q", n, kind)
		}
		e := SoakEvent{Kind: kind}
		complete := false
		for _, f := range strings.Fields(rest) {
			k, v, _ := strings.Cut(f, "=")
			var err error
			switch k {
			case "gen":
				e.Gen, err = strconv.ParseUint(v, 10, 64)
			case "rank":
				e.Rank, err = strconv.Atoi(v)
			case "size":
				e.Size, err = strconv.Atoi(v)
			case "step":
				e.Step, err = strconv.ParseInt(v, 10, 64)
			case "epoch":
				e.Epoch, err = strconv.Atoi(v)
			case "pid":
				e.PID, err = strconv.Atoi(v)
			case "t":
				var ns int64
				ns, err = strconv.ParseInt(v, 10, 64)
				e.T = time.Unix(0, ns)
				complete = kind != "step"
			case "samples":
				complete = true
				if v == "" {
					break
				}
				for _, s := range strings.Split(v, ",") {
					i, perr := strconv.ParseInt(s, 10, 32)
					if perr != nil {
						err = perr
						break
					}
					e.Samples = append(e.Samples, int32(i))
				}
			}
			if err != nil {
				return nil, fmt.Errorf("line %d: %s: %w", n, k, err)
			}
		}
		if !complete {
			continue
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// stepRec is one step of a generation: what its ranks logged.
type stepRec struct {
	gen     uint64
	size    int
	epoch   int
	t       time.Time // the first rank's start of the step
	samples map[int][]int32
}

// CheckSoak checks the invariants of a soak over the history of every rank and what the
// harness observed. It is a pure function of its arguments.
//
// The final lineage is rebuilt by generation, in order: each generation resumes at a step
// (its Sync's commit), which cuts the lineage there, then appends the steps it trained. The
// lineage ends at the last commit within it. The invariants:
//
//   - every step of the final lineage exists once, from 1 up, each with every rank's samples;
//   - no generation resumes before a step an earlier one committed (steps lost), nor after
//     the last step trained;
//   - every sample is trained at most once per epoch, and exactly once in each finished epoch
//     (the sampler pads nothing: the last step of an epoch takes what is left), and epochs
//     never go back;
//   - no time between consecutive steps of the final lineage is longer than the bound of the
//     faults applied in it or in the 20 s before it (the largest), or Bounds[""] without any;
//   - no orphan, the driver's exit status as wanted, descriptors and RSS within bounds.
func CheckSoak(events []SoakEvent, o SoakObservations) SoakCheck {
	var c SoakCheck
	bad := func(inv, format string, a ...any) {
		c.Violations = append(c.Violations, SoakViolation{inv, fmt.Sprintf(format, a...)})
	}
	c.Violations = append(c.Violations, o.Extra...)

	type genRec struct {
		resume  int64 // -1: no start line
		steps   map[int64]*stepRec
		commits []int64
		maxStep int64
	}
	gens := map[uint64]*genRec{}
	get := func(g uint64) *genRec {
		if gens[g] == nil {
			gens[g] = &genRec{resume: -1, steps: map[int64]*stepRec{}}
		}
		return gens[g]
	}
	for _, e := range events {
		g := get(e.Gen)
		switch e.Kind {
		case "start":
			if g.resume >= 0 && g.resume != e.Step {
				bad("one-resume", "generation %d: ranks resumed at steps %d and %d", e.Gen, g.resume, e.Step)
			}
			g.resume = e.Step
			g.commits = append(g.commits, e.Step)
		case "commit":
			g.commits = append(g.commits, e.Step)
		case "step":
			s := g.steps[e.Step]
			if s == nil {
				s = &stepRec{gen: e.Gen, size: e.Size, epoch: e.Epoch, t: e.T, samples: map[int][]int32{}}
				g.steps[e.Step] = s
			}
			if s.size != e.Size || s.epoch != e.Epoch {
				bad("ranks-agree", "generation %d step %d: ranks disagree on the world size (%d, %d) or epoch (%d, %d)", e.Gen, e.Step, s.size, e.Size, s.epoch, e.Epoch)
			}
			if _, dup := s.samples[e.Rank]; dup {
				bad("step-once", "generation %d: rank %d trained step %d twice", e.Gen, e.Rank, e.Step)
			}
			s.samples[e.Rank] = e.Samples
			if e.T.Before(s.t) {
				s.t = e.T
			}
			g.maxStep = max(g.maxStep, e.Step)
		}
	}
	order := make([]uint64, 0, len(gens))
	for g := range gens {
		order = append(order, g)
	}
	slices.Sort(order)
	c.Generations = len(order)

	var lineage []*stepRec // lineage[i] is step i+1
	var committed int64    // the highest step committed so far
	var committedGen uint64
	for _, gn := range order {
		g := gens[gn]
		resume := g.resume
		if resume < 0 { // no rank's start line: resumed just before its first step
			resume = g.maxStep
			for s := range g.steps {
				resume = min(resume, s-1)
			}
		}
		if resume < committed {
			c.StepsLost += committed - resume
			bad("committed-steps-kept", "generation %d resumed at step %d, but step %d was committed (generation %d): %d committed steps trained again", gn, resume, committed, committedGen, committed-resume)
			committed = resume // the lineage is cut here: count those steps once
		}
		if resume > int64(len(lineage)) {
			bad("lineage-contiguous", "generation %d resumed at step %d, but only %d steps were trained before it", gn, resume, len(lineage))
			continue // its steps cannot join the lineage
		}
		if redone := int64(len(lineage)) - resume; redone > 0 {
			c.StepsRolledBack += redone - max(0, committed-resume)
		}
		lineage = lineage[:resume]
		for s := resume + 1; s <= g.maxStep; s++ {
			rec := g.steps[s]
			if rec == nil {
				bad("lineage-contiguous", "generation %d trained steps up to %d but has no line of step %d", gn, g.maxStep, s)
				break
			}
			lineage = append(lineage, rec)
		}
		complained := false
		for _, cm := range g.commits {
			if cm > int64(len(lineage)) {
				if !complained && int64(len(lineage)) == g.maxStep {
					bad("lineage-contiguous", "generation %d committed step %d, beyond the %d steps it holds", gn, cm, len(lineage))
				}
				complained = true
				continue
			}
			if cm > committed {
				committed, committedGen = cm, gn
			}
		}
	}
	if committed < int64(len(lineage)) {
		lineage = lineage[:committed]
	}
	c.Steps = int64(len(lineage))

	// Samples: every rank of every step, once per epoch.
	epochs := map[int]map[int32]int{}
	lastOf := map[int]int{} // epoch → index in the lineage of its last step
	for i, s := range lineage {
		lastOf[s.epoch] = i
	}
	lastEpoch, wentBack := -1, false
	for i, s := range lineage {
		step := i + 1
		if s.epoch < lastEpoch && !wentBack {
			wentBack = true
			bad("epochs-forward", "step %d (generation %d) is in epoch %d, after a step in epoch %d", step, s.gen, s.epoch, lastEpoch)
		}
		lastEpoch = max(lastEpoch, s.epoch)
		for r := range s.size {
			if _, ok := s.samples[r]; !ok {
				bad("every-rank", "step %d (generation %d, world %d) has no line from rank %d", step, s.gen, s.size, r)
			}
		}
		seen := epochs[s.epoch]
		if seen == nil {
			seen = map[int32]int{}
			epochs[s.epoch] = seen
		}
		pad := 0
		if o.Padding && lastOf[s.epoch] == i {
			pad = s.size - 1
		}
		for _, r := range slices.Sorted(maps.Keys(s.samples)) {
			for _, x := range s.samples[r] {
				if x < 0 || (o.DatasetSize > 0 && int(x) >= o.DatasetSize) {
					bad("samples-in-range", "step %d: sample %d outside [0, %d)", step, x, o.DatasetSize)
				}
				if seen[x]++; seen[x] > 1 {
					if pad > 0 {
						pad--
						c.PaddedSamples++
						continue
					}
					c.DuplicateSamples++
				}
			}
		}
	}
	c.Epochs = len(epochs)
	for e, seen := range epochs {
		if e < lastEpoch && o.DatasetSize > 0 && len(seen) < o.DatasetSize {
			c.MissingSamples += o.DatasetSize - len(seen)
			bad("samples-once", "epoch %d ended with %d of its %d samples never trained", e, o.DatasetSize-len(seen), o.DatasetSize)
		}
	}
	if c.DuplicateSamples > 0 {
		bad("samples-once", "%d samples trained more than once in their epoch", c.DuplicateSamples)
	}

	// Stalls.
	faults := slices.SortedFunc(slices.Values(o.Faults), func(a, b SoakFault) int { return a.At.Compare(b.At) })
	c.StallCause = "none"
	for i := 1; i < len(lineage); i++ {
		from, to := lineage[i-1].t, lineage[i].t
		gap := to.Sub(from)
		bound, cause := o.Bounds[""], "none"
		for _, f := range faults {
			if f.At.After(to) {
				break
			}
			if f.At.Before(from.Add(-stallLookback)) {
				continue
			}
			cause = f.Kind + " " + f.Target
			bound = max(bound, o.Bounds[f.Kind])
		}
		if gap > c.LongestStall {
			c.LongestStall, c.StallCause = gap, cause
		}
		if bound > 0 && gap > bound {
			bad("stall-bounded", "%v between steps %d and %d, over the bound of %v (cause: %s)", gap.Round(time.Millisecond), i, i+1, bound, cause)
		}
	}

	for _, p := range o.Orphans {
		bad("no-orphans", "%s still alive at the end", p)
	}
	if o.ExitCode != o.WantExit {
		bad("driver-exit", "the driver exited %d, want %d", o.ExitCode, o.WantExit)
	}
	for _, r := range o.Resources {
		if r.FDs > r.FDsAt0+o.FDSlack {
			bad("fds-flat", "%s: %d open descriptors at the end, %d at the start (slack %d)", r.Role, r.FDs, r.FDsAt0, o.FDSlack)
		}
		if r.RSSKiB > 2*r.RSSKiBAt0+o.RSSGrowth {
			bad("rss-bounded", "%s: RSS %d KiB at the end, %d KiB at the start (bound 2× + %d KiB)", r.Role, r.RSSKiB, r.RSSKiBAt0, o.RSSGrowth)
		}
		switch {
		case r.GoroutinesAt0 < 0 || r.Goroutines < 0:
			bad("goroutines-flat", "%s: did not tell its goroutines (SIGUSR1) at the start or the end", r.Role)
		case r.Goroutines > 2*r.GoroutinesAt0+o.GoroutineSlack:
			bad("goroutines-flat", "%s: %d goroutines at the end, %d at the start (bound 2× + %d)", r.Role, r.Goroutines, r.GoroutinesAt0, o.GoroutineSlack)
		}
	}
	slices.SortStableFunc(c.Violations, func(a, b SoakViolation) int { return cmp.Compare(a.Invariant, b.Invariant) })
	return c
}

// stallLookback is how long before a stall a fault still counts as its possible cause (a
// slot killed rejoins after its cooldown, a host back after its absence: a reset each).
const stallLookback = 20 * time.Second
