package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/elasticd/elasticd/protocol"
)

// The relay (docs/protocol.md §4.5): the workers the agent starts reach the driver's
// rendezvous through it, on loopback, so that the driver holds one connection and one
// long-poll per host instead of a few per worker. It answers the workers' assignment and
// host-update long-polls itself, from the session's one watch of the driver, and carries
// every other request (reports, progress, load, the key-value store) unchanged, signature
// and all, over the agent's session connection: the driver checks each worker's MAC as if
// the worker had sent it.

const (
	// relayPollTimeout is how long the relay holds a worker's long-poll before "nothing new"
	// (204), as the driver's rendezvous does.
	relayPollTimeout = 25 * time.Second
	// relayMaxBody bounds a relayed request or answer; the driver's own limit (1 MiB for a
	// key-value value) is lower, so it is the driver that refuses.
	relayMaxBody = 4 << 20
)

// relay serves the agent's workers on 127.0.0.1. Its methods are safe for concurrent use.
type relay struct {
	log    *slog.Logger
	ln     net.Listener
	srv    *http.Server
	served chan struct{}
	driver *url.URL     // scheme and host of the driver's listener
	hc     *http.Client // the agent's session client (one connection), reports batched
	secret []byte       // the agent secret, whence each job's secret

	mu      sync.Mutex
	jobID   string
	auth    *protocol.Auth // the job's rendezvous MAC, to check the polls answered here
	view    protocol.AgentWatchAnswer
	placed  map[string]protocol.Assignment // view's assignments, by worker ID
	asked   []string                       // the workers view answers for
	changed chan struct{}                  // closed and replaced when view changes
	workers map[string]int                 // the workers to watch, with how many processes each
	wset    chan struct{}                  // closed and replaced when workers changes
}

// startRelay listens on a loopback port and serves until close.
func startRelay(log *slog.Logger, driverURL string, hc *http.Client, secret []byte) (*relay, error) {
	u, err := url.Parse(driverURL)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("the workers' relay: listen on loopback: %w", err)
	}
	r := &relay{
		log: log, ln: ln, served: make(chan struct{}), driver: &url.URL{Scheme: u.Scheme, Host: u.Host}, secret: secret,
		changed: make(chan struct{}), workers: map[string]int{}, wset: make(chan struct{}),
	}
	// The session's connection, the workers' reports sent together.
	r.hc = &http.Client{Transport: &BatchTransport{Base: hc.Transport, Driver: r.driver}, Timeout: hc.Timeout}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	go func() { defer close(r.served); r.srv.Serve(ln) }()
	return r, nil
}

// close stops serving; held polls end.
func (r *relay) close() {
	r.srv.Close()
	<-r.served
}

// url is the rendezvous URL a worker gets instead of the driver's, rdzv: the same path, so
// that the targets the worker signs are those the driver checks.
func (r *relay) url(rdzv string) string {
	u, err := url.Parse(rdzv)
	if err != nil || u.Host == "" {
		return "http://" + r.ln.Addr().String()
	}
	return "http://" + r.ln.Addr().String() + strings.TrimRight(u.EscapedPath(), "/")
}

// forJob readies the relay for a session of job jobID: a new job forgets the old one's view
// and keys.
func (r *relay) forJob(jobID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if jobID == r.jobID {
		return
	}
	auth, _ := protocol.NewAuth(protocol.JobSecret(r.secret, jobID), protocol.RendezvousAuthLabel, 0)
	// The relay starts with the agent, and its workers with a session: none signed a request
	// before it started, and a driver restarted does not restart it.
	auth.StartedAt(time.Unix(0, 0))
	r.jobID, r.auth = jobID, auth
	r.setViewLocked(protocol.AgentWatchAnswer{}, nil)
}

