package allreduce

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"
)

// Collective codes carried in every data frame, so ranks that call different collectives
// fail with a clear error instead of misreading each other's bytes.
const (
	opAllreduce      = 0x10 // | Op
	opBroadcast      = 0x20
	opAllgather      = 0x30
	opAllgatherSizes = 0x31
	opBarrier        = 0x40
)

func opName(code uint8) string {
	switch {
	case code&0xf0 == opAllreduce:
		return "Allreduce(" + Op(code&0x0f).String() + ")"
	case code == opBroadcast:
		return "Broadcast"
	case code == opAllgather:
		return "Allgather"
	case code == opAllgatherSizes:
		return "Allgather (sizes)"
	case code == opBarrier:
		return "Barrier"
	}
	return fmt.Sprintf("collective %#02x", code)
}

// opInfo is what every data frame of one collective carries.
type opInfo struct {
	code  uint8
	dtype dtype
	seq   uint64
	total uint64
}

// nextOp starts a collective phase; every rank numbers phases the same way. What it returns
// is the communicator's own record, rewritten by the next call: a phase ends, with every
// goroutine it started, before the next one begins.
func (c *Comm) nextOp(code uint8, dt dtype, total int) *opInfo {
	c.seq++
	c.cur = opInfo{code: code, dtype: dt, seq: c.seq, total: uint64(total)}
	c.ntOn.Store(c.stats.NonTemporal(int64(total)))
	return &c.cur
}

// do runs one collective under the operation lock. Any failure breaks the communicator:
// the stream position is lost, so neighbours are told (abort frames) and connections closed.
func (c *Comm) do(ctx context.Context, fn func() error) error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.mu.Lock()
	closed, failed, retired := c.closed, c.err, c.retired
	c.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case retired:
		return fmt.Errorf("the next generation's communicator took over its connections: %w", ErrClosed)
	case failed != nil:
		return fmt.Errorf("communicator failed earlier: %w", failed)
	case ctx.Err() != nil:
		return context.Cause(ctx) // nothing was sent: the communicator stays usable
	}
	done := ctx.Done()
	if done != nil && done != c.watchDone {
		c.unwatch()
		c.watchDone = done
		c.watchStop = context.AfterFunc(ctx, func() { c.ctxDone(ctx, done) })
	}
	c.mu.Lock()
	c.opDone = done
	if ctx.Err() != nil {
		// Ended since the check above, perhaps before ctxDone could see this operation
		// run: once subscribed (Done), a cancellation interrupts the operation, which then
		// fails and tells its peers, rather than preventing it.
		c.interruptLocked(context.Cause(ctx))
	}
	c.mu.Unlock()
	err := fn()
	clear(c.units)
	c.mu.Lock() // ctxDone interrupts under mu: from here on it cannot for this operation
	c.opDone = nil
	cause := c.cause
	if !c.closed {
		c.cause = nil
	}
	c.mu.Unlock()
	if err == nil {
		return nil // finished before the interruption could matter
	}
	if cause != nil {
		err = cause // the I/O errors were our own interruption
	}
	c.fail(err)
	return err
}

// ctxDone interrupts the running operation when the context it was called with ends: the
// watch registered by do stays from one operation to the next while their contexts share
// a Done channel, so that a training loop passing one context allocates nothing for it per
// collective (docs/protocol.md §1.6).
func (c *Comm) ctxDone(ctx context.Context, done <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.opDone == done {
		c.interruptLocked(context.Cause(ctx))
	}
}

// unwatch ends do's context watch; a callback already started finds no operation of its
// context running. Called under opMu.
func (c *Comm) unwatch() {
	if c.watchStop != nil {
		c.watchStop()
	}
	c.watchStop, c.watchDone = nil, nil
}

