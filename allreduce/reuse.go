package allreduce

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync/atomic"
	"time"
)

// Carrying connections over from one generation to the next (docs/protocol.md §1.2).
//
// Each rank with a Config.ID publishes, with its address, the IDs of the members it holds a
// healthy connection to in its previous communicator, and that communicator's generation.
// Two neighbours of the new generation reuse their connection when each lists the other and
// both name the same previous generation: both read the same two records, so both decide
// the same without talking, and neither waits for a decision that the other does not make.
// Then each sends a rehello on the connection and reads the other's; anything the other had
// sent in the previous generation and this rank never read comes before the rehello and is
// discarded, so no frame of the old generation reaches the new one.

// record is what a rank publishes under its address key. Without an ID or a host it is the
// bare address, as before reuse existed; with either, a JSON object.
type record struct {
	Addr string   `json:"addr"`
	Host string   `json:"host,omitempty"` // Config.HostID; "" with TCP forced (docs/protocol.md §1.7)
	ID   string   `json:"id,omitempty"`
	Prev uint64   `json:"prev,omitempty"` // generation of the communicator Keep refers to
	Keep []string `json:"keep,omitempty"` // IDs this rank can carry a connection over to
}

func (r record) encode() []byte {
	if r.ID == "" && r.Host == "" {
		return []byte(r.Addr)
	}
	b, _ := json.Marshal(r) // strings and a number: cannot fail
	return b
}

func parseRecord(v []byte) (record, error) {
	if len(v) == 0 || v[0] != '{' {
		return record{Addr: string(v)}, nil
	}
	var r record
	if err := json.Unmarshal(v, &r); err != nil {
		return record{}, fmt.Errorf("malformed record %q: %w", v, err)
	}
	if r.Addr == "" {
		return record{}, fmt.Errorf("record %q has no address", v)
	}
	return r, nil
}

// handover is a connection of the previous communicator that New may carry over.
type handover struct {
	old     *peer // as it was in the previous communicator (rank there, connection)
	prevGen uint64
	oldRank int         // this rank in the previous communicator
	claimed atomic.Bool // New has started a rehello on it: it is New's, never given back
}

// handOver takes from prev, for a New of member id, every connection whose stream is intact
// (prev neither closed nor failed, no write stopped mid-frame) and whose peer has a unique
// ID, and retires prev. It takes nothing when in doubt: no prev, another member's, or an
// operation running on it.
func (prev *Comm) handOver(id string) map[string]*handover {
	if prev == nil || id == "" || prev.cfg.ID != id {
		return nil
	}
	if !prev.opMu.TryLock() {
		return nil
	}
	defer prev.opMu.Unlock()
	prev.mu.Lock()
	defer prev.mu.Unlock()
	if prev.closed || prev.err != nil {
		return nil
	}
	prev.retired = true
	seen := map[string]int{}
	for _, p := range prev.peers {
		if p != nil {
			seen[p.id]++
		}
	}
	cands := map[string]*handover{}
	for i, p := range prev.peers {
		if p == nil || p.broken || p.id == "" || p.id == id || seen[p.id] > 1 {
			continue
		}
		if p.shm != nil {
			// Not shut: the peer, idle as well, reads nothing more from it, and a closed mark
			// would send it to the connection, which now belongs to the next generation.
			p.shm.release()
			p.shm = nil
		}
		cands[p.id] = &handover{old: p, prevGen: prev.cfg.Generation, oldRank: prev.cfg.Rank}
		prev.peers[i] = nil
	}
	return cands
}

// takeBack returns to prev the connections New did not start to reuse, so that prev's Close
// closes them (or closes them now if prev is closed already). Claimed ones are New's.
func (prev *Comm) takeBack(cands map[string]*handover) {
	if len(cands) == 0 {
		return
	}
	prev.opMu.Lock()
	defer prev.opMu.Unlock()
	prev.mu.Lock()
	defer prev.mu.Unlock()
	for _, h := range cands {
		switch {
		case h.claimed.Load():
		case prev.closed:
			h.old.conn.Close()
		default:
			prev.peers[h.old.rank] = h.old
		}
	}
}

// agree decides, from this rank's record and a neighbour's, whether the two carry over
// their connection; both sides compute the same answer from the same two records. It
// returns the connection, claimed, or nil to connect afresh.
func agree(self, other record, cands map[string]*handover) *handover {
	if self.ID == "" || other.ID == "" || other.ID == self.ID || other.Prev != self.Prev ||
		!slices.Contains(self.Keep, other.ID) || !slices.Contains(other.Keep, self.ID) {
		return nil
	}
	h := cands[other.ID]
	if h == nil || !h.claimed.CompareAndSwap(false, true) {
		return nil
	}
	return h
}

// rehelloLen is the rehello payload before its MAC: the receiver's rank, then the sender's
// and the receiver's ranks in the previous generation, u32 each.
const rehelloLen = 12

