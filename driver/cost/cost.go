// Package cost prices a job's instance time: what it cost, what the same instance-hours
// would have cost on demand, and what the work rolled back after failures cost.
//
// Prices come from a price file (--prices, every cloud) and, for spot capacity on clouds
// that publish it, from the provider (providers.SpotPricer: AWS DescribeSpotPriceHistory),
// asked about hourly and cached. A price the API gives wins over the file's.
package cost

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/elasticd/elasticd/providers"
	"go.yaml.in/yaml/v3"
)

// Rate is one instance type's price per instance-hour; zero is unknown.
type Rate struct {
	OnDemand float64 `yaml:"on_demand"`
	Spot     float64 `yaml:"spot"`
}

// File is a price file:
//
//	currency: USD            # optional, USD by default; a label only
//	types:
//	  g5.12xlarge:  {on_demand: 5.672, spot: 2.03}
//	  p4d.24xlarge: {on_demand: 32.7726}
//	  a2-highgpu-1g: {on_demand: 3.67, spot: 1.47}
type File struct {
	Currency string          `yaml:"currency"`
	Types    map[string]Rate `yaml:"types"`
}

// maxRate bounds a price: no instance costs a million per hour; a bigger number is a typo.
const maxRate = 1e6

// ReadFile reads and checks a price file. Errors name the file and the entry.
func ReadFile(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f, err := ParseFile(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// ParseFile parses and checks a price file's contents.
func ParseFile(b []byte) (*File, error) {
	var f File
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)                                             // a misspelt key ("ondemand") is an error, not a silent zero
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) { // an empty file says nothing: "no prices" below
		return nil, fmt.Errorf("not a price file (want currency: and types: TYPE: {on_demand: N, spot: N}): %w", err)
	}
	f.Currency = cmp.Or(strings.TrimSpace(f.Currency), "USD")
	if len(f.Types) == 0 {
		return nil, fmt.Errorf("no prices: want types: TYPE: {on_demand: N, spot: N}")
	}
	for _, t := range slices.Sorted(maps.Keys(f.Types)) {
		r := f.Types[t]
		for _, v := range []struct {
			name string
			p    float64
		}{{"on_demand", r.OnDemand}, {"spot", r.Spot}} {
			if math.IsNaN(v.p) || v.p < 0 || v.p >= maxRate {
				return nil, fmt.Errorf("types.%s.%s: %v: want a price per instance-hour, at least 0", t, v.name, v.p)
			}
		}
		if r.OnDemand == 0 && r.Spot == 0 {
			return nil, fmt.Errorf("types.%s: neither on_demand nor spot is set", t)
		}
	}
	return &f, nil
}

// Source says where a price came from.
type Source string

const (
	FromAPI  Source = "api"  // the cloud's spot price for the host's zone
	FromFile Source = "file" // the price file
)

// Catalog answers prices from a price file and a provider's spot prices. Safe for
// concurrent use.
type Catalog struct {
	file         *File
	spot         providers.SpotPricer
	log          *slog.Logger
	mu           sync.Mutex
	api          map[[2]string][]point // (type, zone) -> the provider's spot prices, oldest first
	asked        map[string]bool       // types the provider was asked about
	last         time.Time             // the last refresh
	now          func() time.Time      // time.Now; tests set it
	newTypeEvery time.Duration         // how often Run looks for new types: newTypeEvery; tests shorten it
	wake         chan struct{}         // Wake's: the hosts changed, look for new types now
}

// NewCatalog returns a catalog over file and spot, either of which may be nil.
func NewCatalog(file *File, spot providers.SpotPricer, log *slog.Logger) *Catalog {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Catalog{file: file, spot: spot, log: log, api: map[[2]string][]point{}, asked: map[string]bool{}, now: time.Now, newTypeEvery: newTypeEvery, wake: make(chan struct{}, 1)}
}

// point is a spot price in effect from a time on.
type point struct {
	from  time.Time
	price float64
}

// maxPoints bounds a zone's price history: hourly refreshes for about six weeks.
const maxPoints = 1000

// Currency is the prices' currency.
func (c *Catalog) Currency() string {
	if c == nil || c.file == nil {
		return "USD"
	}
	return c.file.Currency
}

