//go:build !linux

package allreduce

import (
	"net"
	"os"
	"sync/atomic"
	"time"
)

// Shared memory is Linux-only (memfd, futex, /proc); elsewhere every pair uses TCP, and the
// offer a Linux peer makes is declined. These are never reached with a link in place.

const shmSupported = false

type segment struct {
	file *os.File
	mem  []byte
}

func futexWait(_ *atomic.Uint32, _ uint32, d time.Duration)  { time.Sleep(min(d, time.Millisecond)) }
func futexWake(*atomic.Uint32)                               {}
func futexWaitAny(_ []waitWord, _ []uint32, d time.Duration) { time.Sleep(min(d, time.Millisecond)) }
func osYield()                                               {}
func createSegment(int, []byte) (*segment, error)            { return nil, errNoShm }
func openSegment(_, _, _ int, _ []byte) ([]byte, error)      { return nil, errNoShm }
func unmapSegment([]byte) error                              { return nil }
func hostID() string                                         { return "" }

type peeker struct{}

func newPeeker(*net.TCPConn) *peeker { return nil }
func (*peeker) peek() bool           { return false }
