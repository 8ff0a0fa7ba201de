package peerstate

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of ServerConfig.
const (
	DefaultMaxTransfers = 4
	DefaultChunkSize    = 4 << 20
	DefaultIOTimeout    = 30 * time.Second
	DefaultIdleTimeout  = 2 * time.Minute
)

// ServerConfig configures a holder.
type ServerConfig struct {
	// Secret is the job secret; requests must carry its HMAC. Required.
	Secret []byte
	// MaxTransfers is how many chunks the holder sends at once; a chunk request beyond that
	// is answered BUSY at once. Default 4.
	MaxTransfers int
	// ChunkSize is the unit of transfer and verification; default 4 MiB, 4 KiB to 64 MiB.
	ChunkSize int
	// IOTimeout bounds each write to a fetcher; a fetcher that stops reading loses its
	// connection (and its transfer slot) after it. Default 30s.
	IOTimeout time.Duration
	// IdleTimeout closes a connection with no request for this long; default 2m.
	IdleTimeout time.Duration
	// Observe, when set, is called after each reply (for metrics and tests); it must be quick.
	Observe func(Reply)
	// Logger receives connection-level events; nil discards them.
	Logger *slog.Logger
}

// Reply describes one answered request, for ServerConfig.Observe.
type Reply struct {
	Kind    Kind
	Version uint64 // the version asked for
	Chunk   int
	Status  Status
	Remote  string
}

// Validate reports the first invalid field.
func (c ServerConfig) Validate() error {
	switch {
	case len(c.Secret) == 0:
		return errors.New("peerstate server: no job secret: requests could not be authenticated")
	case c.MaxTransfers < 0:
		return fmt.Errorf("peerstate server: MaxTransfers %d: must be positive (0 for the default %d)", c.MaxTransfers, DefaultMaxTransfers)
	case c.ChunkSize != 0 && (c.ChunkSize < 4<<10 || c.ChunkSize > 64<<20):
		return fmt.Errorf("peerstate server: ChunkSize %d: must be from 4 KiB to 64 MiB (0 for the default 4 MiB)", c.ChunkSize)
	case c.IOTimeout < 0 || c.IdleTimeout < 0:
		return errors.New("peerstate server: timeouts must not be negative (0 for the defaults)")
	}
	return nil
}

// ServerStats counts what a holder answered.
type ServerStats struct {
	Requests  int64 // requests with a valid MAC
	Chunks    int64 // chunks sent in full
	Busy      int64 // BUSY answers
	Denied    int64 // requests refused for a bad MAC
	BytesSent int64 // chunk data bytes written
}

// Server is a holder: it serves the version last Published to authenticated fetchers.
type Server struct {
	cfg    ServerConfig
	log    *slog.Logger
	ln     net.Listener
	snap   atomic.Pointer[snapshot]
	active atomic.Int64 // chunk transfers in progress

	requests, chunks, busy, denied, bytesSent atomic.Int64

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// snapshot is one published version.
type snapshot struct {
	version uint64
	data    []byte      // Publish
	r       io.ReaderAt // PublishFrom
	size    int64
	chunk   int

	once  sync.Once
	reply *manifest // computed on the first MANIFEST request
	err   error
}

func (s *snapshot) readAt(p []byte, off int64) error {
	if s.data != nil {
		copy(p, s.data[off:])
		return nil
	}
	n, err := s.r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	return cmp.Or(err, io.ErrUnexpectedEOF)
}

func (s *snapshot) manifest() (*manifest, error) {
	s.once.Do(func() {
		m := &manifest{version: s.version, size: s.size, chunk: s.chunk, sums: make([]uint32, chunkCount(s.size, s.chunk))}
		var buf []byte
		for i := range m.sums {
			off, end := m.span(i)
			if s.data != nil {
				m.sums[i] = checksum(s.data[off:end])
				continue
			}
			buf = grow(buf, int(end-off))
			if err := s.readAt(buf, off); err != nil {
				s.err = fmt.Errorf("read chunk %d of version %d: %w", i, s.version, err)
				return
			}
			m.sums[i] = checksum(buf)
		}
		s.reply = m
	})
	return s.reply, s.err
}

// Listen starts a holder on addr (host:port; port 0 picks one). Close stops it.
func Listen(cfg ServerConfig, addr string) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("peerstate server: listen on %s: %w", addr, err)
	}
	cfg.MaxTransfers = cmp.Or(cfg.MaxTransfers, DefaultMaxTransfers)
	cfg.ChunkSize = cmp.Or(cfg.ChunkSize, DefaultChunkSize)
	cfg.IOTimeout = cmp.Or(cfg.IOTimeout, DefaultIOTimeout)
	cfg.IdleTimeout = cmp.Or(cfg.IdleTimeout, DefaultIdleTimeout)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: log, ln: ln, conns: map[net.Conn]struct{}{}}
	s.wg.Go(s.accept)
	return s, nil
}

