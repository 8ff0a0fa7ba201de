package peerstate

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"slices"
	"strings"
	"time"
)

// Defaults of FetcherConfig.
const (
	DefaultBusyFor   = 150 * time.Millisecond
	DefaultParallel  = 4
	DefaultPerHolder = 2
)

// ErrNoHolder is returned by Fetch when no holder could serve the version: every holder it
// knew, and every one the Directory named, failed or no longer holds it.
var ErrNoHolder = errors.New("no holder can serve the state")

// Holder is a peer that may hold the state.
type Holder struct {
	Addr string // host:port of its Server
	Host string // the host it runs on: holders on FetcherConfig.Host are tried first
}

// Directory says who holds a version: the driver, which knows every worker's committed
// version and Server address. Holders may include ones already known.
type Directory interface {
	Holders(ctx context.Context, version uint64) ([]Holder, error)
}

// FetcherConfig configures a Fetcher.
type FetcherConfig struct {
	// Secret is the job secret, the same as the holders'. Required.
	Secret []byte
	// Host is this worker's host, to prefer holders on it.
	Host string
	// Directory is asked who else holds the version when every known holder is busy or
	// has failed; nil: only the holders given to Fetch are used.
	Directory Directory
	// Parallel is how many chunks are fetched at once in all; default 4.
	Parallel int
	// PerHolder is how many of them may go to one holder; default 2.
	PerHolder int
	// BusyFor is how long a holder that answered BUSY is left alone: a fixed time, never
	// grown; default 150ms (seed 001).
	BusyFor time.Duration
	// IOTimeout bounds connecting and each read or write; default 30s.
	IOTimeout time.Duration
	// Logger receives per-holder events; nil discards them.
	Logger *slog.Logger
}

// Validate reports the first invalid field.
func (c FetcherConfig) Validate() error {
	switch {
	case len(c.Secret) == 0:
		return errors.New("peerstate fetcher: no job secret: holders would refuse every request")
	case c.Parallel < 0 || c.PerHolder < 0:
		return fmt.Errorf("peerstate fetcher: Parallel %d, PerHolder %d: must be positive (0 for the defaults %d and %d)", c.Parallel, c.PerHolder, DefaultParallel, DefaultPerHolder)
	case c.BusyFor < 0 || c.IOTimeout < 0:
		return errors.New("peerstate fetcher: BusyFor and IOTimeout must not be negative (0 for the defaults)")
	}
	return nil
}

// Fetcher pulls versions of the state from holders. It is safe for concurrent use; each
// Fetch is independent.
type Fetcher struct {
	cfg FetcherConfig
	log *slog.Logger
}

// NewFetcher returns a fetcher; zero fields of cfg take their defaults.
func NewFetcher(cfg FetcherConfig) (*Fetcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Parallel = cmp.Or(cfg.Parallel, DefaultParallel)
	cfg.PerHolder = cmp.Or(cfg.PerHolder, DefaultPerHolder)
	cfg.BusyFor = cmp.Or(cfg.BusyFor, DefaultBusyFor)
	cfg.IOTimeout = cmp.Or(cfg.IOTimeout, DefaultIOTimeout)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Fetcher{cfg: cfg, log: log}, nil
}

// FetchStats says how a fetch went.
type FetchStats struct {
	Bytes            int64          // state size
	Chunks           int            // chunks
	Busy             int            // BUSY answers received
	Failed           int            // holders dropped (dead, wrong version, denied, corrupt)
	Corrupt          int            // chunks that failed verification
	DirectoryQueries int            // times the Directory was asked
	Waits            int            // times every holder was busy and the fetch waited
	FromHolder       map[string]int // chunks received per holder address
}

// holder is the fetch's view of one holder; only the Fetch goroutine touches it.
type holder struct {
	Holder
	local     bool
	busyUntil time.Time
	failed    error
	inflight  int
	idle      []net.Conn
}

// task is one request to one holder.
type task struct {
	h     *holder
	conn  net.Conn // an idle connection to reuse, or nil to dial
	kind  Kind
	chunk int
}

