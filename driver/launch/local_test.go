//go:build linux

package launch_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/proc"
)

func sh(script string) []string { return []string{"/bin/sh", "-c", script} }

func startLocal(t *testing.T, ctx context.Context, s proc.Spec) proc.Process {
	t.Helper()
	if s.Name == "" {
		s.Name = "worker"
	}
	p, err := proc.NewLocal().Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(0) })
	return p
}

func TestLocalExitStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		script string
		want   proc.ExitStatus
		str    string
	}{
		{"exit 0", proc.ExitStatus{Code: 0}, "exit 0"},
		{"exit 3", proc.ExitStatus{Code: 3}, "exit 3"},
		{"kill -s KILL $$", proc.ExitStatus{Code: -1, Signal: "SIGKILL"}, "killed by SIGKILL"},
		{"kill -s TERM $$", proc.ExitStatus{Code: -1, Signal: "SIGTERM"}, "killed by SIGTERM"},
		{"kill -s SEGV $$", proc.ExitStatus{Code: -1, Signal: "SIGSEGV"}, "killed by SIGSEGV"},
	} {
		t.Run(tc.script, func(t *testing.T) {
			t.Parallel()
			p := startLocal(t, t.Context(), proc.Spec{Command: sh(tc.script)})
			st, err := p.Wait()
			if err != nil {
				t.Fatal(err)
			}
			if st != tc.want || st.String() != tc.str {
				t.Errorf("status %+v (%q), want %+v (%q)", st, st, tc.want, tc.str)
			}
			if st.Success() != (tc.script == "exit 0") {
				t.Errorf("Success() = %v", st.Success())
			}
		})
	}
}

func TestLocalStartErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		spec proc.Spec
		want string
	}{
		{"no command", proc.Spec{Name: "rank 1"}, "start rank 1: empty command"},
		{"not found", proc.Spec{Name: "rank 1", Command: []string{"elasticd-no-such-command"}}, "start rank 1: exec: \"elasticd-no-such-command\": executable file not found"},
		{"bad dir", proc.Spec{Name: "rank 1", Command: []string{"true"}, Dir: "/nonexistent/dir"}, "/nonexistent/dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := proc.NewLocal().Start(t.Context(), tc.spec)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// The secret reaches the worker in its environment and is in no process's argv.
func TestLocalEnvNotInArgv(t *testing.T) {
	t.Parallel()
	secret := randomSecret(t)
	var out buffer
	p := startLocal(t, t.Context(), proc.Spec{
		// No exec after "ready": while the shell is becoming sleep, the kernel
		// reads its /proc/PID/environ as empty.
		Command: sh(`printf 'secret=%s\n' "$ELASTICD_SECRET"; echo ready; sleep 60`),
		Env:     []string{"ELASTICD_SECRET=" + secret, "HOME=/elasticd-overridden"},
		Stdout:  &out,
	})
	waitLine(t, &out, "ready")
	if !strings.Contains(out.String(), "secret="+secret+"\n") {
		t.Errorf("worker did not get the secret: %q", out.String())
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.PID()))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(environ, []byte("\x00HOME=/elasticd-overridden\x00")) || bytes.Count(environ, []byte("\x00HOME=")) != 1 {
		t.Errorf("Spec.Env should replace the driver's HOME, once: %q", environ)
	}
	if found := cmdlinesWith(t, secret); len(found) > 0 {
		t.Errorf("secret in argv: %q", found)
	}
	p.Stop(time.Second)
}

// Stop sends SIGTERM to the whole group, so children and grandchildren die too.
func TestLocalStopKillsTree(t *testing.T) {
	t.Parallel()
	var out buffer
	p := startLocal(t, t.Context(), proc.Spec{
		Command: sh(`sleep 60 & echo "pid $!"; (sleep 60 & echo "pid $!"; wait) & echo "pid $!"; echo "pid $$"; echo ready; wait`),
		Stdout:  &out,
	})
	refs := waitPIDs(t, &out, 4)
	start := time.Now()
	p.Stop(10 * time.Second)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Stop took %v for a worker that obeys SIGTERM", d)
	}
	if st, _ := p.Wait(); st.Signal != "SIGTERM" {
		t.Errorf("status %v, want killed by SIGTERM", st)
	}
	waitGone(t, 2*time.Second, refs)
}