// watch adds (+1) or drops (-1) a worker process to watch the assignment of.
func (r *relay) watch(worker string, delta int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	before := r.workers[worker]
	if r.workers[worker] += delta; r.workers[worker] <= 0 {
		delete(r.workers, worker)
	}
	if (before > 0) != (r.workers[worker] > 0) {
		close(r.wset)
		r.wset = make(chan struct{})
	}
}

// watched returns the workers to watch, sorted, the generation and host-update version to ask
// after (0 when the view does not answer for exactly those workers: the driver then answers at
// once), and a channel closed when the set changes.
func (r *relay) watched() (workers []string, gen, hosts uint64, set <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for w := range r.workers {
		workers = append(workers, w)
	}
	slices.Sort(workers)
	if slices.Equal(workers, r.asked) {
		gen, hosts = r.view.Generation, r.view.HostsVersion
	}
	return workers, gen, hosts, r.wset
}

// setView takes a watch answer for the workers asked.
func (r *relay) setView(v protocol.AgentWatchAnswer, asked []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.setViewLocked(v, asked)
}

func (r *relay) setViewLocked(v protocol.AgentWatchAnswer, asked []string) {
	if v.Generation == r.view.Generation && v.HostsVersion == r.view.HostsVersion && slices.Equal(asked, r.asked) {
		return
	}
	r.view, r.asked = v, asked
	r.placed = make(map[string]protocol.Assignment, len(v.Assignments))
	for _, p := range v.Assignments {
		r.placed[p.Worker] = p.Assignment
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

// ServeHTTP answers a worker: its assignment and host-update polls here, the rest relayed.
func (r *relay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	path := req.URL.EscapedPath()
	switch {
	case req.Method == http.MethodGet && strings.HasSuffix(path, "/v1/hosts/version"):
		r.poll(w, req, func(v protocol.AgentWatchAnswer, _ map[string]protocol.Assignment, after uint64) any {
			if v.HostsVersion > after {
				return protocol.HostsVersion{Version: v.HostsVersion}
			}
			return nil
		})
	case req.Method == http.MethodGet && strings.HasSuffix(path, "/assignment") && strings.Contains(path, "/v1/workers/"):
		seg := strings.TrimSuffix(path[strings.LastIndex(path, "/v1/workers/")+len("/v1/workers/"):], "/assignment")
		id, err := url.PathUnescape(seg)
		if err == nil {
			_, err = protocol.ParseWorkerID(id)
		}
		if err != nil {
			r.forward(w, req) // the driver says what is wrong with it
			return
		}
		r.poll(w, req, func(v protocol.AgentWatchAnswer, placed map[string]protocol.Assignment, after uint64) any {
			if a, ok := placed[id]; ok && v.Generation > after {
				return a
			}
			return nil
		})
	default:
		r.forward(w, req)
	}
}

// poll holds a worker's long-poll until answer, given the view and the request's after=,
// has an answer; 204 after wait_ms (at most relayPollTimeout).
func (r *relay) poll(w http.ResponseWriter, req *http.Request, answer func(protocol.AgentWatchAnswer, map[string]protocol.Assignment, uint64) any) {
	r.mu.Lock()
	auth := r.auth
	r.mu.Unlock()
	if auth == nil {
		http.Error(w, "the agent has not registered with the driver yet; retry", http.StatusServiceUnavailable)
		return
	}
	if _, err := auth.VerifyHeaders(req, time.Now()); err != nil {
		w.Header().Set("Connection", "close")
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	if err := protocol.CheckBody(req, nil); err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	q := req.URL.Query()
	after, err := strconv.ParseUint(q.Get("after"), 10, 64)
	if err != nil {
		http.Error(w, fmt.Sprintf("bad query parameter after=%q: want a non-negative decimal", q.Get("after")), http.StatusBadRequest)
		return
	}
	wait := relayPollTimeout
	if v := q.Get("wait_ms"); v != "" {
		ms, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			http.Error(w, fmt.Sprintf("bad query parameter wait_ms=%q: want a non-negative decimal", v), http.StatusBadRequest)
			return
		}
		wait = min(wait, time.Duration(min(ms, uint64(wait/time.Millisecond)))*time.Millisecond)
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		r.mu.Lock()
		out, ch := answer(r.view, r.placed, after), r.changed
		if r.auth != auth { // another job now: this worker's is over
			out = nil
		}
		r.mu.Unlock()
		if out != nil {
			b, _ := json.Marshal(out)
			w.Header().Set("Content-Type", "application/json")
			w.Write(append(b, '\n'))
			return
		}
		select {
		case <-ch:
		case <-timer.C:
			w.WriteHeader(http.StatusNoContent)
			return
		case <-req.Context().Done():
			return
		}
	}
}

// forward carries a worker's request to the driver as it came, and the driver's answer back.
func (r *relay) forward(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, relayMaxBody+1))
	if err != nil {
		http.Error(w, "read request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if len(body) > relayMaxBody {
		w.Header().Set("Connection", "close")
		http.Error(w, fmt.Sprintf("request body exceeds the limit of %d bytes", relayMaxBody), http.StatusRequestEntityTooLarge)
		return
	}
	// The target exactly as the worker sent (and signed) it.
	path, query, _ := strings.Cut(req.RequestURI, "?")
	out, err := http.NewRequestWithContext(req.Context(), req.Method, r.driver.String()+"/", bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	out.URL.Path, out.URL.Opaque, out.URL.RawQuery = "", path, query
	for k, vs := range req.Header {
		if strings.HasPrefix(k, "X-Elasticd-") || k == "Content-Type" {
			out.Header[k] = vs
		}
	}
	resp, err := r.hc.Do(out)
	if err != nil {
		if req.Context().Err() == nil {
			r.log.Debug("cannot relay a worker's request to the driver", "path", req.URL.Path, "err", err)
			http.Error(w, "the agent cannot reach the driver: "+protocol.OneLine(err.Error()), http.StatusBadGateway)
		}
		return
	}
	defer resp.Body.Close()
	ans, err := io.ReadAll(io.LimitReader(resp.Body, relayMaxBody+1))
	if err != nil || len(ans) > relayMaxBody {
		if err == nil {
			err = errors.New("answer too large")
		}
		http.Error(w, "the agent lost the driver's answer: "+protocol.OneLine(err.Error()), http.StatusBadGateway)
		return
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	if resp.Header.Get("Connection") == "close" || resp.StatusCode == http.StatusUnauthorized {
		w.Header().Set("Connection", "close")
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(ans)
}

// watchDriver keeps the session's watch of the driver: the view of the workers the agent runs,
// asked again whenever that set changes.
func (s *sess) watchDriver(ctx context.Context, wait time.Duration) error {
	rl := s.a.relay
	for attempt := 0; ctx.Err() == nil; {
		workers, gen, hosts, set := rl.watched()
		q := url.Values{}
		q.Set("generation", strconv.FormatUint(gen, 10))
		q.Set("hosts_version", strconv.FormatUint(hosts, 10))
		q.Set("wait_ms", strconv.FormatInt(wait.Milliseconds(), 10))
		for _, w := range workers {
			q.Add("worker", w)
		}
		rctx, cancel := context.WithCancel(ctx)
		moved := make(chan struct{})
		go func() {
			select {
			case <-set:
				close(moved)
				cancel()
			case <-rctx.Done():
			}
		}()
		var ans protocol.AgentWatchAnswer
		err := s.a.c.do(rctx, http.MethodGet, s.path("watch")+"?"+q.Encode(), nil, &ans, wait)
		cancel()
		select {
		case <-moved: // the workers changed under the request: ask for the new set
			continue
		default:
		}
		if err != nil {
			if err := s.retry(ctx, err, "cannot watch the driver's rendezvous for this host's workers; retrying", attempt); err != nil {
				return err
			}
			attempt++
			continue
		}
		attempt = 0
		s.a.touch()
		rl.setView(ans, workers)
	}
	return ctx.Err()
}
