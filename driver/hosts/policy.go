package hosts

// Slot policies (seed 002): which of the offered slots a job uses when discovery offers more
// than --max-np. They are pure functions of their input: no clock, no I/O, no randomness, so
// the same offers always give the same slots.
//
// roundrobin takes one slot from each host in turn, in the order given (the manager's
// assignment order), until n slots are taken; on each host the slot (GPU) index rotates,
// starting at Offer.First: First, First+1, … modulo the host's slot count. A host with fewer
// slots drops out of the turn when they are used up.
//
// loadaware scores each host: step time (seconds)·w1 + GPU busy (0..1)·w2 + active slots·w3;
// lower is better. Hosts are sorted by score (ties keep their order in the input), split into
// Groups contiguous groups (fastest first; group sizes differ by at most one, the faster
// groups taking the extra host), and the slots are shared between the groups so that each
// group gets (1+Gradient) times the slots of the next slower group: with five groups and the
// slowest one getting 100, the others get 110, 121, 133 and 146. Inside a group the group's
// slots are shared in proportion to the slots each host offers: 100 slots over hosts offering
// 100, 50 and 20 are 59, 29 and 12. Every share is rounded by largest remainder (ties go to
// the faster group, then the earlier host) so the totals are exact; a group whose share is
// more than its hosts offer keeps what they offer and the excess is shared again among the
// other groups by the same weights, so no host ever gets more slots than it offers. The
// slots taken on a host are its slot indices from Offer.First on, rotating, as in roundrobin.

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/elasticd/elasticd/providers"
)

// Slot policy names, the values of --slot-policy.
const (
	RoundRobin = "roundrobin"
	LoadAware  = "loadaware"
)

// Defaults of SlotPolicy (DefaultSlotPolicy).
const (
	DefaultSlotGroups   = 5
	DefaultSlotGradient = 0.1
	MaxSlotGroups       = 1000
	MaxSlotGradient     = 10
)

// Weights are the loadaware score weights, --slot-weights "steptime,busy,active".
type Weights struct {
	StepTime    float64 // per second of mean step time
	GPUBusy     float64 // per unit of GPU busy (0..1)
	ActiveSlots float64 // per active slot
}

// String formats w as --slot-weights takes it.
func (w Weights) String() string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	return f(w.StepTime) + "," + f(w.GPUBusy) + "," + f(w.ActiveSlots)
}

// ParseWeights reads --slot-weights: three non-negative numbers "steptime,busy,active".
func ParseWeights(s string) (Weights, error) {
	parts := strings.Split(s, ",")
	if len(parts) != 3 {
		return Weights{}, fmt.Errorf("--slot-weights %q: want three comma-separated numbers steptime,busy,active (e.g. 1,0.5,0)", s)
	}
	var v [3]float64
	for i, p := range parts {
		f, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
			return Weights{}, fmt.Errorf("--slot-weights %q: %q is not a non-negative number; want steptime,busy,active (e.g. 1,0.5,0)", s, p)
		}
		v[i] = f
	}
	return Weights{StepTime: v[0], GPUBusy: v[1], ActiveSlots: v[2]}, nil
}

// SlotPolicy is the slot-allocation configuration: --slot-policy, --slot-groups,
// --slot-gradient and --slot-weights. Start from DefaultSlotPolicy: a zero Name or Groups
// takes its default, but a zero Gradient or zero weights mean zero.
type SlotPolicy struct {
	Name     string  // --slot-policy: roundrobin (default) or loadaware
	Groups   int     // --slot-groups: loadaware groups, 1..1000, default 5
	Gradient float64 // --slot-gradient: loadaware, 0..10, default 0.1
	Weights  Weights // --slot-weights: loadaware score weights, default 1,0,0
}

// DefaultSlotPolicy is the configuration when no --slot-* flag is given.
func DefaultSlotPolicy() SlotPolicy {
	return SlotPolicy{Name: RoundRobin, Groups: DefaultSlotGroups, Gradient: DefaultSlotGradient, Weights: Weights{StepTime: 1}}
}

