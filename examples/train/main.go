// Command train is the demo trainer: data-parallel softmax regression on a generated data set
// with a known answer, run under `elasticd run`. Each rank computes the gradient of its share
// of every global batch; gradients are averaged with allreduce; the model and the step are
// the elastic state, so the job survives workers dying and joining.
//
//	elasticd run -np 4 --min-np 2 -- ./train --steps 600
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/elasticd/elasticd/allreduce"
	"github.com/elasticd/elasticd/worker"
)

const (
	features = 16
	classes  = 4
)

type options struct {
	steps, batch, logEvery, dieAtStep, dieRank, commitEvery int
	lr                                                      float64
	stepDelay                                               time.Duration
	seed                                                    uint64
	events                                                  bool
	datasetSize                                             int
	history                                                 string // --history DIR: per-step sample log for elasticd bench soak
	stopFile                                                string // --stop-file FILE: the job ends at the first commit after FILE appears
	mutation                                                string // --mutation: a bug planted on purpose, for the soak's checker tests
}

func main() {
	var o options
	flag.IntVar(&o.steps, "steps", 600, "global steps to train")
	flag.IntVar(&o.batch, "batch", 512, "global batch size (split across the ranks)")
	flag.Float64Var(&o.lr, "lr", 0.5, "learning rate")
	flag.IntVar(&o.logEvery, "log-every", 50, "rank 0 prints progress every this many steps")
	flag.DurationVar(&o.stepDelay, "step-delay", 0, "sleep per step, to watch a demo at human speed")
	flag.IntVar(&o.dieAtStep, "die-at-step", 0, "demo: the worker with rank --die-rank in the first generation kills itself with SIGKILL at this step")
	flag.IntVar(&o.commitEvery, "commit-every", 1, "commit the state every this many steps (a failure rolls back the steps since the last commit)")
	flag.IntVar(&o.dieRank, "die-rank", 1, "demo: which rank dies (see --die-at-step)")
	flag.Uint64Var(&o.seed, "seed", 1, "data set seed")
	flag.IntVar(&o.datasetSize, "dataset-size", 50000, "training samples generated; each epoch visits every one exactly once, across resets")
	flag.BoolVar(&o.events, "events", false, "rank 0 prints a timestamped line per step (for elasticd bench recovery)")
	flag.StringVar(&o.history, "history", "", "every rank appends, to DIR/pid-PID.log, a line per generation start, per step (the samples it trains) and per commit (for elasticd bench soak)")
	flag.StringVar(&o.stopFile, "stop-file", "", "training ends, with exit 0, at the first commit at which any rank sees `FILE` exist (the ranks agree on it in one small allreduce per commit; for elasticd bench soak)")
	flag.StringVar(&o.mutation, "mutation", "", "") // hidden: skip-sampler-commit or drop-commit, bugs for the soak's checker to find
	flag.Parse()
	if o.commitEvery < 1 {
		fmt.Fprintf(os.Stderr, "train: --commit-every %d: must be at least 1\n", o.commitEvery)
		os.Exit(2)
	}
	switch o.mutation {
	case "", mutSkipSamplerCommit, mutDropCommit:
	default:
		fmt.Fprintf(os.Stderr, "train: --mutation %q: want %s or %s\n", o.mutation, mutSkipSamplerCommit, mutDropCommit)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	w, err := worker.Init(ctx, log)
	if errors.Is(err, worker.ErrRemoved) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "train:", err)
		os.Exit(1)
	}
	err = train(ctx, w, o)
	w.Close(context.Background(), err)
	switch {
	case errors.Is(err, worker.ErrRemoved):
		fmt.Println("removed from the job; exiting")
	case err != nil:
		fmt.Fprintln(os.Stderr, "train:", err)
		os.Exit(1)
	}
}

// dataset is a deterministic classification problem: labels come from a hidden linear model,
// so a perfect softmax regression exists and accuracy says how close training got.
type dataset struct {
	x      []float32 // n × features
	y      []int
	n      int
	hidden []float32 // classes × features
}

// makeData draws n samples (with sampleSeed) labelled by the hidden model of seed.
func makeData(seed, sampleSeed uint64, n int) *dataset {
	d := &dataset{x: make([]float32, n*features), y: make([]int, n), n: n, hidden: make([]float32, classes*features)}
	model := rand.New(rand.NewPCG(seed, 42))
	for i := range d.hidden {
		d.hidden[i] = float32(model.NormFloat64())
	}
	rng := rand.New(rand.NewPCG(seed, sampleSeed))
	for i := range n {
		row := d.x[i*features : (i+1)*features]
		for j := range row {
			row[j] = float32(rng.NormFloat64())
		}
		best, bestV := 0, float32(math.Inf(-1))
		for c := range classes {
			v := dot(d.hidden[c*features:(c+1)*features], row)
			if v > bestV {
				best, bestV = c, v
			}
		}
		d.y[i] = best
	}
	return d
}

