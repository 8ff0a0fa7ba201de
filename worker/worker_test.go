package worker_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/allreduce"
	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/worker"
)

// job is a rendezvous server played by the test, as the driver would.
type job struct {
	t      *testing.T
	srv    *rendezvous.Server
	url    string
	secret []byte
}

func newJob(t *testing.T) *job {
	t.Helper()
	secret := []byte("0123456789abcdef0123456789abcdef")
	srv, err := rendezvous.NewServer(rendezvous.ServerConfig{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { srv.Close(); hs.Close() })
	return &job{t: t, srv: srv, url: hs.URL, secret: secret}
}

func id(i int) protocol.WorkerID { return protocol.WorkerID{Host: fmt.Sprintf("h%d", i), Slot: 0} }

// publish makes generation gen with the given workers in rank order.
func (j *job) publish(gen uint64, ids ...protocol.WorkerID) {
	plan := map[protocol.WorkerID]protocol.Assignment{}
	for r, w := range ids {
		plan[w] = protocol.Assignment{Generation: gen, Rank: r, Size: len(ids), LocalRank: r, LocalSize: len(ids)}
	}
	j.srv.Publish(gen, plan)
}

// start joins n workers to generation 1 concurrently.
func (j *job) start(n int) []*worker.Worker {
	j.t.Helper()
	return j.startWith(n, 0)
}

// startWith is start with workers that report their step time every loadEvery (0: the default).
func (j *job) startWith(n int, loadEvery time.Duration) []*worker.Worker {
	j.t.Helper()
	var ids []protocol.WorkerID
	for i := range n {
		ids = append(ids, id(i))
	}
	j.publish(1, ids...)
	ws := make([]*worker.Worker, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range n {
		wg.Go(func() {
			ws[i], errs[i] = worker.New(ctx, worker.Config{
				Rendezvous: j.url, Secret: j.secret, ID: ids[i], Generation: 1,
				HostAddr: "127.0.0.1", CommTimeout: 10 * time.Second, LoadEvery: loadEvery,
			}, nil)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			j.t.Fatalf("worker %d: %v", i, err)
		}
	}
	j.t.Cleanup(func() {
		for _, w := range ws {
			w.Close(context.Background(), nil)
		}
	})
	return ws
}

// each runs fn on every worker concurrently and fails the test on any error.
func each(t *testing.T, ws []*worker.Worker, fn func(i int, w *worker.Worker) error) {
	t.Helper()
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() { errs[i] = fn(i, w) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("worker %d: %v", i, err)
		}
	}
}

func TestConfigFromEnvNamesWhatIsMissing(t *testing.T) {
	t.Setenv(protocol.EnvRendezvous, "")
	if _, err := worker.ConfigFromEnv(); err == nil || !errorsContain(err, protocol.EnvRendezvous, "elasticd run") {
		t.Fatalf("ConfigFromEnv: %v", err)
	}
	t.Setenv(protocol.EnvRendezvous, "http://127.0.0.1:1")
	t.Setenv(protocol.EnvSecret, "zz")
	t.Setenv(protocol.EnvWorkerID, "h/0")
	t.Setenv(protocol.EnvGeneration, "1")
	t.Setenv(protocol.EnvHostAddr, "127.0.0.1")
	if _, err := worker.ConfigFromEnv(); err == nil || !errorsContain(err, protocol.EnvSecret, "hex") {
		t.Fatalf("ConfigFromEnv: %v", err)
	}
	t.Setenv(protocol.EnvSecret, "abcd")
	t.Setenv(protocol.EnvGeneration, "0")
	if _, err := worker.ConfigFromEnv(); err == nil || !errorsContain(err, protocol.EnvGeneration) {
		t.Fatalf("ConfigFromEnv: %v", err)
	}
	t.Setenv(protocol.EnvGeneration, "3")
	cfg, err := worker.ConfigFromEnv()
	if err != nil || cfg.Generation != 3 || cfg.ID != (protocol.WorkerID{Host: "h", Slot: 0}) || string(cfg.Secret) != "\xab\xcd" {
		t.Fatalf("ConfigFromEnv: %+v, %v", cfg, err)
	}
	t.Setenv(protocol.EnvCommTransport, "shm")
	if _, err := worker.ConfigFromEnv(); err == nil || !errorsContain(err, protocol.EnvCommTransport, `"shm"`, "auto", "tcp") {
		t.Fatalf("ConfigFromEnv with a bad transport: %v", err)
	}
	t.Setenv(protocol.EnvCommTransport, "tcp")
	if cfg, err := worker.ConfigFromEnv(); err != nil || cfg.CommTransport != "tcp" {
		t.Fatalf("ConfigFromEnv: %+v, %v; want CommTransport tcp", cfg, err)
	}
	if cfg, err := worker.ConfigFromEnv(); err != nil || cfg.LoadEvery != 0 {
		t.Fatalf("ConfigFromEnv: %+v, %v; want LoadEvery 0 (the default) without %s", cfg, err, protocol.EnvLoadEvery)
	}
	for v, want := range map[string]time.Duration{"0s": -1, "0": -1, "2s": 2 * time.Second} {
		t.Setenv(protocol.EnvLoadEvery, v)
		if cfg, err := worker.ConfigFromEnv(); err != nil || cfg.LoadEvery != want {
			t.Fatalf("ConfigFromEnv with %s=%s: %+v, %v; want LoadEvery %v", protocol.EnvLoadEvery, v, cfg, err, want)
		}
	}
	for _, v := range []string{"-1s", "often"} {
		t.Setenv(protocol.EnvLoadEvery, v)
		if _, err := worker.ConfigFromEnv(); err == nil || !errorsContain(err, protocol.EnvLoadEvery, strconv.Quote(v), "0s for no reports") {
			t.Fatalf("ConfigFromEnv with %s=%s: %v", protocol.EnvLoadEvery, v, err)
		}
	}
}

func errorsContain(err error, subs ...string) bool {
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			return false
		}
	}
	return true
}

