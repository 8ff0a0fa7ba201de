package providers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// DefaultScriptTimeout bounds a discovery script run when NewScript is given no timeout.
const DefaultScriptTimeout = 10 * time.Second

const (
	// maxScriptOutput bounds what is read from a script's stdout: a host list is a few KiB,
	// and a script stuck in a loop must not grow the driver without limit.
	maxScriptOutput = 1 << 20
	// stderrTail is how much of the end of stderr is kept for the error of a failed run.
	stderrTailBytes = 4 << 10
	stderrTailLines = 5
	// pipeGrace is how long the output pipes may stay open once the script's process group is
	// gone. Only a process that left the group (setsid) can hold them longer.
	pipeGrace = 500 * time.Millisecond
)

// NewScript runs the executable at path on every poll and reads its stdout: one host[:slots]
// per line (slots default to defaultSlots), with surrounding whitespace trimmed, blank lines
// and '#' comments skipped, and exact duplicates ignored; a host listed with two slot counts
// is an error. ID and Addr are the host, spelled as ParseHosts spells it. Output is read up to
// 1 MiB. An empty output is a valid, empty group. A bare name is looked up in $PATH, as by
// os/exec; the script inherits the driver's environment and working directory, and its stdin
// is empty.
//
// Each run is bounded by timeout (DefaultScriptTimeout when timeout <= 0) and by the poll's
// context. The script runs in its own process group, which is killed (SIGKILL) when the
// script exits, times out or its poll is cancelled: a script must not leave processes behind,
// and nothing it started outlives the poll unless it left the group (setsid). A non-zero exit
// is an error with the exit status and the last lines of stderr.
func NewScript(path string, defaultSlots int, timeout time.Duration) Provider {
	if timeout <= 0 {
		timeout = DefaultScriptTimeout
	}
	return &script{path: path, defaultSlots: defaultSlots, timeout: timeout}
}

type script struct {
	path         string
	defaultSlots int
	timeout      time.Duration
}

func (s *script) Hosts(ctx context.Context) ([]Host, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("discovery script %s: %w", s.path, err)
	}
	if err := checkSlots(s.defaultSlots); err != nil {
		return nil, fmt.Errorf("discovery script %s: default slots: %w", s.path, err)
	}
	out, err := s.run(ctx)
	if err != nil {
		return nil, fmt.Errorf("discovery script %s: %w", s.path, err)
	}
	hosts, err := parseScriptOutput(out, s.defaultSlots)
	if err != nil {
		return nil, fmt.Errorf("discovery script %s: %w", s.path, err)
	}
	return hosts, nil
}

// parseScriptOutput turns the script's stdout into hosts, in the order first listed.
func parseScriptOutput(out []byte, defaultSlots int) ([]Host, error) {
	var hosts []Host
	seen := make(map[string]int) // host ID → index in hosts
	lineOf := make(map[string]int)
	for i, raw := range strings.Split(string(out), "\n") {
		n := i + 1
		line, _, _ := strings.Cut(raw, "#")
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		h, err := parseEntry(line, defaultSlots)
		if err != nil {
			return nil, fmt.Errorf("output line %d %q: %w; %s", n, clip(raw, 120), err, entryHelp)
		}
		if j, dup := seen[h.ID]; dup {
			if hosts[j].Slots != h.Slots {
				return nil, fmt.Errorf("output line %d %q: host %s has %d slots here but %d on line %d; list each host with one slot count",
					n, clip(raw, 120), h.ID, h.Slots, hosts[j].Slots, lineOf[h.ID])
			}
			continue
		}
		seen[h.ID] = len(hosts)
		lineOf[h.ID] = n
		hosts = append(hosts, h)
	}
	return hosts, nil
}

