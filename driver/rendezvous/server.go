package rendezvous

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/elasticd/elasticd/allreduce"
	"github.com/elasticd/elasticd/protocol"
)

// ServerConfig configures a Server. Zero values take the defaults.
type ServerConfig struct {
	// Secret is the per-job key (at least 16 bytes). It reaches workers only through their
	// launch environment; it never crosses the network.
	Secret []byte
	// MaxBody bounds a request body (default 1 MiB); larger bodies get 413.
	MaxBody int64
	// ReplayWindow (default 60s): requests stamped outside now±ReplayWindow get 401, and so
	// does a request whose nonce was seen within the window.
	ReplayWindow time.Duration
	// PollTimeout is how long a long-poll is held before answering "nothing new" (default 25s).
	PollTimeout time.Duration
	// Logger receives the server's log (keys: worker, generation); nil discards it.
	Logger *slog.Logger

	// MaxKeys bounds the keys, set or waited for, in one generation's key-value store
	// (default 65536); beyond it a new key gets 507.
	MaxKeys int
	// MaxQueuedEvents bounds the reports queued for a driver that is not reading Events
	// (default 65536). Beyond it a report gets 503, which the client retries: reports are
	// refused, never dropped.
	MaxQueuedEvents int
}

const (
	defaultMaxBody         = 1 << 20
	defaultPollTimeout     = 25 * time.Second
	defaultMaxKeys         = 1 << 16
	defaultMaxQueuedEvents = 1 << 16

	maxMaxBody      = 1 << 30
	maxReplayWindow = time.Hour
	maxPollTimeout  = 10 * time.Minute
	maxKeyLen       = 1024
	maxReportIDLen  = 64
)

// Validate reports the first invalid field.
func (c ServerConfig) Validate() error {
	switch {
	case len(c.Secret) < 16:
		return fmt.Errorf("rendezvous config: Secret of %d bytes: must be at least 16", len(c.Secret))
	case c.MaxBody < 0 || c.MaxBody > maxMaxBody:
		return fmt.Errorf("rendezvous config: MaxBody %d: must be in [0, %d] (0 for the default)", c.MaxBody, maxMaxBody)
	case c.ReplayWindow < 0 || (c.ReplayWindow > 0 && c.ReplayWindow < time.Second) || c.ReplayWindow > maxReplayWindow:
		return fmt.Errorf("rendezvous config: ReplayWindow %v: must be in [1s, %v] (0 for the default)", c.ReplayWindow, maxReplayWindow)
	case c.PollTimeout < 0 || c.PollTimeout > maxPollTimeout:
		return fmt.Errorf("rendezvous config: PollTimeout %v: must be in [0, %v] (0 for the default)", c.PollTimeout, maxPollTimeout)
	case c.MaxKeys < 0:
		return fmt.Errorf("rendezvous config: MaxKeys %d: must not be negative", c.MaxKeys)
	case c.MaxQueuedEvents < 0:
		return fmt.Errorf("rendezvous config: MaxQueuedEvents %d: must not be negative", c.MaxQueuedEvents)
	}
	return nil
}

