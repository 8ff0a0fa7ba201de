package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/elasticd/elasticd/allreduce"
	"github.com/elasticd/elasticd/driver"
	"github.com/elasticd/elasticd/driver/admin"
	"github.com/elasticd/elasticd/driver/agents"
	"github.com/elasticd/elasticd/driver/cost"
	"github.com/elasticd/elasticd/driver/hosts"
	"github.com/elasticd/elasticd/driver/launch"
	"github.com/elasticd/elasticd/driver/webui"
	"github.com/elasticd/elasticd/proc"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/python"
	"github.com/urfave/cli/v2"
)

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "run an elastic data-parallel training job",
		ArgsUsage: "-- COMMAND [ARGS...]",
		Description: `Discovers hosts, launches COMMAND once per slot, and keeps the job going while workers
fail and hosts come and go: a failed worker's slot is blacklisted for a cooldown, the others
reset to a new generation (dense ranks, oldest worker = rank 0) and carry on from their
last commit. The job succeeds when every worker of the final generation exits 0.

How workers recover (--mode):
   auto        the default: in-process as soon as a worker registers with the rendezvous
               (programs built on elasticd's Go worker/ package or on its Python package,
               'import elasticd.torch as hvd'); restart for a script that never does, such
               as any torchrun-style PyTorch script
   restart     any change of membership (a worker failed, a host lost, added or given a
               notice) stops the whole group (SIGTERM, --stop-grace, SIGKILL) and launches
               every slot into the next generation with torchrun's environment (RANK,
               WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, a fresh MASTER_PORT, TORCHELASTIC_*...);
               the script resumes from its own checkpoint. Growth waits for
               --scale-up-interval so that hosts arriving together join in one restart.
   inprocess   survivors keep their processes, restore their last commit and go on; a
               worker that does not register within --start-timeout has failed
   PyTorch: docs/pytorch.md.

Hosts come from one provider:
   --provider local        this machine, one host per slot (the default)
   -H host[:slots],...     a fixed list (--provider fixed)
   --host-discovery-script a program printing one host[:slots] per line (--provider script)
   --provider aws|gcp|azure|ibm   a cloud group (see docs/providers/)
   --provider agents       the hosts whose 'elasticd agent' is connected (the default
                           with --launcher agent)

Workers start through one launcher:
   --launcher local        on this machine (the default)
   --launcher ssh          over ssh, on each host
   --launcher agent        through 'elasticd agent' on each host: no ssh keys; the agents
                           also report GPUs (one slot per GPU), GPU faults and the cloud's
                           interruption notices. Needs --agent-secret-file, the same file
                           the agents read; they connect to --listen (default :29400).

Examples:
   elasticd run -np 4 --min-np 2 -- ./train
   elasticd run -np 4 --min-np 2 --max-np 8 -- /usr/bin/python3 train.py --checkpoint /data/ckpt.pt
   elasticd run -np 8 -H gpu1:4,gpu2:4 --launcher ssh -- python train.py
   elasticd run -np 4 --max-np 16 --host-discovery-script ./hosts.sh -- ./train
   elasticd run -np 8 --launcher agent --agent-secret-file /etc/elasticd/agent-secret \
       --provider aws --asg my-gpu-asg --region us-east-1 -- ./train

Watching it: the driver serves a live page at http://<--listen>/ (world size, step rate,
loss and cost over time, step X of N and the time to go where the program reports them,
hosts with their uptime, heartbeat and failures, recent events, cost and savings),
/v1/status (JSON; 'elasticd status --driver URL' prints it) and /metrics (Prometheus;
dashboards/elasticd.json for Grafana). The URL is logged at start; give --listen a fixed
port to find it again. With --output-dir, the job also writes DIR/report.html at its end:
the same page with the final state, which opens in a browser with no driver running.

Cost: each host's time in the group × its price: spot prices from the cloud where it
publishes them (AWS), else --prices FILE (on-demand and spot per instance type):
   currency: USD
   types:
     g5.12xlarge: {on_demand: 5.672, spot: 2.03}
The job's last line gives the cost, the savings against on-demand and the cost of work
rolled back after failures.

Stopping: SIGINT (Ctrl-C), SIGTERM and 'elasticd ctl stop' end the job, its workers stopped
first. With --launcher agent and --state-dir, SIGTERM (systemd stopping the driver, a reboot
of its machine) ends the driver alone: the workers train on under their agents, and the
driver started again on the same --state-dir and --listen takes them up, no step lost;
SIGINT or 'elasticd ctl stop' ends such a job.

Exit status: 0 success, or the driver left a running job (SIGTERM, above); 1 the job failed
(the reason is printed); 2 bad usage; 3 --max-cost stopped the job; 130 interrupted (every
worker is stopped first).`,
		Flags: append(append(providerFlags(), simFlags()...),
			&cli.IntFlag{Name: "np", Usage: "number of workers to start with (required)", EnvVars: []string{"ELASTICD_NP"}},
			&cli.IntFlag{Name: "min-np", Usage: "fewest workers to keep training with (default: -np)", EnvVars: []string{"ELASTICD_MIN_NP"}},
			&cli.IntFlag{Name: "max-np", Usage: "most workers to grow to (default: -np)", EnvVars: []string{"ELASTICD_MAX_NP"}},
			&cli.DurationFlag{Name: "discovery-interval", Value: time.Second, Usage: "how often hosts are discovered", EnvVars: []string{"ELASTICD_DISCOVERY_INTERVAL"}},
			&cli.IntFlag{Name: "reset-limit", Usage: "resets caused by failures before the job fails (0: unlimited; scale-ups, removals and a flapping slot's failures do not count)", EnvVars: []string{"ELASTICD_RESET_LIMIT"}},
			&cli.DurationFlag{Name: "elastic-timeout", Value: driver.DefaultElasticTimeout, Usage: "how long fewer than --min-np slots are tolerated", EnvVars: []string{"ELASTICD_ELASTIC_TIMEOUT"}},
			&cli.StringFlag{Name: "mode", Value: string(driver.ModeAuto), Usage: "how workers recover from a change of membership: auto, restart (stop and relaunch the whole group; torchrun-style scripts) or inprocess (survivors keep their processes); see above", EnvVars: []string{"ELASTICD_MODE"}},
			&cli.DurationFlag{Name: "scale-up-interval", Value: driver.DefaultScaleUpInterval, Usage: "restart mode: how long after a generation starts a restart to grow may come at the earliest; slots arriving meanwhile join together (failures and notices restart at once)", EnvVars: []string{"ELASTICD_SCALE_UP_INTERVAL"}},
			&cli.BoolFlag{Name: "warm-start", Usage: "restart mode, --launcher local, a python command: keep a spare interpreter per slot with torch already imported, so that a restart does not wait for Python and torch to load again (costs one idle interpreter's memory per slot)", EnvVars: []string{"ELASTICD_WARM_START"}},
			&cli.DurationFlag{Name: "start-timeout", Value: driver.DefaultStartTimeout, Usage: "in-process mode: how long a launched worker may take to register (restart-mode scripts never register and are not failed for it)", EnvVars: []string{"ELASTICD_START_TIMEOUT"}},
			&cli.DurationFlag{Name: "barrier-timeout", Value: driver.DefaultBarrierTimeout, Usage: "once a reset begins, how long a worker may take to reach it before it counts as hung and is killed (cut to 1s once a peer reports it silent inside a collective)", EnvVars: []string{"ELASTICD_BARRIER_TIMEOUT"}},
			&cli.StringFlag{Name: "comm-transport", Value: "auto", Usage: "how workers on the same machine exchange data in collectives: auto (shared memory, TCP with the others) or tcp (TCP with every peer; Go workers only)", EnvVars: []string{"ELASTICD_COMM_TRANSPORT"}},
			&cli.DurationFlag{Name: "comm-timeout", Value: 30 * time.Second, Usage: "how long a worker waits on a silent peer inside a collective", EnvVars: []string{"ELASTICD_COMM_TIMEOUT"}},
			&cli.StringFlag{Name: "checkpoint-dir", Usage: "in-process mode: rank 0 writes its commit to `DIR` every --checkpoint-every commits and at the commit where a planned change takes the job (a notice, a scale-in, --max-cost) (atomically, with a digest; the newest two kept), and a job that loses every worker at once starts over from the newest valid one on the slots that come back within --elastic-timeout. Use a volume every host mounts at the same path; one directory per job (a job started on a directory that holds checkpoints resumes from them). Python: elasticd.torch's TorchState writes and reads it too", EnvVars: []string{"ELASTICD_CHECKPOINT_DIR"}},
			&cli.StringFlag{Name: "state-dir", Usage: "keep the job's state in `DIR` (generation, members, blacklist, reset counts, job ID) so that a driver started again with the same DIR takes the job up after a crash, a SIGKILL or a reboot of its machine. With --launcher agent the workers keep training meanwhile (up to the agents' --driver-timeout) and are adopted, no step lost: start it again with the same --listen; a SIGTERM (a reboot of this machine) then leaves the job running the same way, and SIGINT or elasticd ctl stop ends it. With local and ssh they died with the driver: the job starts again, from --checkpoint-dir. One driver per DIR; a job that ends removes its state", EnvVars: []string{"ELASTICD_STATE_DIR"}},
			&cli.IntFlag{Name: "checkpoint-every", Value: protocol.DefaultCheckpointEvery, Usage: "with --checkpoint-dir: commits between two checkpoints", EnvVars: []string{"ELASTICD_CHECKPOINT_EVERY"}},
			&cli.DurationFlag{Name: "flap-window", Value: driver.DefaultFlapWindow, Usage: "a slot that fails within this long of coming back after a failure of its own is flapping; its failures then do not count toward --reset-limit", EnvVars: []string{"ELASTICD_FLAP_WINDOW"}},
			&cli.IntFlag{Name: "flap-limit", Value: driver.DefaultFlapLimit, Usage: "after this many returns in a row that failed within --flap-window, a flapping slot is quarantined: out of the job until 'elasticd ctl add-host HOST' takes it back", EnvVars: []string{"ELASTICD_FLAP_LIMIT"}},
			&cli.StringFlag{Name: "blacklist-cooldown-range", Value: "10s,5m", Usage: "`MIN,MAX` cooldown of a failed slot: MIN after the first failure, doubling per failure up to MAX (seconds or durations; 'MIN MAX' as two arguments works too)", EnvVars: []string{"ELASTICD_BLACKLIST_COOLDOWN_RANGE"}},
			&cli.StringFlag{Name: "launcher", Value: "local", Usage: "how workers start: local (on this machine; refused for hosts that are not this machine), ssh or agent (elasticd agent on each host; the default with --provider aws, gcp, azure, ibm or sim)", EnvVars: []string{"ELASTICD_LAUNCHER"}},
			&cli.StringFlag{Name: "agent-secret-file", Usage: "with --launcher agent: `FILE` holding the secret shared with every agent (at least 16 bytes, e.g. from head -c 32 /dev/urandom | base64)", EnvVars: []string{"ELASTICD_AGENT_SECRET_FILE"}},
			&cli.DurationFlag{Name: "agent-lease", Value: agents.DefaultLease, Usage: "with --launcher agent: how long the driver waits to hear from an agent before it counts the host lost and its workers failed; the agents poll every third of it. Shorter finds a host cut off from the driver sooner (its workers may still be training with their peers), at one request per agent every lease/3", EnvVars: []string{"ELASTICD_AGENT_LEASE"}},
			&cli.StringFlag{Name: "admin-secret-file", Usage: "turn on the admin API (elasticd ctl add-host, remove-host, status) on the --listen address: `FILE` holding its secret, at least 16 bytes; ctl needs the same file", EnvVars: []string{"ELASTICD_ADMIN_SECRET_FILE"}},
			&cli.StringFlag{Name: "listen", Usage: "`HOST:PORT` the driver listens on for workers and agents (default: 127.0.0.1:0 with the local launcher, :0 with ssh, :29400 with agent)", EnvVars: []string{"ELASTICD_LISTEN"}},
			&cli.IntFlag{Name: "ssh-port", Usage: "ssh port (default: ssh's own)", EnvVars: []string{"ELASTICD_SSH_PORT"}},
			&cli.StringFlag{Name: "driver-addr", Usage: "`HOST` workers use to reach this driver (default: 127.0.0.1 with the local launcher, else this machine's first non-loopback IPv4 address)", EnvVars: []string{"ELASTICD_DRIVER_ADDR"}},
			&cli.StringFlag{Name: "ssh-identity-file", Usage: "ssh private key `FILE`", EnvVars: []string{"ELASTICD_SSH_IDENTITY_FILE"}},
			&cli.StringFlag{Name: "output-dir", Usage: "also write each worker's output to `DIR`/<worker>/gen-<generation>.{stdout,stderr}, and at the job's end DIR/report.html (the live page's final state, viewable with no driver)", EnvVars: []string{"ELASTICD_OUTPUT_DIR"}},
			&cli.DurationFlag{Name: "stop-grace", Value: 5 * time.Second, Usage: "time between SIGTERM and SIGKILL when stopping a worker", EnvVars: []string{"ELASTICD_STOP_GRACE"}},
			&cli.StringFlag{Name: "slot-policy", Usage: "which slots to use when more are usable than --max-np: packed (fill each host in discovery order, as horovodrun), roundrobin (one slot per host in turn) or loadaware (faster hosts get more; see --slot-groups, --slot-gradient, --slot-weights)", Value: "packed", EnvVars: []string{"ELASTICD_SLOT_POLICY"}},
			&cli.IntFlag{Name: "slot-groups", Value: hosts.DefaultSlotGroups, Usage: "loadaware: how many speed groups the hosts are sorted into", EnvVars: []string{"ELASTICD_SLOT_GROUPS"}},
			&cli.Float64Flag{Name: "slot-gradient", Value: hosts.DefaultSlotGradient, Usage: "loadaware: each faster group gets (1+gradient)× the slots of the next slower one", EnvVars: []string{"ELASTICD_SLOT_GRADIENT"}},
			&cli.StringFlag{Name: "slot-weights", Value: hosts.DefaultSlotPolicy().Weights.String(), Usage: "loadaware: `STEPTIME,BUSY,ACTIVE` weights of a host's score (step time in seconds, GPU busy 0..1, active slots); lower scores are faster", EnvVars: []string{"ELASTICD_SLOT_WEIGHTS"}},
			&cli.StringFlag{Name: "prices", Usage: "price `FILE` (YAML): on-demand and spot price per instance-hour of each instance type, for the cost and savings; the cloud's own spot prices win where it publishes them (AWS)", EnvVars: []string{"ELASTICD_PRICES"}},
			&cli.BoolFlag{Name: "manage-capacity", Usage: "steer the cloud group's size (--provider aws, gcp, azure, ibm or sim): its desired size follows what the job can use (enough hosts for --max-np, never above the group's own maximum), a host with a failed GPU or every slot quarantined is handed back for a replacement once its workers left, and when the job ends (success, failure, SIGTERM, --max-cost) the group goes to zero, so nothing bills after it. Each call is logged with its reason; one the cloud refuses (a permission) is said once and the job goes on unmanaged. A driver that crashes changes nothing. One driver per group: on AWS, Azure and sim the group is claimed with a tag (elasticd-driver), and a second driver refuses to start (exit 2)", EnvVars: []string{"ELASTICD_MANAGE_CAPACITY"}},
			&cli.IntFlag{Name: "replace-per-hour", Value: driver.DefaultReplacePerHour, Usage: "with --manage-capacity: at most this many broken hosts handed back for a replacement in any hour (each instance once)", EnvVars: []string{"ELASTICD_REPLACE_PER_HOUR"}},
			&cli.DurationFlag{Name: "agent-timeout", Value: driver.DefaultAgentTimeout, Usage: "with --manage-capacity and --launcher agent: a host the group lists this long with no agent connecting for it (a bad image, a failed cloud-init, a firewall) is handed back for a replacement", EnvVars: []string{"ELASTICD_AGENT_TIMEOUT"}},
			&cli.StringFlag{Name: "fallback-asg", Usage: "with --manage-capacity, --provider aws: an on-demand Auto Scaling group `NAME` in the same region, normally at zero, that the job falls back on while spot capacity has run out (see --fallback-after); the job moves back to spot at a commit when spot returns, and the group goes back to zero", EnvVars: []string{"ELASTICD_FALLBACK_ASG"}},
			&cli.StringFlag{Name: "fallback-mig", Usage: "as --fallback-asg, for --provider gcp: an on-demand (STANDARD) managed instance group `NAME` in the same zone or region", EnvVars: []string{"ELASTICD_FALLBACK_MIG"}},
			&cli.StringFlag{Name: "fallback-vmss", Usage: "as --fallback-asg, for --provider azure: a regular-priority scale set `NAME` in the same resource group", EnvVars: []string{"ELASTICD_FALLBACK_VMSS"}},
			&cli.StringFlag{Name: "fallback-instance-group", Usage: "as --fallback-asg, for --provider ibm: an on-demand instance group (`NAME` or ID) in the same region", EnvVars: []string{"ELASTICD_FALLBACK_INSTANCE_GROUP"}},
			&cli.DurationFlag{Name: "fallback-after", Value: driver.DefaultFallbackAfter, Usage: "with a fallback group: how long the job must have had fewer than -np slots on spot, with the spot group reporting no capacity, before the fallback group is grown by the hosts missing", EnvVars: []string{"ELASTICD_FALLBACK_AFTER"}},
			&cli.Float64Flag{Name: "max-cost", Usage: "the job's budget, an `AMOUNT` in the prices' currency: before its cost passes it, the workers commit, the job stops with exit status 3 and a managed group goes to zero. Every host type needs a price (--prices, or the cloud's spot prices)", EnvVars: []string{"ELASTICD_MAX_COST"}},
			&cli.BoolFlag{Name: "local-spot", Usage: "--provider local: count this machine's hosts as spot capacity (type 'local'), to try the cost accounting with --prices", EnvVars: []string{"ELASTICD_LOCAL_SPOT"}},
			&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "also log every rendezvous exchange (worker reports, assignments, key-value sets), and every launch past the first 64 of a generation; the driver's decisions are always logged", EnvVars: []string{"ELASTICD_VERBOSE"}},
		),
		Action: runJob,
	}
}

