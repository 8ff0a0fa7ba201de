package allreduce

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Shared-memory data path between two ranks on the same machine (docs/protocol.md §1.6).
//
// The pair keeps its TCP connection for setup, abort frames and liveness; data frames go
// through a segment both map: one single-producer single-consumer byte ring per direction.
// A frame in a ring is the 40-byte header, the payload, and padding to a multiple of 8, so
// every payload starts 8-byte aligned and no element of any dtype straddles the ring's end:
// the receiver reduces straight from the ring into the user's buffer, without a scratch copy.
//
// Segment layout (segHeader bytes of control, then the two data areas):
//
//	0     magic u64, ringSize u64, token [16]byte
//	64    closed u32: set by either side when it aborts or closes; wakes the other at once
//	1024  ring 0 control (creator → acceptor), 2048 ring 1 control (acceptor → creator)
//	4096  ring 0 data, then ring 1 data, ringSize bytes each (a power of two)
//
// Ring control, each field on its own cache line so producer and consumer never share one:
//
//	+0   head u64 (bytes ever written; producer)   +64  tail u64 (bytes ever read; consumer)
//	+128 dataSeq u32, +132 dataWait u32 (consumer sleeps on dataSeq when the ring is empty)
//	+192 spaceSeq u32, +196 spaceWait u32 (producer sleeps on spaceSeq when the ring is full)
//
// Sleeping is a futex on the shared word, in slices of at most shmSlice so that the sleeper
// checks its peer's TCP connection (a dead process closes it), its own interruption and
// Config.Timeout while it waits.
const (
	segHeader = 4096
	shmMagic  = 0x4d48534c45414c45 // "ELALSHM" plus version 'M'
	tokenLen  = 16
	// shmPiece is how many bytes a side copies before publishing its progress, so that the
	// other side starts on a chunk before it is whole.
	shmPiece = 64 << 10
	// shmSlice bounds one futex sleep: how late a waiter notices a dead peer at worst.
	shmSlice = 50 * time.Millisecond
)

// shmYield is how long a waiter yields its core (sched_yield) before it sleeps, whatever
// the number of cores: with more ranks than cores too, a yield hands the core to a rank
// that is runnable, most often the one waited for, at once, where a futex sleep and wake
// cost two trips through the scheduler. Measured with 4 ranks on 2 vCPUs (docs/design-notes/allreduce-tuning.md
// §6), yielding for 50 µs took 40-55 % less time than sleeping at once from 64 KB to 16 MB;
// 250 µs instead of 50 cut the slowest tenth of 64 KB-1 MB allreduces by a further 25-45 %
// (§18). A waiter with cores to spare spins that long at most, then sleeps.
const shmYield = 250 * time.Microsecond

// tcpYield is shmYield for a rank waiting on sockets (tcpLoop), left at the 50 µs measured.
const tcpYield = 50 * time.Microsecond

// spinIters is how many times a waiter polls before it sleeps; spinning only pays when
// every rank can have a core of its own.
var spinIters = func() int {
	if runtime.NumCPU() >= 4 {
		return 4000
	}
	return 50
}()

type ring struct {
	head, tail          *atomic.Uint64
	dataSeq, dataWait   *atomic.Uint32
	spaceSeq, spaceWait *atomic.Uint32
	data                []byte
	mask                uint64
	pos                 uint64 // head for the producer, tail for the consumer: only this side writes it
}

func newRing(ctl unsafe.Pointer, data []byte) ring {
	at := func(off uintptr) unsafe.Pointer { return unsafe.Add(ctl, off) }
	r := ring{
		head: (*atomic.Uint64)(at(0)), tail: (*atomic.Uint64)(at(64)),
		dataSeq: (*atomic.Uint32)(at(128)), dataWait: (*atomic.Uint32)(at(132)),
		spaceSeq: (*atomic.Uint32)(at(192)), spaceWait: (*atomic.Uint32)(at(196)),
		data: data, mask: uint64(len(data) - 1),
	}
	return r
}

// shmLink is one rank's view of a segment shared with one peer.
type shmLink struct {
	mem    []byte // the whole mapping
	unmap  func([]byte) error
	closed *atomic.Uint32
	tx, rx ring
	nt     *atomic.Bool // whether write uses non-temporal stores (Comm.ntOn); nil: never

	// check is called before every sleep: a non-nil error ends the wait (peer gone, this
	// rank interrupted, Timeout passed). start is when the wait began.
	check func(start time.Time) error

	goneMu sync.Mutex
	gone   error // why the peer is known gone, once a waiter found out
}

