package hosts_test

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/hosts"
	"github.com/elasticd/elasticd/providers"
)

func counts(slots [][]int) []int {
	out := make([]int, len(slots))
	for i, s := range slots {
		out[i] = len(s)
	}
	return out
}

func loadAware(groups int, gradient float64) hosts.SlotPolicy {
	p := hosts.DefaultSlotPolicy()
	p.Name, p.Groups, p.Gradient = hosts.LoadAware, groups, gradient
	return p
}

// stepTimes gives host i a step time of times[i] milliseconds.
func stepTimes(slots []int, times []int) []hosts.Offer {
	var out []hosts.Offer
	for i, s := range slots {
		out = append(out, hosts.Offer{Host: fmt.Sprintf("h%d", i), Slots: s, Load: hosts.Load{StepTime: time.Duration(times[i]) * time.Millisecond}})
	}
	return out
}

// The seed's own numbers: five groups, the slowest gets 100 → 110, 121, 133, 146.
func TestLoadAwareGroupGradientSeedVector(t *testing.T) {
	// One host per group; input order scrambled, step times decide the groups.
	offers := stepTimes([]int{500, 500, 500, 500, 500}, []int{30, 10, 50, 20, 40})
	got, err := hosts.Allocate(loadAware(5, 0.1), offers, 100+110+121+133+146)
	if err != nil {
		t.Fatal(err)
	}
	// h1 fastest (G1) … h2 slowest (G5).
	want := []int{121, 146, 100, 133, 110}
	if c := counts(got); !reflect.DeepEqual(c, want) {
		t.Fatalf("slots per host = %v, want %v (G1 146, G2 133, G3 121, G4 110, G5 100)", c, want)
	}
}

// The seed's own numbers: 100 slots inside a group over usable 100/50/20 → 59/29/12.
func TestLoadAwareInsideGroupSeedVector(t *testing.T) {
	offers := stepTimes([]int{100, 50, 20}, []int{10, 10, 10})
	got, err := hosts.Allocate(loadAware(1, 0.1), offers, 100)
	if err != nil {
		t.Fatal(err)
	}
	if c := counts(got); !reflect.DeepEqual(c, []int{59, 29, 12}) {
		t.Fatalf("slots per host = %v, want [59 29 12]", c)
	}
}

func TestLoadAwareRedistributesWhatAHostCannotTake(t *testing.T) {
	// The fastest group offers only 2 slots; its share (of 10 at gradient 1: 5 of 7.5…) is
	// more, so the rest goes to the slower groups.
	offers := stepTimes([]int{2, 100, 100}, []int{1, 2, 3})
	got, err := hosts.Allocate(loadAware(3, 1), offers, 30)
	if err != nil {
		t.Fatal(err)
	}
	// Weights 4:2:1 of 30 → 17.1, 8.6, 4.3: h0 keeps 2, the other 28 split 2:1 → 19, 9.
	if c := counts(got); !reflect.DeepEqual(c, []int{2, 19, 9}) {
		t.Fatalf("slots per host = %v, want [2 19 9]", c)
	}
}

func TestRoundRobinOneSlotPerHostInTurn(t *testing.T) {
	p := hosts.DefaultSlotPolicy()
	offers := []hosts.Offer{{Host: "a", Slots: 4, First: 2}, {Host: "b", Slots: 1}, {Host: "c", Slots: 3, First: 7}, {Host: "d", Slots: 0}}
	got, err := hosts.Allocate(p, offers, 6)
	if err != nil {
		t.Fatal(err)
	}
	// Turns: a b c | a c | a → a gets 3 (from 2: 2,3,0), b 1, c 2 (from 7%3=1: 1,2).
	want := [][]int{{2, 3, 0}, {0}, {1, 2}, {}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Allocate = %v, want %v", got, want)
	}
}

func TestAllocateTakesEverythingWhenNotOverOffered(t *testing.T) {
	for _, name := range []string{hosts.RoundRobin, hosts.LoadAware} {
		p := hosts.DefaultSlotPolicy()
		p.Name = name
		got, err := hosts.Allocate(p, []hosts.Offer{{Host: "a", Slots: 2}, {Host: "b", Slots: 1}}, 5)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, [][]int{{0, 1}, {0}}) {
			t.Fatalf("%s: %v", name, got)
		}
	}
}