func runJob(c *cli.Context) error {
	level := slog.LevelInfo
	if c.Bool("verbose") {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(c.App.ErrWriter, &slog.HandlerOptions{Level: level, ReplaceAttr: shortTime}))
	logStatsOnSIGUSR1(c.Context, log)
	if c.NArg() == 0 {
		return cli.Exit("run: no command: put the training command after --, e.g. elasticd run -np 4 -- ./train", 2)
	}
	o, cleanup, err := runOptions(c, log)
	defer cleanup()
	if err != nil {
		return err
	}
	o.Stdout, o.Stderr = c.App.Writer, c.App.ErrWriter
	if err := checkLocalHosts(c.Context, c, o); err != nil {
		return err
	}
	if o.Agents != nil && o.StateDir != "" && o.ProviderName != "sim" {
		leave := make(chan struct{})
		if sigtermOf(c.Context).leaveOn(leave) {
			o.Leave = leave
			log.Info("SIGTERM (systemd stopping this machine) leaves the job running, for a driver started again on --state-dir to take up; SIGINT (Ctrl-C) or elasticd ctl stop ends the job", "state_dir", o.StateDir)
		}
	}
	if o.Capacity != nil {
		// An unknown group, or one the credentials may not read, is said now, not in the
		// middle of the job.
		ctx, cancel := context.WithTimeout(c.Context, time.Minute)
		size, err := o.Capacity.GroupSize(ctx)
		cancel()
		if err != nil {
			return cli.Exit(fmt.Sprintf("--manage-capacity: %v", err), 1)
		}
		log.Info("managing the group's size", "group", o.Config.Capacity.Group, "size", size.String(), "autoscaled_by", size.Autoscaled)
		if o.Fallback != nil {
			if err := checkFallback(c.Context, o); err != nil {
				return err
			}
		}
		if err := claimGroups(c.Context, &o); err != nil {
			return err
		}
	}
	res, err := driver.Run(c.Context, o)
	if err != nil {
		releaseClaims(c.Context, o) // the job never ran: its claims would hold its groups for nothing
		return cli.Exit(err.Error(), 1)
	}
	if res.Left {
		fmt.Fprintf(c.App.ErrWriter, "elasticd: %s\n", res.Reason)
		return nil
	}
	fmt.Fprintf(c.App.ErrWriter, "elasticd: %s (generations %d, resets %d of which %d after failures)\n", res.Reason, res.Generations, res.Resets, res.FailureResets)
	if res.Status != nil {
		fmt.Fprintf(c.App.ErrWriter, "elasticd: %s\n", costLine(res.Status))
		if cs := res.Status.Capacity; cs != nil {
			fmt.Fprintf(c.App.ErrWriter, "elasticd: %s\n", cs.CapacityLine())
		}
		if o.OutputDir != "" {
			if path, err := writeReport(o.OutputDir, res.Status); err != nil {
				fmt.Fprintf(c.App.ErrWriter, "elasticd: no report: %v\n", err)
			} else {
				fmt.Fprintf(c.App.ErrWriter, "elasticd: report at %s (the live page's final state; open it in a browser, no driver needed)\n", path)
			}
		}
	}
	if res.Code != 0 {
		return cli.Exit("job failed: "+res.Reason, res.Code)
	}
	return nil
}