func newLink(mem []byte, creator bool, unmap func([]byte) error) *shmLink {
	size := (len(mem) - segHeader) / 2
	base := unsafe.Pointer(unsafe.SliceData(mem))
	r0 := newRing(unsafe.Add(base, 1024), mem[segHeader:segHeader+size:segHeader+size])
	r1 := newRing(unsafe.Add(base, 2048), mem[segHeader+size:])
	l := &shmLink{mem: mem, unmap: unmap, closed: (*atomic.Uint32)(unsafe.Add(base, 64))}
	if creator {
		l.tx, l.rx = r0, r1
	} else {
		l.tx, l.rx = r1, r0
	}
	l.tx.pos = l.tx.head.Load()
	l.rx.pos = l.rx.tail.Load()
	return l
}

// wake bumps seq and wakes its sleeper when one announced itself in flag.
func wake(seq, flag *atomic.Uint32) {
	if flag.Load() != 0 {
		seq.Add(1)
		futexWake(seq)
	}
}

// kick wakes this side's own sleepers, whatever they wait for (an interruption).
func (l *shmLink) kick() {
	l.rx.dataSeq.Add(1)
	futexWake(l.rx.dataSeq)
	l.tx.spaceSeq.Add(1)
	futexWake(l.tx.spaceSeq)
}

// shut marks the segment closed and wakes both sides' sleepers.
func (l *shmLink) shut() {
	l.closed.Store(1)
	for _, s := range []*atomic.Uint32{l.rx.dataSeq, l.tx.spaceSeq, l.tx.dataSeq, l.rx.spaceSeq} {
		s.Add(1)
		futexWake(s)
	}
}

// release unmaps the segment; nothing may touch it afterwards.
func (l *shmLink) release() {
	if l.mem != nil {
		l.unmap(l.mem)
		l.mem = nil
	}
}

// errPeerClosed ends a wait when the peer marked the segment closed; the caller finds out
// why on the TCP connection.
type shmClosed struct{}

func (shmClosed) Error() string { return "peer closed the shared-memory link" }

// await returns once ready holds, spinning briefly, then sleeping on seq with flag raised.
func (l *shmLink) await(ready func() bool, seq, flag *atomic.Uint32) error {
	_, err := awaitLinks([]*shmLink{l}, []waitWord{{seq, flag}}, ready)
	return err
}

// waitWord is a futex word to sleep on and the flag that asks the other side to wake it.
type waitWord struct{ seq, flag *atomic.Uint32 }

// awaitLinks returns once ready holds: it polls spinIters times, then yields its core for
// shmYield (the peer is most often about to publish, and a futex round trip through the
// scheduler costs tens of microseconds), then sleeps on every word at once (at most two),
// with their flags raised. A wait on links ends early when one of them is closed or its
// check fails; the index of that link comes with the error.
//
// A peer that is done writes its last frame and then closes (its process exits), so a
// close may be seen after a ready that did not yet see the frame: every wait that a close or
// a failed check ends looks at ready once more, and takes the frame if it is there.
func awaitLinks(links []*shmLink, words []waitWord, ready func() bool) (int, error) {
	closed := func() int {
		for i, l := range links {
			if l.closed.Load() != 0 {
				return i
			}
		}
		return -1
	}
	for range spinIters {
		if ready() {
			return 0, nil
		}
		if i := closed(); i >= 0 {
			return lastLook(i, shmClosed{}, ready)
		}
	}
	start := time.Now()
	for time.Since(start) < shmYield {
		osYield()
		if ready() {
			return 0, nil
		}
		if i := closed(); i >= 0 {
			return lastLook(i, shmClosed{}, ready)
		}
	}
	var vals [2]uint32
	for {
		for i, w := range words {
			w.flag.Store(1)
			vals[i] = w.seq.Load() // before the checks: a wake after them changes it
		}
		i, err := awaitCheck(links, ready, start)
		if i < 0 {
			futexWaitAny(words, vals[:len(words)], shmSlice)
		}
		for _, w := range words {
			w.flag.Store(0)
		}
		if i >= 0 {
			return i, err
		}
	}
}

