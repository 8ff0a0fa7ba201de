package allreduce

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futex operations (linux/futex.h); not the _PRIVATE ones: the word is shared between processes.
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

// futexWait sleeps while *w == v, for at most d (or until a signal or a wake).
func futexWait(w *atomic.Uint32, v uint32, d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp, uintptr(v), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// osYield is sched_yield as a raw system call: Syscall tells the Go scheduler that the
// thread may block (entersyscall), and the monitor thread then takes its P away from a
// thread that has yielded for long, handing it back on return; with 4 ranks on 2 vCPUs
// that cost 15-45 % of a 64 KB-1 MB allreduce (docs/design-notes/allreduce-tuning.md §10). sched_yield and
// FUTEX_WAKE never block; FUTEX_WAIT, which does, stays a Syscall.
func osYield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

func futexWake(w *atomic.Uint32) {
	unix.RawSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, 1, 0, 0, 0)
}

// segment is a shared-memory segment being set up: an anonymous memfd, so that nothing is
// left in any file system whatever happens to the processes; the peer opens it through
// /proc/<pid>/fd/<fd>, which the kernel allows only to the same user.
type segment struct {
	file *os.File
	mem  []byte
}

func createSegment(ringSize int, token []byte) (*segment, error) {
	fd, err := unix.MemfdCreate("elasticd-allreduce", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:elasticd-allreduce")
	size := segHeader + 2*ringSize
	if err := f.Truncate(int64(size)); err != nil {
		f.Close()
		return nil, fmt.Errorf("size shared memory: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("map shared memory: %w", err)
	}
	binary.LittleEndian.PutUint64(mem[0:], shmMagic)
	binary.LittleEndian.PutUint64(mem[8:], uint64(ringSize))
	copy(mem[16:16+tokenLen], token)
	return &segment{file: f, mem: mem}, nil
}

// openSegment maps the creator's segment and checks that it is the one the token names.
func openSegment(pid, fd, ringSize int, token []byte) ([]byte, error) {
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/%d", pid, fd), os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size := segHeader + 2*ringSize
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() != int64(size) {
		return nil, fmt.Errorf("segment of %d bytes, expected %d", st.Size(), size)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map: %w", err)
	}
	if binary.LittleEndian.Uint64(mem[0:]) != shmMagic || binary.LittleEndian.Uint64(mem[8:]) != uint64(ringSize) || !bytes.Equal(mem[16:16+tokenLen], token) {
		unix.Munmap(mem)
		return nil, errors.New("segment does not carry the offered token")
	}
	return mem, nil
}

func unmapSegment(mem []byte) error { return unix.Munmap(mem) }

// hostID names this boot of this machine and this network namespace: two ranks that read the
// same one share a kernel and a network stack, that is, one host. Ranks in separate network
// namespaces (containers, or the hosts the cross-host benchmark makes with veth pairs) count
// as separate hosts and talk over TCP, as ranks on separate machines would.
func hostID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	ns, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(b)) + " " + ns
}

// peeker reports, without blocking or consuming anything, whether a connection has
// something to say: bytes (an abort frame), its end, or an error. A rank looks before every
// sleep on a ring, so one is made per link and a look allocates nothing.
type peeker struct {
	rc syscall.RawConn
	fn func(fd uintptr) bool

	mu   sync.Mutex // a link's sender and receiver may look at once (goStream, fanOut)
	b    [1]byte
	perr error
}

func newPeeker(conn *net.TCPConn) *peeker {
	k := &peeker{}
	rc, err := conn.SyscallConn()
	if err != nil {
		return k // no RawConn: every look reports news, and the read tells what
	}
	k.rc = rc
	k.fn = func(fd uintptr) bool {
		// Not unix.Recvfrom: it allocates for the sender's address, which a stream has not.
		_, _, e := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&k.b[0])), 1, unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		k.perr = nil
		if e != 0 {
			k.perr = e
		}
		return true
	}
	return k
}

// peek is true when the connection has news; false: still quiet.
func (k *peeker) peek() bool {
	if k.rc == nil {
		return true
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.rc.Read(k.fn); err != nil {
		return true // a deadline (our own interruption) or a closed socket: let the read tell
	}
	// No byte and no error is the connection's end; a byte is a frame: both end the wait.
	return k.perr != unix.EAGAIN
}

const shmSupported = true

// futexWaitv is struct futex_waitv (linux/futex.h).
type futexWaitv struct {
	val   uint64
	uaddr uint64
	flags uint32
	_     uint32
}

// futex2SizeU32 is FUTEX2_SIZE_U32: a 32-bit word, shared (FUTEX2_PRIVATE not set).
const futex2SizeU32 = 0x02

// noWaitv is set once futex_waitv is found missing (kernels before 5.16).
var noWaitv atomic.Bool

// futexWaitAny sleeps while every words[i].seq == vals[i], for at most d (or until a signal
// or a wake of any of them). Without futex_waitv it sleeps on the first word only, and then
// for at most a millisecond, so that a wake of another word is late by that much at worst.
func futexWaitAny(words []waitWord, vals []uint32, d time.Duration) {
	if len(words) > 1 && !noWaitv.Load() {
		var ws [2]futexWaitv
		for i, w := range words {
			ws[i] = futexWaitv{val: uint64(vals[i]), uaddr: uint64(uintptr(unsafe.Pointer(w.seq))), flags: futex2SizeU32}
		}
		var ts unix.Timespec
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
		ts = unix.NsecToTimespec(ts.Nano() + d.Nanoseconds())
		_, _, e := unix.Syscall6(unix.SYS_FUTEX_WAITV, uintptr(unsafe.Pointer(&ws[0])), uintptr(len(words)), 0, uintptr(unsafe.Pointer(&ts)), unix.CLOCK_MONOTONIC, 0)
		if e != unix.ENOSYS {
			return
		}
		noWaitv.Store(true)
	}
	if len(words) > 1 {
		d = min(d, time.Millisecond)
	}
	futexWait(words[0].seq, vals[0], d)
}
