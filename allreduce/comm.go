package allreduce

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Config describes one rank of one generation.
type Config struct {
	Rank, Size int
	Generation uint64
	// Store is where ranks publish and find each other's addresses.
	Store Store
	// ListenAddr is the local address to listen on; default "127.0.0.1:0".
	ListenAddr string
	// AdvertiseHost is the host peers dial; default: the host of ListenAddr, which must then
	// be a specific address rather than 0.0.0.0 or [::].
	AdvertiseHost string
	// Timeout bounds every wait on a peer: connection setup, and how long an operation waits
	// for the next chunk before declaring the peer lost (a hung process). Default 30s.
	Timeout time.Duration
	// ChunkBytes is the pipelining unit of the ring; default 1 MiB.
	ChunkBytes int
	// SmallBytes is the largest message reduced by recursive doubling instead of the ring;
	// default 64 KiB.
	SmallBytes int
	// DirectBytes is the smallest allreduce that ranks which all share one host reduce by
	// reading each other's buffers (process_vm_readv, docs/protocol.md §1.8): one copy per
	// byte instead of two through the shared-memory rings. 0: decided per machine (from
	// 2 MiB where the kernel's copies between processes measure fast enough; see
	// ELASTICD_SHM_DIRECT); -1: never. Worlds of 2 to 4 ranks only (every rank connected to
	// every other); ranks that differ take the largest, and any rank that cannot read its
	// peers' memory (Yama ptrace_scope, a seccomp filter such as Docker's default, another
	// PID namespace), or will not, keeps the whole world on the rings. Stats.DirectFrom says
	// what was agreed.
	DirectBytes int
	// Secret, when set, authenticates connections between ranks (HMAC-SHA256 of the hello).
	Secret []byte
	// Transport is TransportAuto ("" too): shared memory with peers on the same machine,
	// TCP with the others; or TransportTCP: TCP with every peer.
	Transport string
	// TCPSendBuffer is the send buffer (SO_SNDBUF) of the TCP connections that carry data.
	// 0, the default: vethSendBuffer where a connection runs over a veth interface (network
	// namespaces, containers, pods on one node) and its congestion control is BBR: there a
	// flow's segments leave from several CPUs and arrive out of order, and BBR then keeps
	// far more in flight than the veth moves and retransmits thousands of segments that were
	// not lost (docs/design-notes/allreduce-tuning.md §10); the kernel's autotuning elsewhere, under CUBIC or
	// Reno on veth too, where the bound made allreduces slower (§21.2), and on real links,
	// whose round trip needs larger windows. Negative: the kernel's autotuning everywhere.
	// Positive: this size on every TCP data connection (the kernel doubles it for its
	// bookkeeping).
	TCPSendBuffer int
	// HostID names the host this rank runs on; it defaults to the kernel's boot ID and the
	// network namespace. Ranks with equal HostID may use shared memory with each other, and
	// a world whose hosts hold several ranks each reduces hierarchically (docs/protocol.md
	// §1.7). Tests set it per rank to make ranks of one machine look like separate hosts.
	// With Transport TCP it is not published: the rank counts as a host of its own.
	HostID string
	// Logger receives connection-level events; nil discards them.
	Logger *slog.Logger

	// ID is this member's identity across generations (a worker ID such as "host/slot"),
	// published with its address. Ranks change from one generation to the next; IDs do not,
	// so they tell which connections of Previous link the same two members again. Empty: no
	// reuse, and New behaves exactly as without it.
	ID string
	// Previous is this member's communicator of the generation it is leaving, or nil. When ID
	// is set, New carries over Previous's healthy connections to members that are neighbours
	// again and agree to it (docs/protocol.md §1.2); the others are dialed fresh. New retires
	// a healthy Previous of the same ID (its collectives fail with ErrClosed from then on) and
	// owns the connections it carries over, even if New fails; the caller still closes
	// Previous after New returns, which closes only what was not carried over. Previous must
	// be idle: one in a collective, failed or closed carries nothing over.
	Previous *Comm
}