// fail records err, tells every neighbour which rank is to blame, and closes the connections.
func (c *Comm) fail(err error) {
	culprit, reason := c.cfg.Rank, "rank "+fmt.Sprint(c.cfg.Rank)+" aborted: "+err.Error()
	var pe *PeerError
	var pre *protocolError
	switch {
	case errors.As(err, &pe):
		culprit, reason = pe.Rank, pe.Err.Error()
	case errors.As(err, &pre):
		culprit, reason = pre.rank, fmt.Sprintf("sent rank %d a malformed frame: %s", c.cfg.Rank, pre.msg)
	}
	if len(reason) > maxAbortLen {
		reason = reason[:maxAbortLen]
	}
	c.log.Warn("collective failed; aborting the communicator", "err", err, "blamed_rank", culprit)
	var wg sync.WaitGroup
	for _, p := range c.peers {
		if p != nil {
			wg.Go(func() { c.abortPeer(p, culprit, reason) })
		}
	}
	wg.Wait()
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
}

// abortPeer sends an abort frame (unless a write stopped mid-frame), then drains what the peer
// still sends until it closes too, so that our close does not turn into a reset that destroys
// the abort frame before the peer reads it. Bounded to a few hundred milliseconds.
func (c *Comm) abortPeer(p *peer, culprit int, reason string) {
	if !p.broken {
		h := header{kind: kindAbort, gen: c.cfg.Generation, unit: uint32(culprit), length: uint32(len(reason))}
		h.put(p.whdr[:])
		p.conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		bufs := net.Buffers{p.whdr[:], []byte(reason)}
		bufs.WriteTo(p.conn)
	}
	if p.shm != nil {
		p.shm.shut() // after the abort frame: a peer woken by it finds the frame there
	}
	p.conn.CloseWrite()
	p.conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	io.Copy(io.Discard, io.LimitReader(p.conn, 64<<20))
	p.conn.Close()
}

func (c *Comm) lost(p *peer, err error) error {
	return &PeerError{Rank: p.rank, Addr: p.addr, Via: p.rank, Err: describeIOErr(err, c.cfg.Timeout)}
}

// stopping reports whether an interruption is pending; checked after a deadline is set, so
// an interruption is never missed (it sets the flag before it sets the deadlines).
func (c *Comm) stopping() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cause
}

// send writes one data frame to p.
func (c *Comm) send(p *peer, o *opInfo, unit int, payload []byte) error {
	c.putHeader(p, o, unit, payload)
	if p.shm != nil {
		if _, err := p.shm.write(shmFrame(p.whdr[:], payload), true); err != nil {
			return c.shmErr(p, err)
		}
		return nil
	}
	return c.write(p, net.Buffers{p.whdr[:], payload}, 0)
}

func (c *Comm) putHeader(p *peer, o *opInfo, unit int, payload []byte) {
	h := header{kind: kindData, op: o.code, dtype: uint8(o.dtype), gen: c.cfg.Generation,
		seq: o.seq, total: o.total, unit: uint32(unit), length: uint32(len(payload))}
	h.put(p.whdr[:])
}

// write sends the rest of a frame of which done bytes are already sent, blocking.
func (c *Comm) write(p *peer, bufs net.Buffers, done int) error {
	p.conn.SetWriteDeadline(time.Now().Add(c.cfg.Timeout))
	if err := c.stopping(); err != nil {
		if done > 0 {
			p.broken = true
		}
		return err
	}
	n, err := bufs.WriteTo(p.conn)
	if err != nil {
		if done+int(n) > 0 {
			p.broken = true
		}
		return c.lost(p, err)
	}
	return nil
}

// recv reads the data frame `unit` of operation o from p into dst, whose length is exactly
// what the frame must carry. Nothing is allocated from what the peer claims.
func (c *Comm) recv(p *peer, o *opInfo, unit int, dst []byte) error {
	if p.shm != nil {
		if err := c.shmRecvHeader(p, o, unit, len(dst)); err != nil {
			return err
		}
		if err := p.shm.read(dst); err != nil {
			return c.shmErr(p, err)
		}
		return c.shmErr(p, p.shm.skipPad(headerLen+len(dst)))
	}
	p.conn.SetReadDeadline(time.Now().Add(c.cfg.Timeout))
	if err := c.stopping(); err != nil {
		return err
	}
	if _, err := io.ReadFull(p.conn, p.rhdr[:]); err != nil {
		return c.lost(p, err)
	}
	h, err := parseHeader(p.rhdr[:])
	if err != nil {
		return &protocolError{rank: p.rank, msg: err.Error()}
	}
	if h.kind == kindAbort {
		return c.readAbort(p, h)
	}
	if msg := c.check(o, h, unit, len(dst)); msg != "" {
		return &protocolError{rank: p.rank, msg: msg}
	}
	if _, err := io.ReadFull(p.conn, dst); err != nil {
		return c.lost(p, err)
	}
	return nil
}

