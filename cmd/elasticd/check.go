package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/elasticd/elasticd/driver"
	"github.com/elasticd/elasticd/driver/cost"
	"github.com/elasticd/elasticd/proc"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
	"github.com/urfave/cli/v2"
)

// checkCommand is `elasticd check`: the job `run` would start, checked before it starts. It
// takes run's flags, so that the line a user is about to run is the line checked.
func checkCommand() *cli.Command {
	return &cli.Command{
		Name:      "check",
		Usage:     "check a job before it starts: credentials, the group, permissions, notices, hosts, prices, secrets",
		ArgsUsage: "[-- COMMAND [ARGS...]]",
		Description: `Takes the flags of 'elasticd run' and checks, without starting anything or changing the
group, what the job they describe needs:
   - the flags themselves (as run reads them);
   - the cloud (aws, gcp, azure, ibm): credentials and region resolved, and from where;
     the group found and its size; each permission the job's flags need (discovery; with
     --manage-capacity the steering calls; with --sqs-queue-url the queue's), asked of the
     cloud without acting where it can be asked (AWS iam:SimulatePrincipalPolicy, GCP
     testIamPermissions, Azure's permissions of the scale set; IBM Cloud cannot be asked,
     and says so); the notice queue reachable and fed by an EventBridge rule (AWS); the
     fallback group (--fallback-asg ...) the same way;
   - the hosts found, their instance types and slots, against -np and --min-np; with
     --launcher local, that they are this machine; with --launcher ssh, that a command
     starts on each;
   - prices: the cloud's spot prices and --prices for every type found (needed by --max-cost);
   - the agent and admin secret files, the --listen address (bindable), and the
     directories the job writes (--checkpoint-dir, --state-dir, --output-dir);
   - with --launcher local, that COMMAND is found.
One line per check: ✔ verified, ✘ wrong (with the fix: the permission, the flag, the doc),
- skipped (with why). On each GPU host, 'elasticd agent --check' checks the host's side.

Examples:
   elasticd check --provider aws --asg my-gpu-asg --region us-east-1 \
       --sqs-queue-url https://sqs.us-east-1.amazonaws.com/123456789012/elasticd-notices \
       --agent-secret-file /etc/elasticd/agent-secret --manage-capacity -np 8 -- python3 train.py
   elasticd check --json -np 4 -H gpu1:4 --launcher ssh -- python3 train.py

Exit status: 0 nothing failed; 1 a check failed; 2 the flags are wrong.`,
		Flags: append(slices.Clone(runCommand().Flags),
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object, {\"ok\": bool, \"checks\": [{\"name\", \"status\", \"detail\", \"fix\"}]}, instead of lines"},
			&cli.DurationFlag{Name: "check-timeout", Value: time.Minute, Usage: "how long the whole check may take; a check still waiting then fails"},
		),
		Action: checkJob,
	}
}

// checkJob runs the checks, prints them and sets the exit status.
func checkJob(c *cli.Context) error {
	if c.Duration("check-timeout") <= 0 {
		return usageError("check-timeout", "%v: must be positive, e.g. 1m", c.Duration("check-timeout"))
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("check-timeout"))
	defer cancel()
	// run's own reading of the flags logs what it decides; check's lines say it instead.
	log := slog.New(slog.NewTextHandler(c.App.ErrWriter, &slog.HandlerOptions{Level: slog.LevelError}))
	cs, code := checks(ctx, c, log)
	if err := printChecks(c.App.Writer, cs, c.Bool("json")); err != nil {
		return err
	}
	if code != 0 {
		failed := 0
		for _, x := range cs {
			if x.Status == providers.CheckFail {
				failed++
			}
		}
		return cli.Exit(fmt.Sprintf("check: %d of %d checks failed", failed, len(cs)), code)
	}
	return nil
}

