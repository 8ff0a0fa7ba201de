package agents

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticd/elasticd/proc"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

// Config configures a Registry. Zero values take the defaults.
type Config struct {
	// Secret is the agent secret shared by the driver and every agent (--agent-secret-file),
	// at least MinSecret bytes.
	Secret []byte
	// JobID names the job; with Secret it gives the job secret (JobSecret).
	JobID string
	// PollWait is how long a commands long-poll is held (default 10s).
	PollWait time.Duration
	// Lease is how long an agent may go unheard before it counts as lost, its processes as
	// failed and its host as gone (default 30s).
	Lease time.Duration
	// DropGrace is how long an agent whose commands long-poll connection closed under it (the
	// agent, or its host, died) has to come back before it counts as lost, without waiting
	// for the lease (default 1s). An agent that is only slow keeps its connection open.
	DropGrace time.Duration
	// MaxBody bounds a request body (default 8 MiB: an events batch carries output).
	MaxBody int64
	// Loads says the driver reads the agents' GPU busy fractions (--slot-policy loadaware);
	// without, agents are told to send none (protocol.AgentRegisterAnswer.NoLoads).
	Loads bool
	// Version is the driver's elasticd version, told to an agent that checks its setup
	// (GET protocol.AgentPathCheck); "" says nothing.
	Version string
	// Logger receives the registry's log; nil discards it.
	Logger *slog.Logger
}

// DefaultPollWait and DefaultLease are Config's defaults: an agent's long-poll is held 10 s,
// and an agent unheard for 30 s is lost.
const (
	DefaultPollWait = 10 * time.Second
	DefaultLease    = 30 * time.Second
)

const (
	defaultPollWait = DefaultPollWait
	defaultLease    = DefaultLease
	defaultDrop     = time.Second
	defaultMaxBody  = 8 << 20
	// queueLen bounds the notices and faults not yet read by the driver; beyond it an events
	// request gets 503 and the agent sends them again.
	queueLen = 1024
	// maxSeen bounds the remembered notice IDs.
	maxSeen = 4096
)

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case len(c.Secret) < protocol.MinAgentSecret:
		return fmt.Errorf("agent secret of %d bytes: must be at least %d", len(c.Secret), protocol.MinAgentSecret)
	case c.JobID == "":
		return errors.New("agents: no job ID")
	case c.PollWait < 0 || c.Lease < 0 || c.MaxBody < 0 || c.DropGrace < 0:
		return errors.New("agents: PollWait, Lease, DropGrace and MaxBody must not be negative")
	case cmp.Or(c.Lease, defaultLease) <= cmp.Or(c.PollWait, defaultPollWait):
		return fmt.Errorf("agents: Lease %v must be longer than PollWait %v", cmp.Or(c.Lease, defaultLease), cmp.Or(c.PollWait, defaultPollWait))
	}
	return nil
}

// Fault is a GPU failure reported by an agent: the driver takes the slots out of the job and
// blacklists them as it does a failed worker's.
type Fault struct {
	HostID string // as the provider knows the host
	// Slots are the host's slots that use the GPU; nil means the whole host (NVML did not say
	// which GPU, or slots do not map onto GPUs).
	Slots  []int
	Reason string
}

// Registry is the driver's side of the agents' protocol, an http.Handler for PathPrefix. Its
// methods are safe for concurrent use.
type Registry struct {
	cfg  Config
	auth *protocol.Auth
	log  *slog.Logger

	notices chan providers.Notice
	faults  chan Fault
	closing chan struct{}
	closed  sync.Once
	janitor sync.WaitGroup

	mu       sync.Mutex
	sessions map[string]*session // live sessions by ID
	// byName indexes the live sessions by each name they answer to (the provider host's ID
	// and address they serve, and the agent's own), byAgent by agent ID: a launch, a
	// discovery poll and a registration look there, not through every session (a fleet has
	// thousands).
	byName   map[string][]*session
	byAgent  map[string][]*session
	seen     map[string]time.Time
	nextProc uint64
	ports    map[uint64]chan protocol.AgentEvent // OpFindPort requests awaiting their KindPort answer
	// unconnected are the provider's hosts that no agent serves (Wrap), since when listed so.
	unconnected map[string]Unconnected
	// expected are the workers of an earlier driver of this job that wait for their agent to
	// list them again (Adopt), by worker ID.
	expected map[string]*process
	viewer   Viewer               // what watches read (SetViewer)
	handler  http.Handler         // what serves the session streams' requests (SetHandler)
	streams  map[*stream]struct{} // the open session streams
	// watches are the watches held without a goroutine (park.go), which answerWatches
	// answers when the view moves; answering: it runs.
	watches   map[*heldPoll]struct{}
	answering bool

	watching atomic.Int64 // watches held now
}

