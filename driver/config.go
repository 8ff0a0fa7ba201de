// Package driver is the job controller of `elasticd run`: it turns discovered hosts into
// generations of ranked workers, launches and watches them, and resets the job when workers
// fail or hosts come and go, through a pure state machine (Machine) and its I/O (Driver).
package driver

import (
	"fmt"
	"time"

	"github.com/elasticd/elasticd/driver/hosts"
)

// Config holds the job settings the state machine needs. Every field maps to an
// `elasticd run` flag of the same name.
type Config struct {
	NP, MinNP, MaxNP int           // -np, --min-np (default NP), --max-np (default NP)
	ResetLimit       int           // --reset-limit: resets caused by failures before giving up; 0 = unlimited
	ElasticTimeout   time.Duration // --elastic-timeout: how long fewer than --min-np slots are tolerated
	StartTimeout     time.Duration // --start-timeout: a launched worker must register within it
	BarrierTimeout   time.Duration // --barrier-timeout: once a reset starts, every worker must reach it within it
	CooldownMin      time.Duration // --blacklist-cooldown-range MIN (0: hosts.DefaultCooldownMin)
	CooldownMax      time.Duration // --blacklist-cooldown-range MAX (0: hosts.DefaultCooldownMax)
	CooldownDecay    time.Duration // a slot without failure this long has its failure count halved (0: hosts.DefaultDecayAfter)
	// FlapWindow (--flap-window) and FlapLimit (--flap-limit): a slot that fails within
	// FlapWindow of coming back (after a failure of its own) is flapping; after FlapLimit such
	// returns in a row it is quarantined: out of the job until an operator brings its host
	// back (elasticd ctl add-host). Its flapping failures do not count toward --reset-limit.
	// 0: the defaults.
	FlapWindow time.Duration
	FlapLimit  int
	// CheckpointDir (--checkpoint-dir) is where rank 0 writes its commit every
	// CheckpointEvery (--checkpoint-every, 0: protocol.DefaultCheckpointEvery) commits. With it, losing every worker at
	// once is not the end of an in-process job: the slots that come back within
	// --elastic-timeout are launched again and resume from the newest valid checkpoint.
	CheckpointDir   string
	CheckpointEvery int
	// Mode (--mode) is how workers recover from a change of membership; "" is ModeAuto.
	Mode Mode
	// ScaleUpInterval (--scale-up-interval): in restart mode, a whole-group restart to grow
	// the job happens at most this long after the generation started, so that hosts arriving
	// one by one join in one restart (failures and notices restart at once). 0: the default.
	ScaleUpInterval time.Duration
	// SlotPolicy (--slot-policy and its --slot-* settings) chooses the new slots of a
	// generation when more are usable than --max-np allows; nil: packed, in the host
	// manager's order (each host filled before the next, as horovodrun does).
	SlotPolicy *hosts.SlotPolicy
	// Capacity (--manage-capacity), when set, steers the group's size (fleet.go); nil: the
	// driver never changes the group.
	Capacity *CapacityConfig
}

// Mode is how a job's workers recover when membership changes (docs/pytorch.md).
type Mode string

const (
	// ModeAuto is in-process as soon as any worker registers with the rendezvous (workers
	// built on worker/ or the Python package elasticd.torch do, at start), and restart until
	// then: a script that never talks to elasticd (torchrun-style) is restarted.
	ModeAuto Mode = "auto"
	// ModeRestart stops the whole group on any change of membership and launches every slot
	// into the next generation, with torchrun's environment; the script resumes from its own
	// checkpoint. Workers are never failed for not registering.
	ModeRestart Mode = "restart"
	// ModeInProcess keeps the survivors' processes: they restore their last in-memory commit
	// and reset to the next generation. A worker that does not register within
	// --start-timeout has failed.
	ModeInProcess Mode = "inprocess"
)

// ParseMode reads a --mode value ("in-process" is accepted for "inprocess").
func ParseMode(s string) (Mode, error) {
	switch s {
	case "", "auto":
		return ModeAuto, nil
	case "restart":
		return ModeRestart, nil
	case "inprocess", "in-process":
		return ModeInProcess, nil
	}
	return "", fmt.Errorf("--mode %q: use auto, restart or inprocess", s)
}

