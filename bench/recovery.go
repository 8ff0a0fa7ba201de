package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// RecoveryResult is what Recovery measures: `elasticd bench recovery --json`.
type RecoveryResult struct {
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

// RecoveryOptions configure Recovery; the flags of `elasticd bench recovery`.
type RecoveryOptions struct {
	Exe         string        // the elasticd binary the job runs as ("": this process's)
	Trainer     string        // the demo trainer ("": train beside Exe, as make build puts it)
	NP          int           // workers, 2 to 32
	Runs        int           // jobs to run, 1 to 100; medians are over them
	Fault       string        // what happens to the last-ranked worker: "kill" (SIGKILL) or "stop" (SIGSTOP)
	CommTimeout time.Duration // the job's --comm-timeout (what a stopped worker costs at least)
	Flood       int           // idle TCP connections held open to the driver's port from just before the fault
	JSON        bool          // one JSON object instead of text
	Out         io.Writer     // the medians (nil: discarded)
	Err         io.Writer     // one line per run unless JSON (nil: discarded)
}

// Recovery runs `Exe run -np NP` with the demo trainer Runs times; in each it waits for
// training, kills (or stops) the last-ranked worker by PID, and measures cold start, recovery,
// rejoin and the steps lost from the trainer's timestamped step events. It prints the
// medians to Out and returns them.
func Recovery(ctx context.Context, o RecoveryOptions) (RecoveryResult, error) {
	np, runs := o.NP, o.Runs
	switch {
	case np < 2 || np > 32:
		return RecoveryResult{}, usageError("np", "%d: must be between 2 and 32 (one worker is killed)", np)
	case runs < 1 || runs > 100:
		return RecoveryResult{}, usageError("runs", "%d: must be between 1 and 100", runs)
	}
	sig := map[string]syscall.Signal{"kill": syscall.SIGKILL, "stop": syscall.SIGSTOP}[o.Fault]
	if sig == 0 {
		return RecoveryResult{}, usageError("fault", "%q: want kill or stop", o.Fault)
	}
	if o.CommTimeout <= 0 {
		return RecoveryResult{}, usageError("comm-timeout", "%v: must be positive", o.CommTimeout)
	}
	self, err := executable(o.Exe)
	if err != nil {
		return RecoveryResult{}, err
	}
	trainer, err := demoTrainer(o.Trainer, self)
	if err != nil {
		return RecoveryResult{}, err
	}
	flood := o.Flood
	if flood < 0 || flood > 1_000_000 {
		return RecoveryResult{}, usageError("flood", "%d: want 0 (none) up to 1000000 connections", flood)
	}
	out, errw := writers(o.Out, o.Err)
	logs := newJobLog()
	var cold, rec, join, lost, status []float64
	for i := range runs {
		r, err := recoveryRun(ctx, logs, self, trainer, np, flood, sig, o.CommTimeout)
		if err != nil {
			return RecoveryResult{}, fmt.Errorf("run %d: %w", i+1, err)
		}
		cold, rec, join, lost, status = append(cold, r.ColdStartS), append(rec, r.RecoveryS), append(join, r.JoinS), append(lost, r.StepsLost), append(status, r.StatusS)
		if !o.JSON {
			fmt.Fprintf(errw, "run %d: cold start %s, recovery %s, join %s, steps lost %.0f", i+1, fmtDur(r.ColdStartS), fmtDur(r.RecoveryS), fmtDur(r.JoinS), r.StepsLost)
			if flood > 0 {
				fmt.Fprintf(errw, ", /v1/status under the flood %s", fmtDur(r.StatusS))
			}
			fmt.Fprintln(errw)
		}
	}
	res := RecoveryResult{NP: np, Runs: runs, ColdStartS: median(cold), RecoveryS: median(rec), JoinS: median(join), StepsLost: median(lost), Flood: flood}
	if flood > 0 {
		res.StatusS = median(status)
	}
	if o.JSON {
		return res, json.NewEncoder(out).Encode(res)
	}
	fmt.Fprintf(out, "recovery: %d local workers, demo trainer, medians of %d runs\n  cold start  %s\n  recovery    %s\n  join        %s\n  steps lost  %.0f\n",
		np, runs, fmtDur(res.ColdStartS), fmtDur(res.RecoveryS), fmtDur(res.JoinS), res.StepsLost)
	if flood > 0 {
		fmt.Fprintf(out, "  under a flood of %d idle connections to the driver's port; GET /v1/status took %s\n", flood, fmtDur(res.StatusS))
	}
	return res, nil
}

// recoveryRun runs one job and measures it; the job is stopped (SIGTERM, then SIGKILL) at the end.
func recoveryRun(ctx context.Context, logs *jobLog, self, trainer string, np, flood int, sig syscall.Signal, commTimeout time.Duration) (RecoveryResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	cmd, pr, err := startChild(ctx, &wg, self, "run", "-np", strconv.Itoa(np), "--min-np", strconv.Itoa(np-1),
		"--blacklist-cooldown-range", "1s,1s", "--discovery-interval", "100ms", "--stop-grace", "1s", "--comm-timeout", commTimeout.String(),
		"--", trainer, "--steps", "100000000", "--step-delay", "2ms", "--events", "--log-every", "100000000")
	if err != nil {
		return RecoveryResult{}, err
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		wg.Go(func() { io.Copy(io.Discard, pr) }) // keep draining until the job has exited
		wg.Wait()
	}()

	var (
		r                             = RecoveryResult{NP: np}
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
		if m := logs.listening.FindStringSubmatch(line); m != nil {
			driverAddr = m[1]
		}
		if m := logs.launched.FindStringSubmatch(line); m != nil && m[2] == strconv.Itoa(np-1) {
			victim, _ = strconv.Atoi(m[3])
		}
		if m := logs.resume.FindStringSubmatch(line); m != nil && !killedAt.IsZero() && !gotRecovery {
			resumed, _ = strconv.Atoi(m[2])
		}
		if !killedAt.IsZero() && rejoinAt.IsZero() && logs.hostsChanged.MatchString(line) {
			rejoinAt = time.Now()
		}
		m := logs.event.FindStringSubmatch(line)
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
				wg.Go(func() { statusCh <- statusTime(driverAddr) }) // the deferred wg.Wait waits for it too
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
