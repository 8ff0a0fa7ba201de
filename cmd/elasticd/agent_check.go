package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/worker/agent"
	"github.com/elasticd/elasticd/worker/agent/gpu"
	"github.com/elasticd/elasticd/worker/agent/metadata"
	"github.com/urfave/cli/v2"
)

// agentCheckTimeout bounds the whole of `elasticd agent --check`. Each network step has its own,
// shorter bound (agent.DefaultCheckTimeout); this one only keeps a stuck step from holding up
// the host's boot, which runs the check before starting the agent.
const agentCheckTimeout = 45 * time.Second

// agentCheck is `elasticd agent --check`: the agent's flags, read as the agent reads them, and
// what they need on this host, checked once. Flags the agent would refuse exit 2, as the agent
// does; what is missing or wrong on the host or the network is a failed check.
func agentCheck(c *cli.Context) error {
	kind := c.String("metadata")
	switch kind {
	case "auto", "aws", "gcp", "azure", "none":
	default:
		return usageError("metadata", "%q: use auto, aws, gcp, azure or none", kind)
	}
	if kind == "none" && c.IsSet("metadata-url") {
		return usageError("metadata-url", "given with --metadata none: name the cloud (aws, gcp or azure)")
	}
	mcfg := metadata.Config{BaseURL: c.String("metadata-url")}
	if err := mcfg.Validate(); err != nil {
		return usageError("metadata-url", "%v", err)
	}
	if c.Int("slots") < 0 {
		return usageError("slots", "%d: must not be negative (0: one per GPU)", c.Int("slots"))
	}
	ctx, cancel := context.WithTimeout(c.Context, agentCheckTimeout)
	defer cancel()
	sys := c.String("sys-root")

	pci, pciErr := gpu.NVIDIAPCI(sys)
	visible, visibleSet := os.LookupEnv("CUDA_VISIBLE_DEVICES")
	cs := agent.CheckGPUs(agent.GPUHost{
		Inventory: gpu.Inspect(c.String("nvml-library")),
		PCI:       pci, PCIErr: pciErr,
		Visible: visible, VisibleSet: visibleSet,
		Slots: c.Int("slots"),
	})

	mc := agent.MetadataCheck{Kind: kind, BaseURL: mcfg.BaseURL}
	if kind == "auto" {
		mc.Kind, mc.Auto = detectCloud(sys), true
	}
	var err error
	switch mc.Kind {
	case "aws":
		var w *metadata.AWS
		w, err = metadata.NewAWS(mcfg)
		if err == nil {
			mc.ID, mc.Notices = w.InstanceID, w
		}
	case "gcp":
		var w *metadata.GCP
		w, err = metadata.NewGCP(mcfg)
		if err == nil {
			mc.ID, mc.Notices = w.InstanceID, w
		}
	case "azure":
		var w *metadata.Azure
		w, err = metadata.NewAzure(mcfg)
		if err == nil {
			mc.ID, mc.Notices = w.VMName, w
		}
	}
	if err != nil {
		return usageError("metadata-url", "%v", err)
	}
	cs = append(cs, agent.CheckMetadata(ctx, mc))

	file := c.String("agent-secret-file")
	secretCheck, secret := agent.ReadSecretFile(file)
	cs = append(cs, secretCheck)
	host, _ := os.Hostname()
	cs = append(cs, agent.CheckDriver(ctx, agent.DriverCheck{
		URL: c.String("driver"), Secret: secret, SecretFile: file,
		Host: cmp.Or(c.String("host-id"), host),
	})...)

	if err := printChecks(c.App.Writer, cs, c.Bool("json")); err != nil {
		return err
	}
	if failed := countFailed(cs); failed > 0 {
		return cli.Exit(fmt.Sprintf("agent --check: %d of %d checks failed", failed, len(cs)), 1)
	}
	return nil
}

func countFailed(cs providers.Checks) int {
	n := 0
	for _, c := range cs {
		if c.Status == providers.CheckFail {
			n++
		}
	}
	return n
}
