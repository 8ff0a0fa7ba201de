//go:build !linux

package proc

import "syscall"

// GroupAttr puts the child in a process group of its own. Without Linux's parent-death signal,
// a worker whose driver is SIGKILLed is left to the guard (local) or to the remote wrapper (ssh).
func GroupAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// waitExited reports false at once: only Linux can wait without reaping, so elsewhere the
// leader is reaped before its leftover group is killed (POSIX keeps a group's ID from being
// reused while the group has members).
func waitExited(pid int) bool { return false }