type result struct {
	task
	status  Status
	held    uint64 // NO_VERSION: the holder's version
	err     error  // transport or protocol failure; the holder is dropped
	corrupt bool
	m       *manifest
}

// Fetch returns the state of the given version, pulled from holders (and from those the
// Directory names). It returns when every chunk is verified, when no holder is left
// (ErrNoHolder), or when ctx ends; it stops every transfer it started before returning.
func (f *Fetcher) Fetch(ctx context.Context, version uint64, holders []Holder) ([]byte, FetchStats, error) {
	return f.FetchInto(ctx, version, holders, nil)
}

// FetchInto is Fetch that writes the state into dst when it is large enough (returning
// dst[:size]), so that a worker can reuse the memory of its state, and allocates otherwise.
func (f *Fetcher) FetchInto(ctx context.Context, version uint64, holders []Holder, dst []byte) ([]byte, FetchStats, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	x := &fetch{
		f: f, ctx: ctx, version: version, dst: dst,
		st:      FetchStats{FromHolder: map[string]int{}},
		known:   map[string]*holder{},
		results: make(chan result, f.cfg.Parallel),
		timer:   time.NewTimer(time.Hour),
	}
	x.timer.Stop()
	defer x.close(cancel)
	x.add(holders)
	for {
		if x.m != nil && x.left == 0 {
			x.st.Bytes, x.st.Chunks = x.m.size, x.m.count()
			return x.out, x.st, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, x.st, fmt.Errorf("fetch state version %d: %w", version, err)
		}
		now := time.Now()
		x.dispatch(now)
		again, err := x.whenStuck(now)
		if err != nil {
			return nil, x.st, err
		}
		if again {
			continue
		}
		select {
		case <-ctx.Done():
		case <-x.timer.C:
		case r := <-x.results:
			x.take(r)
		}
	}
}

// fetch is one FetchInto in progress. Only FetchInto's goroutine touches it; the transfers run
// on goroutines of their own (inflight of them) and report on results.
type fetch struct {
	f       *Fetcher
	ctx     context.Context
	version uint64
	dst     []byte
	st      FetchStats

	known map[string]*holder
	order []*holder // shuffled once, so that joiners spread over equal holders

	m                *manifest
	out              []byte
	pending          []int // chunks to fetch
	left             int   // chunks not yet verified
	inflight         int
	manifestInFlight bool
	asked            time.Time // last Directory query
	results          chan result
	timer            *time.Timer
}

// add learns holders not known yet and returns how many.
func (x *fetch) add(hs []Holder) int {
	added := 0
	for _, i := range mrand.Perm(len(hs)) {
		if hs[i].Addr == "" || x.known[hs[i].Addr] != nil {
			continue
		}
		h := &holder{Holder: hs[i], local: x.f.cfg.Host != "" && hs[i].Host == x.f.cfg.Host}
		x.known[h.Addr] = h
		x.order = append(x.order, h)
		added++
	}
	return added
}

// close stops the transfers still running, waits for them, and closes every connection.
func (x *fetch) close(cancel context.CancelFunc) {
	x.timer.Stop()
	cancel()
	for ; x.inflight > 0; x.inflight-- {
		if r := <-x.results; r.conn != nil {
			r.conn.Close()
		}
	}
	for _, h := range x.order {
		for _, c := range h.idle {
			c.Close()
		}
	}
}

// pick returns the best holder that can take a request now, or nil.
func (x *fetch) pick(now time.Time) *holder {
	var best *holder
	for _, h := range x.order {
		if h.failed != nil || h.busyUntil.After(now) || h.inflight >= x.f.cfg.PerHolder {
			continue
		}
		if best == nil || (h.local && !best.local) || (h.local == best.local && h.inflight < best.inflight) {
			best = h
		}
	}
	return best
}