// checks makes every check the flags call for, and the exit status they mean.
func checks(ctx context.Context, c *cli.Context, log *slog.Logger) (providers.Checks, int) {
	var cs providers.Checks
	name := providerName(c)
	if name == "sim" {
		return providers.Checks{providers.Skipped("provider", "--provider sim is a cloud on this machine that lives as long as its job: nothing to check before it", "")}, 0
	}
	o, cleanup, err := runOptions(c, log)
	defer cleanup()
	if err != nil {
		fix := "elasticd run --help"
		if f := flagOf(err); f != "" {
			fix = "--" + f + ": elasticd run --help says what it takes"
		}
		return providers.Checks{providers.Fail("flags", strings.TrimPrefix(err.Error(), "run: "), fix)}, 2
	}
	cs = append(cs, providers.OK("flags", flagSummary(c, o)))

	// The provider, as its constructor makes it: the job's is wrapped by then (agents, the
	// admin overlay), and those wrappers hide what the cloud can check.
	var raw providers.Provider
	if o.ProviderName != "agents" {
		if raw, err = buildProvider(c, max(o.MaxNP, o.NP), log); err != nil {
			return append(cs, providers.Fail("provider", err.Error(), "elasticd run --help")), 2
		}
	}
	needs := providers.CheckNeeds{ManageCapacity: c.Bool("manage-capacity")}
	_, needs.Prices = raw.(providers.SpotPricer)
	cloudOK := true
	if ch, ok := raw.(providers.Checker); ok {
		got := providers.Checks(ch.Check(ctx, needs))
		cloudOK = !reachFailed(got)
		cs = append(cs, got...)
	}
	if flag, fb := fallbackFlag(c); flag != "" && flag != "sim-fallback" && o.Fallback != nil {
		if p, err := buildFallback(c, fb, log); err != nil {
			cs = append(cs, providers.Fail("fallback group", err.Error(), "--"+flag))
		} else if ch, ok := p.(providers.Checker); ok {
			got := providers.Checks(ch.Check(ctx, providers.CheckNeeds{ManageCapacity: true}))
			cs = append(cs, got.Prefixed("fallback group")...)
		}
	}

	hosts, hc := checkHosts(ctx, c, o, raw, cloudOK)
	cs = append(cs, hc...)
	cs = append(cs, checkPrices(ctx, c, o, raw, hosts)...)
	cs = append(cs, checkLaunch(ctx, c, o, hosts)...)
	cs = append(cs, checkSecrets(c)...)
	cs = append(cs, checkListen(o))
	cs = append(cs, checkDirs(c, o)...)
	if cs.Failed() {
		return cs, 1
	}
	return cs, 0
}

// reachFailed reports whether a check that discovery depends on failed: the credentials, or
// where the group is (a permission to steer it, or a notice rule, does not keep its hosts
// from being listed).
func reachFailed(cs providers.Checks) bool {
	for _, c := range cs {
		switch c.Name {
		case "credentials", "region", "project", "location", "subscription", "resource group", "group":
			if c.Status == providers.CheckFail {
				return true
			}
		}
	}
	return false
}

// flagOf is the flag a usage error names ("--np: ..."), or "".
func flagOf(err error) string {
	msg := err.Error()
	if !strings.HasPrefix(msg, "--") {
		return ""
	}
	f, _, ok := strings.Cut(msg[2:], ":")
	if !ok || strings.ContainsAny(f, " /") {
		return ""
	}
	return f
}

// flagSummary is the job the flags describe, in a line.
func flagSummary(c *cli.Context, o driver.Options) string {
	minNP, maxNP := cmp.Or(o.MinNP, o.NP), cmp.Or(o.MaxNP, o.NP)
	s := fmt.Sprintf("-np %d (min %d, max %d), --provider %s, --launcher %s, --mode %s", o.NP, minNP, maxNP, o.ProviderName, launcherName(c), o.Mode)
	if c.Bool("manage-capacity") {
		s += ", --manage-capacity"
	}
	if len(o.Command) > 0 {
		s += ", command " + strings.Join(o.Command, " ")
	}
	return s
}

