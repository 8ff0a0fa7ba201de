package main

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
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"
)

// noticeResult is `elasticd bench notice --json`.
type noticeResult struct {
	Runs      int     `json:"runs"`
	DetectS   float64 `json:"detect_s"`   // notice on the metadata service → the driver has it (the agent polls every second)
	MoveS     float64 `json:"move_s"`     // the driver has it → first step done without the host
	TotalS    float64 `json:"total_s"`    // notice on the metadata service → first step done without the host
	StepsLost float64 `json:"steps_lost"` // last step done with the host − the step training resumed at
}

func benchNoticeCommand() *cli.Command {
	return &cli.Command{
		Name:  "notice",
		Usage: "time a spot interruption notice on a host's metadata until training goes on without that host",
		Description: `Runs 'elasticd run -np 4 --launcher agent' on this machine with two real agents, each
its own host on a loopback address (127.0.0.2 and 127.0.0.3, two slots each) watching a
simulated EC2 metadata service (IMDSv2) served by this command on 127.0.0.1, and the demo
trainer. In each of --runs jobs it waits for training, puts a spot interruption (2 minutes
ahead) on the metadata of the host that does not hold rank 0, at a random point of the
agent's polling cycle, and measures:

   detect      the notice appears       -> the driver has it (the agent polls every 1 s,
                                           as AWS advises; GCP's agent waits for the change)
   move        the driver has it        -> first step done by the 2 workers left
   total       the notice appears       -> first step done by the 2 workers left
   steps_lost  last step done with the host - the step training resumed at (0: no rollback)

and prints the medians over the runs.`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "runs", Value: 5, Usage: "jobs to run; medians are over them", EnvVars: []string{"ELASTICD_RUNS"}},
			&cli.StringFlag{Name: "trainer", Usage: "demo trainer binary (default: train beside elasticd, as make build puts it)", EnvVars: []string{"ELASTICD_TRAINER"}},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object", EnvVars: []string{"ELASTICD_JSON"}},
		},
		Action: benchNotice,
	}
}

func benchNotice(c *cli.Context) error {
	runs := c.Int("runs")
	if runs < 1 || runs > 100 {
		return usageError("runs", "%d: must be between 1 and 100", runs)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	trainer, err := demoTrainer(c, self)
	if err != nil {
		return err
	}
	var detect, move, total, lost []float64
	for i := range runs {
		r, err := noticeRun(c.Context, self, trainer)
		if err != nil {
			return fmt.Errorf("run %d: %w", i+1, err)
		}
		detect, move, total, lost = append(detect, r.DetectS), append(move, r.MoveS), append(total, r.TotalS), append(lost, r.StepsLost)
		if !c.Bool("json") {
			fmt.Fprintf(c.App.ErrWriter, "run %d: detect %s, move %s, total %s, steps lost %.0f\n", i+1, fmtDur(r.DetectS), fmtDur(r.MoveS), fmtDur(r.TotalS), r.StepsLost)
		}
	}
	res := noticeResult{Runs: runs, DetectS: median(detect), MoveS: median(move), TotalS: median(total), StepsLost: median(lost)}
	if c.Bool("json") {
		return json.NewEncoder(c.App.Writer).Encode(res)
	}
	fmt.Fprintf(c.App.Writer, "notice: 4 workers on 2 agent hosts, demo trainer, medians of %d runs\n  detect      %s\n  move        %s\n  total       %s\n  steps lost  %.0f\n",
		runs, fmtDur(res.DetectS), fmtDur(res.MoveS), fmtDur(res.TotalS), res.StepsLost)
	return nil
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

var (
	listeningRe   = regexp.MustCompile(`rendezvous listening" addr=(\S+)`)
	rank0HostRe   = regexp.MustCompile(`launched worker" worker=(\S+)/\d+ rank=0 generation=1`)
	agentNoticeRe = regexp.MustCompile(`msg="agent notice"`)
)

// noticeRun runs one job with two agents and measures one notice; everything it started is
// stopped (SIGTERM, then SIGKILL) by PID at the end.
func noticeRun(ctx context.Context, self, trainer string) (noticeResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "elasticd-bench-notice-*")
	if err != nil {
		return noticeResult{}, err
	}
	defer os.RemoveAll(dir)
	secret := filepath.Join(dir, "agent-secret")
	if err := os.WriteFile(secret, []byte(strconv.FormatInt(time.Now().UnixNano(), 36)+"-bench-notice-secret\n"), 0o600); err != nil {
		return noticeResult{}, err
	}
	var procs sync.WaitGroup
	defer procs.Wait()
	start := func(args ...string) (*exec.Cmd, io.Reader, error) { return startChild(ctx, &procs, self, args...) }
	defer cancel() // runs before procs.Wait: every process gets SIGTERM

	_, out, err := start("run", "-np", "4", "--min-np", "2", "--launcher", "agent", "--agent-secret-file", secret,
		"--listen", "127.0.0.1:0", "--stop-grace", "1s",
		"--", trainer, "--steps", "100000000", "--step-delay", "2ms", "--events", "--log-every", "100000000")
	if err != nil {
		return noticeResult{}, err
	}
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
			}
		}
		io.Copy(io.Discard, out)
		close(lines)
	}()

	imds := map[string]*simIMDS{}
	var r noticeResult
	var (
		doomed                     *simIMDS
		armed, detected            time.Time
		lastFull, resumed, started int
		// The notice comes at a random point of the agent's 1 s polling cycle: 50 steps in,
		// plus up to about a second more.
		armAt = 50 + mrand.IntN(400)
	)
	for line := range lines {
		if m := listeningRe.FindStringSubmatch(line); m != nil && len(imds) == 0 {
			for _, addr := range []string{"127.0.0.2", "127.0.0.3"} {
				s := &simIMDS{id: "i-" + strings.ReplaceAll(addr, ".", "")}
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					return r, err
				}
				srv := &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
				go srv.Serve(ln)
				defer srv.Close()
				imds[s.id] = s
				if _, aout, err := start("agent", "--driver", "http://"+m[1], "--agent-secret-file", secret, "--addr", addr,
					"--slots", "2", "--metadata", "aws", "--metadata-url", "http://"+ln.Addr().String()); err != nil {
					return r, err
				} else {
					go io.Copy(io.Discard, aout)
				}
			}
		}
		if m := rank0HostRe.FindStringSubmatch(line); m != nil {
			for id, s := range imds {
				if id != m[1] {
					doomed = s
				}
			}
		}
		if !armed.IsZero() && detected.IsZero() && agentNoticeRe.MatchString(line) {
			detected = time.Now()
		}
		if m := resumeRe.FindStringSubmatch(line); m != nil && m[1] == "2" {
			resumed, _ = strconv.Atoi(m[2])
		}
		m := eventRe.FindStringSubmatch(line)
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