// session is one registration of one agent process.
type session struct {
	id         string
	info       protocol.AgentRegisterRequest
	registered time.Time
	lastSeen   time.Time
	polling    int
	// dropped is when a commands long-poll ended because its connection closed; it counts
	// until the agent's next request (lastSeen after it).
	dropped   time.Time
	lostCh    chan struct{}           // closed when the session is lost
	cmds      []protocol.AgentCommand // queued and not yet acknowledged
	nextCmd   uint64
	cmdCh     chan struct{} // closed and replaced when a command is queued
	lastEvent uint64
	procs     map[uint64]*process
	// hostID and hostAddr are the provider's host this agent serves (see Wrap); the agent's
	// own until a discovery matches it.
	hostID, hostAddr string
	evMu             sync.Mutex  // one events request of a session at a time, so output stays in order
	gpuBusy          float64     // the latest KindLoad; -1 before one
	held             []*heldPoll // its polls held without a goroutine (park.go)
}

// New returns a registry; Close stops it.
func New(cfg Config) (*Registry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.PollWait = cmp.Or(cfg.PollWait, defaultPollWait)
	cfg.Lease = cmp.Or(cfg.Lease, defaultLease)
	cfg.DropGrace = cmp.Or(cfg.DropGrace, defaultDrop)
	cfg.MaxBody = cmp.Or(cfg.MaxBody, defaultMaxBody)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	auth, err := protocol.NewAuth(cfg.Secret, protocol.AgentAuthLabel, 0)
	if err != nil {
		return nil, fmt.Errorf("agent secret: %w", err)
	}
	r := &Registry{
		cfg: cfg, auth: auth, log: cfg.Logger,
		notices:  make(chan providers.Notice, queueLen),
		faults:   make(chan Fault, queueLen),
		closing:  make(chan struct{}),
		sessions: map[string]*session{},
		byName:   map[string][]*session{},
		byAgent:  map[string][]*session{},
		seen:     map[string]time.Time{},
		expected: map[string]*process{},
		watches:  map[*heldPoll]struct{}{},

		unconnected: map[string]Unconnected{},
	}
	r.janitor.Go(r.expire)
	return r, nil
}

// Unconnected is a host the provider lists and no agent serves.
type Unconnected struct {
	Host  providers.Host
	Since time.Time // when it was first listed without an agent
}

// Unconnected lists the hosts the provider (through Wrap) has listed for longer than wait
// with no agent connected for them: a bad image, a failed cloud-init, a firewall.
func (r *Registry) Unconnected(wait time.Duration, now time.Time) []Unconnected {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Unconnected
	for _, u := range r.unconnected {
		if now.Sub(u.Since) >= wait {
			out = append(out, u)
		}
	}
	slices.SortFunc(out, func(a, b Unconnected) int { return strings.Compare(a.Host.ID, b.Host.ID) })
	return out
}

// Notices delivers the interruption notices agents see on their hosts, each once, with
// HostID as the provider knows the host.
func (r *Registry) Notices() <-chan providers.Notice { return r.notices }

// Faults delivers the GPU failures agents report.
func (r *Registry) Faults() <-chan Fault { return r.faults }