// awaitCheck is what awaitLinks checks before it sleeps: ready (0, nil), or the link whose
// wait must end and why, or (-1, nil) to sleep.
func awaitCheck(links []*shmLink, ready func() bool, start time.Time) (int, error) {
	if ready() {
		return 0, nil
	}
	for i, l := range links {
		if l.closed.Load() != 0 {
			return lastLook(i, shmClosed{}, ready)
		}
		if err := l.check(start); err != nil {
			return lastLook(i, err, ready)
		}
	}
	return -1, nil
}

// lastLook ends a wait on link i with err, unless ready holds now (see awaitLinks).
func lastLook(i int, err error, ready func() bool) (int, error) {
	if ready() {
		return 0, nil
	}
	return i, err
}

// write copies bufs into tx as one frame's worth of bytes, padding the frame to 8 bytes when
// it ends here (frameEnd). Without block it stops when the ring is full and returns how far it got.
func (l *shmLink) write(bufs [][]byte, block bool) (int, error) {
	r := &l.tx
	size := uint64(len(r.data))
	nt := l.nt != nil && l.nt.Load()
	done := 0
	var tail uint64 = r.tail.Load()
	for _, b := range bufs {
		for len(b) > 0 {
			space := size - (r.pos - tail)
			if space == 0 {
				tail = r.tail.Load()
				space = size - (r.pos - tail)
			}
			if space == 0 {
				if !block {
					return done, nil
				}
				if err := l.await(func() bool { tail = r.tail.Load(); return r.pos-tail < size }, r.spaceSeq, r.spaceWait); err != nil {
					return done, err
				}
				continue
			}
			n := min(uint64(len(b)), space, shmPiece)
			off := r.pos & r.mask
			k := ringCopy(r.data[off:], b[:n], nt)
			ringCopy(r.data, b[k:n], nt)
			r.pos += n
			r.head.Store(r.pos)
			wake(r.dataSeq, r.dataWait)
			b = b[n:]
			done += int(n)
		}
	}
	return done, nil
}

// readable waits until at least need bytes (need ≤ 8) are in rx and returns how many are.
func (l *shmLink) readable(need uint64) (uint64, error) {
	r := &l.rx
	avail := r.head.Load() - r.pos
	if avail >= need {
		return avail, nil
	}
	err := l.await(func() bool { avail = r.head.Load() - r.pos; return avail >= need }, r.dataSeq, r.dataWait)
	return avail, err
}

// consumed gives n bytes of rx back to the producer.
func (l *shmLink) consumed(n uint64) {
	r := &l.rx
	r.pos += n
	r.tail.Store(r.pos)
	wake(r.spaceSeq, r.spaceWait)
}

// read copies the next len(dst) bytes of rx into dst.
func (l *shmLink) read(dst []byte) error {
	r := &l.rx
	for len(dst) > 0 {
		avail, err := l.readable(1)
		if err != nil {
			return err
		}
		off := r.pos & r.mask
		n := min(avail, uint64(len(dst)), uint64(len(r.data))-off, shmPiece)
		copy(dst[:n], r.data[off:off+n])
		l.consumed(n)
		dst = dst[n:]
	}
	return nil
}

// reduce reduces the next len(dst) bytes of rx into dst (dst = dst op ring), piece by piece as
// they arrive, reading the ring in place.
func (l *shmLink) reduce(dst []byte, dt dtype, op Op) error {
	r := &l.rx
	es := uint64(dt.size())
	for len(dst) > 0 {
		avail, err := l.readable(es)
		if err != nil {
			return err
		}
		off := r.pos & r.mask
		n := min(avail, uint64(len(dst)), uint64(len(r.data))-off, shmPiece)
		n -= n % es
		reduceInto(dst[:n], r.data[off:off+n], dt, op, false)
		l.consumed(n)
		dst = dst[n:]
	}
	return nil
}

// skip discards the padding after a frame of n bytes.
func (l *shmLink) skipPad(n int) error {
	pad := uint64(padLen(n))
	if pad == 0 {
		return nil
	}
	if _, err := l.readable(pad); err != nil {
		return err
	}
	l.consumed(pad)
	return nil
}

var zeros [8]byte

// padLen is the padding after a frame of n bytes in a ring.
func padLen(n int) int { return (8 - n%8) % 8 }

// shmRingSize is the data area of each direction: one chunk, a power of two, at least 64 KiB.
func shmRingSize(chunk int) int {
	s := 64 << 10
	for s < chunk {
		s <<= 1
	}
	return s
}
