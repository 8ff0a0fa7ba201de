package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/elasticd/elasticd/driver"
	"github.com/elasticd/elasticd/driver/cost"
	"github.com/urfave/cli/v2"
)

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "print a running job's status: world size, progress, hosts, recent events, cost",
		Description: `Reads GET /v1/status from the driver of 'elasticd run' (the URL its log prints at start:
"live page at http://HOST:PORT/") and prints a summary; --json prints the answer as it
came (documented in docs/protocol.md §6). Needs no secret: the status is read-only.

A fleet of thousands is counted by state, and --hosts of its hosts listed (100 by default),
those of --state only if given; the driver sends just those.

Examples:
   elasticd status --driver http://10.0.0.5:29400
   elasticd status --driver http://10.0.0.5:29400 --state leaving --hosts 1000
   elasticd status --driver http://127.0.0.1:29400 --json | jq .cost`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "driver", Usage: "the driver's `URL`, e.g. http://10.0.0.5:29400 (required)", EnvVars: []string{"ELASTICD_DRIVER"}},
			&cli.BoolFlag{Name: "json", Usage: "print the JSON answer as it came"},
			&cli.IntFlag{Name: "events", Value: 10, Usage: "how many recent events to print"},
			&cli.IntFlag{Name: "hosts", Value: 100, Usage: "list at most `N` hosts (0: only their counts by state); --json lists every host unless this is given"},
			&cli.StringFlag{Name: "state", Usage: "list only the hosts in `STATE`: " + strings.Join(driver.HostStates, ", ")},
			&cli.DurationFlag{Name: "timeout", Value: 10 * time.Second, Usage: "how long to wait for the driver"},
		},
		Action: showStatus,
	}
}

func showStatus(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("status: unexpected argument %q: the driver's URL goes in --driver", c.Args().First()), 2)
	}
	base := c.String("driver")
	if base == "" {
		return usageError("driver", "required: the driver's URL, e.g. --driver http://10.0.0.5:29400 (its log prints it at start)")
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usageError("driver", "%q: want http://HOST:PORT", base)
	}
	if c.Int("events") < 0 {
		return usageError("events", "%d: must be 0 or more", c.Int("events"))
	}
	if c.Int("hosts") < 0 {
		return usageError("hosts", "%d: must be 0 or more", c.Int("hosts"))
	}
	state := c.String("state")
	if state != "" && !slices.Contains(driver.HostStates, state) {
		return usageError("state", "%q: want a host state, one of %s", state, strings.Join(driver.HostStates, ", "))
	}
	// The page of hosts to ask for: every host for --json as it came, unless asked otherwise.
	q := url.Values{}
	if state != "" {
		q.Set("state", state)
	}
	if !c.Bool("json") || c.IsSet("hosts") {
		q.Set("limit", strconv.Itoa(c.Int("hosts")))
	}
	target := strings.TrimRight(base, "/") + "/v1/status"
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	body, err := fetchStatus(ctx, target)
	if err != nil {
		return cli.Exit(fmt.Sprintf("status: %v", err), 1)
	}
	if c.Bool("json") {
		_, err := c.App.Writer.Write(body)
		return err
	}
	var s driver.Status
	if err := json.Unmarshal(body, &s); err != nil {
		return cli.Exit(fmt.Sprintf("status: %s did not answer a job status: %v", base, err), 1)
	}
	if s.HostsTotal == 0 { // an older driver, which lists every host whatever was asked
		s.HostsTotal, s.HostsMatching = len(s.Hosts), len(s.Hosts)
	}
	if n := c.Int("hosts"); len(s.Hosts) > n {
		s.Hosts = s.Hosts[:n]
	}
	printJobStatus(c.App.Writer, &s, c.Int("events"))
	return nil
}

func fetchStatus(ctx context.Context, target string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the driver: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", target, resp.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
}

