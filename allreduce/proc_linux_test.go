package allreduce_test

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal has the kernel SIGKILL the child if the test process dies, a second
// safeguard beside the child's watch on its stdin.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