func (p SlotPolicy) withDefaults() SlotPolicy {
	p.Name = cmp.Or(p.Name, RoundRobin)
	p.Groups = cmp.Or(p.Groups, DefaultSlotGroups)
	return p
}

// Validate reports the first invalid setting, naming its flag and what it accepts.
func (p SlotPolicy) Validate() error {
	p = p.withDefaults()
	w := p.Weights
	switch {
	case p.Name != RoundRobin && p.Name != LoadAware:
		return fmt.Errorf("--slot-policy %q: want %s or %s", p.Name, RoundRobin, LoadAware)
	case p.Groups < 1 || p.Groups > MaxSlotGroups:
		return fmt.Errorf("--slot-groups %d: want a whole number from 1 to %d (default %d)", p.Groups, MaxSlotGroups, DefaultSlotGroups)
	case math.IsNaN(p.Gradient) || p.Gradient < 0 || p.Gradient > MaxSlotGradient:
		return fmt.Errorf("--slot-gradient %v: want a number from 0 to %d (default %v): each faster group gets 1+gradient times the slots of the next slower one", p.Gradient, MaxSlotGradient, DefaultSlotGradient)
	}
	for _, v := range []float64{w.StepTime, w.GPUBusy, w.ActiveSlots} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return fmt.Errorf("--slot-weights %s: every weight must be a non-negative number", w)
		}
	}
	if p.Name == LoadAware && w.StepTime == 0 && w.GPUBusy == 0 && w.ActiveSlots == 0 {
		return fmt.Errorf("--slot-weights %s: with --slot-policy %s at least one weight must be positive", w, LoadAware)
	}
	return nil
}

// Load is what loadaware knows about a host; the zero Load (nothing measured yet, a new
// host) scores 0, the best score, so new hosts get work and thereby measurements.
type Load struct {
	StepTime    time.Duration // mean step time of the job's workers on the host
	GPUBusy     float64       // mean busy fraction of the host's GPUs, 0..1
	ActiveSlots int           // slots on the host already busy (other work)
}

// Offer is one host's slots offered to the job.
type Offer struct {
	Host  string // providers.Host.ID
	Slots int    // slot (GPU) indices 0..Slots-1 are offered
	First int    // the slot index to start from, taken modulo Slots (rotation between calls)
	Load  Load   // loadaware only
}

// Offers makes offers from the manager's usable hosts (Manager.Usable, in assignment order)
// and the load measured per host ID (may be nil), starting every host at slot 0.
func Offers(hosts []providers.Host, load map[string]Load) []Offer {
	out := make([]Offer, 0, len(hosts))
	for _, h := range hosts {
		out = append(out, Offer{Host: h.ID, Slots: h.Slots, Load: load[h.ID]})
	}
	return out
}

// Allocate chooses n of the offered slots with policy p and returns, for each offer in
// order, the slot indices to use (empty when the host gets none). When the offers hold n
// slots or fewer, all are used. It fails when p is invalid, n is negative, or an offer has a
// negative slot count.
func Allocate(p SlotPolicy, offers []Offer, n int) ([][]int, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	p = p.withDefaults()
	if n < 0 {
		return nil, fmt.Errorf("allocate %d slots: the number of slots must not be negative", n)
	}
	total := 0
	for _, o := range offers {
		if o.Slots < 0 {
			return nil, fmt.Errorf("offer of host %q: %d slots: must not be negative", o.Host, o.Slots)
		}
		total += o.Slots
	}
	counts := make([]int, len(offers))
	switch {
	case total <= n:
		for i, o := range offers {
			counts[i] = o.Slots
		}
	case p.Name == LoadAware:
		counts = loadAware(p, offers, n)
	default:
		counts = roundRobin(offers, n)
	}
	out := make([][]int, len(offers))
	for i, o := range offers {
		out[i] = make([]int, counts[i])
		first := 0
		if o.Slots > 0 {
			first = ((o.First % o.Slots) + o.Slots) % o.Slots
		}
		for k := range counts[i] {
			out[i][k] = (first + k) % o.Slots
		}
	}
	return out, nil
}

