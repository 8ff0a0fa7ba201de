package sim_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/sim"
)

func hosts(t *testing.T, p *sim.Provider) []providers.Host {
	t.Helper()
	hs, err := p.Hosts(t.Context())
	if err != nil {
		t.Fatalf("Hosts: %v", err)
	}
	return hs
}

func ids(hs []providers.Host) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.ID
	}
	return out
}

func notices(t *testing.T, p *sim.Provider) []providers.Notice {
	t.Helper()
	ns, err := p.Notices(t.Context())
	if err != nil {
		t.Fatalf("Notices: %v", err)
	}
	return ns
}

func failures(t *testing.T, p *sim.Provider) []providers.LaunchFailure {
	t.Helper()
	fs, err := p.LaunchFailures(t.Context())
	if err != nil {
		t.Fatalf("LaunchFailures: %v", err)
	}
	return fs
}

// The group launches up to its desired size after the launch delay, each instance running
// the agent command with its own ID, address and slots.
func TestLaunchAfterDelay(t *testing.T) {
	const delay = 700 * time.Millisecond
	f := start(t, sim.Config{
		Groups: []sim.GroupConfig{
			{Name: "spot", Spot: true, Type: "sim.gpu2", Zone: "sim-a", Slots: 2, Desired: 2, Max: 3},
			{Name: "ondemand", Slots: 1, Desired: 1, Max: 2},
		},
		SpotCapacity: sim.Unlimited,
		LaunchDelay:  delay,
	})
	spot, od := f.group(t, "spot"), f.group(t, "ondemand")
	if hs := hosts(t, spot); len(hs) != 0 && time.Since(f.start) < delay {
		t.Errorf("before the launch delay, Hosts lists %v; want none (the instances boot)", ids(hs))
	}
	is := f.instances(t)
	if len(is) != 3 {
		t.Fatalf("just after Start, %d instances; want 3 booting", len(is))
	}
	if time.Since(f.start) < delay {
		for _, in := range is {
			if in.State != sim.Pending || in.PID != 0 {
				t.Errorf("instance %s is %s (pid %d) before the launch delay; want pending", in.ID, in.State, in.PID)
			}
		}
	}
	is = f.running(t, 3)
	for _, in := range is {
		r := f.record(t, in.ID)
		if r.PID != in.PID || r.PGID != in.PID {
			t.Errorf("%s: process %d in group %d; the cloud says %d, leading its own group", in.ID, r.PID, r.PGID, in.PID)
		}
		if fi, err := os.Stat(filepath.Join(f.dir, in.ID+".json")); err != nil {
			t.Error(err)
		} else if fi.ModTime().Sub(in.Launched) < delay-fsClockSlack {
			t.Errorf("%s ran %v after its launch; want at least the delay %v", in.ID, fi.ModTime().Sub(in.Launched), delay)
		}
		want := []string{"agent", "--driver", "http://127.0.0.1:1", "--agent-secret-file", filepath.Join(f.dir, "secret"), "--host-id", in.ID,
			"--addr", in.Addr, "--slots", map[string]string{"spot": "2", "ondemand": "1"}[in.Group], "--metadata", "none"}
		if !slices.Equal(r.Args, want) {
			t.Errorf("%s runs with %q; want %q", in.ID, r.Args, want)
		}
	}
	want := map[string]providers.Host{
		"sim-spot-0001":     {ID: "sim-spot-0001", Slots: 2, Zone: "sim-a", Spot: true, Type: "sim.gpu2"},
		"sim-spot-0002":     {ID: "sim-spot-0002", Slots: 2, Zone: "sim-a", Spot: true, Type: "sim.gpu2"},
		"sim-ondemand-0001": {ID: "sim-ondemand-0001", Slots: 1, Zone: sim.DefaultZone, Type: "sim.gpu1"},
	}
	addrs := map[string]bool{}
	for _, h := range append(hosts(t, spot), hosts(t, od)...) {
		w, ok := want[h.ID]
		if !ok {
			t.Errorf("unexpected host %+v", h)
			continue
		}
		w.Addr, w.Launched = h.Addr, h.Launched
		if !providers.SameHost(h, w) {
			t.Errorf("host %+v; want %+v", h, w)
		}
		if !strings.HasPrefix(h.Addr, "127.0.0.") || h.Addr == "127.0.0.1" || addrs[h.Addr] {
			t.Errorf("host %s at %s: want an address 127.0.0.N of its own, not 127.0.0.1", h.ID, h.Addr)
		}
		addrs[h.Addr] = true
	}
}