// Sync makes every rank equal to rank 0; Restore goes back to the last commit.
func TestStateSyncCommitRestore(t *testing.T) {
	ws := newJob(t).start(3)
	models := make([][]float32, 3)
	steps := make([]int64, 3)
	states := make([]*worker.State, 3)
	for i, w := range ws {
		models[i] = []float32{float32(w.Rank()), 1, 2}
		steps[i] = int64(10 * w.Rank())
		states[i] = worker.NewState(w)
		if err := states[i].Register("model", models[i]); err != nil {
			t.Fatal(err)
		}
		if err := states[i].Register("step", &steps[i]); err != nil {
			t.Fatal(err)
		}
		if err := states[i].Register("model", models[i]); err == nil {
			t.Fatal("a name registered twice was accepted")
		}
		if err := states[i].Register("bad", 3); err == nil {
			t.Fatal("a non-pointer value was accepted")
		}
	}
	each(t, ws, func(i int, w *worker.Worker) error { return states[i].Sync(t.Context()) })
	for i := range ws {
		if !slices.Equal(models[i], []float32{0, 1, 2}) || steps[i] != 0 {
			t.Fatalf("worker %d after Sync: %v step %d, want rank 0's", i, models[i], steps[i])
		}
	}
	each(t, ws, func(i int, w *worker.Worker) error {
		models[i][0], steps[i] = 5, 7
		if err := states[i].Commit(t.Context()); err != nil {
			return err
		}
		models[i][0], steps[i] = 9, 9
		return states[i].Restore()
	})
	for i := range ws {
		if models[i][0] != 5 || steps[i] != 7 {
			t.Fatalf("worker %d after Restore: %v step %d, want the commit (5, 7)", i, models[i], steps[i])
		}
	}
}

// When the hosts change, every rank returns ErrHostsUpdated at the same step.
func TestHostsUpdatedAtTheSameStep(t *testing.T) {
	j := newJob(t)
	ws := j.start(3)
	stepAt := make([]int, 3)
	go func() {
		time.Sleep(100 * time.Millisecond) // let the ranks step a while (the scenario, not a sync)
		j.srv.NotifyHostsUpdated()
	}()
	each(t, ws, func(i int, w *worker.Worker) error {
		st := worker.NewState(w)
		for step := 1; step <= 100000; step++ {
			err := st.Step(t.Context())
			if errors.Is(err, worker.ErrHostsUpdated) {
				stepAt[i] = step
				return nil
			}
			if err != nil {
				return err
			}
		}
		return errors.New("no host update within 100000 steps")
	})
	if stepAt[0] != stepAt[1] || stepAt[1] != stepAt[2] {
		t.Fatalf("ranks saw the update at steps %v: they must agree", stepAt)
	}
}

