package allreduce

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
)

// Allreduce replaces data, on every rank, with the element-wise reduction of all ranks'
// data. data is a []float32, []float64 or []int64 of the same length on every rank.
func (c *Comm) Allreduce(ctx context.Context, data any, op Op) error {
	b, dt, err := asBytes(data)
	if err == nil && dt == dtBytes {
		err = errors.New("unsupported buffer type []byte: Allreduce needs []float32, []float64 or []int64")
	}
	if err == nil && (op < Sum || op > Min) {
		err = fmt.Errorf("unsupported reduction %v: use Sum, Max or Min", op)
	}
	if err != nil {
		return fmt.Errorf("allreduce: %w", err)
	}
	err = c.do(ctx, func() error {
		return c.allreduce(c.nextOp(opAllreduce|uint8(op), dt, len(b)), b, dt, op)
	})
	if err != nil {
		return fmt.Errorf("allreduce %s of %d %s: %w", op, len(b)/dt.size(), dt, err)
	}
	return nil
}

func (c *Comm) allreduce(o *opInfo, b []byte, dt dtype, op Op) error {
	switch {
	case c.cfg.Size == 1:
		return nil
	case len(b) <= c.cfg.SmallBytes || len(b)/dt.size() < c.cfg.Size:
		return c.doublingAllreduce(o, b, dt, op)
	case c.stats.Direct(int64(len(b))):
		return c.directAllreduce(o, b, dt, op)
	case c.topo.hierarchical():
		return c.hierAllreduce(o, b, dt, op)
	case c.cfg.Size >= 4 && c.cfg.Size&(c.cfg.Size-1) == 0:
		return c.halvingAllreduce(o, b, dt, op)
	}
	return c.ringAllreduce(o, b, dt, op)
}

// ringAllreduce is reduce-scatter then allgather over n segments, each split into K chunks.
// Segment s is reduced once, travelling s → s+1 → … → s-1 (its owner), then copied around:
// every rank ends with the same bits.
func (c *Comm) ringAllreduce(o *opInfo, data []byte, dt dtype, op Op) error {
	sends, recvs := c.ringPlan(c.cfg.Size, c.cfg.Rank, data, dt.size())
	return c.stream(o, sends, recvs, dt, op)
}

// ringPlan is the units of a ring allreduce of data, elements of es bytes, at position r of
// a ring of n; the hierarchical allreduce runs it on a slice among the slice's owners.
func (c *Comm) ringPlan(n, r int, data []byte, es int) (sends, recvs []unit) {
	elems := len(data) / es
	chunk := max(1, c.cfg.ChunkBytes/es)
	segStart := func(j int) int { return partStart(elems, n, j) }
	k := max(1, ceilDiv(ceilDiv(elems, n), chunk))
	piece := func(j, q int) []byte {
		j = mod(j, n)
		s, e := segStart(j), segStart(j+1)
		a := min(s+q*chunk, e)
		b := min(a+chunk, e)
		return data[a*es : b*es]
	}
	steps := n - 1
	sends, recvs = c.unitLists(2 * steps * k)
	for t := range steps { // reduce-scatter
		for q := range k {
			i := t*k + q
			sends = append(sends, unit{buf: piece(r-t, q), after: i - k})
			recvs = append(recvs, unit{buf: piece(r-1-t, q), after: -1, reduce: true})
		}
	}
	for t := range steps { // allgather
		for q := range k {
			i := (steps+t)*k + q
			sends = append(sends, unit{buf: piece(r+1-t, q), after: i - k})
			// Overwrites a chunk this rank sent during reduce-scatter: wait for that send.
			recvs = append(recvs, unit{buf: piece(r-t, q), after: t*k + q})
		}
	}
	return sends, recvs
}

// doublingAllreduce serves small messages in log2(n) exchanges (two more when n is not a
// power of two: ranks p..n-1 fold into ranks 0..n-p-1 first and get the result back at the
// end). Each exchange reduces lower rank's operand first on both sides, so both sides hold
// the same bits.
func (c *Comm) doublingAllreduce(o *opInfo, data []byte, dt dtype, op Op) error {
	n, r := c.cfg.Size, c.cfg.Rank
	p := pow2Floor(n)
	last := 1 + bits.Len(uint(p)) - 1 // unit of the result sent back to a folded rank
	if r >= p {
		lo := c.peers[r-p]
		if err := c.send(lo, o, 0, data); err != nil {
			return err
		}
		return c.recv(lo, o, last, data)
	}
	if r+p < n {
		if err := c.recvReduce(c.peers[r+p], o, 0, data, dt, op); err != nil {
			return err
		}
	}
	u := 1
	for d := 1; d < p; d <<= 1 {
		q, srcFirst := c.peers[r^d], r^d < r
		if q.shm != nil {
			// Over shared memory, reduce straight from the partner's ring into data, each
			// byte once it is out in the ring to the partner: no copy through scratch, and
			// no wait on the partner beyond its data (docs/protocol.md §1.6).
			sends := []unit{{buf: data, after: -1}}
			recvs := []unit{{buf: data, after: -1, reduce: true, srcFirst: srcFirst, trail: true}}
			if err := c.shmStream(o, q, q, u, sends, recvs, dt, op); err != nil {
				return err
			}
		} else {
			scratch := c.scratchBuf(len(data))
			if err := c.exchange(o, q, u, data, scratch); err != nil {
				return err
			}
			reduceInto(data, scratch, dt, op, srcFirst)
		}
		u++
	}
	if r+p < n {
		return c.send(c.peers[r+p], o, last, data)
	}
	return nil
}

