package rendezvous

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
	viewCh     chan struct{} // closed and replaced by both (View)
	kvFloor    uint64        // key-value data of generations below it is gone
	kv         map[uint64]*genKV
	lastReport map[protocol.WorkerID]string // report ID of each worker's last queued report
	stepTimes  map[protocol.WorkerID]time.Duration
	// heard is when each host's workers last made an authenticated request (its start, and
	// the end of a long-poll), by host ID: the workers' heartbeat, for the status.
	heard map[string]time.Time
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
		viewCh:     make(chan struct{}),
		kv:         map[uint64]*genKV{},
		lastReport: map[protocol.WorkerID]string{},
		stepTimes:  map[protocol.WorkerID]time.Duration{},
		heard:      map[string]time.Time{},
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
	if r.URL.Path == protocol.PathBatch && r.Method == http.MethodPost {
		s.serveBatch(w, r) // each request in it is checked here, as if it came alone
		return
	}
	_, err := s.auth.VerifyHeaders(r, time.Now())
	if err != nil {
		s.refused(r, r.Method, r.URL.Path, err)
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
		s.refused(r, r.Method, r.URL.Path, err)
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	if s.isClosing() {
		http.Error(w, "rendezvous shutting down", http.StatusServiceUnavailable)
		return
	}
	r2 := *r
	r2.Body = io.NopCloser(bytes.NewReader(body))
	if host := workerHost(r.URL); host != "" {
		s.hear(host)
		defer s.hear(host) // a long-poll held 25 s is a live worker too
	}
	s.mux.ServeHTTP(w, &r2)
}

// refused counts and logs a request refused for its signature; r is the request it came in
// (a batch's, for a request inside one).
func (s *Server) refused(r *http.Request, method, path string, err error) {
	s.unauthorized.Add(1)
	s.log.Warn("rendezvous request refused", "remote", r.RemoteAddr, "method", method, "path", path, "reason", err.Error())
}

// workerHost is the host of the worker a /v1/workers/{id}/... request is about, or "".
func workerHost(u *url.URL) string {
	rest, ok := strings.CutPrefix(u.EscapedPath(), "/v1/workers/")
	if !ok {
		return ""
	}
	seg, _, _ := strings.Cut(rest, "/")
	raw, err := url.PathUnescape(seg)
	if err != nil {
		return ""
	}
	id, err := protocol.ParseWorkerID(raw)
	if err != nil {
		return ""
	}
	return id.Host
}

func (s *Server) hear(host string) {
	s.mu.Lock()
	s.heard[host] = time.Now()
	s.mu.Unlock()
}

// Heard returns when each host's workers were last heard from (an authenticated request of
// theirs began or ended), by host ID.
func (s *Server) Heard() map[string]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.heard)
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
