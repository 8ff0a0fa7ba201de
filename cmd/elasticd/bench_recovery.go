package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
)

// recoveryResult is `elasticd bench recovery --json`.
type recoveryResult struct {
	NP         int     `json:"np"`
	Runs       int     `json:"runs"`
	ColdStartS float64 `json:"cold_start_s"` // elasticd run started → first training step done
	RecoveryS  float64 `json:"recovery_s"`   // SIGKILL (or SIGSTOP, --fault stop) of a worker → first step done with the smaller world
	JoinS      float64 `json:"join_s"`       // the slot listed again after its cooldown → first step done with the full world
	StepsLost  float64 `json:"steps_lost"`   // last step done before the kill − step the smaller world resumed at
	// Flood is --flood: idle connections held open to the driver's port from just before the
	// kill to the end of the run; StatusS is how long GET /v1/status then took (-1: no answer).
	Flood   int     `json:"flood,omitempty"`
	StatusS float64 `json:"status_s,omitempty"`
}

func benchRecoveryCommand() *cli.Command {
	return &cli.Command{
		Name:  "recovery",
		Usage: "time cold start, recovery from a SIGKILLed worker, and rejoin, with the demo trainer",
		Description: `Runs 'elasticd run -np N' on this machine with the demo trainer (examples/train) --runs
times. In each run it waits for training, SIGKILLs the last-ranked worker by PID, and
measures, from the trainer's own timestamped step events:

   cold_start  elasticd run started           -> first step done
   recovery    the SIGKILL                    -> first step done by the N-1 survivors
   join        the dead slot listed again     -> first step done by N workers again
               (after its 1 s cooldown)
   steps_lost  last step done before the kill - the step the survivors resumed at

and prints the medians over the runs.`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "np", Value: 4, Usage: "workers (2-32)", EnvVars: []string{"ELASTICD_NP"}},
			&cli.IntFlag{Name: "runs", Value: 5, Usage: "jobs to run; medians are over them", EnvVars: []string{"ELASTICD_RUNS"}},
			&cli.StringFlag{Name: "trainer", Usage: "demo trainer binary (default: train beside elasticd, as make build puts it)", EnvVars: []string{"ELASTICD_TRAINER"}},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object", EnvVars: []string{"ELASTICD_JSON"}},
			&cli.StringFlag{Name: "fault", Value: "kill", Usage: "what happens to the last-ranked worker: kill (SIGKILL) or stop (SIGSTOP: a hung worker, found by its peers after --comm-timeout)", EnvVars: []string{"ELASTICD_FAULT"}},
			&cli.DurationFlag{Name: "comm-timeout", Value: time.Second, Usage: "the job's --comm-timeout (what a stopped worker costs at least)", EnvVars: []string{"ELASTICD_COMM_TIMEOUT"}},
			&cli.IntFlag{Name: "flood", Usage: "open this many idle TCP connections to the driver's port just before the kill and hold them (a connection flood; mind this process's open-file limit)", EnvVars: []string{"ELASTICD_FLOOD"}},
		},
		Action: benchRecovery,
	}
}