// Price is an instance's price per hour: of its lifecycle (spot or on-demand) in its zone.
func (c *Catalog) Price(typ, zone string, spot bool) (float64, Source, bool) {
	if c == nil {
		return 0, "", false
	}
	if spot {
		c.mu.Lock()
		h := c.api[[2]string{typ, zone}]
		c.mu.Unlock()
		if len(h) > 0 {
			return h[len(h)-1].price, FromAPI, true
		}
	}
	if c.file != nil {
		r := c.file.Types[typ]
		p := r.OnDemand
		if spot {
			p = r.Spot
		}
		if p > 0 {
			return p, FromFile, true
		}
	}
	return 0, "", false
}

// Refresh asks the provider for the spot prices of types, replacing what it said before for
// them. Without a spot pricer it does nothing.
func (c *Catalog) Refresh(ctx context.Context, types []string) error {
	if c == nil || c.spot == nil || len(types) == 0 {
		return nil
	}
	prices, err := c.spot.SpotPrices(ctx, types)
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last = now
	for _, t := range types {
		c.asked[t] = true
	}
	if err != nil {
		return err
	}
	for _, t := range types {
		for zone, p := range prices[t] {
			if !(p > 0 && p < maxRate) {
				continue
			}
			k := [2]string{t, zone}
			h := c.api[k]
			if n := len(h); n > 0 && h[n-1].price == p {
				continue
			}
			if len(h) == maxPoints {
				h = slices.Delete(h, 0, 1)
			}
			c.api[k] = append(h, point{from: now, price: p})
		}
	}
	return nil
}

// cost is what an instance cost from from to to: the provider's spot prices in turn as they
// changed (the first one also before it was read), else the file's price.
func (c *Catalog) cost(typ, zone string, spot bool, from, to time.Time) (float64, bool) {
	if !to.After(from) {
		return 0, true
	}
	if c == nil {
		return 0, false
	}
	if spot {
		c.mu.Lock()
		h := c.api[[2]string{typ, zone}]
		c.mu.Unlock()
		if len(h) > 0 {
			total := 0.0
			for i, p := range h {
				start, end := from, to
				if i > 0 && p.from.After(start) {
					start = p.from
				}
				if i+1 < len(h) && h[i+1].from.Before(end) {
					end = h[i+1].from
				}
				if end.After(start) {
					total += p.price * end.Sub(start).Hours()
				}
			}
			return total, true
		}
	}
	p, _, ok := c.Price(typ, zone, spot)
	return p * to.Sub(from).Hours(), ok
}

// RefreshEvery is how often Run asks the provider again.
const RefreshEvery = time.Hour

// newTypeEvery is how often Run looks for types it has not asked about yet (a Catalog's
// newTypeEvery, which its tests shorten).
const newTypeEvery = time.Minute