func (c ServerConfig) withDefaults() ServerConfig {
	c.Secret = bytes.Clone(c.Secret)
	if c.MaxBody == 0 {
		c.MaxBody = defaultMaxBody
	}
	if c.ReplayWindow == 0 {
		c.ReplayWindow = protocol.DefaultReplayWindow
	}
	if c.PollTimeout == 0 {
		c.PollTimeout = defaultPollTimeout
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = defaultMaxKeys
	}
	if c.MaxQueuedEvents == 0 {
		c.MaxQueuedEvents = defaultMaxQueuedEvents
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Server is the driver's side of rendezvous, an http.Handler. Its methods are safe for
// concurrent use.
type Server struct {
	cfg  ServerConfig
	log  *slog.Logger
	auth *protocol.Auth // keyed with protocol.RendezvousAuthLabel
	mux  *http.ServeMux

	closing   chan struct{} // closed by Close
	closeOnce sync.Once
	fed       chan struct{} // closed when the feeder has returned

	mu         sync.Mutex
	gen        uint64                                    // current generation; 0 before the first Publish
	plan       map[protocol.WorkerID]protocol.Assignment // of gen
	planHosts  uint64                                    // host-update version when gen was published
	genCh      chan struct{}                             // closed and replaced by Publish
	hostsVer   uint64
	hostsCh    chan struct{} // closed and replaced by NotifyHostsUpdated
	kvFloor    uint64        // key-value data of generations below it is gone
	kv         map[uint64]*genKV
	lastReport map[protocol.WorkerID]string // report ID of each worker's last queued report
	stepTimes  map[protocol.WorkerID]time.Duration
	// progress is the newest progress report; progressSamples its steps over ProgressWindow.
	progress        Progress
	progressSamples []progressSample

	qmu    sync.Mutex
	queue  []Event       // reports not yet handed to the driver, oldest first
	qwake  chan struct{} // capacity 1: something was queued
	events chan Event

	assignPolls, hostPolls, kvPolls atomic.Int64
	unauthorized                    atomic.Uint64
}

// genKV is one generation's key-value store.
type genKV struct {
	vals    map[string][]byte
	waiting map[string]chan struct{} // keys someone waits for; closed when set or dropped
}

// NewServer returns a server ready to serve; Close stops it.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	auth, err := protocol.NewAuth(cfg.Secret, protocol.RendezvousAuthLabel, cfg.ReplayWindow)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:        cfg,
		log:        cfg.Logger,
		auth:       auth,
		closing:    make(chan struct{}),
		fed:        make(chan struct{}),
		genCh:      make(chan struct{}),
		hostsCh:    make(chan struct{}),
		kv:         map[uint64]*genKV{},
		lastReport: map[protocol.WorkerID]string{},
		stepTimes:  map[protocol.WorkerID]time.Duration{},
		qwake:      make(chan struct{}, 1),
		events:     make(chan Event),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/workers/{id}/state", s.handleState)
	mux.HandleFunc("GET /v1/workers/{id}/assignment", s.handleAssignment)
	mux.HandleFunc("GET /v1/hosts/version", s.handleHosts)
	mux.HandleFunc("POST /v1/workers/{id}/load", s.handleLoad)
	mux.HandleFunc("POST /v1/workers/{id}/progress", s.handleProgress)
	mux.HandleFunc("PUT /v1/kv/{gen}/{key...}", s.handleKVPut)
	mux.HandleFunc("GET /v1/kv/{gen}/{key...}", s.handleKVGet)
	s.mux = mux
	go s.feed()
	return s, nil
}

// ServeHTTP authenticates the request, reads its body (at most MaxBody+1 bytes) and routes it.
// Nothing but the 401 and its one-line reason is revealed to a request that fails the check.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, err := s.auth.VerifyHeaders(r, time.Now())
	if err != nil {
		s.unauthorized.Add(1)
		s.log.Warn("rendezvous request refused", "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path, "reason", err.Error())
		w.Header().Set("Connection", "close")
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	if r.ContentLength > s.cfg.MaxBody {
		s.tooLarge(w, r.ContentLength)
		return
	}
	var body []byte
	if r.ContentLength != 0 {
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	}
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			s.tooLarge(w, -1)
			return
		}
		http.Error(w, "read request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := protocol.CheckBody(r, body); err != nil {
		s.unauthorized.Add(1)
		s.log.Warn("rendezvous request refused", "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path, "reason", err.Error())
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	if s.isClosing() {
		http.Error(w, "rendezvous shutting down", http.StatusServiceUnavailable)
		return
	}
	r2 := *r
	r2.Body = io.NopCloser(bytes.NewReader(body))
	s.mux.ServeHTTP(w, &r2)
}

func (s *Server) tooLarge(w http.ResponseWriter, n int64) {
	// Closing the connection spares net/http from draining the rest of the body.
	w.Header().Set("Connection", "close")
	msg := fmt.Sprintf("request body exceeds the limit of %d bytes", s.cfg.MaxBody)
	if n >= 0 {
		msg = fmt.Sprintf("request body of %d bytes exceeds the limit of %d", n, s.cfg.MaxBody)
	}
	http.Error(w, msg, http.StatusRequestEntityTooLarge)
}

func (s *Server) isClosing() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

// Publish makes generation gen current: workers in plan get their Assignment (the server sets
// its Generation to gen and its HostsVersion to the current host-update version); any other
// worker that asks for an assignment after an older generation gets
// Assignment{Generation: gen, Removed: true, HostsVersion: …}. Key-value data of generations older than gen is
// dropped (a later request for such a key answers 410 Gone). Generations start at 1 and must
// increase: a gen not above the current one is ignored (and logged as an error).
func (s *Server) Publish(gen uint64, plan map[protocol.WorkerID]protocol.Assignment) {
	p := make(map[protocol.WorkerID]protocol.Assignment, len(plan))
	for id, a := range plan {
		a.Generation = gen
		p[id] = a
	}
	s.mu.Lock()
	cur := s.gen
	if gen <= cur {
		s.mu.Unlock()
		s.log.Error("publish ignored: generation is not newer than the current one", "generation", gen, "current", cur)
		return
	}
	for id, a := range p {
		a.HostsVersion = s.hostsVer
		p[id] = a
	}
	s.gen, s.plan, s.planHosts = gen, p, s.hostsVer
	close(s.genCh)
	s.genCh = make(chan struct{})
	for g, kv := range s.kv {
		if g < gen {
			for _, ch := range kv.waiting {
				close(ch)
			}
			delete(s.kv, g)
		}
	}
	s.kvFloor = gen
	s.mu.Unlock()
	s.log.Info("generation published", "generation", gen, "workers", len(p))
}

// Restore makes the server take up a job where an earlier driver's server left it (a driver
// restarted with --state-dir, whose workers kept running): gen is current with plan (each
// Assignment as the workers got it), the host-update version is hostsVersion and progress
// the last saved. Call it once, before serving and before any Publish.
func (s *Server) Restore(gen uint64, plan map[protocol.WorkerID]protocol.Assignment, planHosts, hostsVersion uint64, progress Progress) {
	p := make(map[protocol.WorkerID]protocol.Assignment, len(plan))
	for id, a := range plan {
		a.Generation, a.HostsVersion = gen, planHosts
		p[id] = a
	}
	s.mu.Lock()
	s.gen, s.plan, s.planHosts, s.kvFloor = gen, p, planHosts, gen
	s.hostsVer = max(hostsVersion, planHosts)
	s.progress = progress
	s.mu.Unlock()
	s.log.Info("generation restored", "generation", gen, "workers", len(plan), "hosts_version", s.hostsVer)
}

// PlanHostsVersion returns the host-update version the current generation's assignments
// carry.
func (s *Server) PlanHostsVersion() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.planHosts
}

// HostsVersion returns the current host-update version.
func (s *Server) HostsVersion() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hostsVer
}

// NotifyHostsUpdated bumps the host-update version that workers long-poll; returns the new
// version.
func (s *Server) NotifyHostsUpdated() uint64 {
	s.mu.Lock()
	s.hostsVer++
	v := s.hostsVer
	close(s.hostsCh)
	s.hostsCh = make(chan struct{})
	s.mu.Unlock()
	s.log.Info("hosts updated", "version", v)
	return v
}

// Events delivers worker reports in arrival order. It never drops one and never blocks a
// request on a slow reader: reports queue inside the server (up to MaxQueuedEvents) and one
// goroutine feeds the channel. The channel is closed when Close returns; reports still queued
// then are discarded.
func (s *Server) Events() <-chan Event { return s.events }

// Close ends every long-poll promptly (each answers 503 "rendezvous shutting down"), refuses
// later requests the same way, and stops the server's goroutine. It does not close the
// http.Server the handler runs under. Close is idempotent.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.qmu.Lock() // so that no report is queued after the feeder has gone
		close(s.closing)
		s.qmu.Unlock()
		<-s.fed
	})
}

