package driver_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver"
	"github.com/elasticd/elasticd/driver/cost"
	"github.com/elasticd/elasticd/proc"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

// gatedLauncher is the local launcher with one launch held: the process of the worker and
// generation named hold is started, but Start returns only when the test closes release, as
// an ssh launch waiting for its wrapper does; and it cannot be called off (it ignores ctx),
// so what the driver does with it depends on the driver alone. It records every Stop.
type gatedLauncher struct {
	inner   proc.Launcher
	hold    string        // "worker@generation"
	held    chan int      // the held process's PID, once it runs
	release chan struct{} // closed: the held Start returns
	stopped chan string   // "worker@generation" of each process at its first Stop

	mu    sync.Mutex
	pids  map[string]int
	stops map[string]int
}

func newGatedLauncher(hold string) *gatedLauncher {
	return &gatedLauncher{
		inner: proc.NewLocal(), hold: hold,
		held: make(chan int, 1), release: make(chan struct{}), stopped: make(chan string, 64),
		pids: map[string]int{}, stops: map[string]int{},
	}
}

func (l *gatedLauncher) Start(ctx context.Context, s proc.Spec) (proc.Process, error) {
	key := envOf(s.Env, protocol.EnvWorkerID) + "@" + envOf(s.Env, protocol.EnvGeneration)
	p, err := l.inner.Start(context.WithoutCancel(ctx), s)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.pids[key] = p.PID()
	l.mu.Unlock()
	if key == l.hold {
		l.held <- p.PID()
		<-l.release
	}
	return &recordedProcess{Process: p, key: key, l: l}, nil
}

// killAll kills what the launcher started, should a failed test leave any running.
func (l *gatedLauncher) killAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, pid := range l.pids {
		syscall.Kill(-pid, syscall.SIGKILL) // each worker leads its process group
	}
}

type recordedProcess struct {
	proc.Process
	key string
	l   *gatedLauncher
}

func (p *recordedProcess) Stop(grace time.Duration) {
	p.l.mu.Lock()
	p.l.stops[p.key]++
	first := p.l.stops[p.key] == 1
	p.l.mu.Unlock()
	if first {
		p.l.stopped <- p.key // buffered beyond the few processes of a test
	}
	p.Process.Stop(grace)
}

func envOf(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// waitStopped waits for the first Stop of the process key.
func waitStopped(t *testing.T, l *gatedLauncher, key string, within time.Duration, why string) {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case k := <-l.stopped:
			if k == key {
				return
			}
		case <-timeout:
			t.Fatalf("%s was not stopped within %v: %s", key, within, why)
		}
	}
}

// A launch that does not return (a slow ssh host) holds up none of the driver's other
// decisions: the other workers are launched, one's failure is handled and the group's
// restart stops the other. When the held launch returns after all that, its process, whose
// worker was stopped meanwhile, is stopped, and the job goes on to its next generation.
func TestSlowLaunchHoldsUpNothingElse(t *testing.T) {
	// Generation 1: c/0 fails at once, the others run until stopped; generation 2 succeeds.
	script := `case "$ELASTICD_WORKER_ID@$ELASTICD_GENERATION" in
c/0@1) sleep 0.2; exit 1 ;;
*@1) exec sleep 600 ;;
esac`
	l := newGatedLauncher("a/0@1")
	hs := []providers.Host{{ID: "a", Addr: "127.0.0.1", Slots: 1}, {ID: "b", Addr: "127.0.0.1", Slots: 1}, {ID: "c", Addr: "127.0.0.1", Slots: 1}}
	o := driver.Options{
		Config: driver.Config{
			NP: 3, MinNP: 2, Mode: driver.ModeRestart,
			ElasticTimeout: time.Minute, StartTimeout: time.Minute, BarrierTimeout: time.Minute,
		},
		Provider:          providers.NewFixed(hs),
		DiscoveryInterval: 100 * time.Millisecond,
		Launcher:          l,
		Command:           []string{"/bin/sh", "-c", script},
		StopGrace:         2 * time.Second,
		Logger:            slog.New(slog.NewTextHandler(tWriter{t}, nil)),
	}
	ctx, cancel := context.WithCancel(t.Context())
	type outcome struct {
		res driver.Result
		err error
	}
	done, ended := make(chan outcome, 1), make(chan struct{})
	go func() {
		defer close(ended)
		res, err := driver.Run(ctx, o)
		done <- outcome{res, err}
	}()
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(l.release) }) }
	t.Cleanup(func() { // a failed test still ends the job and its processes
		release()
		cancel()
		select {
		case <-ended:
		case <-time.After(30 * time.Second):
			t.Error("the driver did not return within 30s of its cancel")
		}
		l.killAll()
	})

	var pid int
	select {
	case pid = <-l.held:
	case <-time.After(30 * time.Second):
		t.Fatal("a/0 was not launched within 30s")
	}
	waitStopped(t, l, "b/0@1", 30*time.Second, "the restart after c/0's failure waits for nobody's launch")
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("a/0's held process is not running before its launch returned: %v", err)
	}
	release()
	waitStopped(t, l, "a/0@1", 30*time.Second, "a process launched for a worker stopped meanwhile is stopped when the launch returns")

	var out outcome
	select {
	case out = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the job did not end within 60s of the held launch's return")
	}
	if out.err != nil {
		t.Fatal(out.err)
	}
	if out.res.Code != driver.ExitOK || out.res.Generations != 2 {
		t.Fatalf("job ended with code %d after %d generations (%s), want 0 after 2", out.res.Code, out.res.Generations, out.res.Reason)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("a/0's process of generation 1 outlived the job: kill(%d, 0) = %v", pid, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for key, pid := range l.pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s (pid %d) outlived the job: kill = %v", key, pid, err)
		}
	}
}