// Wake tells Run that the hosts changed: it looks for types it has not asked about at once,
// so that a job's first hosts are priced from the start, not a minute later. It never blocks.
func (c *Catalog) Wake() {
	if c == nil || c.wake == nil {
		return
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Run keeps the spot prices of the types in use (types is called at once, on each Wake, and
// each minute) up to date: every type is asked about as soon as Wake says the hosts changed
// (else within a minute of its first appearing), then all hourly. It returns when ctx ends. A failed refresh is logged and the previous prices stay; it is
// tried again at the next hourly refresh, or with the next new type.
func (c *Catalog) Run(ctx context.Context, types func() []string) {
	if c == nil || c.spot == nil {
		return
	}
	t := time.NewTicker(c.newTypeEvery)
	defer t.Stop()
	for {
		ts := types()
		c.mu.Lock()
		due := c.now().Sub(c.last) >= RefreshEvery
		for _, typ := range ts {
			due = due || !c.asked[typ]
		}
		c.mu.Unlock()
		if due && len(ts) > 0 {
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			if err := c.Refresh(rctx, ts); err != nil && ctx.Err() == nil {
				c.log.Warn("could not read spot prices; using the price file's where it has them", "err", err)
			} else if err == nil {
				c.log.Debug("spot prices refreshed", "types", ts)
			}
			cancel()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.wake:
		}
	}
}

// Stay is a time a host spent in the group; a zero To is "still there".
type Stay struct{ From, To time.Time }

// The lifecycles: the label of a host's capacity in the status and the metrics.
const (
	LifecycleSpot     = "spot"
	LifecycleOnDemand = "on-demand"
)

// Lifecycle names a host's capacity.
func Lifecycle(spot bool) string {
	if spot {
		return LifecycleSpot
	}
	return LifecycleOnDemand
}

// Usage is one host's time in the job.
type Usage struct {
	Type, Zone string
	Spot       bool
	Slots      int
	Stays      []Stay
	// RolledBackSlotSeconds is slot-seconds of work rolled back on this host, priced at the
	// host's current price.
	RolledBackSlotSeconds float64
}

// Line is the instance time of one lifecycle and type.
type Line struct {
	Lifecycle string   `json:"lifecycle"` // spot or on-demand
	Type      string   `json:"type"`
	Seconds   float64  `json:"seconds"`
	Cost      *float64 `json:"cost"` // nil when the type has no price
}

// Summary is the job's cost so far.
type Summary struct {
	Currency string  `json:"currency"`
	Total    float64 `json:"total"`     // what the priced instance time cost
	Spot     float64 `json:"spot"`      // of which spot
	OnDemand float64 `json:"on_demand"` // of which on-demand
	// OnDemandEquivalent is what the same instance-hours would cost on demand, over the
	// hours whose on-demand price is known; Savings is that minus what they cost.
	OnDemandEquivalent float64 `json:"on_demand_equivalent"`
	Savings            float64 `json:"savings"`
	SavingsPercent     float64 `json:"savings_percent"`
	// RolledBack is the cost of the work thrown away by rollbacks: each slot's share of its
	// host's price, over the seconds of work it lost.
	RolledBack float64 `json:"rolled_back"`
	Lines      []Line  `json:"instance_seconds"`
	// Unpriced lists what has no price ("TYPE (spot)"), so the totals leave it out.
	Unpriced []string `json:"unpriced"`
}

// Compute prices the usage until at.
func Compute(c *Catalog, us []Usage, at time.Time) Summary {
	s := Summary{Currency: c.Currency(), Lines: []Line{}, Unpriced: []string{}}
	lines := map[[2]string]*Line{}
	unpriced := map[string]bool{}
	for _, u := range us {
		lc := Lifecycle(u.Spot)
		typ := cmp.Or(u.Type, "unknown")
		l := lines[[2]string{lc, typ}]
		if l == nil {
			l = &Line{Lifecycle: lc, Type: typ}
			lines[[2]string{lc, typ}] = l
		}
		var cost, od float64
		priced, odPriced := true, true
		for _, st := range u.Stays {
			to := st.To
			if to.IsZero() || to.After(at) {
				to = at
			}
			if !to.After(st.From) {
				continue
			}
			l.Seconds += to.Sub(st.From).Seconds()
			v, ok := c.cost(u.Type, u.Zone, u.Spot, st.From, to)
			priced = priced && ok
			cost += v
			v, ok = c.cost(u.Type, u.Zone, false, st.From, to)
			odPriced = odPriced && ok
			od += v
		}
		if !priced {
			unpriced[fmt.Sprintf("%s (%s)", typ, lc)] = true
			continue
		}
		l.Cost = addTo(l.Cost, cost)
		s.Total += cost
		if u.Spot {
			s.Spot += cost
		} else {
			s.OnDemand += cost
		}
		if odPriced {
			s.OnDemandEquivalent += od
			s.Savings += od - cost
		} else {
			unpriced[fmt.Sprintf("%s (on-demand, for the savings)", typ)] = true
		}
		if p, _, ok := c.Price(u.Type, u.Zone, u.Spot); ok && u.Slots > 0 {
			s.RolledBack += p / float64(u.Slots) * u.RolledBackSlotSeconds / 3600
		}
	}
	if s.OnDemandEquivalent > 0 {
		s.SavingsPercent = 100 * s.Savings / s.OnDemandEquivalent
	}
	for _, k := range slices.SortedFunc(maps.Keys(lines), func(a, b [2]string) int {
		return cmp.Or(strings.Compare(a[0], b[0]), strings.Compare(a[1], b[1]))
	}) {
		s.Lines = append(s.Lines, *lines[k])
	}
	s.Unpriced = slices.Sorted(maps.Keys(unpriced))
	return s
}

func addTo(p *float64, v float64) *float64 {
	if p == nil {
		return &v
	}
	*p += v
	return p
}

// Format renders an amount: two decimals, four below 1, with the currency.
func Format(currency string, v float64) string {
	switch a := math.Abs(v); {
	case a >= 1:
		return fmt.Sprintf("%.2f %s", v, currency)
	case v > 0 && v < 0.00005:
		return fmt.Sprintf("<0.0001 %s", currency) // not nothing, but too small for 4 decimals
	default:
		return fmt.Sprintf("%.4f %s", v, currency)
	}
}
