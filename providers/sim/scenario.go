package sim

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Action is what a scenario step does to the cloud.
type Action string

const (
	// ActionSpotCapacity sets the cloud's spot capacity (SetSpotCapacity): N, or Unlimited.
	ActionSpotCapacity Action = "spot-capacity"
	// ActionInterrupt gives one instance an interruption notice (Interrupt): Target is a group
	// (its newest running instance without a notice) or an instance ID; Warning, when
	// positive, overrides Config.InterruptWarning.
	ActionInterrupt Action = "interrupt"
	// ActionVanish kills one instance with no notice (Vanish): Target as for ActionInterrupt.
	ActionVanish Action = "vanish"
	// ActionDesired sets group Target's desired size to N, as a person or another autoscaler
	// would; a desired size below the group's minimum lowers it.
	ActionDesired Action = "desired"
	// ActionOutage makes every call of the groups' providers fail while On (SetOutage).
	ActionOutage Action = "outage"
	// ActionDeny refuses the providers' mutating calls while On (SetDenied).
	ActionDeny Action = "deny"
	// ActionStall makes the providers' calls hang until their context ends while On
	// (SetStalled).
	ActionStall Action = "stall"
)

// Step is one timed event of a scenario.
type Step struct {
	// After is when the step runs, from Start.
	After  time.Duration
	Action Action
	// Target is the group or instance an interrupt, vanish or desired step acts on.
	Target string
	// N is the spot capacity (Unlimited: no limit) or the desired size.
	N int
	// Warning is an interrupt's notice; 0: Config.InterruptWarning.
	Warning time.Duration
	// On switches an outage, deny or stall step's condition on or off.
	On bool
	// Line is the step's line in the scenario file, for messages; 0 when not parsed.
	Line int
}

func (s Step) String() string {
	var arg string
	switch s.Action {
	case ActionSpotCapacity:
		arg = strconv.Itoa(s.N)
		if s.N < 0 {
			arg = "unlimited"
		}
	case ActionInterrupt:
		arg = s.Target
		if s.Warning > 0 {
			arg += " " + s.Warning.String()
		}
	case ActionVanish:
		arg = s.Target
	case ActionDesired:
		arg = s.Target + " " + strconv.Itoa(s.N)
	case ActionOutage, ActionDeny, ActionStall:
		arg = "off"
		if s.On {
			arg = "on"
		}
	}
	return fmt.Sprintf("%v %s %s", s.After, s.Action, arg)
}

// where names the step in messages.
func (s Step) where() string {
	if s.Line > 0 {
		return fmt.Sprintf("line %d (%s)", s.Line, s.Action)
	}
	return fmt.Sprintf("step %q", s.String())
}

// scenarioHelp is the format, for error messages.
const scenarioHelp = `want "AFTER ACTION ARGS", e.g. "20s spot-capacity 1"; actions: ` +
	`spot-capacity N|unlimited, interrupt GROUP|INSTANCE [WARNING], vanish GROUP|INSTANCE, ` +
	`desired GROUP N, outage on|off, deny on|off, stall on|off`

// ParseScenario reads a scenario: one step a line, "AFTER ACTION ARGS", where AFTER is a Go
// duration from the cloud's start ("90s", "2m30s", "0s"); # starts a comment; blank lines are
// skipped. Steps run in the order given, so AFTER never goes back. The actions:
//
//	spot-capacity N|unlimited       the cloud can run N spot instances; those beyond get notices
//	interrupt GROUP|INSTANCE [WARN] an interruption notice, reclaimed after WARN (default: the cloud's)
//	vanish GROUP|INSTANCE           the instance dies at once, with no notice
//	desired GROUP N                 someone else sets the group's desired size
//	outage on|off                   every provider call fails
//	deny on|off                     the provider's mutating calls are refused (a permission)
//	stall on|off                    every provider call hangs until its caller gives up
//
// GROUP picks the group's newest running instance. Which groups and instances exist is checked
// by Config.Validate; an error here names the line, the word and what is allowed.
func ParseScenario(r io.Reader) ([]Step, error) {
	var steps []Step
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(text)
		if len(f) == 0 {
			continue
		}
		s, err := parseStep(f)
		if err != nil {
			return nil, fmt.Errorf("scenario line %d: %w", line, err)
		}
		s.Line = line
		if n := len(steps); n > 0 && s.After < steps[n-1].After {
			return nil, fmt.Errorf("scenario line %d: %q is before the step above it (%v): steps run in order, so sort them", line, f[0], steps[n-1].After)
		}
		steps = append(steps, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("scenario: %w", err)
	}
	return steps, nil
}

