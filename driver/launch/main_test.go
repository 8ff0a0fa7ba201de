//go:build linux

package launch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/launch"
	"github.com/elasticd/elasticd/proc"
)

// driverEnv, when set, makes the test binary act as a driver (see runDriver) instead of running
// tests; its value is a JSON driverConfig.
const driverEnv = "ELASTICD_LAUNCH_TEST_DRIVER"

func TestMain(m *testing.M) {
	if c := os.Getenv(driverEnv); c != "" {
		runDriver(c)
		return
	}
	os.Exit(m.Run())
}

type driverConfig struct {
	SSH  *launch.SSHConfig // nil: the local launcher
	Host string
}

// treeScript makes a worker with a child and a grandchild, all ignoring SIGTERM, and prints
// their PIDs.
const treeScript = `trap "" TERM; sleep 60 & echo "pid $!"; (sleep 60 & echo "pid $!"; wait) & echo "pid $!"; echo "pid $$"; echo ready; wait`

// runDriver launches one treeScript worker with its output on stdout, then waits to be killed.
func runDriver(config string) {
	var c driverConfig
	if err := json.Unmarshal([]byte(config), &c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	l := proc.NewLocal()
	if c.SSH != nil {
		l = launch.NewSSH(*c.SSH)
	}
	p, err := l.Start(context.Background(), proc.Spec{Name: "w", Host: c.Host, Command: sh(treeScript), Stdout: os.Stdout, Stderr: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	p.Wait()
	os.Exit(2)
}

// testDriverKilled runs a driver process that launches a worker tree, SIGKILLs the driver and
// checks that the whole tree dies within the timeout.
func testDriverKilled(t *testing.T, c driverConfig, timeout time.Duration) {
	config, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var out buffer
	driver := exec.Command(os.Args[0], "-test.run=^$")
	driver.Env = append(os.Environ(), driverEnv+"="+string(config))
	driver.Stdout, driver.Stderr = &out, &out
	driver.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	driver.WaitDelay = time.Second
	if err := driver.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(driver.Process.Pid, syscall.SIGKILL)
		driver.Wait()
	})
	refs := waitPIDs(t, &out, 4)
	if err := syscall.Kill(driver.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	driver.Wait()
	waitGone(t, timeout, refs)
}