func shortTime(_ []string, a slog.Attr) slog.Attr {
	if a.Key == slog.TimeKey {
		return slog.String("time", a.Value.Time().Format("15:04:05.000"))
	}
	return a
}

// runOptions turns flags into driver options; every error names its flag (exit code 2).
// cleanup, never nil, releases what the options hold (the simulated cloud of --provider sim).
func runOptions(c *cli.Context, log *slog.Logger) (o driver.Options, cleanup func(), err error) {
	cleanup = func() {}
	o, err = runOptionsOf(c, log, &cleanup)
	return o, cleanup, err
}

func runOptionsOf(c *cli.Context, log *slog.Logger, cleanup *func()) (driver.Options, error) {
	o := driver.Options{Logger: log, Command: c.Args().Slice()}
	var err error
	if !c.IsSet("np") {
		return o, usageError("np", "required: how many workers to start with, e.g. -np 4")
	}
	o.NP, o.MinNP, o.MaxNP, o.ResetLimit = c.Int("np"), c.Int("min-np"), c.Int("max-np"), c.Int("reset-limit")
	o.ElasticTimeout, o.StartTimeout, o.BarrierTimeout = c.Duration("elastic-timeout"), c.Duration("start-timeout"), c.Duration("barrier-timeout")
	if o.Mode, err = driver.ParseMode(c.String("mode")); err != nil {
		return o, usageError("mode", "%q: use auto, restart or inprocess (see elasticd run --help)", c.String("mode"))
	}
	o.ScaleUpInterval, o.FlapWindow, o.FlapLimit = c.Duration("scale-up-interval"), c.Duration("flap-window"), c.Int("flap-limit")
	if dir := c.String("checkpoint-dir"); dir != "" {
		if o.Mode == driver.ModeRestart {
			return o, usageError("checkpoint-dir", "only for in-process workers (Go worker.State, Python elasticd.torch); a restart-mode script checkpoints itself")
		}
		if o.CheckpointDir, err = filepath.Abs(dir); err != nil {
			return o, usageError("checkpoint-dir", "%q: %v", dir, err)
		}
		if err := os.MkdirAll(o.CheckpointDir, 0o755); err != nil {
			return o, usageError("checkpoint-dir", "%v: create it, or give a directory the driver can write", err)
		}
	}
	if dir := c.String("state-dir"); dir != "" {
		if o.StateDir, err = filepath.Abs(dir); err != nil {
			return o, usageError("state-dir", "%q: %v", dir, err)
		}
		if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
			return o, usageError("state-dir", "%v: create it, or give a directory the driver can write", err)
		}
		if o.Restore, err = driver.LoadState(o.StateDir); err != nil {
			return o, usageError("state-dir", "%v", err)
		}
		if o.Restore != nil {
			o.JobID = o.Restore.JobID
			log.Info("taking up the job saved in --state-dir", "job", o.JobID, "generation", o.Restore.Generation, "workers", len(o.Restore.Workers), "saved_at", o.Restore.SavedAt)
		}
	}
	if o.CheckpointEvery = c.Int("checkpoint-every"); o.CheckpointEvery < 1 {
		return o, usageError("checkpoint-every", "%d: must be at least 1 (commits between two checkpoints)", o.CheckpointEvery)
	}
	if o.FlapLimit < 1 {
		return o, usageError("flap-limit", "%d: must be at least 1 (returns in a row that failed before a slot is quarantined)", o.FlapLimit)
	}
	for _, f := range []string{"elastic-timeout", "start-timeout", "barrier-timeout", "comm-timeout", "discovery-interval", "stop-grace", "scale-up-interval", "flap-window"} {
		if c.Duration(f) <= 0 {
			return o, usageError(f, "%v: must be positive, e.g. 30s", c.Duration(f))
		}
	}
	if o.CooldownMin, o.CooldownMax, err = parseCooldown(c.String("blacklist-cooldown-range")); err != nil {
		return o, usageError("blacklist-cooldown-range", "%v", err)
	}
	if err := slotPolicy(c, &o.Config); err != nil {
		return o, err
	}
	if err := o.Config.Validate(); err != nil {
		return o, cli.Exit(err.Error(), 2)
	}
	o.CommTimeout, o.StopGrace = c.Duration("comm-timeout"), c.Duration("stop-grace")
	switch t := c.String("comm-transport"); t {
	case allreduce.TransportAuto, allreduce.TransportTCP:
		o.CommTransport = t
	default:
		return o, usageError("comm-transport", "%q: use auto or tcp", t)
	}
	o.DiscoveryInterval, o.DiscoveryTimeout = c.Duration("discovery-interval"), c.Duration("discovery-timeout")
	o.OutputDir = c.String("output-dir")
	if o.Dir, err = os.Getwd(); err != nil {
		return o, err
	}
	explicit := c.IsSet("provider") || c.IsSet("hosts") || c.IsSet("host-discovery-script")
	simCloud := providerName(c) == "sim"
	if !simCloud {
		for _, f := range []string{"sim-hosts", "sim-max", "sim-spot-capacity", "sim-interrupt-warning", "sim-scenario"} {
			if c.IsSet(f) {
				return o, usageError(f, "only used with --provider sim")
			}
		}
	}
	if simCloud {
		// The cloud, its agents, the agent launcher and the prices, all at once: the agents
		// are told the driver's address, which the driver then listens on.
		s, err := startSim(c, &o)
		if err != nil {
			return o, err
		}
		*cleanup = s.Close
	} else if launcherName(c) == "agent" && !explicit || c.String("provider") == "agents" {
		o.Provider = nil // the agents' hosts: set with the launcher
		o.ProviderName = "agents"
	} else if o.Provider, err = buildProvider(c, max(o.MaxNP, o.NP), o.Logger); err != nil {
		return o, err
	} else {
		o.ProviderName = providerName(c)
	}
	if simCloud {
		for _, f := range []string{"prices", "warm-start", "agent-lease"} {
			if c.IsSet(f) {
				return o, usageError(f, "not used with --provider sim")
			}
		}
		return o, finishOptions(c, &o)
	}
	if err := manageCapacity(c, &o); err != nil {
		return o, err
	}
	if err := prices(c, &o); err != nil {
		return o, err
	}
	if cloudProviders[o.ProviderName] != nil && !c.IsSet("launcher") {
		// The group's hosts are other machines: the local launcher would run every worker on
		// this one. The agent launcher is what the Terraform modules run.
		if !c.IsSet("agent-secret-file") {
			return o, usageError("agent-secret-file", "--provider %s runs the workers on the group's hosts: through an elasticd agent on each (--launcher agent, the default with a cloud provider), which shares the secret in --agent-secret-file FILE with the driver; or over ssh with --launcher ssh", o.ProviderName)
		}
		log.Info("the workers start through the elasticd agent on each of the group's hosts (--launcher agent, the default with a cloud provider; --launcher ssh starts them over ssh)", "provider", o.ProviderName)
	}
	switch l := launcherName(c); l {
	case "local":
		o.Launcher = proc.NewLocal()
		// elasticd's Python package, from this binary, ahead of the workers' PYTHONPATH.
		if root, err := python.Install(python.CacheDir()); err != nil {
			log.Warn("could not write out the Python package; workers cannot import elasticd", "err", err)
		} else {
			o.Env = append(o.Env, python.Env(root, os.Getenv("PYTHONPATH")))
		}
		if c.Bool("warm-start") {
			if o.Mode == driver.ModeInProcess {
				return o, usageError("warm-start", "only for restart mode: in-process workers keep their processes")
			}
			if o.Launcher, err = launch.NewWarm(o.Logger); err != nil {
				return o, err
			}
		}
		if c.String("provider") == "agents" {
			return o, usageError("provider", "agents: needs --launcher agent")
		}
	case "ssh":
		// The hosts get elasticd's Python package through the session: no install step there.
		setup, err := python.RemoteInstall()
		if err != nil {
			return o, err
		}
		o.Launcher = launch.NewSSH(launch.SSHConfig{Port: c.Int("ssh-port"), IdentityFile: c.String("ssh-identity-file"), Setup: setup})
		o.ListenAddr = ":0" // remote workers must reach the rendezvous
		o.AdvertiseHost = c.String("driver-addr")
	case "agent":
		if !c.IsSet("agent-secret-file") {
			return o, usageError("agent-secret-file", "--launcher agent needs the secret shared with the agents (the file their --agent-secret-file names)")
		}
		if err := agentLauncher(c, &o, c.String("agent-secret-file")); err != nil {
			return o, err
		}
	default:
		return o, usageError("launcher", "%q: use local, ssh or agent", l)
	}
	if c.Bool("warm-start") && launcherName(c) != "local" {
		return o, usageError("warm-start", "only with --launcher local: a spare is handed its worker through a file on this machine")
	}
	for _, f := range []string{"agent-secret-file", "agent-lease"} {
		if c.IsSet(f) && launcherName(c) != "agent" {
			return o, usageError(f, "only used with --launcher agent")
		}
	}
	return o, finishOptions(c, &o)
}

