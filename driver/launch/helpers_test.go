//go:build linux

package launch_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// buffer is a bytes.Buffer safe for concurrent use, for a worker's output.
type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func (b *buffer) lines() []string {
	s := strings.TrimSuffix(b.String(), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitLine waits until out has a line equal to want.
func waitLine(t *testing.T, out *buffer, want string) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("line %q in output %q", want, out), func() bool {
		for _, l := range out.lines() {
			if l == want {
				return true
			}
		}
		return false
	})
}

var pidLine = regexp.MustCompile(`(?m)^(?:\[[^]]*\] )?pid (\d+)$`)

// procRef names one process: its PID and start time, so a reused PID is not mistaken for it.
type procRef struct {
	pid   int
	start string
}

// stat returns the state letter and start time of pid, ok false if there is no such process.
func stat(pid int) (state byte, start string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, "", false
	}
	// pid (comm) state ppid ... : fields after the comm, which may itself hold ") ".
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return f[0][0], f[19], true
}

// alive reports whether the process still runs. A zombie counts as dead: it runs nothing, and
// an orphan's zombie may wait for an init that never reaps it.
func (r procRef) alive() bool {
	state, start, ok := stat(r.pid)
	return ok && start == r.start && state != 'Z' && state != 'X'
}

// waitPIDs waits for a "ready" line and want "pid N" lines in out (a subshell may print after
// "ready"), and returns the processes they name, which must all be running then. They are
// SIGKILLed at cleanup if still alive, so that a failing test leaves nothing behind.
func waitPIDs(t *testing.T, out *buffer, want int) []procRef {
	t.Helper()
	waitLine(t, out, "ready")
	waitFor(t, 10*time.Second, fmt.Sprintf("%d pid lines in %q", want, out), func() bool {
		return len(pidLine.FindAllString(out.String(), -1)) >= want
	})
	var refs []procRef
	for _, m := range pidLine.FindAllStringSubmatch(out.String(), -1) {
		pid, _ := strconv.Atoi(m[1])
		state, start, ok := stat(pid)
		if !ok || state == 'Z' {
			t.Fatalf("pid %d is not running (output %q)", pid, out)
		}
		refs = append(refs, procRef{pid, start})
	}
	if len(refs) != want {
		t.Fatalf("got %d pids, want %d, in output %q", len(refs), want, out)
	}
	t.Cleanup(func() {
		for _, r := range refs {
			if r.alive() {
				syscall.Kill(r.pid, syscall.SIGKILL)
			}
		}
	})
	return refs
}

// waitGone waits until none of the processes runs any more.
func waitGone(t *testing.T, timeout time.Duration, refs []procRef) {
	t.Helper()
	waitFor(t, timeout, fmt.Sprintf("processes %v to die", refs), func() bool {
		for _, r := range refs {
			if r.alive() {
				return false
			}
		}
		return true
	})
}

// assertGone checks that none of the processes runs now.
func assertGone(t *testing.T, refs []procRef) {
	t.Helper()
	for _, r := range refs {
		if r.alive() {
			t.Errorf("pid %d still runs", r.pid)
		}
	}
}

// cmdlinesWith returns the command lines of all processes on this machine that contain s.
func cmdlinesWith(t *testing.T, s string) []string {
	t.Helper()
	paths, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(s)) {
			found = append(found, p+": "+string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	return found
}

func randomSecret(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "secret-" + hex.EncodeToString(b)
}
