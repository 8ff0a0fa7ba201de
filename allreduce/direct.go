package allreduce

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"sync"
	"time"
	"unsafe"
)

// envDirect chooses whether ranks that share a host reduce by reading each other's buffers
// (directAllreduce, docs/protocol.md §1.8): unset, empty or "auto" lets rank 0 measure
// its machine (directAgree); 1 (true, on, yes) reads directly from directAutoBytes on
// wherever the kernel allows it; 0 (false, off, no) never does, whatever Config.DirectBytes
// says. Read once, when the package loads.
const envDirect = "ELASTICD_SHM_DIRECT"

var envDirectValue = os.Getenv(envDirect)

// directSetting is envDirect's policy for this process; a variable so tests can change it.
var directSetting, directSettingOK = parsePolicy(envDirectValue)

// directWarnOnce says once per process, not at every generation's New, that envDirect's
// value was not understood.
var directWarnOnce sync.Once

// directMaxRanks is the largest world that reads directly: every rank must be connected to
// every other, and New connects the ring's neighbours and the doubling partners, which are
// all of them up to 4 ranks (TestDirectWorldsAreFullMesh).
const directMaxRanks = 4

// directAutoBytes is the smallest allreduce that reads directly where the machine's copies
// across processes are fast enough (directMinRatio). On the 16-core Xeon of
// docs/design-notes/allreduce-tuning.md §12, reading directly took 1.2-1.5x the rings' time at 512 KB and
// 1 MB with 2, 3 and 4 ranks, and from 2 MB on was faster (1.05-1.67x).
const directAutoBytes = 2 << 20

// directMinRatio is how fast, relative to copy, process_vm_readv must copy on this machine
// (machineReadRatio) before auto reads directly. The rings move each byte twice, both copies
// by the CPU in user space (into the ring, out of it); reading directly moves it once, but
// the kernel pins the peer's pages for every call. So reading directly wins where the
// kernel's copy runs at more than half the speed of a plain one: on the Xeon of §20 the
// ratio measured 0.64-0.80, and reading directly was up to 1.67x faster than the rings; on
// the 2-vCPU VM 0.30-0.36 (its plain copy is fast), and reading directly took 1.6-2.8x the
// rings' time at every size (§20.4). Half is also halfway between the two machines.
const directMinRatio = 0.5

// directAuto is what a rank asks for (directWish) when the machine should decide.
const directAuto = 0

// directWish is the smallest allreduce this rank asks to read directly, given envDirect's
// policy and Config.DirectBytes: -1 for none, directAuto for what the machine's measure says
// (directAgree), or a size.
func directWish(p policy, cfgBytes int) int64 {
	switch {
	case p == policyNever || cfgBytes < 0:
		return -1
	case cfgBytes > 0:
		return int64(cfgBytes)
	case p == policyAlways:
		return directAutoBytes
	}
	return directAuto
}

// directAgree is the smallest allreduce that a world reads directly, or -1 for none, given
// every rank's wish (directWish, or -1 where it cannot read a peer's memory) and the
// machine's ratio as rank 0 measured it (machineReadRatio; 0 if it did not). Any -1 keeps
// the world on the rings; if any rank asked the machine to decide, the ratio does; and the
// largest size asked for wins.
func directAgree(wishes []int64, ratio float64) int64 {
	from, auto := int64(-1), false
	for _, w := range wishes {
		switch {
		case w < 0:
			return -1
		case w == directAuto:
			auto = true
		default:
			from = max(from, w)
		}
	}
	if auto {
		if ratio < directMinRatio {
			return -1
		}
		from = max(from, directAutoBytes)
	}
	return from
}

// directFloor raises an agreed size (not -1) to at least what recursive doubling serves and
// one element of the widest type per rank: the collective then takes the direct path at every
// size from there.
func directFloor(agreed int64, smallBytes, n int) int64 {
	if agreed < 0 {
		return agreed
	}
	return max(agreed, int64(smallBytes)+1, 8*int64(n))
}

// directChunk is how much of a peer's segment directAllreduce reads into scratch before it
// reduces it: small enough to stay in a core's cache between the copy and the reduction.
const directChunk = 256 << 10

