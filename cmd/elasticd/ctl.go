package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/elasticd/elasticd/driver/admin"
	"github.com/elasticd/elasticd/providers"
	"github.com/urfave/cli/v2"
)

func ctlCommand() *cli.Command {
	return &cli.Command{
		Name:  "ctl",
		Usage: "add or remove hosts of a running job, show its status, or end it (the driver's admin API)",
		UsageText: "elasticd ctl [--driver URL] [--admin-secret-file FILE] add-host HOST[:SLOTS]\n" +
			"elasticd ctl [--driver URL] [--admin-secret-file FILE] remove-host HOST [--force]\n" +
			"elasticd ctl [--driver URL] [--admin-secret-file FILE] status [--json]\n" +
			"elasticd ctl [--driver URL] [--admin-secret-file FILE] stop [REASON]",
		Description: `For platforms that manage their machines themselves: tell a running 'elasticd run' to
take a host in or to let one go, without restarting the job.

   add-host HOST[:SLOTS]   the job grows onto HOST: the driver polls discovery at once, its
                           workers start, and the others take them in at their next
                           commit. A host removed before (stopped)
                           comes back as it was, its workers under the same IDs.
   remove-host HOST        HOST's workers leave at their next commit, without rollback, and
                           the host is kept as stopped. Refused when fewer usable slots than
                           the job's --min-np would be left, unless --force.
   status                  generation, world size, the hosts (active, pending, stopped,
                           blacklisted slots) and the workers by rank; --json for scripts.
   stop [REASON]           end the job for good: its workers are stopped (SIGTERM, then
                           SIGKILL after --stop-grace), it exits with status 130 saying
                           REASON, and with --manage-capacity its groups go to zero.

HOST is an address or hostname (an instance ID also names a host the provider found).

The driver must run with --admin-secret-file; ctl signs its requests with the same file
and checks that the answers are signed with it. The driver listens on its --listen address
(with the local launcher 127.0.0.1 only, so run ctl on the same machine or set --listen).

Examples:
   export ELASTICD_DRIVER=http://127.0.0.1:29400 ELASTICD_ADMIN_SECRET_FILE=/etc/elasticd/admin-secret
   elasticd ctl add-host 10.0.0.7:4
   elasticd ctl remove-host 10.0.0.5
   elasticd ctl remove-host 10.0.0.5 --force
   elasticd ctl --driver http://10.0.0.2:29400 status --json
   elasticd ctl stop "done: loss plateaued"

Flags of ctl come before the command (elasticd ctl --driver URL status), or from the
environment. Exit status: 0 done; 1 the driver refused (its reason is printed) or could
not be reached; 2 bad usage.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "driver", Usage: "the driver's `URL`: http:// and its --listen address, e.g. http://127.0.0.1:29400", EnvVars: []string{"ELASTICD_DRIVER"}},
			&cli.StringFlag{Name: "admin-secret-file", Usage: "`FILE` holding the admin secret the driver was started with (its --admin-secret-file)", EnvVars: []string{"ELASTICD_ADMIN_SECRET_FILE"}},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return cli.Exit(fmt.Sprintf("ctl: unknown command %q: use add-host, remove-host, status or stop (see elasticd ctl --help)", c.Args().First()), 2)
			}
			return cli.Exit("ctl: name a command: add-host, remove-host, status or stop (see elasticd ctl --help)", 2)
		},
		Subcommands: []*cli.Command{
			{
				Name:      "add-host",
				Usage:     "add a host to the job, bring a stopped one back, or take back the quarantined (flapping) slots of one in it",
				ArgsUsage: "HOST[:SLOTS]",
				Action:    ctlAddHost,
			},
			{
				Name:      "remove-host",
				Usage:     "remove a host from the job; its workers leave at their next commit",
				ArgsUsage: "HOST [--force]",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "force", Usage: "remove even if fewer usable slots than the job's --min-np are left (the job then waits for slots, up to its --elastic-timeout)"},
				},
				Action: ctlRemoveHost,
			},
			{
				Name:  "status",
				Usage: "show the job's generation, hosts and workers",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "json", Usage: "print the driver's JSON answer"},
				},
				Action: ctlStatus,
			},
			{
				Name:      "stop",
				Usage:     "end the job: its workers are stopped, and a managed group goes to zero",
				ArgsUsage: "[REASON]",
				Action:    ctlStop,
			},
		},
	}
}

// ctlClient reads ctl's flags into a client of the driver's admin API.
func ctlClient(c *cli.Context) (*admin.Client, error) {
	raw := c.String("driver")
	if raw == "" {
		return nil, usageError("driver", "required: the driver's URL, e.g. --driver http://127.0.0.1:29400 (before the command, or ELASTICD_DRIVER)")
	}
	if u, err := url.Parse(raw); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usageError("driver", "%q: want the driver's http(s) URL, e.g. http://127.0.0.1:29400", raw)
	}
	if !c.IsSet("admin-secret-file") {
		return nil, usageError("admin-secret-file", "required: the file holding the admin secret the driver was started with (before the command, or ELASTICD_ADMIN_SECRET_FILE)")
	}
	log := slog.New(slog.NewTextHandler(c.App.ErrWriter, &slog.HandlerOptions{ReplaceAttr: shortTime}))
	secret, err := readSecretFile("admin-secret-file", c.String("admin-secret-file"), log)
	if err != nil {
		return nil, err
	}
	cl, err := admin.NewClient(raw, secret, nil)
	if err != nil {
		return nil, usageError("admin-secret-file", "%v", err)
	}
	return cl, nil
}

// ctlFailed is the driver refusing or not answering: exit 1 with the reason on one line.
func ctlFailed(what string, err error) error {
	return cli.Exit(what+": "+strings.ReplaceAll(err.Error(), "\n", " "), 1)
}

func ctlContext(c *cli.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.Context, 30*time.Second)
}

func ctlAddHost(c *cli.Context) error {
	if c.NArg() != 1 {
		return cli.Exit("add-host: want one HOST[:SLOTS], e.g. elasticd ctl add-host 10.0.0.7:4", 2)
	}
	spec := c.Args().First()
	hs, err := providers.ParseHosts(spec, 1)
	if err != nil {
		return cli.Exit(fmt.Sprintf("add-host %s: %s", spec, strings.TrimPrefix(err.Error(), fmt.Sprintf("host list entry 1 %q: ", spec))), 2)
	}
	// Without ":SLOTS", let the driver choose: a stopped host keeps its count.
	slots := hs[0].Slots
	if again, _ := providers.ParseHosts(spec, 2); again[0].Slots != slots {
		slots = 0
	}
	cl, err := ctlClient(c)
	if err != nil {
		return err
	}
	ctx, cancel := ctlContext(c)
	defer cancel()
	ch, err := cl.AddHost(ctx, hs[0].Addr, slots)
	if err != nil {
		return ctlFailed("add-host "+spec, err)
	}
	h := ch.Host
	switch ch.Action {
	case "released":
		fmt.Fprintf(c.App.Writer, "host %s: %d quarantined %s back in the job (their failure history forgotten)\n", h.ID, h.Slots, plural(h.Slots, "slot"))
	case "restarted":
		fmt.Fprintf(c.App.Writer, "host %s is back (%d %s): its workers restart under their old IDs once the driver's next discovery poll sees it\n", h.ID, h.Slots, plural(h.Slots, "slot"))
	default:
		fmt.Fprintf(c.App.Writer, "added host %s (%d %s): the job grows onto it after the driver's next discovery poll, at the workers' next commit\n", h.ID, h.Slots, plural(h.Slots, "slot"))
	}
	return nil
}

func ctlRemoveHost(c *cli.Context) error {
	// urfave/cli stops at the first argument: accept "HOST --force" as well as "--force HOST".
	force := c.Bool("force")
	var args []string
	for _, a := range c.Args().Slice() {
		switch a {
		case "--force", "-force":
			force = true
		default:
			if strings.HasPrefix(a, "-") {
				return cli.Exit(fmt.Sprintf("remove-host: unknown flag %s: only --force", a), 2)
			}
			args = append(args, a)
		}
	}
	if len(args) != 1 {
		return cli.Exit("remove-host: want one HOST (its address or ID), e.g. elasticd ctl remove-host 10.0.0.5", 2)
	}
	host := args[0]
	cl, err := ctlClient(c)
	if err != nil {
		return err
	}
	ctx, cancel := ctlContext(c)
	defer cancel()
	ch, err := cl.RemoveHost(ctx, host, force)
	if err != nil {
		return ctlFailed("remove-host "+host, err)
	}
	h := ch.Host
	fmt.Fprintf(c.App.Writer, "removed host %s (%d %s): its workers leave at their next commit after the driver's next discovery poll; it is kept as stopped (elasticd ctl add-host %s brings it back)\n", h.ID, h.Slots, plural(h.Slots, "slot"), h.ID)
	return nil
}

func ctlStop(c *cli.Context) error {
	if c.NArg() > 1 {
		return cli.Exit("stop: one REASON at most (quote it)", 2)
	}
	cl, err := ctlClient(c)
	if err != nil {
		return err
	}
	ctx, cancel := ctlContext(c)
	defer cancel()
	if _, err := cl.Stop(ctx, c.Args().First()); err != nil {
		return ctlFailed("stop", err)
	}
	fmt.Fprintln(c.App.Writer, "stopping the job: its workers are being stopped")
	return nil
}

func ctlStatus(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("status: unexpected argument %q (flags: --json)", c.Args().First()), 2)
	}
	cl, err := ctlClient(c)
	if err != nil {
		return err
	}
	ctx, cancel := ctlContext(c)
	defer cancel()
	s, err := cl.Status(ctx)
	if err != nil {
		return ctlFailed("status", err)
	}
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	printStatus(c, s)
	return nil
}

func printStatus(c *cli.Context, s admin.Status) {
	out := c.App.Writer
	fmt.Fprintf(out, "generation %d, world size %d, %s (--min-np %d, --max-np %d, resets %d)\n\n", s.Generation, s.WorldSize, s.Phase, s.MinNP, s.MaxNP, s.Resets)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tADDR\tSLOTS\tSTATE\tBLACKLISTED\tWORKERS")
	type row struct {
		w    admin.Worker
		host string
	}
	var ranked, other []row
	for _, h := range s.Hosts {
		state := h.State
		if h.Added {
			state += " (added)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%d\n", h.ID, h.Addr, h.Slots, state, h.BlacklistedSlots, len(h.Workers))
		for _, w := range h.Workers {
			if w.Rank >= 0 {
				ranked = append(ranked, row{w, h.ID})
			} else {
				other = append(other, row{w, h.ID})
			}
		}
	}
	tw.Flush()
	if len(ranked)+len(other) == 0 {
		fmt.Fprintln(out, "\nno workers")
		return
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RANK\tWORKER\tHOST\tSTATE")
	// Dense ranks 0..n-1, then the workers outside the generation (stopping).
	slices.SortFunc(ranked, func(a, b row) int { return a.w.Rank - b.w.Rank })
	for _, x := range ranked {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", x.w.Rank, x.w.ID, x.host, x.w.State)
	}
	for _, x := range other {
		fmt.Fprintf(tw, "-\t%s\t%s\t%s\n", x.w.ID, x.host, x.w.State)
	}
	tw.Flush()
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
