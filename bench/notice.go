package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// NoticeResult is what Notice measures: `elasticd bench notice --json`.
type NoticeResult struct {
	Runs      int     `json:"runs"`
	DetectS   float64 `json:"detect_s"`   // notice on the metadata service → the driver has it (the agent polls every second)
	MoveS     float64 `json:"move_s"`     // the driver has it → first step done without the host
	TotalS    float64 `json:"total_s"`    // notice on the metadata service → first step done without the host
	StepsLost float64 `json:"steps_lost"` // last step done with the host − the step training resumed at
}

// NoticeOptions configure Notice; the flags of `elasticd bench notice`.
type NoticeOptions struct {
	Exe     string    // the elasticd binary the job and its agents run as ("": this process's)
	Trainer string    // the demo trainer ("": train beside Exe, as make build puts it)
	Runs    int       // jobs to run, 1 to 100; medians are over them
	JSON    bool      // one JSON object instead of text
	Out     io.Writer // the medians (nil: discarded)
	Err     io.Writer // one line per run unless JSON (nil: discarded)
}

// Notice runs `Exe run -np 4 --launcher agent` with two agents on loopback addresses, each
// watching a simulated EC2 metadata service, Runs times; in each it puts a spot interruption
// on the metadata of the host without rank 0 and measures until training goes on without
// that host. It prints the medians to Out and returns them.
func Notice(ctx context.Context, o NoticeOptions) (NoticeResult, error) {
	runs := o.Runs
	if runs < 1 || runs > 100 {
		return NoticeResult{}, usageError("runs", "%d: must be between 1 and 100", runs)
	}
	self, err := executable(o.Exe)
	if err != nil {
		return NoticeResult{}, err
	}
	trainer, err := demoTrainer(o.Trainer, self)
	if err != nil {
		return NoticeResult{}, err
	}
	out, errw := writers(o.Out, o.Err)
	logs := newJobLog()
	var detect, move, total, lost []float64
	for i := range runs {
		r, err := noticeRun(ctx, logs, self, trainer)
		if err != nil {
			return NoticeResult{}, fmt.Errorf("run %d: %w", i+1, err)
		}
		detect, move, total, lost = append(detect, r.DetectS), append(move, r.MoveS), append(total, r.TotalS), append(lost, r.StepsLost)
		if !o.JSON {
			fmt.Fprintf(errw, "run %d: detect %s, move %s, total %s, steps lost %.0f\n", i+1, fmtDur(r.DetectS), fmtDur(r.MoveS), fmtDur(r.TotalS), r.StepsLost)
		}
	}
	res := NoticeResult{Runs: runs, DetectS: median(detect), MoveS: median(move), TotalS: median(total), StepsLost: median(lost)}
	if o.JSON {
		return res, json.NewEncoder(out).Encode(res)
	}
	fmt.Fprintf(out, "notice: 4 workers on 2 agent hosts, demo trainer, medians of %d runs\n  detect      %s\n  move        %s\n  total       %s\n  steps lost  %.0f\n",
		runs, fmtDur(res.DetectS), fmtDur(res.MoveS), fmtDur(res.TotalS), res.StepsLost)
	return res, nil
}

// simIMDS is a simulated EC2 instance metadata service for one instance: IMDSv2 tokens,
// the instance ID, and a spot instance-action once armed.
type simIMDS struct {
	id     string
	mu     sync.Mutex
	action []byte
}

func (s *simIMDS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPut && r.URL.Path == "/latest/api/token" {
		w.Write([]byte("token"))
		return
	}
	s.mu.Lock()
	action := s.action
	s.mu.Unlock()
	switch {
	case r.Header.Get("X-aws-ec2-metadata-token") != "token":
		http.Error(w, "", http.StatusUnauthorized)
	case r.URL.Path == "/latest/meta-data/instance-id":
		w.Write([]byte(s.id))
	case r.URL.Path == "/latest/meta-data/spot/instance-action" && action != nil:
		w.Write(action)
	default:
		http.NotFound(w, r)
	}
}

// interrupt puts a spot interruption at deadline on the metadata.
func (s *simIMDS) interrupt(deadline time.Time) {
	b, _ := json.Marshal(map[string]string{"action": "terminate", "time": deadline.UTC().Format(time.RFC3339)})
	s.mu.Lock()
	s.action = b
	s.mu.Unlock()
}