const (
	defaultTimeout    = 30 * time.Second
	defaultChunkBytes = 1 << 20
	defaultSmallBytes = 64 << 10
)

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Size < 1:
		return fmt.Errorf("allreduce config: Size %d: must be at least 1", c.Size)
	case c.Rank < 0 || c.Rank >= c.Size:
		return fmt.Errorf("allreduce config: Rank %d: must be in [0, %d)", c.Rank, c.Size)
	case c.Store == nil && c.Size > 1:
		return errors.New("allreduce config: Store is nil: ranks need a rendezvous store to find each other")
	case c.Timeout < 0:
		return fmt.Errorf("allreduce config: Timeout %v: must not be negative", c.Timeout)
	case c.ChunkBytes < 0 || (c.ChunkBytes > 0 && c.ChunkBytes < 64):
		return fmt.Errorf("allreduce config: ChunkBytes %d: must be at least 64 (0 for the default)", c.ChunkBytes)
	case c.ChunkBytes > 64<<20:
		return fmt.Errorf("allreduce config: ChunkBytes %d: must be at most 64 MiB", c.ChunkBytes)
	case c.TCPSendBuffer > 64<<20:
		return fmt.Errorf("allreduce config: TCPSendBuffer %d: must be at most 64 MiB (0: the default, negative: the kernel's)", c.TCPSendBuffer)
	case c.SmallBytes < 0:
		return fmt.Errorf("allreduce config: SmallBytes %d: must not be negative", c.SmallBytes)
	case c.DirectBytes < -1:
		return fmt.Errorf("allreduce config: DirectBytes %d: must be at least 0, or -1 for never", c.DirectBytes)
	case c.Transport != "" && c.Transport != TransportAuto && c.Transport != TransportTCP:
		return fmt.Errorf("allreduce config: Transport %q: must be %q or %q", c.Transport, TransportAuto, TransportTCP)
	case len(c.HostID) > maxHostID:
		return fmt.Errorf("allreduce config: HostID of %d bytes: must be at most %d", len(c.HostID), maxHostID)
	case c.Previous != nil && c.Previous.cfg.Generation >= c.Generation:
		return fmt.Errorf("allreduce config: Previous is generation %d: must be earlier than Generation %d", c.Previous.cfg.Generation, c.Generation)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.ListenAddr == "" {
		c.ListenAddr = "127.0.0.1:0"
	}
	if c.Timeout == 0 {
		c.Timeout = defaultTimeout
	}
	if c.ChunkBytes == 0 {
		c.ChunkBytes = defaultChunkBytes
	}
	c.ChunkBytes &^= 7 // whole elements of every dtype
	if c.SmallBytes == 0 {
		c.SmallBytes = defaultSmallBytes
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.HostID == "" {
		c.HostID = hostID()
	}
	return c
}

// Comm is one rank's communicator for one generation. Its operations must be called in the
// same order on every rank; they are serialised, so concurrent calls wait for each other.
type Comm struct {
	cfg   Config
	log   *slog.Logger
	peers []*peer // indexed by rank; nil for ranks this rank has no connection to
	addr  string
	topo  topology // which ranks share a host; set by New before it connects
	nb    []int    // the ranks New connects to (neighbours, and topo's partners)

	opMu    sync.Mutex // serialises operations
	seq     uint64     // guarded by opMu
	scratch []byte     // guarded by opMu
	units   []unit     // unitLists' storage; guarded by opMu
	tcp     *tcpCall   // tcpStream's, reused (tcpstream_linux.go); guarded by opMu
	cur     opInfo     // the running collective phase (nextOp); guarded by opMu
	// do's context watch (ctxDone), guarded by opMu: the Done channel it watches and the
	// AfterFunc's stop.
	watchDone <-chan struct{}
	watchStop func() bool

	stats   Stats       // set by New
	ntOn    atomic.Bool // this collective's Stats.NonTemporal (nextOp), read by every shmLink.write
	shmOnce sync.Once
	// directOnce logs why a peer's memory cannot be read; direct is directAllreduce's
	// storage (guarded by opMu), directOps how many allreduces took that path.
	directOnce sync.Once
	direct     directState
	directOps  atomic.Uint64
	hierOps    atomic.Uint64 // allreduces that took the hierarchical path

	mu      sync.Mutex // guards the fields below, and peers once New has returned
	cause   error      // why the running operation was interrupted (ctx, Close)
	err     error      // sticky failure
	closed  bool
	retired bool            // a later generation's New took connections from peers
	opDone  <-chan struct{} // Done of the running operation's context; nil between operations
	wakeFd  int             // tcpStream's wake-up eventfd plus one; 0: none yet (tcpstream_linux.go)
}