// run runs the script once and returns its stdout.
//
// The pipes are made here, not by os/exec, so that no copying goroutine of exec.Cmd can keep
// Wait blocked on a pipe that some stray process still holds: every goroutine started here is
// waited for before run returns.
func (s *script) run(parent context.Context) ([]byte, error) {
	ctx, cancel := context.WithTimeout(parent, s.timeout)
	defer cancel()

	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer outR.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		outW.Close()
		return nil, err
	}
	defer errR.Close()

	cmd := exec.Command(s.path)
	cmd.Stdout, cmd.Stderr = outW, errW
	cmd.SysProcAttr = groupAttr()
	err = cmd.Start()
	outW.Close() // the child has its own copies; ours would keep the readers from seeing EOF
	errW.Close()
	if err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}

	type result struct {
		b   []byte
		err error
	}
	outc := make(chan result, 1)
	go func() {
		b, err := io.ReadAll(io.LimitReader(outR, maxScriptOutput+1))
		outc <- result{b, err}
	}()
	stderr := &tailBuffer{max: stderrTailBytes}
	errc := make(chan struct{})
	go func() {
		io.Copy(stderr, errR) // stderr is touched by nobody else until errc is closed
		close(errc)
	}()
	exited := make(chan struct{})
	var reap func() error
	go func() {
		reap = waitExited(cmd)
		close(exited)
	}()

	var out result
	gotOut, timedOut, overflow := false, false, false
	outWait := outc
wait:
	for {
		select {
		case <-exited:
			break wait
		case <-ctx.Done():
			select {
			case <-exited: // it finished just in time: not a timeout
			default:
				timedOut = true
			}
			break wait
		case out = <-outWait:
			gotOut, outWait = true, nil
			if len(out.b) > maxScriptOutput {
				overflow = true
				break wait
			}
		}
	}
	// Whether the script finished, timed out or flooded us, its whole group goes now: after
	// its exit this removes what it left behind. The leader is not reaped before the kill, so
	// its PID, which is the group's ID, cannot have been reused by another process.
	killGroup(cmd)
	<-exited
	waitErr := reap()

	// With the group gone the pipes reach EOF at once, unless a process that left the group
	// still holds them; then stop reading after pipeGrace.
	grace := time.NewTimer(pipeGrace)
	defer grace.Stop()
	stuck := false
	if !gotOut {
		select {
		case out = <-outc:
			gotOut = true
		case <-grace.C:
			stuck = true
		}
	}
	if !stuck {
		select {
		case <-errc:
		case <-grace.C:
			stuck = true
		}
	}
	if stuck {
		outR.Close() // unblocks the readers
		errR.Close()
		if !gotOut {
			out = <-outc
		}
		<-errc
	}

	if gotOut && len(out.b) > maxScriptOutput {
		overflow = true // it wrote it all and exited before the reader could report
	}

	switch {
	case parent.Err() != nil:
		return nil, fmt.Errorf("stopped (killed with its process group): %w", parent.Err())
	case timedOut:
		return nil, fmt.Errorf("no answer within %v, killed with its process group%s: %w",
			s.timeout, stderr.note(), context.DeadlineExceeded)
	case overflow:
		return nil, fmt.Errorf("output is longer than %d bytes; one host[:slots] per line is expected", maxScriptOutput)
	case waitErr != nil:
		var exit *exec.ExitError
		if errors.As(waitErr, &exit) {
			return nil, fmt.Errorf("%v%s", exit.ProcessState, stderr.note())
		}
		return nil, fmt.Errorf("wait: %w", waitErr)
	case stuck:
		return nil, errors.New("its output stayed open after it exited: a process it started left its process group " +
			"and still holds stdout or stderr (redirect the output of background processes)")
	case out.err != nil:
		return nil, fmt.Errorf("read output: %w", out.err)
	}
	return out.b, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= t.max {
		t.b = append(t.b[:0], p[len(p)-t.max:]...)
		return n, nil
	}
	if over := len(t.b) + len(p) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	t.b = append(t.b, p...)
	return n, nil
}

// note is "; stderr: …" with the last few non-blank lines, or "" when there were none.
func (t *tailBuffer) note() string {
	var lines []string
	for _, l := range bytes.Split(t.b, []byte("\n")) {
		if l = bytes.TrimSpace(l); len(l) > 0 {
			lines = append(lines, clip(string(l), 200))
		}
	}
	if len(lines) == 0 {
		return ""
	}
	if len(lines) > stderrTailLines {
		lines = lines[len(lines)-stderrTailLines:]
	}
	return "; stderr: " + strings.Join(lines, " | ")
}

// clip shortens s to at most n bytes for an error message.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