// Addr is the address fetchers dial (Holder.Addr).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Publish makes data the version the holder serves, replacing the previous one. data must not
// change while it is served (until the next Publish and the transfers of this version end):
// a torn read fails verification on the fetcher and is fetched elsewhere.
func (s *Server) Publish(version uint64, data []byte) {
	if data == nil {
		data = []byte{}
	}
	s.snap.Store(&snapshot{version: version, data: data, size: int64(len(data)), chunk: s.cfg.ChunkSize})
}

// Unpublish stops serving the published version, so the holder keeps no reference to it:
// requests are answered NO_VERSION (holding 0) until the next Publish. Transfers already
// under way finish.
func (s *Server) Unpublish() { s.snap.Store(nil) }

// PublishFrom is Publish for state read through r (size bytes), for example from a file.
func (s *Server) PublishFrom(version uint64, r io.ReaderAt, size int64) error {
	if size < 0 || size > MaxSize {
		return fmt.Errorf("peerstate server: publish %d bytes: must be from 0 to %d", size, int64(MaxSize))
	}
	s.snap.Store(&snapshot{version: version, r: r, size: size, chunk: s.cfg.ChunkSize})
	return nil
}

// Prepare computes the published version's manifest (a CRC-32C per chunk, one read of the
// whole state) now, instead of on the first MANIFEST request while a joiner waits. Call it
// off the training path, for example when a reset begins; it is a no-op when nothing is
// published or the manifest is ready.
func (s *Server) Prepare() error {
	if snap := s.snap.Load(); snap != nil {
		_, err := snap.manifest()
		return err
	}
	return nil
}

// Stats returns the counters so far.
func (s *Server) Stats() ServerStats {
	return ServerStats{Requests: s.requests.Load(), Chunks: s.chunks.Load(), Busy: s.busy.Load(), Denied: s.denied.Load(), BytesSent: s.bytesSent.Load()}
}

// Close stops listening, closes every connection (transfers in progress fail on the
// fetchers, which fetch those chunks elsewhere) and waits for the connection handlers.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	err := s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.log.Warn("peerstate: accept failed; no longer serving", "err", err)
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			conn.Close()
			return
		}
		s.conns[conn] = struct{}{}
		s.wg.Go(func() { s.serve(conn) })
		s.mu.Unlock()
	}
}

func (s *Server) serve(conn net.Conn) {
	defer func() {
		s.mu.Lock()
		delete(s.conns, conn)
		s.mu.Unlock()
		conn.Close()
	}()
	remote := conn.RemoteAddr().String()
	var buf, out []byte
	for {
		conn.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout))
		body, err := readFrame(conn, buf)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Debug("peerstate: connection ended", "remote", remote, "err", err)
			}
			return
		}
		buf = body
		req, err := parseRequest(s.cfg.Secret, body)
		if err != nil {
			st := StatusBadRequest
			if errors.Is(err, errBadMAC) {
				st = StatusDenied
				s.denied.Add(1)
			}
			s.log.Warn("peerstate: refused a request", "remote", remote, "err", err)
			s.writeError(conn, st, err.Error())
			s.observe(Reply{Status: st, Remote: remote})
			return
		}
		s.requests.Add(1)
		st, ok := s.answer(conn, req, &out)
		s.observe(Reply{Kind: req.kind, Version: req.version, Chunk: int(req.chunk), Status: st, Remote: remote})
		if !ok {
			return
		}
	}
}

