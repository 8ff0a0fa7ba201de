package bench

import "syscall"

// childProcAttr makes a helper process die with elasticd, so none outlives it.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