// finishOptions reads the flags that apply whatever the provider and the launcher.
func finishOptions(c *cli.Context, o *driver.Options) error {
	if c.IsSet("listen") && o.ProviderName != "sim" { // the sim chose its port already
		if _, _, err := net.SplitHostPort(c.String("listen")); err != nil {
			return usageError("listen", "%q: want HOST:PORT, e.g. :29400 or 10.0.0.5:29400", c.String("listen"))
		}
		o.ListenAddr = c.String("listen")
	}
	if c.Int("ssh-port") < 0 || c.Int("ssh-port") > 65535 {
		return usageError("ssh-port", "%d: must be a TCP port", c.Int("ssh-port"))
	}
	if c.IsSet("admin-secret-file") {
		if err := adminAPI(c, o); err != nil {
			return err
		}
	}
	return nil
}

// launcherName is the launcher the flags mean: --launcher as given, else agent with a cloud
// provider (its hosts are other machines, each with an agent), else local.
func launcherName(c *cli.Context) string {
	if p := providerName(c); !c.IsSet("launcher") && (cloudProviders[p] != nil || p == "sim") {
		return "agent"
	}
	return c.String("launcher")
}

// checkLocalHosts refuses, before the job starts, the local launcher with hosts that are not
// this machine: it would run every one of their workers here. One discovery poll says which
// hosts the provider has; a poll that fails is left to the job's own discovery.
func checkLocalHosts(ctx context.Context, c *cli.Context, o driver.Options) error {
	if launcherName(c) != "local" || o.ProviderName == "local" || o.Provider == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.Duration("discovery-timeout"))
	defer cancel()
	hosts, err := o.Provider.Hosts(ctx)
	if err != nil {
		return nil
	}
	for _, h := range hosts {
		if !thisMachine(ctx, h.Addr) {
			return cli.Exit(fmt.Sprintf("--launcher local runs every worker on this machine, but --provider %s lists host %s at %s, which is not this machine: use --launcher agent (elasticd agent on each host) or --launcher ssh", o.ProviderName, h.ID, h.Addr), 2)
		}
	}
	return nil
}