// available reports whether some holder is neither busy nor failed.
func (x *fetch) available(now time.Time) bool {
	return slices.ContainsFunc(x.order, func(h *holder) bool { return h.failed == nil && !h.busyUntil.After(now) })
}

func (x *fetch) start(t task) {
	t.h.inflight++
	x.inflight++
	if n := len(t.h.idle); n > 0 {
		t.conn, t.h.idle = t.h.idle[n-1], t.h.idle[:n-1]
	}
	f, ctx, version, m, out := x.f, x.ctx, x.version, x.m, x.out
	go func() { x.results <- f.do(ctx, version, t, m, out) }()
}

// dispatch hands out work to holders that can take it: the manifest first, then the chunks.
func (x *fetch) dispatch(now time.Time) {
	for x.inflight < x.f.cfg.Parallel {
		if x.m == nil && x.manifestInFlight || x.m != nil && len(x.pending) == 0 {
			return
		}
		h := x.pick(now)
		if h == nil {
			return
		}
		if x.m == nil {
			x.manifestInFlight = true
			x.start(task{h: h, kind: KindManifest})
			continue
		}
		c := x.pending[0]
		x.pending = x.pending[1:]
		x.start(task{h: h, kind: KindChunk, chunk: c})
	}
}

// whenStuck handles work waiting while every known holder is busy or failed: it asks the
// Directory who else holds the version (once per BusyFor; again reports that it named new
// holders), else sets the timer for the first busy holder to be free, or fails when none is
// left and nothing is in flight.
func (x *fetch) whenStuck(now time.Time) (again bool, err error) {
	waiting := (x.m == nil && !x.manifestInFlight) || len(x.pending) > 0
	if !waiting || x.available(now) {
		return false, nil
	}
	f := x.f
	if f.cfg.Directory != nil && (x.asked.IsZero() || now.Sub(x.asked) >= f.cfg.BusyFor) {
		x.asked = now
		x.st.DirectoryQueries++
		hs, err := f.cfg.Directory.Holders(x.ctx, x.version)
		if err != nil {
			if x.ctx.Err() != nil {
				return true, nil
			}
			f.log.Warn("peerstate: directory query failed", "version", x.version, "err", err)
		}
		if x.add(hs) > 0 {
			return true, nil
		}
	}
	next := time.Time{}
	for _, h := range x.order {
		if h.failed == nil && (next.IsZero() || h.busyUntil.Before(next)) {
			next = h.busyUntil
		}
	}
	if next.IsZero() && x.inflight == 0 {
		return false, f.noHolder(x.version, x.order)
	}
	if !next.IsZero() {
		x.st.Waits++
		x.timer.Reset(next.Sub(now))
	}
	return false, nil
}

// take records a transfer's result: a failed or stale holder is dropped and its chunk asked
// of another, a busy one rests for BusyFor, the manifest sizes the output, a chunk counts.
func (x *fetch) take(r result) {
	x.inflight--
	r.h.inflight--
	if r.kind == KindManifest {
		x.manifestInFlight = false
	}
	switch {
	case r.err != nil:
		if r.conn != nil {
			r.conn.Close()
		}
		if x.ctx.Err() != nil {
			return
		}
		if r.corrupt {
			x.st.Corrupt++
		}
		x.st.Failed++
		r.h.failed = r.err
		x.f.log.Warn("peerstate: dropping a holder", "holder", r.h.Addr, "version", x.version, "err", r.err)
		if r.kind == KindChunk {
			x.pending = append(x.pending, r.chunk)
		}
		return
	case r.status == StatusBusy:
		x.st.Busy++
		r.h.busyUntil = time.Now().Add(x.f.cfg.BusyFor)
		if r.kind == KindChunk {
			x.pending = append([]int{r.chunk}, x.pending...)
		}
	case r.status == StatusNoVersion:
		x.st.Failed++
		r.h.failed = fmt.Errorf("holds version %d, not %d", r.held, x.version)
		if r.kind == KindChunk {
			x.pending = append(x.pending, r.chunk)
		}
	case r.kind == KindManifest:
		if x.m == nil {
			x.m = r.m
			if int64(cap(x.dst)) >= x.m.size {
				x.out = x.dst[:x.m.size]
			} else {
				x.out = make([]byte, x.m.size)
			}
			x.left = x.m.count()
			x.pending = make([]int, x.left)
			for i := range x.pending {
				x.pending[i] = i
			}
		}
	default:
		x.left--
		x.st.FromHolder[r.h.Addr]++
	}
	r.h.idle = append(r.h.idle, r.conn)
}