func parseStep(f []string) (Step, error) {
	var s Step
	after, err := time.ParseDuration(f[0])
	if f[0] == "0" {
		after, err = 0, nil
	}
	if err != nil || after < 0 {
		return s, fmt.Errorf("%q: not a time from the start; want a duration such as 20s, 2m30s or 0s (%s)", f[0], scenarioHelp)
	}
	s.After = after
	if len(f) < 2 {
		return s, fmt.Errorf("no action after %q; %s", f[0], scenarioHelp)
	}
	s.Action = Action(f[1])
	args := f[2:]
	nargs := func(min, max int, what string) error {
		if len(args) < min || len(args) > max {
			return fmt.Errorf("%s takes %s, got %q", s.Action, what, strings.Join(args, " "))
		}
		return nil
	}
	switch s.Action {
	case ActionSpotCapacity:
		if err := nargs(1, 1, "a count or unlimited"); err != nil {
			return s, err
		}
		if args[0] == "unlimited" {
			s.N = Unlimited
			break
		}
		n, err := strconv.Atoi(args[0])
		if err != nil || n < 0 || n > MaxInstances {
			return s, fmt.Errorf("spot-capacity %q: want a count of instances from 0 to %d, or unlimited", args[0], MaxInstances)
		}
		s.N = n
	case ActionInterrupt, ActionVanish:
		what := "a group or an instance ID"
		max := 1
		if s.Action == ActionInterrupt {
			what, max = "a group or an instance ID, then optionally the warning (e.g. 30s)", 2
		}
		if err := nargs(1, max, what); err != nil {
			return s, err
		}
		if !target.MatchString(args[0]) {
			return s, fmt.Errorf("%s %q: want a group name (\"spot\") or an instance ID (\"sim-spot-0003\")", s.Action, args[0])
		}
		s.Target = args[0]
		if len(args) == 2 {
			w, err := time.ParseDuration(args[1])
			if err != nil || w <= 0 {
				return s, fmt.Errorf("interrupt %s %q: not a warning; want a positive duration such as 30s or 2m", s.Target, args[1])
			}
			s.Warning = w
		}
	case ActionDesired:
		if err := nargs(2, 2, "a group and a size"); err != nil {
			return s, err
		}
		if !groupName.MatchString(args[0]) {
			return s, fmt.Errorf("desired %q: want a group name such as \"spot\"", args[0])
		}
		n, err := strconv.Atoi(args[1])
		if err != nil || n < 0 || n > MaxInstances {
			return s, fmt.Errorf("desired %s %q: want a size from 0 to %d", args[0], args[1], MaxInstances)
		}
		s.Target, s.N = args[0], n
	case ActionOutage, ActionDeny, ActionStall:
		if err := nargs(1, 1, "on or off"); err != nil {
			return s, err
		}
		switch args[0] {
		case "on":
			s.On = true
		case "off":
		default:
			return s, fmt.Errorf("%s %q: want on or off", s.Action, args[0])
		}
	default:
		return s, fmt.Errorf("%q: not an action; %s", f[1], scenarioHelp)
	}
	return s, nil
}

// target is a group name or an instance ID.
var target = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

var instanceID = regexp.MustCompile(`^sim-([a-z0-9][a-z0-9-]*)-([0-9]{4,})$`)

// instanceGroup is the group an instance ID names.
func instanceGroup(id string) (string, bool) {
	m := instanceID.FindStringSubmatch(id)
	if m == nil {
		return "", false
	}
	return m[1], true
}