// thisMachine reports whether addr (an IP or a host name) is this machine: a loopback address,
// one of its interfaces' addresses, its host name, or a name that resolves to one of those.
func thisMachine(ctx context.Context, addr string) bool {
	if name, err := os.Hostname(); err == nil && strings.EqualFold(addr, name) || strings.EqualFold(addr, "localhost") {
		return true
	}
	var ips []net.IP
	if ip := net.ParseIP(strings.Trim(addr, "[]")); ip != nil {
		ips = []net.IP{ip}
	} else {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		as, err := net.DefaultResolver.LookupIPAddr(rctx, addr)
		if err != nil {
			return false
		}
		for _, a := range as {
			ips = append(ips, a.IP)
		}
	}
	own, _ := net.InterfaceAddrs()
	for _, ip := range ips {
		if ip.IsLoopback() {
			return true
		}
		for _, a := range own {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return true
			}
		}
	}
	return false
}

// manageCapacity reads --manage-capacity, --replace-per-hour and --max-cost. The group is
// the provider's own (read before the admin overlay or the agents wrap it).
func manageCapacity(c *cli.Context, o *driver.Options) error {
	if c.IsSet("max-cost") {
		o.MaxCost = c.Float64("max-cost")
		if !(o.MaxCost > 0) || math.IsInf(o.MaxCost, 0) {
			return usageError("max-cost", "%v: want a positive amount in the prices' currency, e.g. 250", c.Float64("max-cost"))
		}
		if p := providerName(c); !c.IsSet("prices") && (p == "local" || p == "fixed" || p == "script" || p == "agents") {
			return usageError("max-cost", "--provider %s has no prices of its own: give --prices FILE with each host type's price per hour (examples/prices.yaml), or the budget cannot be kept", p)
		}
	}
	if n := c.Int("replace-per-hour"); n < 1 {
		return usageError("replace-per-hour", "%d: must be at least 1", n)
	}
	fbFlag, fbName := fallbackFlag(c)
	if !c.Bool("manage-capacity") {
		for _, f := range []string{"replace-per-hour", "fallback-after", "agent-timeout", fbFlag} {
			if f != "" && c.IsSet(f) {
				return usageError(f, "only used with --manage-capacity")
			}
		}
		return nil
	}
	for _, f := range []string{"fallback-after", "agent-timeout"} {
		if c.Duration(f) <= 0 {
			return usageError(f, "%v: must be positive, e.g. 10m", c.Duration(f))
		}
	}
	cp, ok := o.Provider.(providers.Capacity)
	if !ok {
		return usageError("manage-capacity", "--provider %s has no group to steer: use aws, gcp, azure or ibm (or sim, a cloud on this machine)", o.ProviderName)
	}
	o.Capacity = cp
	o.Config.Capacity = &driver.CapacityConfig{Group: groupName(c), SlotsPerHost: c.Int("slots-per-host"), ReplacePerHour: c.Int("replace-per-hour"),
		AgentTimeout: c.Duration("agent-timeout")}
	if fbFlag == "" {
		if c.IsSet("fallback-after") {
			return usageError("fallback-after", "only used with a fallback group (--fallback-asg, --fallback-mig, --fallback-vmss, --fallback-instance-group or --sim-fallback)")
		}
		return nil
	}
	if o.ProviderName == "sim" { // startSim made the group
		return nil
	}
	if want := fallbackFlags[o.ProviderName]; want != fbFlag {
		return usageError(fbFlag, "not for --provider %s%s", o.ProviderName, map[bool]string{true: ": use --" + want, false: ""}[want != ""])
	}
	if fbName == primaryGroupName(c) {
		return usageError(fbFlag, "%q is the spot group itself: name the on-demand group the job falls back on", fbName)
	}
	fb, err := buildFallback(c, fbName, o.Logger)
	if err != nil {
		return err
	}
	fbc, ok := fb.(providers.Capacity)
	if !ok { // cannot happen: every cloud provider steers
		return usageError(fbFlag, "--provider %s cannot steer a fallback group", o.ProviderName)
	}
	o.Provider = &providers.WithFallback{Spot: o.Provider, Fallback: fb}
	o.Fallback = fbc
	o.Config.Capacity.Fallback = &driver.FallbackConfig{Group: fmt.Sprintf("%s group %s", o.ProviderName, fbName), After: c.Duration("fallback-after")}
	return nil
}

