package cost

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseFile(t *testing.T) {
	f, err := ParseFile([]byte("types:\n  g5.xlarge: {on_demand: 1.006, spot: 0.4}\n  p4d.24xlarge: {on_demand: 32.77}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Currency != "USD" || f.Types["g5.xlarge"] != (Rate{OnDemand: 1.006, Spot: 0.4}) || f.Types["p4d.24xlarge"].Spot != 0 {
		t.Fatalf("parsed %+v", f)
	}
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "", "no prices"},
		{"no types", "currency: EUR\n", "no prices"},
		{"misspelt key", "types:\n  g5.xlarge: {ondemand: 1}\n", "ondemand"},
		{"unknown top-level key", "prices:\n  g5.xlarge: {on_demand: 1}\n", "prices"},
		{"negative", "types:\n  g5.xlarge: {on_demand: -1}\n", "types.g5.xlarge.on_demand: -1"},
		{"absurd", "types:\n  g5.xlarge: {spot: 2e6}\n", "types.g5.xlarge.spot"},
		{"nan", "types:\n  g5.xlarge: {spot: .nan}\n", "types.g5.xlarge.spot"},
		{"nothing set", "types:\n  g5.xlarge: {}\n", "types.g5.xlarge: neither"},
		{"not yaml", "types: [", "not a price file"},
		{"string price", "types:\n  g5.xlarge: {spot: cheap}\n", "not a price file"},
	} {
		if _, err := ParseFile([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

func TestReadFileNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "prices.yaml")
	if err := os.WriteFile(path, []byte("types:\n  x: {spot: -2}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(path); err == nil || !strings.HasPrefix(err.Error(), path+": ") {
		t.Fatalf("error %v, want it to start with the path", err)
	}
	if _, err := ReadFile(path + ".missing"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

// fakeSpot is a SpotPricer whose answers the test sets, counting the calls.
type fakeSpot struct {
	mu     sync.Mutex
	prices map[string]map[string]float64
	err    error
	calls  [][]string
}

func (f *fakeSpot) SpotPrices(_ context.Context, types []string) (map[string]map[string]float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, slices.Clone(types))
	if f.err != nil {
		return nil, f.err
	}
	out := map[string]map[string]float64{}
	for _, t := range types {
		if z, ok := f.prices[t]; ok {
			out[t] = z
		}
	}
	return out, nil
}

func (f *fakeSpot) set(typ, zone string, p float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.prices[typ] == nil {
		f.prices[typ] = map[string]float64{}
	}
	f.prices[typ][zone] = p
}

func (f *fakeSpot) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestPriceAPIWinsOverFile(t *testing.T) {
	file := &File{Currency: "USD", Types: map[string]Rate{"g5.xlarge": {OnDemand: 1, Spot: 0.5}, "p3.2xlarge": {OnDemand: 3}}}
	spot := &fakeSpot{prices: map[string]map[string]float64{"g5.xlarge": {"us-east-1a": 0.3}}}
	c := NewCatalog(file, spot, nil)
	if p, src, ok := c.Price("g5.xlarge", "us-east-1a", true); !ok || p != 0.5 || src != FromFile {
		t.Fatalf("before a refresh: %v %v %v, want the file's 0.5", p, src, ok)
	}
	if err := c.Refresh(context.Background(), []string{"g5.xlarge", "p3.2xlarge"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		typ, zone string
		spot      bool
		want      float64
		src       Source
		ok        bool
	}{
		{"g5.xlarge", "us-east-1a", true, 0.3, FromAPI, true},
		{"g5.xlarge", "us-east-1b", true, 0.5, FromFile, true}, // no API price in that zone
		{"g5.xlarge", "us-east-1a", false, 1, FromFile, true},  // on-demand comes from the file
		{"p3.2xlarge", "us-east-1a", true, 0, "", false},       // no spot price anywhere
		{"p3.2xlarge", "us-east-1a", false, 3, FromFile, true},
		{"unknown", "", false, 0, "", false},
	} {
		p, src, ok := c.Price(tc.typ, tc.zone, tc.spot)
		if p != tc.want || src != tc.src || ok != tc.ok {
			t.Errorf("Price(%s, %s, spot=%v) = %v %q %v, want %v %q %v", tc.typ, tc.zone, tc.spot, p, src, ok, tc.want, tc.src, tc.ok)
		}
	}
	var nilCatalog *Catalog
	if _, _, ok := nilCatalog.Price("g5.xlarge", "", true); ok || nilCatalog.Currency() != "USD" {
		t.Fatal("a nil catalog has prices")
	}
}

// A host's spot time is priced at each price in turn as it changed, not all at the latest.
func TestSpotPriceHistoryIsIntegrated(t *testing.T) {
	spot := &fakeSpot{prices: map[string]map[string]float64{}}
	c := NewCatalog(&File{Currency: "USD", Types: map[string]Rate{"g5.xlarge": {OnDemand: 1}}}, spot, nil)
	now := t0
	c.now = func() time.Time { return now }
	refresh := func(at time.Time, p float64) {
		now = at
		spot.set("g5.xlarge", "z", p)
		if err := c.Refresh(context.Background(), []string{"g5.xlarge"}); err != nil {
			t.Fatal(err)
		}
	}
	refresh(t0.Add(time.Hour), 0.4)   // the first price also covers the time before it
	refresh(t0.Add(2*time.Hour), 0.4) // unchanged: no new point
	refresh(t0.Add(3*time.Hour), 0.2)
	if n := len(c.api[[2]string{"g5.xlarge", "z"}]); n != 2 {
		t.Fatalf("%d price points, want 2 (an unchanged price adds none)", n)
	}
	u := Usage{Type: "g5.xlarge", Zone: "z", Spot: true, Slots: 1, Stays: []Stay{{From: t0}}}
	s := Compute(c, []Usage{u}, t0.Add(4*time.Hour))
	// 3 h at 0.4, then 1 h at 0.2; on demand 4 h at 1.
	if !near(s.Total, 1.4) || !near(s.Spot, 1.4) || s.OnDemand != 0 || !near(s.OnDemandEquivalent, 4) || !near(s.Savings, 2.6) || !near(s.SavingsPercent, 65) {
		t.Fatalf("summary %+v, want total 1.4, on-demand equivalent 4, savings 2.6 (65%%)", s)
	}
	if len(s.Lines) != 1 || s.Lines[0].Seconds != 4*3600 || s.Lines[0].Cost == nil || !near(*s.Lines[0].Cost, 1.4) {
		t.Fatalf("lines %+v", s.Lines)
	}
}

func TestCompute(t *testing.T) {
	file := &File{Currency: "EUR", Types: map[string]Rate{
		"gpu4": {OnDemand: 8, Spot: 2}, // 4 slots
		"cpu":  {OnDemand: 1},
		"odd":  {Spot: 1}, // no on-demand price: cost known, savings not
	}}
	c := NewCatalog(file, nil, nil)
	at := t0.Add(10 * time.Hour)
	us := []Usage{
		// Two stays of 1 h, the second still open until at: 2 h of spot gpu4, 4 slots,
		// 3600 slot-seconds rolled back.
		{Type: "gpu4", Spot: true, Slots: 4, Stays: []Stay{{From: t0, To: t0.Add(time.Hour)}, {From: at.Add(-time.Hour)}}, RolledBackSlotSeconds: 3600},
		{Type: "cpu", Spot: false, Slots: 1, Stays: []Stay{{From: t0, To: t0.Add(30 * time.Minute)}}},
		{Type: "odd", Spot: true, Slots: 1, Stays: []Stay{{From: t0, To: t0.Add(time.Hour)}}},
		{Type: "mystery", Spot: true, Slots: 1, Stays: []Stay{{From: t0, To: t0.Add(time.Hour)}}},
		{Type: "", Spot: false, Slots: 1, Stays: []Stay{{From: t0, To: t0.Add(time.Hour)}}},
		// A stay that begins after at counts nothing.
		{Type: "cpu", Slots: 1, Stays: []Stay{{From: at.Add(time.Hour)}}},
	}
	s := Compute(c, us, at)
	if s.Currency != "EUR" {
		t.Fatalf("currency %q", s.Currency)
	}
	// Cost: gpu4 2 h × 2 = 4; cpu 0.5 h × 1 = 0.5; odd 1 h × 1 = 1.
	if !near(s.Total, 5.5) || !near(s.Spot, 5) || !near(s.OnDemand, 0.5) {
		t.Fatalf("total %v spot %v on-demand %v, want 5.5 5 0.5", s.Total, s.Spot, s.OnDemand)
	}
	// On-demand equivalent over the hours with an on-demand price: gpu4 2 h × 8 + cpu 0.5.
	if !near(s.OnDemandEquivalent, 16.5) || !near(s.Savings, 12) {
		t.Fatalf("on-demand equivalent %v savings %v, want 16.5 and 12", s.OnDemandEquivalent, s.Savings)
	}
	// Rolled back: 3600 slot-seconds at a quarter of gpu4's 2/h = 0.5.
	if !near(s.RolledBack, 0.5) {
		t.Fatalf("rolled back %v, want 0.5", s.RolledBack)
	}
	wantUnpriced := []string{"mystery (spot)", "odd (on-demand, for the savings)", "unknown (on-demand)"}
	if !slices.Equal(s.Unpriced, wantUnpriced) {
		t.Fatalf("unpriced %q, want %q", s.Unpriced, wantUnpriced)
	}
	var got []string
	for _, l := range s.Lines {
		cost := "nil"
		if l.Cost != nil {
			cost = strconv.FormatFloat(*l.Cost, 'f', -1, 64)
		}
		got = append(got, fmt.Sprintf("%s/%s/%.0f/%s", l.Lifecycle, l.Type, l.Seconds, cost))
	}
	want := []string{"on-demand/cpu/1800/0.5", "on-demand/unknown/3600/nil", "spot/gpu4/7200/4", "spot/mystery/3600/nil", "spot/odd/3600/1"}
	if !slices.Equal(got, want) {
		t.Fatalf("lines %q, want %q", got, want)
	}
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		want string
	}{{1234.5678, "1234.57 USD"}, {1, "1.00 USD"}, {0.12345, "0.1235 USD"}, {0, "0.0000 USD"}, {0.00001, "<0.0001 USD"}, {-2.5, "-2.50 USD"}} {
		if got := Format("USD", tc.v); got != tc.want {
			t.Errorf("Format(%v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}

// Run asks at once, again as soon as a new type appears, and keeps the old prices when a
// refresh fails.
func TestRunRefreshesNewTypes(t *testing.T) {
	spot := &fakeSpot{prices: map[string]map[string]float64{"a": {"z": 0.1}, "b": {"z": 0.2}}}
	c := NewCatalog(nil, spot, nil)
	c.newTypeEvery = 10 * time.Millisecond
	var mu sync.Mutex
	types := []string{"a"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx, func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(types) })
	}()
	defer func() { cancel(); <-done }()
	waitFor(t, "the first refresh", func() bool { _, _, ok := c.Price("a", "z", true); return ok })
	calls := spot.callCount()
	time.Sleep(50 * time.Millisecond) // several ticks: nothing new, no call
	if n := spot.callCount(); n != calls {
		t.Fatalf("%d calls with no new type and no hour gone, want %d", n, calls)
	}
	spot.mu.Lock()
	spot.err = errors.New("throttled")
	spot.mu.Unlock()
	mu.Lock()
	types = append(types, "b")
	mu.Unlock()
	waitFor(t, "a refresh for the new type", func() bool { return spot.callCount() > calls })
	if p, src, _ := c.Price("a", "z", true); p != 0.1 || src != FromAPI {
		t.Fatalf("after a failed refresh a's price is %v (%s), want the old 0.1 from the API", p, src)
	}
	calls = spot.callCount()
	time.Sleep(50 * time.Millisecond) // b was asked about, if unsuccessfully: no retry until the hour
	if n := spot.callCount(); n != calls {
		t.Fatalf("a failed refresh was retried every tick (%d calls, want %d)", n, calls)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A job's first hosts are discovered after Run's first look, when no type is known yet: Wake
// makes Run ask for them at once, not at the next minute's look, so that a short job is
// priced.
func TestRunAsksAtOnceWhenWoken(t *testing.T) {
	spot := &fakeSpot{prices: map[string]map[string]float64{"a": {"z": 0.1}}}
	c := NewCatalog(nil, spot, nil)
	c.newTypeEvery = time.Hour
	var mu sync.Mutex
	var types []string
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx, func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(types) })
	}()
	defer func() { cancel(); <-done }()
	time.Sleep(20 * time.Millisecond) // Run's first look finds no type
	if n := spot.callCount(); n != 0 {
		t.Fatalf("%d calls with no type known", n)
	}
	mu.Lock()
	types = []string{"a"}
	mu.Unlock()
	c.Wake()
	c.Wake() // never blocks, however often
	waitFor(t, "the refresh Wake asked for", func() bool { _, _, ok := c.Price("a", "z", true); return ok })
}
