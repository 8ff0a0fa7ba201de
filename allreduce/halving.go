package allreduce

// halvingAllreduce is recursive halving then doubling (Rabenseifner) for a power-of-two
// world. It halves: log2(n) exchanges with partners r^d, d = n/2 … 1, in which each rank
// keeps half of its range, sends the other half, and reduces the partner's copy of the half
// it keeps into its own, until it owns 1/n of the elements; then the same exchanges in
// reverse order copy the owners' results back. Each element is reduced on its owner alone,
// so every rank ends with the same bits. It moves as many bytes per rank as the ring, in
// 2·log2(n) steps instead of 2(n-1): each step is a wake-up of a peer, and where ranks
// outnumber cores each one waits for a scheduler slot. With 4 ranks on 2 vCPUs, shared
// memory, it took 11-31 % less time than the ring from 128 KB to 64 MB, and over TCP 20-48 %
// less at 256 KB, 1 MB and 16 MB (docs/design-notes/allreduce-tuning.md §6).
func (c *Comm) halvingAllreduce(o *opInfo, data []byte, dt dtype, op Op) error {
	n, r := c.cfg.Size, c.cfg.Rank
	es := dt.size()
	lo, hi := 0, len(data)/es
	type span struct{ lo, hi int }
	var beforeBuf [64]span  // on the stack: log2(n) spans
	before := beforeBuf[:0] // the range before each halving, retraced by the doubling
	// Exchange i numbers its units from i*per: how many units a pair cuts an exchange into
	// depends on its halves' sizes, which differ by an element between pairs, so counting
	// them would number the next exchange differently on its two sides.
	per := ceilDiv(len(data), c.cfg.ChunkBytes) + 1
	u := 0
	for d := n / 2; d >= 1; d /= 2 {
		mid := lo + (hi-lo)/2
		before = append(before, span{lo, hi})
		keep, give := data[lo*es:mid*es], data[mid*es:hi*es]
		if r&d == 0 {
			hi = mid
		} else {
			keep, give = give, keep
			lo = mid
		}
		if err := c.pairStep(o, c.peers[r^d], u, give, keep, true, dt, op); err != nil {
			return err
		}
		u += per
	}
	for d := 1; d < n; d *= 2 {
		s := before[len(before)-1]
		before = before[:len(before)-1]
		theirs := data[hi*es : s.hi*es]
		if r&d != 0 {
			theirs = data[s.lo*es : lo*es]
		}
		if err := c.pairStep(o, c.peers[r^d], u, data[lo*es:hi*es], theirs, false, dt, op); err != nil {
			return err
		}
		lo, hi = s.lo, s.hi
		u += per
	}
	return nil
}

// pairStep sends out to p while receiving p's out into in, reducing it into in (reduce) or
// overwriting in, as k units numbered from first. Both sides cut their two buffers into the
// same k pieces of about ChunkBytes (k follows from the larger buffer, the same on both
// sides), so that TCP needs a scratch piece, not a scratch half.
func (c *Comm) pairStep(o *opInfo, p *peer, first int, out, in []byte, reduce bool, dt dtype, op Op) error {
	es := dt.size()
	k := max(1, ceilDiv(max(len(out), len(in)), c.cfg.ChunkBytes))
	piece := func(b []byte, q int) []byte {
		m := len(b) / es
		return b[q*m/k*es : (q+1)*m/k*es]
	}
	sends, recvs := c.unitLists(k)
	for q := range k {
		sends = append(sends, unit{buf: piece(out, q), after: -1})
		recvs = append(recvs, unit{buf: piece(in, q), after: -1, reduce: reduce})
	}
	return c.streamPeers(o, p, p, first, sends, recvs, dt, op)
}