// spotCalls is a SpotPricer that records the types it was asked about.
type spotCalls struct {
	mu    sync.Mutex
	asked []string
}

func (s *spotCalls) SpotPrices(_ context.Context, types []string) (map[string]map[string]float64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = append(s.asked, types...)
	out := map[string]map[string]float64{}
	for _, t := range types {
		out[t] = map[string]float64{"z1": 0.5}
	}
	return out, nil
}

// slowFirst answers no poll before at, as a cloud's first answer comes after the price loop's
// first look.
type slowFirst struct {
	providers.Provider
	at time.Time
}

func (p slowFirst) Hosts(ctx context.Context) ([]providers.Host, error) {
	select {
	case <-time.After(time.Until(p.at)):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return p.Provider.Hosts(ctx)
}

// A job shorter than a minute is priced: the spot prices of its hosts' types are asked as
// soon as discovery finds them, not at the price loop's next look a minute later.
func TestShortJobIsPriced(t *testing.T) {
	spot := &spotCalls{}
	o := driver.Options{
		Config: driver.Config{
			NP: 1, MinNP: 1, Mode: driver.ModeRestart,
			ElasticTimeout: time.Minute, StartTimeout: time.Minute, BarrierTimeout: time.Minute,
		},
		Provider:          slowFirst{providers.NewFixed([]providers.Host{{ID: "a", Addr: "127.0.0.1", Slots: 1, Type: "g4", Zone: "z1", Spot: true}}), time.Now().Add(300 * time.Millisecond)},
		DiscoveryInterval: 100 * time.Millisecond,
		Launcher:          proc.NewLocal(),
		Command:           []string{"/bin/sh", "-c", "sleep 1"},
		StopGrace:         2 * time.Second,
		Prices:            cost.NewCatalog(nil, spot, nil),
		Logger:            slog.New(slog.NewTextHandler(tWriter{t}, nil)),
	}
	res, err := driver.Run(t.Context(), o)
	if err != nil || res.Code != driver.ExitOK {
		t.Fatalf("job: %+v, %v", res, err)
	}
	spot.mu.Lock()
	defer spot.mu.Unlock()
	if !slices.Contains(spot.asked, "g4") {
		t.Fatalf("the spot price of the job's only type was never asked for (asked %v)", spot.asked)
	}
}

// fakeGroup is a providers.Capacity in memory that records its calls.
type fakeGroup struct {
	mu    sync.Mutex
	size  providers.GroupSize
	calls []string
}

func (g *fakeGroup) GroupSize(context.Context) (providers.GroupSize, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.size, nil
}

func (g *fakeGroup) SetDesired(_ context.Context, n int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls = append(g.calls, fmt.Sprintf("set %d", n))
	g.size.Desired, g.size.Min = n, min(g.size.Min, n)
	return nil
}

func (g *fakeGroup) Replace(_ context.Context, id string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls = append(g.calls, "replace "+id)
	return nil
}

func (g *fakeGroup) LaunchFailures(context.Context) ([]providers.LaunchFailure, error) {
	return nil, nil
}

// Under --manage-capacity the group is sized for the job at start, and set to zero at its
// end, whatever ended it, once the workers are stopped; the result says what was done.
func TestManagedGroupGoesToZeroAtTheEnd(t *testing.T) {
	for _, c := range []struct {
		name      string
		command   string
		interrupt bool
		code      int
	}{
		{"Success", "sleep 0.5", false, driver.ExitOK},
		{"Interrupted", "exec sleep 600", true, driver.ExitInterrupted},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := &fakeGroup{size: providers.GroupSize{Desired: 1, Min: 1, Max: 4, Instances: 1}}
			hs := []providers.Host{{ID: "a", Addr: "127.0.0.1", Slots: 1}, {ID: "b", Addr: "127.0.0.1", Slots: 1}}
			o := driver.Options{
				Config: driver.Config{
					NP: 2, MinNP: 1, Mode: driver.ModeRestart,
					ElasticTimeout: time.Minute, StartTimeout: time.Minute, BarrierTimeout: time.Minute,
					Capacity: &driver.CapacityConfig{Group: "test group g"},
				},
				Capacity:          g,
				Provider:          providers.NewFixed(hs),
				DiscoveryInterval: 100 * time.Millisecond,
				Launcher:          proc.NewLocal(),
				Command:           []string{"/bin/sh", "-c", c.command},
				StopGrace:         2 * time.Second,
				Logger:            slog.New(slog.NewTextHandler(tWriter{t}, nil)),
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if c.interrupt {
				go func() {
					deadline := time.Now().Add(30 * time.Second)
					for time.Now().Before(deadline) {
						g.mu.Lock()
						n := len(g.calls)
						g.mu.Unlock()
						if n > 0 {
							time.Sleep(300 * time.Millisecond) // the workers run
							cancel()
							return
						}
						time.Sleep(10 * time.Millisecond)
					}
				}()
			}
			res, err := driver.Run(ctx, o)
			if err != nil || res.Code != c.code {
				t.Fatalf("job: %+v, %v; want code %d", res, err, c.code)
			}
			g.mu.Lock()
			defer g.mu.Unlock()
			if !slices.Equal(g.calls, []string{"set 2", "set 0"}) {
				t.Fatalf("calls %v, want the group sized for 2 hosts, then zero", g.calls)
			}
			if g.size.Min != 0 {
				t.Errorf("the group's minimum is %d after the job", g.size.Min)
			}
			if cs := res.Status.Capacity; cs == nil || cs.Final != "2 → 0" || cs.CapacityLine() != "test group g: 2 → 0" {
				t.Fatalf("capacity status %+v", cs)
			}
		})
	}
}