// Close ends every long-poll (503), refuses later requests the same way, and fails the
// processes still known (their agents will stop them when they find the driver gone).
func (r *Registry) Close() {
	r.closed.Do(func() {
		close(r.closing)
		r.janitor.Wait()
		r.mu.Lock()
		for _, s := range r.sessions {
			r.loseLocked(s, "the driver is shutting down")
		}
		for id, p := range r.expected {
			delete(r.expected, id)
			p.finish(proc.ExitStatus{Code: -1}, errors.New("the driver is shutting down"))
		}
		r.mu.Unlock()
		r.closeStreams()
	})
}

func (r *Registry) isClosing() bool {
	select {
	case <-r.closing:
		return true
	default:
		return false
	}
}

// AgentInfo describes a connected agent.
type AgentInfo struct {
	Session    string
	HostID     string // the provider's ID for the host, or the agent's own
	Addr       string
	Slots      int // 0 when the provider decides
	GPUs       []protocol.AgentGPU
	Metadata   string
	Registered time.Time
	LastSeen   time.Time
	Processes  int
}

// Agents lists the connected agents, ordered by host ID.
func (r *Registry) Agents() []AgentInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]AgentInfo, 0, len(r.sessions))
	for _, s := range r.sessions {
		out = append(out, AgentInfo{
			Session: s.id, HostID: s.hostID, Addr: s.hostAddr, Slots: s.slots(0),
			GPUs: slices.Clone(s.info.GPUs), Metadata: s.info.Metadata,
			Registered: s.registered, LastSeen: s.lastSeen, Processes: len(s.procs),
		})
	}
	slices.SortFunc(out, func(a, b AgentInfo) int { return strings.Compare(a.HostID, b.HostID) })
	return out
}

// LastSeen adds to heard, by host ID, when each connected agent's host was last heard from
// where that is later than what heard holds. Unlike Agents it neither copies nor sorts the
// agents: the status page asks for it every second, and a driver may hold 10,000 of them.
func (r *Registry) LastSeen(heard map[string]time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.sessions {
		if s.lastSeen.After(heard[s.hostID]) {
			heard[s.hostID] = s.lastSeen
		}
	}
}

// GPUBusy returns the latest mean GPU busy fraction of each connected agent's host that
// reported one, by the host's provider ID.
func (r *Registry) GPUBusy() map[string]float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]float64{}
	for _, s := range r.sessions {
		if s.gpuBusy >= 0 {
			out[s.hostID] = s.gpuBusy
		}
	}
	return out
}

