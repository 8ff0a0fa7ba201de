//go:build unix

package rendezvous_test

import (
	"fmt"
	"syscall"
)

// raiseFileLimit raises the soft limit on open files to at least n, up to the hard limit.
func raiseFileLimit(n uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Cur >= n {
		return nil
	}
	if lim.Max < n {
		return fmt.Errorf("hard limit on open files is %d; need %d (raise ulimit -Hn)", lim.Max, n)
	}
	lim.Cur = n
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}
