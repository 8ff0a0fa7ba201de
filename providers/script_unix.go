//go:build unix && !linux

package providers

import (
	"os/exec"
	"syscall"
)

func groupAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// waitExited reaps the script. Without Linux's waitid(WNOWAIT) the group is killed after the
// leader is reaped, which leaves a tiny window in which its PID could be reused.
func waitExited(cmd *exec.Cmd) (reap func() error) {
	err := cmd.Wait()
	return func() error { return err }
}

func killGroup(cmd *exec.Cmd) { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