// A worker that ignores SIGTERM (and whose children inherit that) is SIGKILLed after the grace.
func TestLocalStopEscalates(t *testing.T) {
	t.Parallel()
	var out buffer
	p := startLocal(t, t.Context(), proc.Spec{
		Command: sh(`trap "" TERM; sleep 60 & echo "pid $!"; echo "pid $$"; echo ready; wait`),
		Stdout:  &out,
	})
	refs := waitPIDs(t, &out, 2)
	const grace = 300 * time.Millisecond
	start := time.Now()
	p.Stop(grace)
	if d := time.Since(start); d < grace || d > 5*time.Second {
		t.Errorf("Stop took %v, want a little over %v", d, grace)
	}
	if st, err := p.Wait(); err != nil || st.Signal != "SIGKILL" {
		t.Errorf("status %v, %v; want killed by SIGKILL", st, err)
	}
	assertGone(t, refs[1:]) // the leader is reaped; its child died with the group
	waitGone(t, 2*time.Second, refs)
}

// When the worker exits by itself, what it left running in its group is killed, and a child
// holding the output pipe open does not hold Wait up.
func TestLocalLeftoversKilledOnExit(t *testing.T) {
	t.Parallel()
	var out buffer
	proceed := filepath.Join(t.TempDir(), "proceed")
	p := startLocal(t, t.Context(), proc.Spec{
		Command: sh(`sleep 60 & echo "pid $!"; echo ready; while [ ! -e "$PROCEED" ]; do sleep 0.01; done; exit 4`),
		Env:     []string{"PROCEED=" + proceed},
		Stdout:  &out,
	})
	refs := waitPIDs(t, &out, 1)
	if err := os.WriteFile(proceed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	st, err := p.Wait()
	if err != nil || st.Code != 4 {
		t.Errorf("status %v, %v; want exit 4", st, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Wait took %v: it waited for the leftover child's pipe", d)
	}
	waitGone(t, 2*time.Second, refs)
}

// A process that left the worker's group (setsid) is out of reach, but holding the output pipe
// it cannot hold Wait up for long.
func TestLocalEscapedProcess(t *testing.T) {
	t.Parallel()
	var out buffer
	proceed := filepath.Join(t.TempDir(), "proceed")
	p := startLocal(t, t.Context(), proc.Spec{
		Command: sh(`setsid sleep 60 & echo "pid $!"; echo ready; while [ ! -e "$PROCEED" ]; do sleep 0.01; done; exit 5`),
		Env:     []string{"PROCEED=" + proceed},
		Stdout:  &out,
	})
	waitPIDs(t, &out, 1) // and killed at cleanup
	if err := os.WriteFile(proceed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if st, err := p.Wait(); err != nil || st.Code != 5 {
		t.Errorf("status %v, %v; want exit 5", st, err)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("Wait took %v", d)
	}
}

func TestLocalContextCancel(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	var out buffer
	p := startLocal(t, ctx, proc.Spec{Command: sh(`echo "pid $$"; echo ready; exec sleep 60`), Stdout: &out})
	refs := waitPIDs(t, &out, 1)
	cancel()
	done := make(chan proc.ExitStatus)
	go func() {
		st, _ := p.Wait()
		done <- st
	}()
	select {
	case st := <-done:
		if st.Signal != "SIGTERM" {
			t.Errorf("status %v, want killed by SIGTERM", st)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelling the context did not stop the worker")
	}
	assertGone(t, refs)
}

func TestLocalStartCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := proc.NewLocal().Start(ctx, proc.Spec{Name: "w", Command: []string{"true"}}); err == nil {
		t.Error("Start with a cancelled context succeeded")
	}
}

// Every line arrives, complete and prefixed, the last ones too, even without a newline.
func TestLocalOutput(t *testing.T) {
	t.Parallel()
	var out buffer
	const n = 20000
	p := startLocal(t, t.Context(), proc.Spec{
		Command: sh(fmt.Sprintf(`seq 1 %d; printf 'e1\ne2' >&2; printf last`, n)),
		Stdout:  proc.NewPrefixWriter(&out, "[3] "),
		Stderr:  proc.NewPrefixWriter(&out, "[3 err] "),
	})
	if st, err := p.Wait(); err != nil || !st.Success() {
		t.Fatalf("status %v, %v", st, err)
	}
	var stdout, stderr []string
	for _, l := range out.lines() {
		switch {
		case strings.HasPrefix(l, "[3] "):
			stdout = append(stdout, strings.TrimPrefix(l, "[3] "))
		case strings.HasPrefix(l, "[3 err] "):
			stderr = append(stderr, strings.TrimPrefix(l, "[3 err] "))
		default:
			t.Fatalf("line without prefix: %q", l)
		}
	}
	if len(stdout) != n+1 || stdout[n] != "last" {
		t.Fatalf("got %d stdout lines ending %q, want %d ending \"last\"", len(stdout), stdout[len(stdout)-1], n+1)
	}
	for i, l := range stdout[:n] {
		if l != strconv.Itoa(i+1) {
			t.Fatalf("stdout line %d is %q", i, l)
		}
	}
	if strings.Join(stderr, ",") != "e1,e2" {
		t.Errorf("stderr lines %q", stderr)
	}
}

// Stdout and Stderr may be one writer that is not safe for concurrent use (the race detector
// would see it otherwise).
func TestLocalSharedWriter(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	p := startLocal(t, t.Context(), proc.Spec{
		Command: sh(`seq 1 3000 & seq 1 3000 >&2; wait`),
		Stdout:  &out,
		Stderr:  &out,
	})
	if st, err := p.Wait(); err != nil || !st.Success() {
		t.Fatalf("status %v, %v", st, err)
	}
	if got := strings.Count(out.String(), "\n"); got != 6000 {
		t.Errorf("got %d lines, want 6000", got)
	}
}

// Wait and Stop from many goroutines at once: all return, all see the same status.
func TestLocalConcurrentWaitStop(t *testing.T) {
	t.Parallel()
	p := startLocal(t, t.Context(), proc.Spec{Command: []string{"sleep", "60"}})
	var wg sync.WaitGroup
	statuses := make(chan proc.ExitStatus, 8)
	for range 5 {
		wg.Go(func() {
			st, err := p.Wait()
			if err != nil {
				t.Error(err)
			}
			statuses <- st
		})
	}
	for _, grace := range []time.Duration{0, time.Millisecond, time.Second} {
		wg.Go(func() { p.Stop(grace) })
	}
	wg.Wait()
	p.Stop(time.Second) // again, after the fact
	close(statuses)
	for st := range statuses {
		if st.Signal != "SIGTERM" && st.Signal != "SIGKILL" {
			t.Errorf("status %v, want killed by SIGTERM or SIGKILL", st)
		}
	}
}

// A driver killed with SIGKILL leaves no worker and no worker's child behind.
func TestLocalDriverKilled(t *testing.T) {
	t.Parallel()
	testDriverKilled(t, driverConfig{}, 2*time.Second)
}

// Many launches leave no file descriptor and no goroutine behind.
func TestLocalNoLeaks(t *testing.T) { // not parallel: it counts the whole process's resources
	fds := func() int {
		e, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(e)
	}
	launchOne := func(i int) {
		var out buffer
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		p, err := proc.NewLocal().Start(ctx, proc.Spec{
			Name:    "w",
			Command: sh(`echo hello; echo err >&2; exit ` + strconv.Itoa(i%3)),
			Stdout:  proc.NewPrefixWriter(&out, "[x] "),
			Stderr:  &out,
		})
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			p.Stop(time.Second)
		}
		p.Wait()
	}
	launchOne(1) // the first exec in a process opens a few files for good (pidfd probe, /dev/null)
	fd0, g0 := fds(), runtime.NumGoroutine()
	for i := range 20 {
		launchOne(i)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > g0 || fds() > fd0 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			fdNames, _ := os.ReadDir("/proc/self/fd")
			var names []string
			for _, e := range fdNames {
				target, _ := os.Readlink("/proc/self/fd/" + e.Name())
				names = append(names, e.Name()+"->"+target)
			}
			t.Fatalf("goroutines %d (was %d), fds %d (was %d): %v\n%s", runtime.NumGoroutine(), g0, fds(), fd0, names, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