// checkHosts asks the provider for its hosts once: their types and slots against the job's
// sizes. A cloud whose own checks failed is not asked again: the cause is said above.
func checkHosts(ctx context.Context, c *cli.Context, o driver.Options, p providers.Provider, cloudOK bool) ([]providers.Host, providers.Checks) {
	if p == nil {
		return nil, providers.Checks{providers.Skipped("hosts", "--launcher agent with no --provider: the hosts are those whose elasticd agent connects, known once the job starts", "run 'elasticd agent --check --driver URL --agent-secret-file FILE' on a host")}
	}
	if !cloudOK {
		return nil, providers.Checks{providers.Skipped("hosts", "not asked: the cloud's credentials or its group failed above", "")}
	}
	dctx, cancel := context.WithTimeout(ctx, max(c.Duration("discovery-timeout"), 10*time.Second))
	defer cancel()
	hosts, err := p.Hosts(dctx)
	if err != nil {
		return nil, providers.Checks{providers.Fail("hosts", err.Error(), "the provider's flags (elasticd discover takes the same ones, and prints what it finds)")}
	}
	minNP, np, maxNP := cmp.Or(o.MinNP, o.NP), o.NP, cmp.Or(o.MaxNP, o.NP)
	slots := 0
	for _, h := range hosts {
		if !h.Leaving {
			slots += h.Slots
		}
	}
	detail := describeHosts(hosts)
	switch {
	case len(hosts) == 0 && c.Bool("manage-capacity"):
		return hosts, providers.Checks{providers.OK("hosts", fmt.Sprintf("none yet: --manage-capacity sizes the group for %d slots at start", maxNP))}
	case slots < minNP && !c.Bool("manage-capacity"):
		return hosts, providers.Checks{providers.Fail("hosts", fmt.Sprintf("%s: %d slots, fewer than --min-np %d; the job would wait --elastic-timeout (%v) and fail", detail, slots, minNP, o.ElasticTimeout),
			"grow the group (or give --manage-capacity to let elasticd size it), or lower --min-np")}
	case slots < np:
		detail += fmt.Sprintf(": %d slots, fewer than -np %d: the job starts once the hosts for -np are there, or with --min-np after --elastic-timeout", slots, np)
	default:
		detail += fmt.Sprintf(": %d slots for -np %d (max %d)", slots, np, maxNP)
	}
	return hosts, providers.Checks{providers.OK("hosts", detail)}
}

// describeHosts is "3 hosts: 2 g5.12xlarge spot (4 slots each), 1 g5.xlarge on-demand (1 slot)".
func describeHosts(hosts []providers.Host) string {
	type kind struct {
		typ   string
		spot  bool
		slots int
	}
	n := map[kind]int{}
	leaving := 0
	for _, h := range hosts {
		if h.Leaving {
			leaving++
			continue
		}
		n[kind{cmp.Or(h.Type, "untyped"), h.Spot, h.Slots}]++
	}
	kinds := slices.SortedFunc(maps.Keys(n), func(a, b kind) int {
		spotLast := func(k kind) int {
			if k.spot {
				return 1
			}
			return 0
		}
		return cmp.Or(cmp.Compare(a.typ, b.typ), cmp.Compare(a.slots, b.slots), cmp.Compare(spotLast(a), spotLast(b)))
	})
	var parts []string
	for _, k := range kinds {
		life := "on-demand"
		if k.spot {
			life = "spot"
		}
		each := "slots each"
		if k.slots == 1 {
			each = "slot each"
		}
		parts = append(parts, fmt.Sprintf("%d %s %s (%d %s)", n[k], k.typ, life, k.slots, each))
	}
	s := fmt.Sprintf("%d hosts", len(hosts)-leaving)
	if len(parts) > 0 {
		s += ": " + strings.Join(parts, ", ")
	}
	if leaving > 0 {
		s += fmt.Sprintf(" (and %d the cloud is taking away)", leaving)
	}
	return s
}