// Stats says how a communicator's connections were made.
type Stats struct {
	Reused int // carried over from Config.Previous
	Fresh  int // dialed or accepted by New
	// SharedMemory counts the peers whose data goes through shared memory (same machine).
	SharedMemory int
	// Hosts is how many hosts the world spans (ranks grouped by Config.HostID) and
	// HostRanks how many ranks share this rank's host, itself included.
	Hosts, HostRanks int
	// TCPSendBuffers counts the TCP peers whose send buffer this rank set
	// (Config.TCPSendBuffer): on veth under BBR, by default.
	TCPSendBuffers int
	// NonTemporalFrom is the smallest collective whose copies into shared memory use
	// non-temporal stores (NonTemporal); -1: none (no shared memory, the CPU lacks them, or
	// ELASTICD_SHM_NONTEMPORAL=0); docs/protocol.md §1.6.
	NonTemporalFrom int64
	// Hierarchical counts the allreduces so far that reduced inside each host first and
	// across hosts second (docs/protocol.md §1.7), rather than over one flat ring.
	Hierarchical uint64
	// DirectFrom is the smallest allreduce that reads the peers' buffers directly instead of
	// passing them through the shared-memory rings (Direct; Config.DirectBytes,
	// ELASTICD_SHM_DIRECT, docs/protocol.md §1.8); -1: none (ranks on more than one host or
	// more than 4, a peer's memory this process may not read, or the machine's measure says
	// the rings are faster). Every rank of the world has the same.
	DirectFrom int64
	// DirectAllreduces counts the allreduces so far that read the peers' buffers directly.
	DirectAllreduces uint64
}

// Direct says whether an allreduce of size bytes reads the peers' buffers directly.
func (s Stats) Direct(size int64) bool {
	return s.DirectFrom >= 0 && size >= s.DirectFrom
}

// NonTemporal says whether a collective phase of size bytes (an allreduce's or broadcast's
// buffer, an allgather's whole result) copies into shared memory with non-temporal stores.
func (s Stats) NonTemporal(size int64) bool {
	return s.NonTemporalFrom >= 0 && size >= s.NonTemporalFrom
}

type peer struct {
	rank   int
	addr   string
	id     string // the member's Config.ID; "" when it has none or this rank has none
	reused bool   // carried over from the previous generation
	conn   *net.TCPConn
	rc     syscall.RawConn // conn's, for tcpStream; nil until it first runs; guarded by opMu
	shm    *shmLink        // data path when the peer is on this machine; nil: data over conn
	whdr   [headerLen]byte // used only by the one goroutine writing to this peer
	wframe [3][]byte       // shmSender's frame (header, payload, padding); that goroutine's too
	rhdr   [headerLen]byte // used only by the one goroutine reading from this peer
	broken bool            // a write stopped mid-frame: no further frame may be sent
	// pid is the peer's process, and direct whether this rank may read its memory (the
	// lower rank of a pair knows both ways): directAllreduce's condition.
	pid    int
	direct bool
	probe  []byte // what the peer reads of this process in the handshake: kept alive here
}

func addrKey(gen uint64, rank int) string {
	return fmt.Sprintf("allreduce/g%d/addr/%d", gen, rank)
}

func abandonKey(gen uint64) string { return fmt.Sprintf("allreduce/g%d/abandoned", gen) }

// Abandon records in the store that generation gen is over, so that ranks still building
// their communicator for it (New) stop waiting for peers at once, with an error wrapping
// ErrPeerLost, instead of after Config.Timeout. A rank leaving a generation to reset calls it.
func Abandon(ctx context.Context, store Store, gen uint64, reason string) error {
	return store.Set(ctx, abandonKey(gen), []byte(reason))
}