// Units of a direct allreduce, in the order they travel to every peer.
const (
	directDesc     = iota // where this rank's buffer lies: address and length, 8 bytes each
	directReduced         // this rank's segment is final, and it reads no other segment of yours
	directGathered        // this rank has copied your segment: your buffer is yours again
)

// directAllreduce serves a world whose ranks all share one host and may read each other's
// memory (docs/protocol.md §1.8). Every rank tells the others where its buffer lies; then
// rank r reduces segment r (partStart) by reading each peer's copy of it into a chunk of
// scratch and reducing that into its own buffer; then it copies every other segment
// straight from the buffer of the segment's owner into its own. Each byte crosses between
// processes once, copied by the kernel (process_vm_readv), where the rings copy it twice (in,
// out); each element is reduced on its owner alone, so every rank ends with the same bits.
//
// Three notices to every peer, over the rings, keep the buffers consistent: a rank
// overwrites segment q only after q's owner has said it is final (and so has read what it
// needed of it here), and returns only once every peer has said it copied segment r: until
// then the caller's buffer may not change. A dead or silent peer fails these waits as it
// fails any wait on a ring. The buffer stays where it is meanwhile: Go's heap does not move,
// and Allreduce's buffer always lies in it (its parameter escapes).
//
// It allocates nothing: the peers are visited in place, from r+1 on so that ranks do not
// all start on the same one, and the notices use the communicator's own storage.
func (c *Comm) directAllreduce(o *opInfo, data []byte, dt dtype, op Op) error {
	n, r := c.cfg.Size, c.cfg.Rank
	c.directOps.Add(1)
	es := dt.size()
	elems := len(data) / es
	segment := func(j int) (int, int) { return partStart(elems, n, j) * es, partStart(elems, n, j+1) * es }
	// other(k) is the k-th peer after this rank, k from 0 to n-2.
	other := func(k int) *peer { return c.peers[(r+1+k)%n] }
	notify := func(unit int, payload []byte) error {
		for k := range n - 1 {
			if err := c.send(other(k), o, unit, payload); err != nil {
				return err
			}
		}
		return nil
	}
	desc := c.direct.desc[:]
	binary.LittleEndian.PutUint64(desc[0:], addrOf(data))
	binary.LittleEndian.PutUint64(desc[8:], uint64(len(data)))
	if err := notify(directDesc, desc); err != nil {
		return err
	}
	addrs := &c.direct.addrs
	for k := range n - 1 {
		p := other(k)
		d := c.direct.peerDesc[:]
		if err := c.recv(p, o, directDesc, d); err != nil {
			return err
		}
		if got := binary.LittleEndian.Uint64(d[8:]); got != uint64(len(data)) {
			return &protocolError{rank: p.rank, msg: fmt.Sprintf("buffer of %d bytes, this rank has %d", got, len(data))}
		}
		addrs[p.rank] = binary.LittleEndian.Uint64(d[0:])
	}

	lo, hi := segment(r)
	scratch := c.scratchBuf(min(directChunk-directChunk%es, hi-lo))
	for off := lo; off < hi; off += len(scratch) {
		end := min(off+len(scratch), hi)
		for k := range n - 1 {
			p := other(k)
			if err := c.readPeer(p, addrs[p.rank]+uint64(off), scratch[:end-off]); err != nil {
				return err
			}
			reduceInto(data[off:end], scratch[:end-off], dt, op, false)
		}
	}
	if err := notify(directReduced, nil); err != nil {
		return err
	}
	for k := range n - 1 {
		p := other(k)
		if err := c.recv(p, o, directReduced, nil); err != nil {
			return err
		}
		lo, hi := segment(p.rank)
		if err := c.readPeer(p, addrs[p.rank]+uint64(lo), data[lo:hi]); err != nil {
			return err
		}
	}
	if err := notify(directGathered, nil); err != nil {
		return err
	}
	for k := range n - 1 {
		if err := c.recv(other(k), o, directGathered, nil); err != nil {
			return err
		}
	}
	return nil
}

// directState is directAllreduce's storage, guarded by opMu.
type directState struct {
	desc     [16]byte               // this rank's buffer, as sent
	peerDesc [16]byte               // a peer's, as received
	addrs    [directMaxRanks]uint64 // every peer's buffer, by rank
}