// Stats is a snapshot of the server for metrics and tests.
type Stats struct {
	Generation      uint64
	HostsVersion    uint64
	AssignmentPolls int    // assignment long-polls held now
	HostPolls       int    // host-version long-polls held now
	KVPolls         int    // key-value gets held now
	QueuedEvents    int    // reports not yet read from Events
	Unauthorized    uint64 // requests refused with 401 so far
	KVGenerations   int    // generations with key-value data
	KVKeys          int    // keys set in those generations
}

// Stats returns a snapshot of the server.
func (s *Server) Stats() Stats {
	st := Stats{
		AssignmentPolls: int(s.assignPolls.Load()),
		HostPolls:       int(s.hostPolls.Load()),
		KVPolls:         int(s.kvPolls.Load()),
		Unauthorized:    s.unauthorized.Load(),
	}
	s.mu.Lock()
	st.Generation, st.HostsVersion, st.KVGenerations = s.gen, s.hostsVer, len(s.kv)
	for _, g := range s.kv {
		st.KVKeys += len(g.vals)
	}
	s.mu.Unlock()
	s.qmu.Lock()
	st.QueuedEvents = len(s.queue)
	s.qmu.Unlock()
	return st
}

// feed hands queued reports to the Events channel, one at a time, until Close.
func (s *Server) feed() {
	defer close(s.fed)
	defer close(s.events)
	for {
		s.qmu.Lock()
		if len(s.queue) == 0 {
			s.qmu.Unlock()
			select {
			case <-s.qwake:
				continue
			case <-s.closing:
				return
			}
		}
		ev := s.queue[0]
		s.queue[0] = Event{}
		s.queue = s.queue[1:]
		if len(s.queue) == 0 {
			s.queue = nil // give the backing array back
		}
		s.qmu.Unlock()
		select {
		case s.events <- ev:
		case <-s.closing:
			return
		}
	}
}