// Random offers: totals are exact, no host gets more than it offers, no slot twice, and the
// answer does not depend on anything but the input (ties included).
func TestAllocateInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for iter := range 500 {
		nHosts := rng.IntN(12)
		var offers []hosts.Offer
		total := 0
		for i := range nHosts {
			o := hosts.Offer{Host: fmt.Sprintf("h%d", i), Slots: rng.IntN(9), First: rng.IntN(20) - 5,
				Load: hosts.Load{StepTime: time.Duration(rng.IntN(4)) * time.Millisecond, GPUBusy: float64(rng.IntN(3)) / 2, ActiveSlots: rng.IntN(3)}}
			total += o.Slots
			offers = append(offers, o)
		}
		n := rng.IntN(total + 3)
		p := loadAware(1+rng.IntN(6), float64(rng.IntN(30))/10)
		p.Weights = hosts.Weights{StepTime: 1000, GPUBusy: 1, ActiveSlots: 0.5}
		if iter%2 == 0 {
			p.Name = hosts.RoundRobin
		}
		got, err := hosts.Allocate(p, offers, n)
		if err != nil {
			t.Fatal(err)
		}
		again, _ := hosts.Allocate(p, offers, n)
		if !reflect.DeepEqual(got, again) {
			t.Fatalf("not deterministic: %v then %v", got, again)
		}
		sum := 0
		for i, s := range got {
			seen := map[int]bool{}
			for _, x := range s {
				if x < 0 || x >= offers[i].Slots || seen[x] {
					t.Fatalf("iter %d (%s): host %d offering %d slots got %v", iter, p.Name, i, offers[i].Slots, s)
				}
				seen[x] = true
			}
			sum += len(s)
		}
		if want := min(n, total); sum != want {
			t.Fatalf("iter %d (%s): %d slots allocated, want %d (offers %+v)", iter, p.Name, sum, want, offers)
		}
	}
}

func TestSlotPolicyValidateNamesTheFlag(t *testing.T) {
	base := hosts.DefaultSlotPolicy()
	if err := base.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if err := (hosts.SlotPolicy{}).Validate(); err != nil {
		t.Fatalf("zero value: %v", err)
	}
	tests := []struct {
		name  string
		tweak func(*hosts.SlotPolicy)
		want  []string
	}{
		{"policy", func(p *hosts.SlotPolicy) { p.Name = "random" }, []string{"--slot-policy", "roundrobin", "loadaware"}},
		{"groups", func(p *hosts.SlotPolicy) { p.Groups = -1 }, []string{"--slot-groups", "from 1 to"}},
		{"gradient", func(p *hosts.SlotPolicy) { p.Gradient = -0.5 }, []string{"--slot-gradient", "from 0 to"}},
		{"weights", func(p *hosts.SlotPolicy) { p.Weights.GPUBusy = -1 }, []string{"--slot-weights", "non-negative"}},
		{"zero weights", func(p *hosts.SlotPolicy) { p.Name, p.Weights = hosts.LoadAware, hosts.Weights{} }, []string{"--slot-weights", "positive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := base
			tt.tweak(&p)
			err := p.Validate()
			if err == nil {
				t.Fatal("Validate accepted it")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if _, aerr := hosts.Allocate(p, nil, 1); aerr == nil {
				t.Error("Allocate accepted the invalid policy")
			}
		})
	}
}

func TestParseWeights(t *testing.T) {
	w, err := hosts.ParseWeights("1, 0.5,0")
	if err != nil || w != (hosts.Weights{StepTime: 1, GPUBusy: 0.5}) {
		t.Fatalf("ParseWeights = %+v, %v", w, err)
	}
	if back, _ := hosts.ParseWeights(w.String()); back != w {
		t.Fatalf("String %q does not parse back: %+v", w, back)
	}
	for _, bad := range []string{"", "1,2", "1,x,0", "1,-1,0", "1,2,3,4", "NaN,0,0"} {
		if _, err := hosts.ParseWeights(bad); err == nil || !strings.Contains(err.Error(), "--slot-weights") {
			t.Errorf("ParseWeights(%q) = %v, want an error naming --slot-weights", bad, err)
		}
	}
}

func TestOffersFromUsableHosts(t *testing.T) {
	hs := []providers.Host{{ID: "a", Slots: 2}, {ID: "b", Slots: 4}}
	got := hosts.Offers(hs, map[string]hosts.Load{"b": {GPUBusy: 0.5}})
	want := []hosts.Offer{{Host: "a", Slots: 2}, {Host: "b", Slots: 4, Load: hosts.Load{GPUBusy: 0.5}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Offers = %+v, want %+v", got, want)
	}
}