// readPeer copies len(dst) bytes at addr in p's memory into dst. A peer that has exited
// fails it as a closed ring does: the connection says why. (Were its PID taken meanwhile by
// another process, the read fails or reads bytes that the notices then discard: the peer
// never sends them, so the allreduce fails.)
func (c *Comm) readPeer(p *peer, addr uint64, dst []byte) error {
	if len(dst) == 0 {
		return nil
	}
	err := readPeerMem(p.pid, addr, dst)
	switch {
	case err == nil:
		return nil
	case peerGone(err):
		return c.shmErr(p, shmClosed{})
	}
	return &PeerError{Rank: p.rank, Addr: p.addr, Via: p.rank, Err: fmt.Errorf("read its buffer at %#x: %w", addr, err)}
}

// addrOf is where b starts in this process's memory.
func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// agreeDirect decides, the same on every rank, whether allreduce reads the peers' buffers
// directly (Stats.DirectFrom), and from which size: where all ranks share one host and
// connect to each other, each one tells every other what it asks for (directWish), or that
// it cannot (a peer's memory it may not read), and rank 0 adds the machine's ratio
// (machineReadRatio); then each one reaches the same answer (directAgree). Rank 0 alone
// measures, while the others wait for its frame: ranks measuring at once disturb each other
// both ways (on the 2-vCPU VM, four at once once made more than 0.55 of a machine that
// measures 0.30-0.36 alone). Every rank of the world takes the same branch here: the
// condition depends on the world's size and hosts alone.
func (c *Comm) agreeDirect(ctx context.Context) error {
	c.stats.DirectFrom = -1
	n := c.cfg.Size
	if !shmSupported || n < 2 || n > directMaxRanks || len(c.topo.hosts) != 1 {
		return nil
	}
	if !directSettingOK {
		directWarnOnce.Do(func() {
			c.log.Warn(envDirect+" not understood: want auto, 1 or 0; using auto", "value", envDirectValue)
		})
	}
	var wishes [directMaxRanks]int64
	r := c.cfg.Rank
	wishes[r] = directWish(directSetting, c.cfg.DirectBytes)
	for _, p := range c.peers {
		if p != nil && (p.shm == nil || !p.direct) {
			wishes[r] = -1
		}
	}
	ratio := 0.0
	if r == 0 && wishes[r] >= 0 {
		ratio = machineReadRatio()
	}
	var mine [16]byte
	binary.LittleEndian.PutUint64(mine[0:], uint64(wishes[r]))
	binary.LittleEndian.PutUint64(mine[8:], math.Float64bits(ratio))
	for _, p := range c.peers {
		if p == nil {
			continue
		}
		conn := p.conn
		stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
		defer stop()
		conn.SetDeadline(time.Now().Add(c.cfg.Timeout))
		defer conn.SetDeadline(time.Time{})
		if err := c.writeShmFrame(p, mine[:]); err != nil {
			return fmt.Errorf("agree on direct reads with rank %d: %w", p.rank, c.lost(p, err))
		}
	}
	for _, p := range c.peers {
		if p == nil {
			continue
		}
		theirs, err := c.readShmFrame(p, len(mine))
		if err == nil && len(theirs) != len(mine) {
			err = &protocolError{rank: p.rank, msg: fmt.Sprintf("direct-read agreement of %d bytes", len(theirs))}
		}
		if err != nil {
			if ctx.Err() != nil {
				err = context.Cause(ctx)
			}
			return fmt.Errorf("agree on direct reads with rank %d: %w", p.rank, err)
		}
		wishes[p.rank] = int64(binary.LittleEndian.Uint64(theirs[0:]))
		if p.rank == 0 {
			ratio = math.Float64frombits(binary.LittleEndian.Uint64(theirs[8:]))
		}
	}
	agreed := directFloor(directAgree(wishes[:n], ratio), c.cfg.SmallBytes, n)
	c.stats.DirectFrom = agreed
	c.log.Debug("direct reads", "from", agreed, "wishes", wishes[:n], "ratio", ratio, "policy", directSetting.String(), "config", c.cfg.DirectBytes)
	return nil
}