// New builds the communicator: it listens, publishes its address under a key scoped by the
// generation, and connects to its peers (the higher rank of each pair dials). It returns when
// every connection is up, or with an error when ctx ends or Config.Timeout passes first; the
// latter wraps ErrPeerLost and ErrPeerSilent (a peer that never came).
func New(ctx context.Context, cfg Config) (*Comm, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	c := &Comm{
		cfg:   cfg,
		log:   cfg.Logger.With("rank", cfg.Rank, "generation", cfg.Generation),
		peers: make([]*peer, cfg.Size),
	}
	if cfg.Size == 1 {
		c.stats.Hosts, c.stats.HostRanks = 1, 1
		return c, nil
	}
	ln, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("allreduce: listen on %s: %w", cfg.ListenAddr, err)
	}
	host := cfg.AdvertiseHost
	if host == "" {
		h, _, _ := net.SplitHostPort(cfg.ListenAddr)
		if ip := net.ParseIP(h); h == "" || (ip != nil && ip.IsUnspecified()) {
			ln.Close()
			return nil, fmt.Errorf("allreduce: listening on %s, all interfaces: set AdvertiseHost to the address peers should dial", cfg.ListenAddr)
		}
		host = h
	}
	c.addr = net.JoinHostPort(host, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))

	parent := ctx
	ctx, cancel := context.WithTimeoutCause(ctx, cfg.Timeout, formationTimeout{cfg.Timeout})
	defer cancel()
	ctx, abandoned := context.WithCancelCause(ctx)
	defer abandoned(nil)
	go func() { // a generation given up by any rank ends the wait for its peers at once
		if v, err := cfg.Store.Get(ctx, abandonKey(cfg.Generation)); err == nil {
			abandoned(fmt.Errorf("generation %d was abandoned (%s): %w", cfg.Generation, v, ErrPeerLost))
		}
	}()
	self := record{Addr: c.addr}
	if cfg.Transport != TransportTCP {
		self.Host = cfg.HostID
	}
	var cands map[string]*handover
	if cfg.ID != "" {
		self.ID = cfg.ID
		cands = cfg.Previous.handOver(cfg.ID)
		defer cfg.Previous.takeBack(cands)
		for id, h := range cands {
			self.Prev = h.prevGen
			self.Keep = append(self.Keep, id)
		}
		slices.Sort(self.Keep)
	}
	if err := cfg.Store.Set(ctx, addrKey(cfg.Generation, cfg.Rank), self.encode()); err != nil {
		ln.Close()
		if ctx.Err() != nil { // say why the wait ended: abandoned (a peer lost), or timed out
			err = fmt.Errorf("%v: %w", err, context.Cause(ctx))
		}
		return nil, fmt.Errorf("allreduce: publish address: %w", err)
	}
	err = c.connect(ctx, parent, ln, self, cands)
	if err == nil {
		err = c.setupShm(ctx)
	}
	if err == nil {
		c.tuneTCP()
		c.chooseNT()
	}
	if err != nil {
		c.closeConns()
		return nil, fmt.Errorf("allreduce: rank %d of %d, generation %d: %w", cfg.Rank, cfg.Size, cfg.Generation, err)
	}
	c.log.Debug("communicator ready", "addr", c.addr, "peers", c.peerRanks(), "reused", c.stats.Reused, "fresh", c.stats.Fresh, "shm", c.stats.SharedMemory)
	return c, nil
}

// vethSendBuffer is Config.TCPSendBuffer's default on veth under BBR: with it, 2 ranks in
// network namespaces joined by veth reduced 1 MB in 0.41-0.60 ms instead of 1.07-1.11 ms and
// 16 MB in 6.9-8.2 ms instead of 15.5-16.1 ms, retransmitting ~1 % as many segments
// (docs/design-notes/allreduce-tuning.md §10); 64 and 128 KiB did no better, 512 KiB as badly as the kernel's
// autotuning. Both ends are one machine, whose round trip is tens of microseconds: the
// window it allows (twice this, as the kernel counts) exceeds what a veth moves in one.
const vethSendBuffer = 256 << 10

// boundOnVeth reports whether a connection over veth whose congestion control is cc (as
// TCP_CONGESTION names it) gets vethSendBuffer by default: BBR and its successors, which
// pace by a bandwidth model that the veth's reordering misleads. Under CUBIC and Reno the
// kernel's autotuning was faster, side by side: 1 MB 1.07-1.17x, 16 MB 1.13x, 4 KB the same
// (docs/design-notes/allreduce-tuning.md §13.2).
func boundOnVeth(cc string) bool { return strings.HasPrefix(cc, "bbr") }

// tuneTCP sets the send buffer of the data connections that stayed on TCP, as
// Config.TCPSendBuffer says.
func (c *Comm) tuneTCP() {
	var veth []net.IP // this namespace's veth addresses, listed once, for the default
	listed := false
	for _, p := range c.peers {
		if p == nil || p.shm != nil {
			continue
		}
		size := c.cfg.TCPSendBuffer
		if size == 0 {
			if !listed {
				veth, listed = vethAddrs(), true
			}
			if la, ok := p.conn.LocalAddr().(*net.TCPAddr); ok && slices.ContainsFunc(veth, la.IP.Equal) {
				if cc := congestionControl(p); boundOnVeth(cc) {
					size = vethSendBuffer
				} else {
					c.log.Debug("send buffer left to the kernel on veth", "peer", p.rank, "congestion_control", cc)
				}
			}
		}
		if size <= 0 {
			continue
		}
		if err := p.conn.SetWriteBuffer(size); err != nil {
			c.log.Debug("send buffer not set", "peer", p.rank, "err", err)
			continue
		}
		c.stats.TCPSendBuffers++
	}
}

