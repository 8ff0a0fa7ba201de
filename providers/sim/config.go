package sim

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/elasticd/elasticd/providers"
)

// Defaults of the Config fields left zero.
const (
	DefaultLaunchDelay      = time.Second
	DefaultInterruptWarning = 30 * time.Second
	DefaultTerminateGrace   = 5 * time.Second
	DefaultLaunchRetry      = 5 * time.Second
	DefaultZone             = "sim-zone-a"
	DefaultCurrency         = "USD"
)

// Unlimited is Config.SpotCapacity (and SetSpotCapacity's n) for a cloud whose spot capacity
// never runs out; any negative number means the same.
const Unlimited = -1

// MaxInstances is how many instances the cloud holds at once: one per loopback address
// 127.0.0.2 … 127.0.0.254. A launch beyond it fails as a subnet out of addresses does.
const MaxInstances = 253

// maxFailures bounds the launch failures each group remembers: a group short of capacity for
// hours fails an attempt every LaunchRetry, and a real cloud forgets old activities too.
const maxFailures = 50

// Config is a simulated cloud: its groups, its prices, the program its instances run, and what
// happens to it over time.
type Config struct {
	// Groups are the cloud's autoscaling groups (at least one), each named uniquely.
	Groups []GroupConfig
	// Prices per instance type, per instance-hour, in Currency; a type without one is unpriced.
	// The spot prices are what each group's SpotPrices answers; PriceFile renders them all.
	Prices map[string]Price
	// Currency labels Prices; empty: DefaultCurrency.
	Currency string

	// Agent is the command an instance runs once it has booted, in real use
	// {"/path/to/elasticd", "agent"}. The cloud appends --driver DriverURL --agent-secret-file
	// SecretFile --host-id ID --addr 127.0.0.N --slots S --metadata none. Required.
	Agent []string
	// Env is added to each instance's environment (which is otherwise the cloud's own), as
	// KEY=VALUE: CUDA_VISIBLE_DEVICES= for a CPU-only job, say.
	Env []string
	// DriverURL is the driver the agents connect to (its --listen address as a URL). Required.
	DriverURL string
	// SecretFile holds the secret the driver and its agents share. Required.
	SecretFile string
	// Output receives the instances' stdout and stderr, each line prefixed "[ID] "; nil
	// discards it.
	Output io.Writer

	// SpotCapacity is how many spot instances the cloud can run, across every spot group; a
	// negative number (Unlimited): no limit. Zero means no spot capacity at all.
	SpotCapacity int
	// LaunchDelay is how long an instance boots before its process starts; 0: the default.
	LaunchDelay time.Duration
	// InterruptWarning is the notice before a spot instance is reclaimed; 0: the default
	// (AWS gives two minutes, GCP 30 seconds).
	InterruptWarning time.Duration
	// TerminateGrace is the time between SIGTERM and SIGKILL when the group terminates an
	// instance (a scale-in, a replacement, Close); 0: the default.
	TerminateGrace time.Duration
	// LaunchRetry is how long a group waits after a failed launch before it tries again; 0:
	// the default.
	LaunchRetry time.Duration
	// LifecycleHook, when positive, holds an instance the group terminates (a scale-in, a
	// replacement) until its ScaleIn notice is completed or this long has passed, as an AWS
	// terminate lifecycle hook does; it is listed as Leaving meanwhile. 0: no hook.
	LifecycleHook time.Duration

	// Scenario is what happens to the cloud over time (see ParseScenario), run in order at
	// each step's offset from Start.
	Scenario []Step

	// Logger receives the cloud's events (launches, notices, reclaims, failures); nil discards.
	Logger *slog.Logger
}

// GroupConfig is one autoscaling group.
type GroupConfig struct {
	// Name names the group ("spot", "ondemand"): 1 to 32 lowercase letters, digits and dashes.
	// It is part of each instance's ID ("sim-spot-0001").
	Name string
	// Spot is true for a group of spot instances, which SpotCapacity limits and reclaims.
	Spot bool
	// Type is the instance type (a key of Config.Prices); empty: "sim.gpu" and the slot count.
	Type string
	// Zone is where the group's instances run; empty: DefaultZone.
	Zone string
	// Slots is the workers each instance runs (--slots of its agent); 0: 1.
	Slots int
	// Min, Max and Desired are the group's size as a cloud holds it: 0 <= Min <= Desired <= Max,
	// and Max at least 1.
	Min, Max, Desired int
}

