package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/elasticd/elasticd/driver"
	"github.com/elasticd/elasticd/driver/cost"
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/sim"
	"github.com/urfave/cli/v2"
)

// simType and simPrices price the simulated instances, per instance-hour, as a small GPU
// instance might be (the report's cost and savings are shown as a cloud's would be).
const (
	simType         = "sim.gpu"
	simSpotPrice    = 1.20
	simOnDemandRate = 4.00
)

// simFlags are --provider sim's: a cloud on this machine (providers/sim, docs/providers/sim.md).
func simFlags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: "sim-hosts", Usage: "--provider sim: the spot group's desired size at start (default: the hosts -np needs)", EnvVars: []string{"ELASTICD_SIM_HOSTS"}},
		&cli.IntFlag{Name: "sim-max", Usage: "--provider sim: the spot group's maximum size (default: the hosts --max-np needs)", EnvVars: []string{"ELASTICD_SIM_MAX"}},
		&cli.StringFlag{Name: "sim-spot-capacity", Value: "unlimited", Usage: "--provider sim: how many spot instances the simulated cloud can run at start (`N` or unlimited)", EnvVars: []string{"ELASTICD_SIM_SPOT_CAPACITY"}},
		&cli.DurationFlag{Name: "sim-interrupt-warning", Value: sim.DefaultInterruptWarning, Usage: "--provider sim: the notice a spot instance gets before it is reclaimed", EnvVars: []string{"ELASTICD_SIM_INTERRUPT_WARNING"}},
		&cli.BoolFlag{Name: "sim-fallback", Usage: "--provider sim, with --manage-capacity: add an on-demand group 'ondemand' at zero, the job's fallback while spot is out (as --fallback-asg does on AWS)", EnvVars: []string{"ELASTICD_SIM_FALLBACK"}},
		&cli.StringFlag{Name: "sim-scenario", Usage: "--provider sim: `FILE` of timed events for the simulated cloud, one a line ('20s spot-capacity 0', '1m interrupt spot', '2m spot-capacity unlimited'; docs/providers/sim.md)", EnvVars: []string{"ELASTICD_SIM_SCENARIO"}},
	}
}

// simSetup is --provider sim: the simulated cloud, started before the job, whose spot group is
// the job's provider; its instances are `elasticd agent`s of this binary, so the launcher is
// the agent launcher. Close stops every instance and removes what was made for it.
type simSetup struct {
	cloud *sim.Cloud
	dir   string // the generated agent secret's directory, if any
}