// checkPrices says where each host type's price comes from: what the cost and savings lines,
// and --max-cost, will have.
func checkPrices(ctx context.Context, c *cli.Context, o driver.Options, p providers.Provider, hosts []providers.Host) providers.Checks {
	var file *cost.File
	if path := c.String("prices"); path != "" {
		f, err := cost.ReadFile(path)
		if err != nil { // runOptions read it already
			return providers.Checks{providers.Fail("prices", err.Error(), "--prices")}
		}
		file = f
	}
	types := map[string]bool{}
	for _, h := range hosts {
		if h.Type != "" {
			types[h.Type] = true
		}
	}
	sp, _ := p.(providers.SpotPricer)
	if len(types) == 0 {
		what := "no host types known yet"
		if file != nil {
			what += fmt.Sprintf("; --prices %s has %d types", c.String("prices"), len(file.Types))
		}
		return providers.Checks{providers.Skipped("prices", what+": prices are read when hosts appear", "")}
	}
	names := slices.Sorted(maps.Keys(types))
	var spot map[string]map[string]float64
	var cs providers.Checks
	if sp != nil {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		got, err := sp.SpotPrices(sctx, names)
		cancel()
		if err != nil {
			cs = append(cs, providers.Fail("spot prices", err.Error(), "the cloud's spot prices need their read permission (see the permission lines above); --prices FILE stands in"))
		} else {
			spot = got
		}
	}
	var have, missing []string
	for _, t := range names {
		var from []string
		if len(spot[t]) > 0 {
			lo := slices.Min(slices.Collect(maps.Values(spot[t])))
			from = append(from, fmt.Sprintf("spot %.4g/h from the cloud (%d zones)", lo, len(spot[t])))
		}
		if file != nil {
			if r := file.Types[t]; r.Spot > 0 || r.OnDemand > 0 {
				from = append(from, fmt.Sprintf("--prices: on-demand %.4g, spot %.4g", r.OnDemand, r.Spot))
			}
		}
		if len(from) == 0 {
			missing = append(missing, t)
			continue
		}
		have = append(have, t+" "+strings.Join(from, "; "))
	}
	switch {
	case len(missing) > 0 && o.MaxCost > 0:
		cs = append(cs, providers.Fail("prices", "no price for "+strings.Join(missing, ", ")+": --max-cost cannot be kept", "give --prices FILE with each type's on-demand and spot price (examples/prices.yaml)"))
	case len(missing) > 0:
		cs = append(cs, providers.Skipped("prices", "no price for "+strings.Join(missing, ", ")+": the cost line counts hours only", "--prices FILE (examples/prices.yaml)"))
	default:
		cs = append(cs, providers.OK("prices", strings.Join(have, "; ")))
	}
	return cs
}

// checkLaunch checks that the workers can start where the launcher starts them: this machine
// for the local launcher (the hosts must be this machine, the command found), each host
// for ssh (a command started and its exit read), the agents' side being theirs to check.
func checkLaunch(ctx context.Context, c *cli.Context, o driver.Options, hosts []providers.Host) providers.Checks {
	switch launcherName(c) {
	case "local":
		var cs providers.Checks
		for _, h := range hosts {
			if !thisMachine(ctx, h.Addr) {
				cs = append(cs, providers.Fail("launcher", fmt.Sprintf("--launcher local runs every worker on this machine, but host %s is at %s", h.ID, h.Addr), "--launcher agent (elasticd agent on each host) or --launcher ssh"))
				break
			}
		}
		if len(o.Command) == 0 {
			return append(cs, providers.Skipped("command", "none given (after --)", ""))
		}
		path, err := exec.LookPath(o.Command[0])
		if err != nil {
			return append(cs, providers.Fail("command", err.Error(), "the program's path, or a PATH that has it"))
		}
		return append(cs, providers.OK("command", path))
	case "ssh":
		return checkSSH(ctx, o, hosts)
	default:
		addr := o.ListenAddr
		if host, port, err := net.SplitHostPort(addr); err == nil {
			if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
				host = driver.OutboundIP() // as the driver advertises itself
			}
			host = cmp.Or(o.AdvertiseHost, host)
			if port == "0" {
				port = "PORT" // chosen at start, and logged
			}
			addr = net.JoinHostPort(host, port)
		}
		return providers.Checks{providers.Skipped("agents", "checked on each host: the agents reach this driver at http://"+addr,
			"on a host: elasticd agent --check --driver http://"+addr+" --agent-secret-file FILE")}
	}
}

// checkSSH starts `true` on each host (at most 16 at a time) through the job's own ssh
// launcher: the same options, key and port the workers will have.
func checkSSH(ctx context.Context, o driver.Options, hosts []providers.Host) providers.Checks {
	if len(hosts) == 0 {
		return providers.Checks{providers.Skipped("ssh", "no hosts to reach", "")}
	}
	sctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	errs := make([]error, len(hosts))
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = sshTrue(sctx, o.Launcher, h.Addr)
		})
	}
	wg.Wait()
	var cs providers.Checks
	ok := 0
	for i, err := range errs {
		if err != nil {
			cs = append(cs, providers.Fail("ssh "+hosts[i].Addr, err.Error(), "ssh -o BatchMode=yes "+hosts[i].Addr+" true must work from this machine: --ssh-identity-file, --ssh-port, the host's authorized_keys"))
		} else {
			ok++
		}
	}
	if ok > 0 {
		cs = append(providers.Checks{providers.OK("ssh", fmt.Sprintf("a command started and exited 0 on %d of %d hosts", ok, len(hosts)))}, cs...)
	}
	return cs
}

