package worker

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/gob"
	"fmt"
	"net"
	"os"
	"time"
	"unsafe"

	"github.com/elasticd/elasticd/allreduce"
	"github.com/elasticd/elasticd/worker/peerstate"
)

// How Sync brings ranks without the newest commit up to date (ELASTICD_STATE_TRANSFER):
//
//	broadcast  every rank takes part in a broadcast from rank 0, entry by entry
//	peers      the ranks that lack it fetch rank 0's commit in chunks from every rank that
//	           holds it (worker/peerstate, seed 001); the holders are not blocked in a
//	           collective while it moves, and busy holders are skipped
//	auto       peers for states of PeerThreshold bytes or more, else broadcast (the default:
//	           on one machine the pipelined broadcast is faster for small states)
const (
	TransferAuto      = "auto"
	TransferBroadcast = "broadcast"
	TransferPeers     = "peers"

	// EnvStateTransfer chooses the transfer; see TransferAuto.
	EnvStateTransfer = "ELASTICD_STATE_TRANSFER"
	// PeerThreshold is the state size from which auto fetches from peers.
	PeerThreshold = 64 << 20
)

// syncInfo is what each rank tells the others at the start of Sync.
type syncInfo struct {
	Holds   bool   // it has a commit (rank 0 always counts as holding)
	Version uint64 // its commit counter
	Size    uint64 // bytes of its committed state
	Addr    string // its peerstate server, "" when it has none
	Total   uint64 // its live step count (State.total)
}

// Sync makes every rank's state equal to the most advanced rank's, then commits it. That is
// the holder with the most steps (then the highest commit counter, then the lowest rank):
// most often rank 0, the oldest worker. A collective that completes on some ranks and fails
// on others leaves those it failed at their commit and those it completed a commit or a step
// ahead; their state is whole (their collectives completed), and taking rank 0's would train
// committed steps again. Ranks that already hold that state (same commit counter and step
// count) move nothing: after a reset among survivors, Sync costs one small allgather.
func (s *State) Sync(ctx context.Context) (err error) {
	// Every rank counts steps from here, so that all commit and check at the same steps (a
	// joiner's count would otherwise start at 0 and a survivor's not).
	s.step, s.lastStep = 0, time.Time{} // the reset is not a step
	c := s.w.comm
	// Rank 0 is the oldest worker: with no commit of its own, nobody has one, and the job
	// starts over, from the checkpoint directory when there is one.
	if c.Rank() == 0 && !s.holds && s.w.ckptDir != "" {
		if err := s.resume(); err != nil {
			return fmt.Errorf("sync: %w", err)
		}
	}
	me := syncInfo{Holds: s.holds || c.Rank() == 0, Version: s.version, Size: uint64(s.size()), Total: s.total}
	mode := s.w.transferMode()
	if me.Holds && wantPeers(mode, me.Size) {
		addr, err := s.w.peerServer()
		if err != nil {
			s.w.log.Warn("cannot serve state to peers; they will use the broadcast", "err", err)
		}
		me.Addr = addr
	}
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(me); err != nil {
		return err
	}
	raw, err := c.Allgather(ctx, buf.Bytes())
	if err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	infos := make([]syncInfo, len(raw))
	for i, b := range raw {
		if err := gob.NewDecoder(bytes.NewReader(b)).Decode(&infos[i]); err != nil {
			return fmt.Errorf("sync: rank %d's state summary: %w", i, err)
		}
	}
	src := sourceRank(infos)
	v0, t0 := infos[src].Version, infos[src].Total
	// A rank holds the source's state when it has its commit counter and step count. The
	// counter alone is not enough: a collective that completes on some ranks and fails on
	// others splits them at the same counter, those it failed having restored their commit
	// and those it completed (hearing of a host change there) keeping the step after it.
	holds := func(in syncInfo) bool { return in.Holds && in.Version == v0 && in.Total == t0 }
	// The source's step count goes with its state; Sync ends in a commit of it on every rank.
	s.total = t0
	defer func() {
		if err == nil {
			s.committedNow(time.Now())
		}
	}()
	// A holder has the source's live state (the ranks step in lockstep; it is ahead of the commit
	// when the hosts changed at a step that did not commit), so it commits it now, before any
	// transfer. A transfer that fails part-way then leaves every holder with the same commit
	// at v0; were they to commit it only once the transfer succeeded, some would restore the
	// older commit and others this one, both at v0, and the next Sync, seeing one version
	// everywhere, would make them equal no more.
	if holds(infos[c.Rank()]) {
		if err := s.save(); err != nil {
			return err
		}
		s.version, s.holds = v0, true
		s.committedNow(time.Now())
	}
	var holders []peerstate.Holder
	needers := 0
	for _, in := range infos {
		switch {
		case !holds(in):
			needers++
		case in.Addr != "":
			host, _, _ := net.SplitHostPort(in.Addr)
			holders = append(holders, peerstate.Holder{Addr: in.Addr, Host: host})
		}
	}
	if needers == 0 {
		return nil
	}
	if infos[src].Addr != "" && wantPeers(mode, infos[src].Size) {
		failed := int64(0)
		holder := holds(infos[c.Rank()])
		published := holder && infos[c.Rank()].Addr != "" // a holder whose server did not start serves nothing
		if published {
			// What the broadcast would send: the live state, committed above.
			s.w.peers.Publish(v0, s.blob())
			defer s.w.peers.Unpublish() // the fetches are over by then: keep no copy of the state
		}
		// No fetch before every holder has published: a holder asked too early answers
		// that it lacks the version, and the fetcher would drop it.
		if err := c.Barrier(ctx); err != nil {
			return fmt.Errorf("sync: %w", err)
		}
		if !holder {
			if err := s.fetch(ctx, v0, holders); err != nil {
				s.w.log.Warn("fetching the state from peers failed; falling back to the broadcast", "err", err)
				failed = 1
			}
		}

		// Every rank waits here until every fetch is over, so holders serve until then.
		flag := []int64{failed}
		if err := c.Allreduce(ctx, flag, allreduce.Max); err != nil {
			return fmt.Errorf("sync: %w", err)
		}
		if flag[0] == 0 {
			s.version, s.holds = v0, true
			if published {
				return nil // saved before publishing
			}
			return s.save()
		}
	}
	if err := s.broadcast(ctx, src); err != nil {
		return err
	}
	s.version, s.holds = v0, true
	return s.save()
}