func (s *simSetup) Close() {
	if s.cloud != nil {
		s.cloud.Close()
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

// startSim checks the sim flags, starts the cloud and sets the job's provider, launcher and
// prices to it. The driver's address must be known ahead (the agents are told it): --listen,
// else a free port on 127.0.0.1.
func startSim(c *cli.Context, o *driver.Options) (*simSetup, error) {
	for _, f := range []string{"hosts", "host-discovery-script"} {
		if c.IsSet(f) {
			return nil, usageError(f, "not used with --provider sim: the simulated cloud's groups are the hosts")
		}
	}
	if c.IsSet("launcher") && c.String("launcher") != "agent" {
		return nil, usageError("launcher", "--provider sim runs every instance as an elasticd agent: use --launcher agent, or leave it out")
	}
	slots := max(c.Int("slots-per-host"), 1)
	need := func(np int) int { return (np + slots - 1) / slots }
	hosts, maxHosts := need(o.NP), need(max(o.MaxNP, o.NP))
	if c.IsSet("sim-hosts") {
		hosts = c.Int("sim-hosts")
	}
	if c.IsSet("sim-max") {
		maxHosts = c.Int("sim-max")
	}
	switch {
	case hosts < 0 || hosts > sim.MaxInstances:
		return nil, usageError("sim-hosts", "%d: must be between 0 and %d", hosts, sim.MaxInstances)
	case maxHosts < max(hosts, 1) || maxHosts > sim.MaxInstances:
		return nil, usageError("sim-max", "%d: must be at least --sim-hosts (%d) and 1, and at most %d", maxHosts, hosts, sim.MaxInstances)
	}
	spot := sim.Unlimited
	if v := c.String("sim-spot-capacity"); v != "unlimited" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, usageError("sim-spot-capacity", "%q: want a count (0 or more) or unlimited", v)
		}
		spot = n
	}
	if c.Duration("sim-interrupt-warning") <= 0 {
		return nil, usageError("sim-interrupt-warning", "%v: must be positive, e.g. 30s", c.Duration("sim-interrupt-warning"))
	}
	var steps []sim.Step
	if path := c.String("sim-scenario"); path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, usageError("sim-scenario", "%v", err)
		}
		if steps, err = sim.ParseScenario(bytes.NewReader(b)); err != nil {
			return nil, usageError("sim-scenario", "%s: %v", path, err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("--provider sim: find this binary to run its agents: %w", err)
	}
	s := &simSetup{}
	secret := c.String("agent-secret-file")
	if secret == "" {
		if s.dir, err = os.MkdirTemp("", "elasticd-sim-"); err != nil {
			return nil, err
		}
		secret = filepath.Join(s.dir, "agent-secret")
		key := make([]byte, 32)
		rand.Read(key)
		if err := os.WriteFile(secret, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
			s.Close()
			return nil, err
		}
	}
	listen := c.String("listen")
	if h, p, err := net.SplitHostPort(listen); listen == "" || err == nil && p == "0" {
		// The agents are told the port before the driver listens: choose it now.
		if listen == "" {
			h = "127.0.0.1"
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(h, "0"))
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("--provider sim: find a port for the driver: %w", err)
		}
		listen = ln.Addr().String()
		ln.Close()
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		s.Close()
		return nil, usageError("listen", "%q: want HOST:PORT, e.g. 127.0.0.1:29400", listen)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	var out io.Writer = io.Discard // the agents' own log; their workers' output reaches the driver
	if c.Bool("verbose") {
		out = c.App.ErrWriter
	}
	cfg := sim.Config{
		Groups: []sim.GroupConfig{
			{Name: "spot", Spot: true, Type: simType, Slots: slots, Max: maxHosts, Desired: hosts},
		},
		Prices:           map[string]sim.Price{simType: {OnDemand: simOnDemandRate, Spot: simSpotPrice}},
		Agent:            []string{self, "agent"},
		Env:              []string{"CUDA_VISIBLE_DEVICES="}, // no GPU here: the agents offer --slots
		DriverURL:        "http://" + net.JoinHostPort(host, port),
		SecretFile:       secret,
		Output:           out,
		SpotCapacity:     spot,
		InterruptWarning: c.Duration("sim-interrupt-warning"),
		Scenario:         steps,
		Logger:           o.Logger,
	}
	if c.Bool("sim-fallback") {
		cfg.Groups = append(cfg.Groups, sim.GroupConfig{Name: "ondemand", Type: simType, Slots: slots, Max: maxHosts})
	}
	if err := cfg.Validate(); err != nil {
		s.Close()
		return nil, cli.Exit(fmt.Sprintf("--provider sim: %v", err), 2)
	}
	if s.cloud, err = sim.Start(context.WithoutCancel(c.Context), cfg); err != nil {
		s.Close()
		return nil, fmt.Errorf("--provider sim: %w", err)
	}
	spotGroup, err := s.cloud.Group("spot")
	if err != nil {
		s.Close()
		return nil, err
	}
	o.Provider, o.ProviderName = spotGroup, "sim"
	if err := manageCapacity(c, o); err != nil { // the group itself, before the agents wrap it
		s.Close()
		return nil, err
	}
	if c.Bool("sim-fallback") {
		od, err := s.cloud.Group("ondemand")
		if err != nil {
			s.Close()
			return nil, err
		}
		o.Provider, o.Fallback = &providers.WithFallback{Spot: spotGroup, Fallback: od}, od
		o.Config.Capacity.Fallback = &driver.FallbackConfig{Group: "sim group ondemand", After: c.Duration("fallback-after")}
	}
	if err := agentLauncher(c, o, secret); err != nil {
		s.Close()
		return nil, err
	}
	o.ListenAddr = listen
	o.Prices = cost.NewCatalog(&cost.File{Currency: sim.DefaultCurrency, Types: map[string]cost.Rate{simType: {OnDemand: simOnDemandRate, Spot: simSpotPrice}}}, spotGroup, o.Logger)
	o.Logger.Info("a simulated cloud on this machine: its instances are elasticd agents on 127.0.0.N", "spot_hosts", hosts, "max", maxHosts, "slots", slots,
		"spot_capacity", c.String("sim-spot-capacity"), "scenario_steps", len(steps), "driver", cfg.DriverURL)
	return s, nil
}
