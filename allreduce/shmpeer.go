package allreduce

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Transports for Config.Transport.
const (
	// TransportAuto (the default) uses shared memory with peers on the same machine where the
	// OS allows it, and TCP otherwise.
	TransportAuto = "auto"
	// TransportTCP sends every byte over TCP, even to peers on the same machine.
	TransportTCP = "tcp"
)

// maxShmOffer bounds an shm offer's payload: 24 bytes of numbers, the token, and a host ID.
const maxShmOffer = 24 + tokenLen + maxHostID

// setupShm agrees with every peer on whether their data goes through shared memory: the
// lower rank of each pair offers a segment, the higher one maps it or declines. Declining
// (another machine, TCP forced, a segment that will not open) leaves the pair on TCP; an
// error of the connection itself fails New.
func (c *Comm) setupShm(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(c.peers))
	for i, p := range c.peers {
		if p != nil {
			wg.Go(func() { errs[i] = c.shmPair(ctx, p) })
		}
	}
	wg.Wait()
	for _, p := range c.peers {
		if p != nil && p.shm != nil {
			c.stats.SharedMemory++
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return c.agreeDirect(ctx)
}

// chooseNT decides, once the links are made, from which collective size their copies use
// non-temporal stores (ntFrom), and lends them the switch that nextOp sets per collective.
func (c *Comm) chooseNT() {
	c.stats.NonTemporalFrom = -1
	if c.stats.SharedMemory > 0 {
		if !ntSettingOK {
			ntWarnOnce.Do(func() {
				c.log.Warn(envNonTemporal+" not understood: want auto, 1 or 0; using auto", "value", envNT)
			})
		}
		llc := machineLLC()
		c.stats.NonTemporalFrom = ntFrom(ntSetting, ntHardware, llc, c.stats.SharedMemory+1)
		c.log.Debug("shared-memory copies", "non_temporal_from", c.stats.NonTemporalFrom, "policy", ntSetting.String(), "llc_bytes", llc.size, "llc_shared", llc.shared)
		for _, p := range c.peers {
			if p != nil && p.shm != nil {
				p.shm.nt = &c.ntOn
			}
		}
	}
}

func (c *Comm) shmPair(ctx context.Context, p *peer) error {
	conn := p.conn
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	conn.SetDeadline(time.Now().Add(c.cfg.Timeout))
	var err error
	if c.cfg.Rank < p.rank {
		err = c.offerShm(p)
	} else {
		err = c.answerShm(p)
	}
	if err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return fmt.Errorf("agree on a transport with rank %d: %w", p.rank, err)
	}
	conn.SetDeadline(time.Time{})
	return nil
}

// noShm logs, once per communicator, why a peer on this machine could not use shared memory.
func (c *Comm) noShm(p *peer, err error) {
	c.shmOnce.Do(func() {
		c.log.Info("shared memory unavailable, using TCP", "peer", p.rank, "err", err)
	})
}

func (c *Comm) writeShmFrame(p *peer, payload []byte) error {
	h := header{kind: kindShm, gen: c.cfg.Generation, unit: uint32(c.cfg.Rank), length: uint32(len(payload))}
	b := make([]byte, headerLen, headerLen+len(payload))
	h.put(b)
	_, err := p.conn.Write(append(b, payload...))
	return err
}

func (c *Comm) readShmFrame(p *peer, limit int) ([]byte, error) {
	var b [headerLen]byte
	if _, err := io.ReadFull(p.conn, b[:]); err != nil {
		return nil, c.lost(p, err)
	}
	h, err := parseHeader(b[:])
	if err != nil {
		return nil, &protocolError{rank: p.rank, msg: err.Error()}
	}
	if h.kind == kindAbort {
		return nil, c.readAbort(p, h)
	}
	if h.kind != kindShm || h.gen != c.cfg.Generation || int(h.unit) != p.rank || int(h.length) > limit {
		return nil, &protocolError{rank: p.rank, msg: fmt.Sprintf("frame kind %d of generation %d from rank %d, %d bytes; expected a transport offer or answer", h.kind, h.gen, h.unit, h.length)}
	}
	payload := make([]byte, h.length)
	if _, err := io.ReadFull(p.conn, payload); err != nil {
		return nil, c.lost(p, err)
	}
	return payload, nil
}

