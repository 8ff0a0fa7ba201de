package allreduce

import (
	"fmt"
)

// shmStream is stream for a rank whose neighbours on both sides of the ring are reached over
// shared memory. One goroutine moves both rings forward without blocking: it writes what the
// ring to next takes, reduces or copies what has arrived from prev, a piece at a time, and
// waits only when neither can move, on both at once. stream's two goroutines hand every
// chunk over a channel and each waits on its own ring; on a machine with no core to spare
// for every rank's goroutines, each hand-off and each wake-up waits for a scheduler slot,
// which cost about 200 µs per collective on 2 vCPUs (docs/design-notes/allreduce-tuning.md §6).
//
// Units are numbered from first, on both sides.
func (c *Comm) shmStream(o *opInfo, next, prev *peer, first int, sends, recvs []unit, dt dtype, op Op) error {
	s := shmSender{side: side{c: c, p: next, o: o, first: first}}
	v := shmReceiver{side: side{c: c, p: prev, o: o, first: first}, dt: dt, op: op}
	for s.i < len(sends) || v.i < len(recvs) {
		canSend := s.i < len(sends) && v.i > sends[s.i].after
		canRecv := v.i < len(recvs) && s.i > recvs[v.i].after
		limit := 0 // payload bytes unit v.i may fill
		if canRecv {
			u := recvs[v.i]
			limit = len(u.buf)
			if u.trail {
				limit = s.sent(v.i, sends)
				if u.reduce {
					limit -= limit % dt.size()
				}
				// Its header and, once the send is out, its padding are not held back.
				canRecv = v.hdr < headerLen || v.done < limit || v.done == len(u.buf)
			}
		}
		moved := false
		if canSend {
			moved = s.step(sends[s.i].buf)
		}
		if canRecv {
			m, err := v.step(recvs[v.i], limit)
			if err != nil {
				return err
			}
			moved = moved || m
		}
		if moved {
			continue
		}
		// Neither side moved. One that cannot start waits on the other's progress, which
		// this goroutine makes: at least one of them is waiting on a ring.
		// Arrays, not appends: a wait allocates nothing (small messages wait once or twice
		// per collective).
		var wordsBuf [2]waitWord
		words := wordsBuf[:0]
		var need uint64
		if canSend {
			words = append(words, waitWord{next.shm.tx.spaceSeq, next.shm.tx.spaceWait})
		}
		if canRecv {
			words = append(words, waitWord{prev.shm.rx.dataSeq, prev.shm.rx.dataWait})
			need = v.need(recvs[v.i])
		}
		if len(words) == 0 {
			return fmt.Errorf("internal error: unit schedule stalls at send %d, receive %d", s.i, v.i)
		}
		// Check only the peers waited on, the one received from first: silence past
		// Config.Timeout is blamed on it (next, when silent too, is most likely waiting for
		// it as well). A peer not waited on may be done and gone: a root that has sent its
		// last chunk closes while the rank after it still forwards.
		var peersBuf [2]*peer
		peers := peersBuf[:0]
		if canRecv {
			peers = append(peers, prev)
		}
		if canSend && (next != prev || !canRecv) {
			peers = append(peers, next)
		}
		ready := func() bool {
			return canSend && next.shm.txSpace() || canRecv && prev.shm.rxAvail() >= need
		}
		if err := c.shmAwait(peers, words, ready); err != nil {
			return err
		}
	}
	return nil
}

// shmSender writes data frames to p's ring without blocking, one unit after the other.
type shmSender struct {
	side
	frame [][]byte // what is left of unit i; nil: not started
	out   int      // bytes of it written, header included
}

// sent is how many payload bytes of unit i are written.
func (s *shmSender) sent(i int, sends []unit) int {
	switch {
	case s.i > i:
		return len(sends[i].buf)
	case s.i < i || s.frame == nil:
		return 0
	}
	return min(max(s.out-headerLen, 0), len(sends[i].buf))
}

// step writes as much of unit i (payload b) as the ring takes now, up to a piece; it
// reports whether it wrote anything.
func (s *shmSender) step(b []byte) bool {
	if s.frame == nil {
		s.c.putHeader(s.p, s.o, s.first+s.i, b)
		f := &s.p.wframe // not shmFrame's new slice: a send allocates nothing
		f[0], f[1], f[2] = s.p.whdr[:], b, zeros[:padLen(headerLen+len(b))]
		s.frame = f[:]
		s.out = 0
	}
	bufs := s.frame
	var lim [3][]byte
	left := shmPiece
	k := 0
	for _, f := range bufs {
		if left == 0 {
			break
		}
		take := min(len(f), left)
		lim[k] = f[:take]
		k++
		left -= take
	}
	w, _ := s.p.shm.write(lim[:k], false) // cannot fail without blocking
	s.out += w
	if s.frame = advance(s.frame, w); s.frame != nil {
		return w > 0
	}
	s.p.wframe = [3][]byte{} // holds no user buffer past its send (closeConns clears it too)
	s.i++
	return true
}

