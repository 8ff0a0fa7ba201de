package providers

import (
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// groupAttr puts the script in a process group of its own (its ID is the script's PID), and
// has the kernel kill the script if the driver dies first.
func groupAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// waitExited blocks until the script has exited but leaves it unreaped (WNOWAIT): while it is
// a zombie its PID, which is also its group's ID, cannot be given to another process, so
// killGroup cannot hit a stranger. The returned reap collects the exit status.
func waitExited(cmd *exec.Cmd) (reap func() error) {
	var info unix.Siginfo
	for {
		// On another error (none is expected), killGroup and reap still end the script.
		if err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != unix.EINTR {
			break
		}
	}
	return cmd.Wait
}

// killGroup sends SIGKILL to every process in the script's group, the script included.
func killGroup(cmd *exec.Cmd) {
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // ESRCH: nothing left, which is fine
}