var (
	errShuttingDown = errors.New("rendezvous shutting down")
	errQueueFull    = errors.New("driver is behind on reports; retry")
)

func (s *Server) enqueue(ev Event) error {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if s.isClosing() {
		return errShuttingDown
	}
	if len(s.queue) >= s.cfg.MaxQueuedEvents {
		return errQueueFull
	}
	s.queue = append(s.queue, ev)
	select {
	case s.qwake <- struct{}{}:
	default:
	}
	return nil
}

// --- handlers ---

func (s *Server) handleState(w http.ResponseWriter, r *http.Request) {
	id, ok := workerParam(w, r)
	if !ok {
		return
	}
	var req protocol.StateReport
	if !decodeJSON(w, r, &req) {
		return
	}
	switch {
	case req.Protocol != 0 && req.Protocol != protocol.ProtocolVersion:
		http.Error(w, fmt.Sprintf("rendezvous protocol version %d is not spoken by this driver, which speaks version %d: run workers and driver from the same elasticd release", req.Protocol, protocol.ProtocolVersion), http.StatusBadRequest)
		return
	case req.Generation == nil:
		http.Error(w, `missing "generation"`, http.StatusBadRequest)
		return
	case !req.State.Valid():
		http.Error(w, fmt.Sprintf("unknown state %q: want READY, SUCCESS or FAILURE", req.State), http.StatusBadRequest)
		return
	case len(req.Message) > protocol.MaxMessage:
		http.Error(w, fmt.Sprintf("message of %d bytes is longer than %d", len(req.Message), protocol.MaxMessage), http.StatusBadRequest)
		return
	case len(req.ReportID) > maxReportIDLen:
		http.Error(w, fmt.Sprintf("report_id longer than %d bytes", maxReportIDLen), http.StatusBadRequest)
		return
	case !(req.Seconds >= 0 && req.Seconds < maxRollbackSeconds):
		http.Error(w, fmt.Sprintf(`"rolled_back_seconds" %v: want seconds, at least 0 and below a year`, req.Seconds), http.StatusBadRequest)
		return
	}
	ev := Event{Worker: id, Generation: *req.Generation, State: req.State, Message: req.Message, At: time.Now(), Rollback: req.Rollback, SilentPeer: req.SilentPeer && req.State == protocol.Ready}

	// De-duplication and queueing under one lock: a retry racing its original cannot slip
	// in between, and a report refused by a full queue is not remembered as delivered.
	s.mu.Lock()
	dup := req.ReportID != "" && s.lastReport[id] == req.ReportID
	var err error
	if !dup {
		if err = s.enqueue(ev); err == nil && req.ReportID != "" {
			s.lastReport[id] = req.ReportID
		}
	}
	s.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	s.log.Debug("worker report", "worker", id, "generation", ev.Generation, "state", string(ev.State), "duplicate", dup)
	w.WriteHeader(http.StatusNoContent)
}