// neighbours lists the ranks that rank r exchanges data with: its ring neighbours and its
// recursive-doubling partners. The relation is symmetric.
func neighbours(r, n int) []int {
	if n < 2 {
		return nil
	}
	set := map[int]bool{(r + 1) % n: true, (r + n - 1) % n: true}
	p := pow2Floor(n)
	if r >= p {
		set[r-p] = true
	} else {
		if r+p < n {
			set[r+p] = true
		}
		for k := 1; k < p; k <<= 1 {
			set[r^k] = true
		}
	}
	var out []int
	for q := range n {
		if set[q] {
			out = append(out, q)
		}
	}
	return out
}

func pow2Floor(n int) int {
	p := 1
	for p*2 <= n {
		p *= 2
	}
	return p
}

func (c *Comm) peerRanks() []int {
	var rs []int
	for _, p := range c.peers {
		if p != nil {
			rs = append(rs, p.rank)
		}
	}
	return rs
}

// connect learns the hosts, which decide the neighbours, then accepts the higher-ranked
// neighbours and dials the lower-ranked ones, except where both sides of a pair agree to
// carry over their connection from the previous generation (self is what this rank
// published, cands what it can carry over). It accepts from the start, so that strangers
// are refused while the hosts are still being learnt.
//
// When it fails, the hosts of the neighbours it lacks that published their address are
// probed (under parent, which outlives ctx): an error naming those that did not answer is an
// UnreachableError, which the driver weighs to find the hosts a network cut sets apart.
func (c *Comm) connect(ctx, parent context.Context, ln net.Listener, self record, cands map[string]*handover) error {
	reuse := self.ID != ""
	ctx, cancel := context.WithCancel(ctx)
	k := newConnector(ctx, c)
	k.wg.Go(func() { k.acceptLoop(ln) })
	nb, err := k.learnNeighbours(self)
	if err != nil {
		cancel()
		ln.Close()
		k.closePending()
		k.wg.Wait()
		return err
	}
	for _, q := range nb {
		if q > c.cfg.Rank && !reuse {
			// It dials this rank, and there is nothing to agree on; its address is learnt
			// only to probe its host should it never come.
			k.wg.Go(func() {
				if rec, err := c.lookup(k.ctx, q); err == nil {
					k.learnt(q, rec.Addr)
				}
			})
			continue
		}
		k.wg.Go(func() { k.reach(q, self, cands, reuse) })
	}
	needIDs := 0
	if reuse {
		needIDs = len(nb)
	}
	peerIDs, err := k.collect(len(nb), needIDs)
	// Stop the accept loop, the dialers and the hellos in progress, and wait for them all.
	cancel()
	ln.Close()
	k.closePending()
	k.wg.Wait()
	for _, p := range c.peers {
		if p == nil {
			continue
		}
		p.id = peerIDs[p.rank]
		if p.reused {
			c.stats.Reused++
		} else {
			c.stats.Fresh++
		}
	}
	if err != nil && parent.Err() == nil {
		addrs := map[int]string{}
		for _, q := range c.missing() {
			if a := k.addrs[q]; a != "" {
				addrs[q] = a
			}
		}
		if ranks := probeHosts(parent, addrs, c.probeTimeout()); len(ranks) > 0 {
			var reached []int // the neighbours connected, and those whose hosts answered
			for _, q := range c.nb {
				if !slices.Contains(ranks, q) && (c.peers[q] != nil || addrs[q] != "") {
					reached = append(reached, q)
				}
			}
			err = &UnreachableError{Ranks: ranks, Reached: reached, Err: err}
		}
	}
	return err
}

// connector is one connect in progress: the goroutines that accept, dial and say hello (wg
// owns them), and the channels they report on.
type connector struct {
	c      *Comm
	ctx    context.Context
	known  chan struct{} // closed once the neighbours are known; accept is set before
	accept map[int]bool  // the ranks that dial this one
	got    chan *peer
	errc   chan error
	ids    chan namedRank
	wg     sync.WaitGroup

	mu      sync.Mutex
	pending map[net.Conn]bool // accepted connections still in their hello
	refused error             // the last hello refused
	addrs   map[int]string    // the neighbours' published addresses, as learnt
}

// learnt records neighbour q's published address.
func (k *connector) learnt(q int, addr string) {
	k.mu.Lock()
	k.addrs[q] = addr
	k.mu.Unlock()
}