// noticeRun runs one job with two agents and measures one notice; everything it started is
// stopped (SIGTERM, then SIGKILL) by PID at the end.
func noticeRun(ctx context.Context, logs *jobLog, self, trainer string) (NoticeResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "elasticd-bench-notice-*")
	if err != nil {
		return NoticeResult{}, err
	}
	defer os.RemoveAll(dir)
	secret := filepath.Join(dir, "agent-secret")
	if err := os.WriteFile(secret, []byte(strconv.FormatInt(time.Now().UnixNano(), 36)+"-bench-notice-secret\n"), 0o600); err != nil {
		return NoticeResult{}, err
	}
	var procs sync.WaitGroup
	defer procs.Wait()
	start := func(args ...string) (*exec.Cmd, io.Reader, error) { return startChild(ctx, &procs, self, args...) }
	defer cancel() // runs before procs.Wait: every process gets SIGTERM

	_, out, err := start("run", "-np", "4", "--min-np", "2", "--launcher", "agent", "--agent-secret-file", secret,
		"--listen", "127.0.0.1:0", "--stop-grace", "1s",
		"--", trainer, "--steps", "100000000", "--step-delay", "2ms", "--events", "--log-every", "100000000")
	if err != nil {
		return NoticeResult{}, err
	}
	lines := make(chan string, 1024)
	procs.Go(func() { // ends with the job's output, once the deferred cancel has stopped the job
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
			}
		}
		io.Copy(io.Discard, out)
		close(lines)
	})

	imds := map[string]*simIMDS{}
	var r NoticeResult
	var (
		doomed                     *simIMDS
		armed, detected            time.Time
		lastFull, resumed, started int
		// The notice comes at a random point of the agent's 1 s polling cycle: 50 steps in,
		// plus up to about a second more.
		armAt = 50 + mrand.IntN(400)
	)
	for line := range lines {
		if m := logs.listening.FindStringSubmatch(line); m != nil && len(imds) == 0 {
			for _, addr := range []string{"127.0.0.2", "127.0.0.3"} {
				s := &simIMDS{id: "i-" + strings.ReplaceAll(addr, ".", "")}
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					return r, err
				}
				srv := &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
				procs.Go(func() { srv.Serve(ln) })
				defer srv.Close() // before procs.Wait, which waits for Serve to return
				imds[s.id] = s
				if _, aout, err := start("agent", "--driver", "http://"+m[1], "--agent-secret-file", secret, "--addr", addr,
					"--slots", "2", "--metadata", "aws", "--metadata-url", "http://"+ln.Addr().String()); err != nil {
					return r, err
				} else {
					procs.Go(func() { io.Copy(io.Discard, aout) })
				}
			}
		}
		if m := logs.rank0Host.FindStringSubmatch(line); m != nil {
			for id, s := range imds {
				if id != m[1] {
					doomed = s
				}
			}
		}
		if !armed.IsZero() && detected.IsZero() && logs.agentNotice.MatchString(line) {
			// When the driver logged it, not when this loop read the line: a reader that lags
			// would count part of the move as detection, and could see the first step without
			// the host (stamped by the trainer) before it.
			detected = loggedAt(line, time.Now())
		}
		if m := logs.resume.FindStringSubmatch(line); m != nil && m[1] == "2" {
			resumed, _ = strconv.Atoi(m[2])
		}
		m := logs.event.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		step, _ := strconv.Atoi(m[1])
		world, _ := strconv.Atoi(m[2])
		ns, _ := strconv.ParseInt(m[3], 10, 64)
		switch {
		case world == 4 && armed.IsZero():
			started++
			if started >= armAt {
				if doomed == nil {
					return r, fmt.Errorf("no rank 0 host logged")
				}
				doomed.interrupt(time.Now().Add(2 * time.Minute))
				armed = time.Now()
			}
			lastFull = step
		case world == 4:
			lastFull = step
		case world == 2 && !armed.IsZero():
			if detected.IsZero() {
				return r, fmt.Errorf("training went on without the host before the driver logged the notice")
			}
			t := time.Unix(0, ns)
			r.DetectS, r.MoveS, r.TotalS = detected.Sub(armed).Seconds(), t.Sub(detected).Seconds(), t.Sub(armed).Seconds()
			r.StepsLost = float64(max(0, lastFull-resumed))
			return r, nil
		}
	}
	return r, fmt.Errorf("the job ended before the notice was measured (armed: %v)", !armed.IsZero())
}

// loggedAt is the time= field of a driver's log line (15:04:05.000, local time, the day of
// now), or now when the line has none. It is truncated to the millisecond, so never later
// than when the line was written.
func loggedAt(line string, now time.Time) time.Time {
	_, rest, ok := strings.Cut(line, "time=")
	if !ok {
		return now
	}
	clock, _, _ := strings.Cut(rest, " ")
	c, err := time.ParseInLocation("15:04:05.000", clock, now.Location())
	if err != nil {
		return now
	}
	t := time.Date(now.Year(), now.Month(), now.Day(), c.Hour(), c.Minute(), c.Second(), c.Nanosecond(), now.Location())
	if t.After(now.Add(time.Hour)) { // logged just before midnight, read just after
		t = t.AddDate(0, 0, -1)
	}
	if t.After(now) {
		return now
	}
	return t
}