// sshTrue runs `true` on host through l and reads its exit.
func sshTrue(ctx context.Context, l proc.Launcher, host string) error {
	p, err := l.Start(ctx, proc.Spec{Name: "check", Host: host, Command: []string{"true"}, Dir: "/"})
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		st, err := p.Wait()
		if err == nil && st.Code != 0 {
			err = fmt.Errorf("exit status %d", st.Code)
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		p.Stop(time.Second)
		return fmt.Errorf("no answer: %w", ctx.Err())
	}
}

// checkSecrets reads the secret files the flags name.
func checkSecrets(c *cli.Context) providers.Checks {
	var cs providers.Checks
	for _, f := range []string{"agent-secret-file", "admin-secret-file"} {
		path := c.String(f)
		if path == "" || (f == "agent-secret-file" && launcherName(c) != "agent") {
			continue
		}
		name := strings.TrimSuffix(f, "-file")
		b, err := os.ReadFile(path)
		if err != nil { // runOptions read it: a file that went away since
			cs = append(cs, providers.Fail(name, err.Error(), "--"+f))
			continue
		}
		n := len(strings.TrimSpace(string(b)))
		detail := fmt.Sprintf("%s, %d bytes", path, n)
		if st, err := os.Stat(path); err == nil {
			detail += ", mode " + st.Mode().Perm().String()
			if st.Mode().Perm()&0o077 != 0 {
				cs = append(cs, providers.Fail(name, detail+": other users can read it", "chmod 600 "+path))
				continue
			}
		}
		if n < protocol.MinAgentSecret {
			cs = append(cs, providers.Fail(name, detail, fmt.Sprintf("at least %d bytes: head -c 32 /dev/urandom | base64 > %s", protocol.MinAgentSecret, path)))
			continue
		}
		cs = append(cs, providers.OK(name, detail))
	}
	return cs
}

// checkListen binds the address the driver will listen on, and lets it go.
func checkListen(o driver.Options) providers.Check {
	addr := cmp.Or(o.ListenAddr, "127.0.0.1:0")
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fix := "--listen HOST:PORT with a free port"
		if errors.Is(err, os.ErrPermission) {
			fix = "a port above 1023, or run with the right to bind it"
		}
		return providers.Fail("listen", err.Error(), fix)
	}
	l.Close()
	if _, port, _ := net.SplitHostPort(addr); port == "0" {
		return providers.OK("listen", addr+": a free port is chosen at start (give --listen a fixed one to find the live page again)")
	}
	return providers.OK("listen", addr+" is free")
}

// checkDirs checks that the directories the job writes can be written: a file made and
// removed in each (a directory not there yet is made by the job: its nearest parent is
// checked).
func checkDirs(c *cli.Context, o driver.Options) providers.Checks {
	var cs providers.Checks
	for _, d := range []struct{ flag, dir string }{{"checkpoint-dir", o.CheckpointDir}, {"state-dir", o.StateDir}, {"output-dir", c.String("output-dir")}} {
		if d.dir == "" {
			continue
		}
		dir, err := filepath.Abs(d.dir)
		if err != nil {
			cs = append(cs, providers.Fail(d.flag, err.Error(), "--"+d.flag))
			continue
		}
		at := dir
		for {
			if _, err := os.Stat(at); err == nil || filepath.Dir(at) == at {
				break
			}
			at = filepath.Dir(at)
		}
		f, err := os.CreateTemp(at, ".elasticd-check-*")
		if err != nil {
			cs = append(cs, providers.Fail(d.flag, fmt.Sprintf("%s cannot be written: %v", dir, err), "--"+d.flag+" DIR that this user can write"))
			continue
		}
		f.Close()
		os.Remove(f.Name())
		detail := dir + " can be written"
		if d.flag == "state-dir" && o.Restore != nil {
			detail += fmt.Sprintf("; it holds job %s at generation %d, which the job takes up", o.Restore.JobID, o.Restore.Generation)
		}
		cs = append(cs, providers.OK(d.flag, detail))
	}
	return cs
}