// handleLoad records a worker's recent mean step time (for --slot-policy loadaware).
func (s *Server) handleLoad(w http.ResponseWriter, r *http.Request) {
	id, ok := workerParam(w, r)
	if !ok {
		return
	}
	var req protocol.LoadReport
	if !decodeJSON(w, r, &req) {
		return
	}
	if !(req.StepSeconds > 0 && req.StepSeconds < 86400) {
		http.Error(w, fmt.Sprintf(`"step_seconds" %v: want a step time in seconds, above 0 and below a day`, req.StepSeconds), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.stepTimes[id] = time.Duration(req.StepSeconds * float64(time.Second))
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// maxRollbackSeconds bounds a reported rollback: a year of work since a commit is a bug.
const maxRollbackSeconds = 365 * 24 * 3600

// handleProgress records how far training has got. Reports of an older generation than the
// newest one heard, or behind it in the same generation (a delayed request), are ignored:
// after a rollback the step goes back only with a new generation.
func (s *Server) handleProgress(w http.ResponseWriter, r *http.Request) {
	if _, ok := workerParam(w, r); !ok {
		return
	}
	var req protocol.ProgressReport
	if !decodeJSON(w, r, &req) {
		return
	}
	if req.Committed > req.Step {
		http.Error(w, fmt.Sprintf(`"committed_step" %d is past "step" %d`, req.Committed, req.Step), http.StatusBadRequest)
		return
	}
	now := time.Now()
	s.mu.Lock()
	p := &s.progress
	if req.Generation > p.Generation || req.Generation == p.Generation && req.Step >= p.Step {
		if req.Step < p.Step { // rolled back: the rate starts over
			s.progressSamples = s.progressSamples[:0]
		}
		p.Generation, p.Step, p.Committed, p.At = req.Generation, req.Step, req.Committed, now
		s.progressSamples = append(s.progressSamples, progressSample{at: now, step: req.Step})
		// Keep the samples of the window, and the one just before it as its start.
		i := 0
		for i+1 < len(s.progressSamples) && now.Sub(s.progressSamples[i+1].at) >= ProgressWindow {
			i++
		}
		s.progressSamples = append(s.progressSamples[:0], s.progressSamples[i:]...)
		p.StepsPerSecond = 0
		if first := s.progressSamples[0]; len(s.progressSamples) > 1 && now.After(first.at) {
			p.StepsPerSecond = float64(req.Step-first.step) / now.Sub(first.at).Seconds()
		}
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

type progressSample struct {
	at   time.Time
	step uint64
}

// Progress returns how far training has got, as last reported.
func (s *Server) Progress() Progress {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.progress
}

// StepTimes returns each worker's latest reported mean step time.
func (s *Server) StepTimes() map[protocol.WorkerID]time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.stepTimes)
}

func (s *Server) handleAssignment(w http.ResponseWriter, r *http.Request) {
	id, ok := workerParam(w, r)
	if !ok {
		return
	}
	after, ok := uintParam(w, r, "after", true)
	if !ok {
		return
	}
	timer, ok := s.pollTimer(w, r)
	if !ok {
		return
	}
	defer timer.Stop()
	s.assignPolls.Add(1)
	defer s.assignPolls.Add(-1)
	for {
		s.mu.Lock()
		gen, ch, hv := s.gen, s.genCh, s.planHosts
		a, inPlan := s.plan[id]
		s.mu.Unlock()
		if gen > after {
			if !inPlan {
				a = protocol.Assignment{Generation: gen, Removed: true, HostsVersion: hv}
			}
			s.log.Debug("assignment", "worker", id, "generation", gen, "rank", a.Rank, "removed", a.Removed)
			writeJSON(w, a)
			return
		}
		if !s.await(w, r, ch, timer) {
			return
		}
	}
}

func (s *Server) handleHosts(w http.ResponseWriter, r *http.Request) {
	after, ok := uintParam(w, r, "after", true)
	if !ok {
		return
	}
	timer, ok := s.pollTimer(w, r)
	if !ok {
		return
	}
	defer timer.Stop()
	s.hostPolls.Add(1)
	defer s.hostPolls.Add(-1)
	for {
		s.mu.Lock()
		v, ch := s.hostsVer, s.hostsCh
		s.mu.Unlock()
		if v > after {
			writeJSON(w, protocol.HostsVersion{Version: v})
			return
		}
		if !s.await(w, r, ch, timer) {
			return
		}
	}
}

func (s *Server) handleKVPut(w http.ResponseWriter, r *http.Request) {
	gen, key, ok := kvParams(w, r)
	if !ok {
		return
	}
	value, _ := io.ReadAll(r.Body) // already in memory, and bounded
	if status, msg := s.set(gen, key, value); status != 0 {
		http.Error(w, msg, status)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// set stores a key of generation gen; a non-zero status says why it could not.
func (s *Server) set(gen uint64, key string, value []byte) (int, string) {
	s.mu.Lock()
	g, status, msg := s.kvGenLocked(gen)
	if g != nil {
		_, set := g.vals[key]
		_, waited := g.waiting[key]
		if !set && !waited && len(g.vals)+len(g.waiting) >= s.cfg.MaxKeys {
			g, status, msg = nil, http.StatusInsufficientStorage, fmt.Sprintf("generation %d already holds %d keys, the limit", gen, s.cfg.MaxKeys)
		}
	}
	if g != nil {
		g.vals[key] = value
		if ch, ok := g.waiting[key]; ok {
			close(ch)
			delete(g.waiting, key)
		}
	}
	s.mu.Unlock()
	if g == nil {
		return status, msg
	}
	s.log.Debug("key set", "generation", gen, "key", key, "bytes", len(value))
	return 0, ""
}

// Store is the driver's own view of generation gen's key-value store, the same data
// workers reach over HTTP (the driver uses it to abandon a generation at a reset).
func (s *Server) Store(gen uint64) allreduce.Store { return serverStore{s, gen} }

type serverStore struct {
	s   *Server
	gen uint64
}

func (st serverStore) Set(_ context.Context, key string, value []byte) error {
	if status, msg := st.s.set(st.gen, key, bytes.Clone(value)); status != 0 {
		return &protocol.StatusError{Code: status, Message: msg}
	}
	return nil
}

func (st serverStore) Get(ctx context.Context, key string) ([]byte, error) {
	for {
		st.s.mu.Lock()
		g, status, msg := st.s.kvGenLocked(st.gen)
		if g == nil {
			st.s.mu.Unlock()
			return nil, &protocol.StatusError{Code: status, Message: msg}
		}
		if v, ok := g.vals[key]; ok {
			st.s.mu.Unlock()
			return bytes.Clone(v), nil
		}
		ch, ok := g.waiting[key]
		if !ok {
			ch = make(chan struct{})
			g.waiting[key] = ch
		}
		st.s.mu.Unlock()
		select {
		case <-ch: // set, or the generation dropped: look again
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (s *Server) handleKVGet(w http.ResponseWriter, r *http.Request) {
	gen, key, ok := kvParams(w, r)
	if !ok {
		return
	}
	timer, ok := s.pollTimer(w, r)
	if !ok {
		return
	}
	defer timer.Stop()
	s.kvPolls.Add(1)
	defer s.kvPolls.Add(-1)
	for {
		s.mu.Lock()
		g, status, msg := s.kvGenLocked(gen)
		var (
			value []byte
			found bool
			ch    chan struct{}
		)
		if g != nil {
			value, found = g.vals[key]
			if !found {
				ch = g.waiting[key]
				if ch == nil {
					if len(g.vals)+len(g.waiting) >= s.cfg.MaxKeys {
						g, status, msg = nil, http.StatusInsufficientStorage, fmt.Sprintf("generation %d already holds %d keys, the limit", gen, s.cfg.MaxKeys)
					} else {
						ch = make(chan struct{})
						g.waiting[key] = ch
					}
				}
			}
		}
		s.mu.Unlock()
		switch {
		case g == nil:
			http.Error(w, msg, status)
			return
		case found:
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Content-Length", strconv.Itoa(len(value)))
			w.Write(value) // values are never modified in place: a Set stores a new slice
			return
		}
		if !s.await(w, r, ch, timer) {
			return
		}
	}
}

// kvGenLocked returns generation gen's store, creating it, or the status that refuses it.
func (s *Server) kvGenLocked(gen uint64) (*genKV, int, string) {
	switch {
	case gen < s.kvFloor:
		return nil, http.StatusGone, fmt.Sprintf("generation %d is over (current %d): its keys are gone", gen, s.gen)
	case gen > s.gen:
		return nil, http.StatusConflict, fmt.Sprintf("generation %d is not published yet (current %d)", gen, s.gen)
	}
	g := s.kv[gen]
	if g == nil {
		g = &genKV{vals: map[string][]byte{}, waiting: map[string]chan struct{}{}}
		s.kv[gen] = g
	}
	return g, 0, ""
}

// await waits for ch, the end of the poll, the end of the request or Close. It reports
// whether the caller should look again; when it returns false it has answered the request
// (or the client has gone).
func (s *Server) await(w http.ResponseWriter, r *http.Request, ch <-chan struct{}, timer *time.Timer) bool {
	select {
	case <-ch:
		return true
	case <-timer.C:
		w.WriteHeader(http.StatusNoContent)
	case <-r.Context().Done():
	case <-s.closing:
		http.Error(w, errShuttingDown.Error(), http.StatusServiceUnavailable)
	}
	return false
}

// pollTimer starts the timer of a long-poll: PollTimeout, or less if the client asked for
// less with wait_ms.
func (s *Server) pollTimer(w http.ResponseWriter, r *http.Request) (*time.Timer, bool) {
	d := s.cfg.PollTimeout
	if r.URL.Query().Has("wait_ms") {
		ms, ok := uintParam(w, r, "wait_ms", true)
		if !ok {
			return nil, false
		}
		if ms < uint64(d/time.Millisecond) {
			d = time.Duration(ms) * time.Millisecond
		}
	}
	return time.NewTimer(d), true
}

// --- request parsing ---

func workerParam(w http.ResponseWriter, r *http.Request) (protocol.WorkerID, bool) {
	id, err := protocol.ParseWorkerID(r.PathValue("id"))
	if err != nil {
		http.Error(w, "bad "+err.Error(), http.StatusBadRequest)
		return protocol.WorkerID{}, false
	}
	return id, true
}

func uintParam(w http.ResponseWriter, r *http.Request, name string, required bool) (uint64, bool) {
	q := r.URL.Query()
	if !q.Has(name) {
		if required {
			http.Error(w, fmt.Sprintf("missing query parameter %q", name), http.StatusBadRequest)
			return 0, false
		}
		return 0, true
	}
	v := q.Get(name)
	n, err := parseUint(v)
	if err != nil {
		http.Error(w, fmt.Sprintf("bad query parameter %s=%q: want a non-negative decimal", name, v), http.StatusBadRequest)
		return 0, false
	}
	return n, true
}

func parseUint(v string) (uint64, error) {
	if v == "" || v[0] == '+' {
		return 0, errors.New("not a decimal")
	}
	return strconv.ParseUint(v, 10, 64)
}

func kvParams(w http.ResponseWriter, r *http.Request) (uint64, string, bool) {
	gs := r.PathValue("gen")
	gen, err := parseUint(gs)
	if err != nil {
		http.Error(w, fmt.Sprintf("bad generation %q: want a non-negative decimal", gs), http.StatusBadRequest)
		return 0, "", false
	}
	key := r.PathValue("key")
	if err := validKey(key); err != nil {
		http.Error(w, fmt.Sprintf("bad key %q: %v", key, err), http.StatusBadRequest)
		return 0, "", false
	}
	return gen, key, true
}

func validKey(key string) error {
	switch {
	case key == "":
		return errors.New("empty")
	case len(key) > maxKeyLen:
		return fmt.Errorf("longer than %d bytes", maxKeyLen)
	case !utf8.ValidString(key):
		return errors.New("not valid UTF-8")
	case strings.IndexFunc(key, unicode.IsControl) >= 0:
		return errors.New("contains a control character")
	}
	return nil
}

func decodeJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	body, _ := io.ReadAll(r.Body) // already in memory, and bounded
	if len(bytes.TrimSpace(body)) == 0 {
		http.Error(w, "empty body: want a JSON object", http.StatusBadRequest)
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("data after the JSON object")
	}
	if err != nil {
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
			err = fmt.Errorf("field %q: JSON %s where %s was expected", te.Field, te.Value, jsonKind(te.Type.Kind().String()))
		}
		http.Error(w, "bad JSON body: "+protocol.OneLine(err.Error()), http.StatusBadRequest)
		return false
	}
	return true
}

func jsonKind(goKind string) string {
	switch {
	case strings.HasPrefix(goKind, "int"), strings.HasPrefix(goKind, "uint"), strings.HasPrefix(goKind, "float"):
		return "a number"
	case goKind == "string":
		return "a string"
	case goKind == "bool":
		return "a boolean"
	}
	return "another type"
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil { // only plain structs are written here
		http.Error(w, "encode answer: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(b, '\n'))
}