func (s *Server) observe(r Reply) {
	if s.cfg.Observe != nil {
		s.cfg.Observe(r)
	}
}

// answer replies to one authenticated request; it returns false when the connection must end.
func (s *Server) answer(conn net.Conn, req request, out *[]byte) (Status, bool) {
	snap := s.snap.Load()
	held := uint64(0)
	if snap != nil {
		held = snap.version
	}
	if snap == nil || snap.version != req.version {
		return StatusNoVersion, s.writeHeader(conn, StatusNoVersion, held, nil) == nil
	}
	switch req.kind {
	case KindManifest:
		m, err := snap.manifest()
		if err != nil {
			s.log.Warn("peerstate: cannot read the published state", "err", err)
			s.writeError(conn, StatusBadRequest, err.Error())
			return StatusBadRequest, false
		}
		*out = appendManifestReply((*out)[:0], s.cfg.Secret, req.nonce, m)
		return StatusOK, s.write(conn, *out) == nil
	default:
		count := chunkCount(snap.size, snap.chunk)
		if int(req.chunk) >= count {
			msg := fmt.Sprintf("chunk %d: version %d has %d chunks", req.chunk, snap.version, count)
			s.writeError(conn, StatusBadRequest, msg)
			return StatusBadRequest, false
		}
		if s.active.Add(1) > int64(s.cfg.MaxTransfers) {
			s.active.Add(-1)
			s.busy.Add(1)
			return StatusBusy, s.writeHeader(conn, StatusBusy, held, nil) == nil
		}
		defer s.active.Add(-1)
		return StatusOK, s.sendChunk(conn, snap, int(req.chunk), out) == nil
	}
}

const piece = 1 << 20 // chunk data is read and written in pieces of this size

func (s *Server) sendChunk(conn net.Conn, snap *snapshot, i int, out *[]byte) error {
	m := manifest{size: snap.size, chunk: snap.chunk}
	off, end := m.span(i)
	var hdr [8]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(i))
	binary.BigEndian.PutUint32(hdr[4:], uint32(end-off))
	if err := s.writeHeader(conn, StatusOK, snap.version, hdr[:]); err != nil {
		return err
	}
	for p := off; p < end; p += piece {
		q := min(p+piece, end)
		var b []byte
		if snap.data != nil {
			b = snap.data[p:q]
		} else {
			*out = grow(*out, int(q-p))
			b = *out
			if err := snap.readAt(b, p); err != nil {
				s.log.Warn("peerstate: cannot read the published state", "err", err)
				return err // the fetcher sees a short chunk and goes elsewhere
			}
		}
		if err := s.write(conn, b); err != nil {
			return err
		}
		s.bytesSent.Add(q - p)
	}
	s.chunks.Add(1)
	return nil
}

func (s *Server) writeHeader(conn net.Conn, st Status, version uint64, rest []byte) error {
	b := make([]byte, 4, 4+9+len(rest))
	binary.BigEndian.PutUint32(b, uint32(9+len(rest)))
	b = append(b, byte(st))
	b = binary.BigEndian.AppendUint64(b, version)
	return s.write(conn, append(b, rest...))
}

func (s *Server) writeError(conn net.Conn, st Status, msg string) {
	_ = s.writeHeader(conn, st, 0, []byte(msg))
}

func (s *Server) write(conn net.Conn, b []byte) error {
	conn.SetWriteDeadline(time.Now().Add(s.cfg.IOTimeout))
	_, err := conn.Write(b)
	return err
}

// grow returns b resized to n bytes, reallocating only when it is too small.
func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}
