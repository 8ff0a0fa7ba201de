package allreduce

import (
	"sync"
)

// unit is one chunk of a pipelined exchange. after is the index of a unit on the other side
// (receives for a send, sends for a receive) that must be complete first, or -1.
type unit struct {
	buf    []byte
	after  int
	reduce bool // receives only: reduce into buf instead of overwriting it
	// srcFirst, with reduce: the received operand comes first (recursive doubling reduces
	// the lower rank's operand first on both sides). Only shmStream and tcpStream take it.
	srcFirst bool
	// trail, receives only: buf is also the buffer of the send of the same index, so the
	// receive may not write past the bytes that send has written out. Only shmStream takes it.
	trail bool
}

// stream runs a pipelined exchange around the ring: sends go to next in order while receives
// come from prev in order, both at once, so sending, receiving and reducing overlap. A send
// that forwards received data waits only for that chunk, not the whole step.
func (c *Comm) stream(o *opInfo, sends, recvs []unit, dt dtype, op Op) error {
	n, r := c.cfg.Size, c.cfg.Rank
	return c.streamPeers(o, c.peers[(r+1)%n], c.peers[(r+n-1)%n], 0, sends, recvs, dt, op)
}

// streamPeers is stream between any two peers, with units numbered from first on both
// sides (the hierarchical allreduce's rings across hosts; a pair's exchange, next == prev).
// Both over shared memory, or both over TCP, one goroutine drives the exchange without
// blocking (shmStream, tcpStream); a mix of the two runs goStream.
func (c *Comm) streamPeers(o *opInfo, next, prev *peer, first int, sends, recvs []unit, dt dtype, op Op) error {
	switch {
	case next.shm != nil && prev.shm != nil:
		return c.shmStream(o, next, prev, first, sends, recvs, dt, op)
	case next.shm == nil && prev.shm == nil:
		return c.tcpStream(o, next, prev, first, sends, recvs, dt, op)
	}
	return c.goStream(o, next, prev, first, sends, recvs, dt, op)
}

// goStream runs an exchange in two goroutines, one sending and one receiving, each blocking
// on its own peer.
func (c *Comm) goStream(o *opInfo, next, prev *peer, first int, sends, recvs []unit, dt dtype, op Op) error {
	sent := make(chan struct{}, len(sends))
	recvd := make(chan struct{}, len(recvs))
	quit := make(chan struct{})
	var firstErr error
	var once sync.Once
	fail := func(err error) {
		once.Do(func() {
			firstErr = err
			close(quit)
			c.interrupt(err) // wakes the other goroutine if it is blocked in I/O
		})
	}
	// wait blocks until `done` tokens exceed after; false if the exchange failed meanwhile.
	wait := func(tokens <-chan struct{}, done *int, after int) bool {
		for *done <= after {
			select {
			case <-tokens:
				*done++
			case <-quit:
				return false
			}
		}
		return true
	}

	var wg sync.WaitGroup
	wg.Go(func() {
		done := 0 // receives known complete
		for i, u := range sends {
			if !wait(recvd, &done, u.after) {
				return
			}
			if err := c.send(next, o, first+i, u.buf); err != nil {
				fail(err)
				return
			}
			sent <- struct{}{}
		}
	})
	wg.Go(func() {
		done := 0 // sends known complete
		for i, u := range recvs {
			if !wait(sent, &done, u.after) {
				return
			}
			var err error
			if u.reduce {
				err = c.recvReduce(prev, o, first+i, u.buf, dt, op)
			} else {
				err = c.recv(prev, o, first+i, u.buf)
			}
			if err != nil {
				fail(err)
				return
			}
			recvd <- struct{}{}
		}
	})
	wg.Wait()
	return firstErr
}

// side is one direction of an exchange driven by one goroutine (shmStream, tcpStream): the
// peer, the collective, and the unit in progress, numbered from first.
type side struct {
	c     *Comm
	p     *peer
	o     *opInfo
	first int // the number of unit 0
	i     int // the unit in progress
}

// header parses the header read into p.rhdr for unit i, of n payload bytes, and checks it
// as recv does. An abort frame is returned unchecked where abortOK (TCP carries them).
func (sd *side) header(n int, abortOK bool) (header, error) {
	h, err := parseHeader(sd.p.rhdr[:])
	if err != nil {
		return h, &protocolError{rank: sd.p.rank, msg: err.Error()}
	}
	if h.kind == kindAbort && abortOK {
		return h, nil
	}
	if msg := sd.c.check(sd.o, h, sd.first+sd.i, n); msg != "" {
		return h, &protocolError{rank: sd.p.rank, msg: msg}
	}
	return h, nil
}

// advance drops the first w bytes of frame; nil once it is all gone.
func advance(frame [][]byte, w int) [][]byte {
	for len(frame) > 0 && w >= len(frame[0]) {
		w -= len(frame[0])
		frame = frame[1:]
	}
	if len(frame) == 0 {
		return nil
	}
	frame[0] = frame[0][w:]
	return frame
}