// exchange sends out to p while receiving p's frame of the same unit into in.
func (c *Comm) exchange(o *opInfo, p *peer, u int, out, in []byte) error {
	sends, recvs := c.unitLists(1)
	sends = append(sends, unit{buf: out, after: -1})
	recvs = append(recvs, unit{buf: in, after: -1})
	return c.streamPeers(o, p, p, u, sends, recvs, dtBytes, 0)
}

// Broadcast copies root's data to every rank. data has the same type and length on every
// rank: []byte, []float32, []float64 or []int64. Chunks are pipelined along the ring from
// root, so a large broadcast costs about one transfer of data, whatever the world size.
// Every rank must name the same root: frames do not carry it, so ranks that disagree are
// caught only by the next collective, as a protocol error.
func (c *Comm) Broadcast(ctx context.Context, data any, root int) error {
	b, dt, err := asBytes(data)
	if err == nil && (root < 0 || root >= c.cfg.Size) {
		err = fmt.Errorf("root %d: must be in [0, %d)", root, c.cfg.Size)
	}
	if err != nil {
		return fmt.Errorf("broadcast: %w", err)
	}
	err = c.do(ctx, func() error {
		o := c.nextOp(opBroadcast, dt, len(b))
		n, r := c.cfg.Size, c.cfg.Rank
		if n == 1 {
			return nil
		}
		cb := c.cfg.ChunkBytes
		k := max(1, ceilDiv(len(b), cb))
		var sends, recvs []unit
		for q := range k {
			piece := b[min(q*cb, len(b)):min((q+1)*cb, len(b))]
			if r != root {
				recvs = append(recvs, unit{buf: piece, after: -1})
			}
			if mod(r+1-root, n) != 0 { // the rank before root forwards nothing
				after := q
				if r == root {
					after = -1
				}
				sends = append(sends, unit{buf: piece, after: after})
			}
		}
		return c.stream(o, sends, recvs, dt, 0)
	})
	if err != nil {
		return fmt.Errorf("broadcast of %d bytes from rank %d: %w", len(b), root, err)
	}
	return nil
}

// Allgather returns every rank's data, indexed by rank; sizes may differ between ranks.
// The result shares one allocation; out[Rank()] is a copy of data.
func (c *Comm) Allgather(ctx context.Context, data []byte) ([][]byte, error) {
	var out [][]byte
	err := c.do(ctx, func() error {
		n, r := c.cfg.Size, c.cfg.Rank
		sizes := make([]int64, n)
		sizes[r] = int64(len(data))
		sb, _, _ := asBytes(sizes)
		if err := c.allreduce(c.nextOp(opAllgatherSizes, dtInt64, len(sb)), sb, dtInt64, Sum); err != nil {
			return err
		}
		total := 0
		for q, s := range sizes {
			if s < 0 || s > 1<<40 || (q == r && s != int64(len(data))) {
				return fmt.Errorf("implausible size %d for rank %d", s, q)
			}
			total += int(s)
		}
		buf := make([]byte, total)
		out = make([][]byte, n)
		maxSize, off := 0, 0
		for q, s := range sizes {
			out[q] = buf[off : off+int(s) : off+int(s)]
			off += int(s)
			maxSize = max(maxSize, int(s))
		}
		copy(out[r], data)
		if n == 1 {
			return nil
		}
		o := c.nextOp(opAllgather, dtBytes, total)
		cb := c.cfg.ChunkBytes
		k := max(1, ceilDiv(maxSize, cb))
		piece := func(j, q int) []byte {
			blk := out[mod(j, n)]
			return blk[min(q*cb, len(blk)):min((q+1)*cb, len(blk))]
		}
		sends, recvs := c.unitLists((n - 1) * k)
		for t := range n - 1 {
			for q := range k {
				sends = append(sends, unit{buf: piece(r-t, q), after: t*k + q - k})
				recvs = append(recvs, unit{buf: piece(r-1-t, q), after: -1})
			}
		}
		return c.stream(o, sends, recvs, dtBytes, 0)
	})
	if err != nil {
		return nil, fmt.Errorf("allgather of %d bytes: %w", len(data), err)
	}
	return out, nil
}

// Barrier returns once every rank has entered it.
func (c *Comm) Barrier(ctx context.Context) error {
	err := c.do(ctx, func() error {
		var v [1]int64
		b, _, _ := asBytes(v[:])
		return c.allreduce(c.nextOp(opBarrier, dtInt64, len(b)), b, dtInt64, Max)
	})
	if err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	return nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// partStart is where part j of n starts when elems elements are cut into n parts whose
// sizes differ by one at most, the larger first (the ring's segments, the hierarchy's
// slices).
func partStart(elems, n, j int) int { return j*(elems/n) + min(j, elems%n) }

func mod(x, n int) int { return ((x % n) + n) % n }
