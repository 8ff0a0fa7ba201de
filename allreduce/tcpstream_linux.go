//go:build linux

package allreduce

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tcpStream is stream for a rank whose neighbours on both sides of the ring are reached over
// TCP, built as shmStream is: one goroutine moves both directions forward with non-blocking
// system calls on the two sockets, and waits only when neither can move, on both sockets and
// the communicator's wake-up eventfd at once (poll). goStream's two goroutines each wait in
// Go's network poller, and every chunk is a hand-off between them: on 2 vCPUs each wake-up
// waited for a scheduler slot, and a 2-rank 1 MiB allreduce over loopback took 2-3 times as
// long (docs/design-notes/allreduce-tuning.md §8).
//
// Units are numbered from first, on both sides.
func (c *Comm) tcpStream(o *opInfo, next, prev *peer, first int, sends, recvs []unit, dt dtype, op Op) error {
	wake, err := c.waker()
	if err != nil {
		return c.goStream(o, next, prev, first, sends, recvs, dt, op)
	}
	t := c.tcpRun()
	if t.next, err = rawConn(next); err != nil {
		return c.lost(next, err)
	}
	if t.prev, err = rawConn(prev); err != nil {
		return c.lost(prev, err)
	}
	t.s = tcpSender{side: side{c: c, p: next, o: o, first: first}}
	t.v = tcpReceiver{side: side{c: c, p: prev, o: o, first: first}, dt: dt, op: op}
	t.wake, t.sends, t.recvs = wake, sends, recvs
	err = t.next.Control(t.outer)
	started, prevErr, loopErr := t.s.started, t.prevErr, t.loopErr
	*t = tcpCall{outer: t.outer, inner: t.inner} // holds no peer or user buffer past the call
	switch {
	case err != nil:
		return c.lost(next, err)
	case prevErr != nil:
		return c.lost(prev, prevErr)
	case loopErr != nil && started:
		next.broken = true // a frame is half out: no abort frame may follow it
	}
	return loopErr
}

// tcpCall is one tcpStream call, handed to the closures that reach its two sockets through
// RawConn.Control (the sockets stay open meanwhile). The communicator keeps one, its
// closures made once, so that a call allocates nothing: a closure made per call escapes
// through the RawConn interface.
type tcpCall struct {
	next, prev   syscall.RawConn
	s            tcpSender
	v            tcpReceiver
	wake         int
	sends, recvs []unit
	prevErr      error // Control on prev's socket failed
	loopErr      error
	outer, inner func(fd uintptr)
}

// tcpRun returns the communicator's tcpCall, made on first use. Like scratchBuf's space it
// is guarded by opMu: streams run one at a time, in the operation's goroutine.
func (c *Comm) tcpRun() *tcpCall {
	if c.tcp == nil {
		t := &tcpCall{}
		t.outer = func(fd uintptr) {
			t.s.fd = int(fd)
			t.prevErr = t.prev.Control(t.inner)
		}
		t.inner = func(fd uintptr) {
			t.v.fd = int(fd)
			t.loopErr = c.tcpLoop(&t.s, &t.v, t.wake, t.sends, t.recvs)
		}
		c.tcp = t
	}
	return c.tcp
}

// rawConn is p's socket for RawConn.Control, asked for once (SyscallConn allocates); under
// opMu, as tcpRun.
func rawConn(p *peer) (syscall.RawConn, error) {
	if p.rc == nil {
		rc, err := p.conn.SyscallConn()
		if err != nil {
			return nil, err
		}
		p.rc = rc
	}
	return p.rc, nil
}

