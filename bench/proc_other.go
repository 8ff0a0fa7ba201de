//go:build !linux

package bench

import "syscall"

// childProcAttr: without Linux's parent-death signal, children are stopped by context.
func childProcAttr() *syscall.SysProcAttr { return nil }