func benchRecovery(c *cli.Context) error {
	np, runs := c.Int("np"), c.Int("runs")
	switch {
	case np < 2 || np > 32:
		return usageError("np", "%d: must be between 2 and 32 (one worker is killed)", np)
	case runs < 1 || runs > 100:
		return usageError("runs", "%d: must be between 1 and 100", runs)
	}
	sig := map[string]syscall.Signal{"kill": syscall.SIGKILL, "stop": syscall.SIGSTOP}[c.String("fault")]
	if sig == 0 {
		return usageError("fault", "%q: want kill or stop", c.String("fault"))
	}
	if c.Duration("comm-timeout") <= 0 {
		return usageError("comm-timeout", "%v: must be positive", c.Duration("comm-timeout"))
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	trainer, err := demoTrainer(c, self)
	if err != nil {
		return err
	}
	flood := c.Int("flood")
	if flood < 0 || flood > 1_000_000 {
		return usageError("flood", "%d: want 0 (none) up to 1000000 connections", flood)
	}
	var cold, rec, join, lost, status []float64
	for i := range runs {
		r, err := recoveryRun(c.Context, self, trainer, np, flood, sig, c.Duration("comm-timeout"))
		if err != nil {
			return fmt.Errorf("run %d: %w", i+1, err)
		}
		cold, rec, join, lost, status = append(cold, r.ColdStartS), append(rec, r.RecoveryS), append(join, r.JoinS), append(lost, r.StepsLost), append(status, r.StatusS)
		if !c.Bool("json") {
			fmt.Fprintf(c.App.ErrWriter, "run %d: cold start %s, recovery %s, join %s, steps lost %.0f", i+1, fmtDur(r.ColdStartS), fmtDur(r.RecoveryS), fmtDur(r.JoinS), r.StepsLost)
			if flood > 0 {
				fmt.Fprintf(c.App.ErrWriter, ", /v1/status under the flood %s", fmtDur(r.StatusS))
			}
			fmt.Fprintln(c.App.ErrWriter)
		}
	}
	res := recoveryResult{NP: np, Runs: runs, ColdStartS: median(cold), RecoveryS: median(rec), JoinS: median(join), StepsLost: median(lost), Flood: flood}
	if flood > 0 {
		res.StatusS = median(status)
	}
	if c.Bool("json") {
		return json.NewEncoder(c.App.Writer).Encode(res)
	}
	fmt.Fprintf(c.App.Writer, "recovery: %d local workers, demo trainer, medians of %d runs\n  cold start  %s\n  recovery    %s\n  join        %s\n  steps lost  %.0f\n",
		np, runs, fmtDur(res.ColdStartS), fmtDur(res.RecoveryS), fmtDur(res.JoinS), res.StepsLost)
	if flood > 0 {
		fmt.Fprintf(c.App.Writer, "  under a flood of %d idle connections to the driver's port; GET /v1/status took %s\n", flood, fmtDur(res.StatusS))
	}
	return nil
}

var (
	eventRe    = regexp.MustCompile(`event step=(\d+) world=(\d+) gen=\d+ t=(\d+)`)
	resumeRe   = regexp.MustCompile(`world size (\d+), resuming at step (\d+)`)
	launchedRe = regexp.MustCompile(`launched worker" worker=(\S+) rank=(\d+) generation=1 pid=(\d+)`)
)

// demoTrainer is --trainer, or the demo trainer beside this binary (make build puts it there).
func demoTrainer(c *cli.Context, self string) (string, error) {
	trainer := c.String("trainer")
	if trainer == "" {
		trainer = filepath.Join(filepath.Dir(self), "train")
	}
	if st, err := os.Stat(trainer); err != nil || st.IsDir() {
		return "", usageError("trainer", "%q not found: run make build, or give the demo trainer's path", trainer)
	}
	return trainer, nil
}

// startChild starts this binary (self) with args, its stdout and stderr together on the
// returned reader, which ends once the process has exited; wg waits for that. The end of ctx
// sends it SIGTERM, and SIGKILL 10 s later.
func startChild(ctx context.Context, wg *sync.WaitGroup, self string, args ...string) (*exec.Cmd, io.Reader, error) {
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.SysProcAttr = childProcAttr()
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	wg.Go(func() { cmd.Wait(); pw.Close() })
	return cmd, pr, nil
}

// recoveryRun runs one job and measures it; the job is stopped (SIGTERM, then SIGKILL) at the end.
func recoveryRun(ctx context.Context, self, trainer string, np, flood int, sig syscall.Signal, commTimeout time.Duration) (recoveryResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	cmd, pr, err := startChild(ctx, &wg, self, "run", "-np", strconv.Itoa(np), "--min-np", strconv.Itoa(np-1),
		"--blacklist-cooldown-range", "1s,1s", "--discovery-interval", "100ms", "--stop-grace", "1s", "--comm-timeout", commTimeout.String(),
		"--", trainer, "--steps", "100000000", "--step-delay", "2ms", "--events", "--log-every", "100000000")
	if err != nil {
		return recoveryResult{}, err
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		go io.Copy(io.Discard, pr) // keep draining until the job has exited
		wg.Wait()
	}()

	var (
		r                             = recoveryResult{NP: np}
		victim, lastFull, resumed     int // lastFull: last step done by the full world
		killedAt, rejoinAt            time.Time
		gotCold, gotRecovery, gotJoin bool
		driverAddr                    string
	)
	var held []net.Conn // the flood
	statusCh := make(chan float64, 1)
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		line := sc.Text()
		if m := listeningRe.FindStringSubmatch(line); m != nil {
			driverAddr = m[1]
		}
		if m := launchedRe.FindStringSubmatch(line); m != nil && m[2] == strconv.Itoa(np-1) {
			victim, _ = strconv.Atoi(m[3])
		}
		if m := resumeRe.FindStringSubmatch(line); m != nil && !killedAt.IsZero() && !gotRecovery {
			resumed, _ = strconv.Atoi(m[2])
		}
		if !killedAt.IsZero() && rejoinAt.IsZero() && regexpHostsChanged.MatchString(line) {
			rejoinAt = time.Now()
		}
		m := eventRe.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		step, _ := strconv.Atoi(m[1])
		world, _ := strconv.Atoi(m[2])
		ns, _ := strconv.ParseInt(m[3], 10, 64)
		t := time.Unix(0, ns)
		if world == np && !gotRecovery {
			lastFull = step // events of steps done before the kill may still arrive after it
		}
		switch {
		case !gotCold:
			r.ColdStartS, gotCold = t.Sub(start).Seconds(), true
		case killedAt.IsZero() && step >= 50:
			if victim == 0 {
				return r, fmt.Errorf("no pid logged for rank %d", np-1)
			}
			if flood > 0 {
				if held, err = floodConns(driverAddr, flood); err != nil {
					return r, err
				}
			}
			killedAt = time.Now()
			syscall.Kill(victim, sig)
			if sig != syscall.SIGKILL {
				defer syscall.Kill(victim, syscall.SIGKILL) // the driver kills it; if not, this run does
			}
			if flood > 0 {
				go func() { statusCh <- statusTime(driverAddr) }()
			}
		case killedAt.IsZero():
		case !gotRecovery && world == np-1:
			r.RecoveryS, gotRecovery = t.Sub(killedAt).Seconds(), true
			r.StepsLost = float64(lastFull - resumed)
		case gotRecovery && !gotJoin && world == np && !rejoinAt.IsZero():
			r.JoinS, gotJoin = t.Sub(rejoinAt).Seconds(), true
			if flood > 0 {
				r.StatusS = <-statusCh // at most its client's 30 s timeout
			}
			return r, nil
		}
	}
	return r, fmt.Errorf("the job ended before all was measured (cold start %v, recovery %v, join %v)", gotCold, gotRecovery, gotJoin)
}

var regexpHostsChanged = regexp.MustCompile(`msg="hosts changed`)

// floodConns opens n idle TCP connections to addr (a connection flood), as fast as it can;
// connections the driver closes meanwhile are not reopened.
func floodConns(addr string, n int) ([]net.Conn, error) {
	if addr == "" {
		return nil, fmt.Errorf("--flood: the driver's address was not logged")
	}
	conns := make([]net.Conn, 0, n)
	for range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return nil, fmt.Errorf("--flood: connection %d of %d: %w (raise this process's open-file limit, ulimit -n)", len(conns)+1, n, err)
		}
		conns = append(conns, c)
	}
	return conns, nil
}

// statusTime is how long GET /v1/status takes at addr, in seconds; -1 when it fails or takes
// more than 30 s.
func statusTime(addr string) float64 {
	start := time.Now()
	cl := &http.Client{Timeout: 30 * time.Second}
	resp, err := cl.Get("http://" + addr + "/v1/status")
	if err != nil {
		return -1
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return -1
	}
	return time.Since(start).Seconds()
}
