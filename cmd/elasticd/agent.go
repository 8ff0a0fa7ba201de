package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/elasticd/elasticd/driver"
	"github.com/elasticd/elasticd/worker/agent"
	"github.com/elasticd/elasticd/worker/agent/gpu"
	"github.com/elasticd/elasticd/worker/agent/metadata"
	"github.com/urfave/cli/v2"
)

func agentCommand() *cli.Command {
	env := func(name string) []string {
		return []string{"ELASTICD_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))}
	}
	return &cli.Command{
		Name:  "agent",
		Usage: "run on each GPU host: report GPUs, GPU faults and interruption notices; start workers for the driver",
		Description: `The agent connects to the driver of 'elasticd run --launcher agent' and stays connected,
reconnecting when the driver restarts. It:
   - registers this host with its GPUs (NVML): the driver runs one worker per GPU,
     each with its own GPU at position LOCAL_RANK of CUDA_VISIBLE_DEVICES, where
     torch.cuda.set_device(LOCAL_RANK) finds it (--slots overrides the count; an agent
     started with CUDA_VISIBLE_DEVICES=2,3 offers those GPUs alone, by nvidia-smi's index
     or UUID, and with it set but empty, or -1, offers none: a CPU job on GPU hosts);
   - starts and stops the workers the driver asks for, and sends back their output and
     exit codes: no ssh is needed. A worker never outlives the agent;
   - watches GPU health (critical XIDs, uncorrectable ECC errors, lost GPUs): the driver
     takes a failed GPU's slot out of the job;
   - watches the cloud's interruption notices on the instance metadata service (AWS
     IMDSv2 spot and rebalance and ASG lifecycle, GCP preemption and maintenance, Azure
     Scheduled Events), so the job moves off this host before the cloud takes it.

The driver and the agents share a secret: the same file on every host (mode 600).

Example (on each GPU host, e.g. as a systemd unit):
   elasticd agent --driver http://10.0.0.5:29400 --agent-secret-file /etc/elasticd/agent-secret

Errors (driver unreachable, secret refused, metadata service failing) are logged and
retried with backoff; the agent only exits when told to (SIGTERM, SIGINT), after stopping
its workers.

Checking a host: --check, with the same flags, checks once what the agent needs and exits
without starting it (the Terraform modules run it before the agent's first start and keep
its output in /var/log/elasticd-agent-check.log):
   - NVIDIA driver: NVML loads (driver, NVML and CUDA versions); without it, a failure if
     the PCI bus has NVIDIA GPUs (an image without the NVIDIA driver), skipped on a CPU host;
   - GPUs: count, models and memory, and those offered as slots (CUDA_VISIBLE_DEVICES and
     --slots applied as the agent applies them); GPU health: a failure per GPU with
     uncorrectable ECC errors, memory pages or rows waiting for a reset, or lost;
   - metadata service: the watcher --metadata picks answers (the instance's ID, one poll);
   - agent-secret: the file is readable, long enough, and not readable by other users;
   - driver: --driver is reachable and serves the agents' protocol (with its version);
     secret: it accepts this secret (a signed request that registers nothing); clock: this
     host's clock is close enough to the driver's for the signatures.
One line per check: ✔ verified, ✘ wrong (followed by "fix:" and what to do), - skipped
(with why); --json prints {"ok": bool, "checks": [{"name", "status", "detail", "fix"}]}.
Each network step gives up after 5s. Exit status: 0 no check failed, 1 a check failed,
2 bad flags.

   elasticd agent --check --driver http://10.0.0.5:29400 --agent-secret-file /etc/elasticd/agent-secret`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "driver", Usage: "the driver's `URL`, e.g. http://10.0.0.5:29400 (its --listen address)", EnvVars: env("driver")},
			&cli.StringFlag{Name: "agent-secret-file", Usage: "`FILE` holding the secret shared with the driver", EnvVars: env("agent-secret-file")},
			&cli.StringFlag{Name: "host-id", Usage: "this host's `ID` as the provider knows it (default: the instance ID from the metadata service, else the hostname)", EnvVars: env("host-id")},
			&cli.StringFlag{Name: "addr", Usage: "`HOST` workers on this host listen on and peers connect to (default: this machine's first non-loopback IPv4 address)", EnvVars: env("addr")},
			&cli.IntFlag{Name: "slots", Usage: "workers on this host (default: one per GPU; without GPUs, the driver's count)", EnvVars: env("slots")},
			&cli.StringFlag{Name: "metadata", Value: "auto", Usage: "which cloud's metadata service to watch for interruption notices: auto (from the machine's DMI vendor), aws, gcp, azure or none", EnvVars: env("metadata")},
			&cli.StringFlag{Name: "metadata-url", Usage: "base `URL` of the metadata service (default: the cloud's own, e.g. http://169.254.169.254)", EnvVars: env("metadata-url")},
			&cli.DurationFlag{Name: "driver-timeout", Value: 2 * time.Minute, Usage: "stop the workers once the driver has been unreachable this long", EnvVars: env("driver-timeout")},
			&cli.DurationFlag{Name: "stop-grace", Value: 5 * time.Second, Usage: "time between SIGTERM and SIGKILL when the agent itself stops workers", EnvVars: env("stop-grace")},
			&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "also log debug detail (metadata answers skipped)", EnvVars: env("verbose")},
			// No ELASTICD_CHECK: set in a unit's environment, it would turn the agent into a
			// check that exits, restarted forever.
			&cli.BoolFlag{Name: "check", Usage: "check once what the agent needs on this host (NVIDIA driver, GPUs, metadata service, secret file, driver and secret), print one line per check and exit: 0 nothing failed, 1 a check failed"},
			&cli.BoolFlag{Name: "json", Usage: "with --check: print one JSON object, {\"ok\": bool, \"checks\": [{\"name\", \"status\", \"detail\", \"fix\"}]}, instead of lines"},
			// Test seams: a fake sysfs (PCI devices, DMI strings) and the NVML library --check loads.
			&cli.StringFlag{Name: "sys-root", Value: "/sys", Hidden: true, Usage: "where sysfs is mounted", EnvVars: env("sys-root")},
			&cli.StringFlag{Name: "nvml-library", Hidden: true, Usage: "with --check: the NVML library to load (default: the system's libnvidia-ml.so.1)", EnvVars: env("nvml-library")},
		},
		Action: runAgent,
	}
}