// Price is an instance type's price per instance-hour; zero is unknown.
type Price struct {
	OnDemand float64
	Spot     float64
}

var groupName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// Validate reports the first thing wrong with c and what to do about it. It starts nothing.
func (c Config) Validate() error {
	if len(c.Groups) == 0 {
		return errors.New("sim: no groups: want at least one, e.g. {Name: \"spot\", Spot: true, Max: 4, Desired: 2}")
	}
	seen := map[string]bool{}
	for i, g := range c.Groups {
		if err := g.validate(); err != nil {
			return fmt.Errorf("sim: group %d: %w", i+1, err)
		}
		if seen[g.Name] {
			return fmt.Errorf("sim: group %q is configured twice: give each group its own name", g.Name)
		}
		seen[g.Name] = true
	}
	if total := c.totalMax(); total > MaxInstances {
		return fmt.Errorf("sim: the groups' maximums add up to %d instances; the cloud holds at most %d (one per address 127.0.0.2 … 127.0.0.254)", total, MaxInstances)
	}
	for _, t := range slices.Sorted(maps.Keys(c.Prices)) {
		p := c.Prices[t]
		for _, v := range []struct {
			name string
			p    float64
		}{{"on-demand", p.OnDemand}, {"spot", p.Spot}} {
			if math.IsNaN(v.p) || math.IsInf(v.p, 0) || v.p < 0 {
				return fmt.Errorf("sim: the %s price of %q is %v: want a price per instance-hour, at least 0 (0: unknown)", v.name, t, v.p)
			}
		}
	}
	if len(c.Agent) == 0 || c.Agent[0] == "" {
		return errors.New("sim: no agent command: set Agent to the program each instance runs, e.g. {\"/usr/local/bin/elasticd\", \"agent\"}")
	}
	if u, err := url.Parse(c.DriverURL); c.DriverURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("sim: driver URL %q: want the driver's address as an http URL, e.g. http://127.0.0.1:29400", c.DriverURL)
	}
	if c.SecretFile == "" {
		return errors.New("sim: no secret file: set SecretFile to the file holding the secret the driver and its agents share")
	}
	for _, e := range c.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("sim: environment entry %q: want KEY=VALUE", e)
		}
	}
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"launch delay", c.LaunchDelay}, {"interrupt warning", c.InterruptWarning}, {"terminate grace", c.TerminateGrace},
		{"launch retry", c.LaunchRetry}, {"lifecycle hook", c.LifecycleHook}} {
		if d.d < 0 {
			return fmt.Errorf("sim: %s %v: must not be negative (0: the default)", d.name, d.d)
		}
	}
	for i, s := range c.Scenario {
		if i > 0 && s.After < c.Scenario[i-1].After {
			return fmt.Errorf("sim: scenario %s: at %v, before the step before it (%v): steps run in order, so sort them", s.where(), s.After, c.Scenario[i-1].After)
		}
		if err := c.checkStep(s); err != nil {
			return fmt.Errorf("sim: scenario %s: %w", s.where(), err)
		}
	}
	return nil
}

func (g GroupConfig) validate() error {
	switch {
	case !groupName.MatchString(g.Name):
		return fmt.Errorf("name %q: want 1 to 32 lowercase letters, digits and dashes, such as \"spot\" or \"ondemand\"", g.Name)
	case strings.ContainsAny(g.Type, " \t\r\n"):
		return fmt.Errorf("group %q: instance type %q: want a name without spaces, such as \"sim.gpu2\"", g.Name, g.Type)
	case strings.ContainsAny(g.Zone, " \t\r\n"):
		return fmt.Errorf("group %q: zone %q: want a name without spaces, such as %q", g.Name, g.Zone, DefaultZone)
	case g.Slots < 0 || g.Slots > providers.MaxSlots:
		return fmt.Errorf("group %q: %d slots per instance: want 1 to %d (0: 1)", g.Name, g.Slots, providers.MaxSlots)
	case g.Max < 1:
		return fmt.Errorf("group %q: max %d: want at least 1", g.Name, g.Max)
	case g.Min < 0 || g.Min > g.Desired || g.Desired > g.Max:
		return fmt.Errorf("group %q: min %d, desired %d, max %d: want 0 <= min <= desired <= max", g.Name, g.Min, g.Desired, g.Max)
	}
	return nil
}