// offerShm creates a segment and offers it (an empty offer: TCP), then reads the answer.
// The offer also says where the token lies in this process, and the answer where a nonce
// lies in the peer's: each side tries to read the other's (directProbe), so that both know
// whether directAllreduce may read the other's buffers.
func (c *Comm) offerShm(p *peer) error {
	var seg *segment
	var offer []byte
	if c.cfg.Transport != TransportTCP && shmSupported {
		ringSize := shmRingSize(c.cfg.ChunkBytes)
		p.probe = make([]byte, tokenLen)
		rand.Read(p.probe)
		var err error
		seg, err = createSegment(ringSize, p.probe)
		if err != nil {
			c.noShm(p, err)
		} else {
			defer seg.file.Close() // the peer has opened it, or never will
			offer = binary.LittleEndian.AppendUint32(offer, uint32(os.Getpid()))
			offer = binary.LittleEndian.AppendUint32(offer, uint32(seg.file.Fd()))
			offer = binary.LittleEndian.AppendUint64(offer, uint64(ringSize))
			offer = binary.LittleEndian.AppendUint64(offer, addrOf(p.probe))
			offer = append(offer, p.probe...)
			offer = append(offer, c.cfg.HostID...)
		}
	}
	if err := c.writeShmFrame(p, offer); err != nil {
		if seg != nil {
			unmapSegment(seg.mem)
		}
		return c.lost(p, err)
	}
	if seg == nil {
		return nil
	}
	answer, err := c.readShmFrame(p, shmAnswerLen)
	if err != nil || len(answer) == 0 || answer[0] != 1 {
		unmapSegment(seg.mem)
		if err == nil && len(answer) == 0 {
			err = &protocolError{rank: p.rank, msg: "transport answer without a status"}
		}
		return err
	}
	p.shm = newLink(seg.mem, true, unmapSegment)
	c.watch(p)
	if len(answer) == shmAnswerLen && answer[1] == 1 {
		p.pid = int(binary.LittleEndian.Uint32(answer[2:]))
		addr := binary.LittleEndian.Uint64(answer[6:])
		if err := directProbe(p.pid, addr, answer[14:]); err != nil {
			c.noDirect(p, err)
		} else {
			p.direct = true
		}
	}
	return nil
}

// shmAnswerLen is a full answer: status 1, whether the answering rank could read the
// offering one's token, its PID, and the address and bytes of a nonce for the offering
// rank to read.
const shmAnswerLen = 2 + 4 + 8 + tokenLen

// noDirect logs, once per communicator, why a peer's memory could not be read directly.
func (c *Comm) noDirect(p *peer, err error) {
	c.directOnce.Do(func() {
		c.log.Info("cannot read a peer's memory (process_vm_readv): its data goes through the shared-memory rings", "peer", p.rank, "err", err)
	})
}

// answerShm reads the lower rank's offer and maps its segment when it can.
func (c *Comm) answerShm(p *peer) error {
	offer, err := c.readShmFrame(p, maxShmOffer)
	if err != nil || len(offer) == 0 {
		return err
	}
	mem, why := c.acceptOffer(offer)
	status := []byte{0}
	if why == nil {
		status[0] = 1
		p.pid = int(binary.LittleEndian.Uint32(offer[0:]))
		addr := binary.LittleEndian.Uint64(offer[16:])
		if err := directProbe(p.pid, addr, offer[24:24+tokenLen]); err != nil {
			c.noDirect(p, err)
			status = append(status, 0)
		} else {
			p.direct = true
			status = append(status, 1)
		}
		p.probe = make([]byte, tokenLen)
		rand.Read(p.probe)
		status = binary.LittleEndian.AppendUint32(status, uint32(os.Getpid()))
		status = binary.LittleEndian.AppendUint64(status, addrOf(p.probe))
		status = append(status, p.probe...)
	} else if c.cfg.Transport != TransportTCP {
		c.noShm(p, why)
	}
	if err := c.writeShmFrame(p, status); err != nil {
		if mem != nil {
			unmapSegment(mem)
		}
		return c.lost(p, err)
	}
	if mem != nil {
		p.shm = newLink(mem, false, unmapSegment)
		c.watch(p)
	}
	return nil
}

