package main

import (
	"cmp"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/urfave/cli/v2"
)

// providerOptions are the provider flags, for every provider's constructor.
type providerOptions struct {
	SlotsPerHost     int           // --slots-per-host (0: the provider's own rule)
	DiscoveryTimeout time.Duration // --discovery-timeout
	Region           string        // --region: AWS region, GCP region of a regional MIG, IBM region
	Zone             string        // --zone: GCP zone of a zonal MIG
	Project          string        // --project: GCP project
	Endpoint         string        // --endpoint: API endpoint override (tests, private endpoints)
	ASG              string        // --asg: AWS Auto Scaling group
	SQSQueueURL      string        // --sqs-queue-url: AWS queue fed by EventBridge with interruption notices
	MIG              string        // --mig: GCP managed instance group
	Subscription     string        // --subscription: Azure subscription ID
	ResourceGroup    string        // --resource-group: Azure resource group
	VMSS             string        // --vmss: Azure virtual machine scale set
	InstanceGroup    string        // --instance-group: IBM Cloud VPC instance group (name or ID)
	Logger           *slog.Logger
}

// cloudProviders maps --provider names to constructors; local, fixed and script are built
// from their own flags in buildProvider.
var cloudProviders = map[string]func(providerOptions) (providers.Provider, error){
	"aws":   newAWSProvider,
	"gcp":   newGCPProvider,
	"azure": newAzureProvider,
	"ibm":   newIBMProvider,
}

func providerNames() string {
	names := append([]string{"local", "fixed", "script", "agents"}, slices.Sorted(maps.Keys(cloudProviders))...)
	names = append(names, "sim")
	return strings.Join(names, ", ")
}

