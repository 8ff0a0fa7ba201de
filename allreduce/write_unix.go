//go:build linux || darwin

package allreduce

import (
	"cmp"
	"errors"
	"net"

	"golang.org/x/sys/unix"
)

// writeNow makes one non-blocking writev; a full socket buffer is not an error.
func writeNow(conn *net.TCPConn, hdr, payload []byte) (int, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var werr error
	err = rc.Write(func(fd uintptr) bool {
		iov := [][]byte{hdr, payload}
		if len(payload) == 0 {
			iov = iov[:1]
		}
		n, werr = unix.Writev(int(fd), iov)
		return true // never wait for the socket to become writable
	})
	if errors.Is(werr, unix.EAGAIN) {
		return 0, nil
	}
	return max(n, 0), cmp.Or(werr, err)
}