// A job under --max-cost stops before its cost passes it: at one price unit per second, the
// budget of 12 is not passed, and the job ends with ExitBudget; one whose host has no price
// stops at once, naming the type.
func TestMaxCost(t *testing.T) {
	run := func(t *testing.T, prices *cost.File, maxCost float64) driver.Result {
		o := driver.Options{
			Config: driver.Config{
				NP: 1, MinNP: 1, Mode: driver.ModeRestart,
				ElasticTimeout: time.Minute, StartTimeout: time.Minute, BarrierTimeout: time.Minute,
			},
			Provider:          providers.NewFixed([]providers.Host{{ID: "a", Addr: "127.0.0.1", Slots: 1, Type: "g", Zone: "z", Spot: true}}),
			DiscoveryInterval: 100 * time.Millisecond,
			Launcher:          proc.NewLocal(),
			Command:           []string{"/bin/sh", "-c", "exec sleep 600"},
			StopGrace:         time.Second,
			Prices:            cost.NewCatalog(prices, nil, nil),
			MaxCost:           maxCost,
			Logger:            slog.New(slog.NewTextHandler(tWriter{t}, nil)),
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		res, err := driver.Run(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	t.Run("Reached", func(t *testing.T) {
		res := run(t, &cost.File{Currency: "USD", Types: map[string]cost.Rate{"g": {OnDemand: 7200, Spot: 3600}}}, 12)
		if res.Code != driver.ExitBudget || !strings.Contains(res.Reason, "--max-cost 12.00 USD reached") {
			t.Fatalf("result %d %q, want ExitBudget", res.Code, res.Reason)
		}
		if c := res.Status.Cost; c == nil || c.Total > 12 || c.Total < 4 {
			t.Fatalf("cost %+v: want stopped after a few seconds, below the budget of 12", c)
		}
	})
	t.Run("Unpriced", func(t *testing.T) {
		res := run(t, nil, 12)
		if res.Code != driver.ExitFailed || !strings.Contains(res.Reason, "no price for g (spot)") {
			t.Fatalf("result %d %q", res.Code, res.Reason)
		}
	})
}