// namedRank is a neighbour's ID, as it published it.
type namedRank struct {
	rank int
	id   string
}

func newConnector(ctx context.Context, c *Comm) *connector {
	return &connector{
		c: c, ctx: ctx, known: make(chan struct{}), accept: map[int]bool{},
		got: make(chan *peer), pending: map[net.Conn]bool{}, addrs: map[int]string{},
	}
}

// learnNeighbours learns the hosts (docs/protocol.md §1.7) and from them the neighbours,
// and lets the hellos waiting for them go on.
func (k *connector) learnNeighbours(self record) ([]int, error) {
	c := k.c
	t, err := c.learnHosts(k.ctx, self)
	if err != nil {
		if k.ctx.Err() != nil { // as in ended: say why the wait ended, and wrap it
			err = fmt.Errorf("%v: %w", err, context.Cause(k.ctx))
		}
		return nil, err
	}
	c.topo, c.nb = t, t.neighbours(c.cfg.Rank)
	c.stats.Hosts, c.stats.HostRanks = len(t.hosts), len(t.hosts[t.host[c.cfg.Rank]])
	k.errc, k.ids = make(chan error, len(c.nb)), make(chan namedRank, len(c.nb))
	for _, q := range c.nb {
		if q > c.cfg.Rank {
			k.accept[q] = true
		}
	}
	close(k.known)
	return c.nb, nil
}

// dials checks that rank r is one that dials this rank; a rank of this world above this
// one waits until the neighbours are known.
func (k *connector) dials(r int) error {
	c := k.c
	if r > c.cfg.Rank && r < c.cfg.Size {
		select {
		case <-k.known:
		case <-k.ctx.Done():
			return fmt.Errorf("hello from rank %d: %w", r, context.Cause(k.ctx))
		}
		if k.accept[r] {
			return nil
		}
	}
	return fmt.Errorf("hello from rank %d, which does not dial rank %d", r, c.cfg.Rank)
}

// offer hands a connected peer to collect, or closes it once connect is over.
func (k *connector) offer(p *peer) {
	select {
	case k.got <- p:
	case <-k.ctx.Done():
		p.conn.Close()
	}
}

// acceptLoop takes connections until ln is closed, each to its hello.
func (k *connector) acceptLoop(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		k.mu.Lock()
		k.pending[conn] = true
		k.mu.Unlock()
		k.wg.Go(func() { k.hello(conn) })
	}
}

// hello checks an accepted connection's hello and offers its peer; a stranger or a rank of
// another generation is told why, and the wait goes on.
func (k *connector) hello(conn net.Conn) {
	p, err := k.c.acceptHello(conn.(*net.TCPConn), k.dials)
	k.mu.Lock()
	delete(k.pending, conn)
	if errors.Is(err, errEmptyHello) { // a peer probing this host (probeHosts), not a peer
		k.mu.Unlock()
		conn.Close()
		return
	}
	if err != nil {
		k.refused = fmt.Errorf("refused %s: %w", conn.RemoteAddr(), err)
	}
	k.mu.Unlock()
	if err != nil {
		k.c.log.Warn("refused connection", "remote", conn.RemoteAddr().String(), "err", err)
		refuse(conn, k.c.cfg.Rank, err)
		return
	}
	k.offer(p)
}

// reach looks neighbour q up and connects to it: over the connection both carry over when
// they agree to, else by dialing it when it ranks lower (a higher one dials this rank). With
// reuse, q's published ID is reported too.
func (k *connector) reach(q int, self record, cands map[string]*handover, reuse bool) {
	c := k.c
	rec, err := c.lookup(k.ctx, q)
	if err != nil {
		k.errc <- err
		return
	}
	k.learnt(q, rec.Addr)
	if reuse {
		k.ids <- namedRank{q, rec.ID}
	}
	if h := agree(self, rec, cands); h != nil {
		p, err := c.rehello(k.ctx, q, rec.Addr, h)
		if err != nil {
			k.errc <- err
			return
		}
		k.offer(p) // its id is set from ids, as every peer's
		return
	}
	if q > c.cfg.Rank {
		return // it dials this rank
	}
	p, err := c.dial(k.ctx, q, rec.Addr)
	if err != nil {
		k.errc <- err
		return
	}
	k.offer(p)
}