// Run survives a peer dying mid-training: the survivors restore the last commit, report
// READY, join the next generation (published by the test, as the driver would), sync from
// rank 0 and finish; at most the step in progress is redone.
func TestRunRestoresAndResetsOnPeerLost(t *testing.T) {
	j := newJob(t)
	ws := j.start(3)
	errDied := errors.New("died")
	type life struct{ gens, sizes, resumed []int }
	lives := make([]life, 3)
	go func() { // the driver: once both survivors are READY for generation 1, publish 2
		seen := map[protocol.WorkerID]bool{}
		for ev := range j.srv.Events() {
			if ev.State == protocol.Ready && ev.Generation == 1 && !seen[ev.Worker] {
				seen[ev.Worker] = true
				if len(seen) == 2 {
					j.publish(2, id(0), id(1))
					return
				}
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	resets := make([]int, 3)
	for i, w := range ws {
		w.OnReset(func(context.Context) error { resets[i]++; return nil })
		wg.Go(func() {
			grad := make([]float32, 4)
			var step int64
			st := worker.NewState(w)
			st.Register("step", &step)
			errs[i] = worker.Run(t.Context(), w, st, func(ctx context.Context) error {
				lives[i].gens = append(lives[i].gens, int(w.Generation()))
				lives[i].sizes = append(lives[i].sizes, w.Size())
				lives[i].resumed = append(lives[i].resumed, int(step))
				for step < 60 {
					if i == 2 && step == 30 {
						w.Comm().Close() // this process "dies" mid-training
						return errDied
					}
					if err := w.Comm().Allreduce(ctx, grad, allreduce.Sum); err != nil {
						return err
					}
					step++
					if err := st.Step(ctx); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
	wg.Wait()
	if !errors.Is(errs[2], errDied) {
		t.Fatalf("the dying worker: %v", errs[2])
	}
	for i := range 2 {
		if errs[i] != nil {
			t.Fatalf("survivor %d: %v", i, errs[i])
		}
		l := lives[i]
		if !slices.Equal(l.gens, []int{1, 2}) || !slices.Equal(l.sizes, []int{3, 2}) {
			t.Fatalf("survivor %d lived generations %v with sizes %v, want [1 2] / [3 2]", i, l.gens, l.sizes)
		}
		if l.resumed[1] < 29 || l.resumed[1] > 30 {
			t.Fatalf("survivor %d resumed at step %d, want 29 or 30 (at most one step redone)", i, l.resumed[1])
		}
	}
	if resets[0] != 1 || resets[1] != 1 {
		t.Fatalf("reset callbacks ran %v times, want once per survivor", resets[:2])
	}
	if lives[0].resumed[1] != lives[1].resumed[1] {
		t.Fatalf("survivors resumed at different steps %d and %d", lives[0].resumed[1], lives[1].resumed[1])
	}
}

// A worker told to send no step times (the driver sets ELASTICD_LOAD_EVERY=0s unless the slot
// policy reads them) sends none, and rank 0 still reports how far training has got.
func TestNoStepTimesWhenTheDriverWantsNone(t *testing.T) {
	j := newJob(t)
	w := j.startWith(1, -1)[0]
	s := worker.NewState(w)
	deadline := time.Now().Add(5 * time.Second)
	for j.srv.Progress().Step == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no progress reached the driver within 5s")
		}
		time.Sleep(20 * time.Millisecond) // a step's work
		if err := s.Step(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	for range 10 { // more steps, ten times as long as TestStepTimeReachesDriver's reports take
		time.Sleep(20 * time.Millisecond)
		if err := s.Step(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if d, ok := j.srv.StepTimes()[id(0)]; ok {
		t.Fatalf("a step time of %v reached the driver, which wants none", d)
	}
}

// A worker's mean step time reaches the driver, the input of --slot-policy loadaware.
func TestStepTimeReachesDriver(t *testing.T) {
	j := newJob(t)
	w := j.startWith(1, 20*time.Millisecond)[0]
	s := worker.NewState(w)
	for range 4 {
		time.Sleep(30 * time.Millisecond) // a step's work
		if err := s.Step(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if d := j.srv.StepTimes()[id(0)]; d > 0 {
			if d < 25*time.Millisecond || d > time.Second {
				t.Fatalf("reported step time %v, want about 30ms", d)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no step time reached the driver within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