// checkFallback reads the fallback group before the job starts: it must exist. (A spot
// instance in it is warned of when it appears: its launch template is the cloud's.)
func checkFallback(ctx context.Context, o driver.Options) error {
	name := o.Config.Capacity.Fallback.Group
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	size, err := o.Fallback.GroupSize(ctx)
	if err != nil {
		return cli.Exit(fmt.Sprintf("the fallback group: %v", err), 1)
	}
	o.Logger.Info("the on-demand fallback group", "group", name, "size", size.String())
	return nil
}

// claimGroups claims the steered groups (and the fallback group) for this job, where their
// cloud tags them (providers.Claimer), before the job starts: a group that another driver's
// fresh claim holds stops this one (exit 2), having changed nothing; a claim the cloud refuses
// (a permission) or fails to make is said, and the job goes on without one. A group whose
// cloud cannot be tagged (GCP, IBM) has no claim: one driver per group is the user's to keep.
// The job's ID, which owns the claims, is chosen here when nothing chose it yet.
func claimGroups(ctx context.Context, o *driver.Options) error {
	if o.JobID == "" { // as driver.Run would choose it
		var id [4]byte
		rand.Read(id[:])
		o.JobID = hex.EncodeToString(id[:])
	}
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	type group struct {
		c     providers.Capacity
		name  string
		claim **providers.GroupClaim
	}
	groups := []group{{o.Capacity, o.Config.Capacity.Group, &o.Claim}}
	if o.Fallback != nil {
		groups = append(groups, group{o.Fallback, o.Config.Capacity.Fallback.Group, &o.FallbackClaim})
	}
	for _, g := range groups {
		cl, ok := g.c.(providers.Claimer)
		if !ok {
			o.Logger.Info("the group's cloud takes no tag: nothing tells a second driver that this one steers it; run one job per group", "group", g.name)
			continue
		}
		claim := providers.GroupClaim{Owner: o.JobID, Host: host, At: time.Now()}
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		held, err := cl.Claim(cctx, claim)
		cancel()
		switch {
		case err != nil:
			o.Logger.Warn("could not claim the group: a second driver would not learn of this one; the job goes on", "group", g.name, "tag", providers.ClaimTagKey, "err", err)
		case held != nil:
			releaseClaims(ctx, *o) // those taken already
			return cli.Exit(fmt.Sprintf("--manage-capacity: %s is steered by job %s on host %s (claimed at %s); stop that driver, or wait until its claim lapses at %s",
				g.name, held.Owner, held.Host, held.At.UTC().Format(time.RFC3339), held.Lapses().UTC().Format(time.RFC3339)), 2)
		default:
			*g.claim = &claim
			o.Logger.Info("claimed the group for this job", "group", g.name, "tag", providers.ClaimTagKey, "claim", claim.Value())
		}
	}
	return nil
}