// names are the names s answers to, each once: its provider host's address and ID, and its
// agent's.
func (s *session) names() []string {
	out := make([]string, 0, 4)
	for _, n := range [...]string{s.hostAddr, s.hostID, s.info.Addr, s.info.HostID} {
		if n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// indexLocked adds the live session s to byName and byAgent, or removes it.
func (r *Registry) indexLocked(s *session, add bool) {
	edit := func(m map[string][]*session, key string) {
		if add {
			m[key] = append(m[key], s)
			return
		}
		if l := slices.DeleteFunc(m[key], func(x *session) bool { return x == s }); len(l) > 0 {
			m[key] = l
		} else {
			delete(m, key)
		}
	}
	for _, n := range s.names() {
		edit(r.byName, n)
	}
	edit(r.byAgent, s.info.AgentID)
}

// namedLocked returns the live sessions answering to any of names, each once.
func (r *Registry) namedLocked(names ...string) []*session {
	var out []*session
	for _, n := range names {
		for _, s := range r.byName[n] {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// setHostLocked names the provider host that s serves.
func (r *Registry) setHostLocked(s *session, id, addr string) {
	if s.hostID == id && s.hostAddr == addr {
		return
	}
	live := r.sessions[s.id] == s
	if live {
		r.indexLocked(s, false)
	}
	s.hostID, s.hostAddr = id, addr
	if live {
		r.indexLocked(s, true)
	}
}

// slots is the agent's slot count: its --slots, else one per GPU, else fallback.
func (s *session) slots(fallback int) int {
	if s.info.Slots > 0 {
		return s.info.Slots
	}
	if len(s.info.GPUs) > 0 {
		return len(s.info.GPUs)
	}
	return fallback
}

// expire counts agents lost when they have not been heard from for a lease, or when their
// connection closed and they did not come back within DropGrace.
func (r *Registry) expire() {
	t := time.NewTicker(max(min(r.cfg.Lease/4, r.cfg.DropGrace/2, time.Second), time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-r.closing:
			return
		case now := <-t.C:
			r.mu.Lock()
			for _, s := range r.sessions {
				switch {
				case s.polling > 0:
				case now.Sub(s.lastSeen) > r.cfg.Lease:
					r.loseLocked(s, fmt.Sprintf("no word from the agent for %v", r.cfg.Lease))
				case !s.dropped.IsZero() && !s.lastSeen.After(s.dropped) && now.Sub(s.dropped) > r.cfg.DropGrace:
					r.loseLocked(s, fmt.Sprintf("its connection closed and it did not come back within %v (the agent or its host is gone)", r.cfg.DropGrace))
				}
			}
			for id, p := range r.expected {
				if !now.Before(p.deadline) {
					delete(r.expected, id)
					r.log.Warn("worker not adopted: its agent did not list it in time", "worker", id, "host", p.spec.Host)
					p.finish(proc.ExitStatus{Code: -1}, fmt.Errorf("not adopted: no agent listed worker %s as running within %v of the driver's restart", id, p.wait))
				}
			}
			r.mu.Unlock()
		}
	}
}

// loseLocked ends a session: its processes fail, its host is no longer offered, and a later
// request of the agent gets 404 so that it registers again.
func (r *Registry) loseLocked(s *session, why string) {
	if _, ok := r.sessions[s.id]; !ok {
		return
	}
	delete(r.sessions, s.id)
	r.indexLocked(s, false)
	close(s.lostCh)
	s.endHeldLocked()
	level := slog.LevelWarn
	if r.isClosing() {
		level = slog.LevelInfo
	}
	r.log.Log(context.Background(), level, "agent session ended", "host", s.hostID, "addr", s.hostAddr, "session", s.id, "reason", why, "processes", len(s.procs))
	for _, p := range s.procs {
		p.finish(proc.ExitStatus{Code: -1}, fmt.Errorf("agent on %s lost: %s", s.hostAddr, why))
	}
	s.procs = nil
}

// --- HTTP ---

// ServeHTTP authenticates and routes a request under PathPrefix.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	now := time.Now()
	// Even a refusal, unsigned, says that the agents' protocol answered: a driver without
	// --launcher agent refuses the same requests without it.
	w.Header().Set(protocol.HeaderAgentsProtocol, strconv.Itoa(protocol.AgentProtocolVersion))
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, r.cfg.MaxBody))
	if err != nil {
		w.Header().Set("Connection", "close")
		http.Error(w, fmt.Sprintf("read request body (limit %d bytes): %v", r.cfg.MaxBody, err), http.StatusRequestEntityTooLarge)
		return
	}
	a, ok := r.admit(w, req, body, now)
	if !ok {
		return
	}
	rest := strings.TrimPrefix(req.URL.Path, protocol.AgentPathPrefix)
	switch {
	case req.URL.Path == protocol.AgentPathRegister && req.Method == http.MethodPost:
		r.register(a, req, body, now)
	case req.URL.Path == protocol.AgentPathCheck && req.Method == http.MethodGet:
		r.check(a, req, now)
	case req.URL.Path == protocol.AgentPathStream && req.Method == http.MethodGet:
		r.openStream(a, w, req)
	case strings.HasSuffix(rest, "/commands") && req.Method == http.MethodGet:
		r.commands(a, req, strings.TrimSuffix(rest, "/commands"))
	case strings.HasSuffix(rest, "/events") && req.Method == http.MethodPost:
		r.events(a, body, strings.TrimSuffix(rest, "/events"))
	case strings.HasSuffix(rest, "/watch") && req.Method == http.MethodGet:
		r.watch(a, req, strings.TrimSuffix(rest, "/watch"))
	default:
		a.Error(http.StatusNotFound, fmt.Sprintf("no %s %s in the agents' protocol", req.Method, req.URL.Path))
	}
}

// admit checks a request's signature and that the registry still serves, answering 401 or
// 503 when not; it returns what signs the answers to the request. ServeHTTP and the polls
// held on a stream (park.go) both come through here.
func (r *Registry) admit(w http.ResponseWriter, req *http.Request, body []byte, now time.Time) (protocol.Answer, bool) {
	nonce, err := r.auth.Verify(req, body, now)
	if err != nil {
		r.log.Warn("agent request refused", "remote", req.RemoteAddr, "method", req.Method, "path", req.URL.Path, "reason", err.Error())
		w.Header().Set("Connection", "close")
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return protocol.Answer{}, false
	}
	a := protocol.Answer{W: w, Auth: r.auth, Nonce: nonce}
	if r.isClosing() {
		a.Error(http.StatusServiceUnavailable, "driver shutting down")
		return a, false
	}
	return a, true
}

func decode(a protocol.Answer, body []byte, v any) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		a.Error(http.StatusBadRequest, "malformed JSON body: "+err.Error())
		return false
	}
	return true
}