func runAgent(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("agent: unexpected argument %q (the agent takes flags only; see --help)", c.Args().First()), 2)
	}
	if c.Bool("check") {
		return agentCheck(c)
	}
	if c.Bool("json") {
		return usageError("json", "only with --check")
	}
	level := slog.LevelInfo
	if c.Bool("verbose") {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(c.App.ErrWriter, &slog.HandlerOptions{Level: level, ReplaceAttr: shortTime}))
	logStatsOnSIGUSR1(c.Context, log)
	cfg := agent.Config{
		DriverURL: c.String("driver"), Slots: c.Int("slots"), Version: version, Logger: log,
		DriverTimeout: c.Duration("driver-timeout"), StopGrace: c.Duration("stop-grace"),
	}
	if cfg.DriverURL == "" {
		return usageError("driver", "required: the driver's URL, e.g. --driver http://10.0.0.5:29400")
	}
	if !c.IsSet("agent-secret-file") {
		return usageError("agent-secret-file", "required: the file holding the secret shared with the driver")
	}
	for _, f := range []string{"driver-timeout", "stop-grace"} {
		if c.Duration(f) <= 0 {
			return usageError(f, "%v: must be positive, e.g. 30s", c.Duration(f))
		}
	}
	if cfg.Slots < 0 {
		return usageError("slots", "%d: must not be negative (0: one per GPU)", cfg.Slots)
	}
	var err error
	if cfg.Secret, err = readSecretFile("agent-secret-file", c.String("agent-secret-file"), log); err != nil {
		return err
	}
	kind := c.String("metadata")
	if kind == "auto" {
		kind = detectCloud(c.String("sys-root"))
		log.Info("metadata service chosen from the machine's vendor", "metadata", kind)
	}
	mcfg := metadata.Config{BaseURL: c.String("metadata-url"), Logger: log}
	if err := mcfg.Validate(); err != nil {
		return usageError("metadata-url", "%v", err)
	}
	var hostID func(context.Context) (string, error)
	switch kind {
	case "aws":
		w, err := metadata.NewAWS(mcfg)
		if err != nil {
			return usageError("metadata-url", "%v", err)
		}
		cfg.Notices, hostID = w, w.InstanceID
	case "gcp":
		w, err := metadata.NewGCP(mcfg)
		if err != nil {
			return usageError("metadata-url", "%v", err)
		}
		cfg.Notices, hostID = w, w.InstanceID
	case "azure":
		w, err := metadata.NewAzure(mcfg)
		if err != nil {
			return usageError("metadata-url", "%v", err)
		}
		cfg.Notices, hostID = w, w.VMName
	case "none":
		if c.IsSet("metadata-url") {
			return usageError("metadata-url", "given with --metadata none: name the cloud (aws, gcp or azure)")
		}
	default:
		return usageError("metadata", "%q: use auto, aws, gcp, azure or none", kind)
	}
	cfg.Metadata = kind
	cfg.HostID = c.String("host-id")
	if cfg.HostID == "" && hostID != nil {
		ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
		cfg.HostID, err = hostID(ctx)
		cancel()
		if err != nil {
			log.Warn("cannot read this instance's ID from the metadata service; using the hostname (set --host-id)", "err", err)
		}
	}
	if cfg.HostID == "" {
		if cfg.HostID, err = os.Hostname(); err != nil {
			return usageError("host-id", "no hostname to default to (%v): set --host-id", err)
		}
	}
	cfg.Addr = cmp.Or(c.String("addr"), driver.OutboundIP())

	if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok && strings.TrimSpace(v) == "" {
		// The operator hid the GPUs (a CPU job on a GPU host): the workers inherit that.
		log.Info("CUDA_VISIBLE_DEVICES is empty: offering no GPUs; slots come from --slots or the driver")
	} else if mon, err := gpu.Open(log); err != nil {
		log.Error("NVML failed; running without GPUs (no GPU health either)", "err", err)
	} else {
		defer mon.Close()
		cfg.GPUs = mon
		if ok && len(mon.GPUs()) > 0 {
			// NVML lists every GPU: the operator's list narrows what the agent offers.
			vis, err := agent.VisibleGPUs(mon, v)
			if err != nil {
				return cli.Exit("agent: "+err.Error()+" (unset it to offer every GPU of this host, or set it empty to offer none)", 2)
			}
			log.Info("CUDA_VISIBLE_DEVICES narrows the GPUs offered", "value", v, "gpus", len(vis.GPUs()), "of", len(mon.GPUs()))
			cfg.GPUs = vis
		}
	}
	log.Info("agent starting", "driver", cfg.DriverURL, "host", cfg.HostID, "addr", cfg.Addr, "metadata", kind, "version", version)
	if err := agent.Run(c.Context, cfg); err != nil {
		return cli.Exit("agent: "+err.Error(), 2)
	}
	log.Info("agent stopped", "reason", context.Cause(c.Context))
	return nil
}

// detectCloud names the cloud whose metadata service this machine has, from the DMI strings
// the hypervisor sets (as cloud-init does) in sysfs at sysRoot, without a network call; "none"
// elsewhere.
func detectCloud(sysRoot string) string {
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(sysRoot, "class", "dmi", "id", name))
		return strings.ToLower(strings.TrimSpace(string(b)))
	}
	vendor, product, bios := read("sys_vendor"), read("product_name"), read("bios_version")
	switch {
	case strings.Contains(vendor, "amazon") || strings.Contains(bios, "amazon"):
		return "aws"
	case strings.Contains(product, "google compute engine") || strings.Contains(vendor, "google"):
		return "gcp"
	case strings.Contains(vendor, "microsoft") && read("chassis_asset_tag") == "7783-7084-3265-9085-8269-3286-77":
		return "azure"
	}
	return "none"
}
