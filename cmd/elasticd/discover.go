package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/elasticd/elasticd/driver/discovery"
	"github.com/elasticd/elasticd/providers"
	"github.com/urfave/cli/v2"
)

func discoverCommand() *cli.Command {
	return &cli.Command{
		Name:  "discover",
		Usage: "print the hosts a provider finds (as discovery-script lines, or JSON)",
		Description: `Polls the provider once and prints one host:slots line per usable host, the format of
--host-discovery-script, so the output can be checked or fed to another tool. Hosts the
cloud is already taking away are left out (shown with --json).

   elasticd discover --provider aws --asg my-gpu-asg --region us-east-1
   elasticd discover --provider gcp --project p --zone us-central1-a --mig gpus --json
   elasticd discover --provider aws --asg my-gpu-asg --sqs-queue-url URL --watch

--watch keeps polling and prints each change of the host set and each notice (spot
interruptions, scale-ins) as it happens, until interrupted.`,
		Flags: append(providerFlags(),
			&cli.BoolFlag{Name: "json", Usage: "print every field as JSON (one object per host; with --watch, one object per event)", EnvVars: []string{"ELASTICD_JSON"}},
			&cli.BoolFlag{Name: "watch", Usage: "keep watching: print host changes and notices as they happen", EnvVars: []string{"ELASTICD_WATCH"}},
			&cli.DurationFlag{Name: "discovery-interval", Value: time.Second, Usage: "with --watch: pause between polls", EnvVars: []string{"ELASTICD_DISCOVERY_INTERVAL"}},
		),
		Action: discover,
	}
}

// hostJSON is a host as `discover --json` prints it.
type hostJSON struct {
	ID       string    `json:"id"`
	Addr     string    `json:"addr"`
	Slots    int       `json:"slots"`
	Zone     string    `json:"zone,omitempty"`
	Spot     bool      `json:"spot"`
	Type     string    `json:"type,omitempty"`
	Launched time.Time `json:"launched,omitzero"`
	Leaving  bool      `json:"leaving,omitempty"`
}

func toJSON(h providers.Host) hostJSON {
	return hostJSON{ID: h.ID, Addr: h.Addr, Slots: h.Slots, Zone: h.Zone, Spot: h.Spot, Type: h.Type, Launched: h.Launched, Leaving: h.Leaving}
}

func discover(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("discover takes no arguments, got %q", c.Args().First()), 2)
	}
	if c.Duration("discovery-interval") <= 0 {
		return usageError("discovery-interval", "%v: must be positive, e.g. 1s", c.Duration("discovery-interval"))
	}
	log := slog.New(slog.NewTextHandler(c.App.ErrWriter, &slog.HandlerOptions{Level: slog.LevelWarn, ReplaceAttr: shortTime}))
	p, err := buildProvider(c, 1, log)
	if err != nil {
		return err
	}
	out := c.App.Writer
	if !c.Bool("watch") {
		ctx, cancel := context.WithTimeout(c.Context, c.Duration("discovery-timeout"))
		defer cancel()
		hosts, err := p.Hosts(ctx)
		if err != nil {
			return fmt.Errorf("discover: %w", err)
		}
		printHosts(out, hosts, c.Bool("json"))
		return nil
	}
	return watch(c, p, log)
}

func printHosts(w io.Writer, hosts []providers.Host, asJSON bool) {
	hosts = slices.Clone(hosts)
	slices.SortFunc(hosts, func(a, b providers.Host) int { return strings.Compare(a.ID, b.ID) })
	enc := json.NewEncoder(w)
	for _, h := range hosts {
		switch {
		case asJSON:
			enc.Encode(toJSON(h))
		case !h.Leaving:
			fmt.Fprintln(w, h.Addr+":"+strconv.Itoa(h.Slots))
		}
	}
}

// watch prints host-set changes and notices until ctx ends; the first poll's failure is fatal.
func watch(c *cli.Context, p providers.Provider, log *slog.Logger) error {
	ctx, cancel := context.WithCancel(c.Context)
	defer cancel()
	w := &discovery.Watcher{Provider: p, Interval: c.Duration("discovery-interval"), Timeout: c.Duration("discovery-timeout"), Logger: log}
	hostsCh := make(chan []providers.Host)
	noticeCh := make(chan providers.Notice)
	errc := make(chan error, 1)
	go func() { errc <- w.Run(ctx, hostsCh) }()
	done := make(chan struct{})
	go func() { defer close(done); w.RunNotices(ctx, noticeCh) }()
	defer func() { cancel(); <-done }()
	enc := json.NewEncoder(c.App.Writer)
	var prev map[string]providers.Host
	for {
		select {
		case err := <-errc:
			if ctx.Err() != nil || c.Context.Err() != nil {
				return nil // interrupted
			}
			return fmt.Errorf("discover: %w", err)
		case hs := <-hostsCh:
			now := time.Now().Format("15:04:05")
			if c.Bool("json") {
				list := make([]hostJSON, len(hs))
				for i, h := range hs {
					list[i] = toJSON(h)
				}
				enc.Encode(map[string]any{"event": "hosts", "time": time.Now(), "hosts": list})
			} else {
				cur := map[string]providers.Host{}
				for _, h := range hs {
					cur[h.ID] = h
					old, ok := prev[h.ID]
					switch {
					case !ok:
						fmt.Fprintf(c.App.Writer, "%s + %s %s:%d %s%s\n", now, h.ID, h.Addr, h.Slots, h.Type, leavingMark(h))
					case !providers.SameHost(old, h):
						fmt.Fprintf(c.App.Writer, "%s ~ %s %s:%d %s%s\n", now, h.ID, h.Addr, h.Slots, h.Type, leavingMark(h))
					}
				}
				for id, h := range prev {
					if _, ok := cur[id]; !ok {
						fmt.Fprintf(c.App.Writer, "%s - %s %s\n", now, id, h.Addr)
					}
				}
				prev = cur
			}
		case n := <-noticeCh:
			if c.Bool("json") {
				enc.Encode(map[string]any{"event": "notice", "time": time.Now(), "id": n.ID, "host": n.HostID, "kind": n.Kind, "deadline": n.Deadline, "detail": n.Detail})
			} else {
				dl := ""
				if !n.Deadline.IsZero() {
					dl = " deadline " + n.Deadline.Format(time.RFC3339)
				}
				fmt.Fprintf(c.App.Writer, "%s ! %s %s%s %s\n", time.Now().Format("15:04:05"), n.Kind, n.HostID, dl, n.Detail)
			}
		}
	}
}

func leavingMark(h providers.Host) string {
	if h.Leaving {
		return " (leaving)"
	}
	return ""
}