// collect takes need peers and needIDs neighbour IDs, or the first error, or the end of the
// context, and returns the IDs by rank.
func (k *connector) collect(need, needIDs int) ([]string, error) {
	c := k.c
	peerIDs := make([]string, c.cfg.Size)
	var err error
	for (need > 0 || needIDs > 0) && err == nil {
		select {
		case p := <-k.got:
			if c.peers[p.rank] != nil {
				p.conn.Close()
				err = fmt.Errorf("two connections claim rank %d", p.rank)
				continue
			}
			c.peers[p.rank] = p
			need--
		case n := <-k.ids:
			peerIDs[n.rank] = n.id
			needIDs--
		case err = <-k.errc:
			if k.ctx.Err() != nil { // the error is the end of the wait, not its reason
				err = k.ended()
			}
		case <-k.ctx.Done():
			err = k.ended()
		}
	}
	return peerIDs, err
}

// ended is the error once the context has ended: what is missing and why. A peer that was
// refused (wrong secret, generation or world size) is the likely reason; say so here too, not
// only in the peer's error.
func (k *connector) ended() error {
	err := fmt.Errorf("waiting for peers %v: %w", k.c.missing(), context.Cause(k.ctx))
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.refused != nil {
		err = fmt.Errorf("%w (last connection %v)", err, k.refused)
	}
	return err
}

// closePending ends the hellos in progress.
func (k *connector) closePending() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for conn := range k.pending {
		conn.Close()
	}
}

// missing lists the neighbours not connected yet.
func (c *Comm) missing() []int {
	var rs []int
	for _, q := range c.nb {
		if c.peers[q] == nil {
			rs = append(rs, q)
		}
	}
	return rs
}

func (c *Comm) helloHeader(rank int) header {
	h := header{kind: kindHello, gen: c.cfg.Generation, total: uint64(c.cfg.Size), unit: uint32(rank)}
	if len(c.cfg.Secret) > 0 {
		h.length = sha256.Size
	}
	return h
}

func (c *Comm) mac(hdr []byte) []byte {
	m := hmac.New(sha256.New, c.cfg.Secret)
	m.Write(hdr)
	return m.Sum(nil)
}

func (c *Comm) writeHello(conn net.Conn) error {
	var b [headerLen]byte
	h := c.helloHeader(c.cfg.Rank)
	h.put(b[:])
	msg := b[:]
	if len(c.cfg.Secret) > 0 {
		msg = append(msg, c.mac(b[:])...)
	}
	_, err := conn.Write(msg)
	return err
}

// errEmptyHello is a connection closed before the first byte of its hello.
var errEmptyHello = errors.New("closed before its hello (a probe?)")

// readHello reads a peer's hello and checks generation, world size, MAC, and that the
// claimed rank passes ok.
func (c *Comm) readHello(conn net.Conn, ok func(rank int) error) (int, error) {
	var b [headerLen]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		if err == io.EOF {
			err = errEmptyHello
		}
		return 0, fmt.Errorf("read hello: %w", err)
	}
	h, err := parseHeader(b[:])
	if err != nil {
		return 0, fmt.Errorf("hello: %w", err)
	}
	if h.kind == kindAbort && h.length <= maxAbortLen {
		reason := make([]byte, h.length)
		io.ReadFull(conn, reason)
		return 0, fmt.Errorf("rank %d refused the connection: %s", h.unit, reason)
	}
	want := c.helloHeader(int(h.unit))
	switch {
	case h.kind != kindHello:
		return 0, fmt.Errorf("hello: got frame kind %d", h.kind)
	case h.gen != want.gen:
		return 0, fmt.Errorf("hello from generation %d, this is generation %d", h.gen, want.gen)
	case h.total != want.total:
		return 0, fmt.Errorf("hello for world size %d, this is size %d", h.total, want.total)
	case h.length != want.length:
		return 0, fmt.Errorf("hello carries %d bytes of authentication, expected %d (is the job secret set on both sides?)", h.length, want.length)
	}
	if err := ok(int(h.unit)); err != nil {
		return 0, err
	}
	if h.length > 0 {
		sum := make([]byte, h.length)
		if _, err := io.ReadFull(conn, sum); err != nil {
			return 0, fmt.Errorf("read hello MAC: %w", err)
		}
		if !hmac.Equal(sum, c.mac(b[:])) {
			return 0, fmt.Errorf("hello from rank %d: bad MAC (wrong job secret)", h.unit)
		}
	}
	return int(h.unit), nil
}