// Scaling in terminates the newest instances first, listed as Leaving until their process is
// gone (here only after SIGKILL: the stand-ins ignore SIGTERM).
func TestScaleDownNewestFirst(t *testing.T) {
	cfg := oneGroup(0)
	cfg.Groups[0].Desired = 3
	cfg.TerminateGrace = 1500 * time.Millisecond
	f := start(t, cfg, "SIM_TEST_IGNORE_TERM=1")
	p := f.group(t, "spot")
	is := f.running(t, 3)
	for _, in := range is {
		f.record(t, in.ID) // it ignores SIGTERM from now on
	}
	begin := time.Now()
	if err := p.SetDesired(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	hs := hosts(t, p)
	slices.SortFunc(hs, func(a, b providers.Host) int { return strings.Compare(a.ID, b.ID) })
	if len(hs) != 3 || hs[0].Leaving || !hs[1].Leaving || !hs[2].Leaving {
		t.Fatalf("after SetDesired(1): %+v; want the two newest listed as Leaving, the oldest not", hs)
	}
	if s, err := p.GroupSize(t.Context()); err != nil || s.Desired != 1 || s.Instances != 3 {
		t.Errorf("GroupSize while terminating: %v, %v; want desired 1 and 3 instances", s, err)
	}
	waitFor(t, "the terminated instances to go", 10*time.Second, func() bool { return len(hosts(t, p)) == 1 })
	if time.Since(begin) < cfg.TerminateGrace {
		t.Errorf("the instances that ignore SIGTERM went before the grace")
	}
	if got := ids(hosts(t, p)); !slices.Equal(got, []string{is[0].ID}) {
		t.Errorf("left %v; want the oldest, %s", got, is[0].ID)
	}
	waitDead(t, is[1].PID, is[2].PID)
	if s, _ := p.GroupSize(t.Context()); s.Instances != 1 {
		t.Errorf("GroupSize after the scale-in: %v; want 1 instance", s)
	}
}

// Spot capacity runs out: the newest instances beyond it get interruption notices and are
// reclaimed after the warning; the group's launches fail as AWS's do, classified NoCapacity,
// until capacity returns and the group fills up again.
func TestSpotRunsOutAndReturns(t *testing.T) {
	cfg := oneGroup(0)
	cfg.Groups[0].Desired = 3
	cfg.InterruptWarning = 600 * time.Millisecond
	f := start(t, cfg)
	p := f.group(t, "spot")
	is := f.running(t, 3)

	before := time.Now()
	if err := f.cloud.SetSpotCapacity(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	ns := notices(t, p)
	slices.SortFunc(ns, func(a, b providers.Notice) int { return strings.Compare(a.HostID, b.HostID) })
	if len(ns) != 2 || ns[0].HostID != is[1].ID || ns[1].HostID != is[2].ID || ns[0].ID == ns[1].ID {
		t.Fatalf("notices %+v; want one each for the two newest, %s and %s", ns, is[1].ID, is[2].ID)
	}
	for _, n := range ns {
		if n.Kind != providers.Interruption || n.ID == "" || n.Deadline.Before(before.Add(cfg.InterruptWarning)) || n.Deadline.After(time.Now().Add(cfg.InterruptWarning)) {
			t.Errorf("notice %+v: want an interruption with an ID, due in %v", n, cfg.InterruptWarning)
		}
	}
	for _, h := range hosts(t, p) {
		if h.Leaving {
			t.Errorf("host %s is Leaving during its notice; the notice says it", h.ID)
		}
	}
	waitFor(t, "the reclaim", 10*time.Second, func() bool { return len(hosts(t, p)) == 1 })
	if took := time.Since(before); took < cfg.InterruptWarning {
		t.Errorf("reclaimed %v after the notice; want after the warning, %v", took, cfg.InterruptWarning)
	}
	waitDead(t, is[1].PID, is[2].PID)
	if ns := notices(t, p); len(ns) != 0 {
		t.Errorf("the reclaimed instances' notices are still listed: %+v", ns)
	}

	// Launch attempts go on failing, each a failure of its own, classified.
	var fs []providers.LaunchFailure
	waitFor(t, "two failed launch attempts", 10*time.Second, func() bool { fs = failures(t, p); return len(fs) >= 2 })
	for _, fl := range fs {
		if fl.Kind != providers.NoCapacity || fl.Code != "InsufficientInstanceCapacity" || providers.Classify(fl.Code, fl.Message) != providers.NoCapacity ||
			!strings.Contains(fl.Message, "There is no Spot capacity available") || fl.Zone == "" {
			t.Errorf("failure %+v: want InsufficientInstanceCapacity, no capacity, with AWS's message and the zone", fl)
		}
	}
	if fs[0].ID == fs[1].ID || fs[1].At.Sub(fs[0].At) < cfg.LaunchRetry {
		t.Errorf("failures %+v: want distinct IDs, at least %v apart", fs[:2], cfg.LaunchRetry)
	}
	again := failures(t, p)
	if !slices.EqualFunc(fs, again[:len(fs)], func(a, b providers.LaunchFailure) bool { return a.ID == b.ID }) {
		t.Errorf("failures listed again under other IDs: %+v, then %+v", fs, again)
	}
	if s, _ := p.GroupSize(t.Context()); s.Desired != 3 || s.Instances != 1 {
		t.Errorf("GroupSize while short of capacity: %v; want desired 3 and 1 instance", s)
	}

	// Capacity returns: the group launches again, under new IDs.
	if err := f.cloud.SetSpotCapacity(t.Context(), sim.Unlimited); err != nil {
		t.Fatal(err)
	}
	now := f.running(t, 3)
	for _, in := range now[1:] {
		if in.ID == is[1].ID || in.ID == is[2].ID {
			t.Errorf("ID %s given again", in.ID)
		}
	}
}

// The cloud's spot capacity holds across its groups, and limits only spot groups.
func TestSpotCapacityAcrossGroups(t *testing.T) {
	f := start(t, sim.Config{
		Groups: []sim.GroupConfig{
			{Name: "a", Spot: true, Desired: 2, Max: 2},
			{Name: "b", Spot: true, Desired: 2, Max: 2},
			{Name: "ondemand", Desired: 1, Max: 1},
		},
		SpotCapacity: 3,
		LaunchDelay:  20 * time.Millisecond,
		LaunchRetry:  50 * time.Millisecond,
	})
	waitFor(t, "3 spot and 1 on-demand instances and a failed launch", 10*time.Second, func() bool {
		n := 0
		for _, in := range f.instances(t) {
			if in.State == sim.Running {
				n++
			}
		}
		fs := append(failures(t, f.group(t, "a")), failures(t, f.group(t, "b"))...)
		return n == 4 && len(fs) > 0
	})
	if fs := failures(t, f.group(t, "ondemand")); len(fs) != 0 {
		t.Errorf("the on-demand group failed launches: %+v", fs)
	}
}

// An instance that vanishes dies at once with no notice and leaves its group at once; the
// group replaces it.
func TestVanish(t *testing.T) {
	f := start(t, oneGroup(0))
	p := f.group(t, "spot")
	is := f.running(t, 2)
	if err := f.cloud.Vanish(t.Context(), is[1].ID); err != nil {
		t.Fatal(err)
	}
	if got := ids(hosts(t, p)); slices.Contains(got, is[1].ID) {
		t.Errorf("just after Vanish(%s), Hosts lists %v", is[1].ID, got)
	}
	if ns := notices(t, p); len(ns) != 0 {
		t.Errorf("a vanished instance left notices: %+v", ns)
	}
	waitDead(t, is[1].PID)
	now := f.running(t, 2)
	if now[1].ID == is[1].ID || now[0].ID != is[0].ID {
		t.Errorf("after the vanish, instances %v; want %s and a replacement", now, is[0].ID)
	}
	if err := f.cloud.Vanish(t.Context(), is[1].ID); !errors.Is(err, sim.ErrNoInstance) {
		t.Errorf("Vanish of a gone instance: %v; want ErrNoInstance", err)
	}
}

// Replace terminates the instance and the group launches another, its desired size kept;
// the calls are recorded.
func TestReplace(t *testing.T) {
	cfg := oneGroup(0)
	cfg.TerminateGrace = 500 * time.Millisecond
	f := start(t, cfg, "SIM_TEST_IGNORE_TERM=1") // so that it stays Leaving for the grace
	p := f.group(t, "spot")
	is := f.running(t, 2)
	f.record(t, is[0].ID)
	if err := p.Replace(t.Context(), is[0].ID); err != nil {
		t.Fatal(err)
	}
	if hs := hosts(t, p); !slices.ContainsFunc(hs, func(h providers.Host) bool { return h.ID == is[0].ID && h.Leaving }) {
		t.Errorf("just after Replace(%s): %+v; want it listed as Leaving", is[0].ID, hs)
	}
	waitDead(t, is[0].PID)
	now := f.running(t, 2)
	if now[0].ID != is[1].ID || now[1].ID == is[0].ID {
		t.Errorf("after the replacement, instances %v; want %s and a new one", now, is[1].ID)
	}
	if s, _ := p.GroupSize(t.Context()); s.Desired != 2 {
		t.Errorf("Replace changed the desired size: %v", s)
	}
	err := p.Replace(t.Context(), "sim-spot-9999")
	if !errors.Is(err, providers.ErrNotInGroup) {
		t.Errorf("Replace of an unknown instance: %v; want ErrNotInGroup", err)
	}
	cs := f.cloud.Calls()
	if len(cs) != 2 || cs[0].Op != "replace" || cs[0].HostID != is[0].ID || cs[0].Err != "" || cs[0].Group != "spot" ||
		cs[1].HostID != "sim-spot-9999" || cs[1].Err == "" || cs[0].At.IsZero() {
		t.Errorf("calls %+v; want the two replaces, the second failed", cs)
	}
}

// SetDesired obeys a cloud's rules.
func TestSetDesiredRules(t *testing.T) {
	f := start(t, oneGroup(0))
	p := f.group(t, "spot")
	if err := p.SetDesired(t.Context(), 5); !errors.Is(err, providers.ErrAboveMax) {
		t.Errorf("SetDesired above max: %v; want ErrAboveMax", err)
	}
	if err := p.SetDesired(t.Context(), -1); !errors.Is(err, providers.ErrRefused) {
		t.Errorf("SetDesired(-1): %v; want ErrRefused", err)
	}
	if err := p.SetDesired(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	if s, _ := p.GroupSize(t.Context()); s.Min != 0 || s.Desired != 0 || s.Max != 4 {
		t.Errorf("after SetDesired(0) of a group with min 1: %v; want min 0, desired 0, max 4", s)
	}
	waitFor(t, "the group to empty", 10*time.Second, func() bool { return len(f.instances(t)) == 0 })
	if err := f.cloud.SetDenied(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	err := p.SetDesired(t.Context(), 1)
	if !errors.Is(err, providers.ErrRefused) || !strings.Contains(err.Error(), "sim:SetDesiredCapacity") {
		t.Errorf("SetDesired while denied: %v; want a refusal naming the permission", err)
	}
	if hs := hosts(t, p); len(hs) != 0 {
		t.Errorf("Hosts while denied: %v, want it answered", hs)
	}
}

// With a lifecycle hook, a scale-in holds the instance until its ScaleIn notice is completed.
func TestLifecycleHook(t *testing.T) {
	f := start(t, oneGroup(time.Hour))
	p := f.group(t, "spot")
	is := f.running(t, 2)
	if err := p.SetDesired(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	ns := notices(t, p)
	if len(ns) != 1 || ns[0].Kind != providers.ScaleIn || ns[0].HostID != is[1].ID {
		t.Fatalf("notices after a scale-in: %+v; want a scale-in notice of %s", ns, is[1].ID)
	}
	time.Sleep(200 * time.Millisecond)
	if dead(t, is[1].PID) {
		t.Fatal("the hook did not hold the instance")
	}
	if err := p.CompleteNotice(t.Context(), ns[0]); err != nil {
		t.Fatal(err)
	}
	waitDead(t, is[1].PID)
	waitFor(t, "the instance to leave", 10*time.Second, func() bool { return len(hosts(t, p)) == 1 })
}

// Close stops every process it started and the children they started, and waits for them.
func TestCloseLeavesNoProcess(t *testing.T) {
	cfg, dir := standInConfig(t, sim.Config{
		Groups: []sim.GroupConfig{
			{Name: "spot", Spot: true, Desired: 2, Max: 2},
			{Name: "ondemand", Desired: 1, Max: 1},
		},
		SpotCapacity:   sim.Unlimited,
		LaunchDelay:    20 * time.Millisecond,
		TerminateGrace: 500 * time.Millisecond,
	}, "SIM_TEST_CHILD=1", "SIM_TEST_IGNORE_TERM=1")
	c, err := sim.Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := &fixture{cloud: c, dir: dir}
	is := f.running(t, 3)
	p, _ := c.Group("spot")
	var pids []int
	for _, in := range is {
		r := f.record(t, in.ID)
		if r.Child == 0 || r.PID != in.PID {
			t.Fatalf("record of %s: %+v", in.ID, r)
		}
		pids = append(pids, r.PID, r.Child)
	}
	begin := time.Now()
	c.Close()
	if took := time.Since(begin); took > cfg.TerminateGrace+5*time.Second {
		t.Errorf("Close took %v", took)
	}
	// Each instance's own process is reaped by Close; what it started in its group got SIGKILL
	// with it, which a loaded machine may take a moment to carry out.
	for _, pid := range []int{pids[0], pids[2], pids[4]} {
		if !dead(t, pid) {
			t.Errorf("instance process %d outlived Close", pid)
		}
	}
	waitDead(t, pids...)
	if _, err := p.Hosts(t.Context()); !errors.Is(err, sim.ErrClosed) {
		t.Errorf("Hosts after Close: %v; want ErrClosed", err)
	}
	if _, err := c.Instances(t.Context()); !errors.Is(err, sim.ErrClosed) {
		t.Errorf("Instances after Close: %v; want ErrClosed", err)
	}
	c.Close() // again: harmless
}

// A launch failure record is bounded however long the group fails.
func TestLaunchFailuresBounded(t *testing.T) {
	cfg := oneGroup(0)
	cfg.SpotCapacity = 0
	cfg.LaunchRetry = time.Millisecond
	f := start(t, cfg)
	p := f.group(t, "spot")
	var fs []providers.LaunchFailure
	waitFor(t, "many failed attempts", 20*time.Second, func() bool {
		fs = failures(t, p)
		return len(fs) > 0 && strings.Compare(fs[len(fs)-1].ID, "sim-launch-000080") > 0
	})
	if len(fs) > 50 {
		t.Errorf("%d failures kept; want at most 50", len(fs))
	}
	if !slices.IsSortedFunc(fs, func(a, b providers.LaunchFailure) int { return a.At.Compare(b.At) }) {
		t.Errorf("failures not newest last")
	}
}

func TestSpotPricesAndPriceFile(t *testing.T) {
	cfg := oneGroup(0)
	cfg.Groups[0].Zone = "sim-b"
	cfg.Prices = map[string]sim.Price{"sim.gpu2": {OnDemand: 4, Spot: 1.25}, "sim.gpu8": {OnDemand: 16}}
	f := start(t, cfg)
	got, err := f.group(t, "spot").SpotPrices(t.Context(), []string{"sim.gpu2", "sim.gpu8", "other"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["sim.gpu2"]["sim-b"] != 1.25 {
		t.Errorf("SpotPrices: %v; want sim.gpu2 at 1.25 in sim-b", got)
	}
	want := "currency: USD\ntypes:\n  \"sim.gpu2\": {on_demand: 4, spot: 1.25}\n  \"sim.gpu8\": {on_demand: 16}\n"
	if pf := cfg.PriceFile(); pf != want {
		t.Errorf("PriceFile:\n%s\nwant:\n%s", pf, want)
	}
}

func TestValidate(t *testing.T) {
	good := func() sim.Config {
		cfg := oneGroup(0)
		cfg.Agent, cfg.DriverURL, cfg.SecretFile = []string{"/bin/true"}, "http://127.0.0.1:29400", "/tmp/s"
		return cfg
	}
	if err := good().Validate(); err != nil {
		t.Fatalf("a good config: %v", err)
	}
	for _, c := range []struct {
		name   string
		change func(*sim.Config)
		want   string
	}{
		{"no groups", func(c *sim.Config) { c.Groups = nil }, "no groups"},
		{"bad name", func(c *sim.Config) { c.Groups[0].Name = "Spot!" }, `name "Spot!"`},
		{"twice", func(c *sim.Config) { c.Groups = append(c.Groups, c.Groups[0]) }, "configured twice"},
		{"desired above max", func(c *sim.Config) { c.Groups[0].Desired = 9 }, "want 0 <= min <= desired <= max"},
		{"no max", func(c *sim.Config) { c.Groups[0].Max, c.Groups[0].Desired, c.Groups[0].Min = 0, 0, 0 }, "max 0"},
		{"too many", func(c *sim.Config) { c.Groups[0].Max = 300 }, "at most 253"},
		{"no agent", func(c *sim.Config) { c.Agent = nil }, "no agent command"},
		{"bad driver", func(c *sim.Config) { c.DriverURL = "127.0.0.1:29400" }, "want the driver's address as an http URL"},
		{"no secret", func(c *sim.Config) { c.SecretFile = "" }, "no secret file"},
		{"bad env", func(c *sim.Config) { c.Env = []string{"X"} }, "want KEY=VALUE"},
		{"negative delay", func(c *sim.Config) { c.LaunchDelay = -time.Second }, "launch delay -1s"},
		{"bad price", func(c *sim.Config) { c.Prices = map[string]sim.Price{"t": {Spot: -1}} }, `spot price of "t"`},
		{"unknown group in scenario", func(c *sim.Config) {
			c.Scenario = []sim.Step{{After: time.Second, Action: sim.ActionVanish, Target: "ondemand", Line: 3}}
		}, `line 3 (vanish): vanish "ondemand": no such group or instance`},
		{"scenario out of order", func(c *sim.Config) {
			c.Scenario = []sim.Step{{After: time.Minute, Action: sim.ActionDeny, On: true}, {After: time.Second, Action: sim.ActionDeny}}
		}, "steps run in order"},
		{"desired above max in scenario", func(c *sim.Config) {
			c.Scenario = []sim.Step{{After: time.Second, Action: sim.ActionDesired, Target: "spot", N: 9}}
		}, "above the group's max 4"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := good()
			c.change(&cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Validate: %v; want an error containing %q", err, c.want)
			}
			if _, serr := sim.Start(t.Context(), cfg); serr == nil {
				t.Errorf("Start accepted the config")
			}
		})
	}
}

// fsClockSlack: a file's modification time comes from the kernel's coarse clock, a tick (up
// to 10 ms) behind the clock Go reads, so a file written just after an instant may be stamped
// just before it.
const fsClockSlack = 10 * time.Millisecond