func (c Config) totalMax() int {
	n := 0
	for _, g := range c.Groups {
		n += g.Max
	}
	return n
}

// group returns the configured group called name.
func (c Config) group(name string) (GroupConfig, bool) {
	i := slices.IndexFunc(c.Groups, func(g GroupConfig) bool { return g.Name == name })
	if i < 0 {
		return GroupConfig{}, false
	}
	return c.Groups[i], true
}

func (c Config) groupNames() string {
	names := make([]string, len(c.Groups))
	for i, g := range c.Groups {
		names[i] = fmt.Sprintf("%q", g.Name)
	}
	return strings.Join(names, ", ")
}

// checkStep checks that a step names what the cloud has.
func (c Config) checkStep(s Step) error {
	switch s.Action {
	case ActionInterrupt, ActionVanish:
		if _, ok := c.group(s.Target); ok {
			return nil
		}
		if g, ok := instanceGroup(s.Target); ok {
			if _, ok := c.group(g); ok {
				return nil
			}
		}
		return fmt.Errorf("%s %q: no such group or instance: want one of the groups %s, or an instance ID such as sim-%s-0001", s.Action, s.Target, c.groupNames(), c.Groups[0].Name)
	case ActionDesired:
		g, ok := c.group(s.Target)
		if !ok {
			return fmt.Errorf("desired %q: no such group: want one of %s", s.Target, c.groupNames())
		}
		if s.N > g.Max {
			return fmt.Errorf("desired %s %d: above the group's max %d", s.Target, s.N, g.Max)
		}
	}
	return nil
}

// withDefaults fills the zero fields.
func (c Config) withDefaults() Config {
	c.Groups = slices.Clone(c.Groups)
	for i := range c.Groups {
		g := &c.Groups[i]
		g.Slots = cmp.Or(g.Slots, 1)
		g.Zone = cmp.Or(g.Zone, DefaultZone)
		g.Type = cmp.Or(g.Type, fmt.Sprintf("sim.gpu%d", g.Slots))
	}
	c.Prices = maps.Clone(c.Prices)
	c.Currency = cmp.Or(c.Currency, DefaultCurrency)
	c.Agent = slices.Clone(c.Agent)
	c.Env = slices.Clone(c.Env)
	c.LaunchDelay = cmp.Or(c.LaunchDelay, DefaultLaunchDelay)
	c.InterruptWarning = cmp.Or(c.InterruptWarning, DefaultInterruptWarning)
	c.TerminateGrace = cmp.Or(c.TerminateGrace, DefaultTerminateGrace)
	c.LaunchRetry = cmp.Or(c.LaunchRetry, DefaultLaunchRetry)
	c.Scenario = slices.Clone(c.Scenario)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Logger = c.Logger.With("provider", "sim")
	return c
}

// PriceFile renders c's prices as a price file for the driver's cost accounting (elasticd run
// --prices), so that the report prices the simulated instances as the cloud does.
func (c Config) PriceFile() string {
	var b strings.Builder
	fmt.Fprintf(&b, "currency: %s\ntypes:\n", cmp.Or(c.Currency, DefaultCurrency))
	for _, t := range slices.Sorted(maps.Keys(c.Prices)) {
		p := c.Prices[t]
		var parts []string
		if p.OnDemand > 0 {
			parts = append(parts, fmt.Sprintf("on_demand: %g", p.OnDemand))
		}
		if p.Spot > 0 {
			parts = append(parts, fmt.Sprintf("spot: %g", p.Spot))
		}
		if len(parts) > 0 {
			fmt.Fprintf(&b, "  %q: {%s}\n", t, strings.Join(parts, ", "))
		}
	}
	return b.String()
}
