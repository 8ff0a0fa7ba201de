package proc

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// GroupAttr puts the child in a process group of its own, and has the kernel SIGKILL it when
// the driver dies, however it dies. (Strictly: when the OS thread that forked it exits. Go
// retires a thread only when a goroutine exits while locked to it with runtime.LockOSThread,
// so nothing that starts processes here may do that.)
func GroupAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// waitExited blocks until the process has exited, without reaping it, and reports true.
func waitExited(pid int) bool {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			return err == nil
		}
	}
}