func (r *Registry) register(a protocol.Answer, req *http.Request, body []byte, now time.Time) {
	var in protocol.AgentRegisterRequest
	if !decode(a, body, &in) {
		return
	}
	switch {
	case cmp.Or(in.Protocol, 1) != protocol.AgentProtocolVersion:
		a.Error(http.StatusBadRequest, fmt.Sprintf("agent protocol version %d is not spoken by this driver, which speaks version %d: run the agents and the driver from the same elasticd release", cmp.Or(in.Protocol, 1), protocol.AgentProtocolVersion))
		return
	case in.AgentID == "" || len(in.AgentID) > 64:
		a.Error(http.StatusBadRequest, `"agent_id" must be 1 to 64 characters`)
		return
	case in.HostID == "" || in.Addr == "":
		a.Error(http.StatusBadRequest, `"host_id" and "addr" are required`)
		return
	case in.Slots < 0 || in.Slots > 4096:
		a.Error(http.StatusBadRequest, fmt.Sprintf(`"slots" %d: must be in [0, 4096]`, in.Slots))
		return
	case len(in.GPUs) > 4096:
		a.Error(http.StatusBadRequest, fmt.Sprintf("%d GPUs: at most 4096", len(in.GPUs)))
		return
	case len(in.Procs) > 4096:
		a.Error(http.StatusBadRequest, fmt.Sprintf("%d held processes: at most 4096", len(in.Procs)))
		return
	}
	s := &session{
		id: randomID(), info: in, registered: now, lastSeen: now,
		lostCh: make(chan struct{}), cmdCh: make(chan struct{}), procs: map[uint64]*process{},
		hostID: in.HostID, hostAddr: in.Addr, gpuBusy: -1,
	}
	r.mu.Lock()
	for _, old := range append(r.namedLocked(in.HostID, in.Addr), r.byAgent[in.AgentID]...) {
		if old.info.HostID == in.HostID && old.info.Addr == in.Addr {
			// Discovery would match s as it matched old: keep the provider's names meanwhile,
			// for the notices and faults the agent sends as soon as it has registered.
			s.hostID, s.hostAddr = old.hostID, old.hostAddr
		}
		switch {
		case old.info.AgentID == in.AgentID:
			r.loseLocked(old, "the agent registered again")
		case old.info.HostID == in.HostID || old.info.Addr == in.Addr:
			r.loseLocked(old, "a new agent registered for the same host (the agent restarted?)")
		}
	}
	r.sessions[s.id] = s
	r.indexLocked(s, true)
	adopted := r.adoptLocked(s, in)
	r.mu.Unlock()
	r.log.Info("agent registered", "host", in.HostID, "addr", in.Addr, "gpus", len(in.GPUs), "slots", s.slots(0), "metadata", in.Metadata, "session", s.id, "remote", req.RemoteAddr, "held", len(in.Procs), "adopted", len(adopted))
	a.JSON(protocol.AgentRegisterAnswer{Session: s.id, JobID: r.cfg.JobID, PollWaitMS: r.cfg.PollWait.Milliseconds(), LeaseMS: r.cfg.Lease.Milliseconds(), Adopted: adopted, NoLoads: !r.cfg.Loads})
}