// releaseClaims removes the claims claimGroups took, for a job that does not run.
func releaseClaims(ctx context.Context, o driver.Options) {
	for _, g := range []struct {
		c     providers.Capacity
		claim *providers.GroupClaim
	}{{o.Capacity, o.Claim}, {o.Fallback, o.FallbackClaim}} {
		cl, ok := g.c.(providers.Claimer)
		if !ok || g.claim == nil {
			continue
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		if err := cl.Unclaim(cctx, g.claim.Owner); err != nil {
			o.Logger.Warn("could not remove the group's claim: it lapses on its own", "tag", providers.ClaimTagKey, "err", err)
		}
		cancel()
	}
}

// fallbackFlags are each cloud's fallback group flag.
var fallbackFlags = map[string]string{"aws": "fallback-asg", "gcp": "fallback-mig", "azure": "fallback-vmss", "ibm": "fallback-instance-group"}

// fallbackFlag is the fallback group flag given, if any, and its value.
func fallbackFlag(c *cli.Context) (flag, name string) {
	for _, f := range []string{"fallback-asg", "fallback-mig", "fallback-vmss", "fallback-instance-group"} {
		if c.IsSet(f) {
			return f, c.String(f)
		}
	}
	if c.Bool("sim-fallback") {
		return "sim-fallback", "ondemand"
	}
	return "", ""
}

// primaryGroupName is the spot group's name as its flag gives it.
func primaryGroupName(c *cli.Context) string {
	for _, f := range []string{"asg", "mig", "vmss", "instance-group"} {
		if c.IsSet(f) {
			return c.String(f)
		}
	}
	return ""
}

// groupName names the steered group in the log and the job's last line.
func groupName(c *cli.Context) string {
	switch p := c.String("provider"); p {
	case "aws":
		return fmt.Sprintf("aws group %s", c.String("asg"))
	case "gcp":
		return fmt.Sprintf("gcp group %s", c.String("mig"))
	case "azure":
		return fmt.Sprintf("azure scale set %s", c.String("vmss"))
	case "ibm":
		return fmt.Sprintf("ibm instance group %s", c.String("instance-group"))
	case "sim":
		return "sim group spot"
	default:
		return p + " group"
	}
}

// prices sets up the cost accounting: --prices, and the provider's spot prices (read before
// the admin overlay or the agents wrap the provider, which hide them).
func prices(c *cli.Context, o *driver.Options) error {
	var file *cost.File
	if path := c.String("prices"); path != "" {
		f, err := cost.ReadFile(path)
		if err != nil {
			return usageError("prices", "%v", err)
		}
		file = f
	}
	sp, _ := o.Provider.(providers.SpotPricer)
	if c.Bool("local-spot") && o.ProviderName != "local" {
		return usageError("local-spot", "only used with --provider local")
	}
	o.Prices = cost.NewCatalog(file, sp, o.Logger)
	return nil
}

// adminAPI sets up --admin-secret-file: the provider, whichever it is, is wrapped so that
// hosts can be added and removed while the job runs, through the signed admin API.
func adminAPI(c *cli.Context, o *driver.Options) error {
	secret, err := readSecretFile("admin-secret-file", c.String("admin-secret-file"), o.Logger)
	if err != nil {
		return err
	}
	minNP := o.MinNP
	if minNP == 0 {
		minNP = o.NP
	}
	overlay := admin.NewOverlay(o.Provider, minNP)
	if o.Restore != nil { // a host the operator removed stays removed; one added stays
		overlay.Restore(o.Restore.OperatorAdded, o.Restore.OperatorStopped)
	}
	o.Status = &driver.StatusBoard{}
	h, err := admin.NewHandler(secret, overlay, o.Status.Load, o.Logger)
	if err != nil {
		return usageError("admin-secret-file", "%v", err)
	}
	releases, stops := make(chan driver.Release), make(chan string)
	h.Releases(releases)
	h.Stops(stops)
	o.Provider, o.Admin, o.Rediscover, o.Releases, o.Stops, o.Operator = overlay, h, overlay.Changed(), releases, stops, overlay
	if o.Agents != nil && !o.Agents.Wraps(overlay.Inner()) { // agentLauncher left the agents' view to go on the overlay
		o.Provider = o.Agents.Wrap(overlay)
	}
	return nil
}

// slotPolicy reads --slot-policy and its settings.
func slotPolicy(c *cli.Context, cfg *driver.Config) error {
	name := c.String("slot-policy")
	if name == "packed" {
		for _, f := range []string{"slot-groups", "slot-gradient", "slot-weights"} {
			if c.IsSet(f) {
				return usageError(f, "only used with --slot-policy loadaware")
			}
		}
		return nil
	}
	p := hosts.DefaultSlotPolicy()
	p.Name, p.Groups, p.Gradient = name, c.Int("slot-groups"), c.Float64("slot-gradient")
	w, err := hosts.ParseWeights(c.String("slot-weights"))
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	p.Weights = w
	if err := p.Validate(); err != nil {
		return cli.Exit(strings.Replace(err.Error(), "roundrobin or loadaware", "packed, roundrobin or loadaware", 1), 2)
	}
	cfg.SlotPolicy = &p
	return nil
}

// agentLauncher sets up --launcher agent: the registry the agents connect to, the job's
// secret derived from the agent secret, and hosts limited to those with an agent.
func agentLauncher(c *cli.Context, o *driver.Options, secretFile string) error {
	secret, err := readSecretFile("agent-secret-file", secretFile, o.Logger)
	if err != nil {
		return err
	}
	if o.JobID == "" { // else the job taken up from --state-dir
		var id [8]byte
		rand.Read(id[:])
		o.JobID = hex.EncodeToString(id[:])
	}
	o.Secret = protocol.JobSecret(secret, o.JobID)
	lease := c.Duration("agent-lease")
	if lease < time.Second {
		return usageError("agent-lease", "%v: at least 1s (the agents poll every third of it)", lease)
	}
	reg, err := agents.New(agents.Config{Secret: secret, JobID: o.JobID, Version: version, Logger: o.Logger,
		Lease: lease, PollWait: min(lease/3, agents.DefaultPollWait), Loads: c.String("slot-policy") == hosts.LoadAware})
	if err != nil {
		return usageError("agent-secret-file", "%v", err)
	}
	o.Agents = reg
	// With a provider and the admin API, the admin overlay goes between them, and adminAPI
	// wraps it: ctl then names the provider's hosts whether or not their agents are
	// connected (a driver just started has none yet), and an added host waits for its agent.
	if !c.IsSet("admin-secret-file") || o.Provider == nil {
		o.Provider = reg.Wrap(o.Provider)
	}
	o.Launcher = reg.Launcher()
	o.ListenAddr = ":29400"
	o.AdvertiseHost = c.String("driver-addr")
	return nil
}

// readSecretFile reads a secret: the file's bytes without surrounding whitespace.
func readSecretFile(flag, path string, log *slog.Logger) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, usageError(flag, "%v", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < protocol.MinAgentSecret {
		return nil, usageError(flag, "%s holds %d bytes; a secret of at least %d is needed (e.g. head -c 32 /dev/urandom | base64 > %s)", path, len(b), protocol.MinAgentSecret, path)
	}
	if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
		log.Warn("the secret file can be read by other users; chmod 600 it", "file", path, "mode", st.Mode().Perm().String())
	}
	return b, nil
}

