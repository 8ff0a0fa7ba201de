package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/bench"
	"github.com/elasticd/elasticd/internal/lan"
)

// The checker finds the bugs the trainer's hidden --mutation plants, in the history of a real
// job whose rank 1 kills itself at step 27 (commits every 5 steps: a rollback to 25), and
// finds nothing in the same job without a mutation.
func TestSoakMutations(t *testing.T) {
	for _, tc := range []struct{ mutation, want string }{
		{"", ""},
		{"skip-sampler-commit", "samples-once"},
		{"drop-commit", "committed-steps-kept"},
	} {
		t.Run("mutation="+tc.mutation, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			args := []string{"run", "-np", "3", "--min-np", "2", "--blacklist-cooldown-range", "10m,10m", "--stop-grace", "1s",
				"--", trainer, "--steps", "60", "--commit-every", "5", "--die-at-step", "27", "--die-rank", "1",
				"--dataset-size", "1024", "--batch", "64", "--log-every", "1000", "--history", dir}
			if tc.mutation != "" {
				args = append(args, "--mutation", tc.mutation)
			}
			out, err := exec.CommandContext(ctx, binary, args...).CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("the job did not end in a minute:\n%s", out)
			}
			if tc.mutation == "" && err != nil {
				t.Fatalf("%v:\n%s", err, out)
			}
			events, rerr := bench.ReadSoakHistory(dir)
			if rerr != nil {
				t.Fatal(rerr)
			}
			c := bench.CheckSoak(events, bench.SoakObservations{DatasetSize: 1024})
			got := map[string]bool{}
			for _, v := range c.Violations {
				got[v.Invariant] = true
			}
			if c.Generations < 2 {
				t.Fatalf("%d generations: rank 1 did not die and no rollback happened:\n%s", c.Generations, out)
			}
			switch {
			case tc.want == "" && len(c.Violations) > 0:
				t.Fatalf("violations without a mutation: %+v", c.Violations)
			case tc.want == "" && c.Steps != 60:
				t.Fatalf("final lineage of %d steps, want 60", c.Steps)
			case tc.want != "" && !got[tc.want]:
				t.Fatalf("--mutation %s: violations %+v, want %s", tc.mutation, c.Violations, tc.want)
			}
			t.Logf("%d steps, %d generations, %d rolled back, %d lost, %d duplicates, %d missing; violations %v", c.Steps, c.Generations, c.StepsRolledBack, c.StepsLost, c.DuplicateSamples, c.MissingSamples, c.Violations)
		})
	}
}

// A soak of a fixed seed: every fault kind that fits in the time, no violation.
func TestSoakEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("a 70 s soak")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out, stderr bytes.Buffer
	r, err := bench.Soak(ctx, bench.SoakOptions{Exe: binary, Trainer: trainer, Seed: 1, Duration: 70 * time.Second, Hosts: 3, Slots: 2,
		CommTimeout: 2 * time.Second, JSON: true, Out: &out, Err: &stderr, LogDir: t.TempDir()})
	if err != nil && !errors.Is(err, bench.ErrSoakViolation) {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	var j map[string]any
	if jerr := json.Unmarshal(out.Bytes(), &j); jerr != nil {
		t.Fatalf("%q: %v", out.String(), jerr)
	}
	for _, k := range []string{"seed", "faults", "steps", "steps_lost", "duplicate_samples", "longest_stall_s", "orphans", "resources"} {
		if _, ok := j[k]; !ok {
			t.Errorf("no %q in the JSON", k)
		}
	}
	t.Logf("%s", strings.TrimSpace(out.String()))
	if len(r.Violations) > 0 {
		t.Errorf("violations: %+v", r.Violations)
	}
	if len(r.Faults) < 6 {
		t.Errorf("%d fault kinds applied (%v), want at least 6", len(r.Faults), r.Faults)
	}
	if r.Steps < 500 || r.Epochs < 2 {
		t.Errorf("%d steps, %d epochs: the job hardly trained", r.Steps, r.Epochs)
	}
}

// A soak interrupted before its duration (Ctrl-C) ends the job, checks the history so far,
// and says it was interrupted: no invariant is taken as broken for the waits the interrupt
// cut short, and nothing is left running.
func TestSoakInterrupted(t *testing.T) {
	if testing.Short() {
		t.Skip("a 15 s soak")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(15*time.Second, cancel)
	var out, stderr bytes.Buffer
	r, err := bench.Soak(ctx, bench.SoakOptions{Exe: binary, Trainer: trainer, Seed: 3, Duration: 5 * time.Minute, Hosts: 3, Slots: 1,
		CommTimeout: 2 * time.Second, Out: &out, Err: &stderr})
	if !errors.Is(err, bench.ErrSoakInterrupted) {
		t.Fatalf("err %v, want ErrSoakInterrupted:\n%s\n%s", err, out.String(), stderr.String())
	}
	if !r.Interrupted || len(r.Violations) > 0 || len(r.Orphans) > 0 || r.DurationS > 60 {
		t.Fatalf("interrupted %v, violations %v, orphans %v, %.0f s:\n%s", r.Interrupted, r.Violations, r.Orphans, r.DurationS, out.String())
	}
	if !strings.Contains(out.String(), "interrupted before its duration") {
		t.Errorf("the summary does not say the soak was interrupted:\n%s", out.String())
	}
}

// The network faults, on hosts in network namespaces: cut off from their peers (both ways
// and one way), from the driver, and throttled. Every invariant must hold; nothing may be
// left in the namespaces, which are gone at the end. Skips where namespaces cannot be made.
func TestSoakNetworkFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("a 40 s soak")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out, stderr bytes.Buffer
	r, err := bench.Soak(ctx, bench.SoakOptions{Exe: binary, Trainer: trainer, Seed: 5, Duration: 40 * time.Second, Hosts: 3, Slots: 2,
		CommTimeout: 2 * time.Second, Netns: true, Faults: bench.SoakNetFaultKinds, Out: &out, Err: &stderr})
	if errors.Is(err, lan.ErrUnavailable) {
		t.Skip(err)
	}
	t.Logf("%s", out.String())
	if err != nil {
		t.Fatalf("%v:\n%s", err, stderr.String())
	}
	if len(r.Faults) < 3 || r.Steps < 300 {
		t.Errorf("%d network fault kinds applied (%v), %d steps: want at least 3 kinds and a job that trained", len(r.Faults), r.Faults, r.Steps)
	}
	left, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(left), fmt.Sprintf("edsoak-%d", os.Getpid())) {
		t.Errorf("namespaces left behind:\n%s", left)
	}
}