// printJobStatus writes a readable summary of s.
func printJobStatus(w io.Writer, s *driver.Status, events int) {
	elapsed := (time.Duration(s.ElapsedSeconds) * time.Second).String()
	fmt.Fprintf(w, "job %s: %s, generation %d, world size %d (np %d, min %d, max %d), %s mode, running for %s\n",
		s.JobID, s.Phase, s.Generation, s.WorldSize, s.NP, s.MinNP, s.MaxNP, s.Mode, elapsed)
	if s.Finished != nil {
		fmt.Fprintf(w, "finished: exit %d: %s\n", s.Finished.Code, s.Finished.Reason)
	}
	p := s.Progress
	rate := "not stepping"
	if p.StepsPerSecond > 0 {
		rate = fmt.Sprintf("%.1f steps/s", p.StepsPerSecond)
	}
	step := fmt.Sprintf("step %d", p.Step)
	if p.TotalSteps > 0 {
		step += fmt.Sprintf(" of %d", p.TotalSteps)
	}
	if p.ETASeconds != nil && s.Finished == nil {
		rate += fmt.Sprintf(", %s to go", (time.Duration(*p.ETASeconds) * time.Second).String())
	}
	if p.Loss != nil {
		rate += fmt.Sprintf("; loss %.4g", *p.Loss)
	}
	fmt.Fprintf(w, "progress: %s, committed %d, %s; rolled back %d steps\n", step, p.CommittedStep, rate, p.RolledBackSteps)
	var causes []string
	for _, c := range driver.ResetCauses {
		causes = append(causes, fmt.Sprintf("%s %d", c, s.ResetsByCause[c]))
	}
	fmt.Fprintf(w, "resets: %d (%s)\n", s.Resets, strings.Join(causes, ", "))
	for _, n := range s.Notices {
		fmt.Fprintf(w, "notices: %d %s from %s\n", n.Count, n.Kind, n.Provider)
	}
	if s.Cost != nil {
		fmt.Fprintf(w, "%s\n", costLine(s))
	}
	fmt.Fprintf(w, "hosts: %d%s\n", s.HostsTotal, hostCounts(s.HostStates))
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tADDR\tSTATE\tLIFECYCLE\tTYPE\tZONE\tSLOTS\tBLACKLISTED\tPRICE/H")
	for _, h := range s.Hosts {
		price := "-"
		if h.PricePerHour != nil && s.Cost != nil {
			price = cost.Format(s.Cost.Currency, *h.PricePerHour)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", h.ID, h.Addr, h.State, h.Lifecycle, dash(h.Type), dash(h.Zone), h.Slots, h.Blacklisted, price)
	}
	tw.Flush()
	if more := s.HostsMatching - len(s.Hosts); more > 0 {
		fmt.Fprintf(w, "%d more hosts not listed (--hosts N lists more, --state STATE those in one state)\n", more)
	}
	if events > 0 && len(s.Events) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "recent events:")
		from := max(0, len(s.Events)-events)
		for _, e := range s.Events[from:] {
			fmt.Fprintf(w, "  %s  %-12s %s\n", e.At.Local().Format("15:04:05"), e.Kind, e.Message)
		}
	}
}

// hostCounts is " (active 9800, leaving 200)": the states with hosts, in driver.HostStates'
// order; "" when none is known.
func hostCounts(by map[string]int) string {
	var parts []string
	for _, st := range driver.HostStates {
		if n := by[st]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", st, n))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// costLine is the cost in one line: what the job cost, what it saved against the same hours
// at on-demand prices, and what the work rolled back cost. The job's last line, and `elasticd
// status`. With no price known for any of its instance time it says "unpriced", not a zero
// that reads as free, and how to get prices.
func costLine(s *driver.Status) string {
	c := s.Cost
	if c == nil {
		return "cost: unknown"
	}
	var hours float64
	priced := false
	for _, l := range c.Lines {
		hours += l.Seconds / 3600
		priced = priced || l.Cost != nil
	}
	f := func(v float64) string { return cost.Format(c.Currency, v) }
	var line string
	switch {
	case len(c.Lines) == 0:
		line = "cost: nothing to price: no host was in the job"
	case !priced:
		line = fmt.Sprintf("cost: unpriced, %.2f instance-hours with no price (%s): give --prices FILE, each instance type's spot and on-demand price per hour (examples/prices.yaml); on AWS the spot prices come by themselves", hours, strings.Join(c.Unpriced, ", "))
	default:
		line = fmt.Sprintf("cost %s for %.2f instance-hours (%s on spot instances, %s on on-demand instances)", f(c.Total), hours, f(c.Spot), f(c.OnDemand))
		if c.OnDemandEquivalent > 0 {
			line += fmt.Sprintf("; saved %s (%.0f%%) against %s for the same hours at on-demand prices", f(c.Savings), c.SavingsPercent, f(c.OnDemandEquivalent))
		}
	}
	rolledBack := func(steps uint64) string {
		if !priced {
			return fmt.Sprintf("%d steps", steps)
		}
		return fmt.Sprintf("%d steps, %s", steps, f(c.RolledBack))
	}
	switch p := s.Progress; {
	case s.Mode == "restart" && p.UpdatedAt == nil && s.Resets > 0:
		line += "; work thrown away by restarts unknown: the script reports no progress (elasticd.progress, docs/pytorch.md)"
	case p.UnreportedRestarts > 0:
		line += fmt.Sprintf("; rollbacks threw away %s, and an unknown amount in %d %s where the script reported no progress", rolledBack(p.RolledBackSteps), p.UnreportedRestarts, plural(p.UnreportedRestarts, "restart"))
	default:
		line += fmt.Sprintf("; rollbacks threw away %s", rolledBack(p.RolledBackSteps))
	}
	if priced && len(c.Unpriced) > 0 {
		line += fmt.Sprintf("; no price for %s (left out of the totals): give --prices FILE", strings.Join(c.Unpriced, ", "))
	}
	return line
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