// shmReceiver reads data frames from p's ring without blocking, one unit after the other:
// the header, checked as recv checks it, then the payload reduced or copied into the
// unit's buffer as it arrives, then the padding.
type shmReceiver struct {
	side
	dt   dtype
	op   Op
	hdr  int // header bytes read of unit i
	done int // payload bytes of unit i reduced or copied
}

// need is how many bytes the ring must hold for unit u to move on. Waiting for a count,
// not for more than a step saw, matters: bytes that arrive between a step's look at the
// ring and its return would otherwise count as seen, and the wait would last until the
// writer wrote again, which it may never do (it may be done: a hang found at 4 ranks).
func (v *shmReceiver) need(u unit) uint64 {
	switch {
	case v.hdr < headerLen:
		return 1
	case v.done < len(u.buf) && u.reduce:
		return uint64(v.dt.size())
	case v.done < len(u.buf):
		return 1
	}
	return uint64(padLen(headerLen + len(u.buf)))
}

// step moves unit u (the i-th) forward with what the ring holds now, a piece at most and no
// further than payload byte limit; it reports whether it moved.
func (v *shmReceiver) step(u unit, limit int) (bool, error) {
	// No look at closed here: a peer that has sent its last frame may close before this
	// side has read it, and what is in the ring comes first (shmAwait checks closed).
	l := v.p.shm
	moved := false
	if v.hdr < headerLen {
		got := l.readNow(v.p.rhdr[v.hdr:])
		v.hdr += got
		moved = got > 0
		if v.hdr < headerLen {
			return moved, nil
		}
		if _, err := v.header(len(u.buf), false); err != nil {
			return false, err
		}
	}
	if v.done < len(u.buf) {
		dst := u.buf[v.done:min(limit, v.done+shmPiece)]
		var got int
		if u.reduce {
			got = l.reduceNow(dst, v.dt, v.op, u.srcFirst)
		} else {
			got = l.readNow(dst)
		}
		v.done += got
		moved = moved || got > 0
		if v.done < len(u.buf) {
			return moved, nil
		}
	}
	pad := uint64(padLen(headerLen + len(u.buf)))
	if l.rxAvail() < pad {
		return moved, nil
	}
	if pad > 0 {
		l.consumed(pad)
	}
	v.i++
	v.hdr, v.done = 0, 0
	return true, nil
}

// shmAwait is awaitLinks for shmStream, on the links of peers: an error names its peer.
func (c *Comm) shmAwait(peers []*peer, words []waitWord, ready func() bool) error {
	var linksBuf [2]*shmLink
	links := linksBuf[:len(peers)]
	for i, p := range peers {
		links[i] = p.shm
	}
	if i, err := awaitLinks(links, words, ready); err != nil {
		return c.shmErr(peers[i], err)
	}
	return nil
}

// txSpace reports whether the ring to the peer has room.
func (l *shmLink) txSpace() bool {
	r := &l.tx
	return r.pos-r.tail.Load() < uint64(len(r.data))
}

// rxAvail is how many bytes wait in the ring from the peer.
func (l *shmLink) rxAvail() uint64 { return l.rx.head.Load() - l.rx.pos }

// readNow copies into dst what of the next len(dst) bytes of rx has arrived, without
// waiting, and returns how many it copied.
func (l *shmLink) readNow(dst []byte) int {
	r := &l.rx
	done := 0
	for done < len(dst) {
		avail := r.head.Load() - r.pos
		if avail == 0 {
			break
		}
		off := r.pos & r.mask
		n := min(avail, uint64(len(dst)-done), uint64(len(r.data))-off)
		copy(dst[done:done+int(n)], r.data[off:off+n])
		l.consumed(n)
		done += int(n)
	}
	return done
}

// reduceNow is readNow reducing into dst (dst = dst op ring, or ring op dst with srcFirst)
// instead of copying, whole elements only.
func (l *shmLink) reduceNow(dst []byte, dt dtype, op Op, srcFirst bool) int {
	r := &l.rx
	es := uint64(dt.size())
	done := 0
	for done < len(dst) {
		avail := r.head.Load() - r.pos
		off := r.pos & r.mask
		n := min(avail, uint64(len(dst)-done), uint64(len(r.data))-off)
		n -= n % es
		if n == 0 {
			break
		}
		reduceInto(dst[done:done+int(n)], r.data[off:off+n], dt, op, srcFirst)
		l.consumed(n)
		done += int(n)
	}
	return done
}