// providerFlags are shared by `run` and `discover`.
func providerFlags() []cli.Flag {
	env := func(name string) []string {
		return []string{"ELASTICD_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))}
	}
	str := func(name, usage string) cli.Flag {
		return &cli.StringFlag{Name: name, Usage: usage, EnvVars: env(name)}
	}
	return []cli.Flag{
		str("provider", "where hosts come from: "+providerNames()+" (default: fixed with -H, script with --host-discovery-script, else local)"),
		&cli.StringFlag{Name: "hosts", Aliases: []string{"H"}, Usage: "fixed hosts, `host[:slots],...`", EnvVars: env("hosts")},
		&cli.StringFlag{Name: "host-discovery-script", Usage: "`PATH` of a program that prints host[:slots] lines", EnvVars: env("host-discovery-script")},
		&cli.IntFlag{Name: "slots-per-host", Usage: "workers per host (default: fixed/script 1; local --max-np; clouds the instance type's GPU count, else 1)", EnvVars: env("slots-per-host")},
		&cli.DurationFlag{Name: "discovery-timeout", Value: 10 * time.Second, Usage: "how long one discovery may take", EnvVars: env("discovery-timeout")},
		str("region", "cloud region (aws, gcp regional MIG, ibm)"),
		str("zone", "GCP zone of a zonal MIG"),
		str("project", "GCP project"),
		str("endpoint", "cloud API endpoint `URL` override (private endpoints, tests)"),
		str("asg", "AWS Auto Scaling group name"),
		str("sqs-queue-url", "AWS SQS queue `URL` receiving EventBridge interruption notices (optional)"),
		str("mig", "GCP managed instance group name"),
		str("subscription", "Azure subscription ID"),
		str("resource-group", "Azure resource group"),
		str("vmss", "Azure virtual machine scale set name"),
		str("instance-group", "IBM Cloud VPC instance group name or ID"),
	}
}

// providerName is the --provider the flags mean: as given, else fixed with -H, script with
// --host-discovery-script, else local.
func providerName(c *cli.Context) string {
	switch {
	case c.String("provider") != "":
		return c.String("provider")
	case c.IsSet("hosts"):
		return "fixed"
	case c.IsSet("host-discovery-script"):
		return "script"
	default:
		return "local"
	}
}

// buildProvider makes the provider the flags describe; localSlots is the local provider's
// default slot count. Errors name the flag (exit code 2).
func buildProvider(c *cli.Context, localSlots int, log *slog.Logger) (providers.Provider, error) {
	slots := c.Int("slots-per-host")
	if slots < 0 {
		return nil, usageError("slots-per-host", "%d: must be at least 1", slots)
	}
	if c.Duration("discovery-timeout") <= 0 {
		return nil, usageError("discovery-timeout", "%v: must be positive, e.g. 10s", c.Duration("discovery-timeout"))
	}
	name := providerName(c)
	if c.IsSet("hosts") && c.IsSet("host-discovery-script") {
		return nil, cli.Exit("-H/--hosts and --host-discovery-script: give one or the other", 2)
	}
	switch name {
	case "local":
		if c.Bool("local-spot") {
			return providers.NewLocalSpot(cmp.Or(slots, localSlots)), nil
		}
		return providers.NewLocal(cmp.Or(slots, localSlots)), nil
	case "fixed":
		if !c.IsSet("hosts") {
			return nil, usageError("hosts", "--provider fixed needs -H host[:slots],...")
		}
		hs, err := providers.ParseHosts(c.String("hosts"), cmp.Or(slots, 1))
		if err != nil {
			return nil, usageError("hosts", "%v", err)
		}
		return providers.NewFixed(hs), nil
	case "agents":
		return nil, usageError("provider", "agents: only `elasticd run --launcher agent` has agents")
	case "sim":
		return nil, usageError("provider", "sim: a cloud on this machine that lives as long as its job: only `elasticd run --provider sim`")
	case "script":
		path := c.String("host-discovery-script")
		if path == "" {
			return nil, usageError("host-discovery-script", "--provider script needs the script's path")
		}
		if st, err := os.Stat(path); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return nil, usageError("host-discovery-script", "%q is not an executable file", path)
		}
		return providers.NewScript(path, cmp.Or(slots, 1), c.Duration("discovery-timeout")), nil
	}
	build, ok := cloudProviders[name]
	if !ok {
		return nil, usageError("provider", "%q: use one of %s", name, providerNames())
	}
	p, err := build(cloudOptions(c, log))
	if err != nil {
		return nil, cli.Exit(fmt.Sprintf("--provider %s: %v", name, err), 2)
	}
	return p, nil
}

// cloudOptions are the cloud provider flags as given.
func cloudOptions(c *cli.Context, log *slog.Logger) providerOptions {
	return providerOptions{
		SlotsPerHost: c.Int("slots-per-host"), DiscoveryTimeout: c.Duration("discovery-timeout"),
		Region: c.String("region"), Zone: c.String("zone"), Project: c.String("project"), Endpoint: c.String("endpoint"),
		ASG: c.String("asg"), SQSQueueURL: c.String("sqs-queue-url"), MIG: c.String("mig"),
		Subscription: c.String("subscription"), ResourceGroup: c.String("resource-group"), VMSS: c.String("vmss"),
		InstanceGroup: c.String("instance-group"), Logger: log,
	}
}

// buildFallback makes the provider of the on-demand fallback group name: the same cloud,
// region, project, resource group and credentials as the spot group, without its notice
// queue (spot interruptions concern the spot instances).
func buildFallback(c *cli.Context, name string, log *slog.Logger) (providers.Provider, error) {
	cloud := providerName(c)
	o := cloudOptions(c, log)
	o.SQSQueueURL = ""
	switch cloud {
	case "aws":
		o.ASG = name
	case "gcp":
		o.MIG = name
	case "azure":
		o.VMSS = name
	case "ibm":
		o.InstanceGroup = name
	}
	p, err := cloudProviders[cloud](o)
	if err != nil {
		return nil, cli.Exit(fmt.Sprintf("--%s: %v", fallbackFlags[cloud], err), 2)
	}
	return p, nil
}