func (c *Comm) acceptHello(conn *net.TCPConn, dials func(rank int) error) (*peer, error) {
	conn.SetDeadline(time.Now().Add(min(c.cfg.Timeout, 10*time.Second)))
	rank, err := c.readHello(conn, dials)
	if err != nil {
		return nil, err
	}
	if err := c.writeHello(conn); err != nil {
		return nil, fmt.Errorf("answer hello of rank %d: %w", rank, err)
	}
	conn.SetDeadline(time.Time{})
	return &peer{rank: rank, addr: conn.RemoteAddr().String(), conn: conn}, nil
}

// refuse answers a failed hello with an abort frame carrying the reason, then closes.
func refuse(conn net.Conn, rank int, why error) {
	reason := why.Error()
	if len(reason) > maxAbortLen {
		reason = reason[:maxAbortLen]
	}
	var b [headerLen]byte
	h := header{kind: kindAbort, unit: uint32(rank), length: uint32(len(reason))}
	h.put(b[:])
	conn.SetWriteDeadline(time.Now().Add(time.Second))
	conn.Write(append(b[:], reason...))
	conn.Close()
}

// lookup reads rank q's record from the store, waiting until q has published it.
func (c *Comm) lookup(ctx context.Context, q int) (record, error) {
	v, err := c.cfg.Store.Get(ctx, addrKey(c.cfg.Generation, q))
	if err != nil {
		return record{}, fmt.Errorf("look up rank %d: %w", q, err)
	}
	rec, err := parseRecord(v)
	if err != nil {
		return record{}, fmt.Errorf("look up rank %d: %w", q, err)
	}
	return rec, nil
}

// dial connects to rank q at addr, retrying while the address is refused (a listener not up
// yet cannot happen, but a restarted host can briefly refuse).
func (c *Comm) dial(ctx context.Context, q int, addr string) (*peer, error) {
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			tc := conn.(*net.TCPConn)
			p, err := c.dialHello(ctx, tc, q)
			if err != nil {
				tc.Close()
				return nil, fmt.Errorf("handshake with rank %d at %s: %w", q, addr, err)
			}
			p.addr = addr
			return p, nil
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("dial rank %d at %s: %w", q, addr, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dial rank %d at %s: %w (last: %v)", q, addr, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Comm) dialHello(ctx context.Context, conn *net.TCPConn, q int) (*peer, error) {
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	conn.SetDeadline(time.Now().Add(c.cfg.Timeout))
	if err := c.writeHello(conn); err != nil {
		return nil, err
	}
	if _, err := c.readHello(conn, func(r int) error {
		if r != q {
			return fmt.Errorf("the listener at this address is rank %d, not %d", r, q)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	return &peer{rank: q, conn: conn}, nil
}

// Rank returns this rank.
func (c *Comm) Rank() int { return c.cfg.Rank }

// Size returns the world size.
func (c *Comm) Size() int { return c.cfg.Size }

// Generation returns the generation this communicator serves.
func (c *Comm) Generation() uint64 { return c.cfg.Generation }

// Addr returns the address this rank published ("" for a world of one).
func (c *Comm) Addr() string { return c.addr }

// Stats says how many connections New carried over from Config.Previous and how many it
// made afresh.
func (c *Comm) Stats() Stats {
	s := c.stats
	s.Hierarchical = c.hierOps.Load()
	s.DirectAllreduces = c.directOps.Load()
	return s
}

// Close releases every connection. An operation in progress returns ErrClosed; Close waits
// for it. Close is idempotent.
func (c *Comm) Close() error {
	c.mu.Lock()
	already := c.closed
	c.closed = true
	c.mu.Unlock()
	if already {
		return nil
	}
	c.interrupt(ErrClosed)
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.closeConns()
	c.scratch = nil
	c.unwatch()
	return nil
}

func (c *Comm) closeConns() {
	c.mu.Lock() // interrupt reads p.shm
	defer c.mu.Unlock()
	for _, p := range c.peers {
		if p != nil {
			p.wframe = [3][]byte{}
			p.conn.Close()
			if p.shm != nil {
				p.shm.shut()
				p.shm.release()
				p.shm = nil
			}
		}
	}
	c.closeWaker()
}

// interrupt makes every blocked read and write return at once; the running operation then
// reports cause.
func (c *Comm) interrupt(cause error) {
	c.mu.Lock()
	defer c.mu.Unlock() // a later generation's New may be taking peers away (handOver)
	c.interruptLocked(cause)
}

func (c *Comm) interruptLocked(cause error) {
	if c.cause == nil {
		c.cause = cause
	}
	now := time.Now()
	for _, p := range c.peers {
		if p != nil {
			p.conn.SetDeadline(now)
			if p.shm != nil {
				p.shm.kick()
			}
		}
	}
	c.kickWaker()
}