func (c *Comm) tcpLoop(s *tcpSender, v *tcpReceiver, wake int, sends, recvs []unit) error {
	var stalled time.Time // when neither side last moved; zero while they do
	for s.i < len(sends) || v.i < len(recvs) {
		if err := c.stopping(); err != nil {
			return err
		}
		canSend := s.i < len(sends) && v.i > sends[s.i].after
		canRecv := v.i < len(recvs) && s.i > recvs[v.i].after
		moved := false
		if canSend {
			m, err := s.step(sends[s.i].buf)
			if err != nil {
				return err
			}
			moved = m
		}
		if canRecv {
			m, err := v.step(recvs[v.i])
			if err != nil {
				return err
			}
			moved = moved || m
		}
		if moved {
			stalled = time.Time{}
			continue
		}
		if !canSend && !canRecv {
			return fmt.Errorf("internal error: unit schedule stalls at send %d, receive %d", s.i, v.i)
		}
		now := time.Now()
		if stalled.IsZero() {
			stalled = now
		}
		// Yield the core for a while before sleeping, as shmAwait does: the peer is most
		// often about to run, and a sleep and a wake cost two trips through the scheduler.
		if now.Sub(stalled) < tcpYield {
			osYield()
			continue
		}
		// Silence past Config.Timeout is blamed on the peer received from when this side
		// waits on it (next, when silent too, is most likely waiting for it as well).
		left := c.cfg.Timeout - now.Sub(stalled)
		if left <= 0 {
			if canRecv {
				return c.lost(v.p, os.ErrDeadlineExceeded)
			}
			return c.lost(s.p, os.ErrDeadlineExceeded)
		}
		fds := make([]unix.PollFd, 0, 3)
		fds = append(fds, unix.PollFd{Fd: int32(wake), Events: unix.POLLIN})
		if canSend {
			fds = append(fds, unix.PollFd{Fd: int32(s.fd), Events: unix.POLLOUT})
		}
		if canRecv {
			if canSend && s.fd == v.fd {
				fds[1].Events |= unix.POLLIN
			} else {
				fds = append(fds, unix.PollFd{Fd: int32(v.fd), Events: unix.POLLIN})
			}
		}
		ms := int((left + time.Millisecond - 1) / time.Millisecond)
		if _, err := unix.Poll(fds, max(ms, 1)); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("poll: %w", err)
		}
		if fds[0].Revents != 0 {
			drainWaker(wake) // an interruption: stopping says which, at the top
		}
	}
	return nil
}

// tcpSender writes data frames to p's socket without blocking, one unit after the other.
type tcpSender struct {
	side
	fd      int
	frame   [][]byte // what is left of unit i; nil: not started
	started bool     // some of unit i is written
	iov     [2][]byte
	vec     [2]unix.Iovec // writevNow's iovecs, kept here so that a call allocates nothing
}

// step writes as much of unit i (payload b) as the socket takes now; it reports whether it
// wrote anything. The whole rest of the frame goes to one writev: writing in pieces and
// reading between them, as shmStream does, made TCP 1.5-2x slower at 16 MiB over loopback
// and veth here (docs/design-notes/allreduce-tuning.md §8).
func (s *tcpSender) step(b []byte) (bool, error) {
	if s.frame == nil {
		s.c.putHeader(s.p, s.o, s.first+s.i, b)
		s.iov = [2][]byte{s.p.whdr[:], b}
		s.frame = s.iov[:]
		if len(b) == 0 {
			s.frame = s.iov[:1]
		}
		s.started = false
	}
	w, err := writevNow(s.fd, s.frame, &s.vec)
	switch {
	case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
		return false, nil
	case err != nil:
		return false, s.c.lost(s.p, err)
	}
	s.started = s.started || w > 0
	if s.frame = advance(s.frame, w); s.frame != nil {
		return true, nil
	}
	s.started = false
	s.i++
	return true, nil
}

// tcpReceiver reads data frames from p's socket without blocking, one unit after the other:
// the header, checked as recv checks it, then the payload, copied into the unit's buffer as
// it arrives, or gathered in scratch space the size of the unit (a chunk) and reduced into
// the unit's buffer as whole elements arrive.
type tcpReceiver struct {
	side
	fd   int
	dt   dtype
	op   Op
	hdr  int // header bytes read of unit i
	done int // payload bytes of unit i read
	red  int // payload bytes of unit i reduced (reduce units)
}

// step moves unit u (the i-th) forward with what the socket holds now; it reports whether
// it moved.
func (v *tcpReceiver) step(u unit) (bool, error) {
	moved := false
	if v.hdr < headerLen {
		n, err := readNow(v.fd, v.p.rhdr[v.hdr:])
		if err != nil {
			return false, v.c.lost(v.p, err)
		}
		v.hdr += n
		if v.hdr < headerLen {
			return n > 0, nil
		}
		moved = true
		h, err := v.header(len(u.buf), true)
		if err != nil {
			return false, err
		}
		if h.kind == kindAbort {
			v.p.conn.SetReadDeadline(time.Now().Add(v.c.cfg.Timeout))
			return false, v.c.readAbort(v.p, h)
		}
	}
	if v.done < len(u.buf) {
		dst := u.buf
		if u.reduce {
			dst = v.c.scratchBuf(len(u.buf))
		}
		n, err := readNow(v.fd, dst[v.done:])
		if err != nil {
			return false, v.c.lost(v.p, err)
		}
		v.done += n
		moved = moved || n > 0
		if u.reduce {
			if whole := v.done - v.done%v.dt.size(); whole > v.red {
				reduceInto(u.buf[v.red:whole], dst[v.red:whole], v.dt, v.op, u.srcFirst)
				v.red = whole
			}
		}
		if v.done < len(u.buf) {
			return moved, nil
		}
	}
	v.i++
	v.hdr, v.done, v.red = 0, 0, 0
	return true, nil
}