// session returns the live session id, or answers 404.
func (r *Registry) session(a protocol.Answer, id string) *session {
	r.mu.Lock()
	s := r.sessions[id]
	if s != nil {
		s.lastSeen = time.Now()
	}
	r.mu.Unlock()
	if s == nil {
		a.Error(http.StatusNotFound, "unknown agent session (the driver restarted, or counted this agent lost): register again")
	}
	return s
}

func (r *Registry) commands(a protocol.Answer, req *http.Request, id string) {
	s := r.session(a, id)
	if s == nil {
		return
	}
	after, wait, ok := r.commandsQuery(a, req.URL.Query())
	if !ok {
		return
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	r.mu.Lock()
	s.polling++
	defer func() {
		r.mu.Lock()
		s.polling--
		s.lastSeen = time.Now()
		if req.Context().Err() != nil {
			s.dropped = s.lastSeen
		}
		r.mu.Unlock()
	}()
	for {
		if cmds := s.pendingLocked(after); len(cmds) > 0 {
			r.mu.Unlock()
			a.JSON(protocol.AgentCommandsAnswer{Commands: cmds})
			return
		}
		ch := s.cmdCh
		r.mu.Unlock()
		switch r.await(a, req, s, ch, timer) {
		case pollTimedOut:
			a.JSON(protocol.AgentCommandsAnswer{Commands: []protocol.AgentCommand{}})
			return
		case pollEnded:
			return
		}
		r.mu.Lock()
	}
}

// commandsQuery reads a commands poll's query: the last command it has, and its wait; ok is
// false when it answered a 400.
func (r *Registry) commandsQuery(a protocol.Answer, q url.Values) (after uint64, wait time.Duration, ok bool) {
	after, err := strconv.ParseUint(cmp.Or(q.Get("after"), "0"), 10, 64)
	if err != nil {
		a.Error(http.StatusBadRequest, fmt.Sprintf("after=%q: want a command sequence number", q.Get("after")))
		return 0, 0, false
	}
	wait, ok = r.pollWait(a, q.Get("wait_ms"))
	return after, wait, ok
}

// pendingLocked forgets s's commands up to after (the agent has them) and returns a copy of
// the others, r.mu held.
func (s *session) pendingLocked(after uint64) []protocol.AgentCommand {
	i := 0
	for i < len(s.cmds) && s.cmds[i].Seq <= after {
		i++
	}
	if i > 0 { // a copy, so that the acknowledged commands (their environments) are freed
		s.cmds = slices.Clone(s.cmds[i:])
	}
	if len(s.cmds) == 0 {
		return nil
	}
	return slices.Clone(s.cmds)
}

type pollWake int

const (
	pollWoke     pollWake = iota // ch was closed: look again
	pollTimedOut                 // the poll's time is up: the caller answers
	pollEnded                    // answered (the session ended, the driver is closing) or the agent gone
)

// await holds a long-poll of session s until ch is closed, timer fires, or the poll ends.
func (r *Registry) await(a protocol.Answer, req *http.Request, s *session, ch <-chan struct{}, timer *time.Timer) pollWake {
	select {
	case <-ch:
		return pollWoke
	case <-timer.C:
		return pollTimedOut
	case <-s.lostCh:
		if r.isClosing() { // Close ends the sessions too: answer as Close promises
			a.Error(http.StatusServiceUnavailable, "driver shutting down")
		} else {
			a.Error(http.StatusNotFound, "agent session ended: register again")
		}
	case <-r.closing:
		a.Error(http.StatusServiceUnavailable, "driver shutting down")
	case <-req.Context().Done():
	}
	return pollEnded
}

// queueLocked adds a command to s and wakes its poll.
func (s *session) queueLocked(c protocol.AgentCommand) {
	s.nextCmd++
	c.Seq = s.nextCmd
	s.cmds = append(s.cmds, c)
	close(s.cmdCh)
	s.cmdCh = make(chan struct{})
	s.wakeCommandsLocked()
}

func (r *Registry) events(a protocol.Answer, body []byte, id string) {
	s := r.session(a, id)
	if s == nil {
		return
	}
	var in protocol.AgentEventsRequest
	if !decode(a, body, &in) {
		return
	}
	s.evMu.Lock()
	defer s.evMu.Unlock()
	for _, ev := range in.Events {
		r.mu.Lock()
		if ev.Seq <= s.lastEvent {
			r.mu.Unlock()
			continue // a retry of one already taken
		}
		p := s.procs[ev.Proc]
		r.mu.Unlock()
		if err := r.event(s, p, ev); err != nil {
			a.Error(http.StatusServiceUnavailable, err.Error())
			return
		}
		r.mu.Lock()
		s.lastEvent = ev.Seq
		r.mu.Unlock()
	}
	a.Write(http.StatusNoContent, "", nil)
}

var errBehind = errors.New("the driver is behind on agent events; send them again")

// event applies one event of s; p is the process it names, if known.
func (r *Registry) event(s *session, p *process, ev protocol.AgentEvent) error {
	switch ev.Kind {
	case protocol.KindStarted:
		if p != nil {
			p.pid.Store(int64(ev.PID))
		}
	case protocol.KindOutput:
		if p != nil {
			p.output(ev.Stream, ev.Data)
		}
	case protocol.KindPort:
		r.mu.Lock()
		ch := r.ports[ev.Proc]
		delete(r.ports, ev.Proc)
		r.mu.Unlock()
		if ch != nil {
			ch <- ev // buffered: the asker may have given up
		}
	case protocol.KindExited:
		if p == nil {
			return nil
		}
		r.mu.Lock()
		delete(s.procs, p.id)
		r.mu.Unlock()
		if ev.Error != "" {
			p.output("stderr", []byte("agent: "+ev.Error+"\n"))
		}
		p.finish(proc.ExitStatus{Code: ev.Code, Signal: ev.Signal}, nil)
	case protocol.KindNotice:
		if ev.Notice == nil {
			return nil
		}
		r.mu.Lock()
		// Per agent process: a VM that is preempted, restarted and preempted again may
		// repeat a notice ID (GCP's are derived from the metadata rendezvous.Answer), and its agent is a
		// new process then. A restarted agent on a live host may send a notice twice; the
		// job treats the repeat as the same news.
		key := s.info.AgentID + "\x00" + ev.Notice.ID
		_, dup := r.seen[key]
		host := s.hostID
		r.mu.Unlock()
		if dup {
			return nil
		}
		n := providers.Notice{
			ID: "agent:" + ev.Notice.ID, HostID: host, Kind: providers.NoticeKind(ev.Notice.Kind),
			Deadline: ev.Notice.Deadline, Detail: "from the agent: " + ev.Notice.Detail, Token: s.info.AgentID,
		}
		select {
		case r.notices <- n:
		default:
			return errBehind
		}
		r.mu.Lock()
		r.remember(key)
		r.mu.Unlock()
		r.log.Info("agent notice", "host", host, "kind", n.Kind, "deadline", n.Deadline, "detail", ev.Notice.Detail)
	case protocol.KindLoad:
		if ev.GPUBusy >= 0 && ev.GPUBusy <= 1 {
			r.mu.Lock()
			s.gpuBusy = ev.GPUBusy
			r.mu.Unlock()
		}
	case protocol.KindGPU:
		if ev.GPU == nil {
			return nil
		}
		f := r.fault(s, *ev.GPU)
		if f == nil {
			return nil
		}
		select {
		case r.faults <- *f:
		default:
			return errBehind
		}
	}
	return nil
}

// remember records a notice key, forgetting the oldest when there are too many.
func (r *Registry) remember(key string) {
	if len(r.seen) >= maxSeen {
		var oldest string
		var t time.Time
		for k, at := range r.seen {
			if oldest == "" || at.Before(t) {
				oldest, t = k, at
			}
		}
		delete(r.seen, oldest)
	}
	r.seen[key] = time.Now()
}

// fault maps a GPU failure to the slots that use the GPU: slot s uses GPU s mod #GPUs.
func (r *Registry) fault(s *session, g protocol.GPUFault) *Fault {
	r.mu.Lock()
	host, nslots, ngpu := s.hostID, s.slots(0), len(s.info.GPUs)
	r.mu.Unlock()
	reason := fmt.Sprintf("GPU %d (%s) on %s: %s", g.Index, cmp.Or(g.UUID, "unknown UUID"), host, cmp.Or(g.Detail, g.Kind))
	r.log.Warn("GPU fault reported", "host", host, "gpu", g.Index, "uuid", g.UUID, "kind", g.Kind, "xid", g.XID, "detail", g.Detail)
	if g.Index < 0 || ngpu == 0 || nslots == 0 {
		return &Fault{HostID: host, Reason: reason}
	}
	var slots []int
	for i := range nslots {
		if i%ngpu == g.Index {
			slots = append(slots, i)
		}
	}
	if len(slots) == 0 {
		r.log.Info("the failed GPU is used by no slot", "host", host, "gpu", g.Index)
		return nil
	}
	return &Fault{HostID: host, Slots: slots, Reason: reason}
}

func randomID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// --- adoption (a driver restarted with --state-dir) ---

// Adopt expects worker id, which an earlier driver of this job started through an agent, to
// be listed as held by its agent when that agent registers again (RegisterRequest.Procs). It
// returns the worker as a process of this driver, and a channel closed once it is adopted.
// A worker no agent lists within wait fails: Wait answers code -1 and why. Stopping it before
// it is adopted gives it up (its agent then stops it). spec's Name, Host (the address it was
// launched on), Stdout and Stderr are used.
func (r *Registry) Adopt(id string, spec proc.Spec, wait time.Duration) (proc.Process, <-chan struct{}) {
	p := &process{r: r, spec: spec, done: make(chan struct{}), adopted: make(chan struct{}), deadline: time.Now().Add(wait), wait: wait}
	r.mu.Lock()
	if old := r.expected[id]; old != nil {
		old.finish(proc.ExitStatus{Code: -1}, errors.New("expected again"))
	}
	r.expected[id] = p
	r.mu.Unlock()
	return p, p.adopted
}

// adoptLocked takes over the held workers of a registering agent that this driver expects:
// those of its job, named by a worker ID it waits for, on the agent's host. A held worker
// that exited meanwhile is adopted and ends at once with its status.
func (r *Registry) adoptLocked(s *session, in protocol.AgentRegisterRequest) []protocol.Adoption {
	var out []protocol.Adoption
	for _, h := range in.Procs {
		p := r.expected[h.Worker]
		if p == nil || h.JobID != r.cfg.JobID {
			continue
		}
		id, err := protocol.ParseWorkerID(h.Worker)
		if err != nil || (p.spec.Host != in.Addr && id.Host != in.HostID && id.Host != in.Addr) {
			r.log.Warn("an agent lists a worker of another host; not adopting it", "worker", h.Worker, "agent_host", in.HostID, "agent_addr", in.Addr)
			continue
		}
		delete(r.expected, h.Worker)
		r.nextProc++
		p.id, p.s = r.nextProc, s
		p.pid.Store(int64(h.PID))
		close(p.adopted)
		out = append(out, protocol.Adoption{Old: h.Proc, New: p.id})
		if h.Exited {
			r.log.Info("adopted a worker that exited while the driver was away", "worker", h.Worker, "code", h.Code, "signal", h.Signal)
			p.finish(proc.ExitStatus{Code: h.Code, Signal: h.Signal}, nil)
			continue
		}
		s.procs[p.id] = p
		r.log.Info("adopted a running worker", "worker", h.Worker, "host", in.HostID, "pid", h.PID, "proc", p.id)
	}
	return out
}