func (c *Comm) acceptOffer(offer []byte) ([]byte, error) {
	if c.cfg.Transport == TransportTCP {
		return nil, errors.New("TCP forced")
	}
	if len(offer) < 24+tokenLen {
		return nil, fmt.Errorf("offer of %d bytes", len(offer))
	}
	pid := int(binary.LittleEndian.Uint32(offer[0:]))
	fd := int(binary.LittleEndian.Uint32(offer[4:]))
	ringSize := binary.LittleEndian.Uint64(offer[8:])
	token := offer[24 : 24+tokenLen]
	host := string(offer[24+tokenLen:])
	switch {
	case !shmSupported:
		return nil, errNoShm
	case host == "" || host != c.cfg.HostID:
		return nil, errors.New("peer is on another host (host IDs differ: boot ID and network namespace, or Config.HostID)")
	case ringSize < 64<<10 || ringSize > 1<<30 || ringSize&(ringSize-1) != 0:
		return nil, fmt.Errorf("ring of %d bytes", ringSize)
	}
	mem, err := openSegment(pid, fd, int(ringSize), token)
	if err != nil {
		return nil, fmt.Errorf("open the peer's segment: %w", err)
	}
	return mem, nil
}

var errNoShm = errors.New("no shared-memory transport on this OS")

// watch sets what a rank does while it waits on p's ring: it gives up when this rank is
// interrupted, when p's connection has news (an abort frame or its end: a dead process's
// socket closes), or when p has been silent for Config.Timeout.
func (c *Comm) watch(p *peer) {
	pk := newPeeker(p.conn)
	p.shm.check = func(start time.Time) error {
		p.conn.SetReadDeadline(time.Now().Add(c.cfg.Timeout))
		if err := c.stopping(); err != nil {
			return err
		}
		if pk.peek() {
			return shmClosed{}
		}
		if time.Since(start) >= c.cfg.Timeout {
			return &PeerError{Rank: p.rank, Addr: p.addr, Via: p.rank, Err: silentError{c.cfg.Timeout}}
		}
		return nil
	}
}

// shmErr turns the end of a wait on p's ring into the error the collective reports: when the
// peer closed its side or its connection has news, what the connection says.
func (c *Comm) shmErr(p *peer, err error) error {
	if _, ok := err.(shmClosed); !ok {
		return err
	}
	l := p.shm
	l.goneMu.Lock()
	defer l.goneMu.Unlock()
	if l.gone != nil {
		return l.gone
	}
	p.conn.SetReadDeadline(time.Now().Add(c.cfg.Timeout))
	if err := c.stopping(); err != nil {
		return err
	}
	var b [headerLen]byte
	_, err = io.ReadFull(p.conn, b[:])
	if s := c.stopping(); s != nil {
		return s
	}
	switch {
	case err != nil:
		l.gone = c.lost(p, err)
	default:
		h, perr := parseHeader(b[:])
		switch {
		case perr != nil:
			l.gone = &protocolError{rank: p.rank, msg: perr.Error()}
		case h.kind == kindAbort:
			l.gone = c.readAbort(p, h)
		default:
			l.gone = &protocolError{rank: p.rank, msg: fmt.Sprintf("frame kind %d on the connection while data goes through shared memory", h.kind)}
		}
	}
	return l.gone
}

// shmFrame is a data frame's bytes in a ring: header, payload, padding.
func shmFrame(hdr, payload []byte) [][]byte {
	return [][]byte{hdr, payload, zeros[:padLen(len(hdr)+len(payload))]}
}

// shmRecvHeader reads and checks the header of data frame `unit` of o from p's ring.
func (c *Comm) shmRecvHeader(p *peer, o *opInfo, unit, n int) error {
	if err := p.shm.read(p.rhdr[:]); err != nil {
		return c.shmErr(p, err)
	}
	h, err := parseHeader(p.rhdr[:])
	if err != nil {
		return &protocolError{rank: p.rank, msg: err.Error()}
	}
	if msg := c.check(o, h, unit, n); msg != "" {
		return &protocolError{rank: p.rank, msg: msg}
	}
	return nil
}