func (f *Fetcher) noHolder(version uint64, order []*holder) error {
	if len(order) == 0 {
		return fmt.Errorf("fetch state version %d: %w: none is known and the directory named none", version, ErrNoHolder)
	}
	var why []string
	for _, h := range order {
		why = append(why, fmt.Sprintf("%s: %v", h.Addr, h.failed))
	}
	return fmt.Errorf("fetch state version %d: %w: %s; fall back to a broadcast from rank 0", version, ErrNoHolder, strings.Join(why, "; "))
}

// do runs one request on its own goroutine. It only writes out's bytes of its chunk.
func (f *Fetcher) do(ctx context.Context, version uint64, t task, m *manifest, out []byte) (r result) {
	r.task = t
	if r.conn == nil {
		d := net.Dialer{Timeout: f.cfg.IOTimeout}
		c, err := d.DialContext(ctx, "tcp", t.h.Addr)
		if err != nil {
			r.err = fmt.Errorf("connect: %w", err)
			return r
		}
		r.conn = c
	}
	conn := r.conn
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	deadline := func() { conn.SetDeadline(time.Now().Add(f.cfg.IOTimeout)) }

	req := request{kind: t.kind, version: version, chunk: uint32(t.chunk)}
	rand.Read(req.nonce[:])
	deadline()
	if _, err := conn.Write(appendRequest(nil, f.cfg.Secret, req)); err != nil {
		r.err = fmt.Errorf("send %s request: %w", t.kind, err)
		return r
	}
	body, err := readFrame(conn, nil)
	if err != nil {
		r.err = fmt.Errorf("read %s reply: %w", t.kind, err)
		return r
	}
	if len(body) < 9 {
		r.err = fmt.Errorf("%s reply of %d bytes is too short", t.kind, len(body))
		return r
	}
	r.status, r.held = Status(body[0]), binary.BigEndian.Uint64(body[1:])
	switch r.status {
	case StatusBusy, StatusNoVersion:
		return r
	case StatusOK:
	default:
		r.err = fmt.Errorf("holder answered %v: %s", r.status, body[9:])
		return r
	}
	if r.held != version {
		r.err = fmt.Errorf("%s reply for version %d, asked for %d", t.kind, r.held, version)
		return r
	}
	if t.kind == KindManifest {
		if r.m, r.err = parseManifest(f.cfg.Secret, req.nonce, body); r.err == nil && r.m.version != version {
			r.err = fmt.Errorf("manifest for version %d, asked for %d", r.m.version, version)
		}
		return r
	}
	off, end := m.span(t.chunk)
	if len(body) != 17 || binary.BigEndian.Uint32(body[9:]) != uint32(t.chunk) || int64(binary.BigEndian.Uint32(body[13:])) != end-off {
		r.err = fmt.Errorf("reply for chunk %d does not match the request", t.chunk)
		return r
	}
	dst := out[off:end]
	sum := uint32(0)
	for p := 0; p < len(dst); p += piece {
		deadline()
		b := dst[p:min(p+piece, len(dst))]
		if _, err := io.ReadFull(conn, b); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			r.err = fmt.Errorf("read chunk %d: %w", t.chunk, err)
			return r
		}
		sum = crc32.Update(sum, castagnoli, b) // while the piece is still in cache
	}
	if sum != m.sums[t.chunk] {
		r.err, r.corrupt = fmt.Errorf("chunk %d failed verification against the manifest (CRC-32C)", t.chunk), true
	}
	return r
}