// recvReduce receives data frame `unit` of o from p and reduces it into dst (dst op
// received). Over shared memory it reads the ring in place; over TCP through scratch space.
func (c *Comm) recvReduce(p *peer, o *opInfo, unit int, dst []byte, dt dtype, op Op) error {
	if p.shm == nil {
		scratch := c.scratchBuf(len(dst))
		if err := c.recv(p, o, unit, scratch); err != nil {
			return err
		}
		reduceInto(dst, scratch, dt, op, false)
		return nil
	}
	if err := c.shmRecvHeader(p, o, unit, len(dst)); err != nil {
		return err
	}
	if err := p.shm.reduce(dst, dt, op); err != nil {
		return c.shmErr(p, err)
	}
	return c.shmErr(p, p.shm.skipPad(headerLen+len(dst)))
}

func (c *Comm) check(o *opInfo, h header, unit, n int) string {
	switch {
	case h.kind != kindData:
		return fmt.Sprintf("frame kind %d in the middle of a collective", h.kind)
	case h.gen != c.cfg.Generation:
		return fmt.Sprintf("generation %d, expected %d", h.gen, c.cfg.Generation)
	case h.seq != o.seq:
		return fmt.Sprintf("collective #%d, expected #%d (ranks called different numbers of collectives)", h.seq, o.seq)
	case h.op != o.code || dtype(h.dtype) != o.dtype:
		return fmt.Sprintf("%s on %s, expected %s on %s (ranks called different collectives)",
			opName(h.op), dtype(h.dtype), opName(o.code), o.dtype)
	case h.total != o.total:
		return fmt.Sprintf("%s of %d bytes, this rank has %d (ranks passed buffers of different sizes)", opName(h.op), h.total, o.total)
	case int(h.unit) != unit || int(h.length) != n:
		return fmt.Sprintf("unit %d of %d bytes, expected unit %d of %d bytes", h.unit, h.length, unit, n)
	}
	return ""
}

func (c *Comm) readAbort(p *peer, h header) error {
	if h.length > maxAbortLen {
		return &protocolError{rank: p.rank, msg: fmt.Sprintf("abort frame of %d bytes (at most %d)", h.length, maxAbortLen)}
	}
	reason := make([]byte, h.length)
	if _, err := io.ReadFull(p.conn, reason); err != nil {
		return c.lost(p, err)
	}
	pe := &PeerError{Rank: int(h.unit), Via: p.rank, Err: errors.New(string(reason))}
	if pe.Rank >= 0 && pe.Rank < len(c.peers) && c.peers[pe.Rank] != nil {
		pe.Addr = c.peers[pe.Rank].addr
	}
	return pe
}

// describeIOErr turns a socket error into the reason a peer is considered lost.
func describeIOErr(err error, timeout time.Duration) error {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("connection closed (process exited or was killed?)")
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return errors.New("connection reset (process exited or was killed?)")
	case isTimeout(err):
		return silentError{timeout}
	}
	return err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// unitLists returns two empty unit lists with room for n units each, from storage the
// communicator keeps, so that a collective allocates none once its sizes have been seen.
// They are valid until the next call: a phase ends before the next one plans. do clears
// them after every operation, so that they hold no user buffer alive.
func (c *Comm) unitLists(n int) (a, b []unit) {
	if cap(c.units) < 2*n {
		c.units = make([]unit, 2*n)
	}
	u := c.units[:2*n]
	return u[:0:n], u[n : n : 2*n]
}

func (c *Comm) scratchBuf(n int) []byte {
	if cap(c.scratch) < n {
		c.scratch = make([]byte, n)
	}
	return c.scratch[:n]
}