// readNow reads what the socket holds of len(b) bytes without waiting; the end of the
// stream is io.EOF.
//
// readNow and writevNow are raw system calls, as osYield is. The sockets are non-blocking
// (Go's net package makes them so), so neither call ever waits; but a Syscall tells the Go
// scheduler the thread may block, and a writev of a 1 MiB chunk copies for hundreds of
// microseconds. Meanwhile the runtime's monitor thread (sysmon) finds the processor in a
// system call, takes it back and hands it off, and so keeps waking every 20 µs: on 2 vCPUs
// those wake-ups pre-empted the ranks (in a 4 MB run across veth, 1,756 of the ranks' 5,620
// context switches were sysmon's sleeps); raw calls made 1-64 MB allreduces of 2 ranks
// there 1.15-1.5x faster under BBR and CUBIC (docs/design-notes/allreduce-tuning.md §14).
func readNow(fd int, b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	switch {
	case e == unix.EAGAIN || e == unix.EINTR:
		return 0, nil
	case e != 0:
		return 0, e
	case n == 0:
		return 0, io.EOF
	}
	return int(n), nil
}

// writevNow writes as much of frame's pieces (at most two) as the socket takes now, with vec
// as the iovecs; see readNow.
func writevNow(fd int, frame [][]byte, vec *[2]unix.Iovec) (int, error) {
	n := 0
	for _, b := range frame {
		if len(b) > 0 {
			vec[n].Base = &b[0]
			vec[n].SetLen(len(b))
			n++
		}
	}
	r, _, e := unix.RawSyscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&vec[0])), uintptr(n))
	*vec = [2]unix.Iovec{} // holds no user buffer past the call
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// waker returns the communicator's eventfd, which interrupt writes to so that a tcpStream
// waiting in poll returns; it is made on first use and closed with the connections.
func (c *Comm) waker() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.wakeFd == 0 {
		fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
		if err != nil {
			return 0, err
		}
		c.wakeFd = fd + 1
	}
	return c.wakeFd - 1, nil
}

// kickWaker wakes a tcpStream waiting in poll; c.mu is held.
func (c *Comm) kickWaker() {
	if c.wakeFd != 0 {
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		unix.Write(c.wakeFd-1, one[:])
	}
}

func drainWaker(fd int) {
	var b [8]byte
	unix.Read(fd, b[:])
}

// closeWaker closes the eventfd; c.mu is held.
func (c *Comm) closeWaker() {
	if c.wakeFd != 0 {
		unix.Close(c.wakeFd - 1)
		c.wakeFd = 0
	}
}

// congestionControl is the congestion control algorithm of p's connection (TCP_CONGESTION:
// the network namespace's default unless a program chose), "" if it cannot be read.
func congestionControl(p *peer) string {
	rc, err := rawConn(p)
	if err != nil {
		return ""
	}
	var cc string
	rc.Control(func(fd uintptr) {
		cc, _ = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	})
	return cc
}

// vethAddrs lists this network namespace's addresses that belong to veth interfaces (the
// driver ethtool names), as in a network namespace or a container.
func vethAddrs() []net.IP {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil
	}
	var ips []net.IP
	for _, ifc := range ifaces {
		if ifaceDriver(ifc.Name) != "veth" {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				ips = append(ips, n.IP)
			}
		}
	}
	return ips
}

// ifaceDriver is the driver of network interface name (ETHTOOL_GDRVINFO), "" if unknown.
func ifaceDriver(name string) string {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	info, err := unix.IoctlGetEthtoolDrvinfo(fd, name)
	if err != nil {
		return ""
	}
	return unix.ByteSliceToString(info.Driver[:])
}