func dot(a, b []float32) float32 {
	var s float32
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

func train(ctx context.Context, w *worker.Worker, o options) error {
	data := makeData(o.seed, 1, o.datasetSize)
	test := makeData(o.seed, 2, 5000) // same hidden model, unseen samples
	// Model: weights (classes×features) then biases (classes). Identical on every rank.
	model := make([]float32, classes*features+classes)
	var step int64
	// The sampler picks each step's global batch from a per-epoch permutation and splits it
	// over the ranks; its progress is committed with the model, so every sample is trained on
	// exactly once per epoch however the world changes.
	sampler, err := worker.NewSampler(o.datasetSize, o.seed, o.batch)
	if err != nil {
		return fmt.Errorf("--dataset-size %d, --batch %d: %w", o.datasetSize, o.batch, err)
	}
	hist, err := openHistory(o.history)
	if err != nil {
		return err
	}
	defer hist.close()
	st := worker.NewState(w)
	st.CommitEvery = o.commitEvery
	if o.mutation == mutDropCommit {
		st.CommitEvery = 2 * o.commitEvery // every other commit is dropped, yet reported below
	}
	st.TotalSteps = uint64(o.steps) // the live page's "step X of N" and time to go
	if err := st.Register("model", model); err != nil {
		return err
	}
	if err := st.Register("step", &step); err != nil {
		return err
	}
	var samplerState any = sampler
	if o.mutation == mutSkipSamplerCommit {
		samplerState = &staleSampler{Sampler: sampler}
	}
	if err := st.Register("sampler", samplerState); err != nil {
		return err
	}
	firstGen := w.Generation()
	grad := make([]float32, len(model)+2) // gradient, then loss sum and sample count
	lastLog, lastStep := time.Now(), int64(0)

	return worker.Run(ctx, w, st, func(ctx context.Context) error {
		comm := w.Comm()
		if w.Rank() == 0 {
			fmt.Printf("generation %d: world size %d, resuming at step %d\n", w.Generation(), w.Size(), step)
		}
		hist.start(w, step) // Sync, just done, ends in a commit of this step
		sinceSync := 0      // State.Step's count: it commits every CommitEvery steps from the Sync
		for step < int64(o.steps) {
			if o.dieAtStep > 0 && step == int64(o.dieAtStep) && w.Generation() == firstGen && w.Rank() == o.dieRank {
				fmt.Printf("demo: rank %d kills itself with SIGKILL at step %d\n", w.Rank(), step)
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
			clear(grad)
			// This rank's share of the step's global batch. The history has it before the
			// sampler's Record: a step that any rank completes is logged by every rank.
			idx := sampler.Next(comm)
			hist.step(w, step+1, sampler.Epoch(), idx)
			for _, i := range idx {
				addGradient(grad, model, data.x[i*features:(i+1)*features], data.y[i])
			}
			if err := comm.Allreduce(ctx, grad, allreduce.Sum); err != nil {
				return err
			}
			count := grad[len(grad)-1]
			st.SetLoss(float64(grad[len(grad)-2] / count)) // the mean loss of the global batch, for the live page
			for j := range model {
				model[j] -= float32(o.lr) * grad[j] / count
			}
			if err := sampler.Record(ctx, comm); err != nil {
				return err
			}
			step++
			if o.events && w.Rank() == 0 {
				fmt.Printf("event step=%d world=%d gen=%d t=%d\n", step, w.Size(), w.Generation(), time.Now().UnixNano())
			}
			if w.Rank() == 0 && (step%int64(o.logEvery) == 0 || step == int64(o.steps)) {
				rate := float64(step-lastStep) * float64(o.batch) / time.Since(lastLog).Seconds()
				fmt.Printf("step %4d  world %d  loss %.4f  %8.0f samples/s\n", step, w.Size(), grad[len(grad)-2]/count, rate)
				lastLog, lastStep = time.Now(), step
			}
			if o.stepDelay > 0 {
				time.Sleep(o.stepDelay)
			}
			err := st.Step(ctx)
			// Step saves before it checks the hosts: its commit stands even when that fails.
			committed := false
			if sinceSync++; o.commitEvery <= 1 || sinceSync%o.commitEvery == 0 {
				hist.commit(w, step)
				committed = true
			}
			if err != nil {
				return err
			}
			if committed && o.stopFile != "" {
				if stop, err := stopAgreed(ctx, comm, o.stopFile); err != nil {
					return err
				} else if stop {
					break
				}
			}
		}
		if w.Rank() == 0 {
			fmt.Printf("done: %d steps, test accuracy %.2f%%\n", step, 100*accuracy(model, test))
		}
		return nil
	})
}

// stopAgreed reports whether any rank sees file exist: every rank gives its own flag to an
// allreduce(max), so all stop at the same commit.
func stopAgreed(ctx context.Context, comm *allreduce.Comm, file string) (bool, error) {
	flag := []int64{0}
	if _, err := os.Stat(file); err == nil {
		flag[0] = 1
	}
	if err := comm.Allreduce(ctx, flag, allreduce.Max); err != nil {
		return false, err
	}
	return flag[0] > 0, nil
}

// addGradient adds the softmax cross-entropy gradient of one sample, its loss and a count of 1.
func addGradient(grad, model, x []float32, y int) {
	var logits [classes]float64
	maxL := math.Inf(-1)
	for c := range classes {
		logits[c] = float64(dot(model[c*features:(c+1)*features], x) + model[classes*features+c])
		maxL = max(maxL, logits[c])
	}
	var sum float64
	for c := range classes {
		logits[c] = math.Exp(logits[c] - maxL)
		sum += logits[c]
	}
	for c := range classes {
		p := logits[c] / sum
		g := p
		if c == y {
			g -= 1
		}
		row := grad[c*features : (c+1)*features]
		for j := range row {
			row[j] += float32(g) * x[j]
		}
		grad[classes*features+c] += float32(g)
	}
	grad[len(grad)-2] += float32(-math.Log(max(logits[y]/sum, 1e-12)))
	grad[len(grad)-1]++
}

func accuracy(model []float32, d *dataset) float64 {
	right := 0
	for i := range d.n {
		x := d.x[i*features : (i+1)*features]
		best, bestV := 0, float32(math.Inf(-1))
		for c := range classes {
			v := dot(model[c*features:(c+1)*features], x) + model[classes*features+c]
			if v > bestV {
				best, bestV = c, v
			}
		}
		if best == d.y[i] {
			right++
		}
	}
	return float64(right) / float64(d.n)
}