// parseCooldown reads "MIN,MAX" (or "MIN MAX"); bare numbers are seconds, as in horovodrun.
func parseCooldown(s string) (time.Duration, time.Duration, error) {
	f := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("%q: want MIN,MAX, e.g. 10s,5m or 10,300", s)
	}
	var d [2]time.Duration
	for i, v := range f {
		if n, err := strconv.Atoi(v); err == nil {
			d[i] = time.Duration(n) * time.Second
		} else if d[i], err = time.ParseDuration(v); err != nil {
			return 0, 0, fmt.Errorf("%q is not a duration (e.g. 10s) or a number of seconds", v)
		}
	}
	if d[0] <= 0 || d[1] < d[0] || d[1] > time.Hour {
		return 0, 0, fmt.Errorf("%v,%v: need 0 < MIN <= MAX <= 1h", d[0], d[1])
	}
	return d[0], d[1], nil
}

// joinCooldownArgs lets `--blacklist-cooldown-range 10 100` (horovodrun's two arguments) work.
func joinCooldownArgs(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if (a == "--blacklist-cooldown-range" || a == "-blacklist-cooldown-range") && i+2 < len(args) &&
			!strings.HasPrefix(args[i+1], "-") && !strings.HasPrefix(args[i+2], "-") && !strings.Contains(args[i+1], ",") {
			out = append(out, a, args[i+1]+","+args[i+2])
			i += 2
			continue
		}
		out = append(out, a)
	}
	return out
}

// writeReport writes the job's post-mortem, the live page with its final status, to
// DIR/report.html, and returns the path. It replaces the file at once (a rename), so a
// browser never opens half of one.
func writeReport(dir string, s *driver.Status) (string, error) {
	path := filepath.Join(dir, "report.html")
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(dir, ".report-*.html")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name()) // after the rename, there is nothing left to remove
	if err := webui.Report(f, s); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return "", err
	}
	return path, nil
}
