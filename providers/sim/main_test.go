package sim_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers/sim"
)

// The instances' processes are this test binary, re-executed as a stand-in for elasticd agent:
// SIM_TEST_ROLE=instance records its arguments and PIDs in SIM_TEST_DIR/<host-id>.json and
// sleeps until it is killed (SIGTERM ends it, unless SIM_TEST_IGNORE_TERM=1); with
// SIM_TEST_CHILD=1 it first starts a child in its process group (SIM_TEST_ROLE=child), as an
// agent starts workers, which must die with it. Both give up by themselves after
// standInLife, so that a broken cloud leaks nothing for long.
const standInLife = 2 * time.Minute

// record is what a stand-in instance writes.
type record struct {
	PID, PGID, Child int
	Args             []string
}

func TestMain(m *testing.M) {
	switch os.Getenv("SIM_TEST_ROLE") {
	case "instance":
		standIn()
		return
	case "child":
		time.Sleep(standInLife)
		return
	}
	os.Exit(m.Run())
}

func standIn() {
	if os.Getenv("SIM_TEST_IGNORE_TERM") == "1" {
		signal.Ignore(syscall.SIGTERM)
	}
	args := os.Args[1:]
	i := slices.Index(args, "--host-id")
	if i < 0 || i+1 >= len(args) {
		fmt.Fprintln(os.Stderr, "stand-in: no --host-id in", args)
		os.Exit(2)
	}
	pgid, _ := syscall.Getpgid(0)
	r := record{PID: os.Getpid(), PGID: pgid, Args: args}
	if os.Getenv("SIM_TEST_CHILD") == "1" {
		child := exec.Command(os.Args[0])
		child.Env = append(os.Environ(), "SIM_TEST_ROLE=child")
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "stand-in: child:", err)
			os.Exit(2)
		}
		r.Child = child.Process.Pid
	}
	b, _ := json.Marshal(r)
	path := filepath.Join(os.Getenv("SIM_TEST_DIR"), args[i+1]+".json")
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil || os.Rename(path+".tmp", path) != nil {
		fmt.Fprintln(os.Stderr, "stand-in: record:", err)
		os.Exit(2)
	}
	fmt.Println("stand-in running as", args[i+1])
	time.Sleep(standInLife)
}

// fixture is a Cloud of stand-ins and the directory where they record themselves.
type fixture struct {
	cloud *sim.Cloud
	dir   string
	start time.Time
}

// standInConfig fills cfg's agent fields with the stand-in and its logger with t's.
func standInConfig(t *testing.T, cfg sim.Config, env ...string) (sim.Config, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg.Agent = []string{exe, "agent"}
	cfg.DriverURL = "http://127.0.0.1:1"
	cfg.SecretFile = filepath.Join(dir, "secret")
	cfg.Env = append([]string{"SIM_TEST_ROLE=instance", "SIM_TEST_DIR=" + dir}, env...)
	cfg.Output = t.Output()
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	return cfg, dir
}

// start starts a cloud of stand-ins, closed when the test ends.
func start(t *testing.T, cfg sim.Config, env ...string) *fixture {
	t.Helper()
	cfg, dir := standInConfig(t, cfg, env...)
	begin := time.Now()
	c, err := sim.Start(t.Context(), cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(c.Close)
	return &fixture{cloud: c, dir: dir, start: begin}
}

func (f *fixture) group(t *testing.T, name string) *sim.Provider {
	t.Helper()
	p, err := f.cloud.Group(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (f *fixture) instances(t *testing.T) []sim.Instance {
	t.Helper()
	is, err := f.cloud.Instances(t.Context())
	if err != nil {
		t.Fatalf("Instances: %v", err)
	}
	return is
}

// running waits until n instances run (no more booting) and returns them.
func (f *fixture) running(t *testing.T, n int) []sim.Instance {
	t.Helper()
	var is []sim.Instance
	waitFor(t, fmt.Sprintf("%d running instances", n), 20*time.Second, func() bool {
		is = f.instances(t)
		return len(is) == n && !slices.ContainsFunc(is, func(i sim.Instance) bool { return i.State != sim.Running })
	})
	return is
}

// record waits for the record of stand-in id.
func (f *fixture) record(t *testing.T, id string) record {
	t.Helper()
	var r record
	waitFor(t, "the record of "+id, 20*time.Second, func() bool {
		b, err := os.ReadFile(filepath.Join(f.dir, id+".json"))
		return err == nil && json.Unmarshal(b, &r) == nil
	})
	return r
}

// waitFor polls cond every 20ms until it holds, failing the test after timeout.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dead reports whether process pid has exited (a zombie not yet reaped by its new parent
// counts: it runs nothing).
func dead(t *testing.T, pid int) bool {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("checks processes through /proc")
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && len(b) > i+2 && b[i+2] == 'Z'
}

// waitDead waits until every pid has exited.
func waitDead(t *testing.T, pids ...int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("processes %v to exit", pids), 10*time.Second, func() bool {
		return !slices.ContainsFunc(pids, func(pid int) bool { return !dead(t, pid) })
	})
}
