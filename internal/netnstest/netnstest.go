// Package netnstest is for tests that make network namespaces (ip netns): listing what runs in
// one and deleting it with nothing left behind.
package netnstest

import (
	"os/exec"
	"syscall"
	"testing"

	"github.com/elasticd/elasticd/internal/lan"
)

// Pids lists the processes running in namespace ns.
func Pids(ns string) ([]int, error) { return lan.Pids(ns) }

// Delete kills what still runs in namespace ns, by PID, failing the test for each (a test
// stops what it starts), and deletes the namespace; its veths go with it.
func Delete(t testing.TB, ns string) {
	t.Helper()
	if pids, err := Pids(ns); err == nil {
		for _, pid := range pids {
			t.Errorf("process %d still runs in %s: killing it", pid, ns)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if out, err := exec.Command("ip", "netns", "delete", ns).CombinedOutput(); err != nil {
		t.Errorf("ip netns delete %s: %v: %s", ns, err, out)
	}
}
