//go:build !linux

package allreduce_test

import (
	"errors"
	"os/exec"
)

// setParentDeathSignal: only Linux has a parent-death signal; elsewhere the child relies on
// its watch on stdin.
func setParentDeathSignal(*exec.Cmd) {}

// denyMemoryReads: seccomp is Linux's, as are direct reads.
func denyMemoryReads() error { return errors.New("no seccomp here") }