// rehello opens the carried-over connection h to rank q of this generation: both sides send
// a rehello and read the other's, concurrently, so old bytes still queued in either
// direction cannot block them. It owns h's connection: on failure it closes it.
func (c *Comm) rehello(ctx context.Context, q int, addr string, h *handover) (*peer, error) {
	conn := h.old.conn
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	conn.SetDeadline(time.Now().Add(c.cfg.Timeout))
	msg := c.rehelloFrame(q, h)
	werr := make(chan error, 1)
	go func() {
		_, err := conn.Write(msg)
		werr <- err
	}()
	skipped, rerr := c.readRehello(conn, q, h)
	if rerr != nil {
		conn.SetDeadline(time.Now()) // ends the write too
	}
	err := cmp.Or(rerr, <-werr)
	if err != nil {
		conn.Close()
		var pe *protocolError
		if !errors.As(err, &pe) {
			err = &PeerError{Rank: q, Addr: addr, Via: q, Err: describeIOErr(err, c.cfg.Timeout)}
		}
		return nil, fmt.Errorf("carry over the connection to rank %d from generation %d: %w", q, h.prevGen, err)
	}
	conn.SetDeadline(time.Time{})
	if skipped > 0 {
		c.log.Debug("discarded frames of the previous generation", "peer", q, "frames", skipped)
	}
	return &peer{rank: q, addr: addr, conn: conn, reused: true}, nil
}

// rehelloHeader is the header of the rehello that rank `from` sends to rank `to`.
func (c *Comm) rehelloHeader(from int, h *handover) header {
	rh := header{kind: kindRehello, gen: c.cfg.Generation, seq: h.prevGen, total: uint64(c.cfg.Size),
		unit: uint32(from), length: rehelloLen}
	if len(c.cfg.Secret) > 0 {
		rh.length += sha256.Size
	}
	return rh
}

func (c *Comm) rehelloFrame(q int, h *handover) []byte {
	b := make([]byte, headerLen+rehelloLen, headerLen+rehelloLen+sha256.Size)
	rh := c.rehelloHeader(c.cfg.Rank, h)
	rh.put(b)
	binary.LittleEndian.PutUint32(b[headerLen:], uint32(q))
	binary.LittleEndian.PutUint32(b[headerLen+4:], uint32(h.oldRank))
	binary.LittleEndian.PutUint32(b[headerLen+8:], uint32(h.old.rank))
	if len(c.cfg.Secret) > 0 {
		b = append(b, c.mac(b)...)
	}
	return b
}

// readRehello reads up to and including q's rehello. Data frames of the previous generation
// before it were sent by q after this rank's last read in that generation (q had run ahead)
// and are discarded; the stream is intact on both sides, so they are whole frames.
func (c *Comm) readRehello(conn net.Conn, q int, h *handover) (skipped int, err error) {
	var b [headerLen + rehelloLen]byte
	for {
		if _, err := io.ReadFull(conn, b[:headerLen]); err != nil {
			return skipped, err
		}
		got, err := parseHeader(b[:headerLen])
		if err != nil {
			return skipped, &protocolError{rank: q, msg: err.Error()}
		}
		switch {
		case got.kind == kindData && got.gen == h.prevGen:
			if _, err := io.CopyN(io.Discard, conn, int64(got.length)); err != nil {
				return skipped, err
			}
			skipped++
			continue
		case got.kind == kindAbort && got.length <= maxAbortLen:
			reason := make([]byte, got.length)
			if _, err := io.ReadFull(conn, reason); err != nil {
				return skipped, err
			}
			return skipped, fmt.Errorf("rank %d aborted: %s", q, reason)
		case got.kind != kindRehello:
			return skipped, &protocolError{rank: q, msg: fmt.Sprintf("frame kind %d of generation %d before the rehello", got.kind, got.gen)}
		}
		if want := c.rehelloHeader(q, h); got != want {
			return skipped, &protocolError{rank: q, msg: fmt.Sprintf(
				"rehello for generation %d from %d, world size %d, rank %d, %d bytes; expected generation %d from %d, size %d, rank %d, %d bytes",
				got.gen, got.seq, got.total, got.unit, got.length, want.gen, want.seq, want.total, want.unit, want.length)}
		}
		if _, err := io.ReadFull(conn, b[headerLen:]); err != nil {
			return skipped, err
		}
		to := binary.LittleEndian.Uint32(b[headerLen:])
		fromOld := binary.LittleEndian.Uint32(b[headerLen+4:])
		toOld := binary.LittleEndian.Uint32(b[headerLen+8:])
		if int(to) != c.cfg.Rank || int(fromOld) != h.old.rank || int(toOld) != h.oldRank {
			return skipped, &protocolError{rank: q, msg: fmt.Sprintf(
				"rehello to rank %d over the connection of ranks %d→%d, expected to rank %d over %d→%d",
				to, fromOld, toOld, c.cfg.Rank, h.old.rank, h.oldRank)}
		}
		if len(c.cfg.Secret) > 0 {
			sum := make([]byte, sha256.Size)
			if _, err := io.ReadFull(conn, sum); err != nil {
				return skipped, err
			}
			if !hmac.Equal(sum, c.mac(b[:])) {
				return skipped, &protocolError{rank: q, msg: "rehello: bad MAC (wrong job secret)"}
			}
		}
		return skipped, nil
	}
}