// roundRobin gives one slot per host per turn until n are given (n < the total offered).
func roundRobin(offers []Offer, n int) []int {
	counts := make([]int, len(offers))
	for n > 0 {
		for i, o := range offers {
			if n > 0 && counts[i] < o.Slots {
				counts[i]++
				n--
			}
		}
	}
	return counts
}

// loadAware shares n (< the total offered) slots as the file comment says.
func loadAware(p SlotPolicy, offers []Offer, n int) []int {
	score := func(o Offer) float64 {
		l := o.Load
		return l.StepTime.Seconds()*p.Weights.StepTime + l.GPUBusy*p.Weights.GPUBusy + float64(l.ActiveSlots)*p.Weights.ActiveSlots
	}
	var order []int // offers with slots, best score first, ties in input order
	for i, o := range offers {
		if o.Slots > 0 {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(score(offers[a]), score(offers[b])) })

	g := min(p.Groups, len(order))
	groups := make([][]int, g) // each a list of offer indices
	at := 0
	for k := range g {
		size := len(order) / g
		if k < len(order)%g {
			size++
		}
		groups[k] = order[at : at+size]
		at += size
	}
	weights := make([]float64, g) // the slowest group has weight 1
	capacity := make([]int, g)
	for k, grp := range groups {
		weights[k] = math.Pow(1+p.Gradient, float64(g-1-k))
		for _, i := range grp {
			capacity[k] += offers[i].Slots
		}
	}
	counts := make([]int, len(offers))
	for k, share := range shareCapped(n, weights, capacity) {
		inner := make([]float64, len(groups[k]))
		innerCap := make([]int, len(groups[k]))
		for j, i := range groups[k] {
			inner[j], innerCap[j] = float64(offers[i].Slots), offers[i].Slots
		}
		for j, c := range shareCapped(share, inner, innerCap) {
			counts[groups[k][j]] = c
		}
	}
	return counts
}

// shareCapped splits n (<= the sum of capacity) in proportion to weights, rounding by largest
// remainder (ties to the lower index), with no part above its capacity: a part whose share
// exceeds its capacity is fixed at its capacity and the rest is shared again among the
// others, until every share fits.
func shareCapped(n int, weights []float64, capacity []int) []int {
	out := make([]int, len(weights))
	fixed := make([]bool, len(weights))
	for n > 0 {
		var open []int
		for i := range weights {
			if !fixed[i] {
				open = append(open, i)
			}
		}
		if len(open) == 0 {
			break
		}
		w := make([]float64, len(open))
		for j, i := range open {
			w[j] = weights[i]
		}
		share := largestRemainder(n, w)
		over := false
		for j, i := range open {
			if share[j] >= capacity[i] {
				out[i], fixed[i], over = capacity[i], true, true
				n -= capacity[i]
			}
		}
		if !over {
			for j, i := range open {
				out[i] = share[j]
			}
			break
		}
	}
	return out
}

// largestRemainder splits n in proportion to w exactly: floors first, then one more to the
// parts with the largest fractional remainders (ties to the lower index). All-zero weights
// share equally.
func largestRemainder(n int, w []float64) []int {
	sum := 0.0
	for _, v := range w {
		sum += v
	}
	if sum <= 0 {
		w = slices.Repeat([]float64{1}, len(w))
		sum = float64(len(w))
	}
	out := make([]int, len(w))
	rem := make([]float64, len(w))
	left := n
	for i, v := range w {
		exact := float64(n) * v / sum
		out[i] = int(math.Floor(exact + 1e-9))
		rem[i] = exact - float64(out[i])
		left -= out[i]
	}
	idx := make([]int, len(w))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(rem[b], rem[a]) })
	for k := 0; left > 0 && len(idx) > 0; k = (k + 1) % len(idx) {
		out[idx[k]]++
		left--
	}
	return out
}