// sourceRank is the rank whose state Sync gives every rank: of the holders (rank 0 always
// counts as one), the one with the most steps, then the highest commit counter, then the
// lowest rank.
func sourceRank(infos []syncInfo) int {
	src := 0
	for r, in := range infos {
		best := infos[src]
		if in.Holds && (in.Total > best.Total || in.Total == best.Total && in.Version > best.Version) {
			src = r
		}
	}
	return src
}

// transferMode is ELASTICD_STATE_TRANSFER; an unknown value is auto, said once per worker in
// its log.
func (w *Worker) transferMode() string {
	switch m := os.Getenv(EnvStateTransfer); m {
	case TransferBroadcast, TransferPeers:
		return m
	case "", TransferAuto:
		return TransferAuto
	default:
		w.badTransfer.Do(func() {
			w.log.Warn("unknown "+EnvStateTransfer+"; using auto", "value", m, "want", TransferAuto+", "+TransferBroadcast+" or "+TransferPeers)
		})
		return TransferAuto
	}
}

// wantPeers reports whether a state of size bytes travels from peers in mode.
func wantPeers(mode string, size uint64) bool {
	return mode == TransferPeers || mode == TransferAuto && size >= PeerThreshold
}

// peerServer starts this worker's peerstate server once and returns its address.
func (w *Worker) peerServer() (string, error) {
	if w.peers == nil {
		srv, err := peerstate.Listen(peerstate.ServerConfig{Secret: w.secret, Logger: w.log}, net.JoinHostPort(w.hostAddr, "0"))
		if err != nil {
			return "", err
		}
		w.peers = srv
	}
	return w.peers.Addr(), nil
}

// fetch pulls version v of the committed state from the holders into the live entries.
func (s *State) fetch(ctx context.Context, v uint64, holders []peerstate.Holder) error {
	f, err := peerstate.NewFetcher(peerstate.FetcherConfig{Secret: s.w.secret, Host: s.w.hostAddr, Logger: s.w.log})
	if err != nil {
		return err
	}
	blob, _, err := f.FetchInto(ctx, v, holders, nil)
	if err != nil {
		return err
	}
	return s.load(blob)
}

// size is the length of blob().
func (s *State) size() int {
	n := 0
	for _, e := range s.entries {
		n += 8 + len(rawBytes(e.saved))
	}
	return n
}

// blob is the committed state as bytes: per entry, its length (uint64, little-endian) and
// its snapshot (a tensor's memory, or the gob encoding of a value).
func (s *State) blob() []byte {
	out := make([]byte, 0, s.size())
	for _, e := range s.entries {
		b := rawBytes(e.saved)
		out = binary.LittleEndian.AppendUint64(out, uint64(len(b)))
		out = append(out, b...)
	}
	return out
}

// load puts a blob into the live entries.
func (s *State) load(blob []byte) error {
	for _, e := range s.entries {
		if len(blob) < 8 {
			return fmt.Errorf("state %q: the fetched state is truncated", e.name)
		}
		n := binary.LittleEndian.Uint64(blob)
		blob = blob[8:]
		if uint64(len(blob)) < n {
			return fmt.Errorf("state %q: the fetched state is truncated", e.name)
		}
		b := blob[:n]
		blob = blob[n:]
		switch l := e.live.(type) {
		case []float32, []float64, []int64:
			dst := rawBytes(l)
			if len(dst) != len(b) {
				return fmt.Errorf("state %q: %d bytes fetched for a tensor of %d: the ranks registered different shapes", e.name, len(b), len(dst))
			}
			copy(dst, b)
		default:
			if err := e.decode(b); err != nil {
				return err
			}
		}
	}
	if len(blob) != 0 {
		return fmt.Errorf("the fetched state has %d bytes more than the registered entries", len(blob))
	}
	return nil
}

// rawBytes is a tensor's memory, or gob bytes as they are.
func rawBytes(v any) []byte {
	switch l := v.(type) {
	case []float32:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(l))), len(l)*4)
	case []float64:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(l))), len(l)*8)
	case []int64:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(l))), len(l)*8)
	case []byte:
		return l
	}
	return nil
}
