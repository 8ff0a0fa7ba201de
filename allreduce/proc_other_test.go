//go:build !linux

package allreduce_test

import "os/exec"

// setParentDeathSignal: only Linux has a parent-death signal; elsewhere the child relies on
// its watch on stdin.
func setParentDeathSignal(*exec.Cmd) {}
