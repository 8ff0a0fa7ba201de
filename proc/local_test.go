package proc

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childrenNamed returns the PIDs of this process's children whose argv[0] is name, from /proc.
func childrenNamed(t *testing.T, name string) map[int][]string {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	found := map[int][]string{}
	me := strconv.Itoa(os.Getpid())
	for _, d := range dirs {
		stat, err := os.ReadFile(filepath.Join(d, "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after its last ')'.
		rest := string(stat[bytes.LastIndexByte(stat, ')')+1:])
		if f := strings.Fields(rest); len(f) < 2 || f[1] != me {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
		if argv[0] == name {
			pid, _ := strconv.Atoi(filepath.Base(d))
			found[pid] = argv
		}
	}
	return found
}

// A user who runs ps beside a job sees each worker's guard under its own name, with the
// group and the worker it guards, not a line of shell; and the guard goes with its worker.
func TestGuardIsNamedInPs(t *testing.T) {
	if _, err := os.Stat("/proc/self/cmdline"); err != nil {
		t.Skip("no /proc here")
	}
	before := childrenNamed(t, guardName)
	p, err := NewLocal().Start(context.Background(), Spec{Name: "rank-7", Command: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	var guards map[int][]string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		guards = childrenNamed(t, guardName)
		for pid := range before {
			delete(guards, pid)
		}
		if len(guards) > 0 {
			break
		}
	}
	if len(guards) != 1 {
		p.Stop(0)
		p.Wait()
		t.Fatalf("children named %s: %v, want one", guardName, guards)
	}
	for _, argv := range guards {
		want := []string{guardName, "/dev/fd/3", strconv.Itoa(p.PID()), "rank-7"}
		if strings.Join(argv, " ") != strings.Join(want, " ") {
			t.Errorf("guard's command line %q, want %q", argv, want)
		}
	}
	p.Stop(time.Second)
	p.Wait()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		left := childrenNamed(t, guardName)
		for pid := range before {
			delete(left, pid)
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("guards left after their worker was reaped: %v", left)
		}
	}
}

// The guard, read from its pipe as it is, kills the whole group it guards when its stdin
// reports EOF, as it does when the driver dies; and signals a shutdown sends do not stop it.
func TestGuardKillsGroupOnEOF(t *testing.T) {
	// A group of two: a shell and a sleep it started, as a worker and its data loader.
	leader := exec.Command("/bin/sh", "-c", "sleep 30 & echo $!; wait")
	leader.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := leader.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := leader.Process.Pid
	defer syscall.Kill(-pgid, syscall.SIGKILL)
	buf := make([]byte, 32)
	n, _ := out.Read(buf)
	child, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil {
		t.Fatalf("the group's second process: %q: %v", buf[:n], err)
	}

	guard, in, err := startGuard(pgid, "rank-0")
	if err != nil {
		t.Fatal(err)
	}
	defer guard.Process.Kill()
	// A shutdown's SIGTERM to the guard must not stop it: it would leave the group behind.
	// Sent only once sh has run its trap (the kernel lists SIGTERM as ignored), so that the
	// test does not race the guard's start.
	for deadline := time.Now().Add(5 * time.Second); !ignores(guard.Process.Pid, syscall.SIGTERM); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the guard did not set its trap within 5 s")
		}
	}
	if err := guard.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := syscall.Kill(guard.Process.Pid, 0); err != nil {
		t.Fatalf("the guard did not survive SIGTERM: %v", err)
	}
	if err := syscall.Kill(child, 0); err != nil {
		t.Fatalf("the group was touched before EOF: %v", err)
	}

	in.Close() // what the kernel does to the driver's end when the driver dies
	done := make(chan error, 1)
	go func() { done <- guard.Wait() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the guard did not exit within 5 s of EOF")
	}
	if err := leader.Wait(); err == nil {
		t.Fatal("the group's leader exited cleanly; the guard should have killed it")
	} else if ws, ok := leader.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the group's leader: %v, want killed by SIGKILL", err)
	}
	// The sleep is the leader's child, reparented to init once the leader died: it is gone
	// when the kernel reports no such process (a zombie awaiting init counts as gone too).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st, err := os.ReadFile("/proc/" + strconv.Itoa(child) + "/stat")
		if err != nil || strings.Contains(string(st[bytes.LastIndexByte(st, ')')+1:]), " Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d of the group outlived the guard", child)
		}
	}
}

// ignores reports whether process pid ignores sig, from the SigIgn mask in /proc/PID/status.
func ignores(pid int, sig syscall.Signal) bool {
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(status), "\n") {
		if mask, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			bits, err := strconv.ParseUint(strings.TrimSpace(mask), 16, 64)
			return err == nil && bits&(1<<(uint(sig)-1)) != 0
		}
	}
	return false
}