// Defaults, also in `elasticd run --help` and docs/operations.md.
const (
	DefaultElasticTimeout = 10 * time.Minute
	DefaultStartTimeout   = 2 * time.Minute
	DefaultFlapWindow     = time.Minute
	DefaultFlapLimit      = 3
	DefaultBarrierTimeout = time.Minute
	// DefaultScaleUpInterval is torchrun's last-call wait: hosts that arrive within it of
	// each other join in one restart.
	DefaultScaleUpInterval = 30 * time.Second
)

func (c Config) withDefaults() Config {
	if c.MinNP == 0 {
		c.MinNP = c.NP
	}
	if c.MaxNP == 0 {
		c.MaxNP = c.NP
	}
	if c.ElasticTimeout == 0 {
		c.ElasticTimeout = DefaultElasticTimeout
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = DefaultStartTimeout
	}
	if c.BarrierTimeout == 0 {
		c.BarrierTimeout = DefaultBarrierTimeout
	}
	if c.Mode == "" {
		c.Mode = ModeAuto
	}
	if c.ScaleUpInterval == 0 {
		c.ScaleUpInterval = DefaultScaleUpInterval
	}
	if c.FlapWindow == 0 {
		c.FlapWindow = DefaultFlapWindow
	}
	if c.FlapLimit == 0 {
		c.FlapLimit = DefaultFlapLimit
	}
	return c
}

// Validate reports the first invalid setting, naming its flag.
func (c Config) Validate() error {
	d := c.withDefaults()
	switch {
	case c.NP < 1:
		return fmt.Errorf("-np %d: must be at least 1", c.NP)
	case c.MinNP < 0 || d.MinNP > c.NP:
		return fmt.Errorf("--min-np %d: must be between 1 and -np (%d)", c.MinNP, c.NP)
	case c.MaxNP < 0 || d.MaxNP < c.NP:
		return fmt.Errorf("--max-np %d: must be at least -np (%d)", c.MaxNP, c.NP)
	case c.ResetLimit < 0:
		return fmt.Errorf("--reset-limit %d: must be 0 (unlimited) or more", c.ResetLimit)
	case c.ElasticTimeout < 0:
		return fmt.Errorf("--elastic-timeout %v: must be positive", c.ElasticTimeout)
	case c.StartTimeout < 0:
		return fmt.Errorf("--start-timeout %v: must be positive", c.StartTimeout)
	case c.BarrierTimeout < 0:
		return fmt.Errorf("--barrier-timeout %v: must be positive", c.BarrierTimeout)
	case c.ScaleUpInterval < 0:
		return fmt.Errorf("--scale-up-interval %v: must be positive", c.ScaleUpInterval)
	case c.FlapWindow < 0:
		return fmt.Errorf("--flap-window %v: must be positive", c.FlapWindow)
	case c.FlapLimit < 0:
		return fmt.Errorf("--flap-limit %d: must be at least 1", c.FlapLimit)
	case c.CheckpointEvery < 0:
		return fmt.Errorf("--checkpoint-every %d: must be at least 1", c.CheckpointEvery)
	}
	if _, err := ParseMode(string(c.Mode)); err != nil {
		return err
	}
	if c.Capacity != nil && (c.Capacity.Group == "" || c.Capacity.SlotsPerHost < 0 || c.Capacity.CheckEvery < 0 || c.Capacity.ReplacePerHour < 0) {
		return fmt.Errorf("--manage-capacity: the group's name is required, and its settings must not be negative")
	}
	if c.SlotPolicy != nil {
		if err := c.SlotPolicy.Validate(); err != nil {
			return err
		}
	}
	// The host manager owns the cooldown settings, their defaults and their limits.
	if err := c.hostsConfig().Validate(); err != nil {
		return fmt.Errorf("--blacklist-cooldown-range %v,%v: %w", c.CooldownMin, c.CooldownMax, err)
	}
	return nil
}

func (c Config) hostsConfig() hosts.Config {
	return hosts.Config{CooldownMin: c.CooldownMin, CooldownMax: c.CooldownMax, DecayAfter: c.CooldownDecay}
}
