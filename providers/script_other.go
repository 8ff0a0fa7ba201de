//go:build !unix

package providers

import (
	"os/exec"
	"syscall"
)

// Without process groups only the script itself can be killed; what it started may outlive it.
func groupAttr() *syscall.SysProcAttr { return nil }

func waitExited(cmd *exec.Cmd) (reap func() error) {
	err := cmd.Wait()
	return func() error { return err }
}

func killGroup(cmd *exec.Cmd) { cmd.Process.Kill() }
