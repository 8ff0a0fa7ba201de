package sim_test

import (
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/sim"
)

func TestParseScenario(t *testing.T) {
	steps, err := sim.ParseScenario(strings.NewReader(`# after  action
0        desired spot 3
20s      spot-capacity 1        # spot runs out: one spot instance is reclaimed with a notice

90s      spot-capacity unlimited
2m       interrupt spot         # the newest instance of group "spot" gets a notice
2m       interrupt sim-spot-0002 45s
2m30s    vanish spot
3m       outage on
3m10s    outage off
4m       deny on
4m       stall off
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []sim.Step{
		{After: 0, Action: sim.ActionDesired, Target: "spot", N: 3, Line: 2},
		{After: 20 * time.Second, Action: sim.ActionSpotCapacity, N: 1, Line: 3},
		{After: 90 * time.Second, Action: sim.ActionSpotCapacity, N: sim.Unlimited, Line: 5},
		{After: 2 * time.Minute, Action: sim.ActionInterrupt, Target: "spot", Line: 6},
		{After: 2 * time.Minute, Action: sim.ActionInterrupt, Target: "sim-spot-0002", Warning: 45 * time.Second, Line: 7},
		{After: 150 * time.Second, Action: sim.ActionVanish, Target: "spot", Line: 8},
		{After: 3 * time.Minute, Action: sim.ActionOutage, On: true, Line: 9},
		{After: 190 * time.Second, Action: sim.ActionOutage, Line: 10},
		{After: 4 * time.Minute, Action: sim.ActionDeny, On: true, Line: 11},
		{After: 4 * time.Minute, Action: sim.ActionStall, Line: 12},
	}
	if len(steps) != len(want) {
		t.Fatalf("%d steps: %+v; want %d", len(steps), steps, len(want))
	}
	for i := range want {
		if steps[i] != want[i] {
			t.Errorf("step %d: %+v; want %+v", i, steps[i], want[i])
		}
	}
	if s := steps[4].String(); s != "2m0s interrupt sim-spot-0002 45s" {
		t.Errorf("String: %q", s)
	}
}

func TestParseScenarioErrors(t *testing.T) {
	for _, c := range []struct {
		text string
		want []string // all in the error
	}{
		{"10s spot-capacty 1", []string{"line 1", `"spot-capacty": not an action`, "spot-capacity N|unlimited", "interrupt GROUP|INSTANCE"}},
		{"\n\n# c\nsoon vanish spot", []string{"line 4", `"soon": not a time`, "20s"}},
		{"-5s vanish spot", []string{"line 1", `"-5s"`}},
		{"10s", []string{"line 1", "no action"}},
		{"10s spot-capacity lots", []string{"line 1", `spot-capacity "lots"`, "or unlimited"}},
		{"10s spot-capacity", []string{"line 1", "spot-capacity takes a count or unlimited"}},
		{"10s interrupt", []string{"line 1", "interrupt takes a group or an instance ID"}},
		{"10s interrupt spot soon", []string{"line 1", `interrupt spot "soon": not a warning`, "30s"}},
		{"10s vanish spot 5s", []string{"line 1", "vanish takes a group or an instance ID"}},
		{"10s vanish Spot!", []string{"line 1", `vanish "Spot!"`, "group name"}},
		{"10s desired spot", []string{"line 1", "desired takes a group and a size"}},
		{"10s desired spot -1", []string{"line 1", `desired spot "-1"`, "from 0 to"}},
		{"10s outage maybe", []string{"line 1", `outage "maybe": want on or off`}},
		{"1m deny on\n30s deny off", []string{"line 2", `"30s" is before the step above it`, "sort them"}},
	} {
		_, err := sim.ParseScenario(strings.NewReader(c.text))
		if err == nil {
			t.Errorf("%q: no error", c.text)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: error %q; want it to contain %q", c.text, err, w)
			}
		}
	}
}

// A scenario runs at its times: an interruption of the newest instance, the oldest vanishing,
// spot capacity running out and returning.
func TestScenarioRuns(t *testing.T) {
	steps, err := sim.ParseScenario(strings.NewReader(`
400ms  interrupt spot 1h
800ms  vanish sim-spot-0001
1500ms spot-capacity 0
2200ms spot-capacity unlimited
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg := oneGroup(0)
	cfg.InterruptWarning = 300 * time.Millisecond
	cfg.Scenario = steps
	f := start(t, cfg)
	p := f.group(t, "spot")
	f.running(t, 2)

	var ns []providers.Notice
	waitFor(t, "the interruption", 10*time.Second, func() bool { ns = notices(t, p); return len(ns) > 0 })
	if at := time.Since(f.start); at < 400*time.Millisecond {
		t.Errorf("the interruption came %v after the start; want after 400ms", at)
	}
	if len(ns) != 1 || ns[0].HostID != "sim-spot-0002" || time.Until(ns[0].Deadline) < 50*time.Minute {
		t.Errorf("notices %+v; want one for sim-spot-0002 due in an hour", ns)
	}
	waitFor(t, "the vanish and its replacement", 10*time.Second, func() bool {
		is := f.instances(t)
		return len(is) == 2 && is[0].ID == "sim-spot-0002" && is[1].ID == "sim-spot-0003"
	})
	if at := time.Since(f.start); at < 800*time.Millisecond {
		t.Errorf("the vanish came %v after the start; want after 800ms", at)
	}
	waitFor(t, "a failure for want of capacity", 10*time.Second, func() bool { return len(failures(t, p)) > 0 })
	if at := time.Since(f.start); at < 1500*time.Millisecond {
		t.Errorf("spot ran out %v after the start; want after 1500ms", at)
	}
	// sim-spot-0002 keeps its hour's notice; sim-spot-0003 gets one of 300ms when spot
	// runs out, is reclaimed, and is replaced once spot returns.
	waitFor(t, "the group refilled after spot returned", 10*time.Second, func() bool {
		is := f.instances(t)
		return len(is) == 2 && is[0].ID == "sim-spot-0002" && is[1].ID >= "sim-spot-0004" && is[1].State == sim.Running
	})
}
