package rendezvous

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/elasticd/elasticd/allreduce"
	"github.com/elasticd/elasticd/protocol"
)

// Client is a worker's side of rendezvous (docs/protocol.md §2; the wire types are package
// protocol's, shared with the driver's server in driver/rendezvous). Its methods are safe for concurrent use.
type Client struct {
	base string // scheme://host[:port][/prefix], without a trailing slash
	auth *protocol.Auth
	id   protocol.WorkerID
	hc   *http.Client

	retries    int           // further attempts after a connection error or 5xx
	retryDelay time.Duration // between attempts
	pollWait   time.Duration // how long the client asks the server to hold a long-poll
	driverWait time.Duration // SetDriverWait's; 0: retries only
}

// SetDriverWait has requests that meet connection errors or 5xx answers retried for up to d
// since the first, backing off to 2 s apart, rather than retries times: a worker kept by an
// agent outlives its driver, and one that must reset while the driver restarts waits for
// it. Call it before the client is used.
func (c *Client) SetDriverWait(d time.Duration) { c.driverWait = d }

const (
	defaultRetries    = 3
	defaultRetryDelay = 100 * time.Millisecond
	defaultPollWait   = 25 * time.Second
	// requestTimeout bounds one attempt of a request that does not long-poll; a long-poll
	// attempt gets pollWait on top.
	requestTimeout  = 15 * time.Second
	maxResponseBody = 64 << 20 // a key-value value; larger answers are refused
	maxErrorBody    = 1 << 10
)

// NewClient returns a client for the rendezvous server at baseURL (e.g. "http://10.0.0.1:7000")
// that acts as worker id. hc nil means a client of its own, with bounded dial and handshake
// times, no proxy and no redirects.
func NewClient(baseURL string, secret []byte, id protocol.WorkerID, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{
			Transport: &http.Transport{
				Proxy:                 nil, // the rendezvous is on the job's own network
				DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
				ForceAttemptHTTP2:     true,
				MaxIdleConns:          8,
				MaxIdleConnsPerHost:   8,
				IdleConnTimeout:       90 * time.Second,
				TLSHandshakeTimeout:   5 * time.Second,
				ExpectContinueTimeout: time.Second,
			},
			// A redirect would be re-signed for the wrong target; never follow one.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return &Client{
		base:       strings.TrimRight(baseURL, "/"),
		auth:       protocol.NewSigner(secret, protocol.RendezvousAuthLabel),
		id:         id,
		hc:         hc,
		retries:    defaultRetries,
		retryDelay: defaultRetryDelay,
		pollWait:   defaultPollWait,
	}
}

// CloseIdleConnections closes the client's idle keep-alive connections.
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

// ReportLoad tells the driver this worker's recent mean step time, one of the inputs of
// --slot-policy loadaware.
func (c *Client) ReportLoad(ctx context.Context, step time.Duration) error {
	return c.post(ctx, "load", protocol.LoadReport{StepSeconds: step.Seconds()})
}

// ReportProgress tells the driver how far training has got (rank 0 sends it about once a
// second): the job's step count and the step of the last commit in a generation, and, when the
// program gives them, the latest loss and the steps in all.
func (c *Client) ReportProgress(ctx context.Context, p protocol.ProgressReport) error {
	return c.post(ctx, "progress", p)
}

// post sends v to POST /v1/workers/{id}/{what}, which answers 204.
func (c *Client) post(ctx context.Context, what string, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	target := "/v1/workers/" + escapeSegment(c.id.String()) + "/" + what
	if _, _, err := c.do(ctx, http.MethodPost, target, body, 0, http.StatusNoContent); err != nil {
		return fmt.Errorf("rendezvous: report %s: %w", what, err)
	}
	return nil
}

// Report tells the driver this worker's state in generation gen. A message longer than
// MaxMessage is truncated. Retries carry the same report ID, so the driver sees a report
// once even when an answer was lost.
func (c *Client) Report(ctx context.Context, gen uint64, st protocol.State, msg string) error {
	return c.report(ctx, gen, st, protocol.ReadyReport{Message: msg})
}

// ReportReady is Report(READY) that also tells the driver the work this worker rolled back
// since generation gen's last commit (for the job's rollback accounting), and whether it left
// because a peer went silent (the driver then fails whoever does not follow at once).
func (c *Client) ReportReady(ctx context.Context, gen uint64, r protocol.ReadyReport) error {
	return c.report(ctx, gen, protocol.Ready, r)
}

func (c *Client) report(ctx context.Context, gen uint64, st protocol.State, r protocol.ReadyReport) error {
	// Invalid UTF-8 would grow in JSON (each bad byte becomes U+FFFD), so replace it first.
	msg := truncate(strings.ToValidUTF8(r.Message, "\uFFFD"), protocol.MaxMessage)
	body, err := json.Marshal(protocol.StateReport{Protocol: protocol.ProtocolVersion, Generation: &gen, State: st, Message: msg, ReportID: protocol.NewReportID(), Rollback: r.Rollback, SilentPeer: r.SilentPeer, Unreachable: r.Unreachable, Reached: r.Reached})
	if err != nil {
		return fmt.Errorf("rendezvous: report %s: %w", st, err)
	}
	target := "/v1/workers/" + escapeSegment(c.id.String()) + "/state"
	if _, _, err := c.do(ctx, http.MethodPost, target, body, 0, http.StatusNoContent); err != nil {
		return fmt.Errorf("rendezvous: report %s for generation %d: %w", st, gen, err)
	}
	return nil
}

// Assignment waits (re-polling) until this worker has an assignment with Generation > after,
// or ctx ends. An assignment with Removed set means the worker has no place any more.
func (c *Client) Assignment(ctx context.Context, after uint64) (protocol.Assignment, error) {
	target := "/v1/workers/" + escapeSegment(c.id.String()) + "/assignment?after=" + strconv.FormatUint(after, 10) + c.waitQuery()
	for {
		code, body, err := c.do(ctx, http.MethodGet, target, nil, c.pollWait, http.StatusOK, http.StatusNoContent)
		if err != nil {
			return protocol.Assignment{}, fmt.Errorf("rendezvous: assignment after generation %d: %w", after, err)
		}
		if code == http.StatusNoContent {
			continue
		}
		var a protocol.Assignment
		if err := json.Unmarshal(body, &a); err != nil {
			return protocol.Assignment{}, fmt.Errorf("rendezvous: assignment after generation %d: decode answer: %w", after, err)
		}
		if a.Generation <= after {
			return protocol.Assignment{}, fmt.Errorf("rendezvous: assignment after generation %d: server answered generation %d", after, a.Generation)
		}
		return a, nil
	}
}

// HostsUpdated waits until the host-update version is > after, and returns it.
func (c *Client) HostsUpdated(ctx context.Context, after uint64) (uint64, error) {
	target := "/v1/hosts/version?after=" + strconv.FormatUint(after, 10) + c.waitQuery()
	for {
		code, body, err := c.do(ctx, http.MethodGet, target, nil, c.pollWait, http.StatusOK, http.StatusNoContent)
		if err != nil {
			return 0, fmt.Errorf("rendezvous: host updates after version %d: %w", after, err)
		}
		if code == http.StatusNoContent {
			continue
		}
		var v protocol.HostsVersion
		if err := json.Unmarshal(body, &v); err != nil {
			return 0, fmt.Errorf("rendezvous: host updates after version %d: decode answer: %w", after, err)
		}
		if v.Version <= after {
			return 0, fmt.Errorf("rendezvous: host updates after version %d: server answered version %d", after, v.Version)
		}
		return v.Version, nil
	}
}

// Store returns the key-value store of generation gen. It satisfies allreduce.Store: Get
// waits for the key; both fail with an error wrapping ErrGenerationGone once the driver has
// published a newer generation.
func (c *Client) Store(gen uint64) allreduce.Store { return &store{c: c, gen: gen} }

type store struct {
	c   *Client
	gen uint64
}

func (s *store) target(key string) string {
	return "/v1/kv/" + strconv.FormatUint(s.gen, 10) + "/" + escapeSegment(key)
}

// escapeSegment escapes s as one path segment. "." and ".." are spelled with %2E, which
// servers do not treat as dot segments to clean away.
func escapeSegment(s string) string {
	if s == "." || s == ".." {
		return strings.Repeat("%2E", len(s))
	}
	return url.PathEscape(s)
}

func (s *store) Set(ctx context.Context, key string, value []byte) error {
	if _, _, err := s.c.do(ctx, http.MethodPut, s.target(key), value, 0, http.StatusNoContent); err != nil {
		return fmt.Errorf("rendezvous: set key %q of generation %d: %w", key, s.gen, err)
	}
	return nil
}

func (s *store) Get(ctx context.Context, key string) ([]byte, error) {
	target := s.target(key) + "?" + strings.TrimPrefix(s.c.waitQuery(), "&")
	for {
		code, body, err := s.c.do(ctx, http.MethodGet, target, nil, s.c.pollWait, http.StatusOK, http.StatusNoContent)
		if err != nil {
			return nil, fmt.Errorf("rendezvous: get key %q of generation %d: %w", key, s.gen, err)
		}
		if code == http.StatusOK {
			return body, nil
		}
	}
}

func (c *Client) waitQuery() string {
	return "&wait_ms=" + strconv.FormatInt(c.pollWait.Milliseconds(), 10)
}

// do sends a signed request and returns the status (one of want) and body of the answer.
// Connection errors and 5xx answers are retried c.retries times, c.retryDelay apart; other
// answers outside want come back as a *protocol.StatusError.
func (c *Client) do(ctx context.Context, method, target string, body []byte, wait time.Duration, want ...int) (int, []byte, error) {
	var errs []error
	var firstErr, firstEarly time.Time
	delay := c.retryDelay
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return 0, nil, fmt.Errorf("%s %s: %w (after: %w)", method, target, ctx.Err(), errors.Join(errs...))
			}
		}
		code, data, err := c.once(ctx, method, target, body, wait)
		if err == nil {
			for _, w := range want {
				if code == w {
					return code, data, nil
				}
			}
			err = &protocol.StatusError{Method: method, Target: target, Code: code, Message: protocol.ErrorReason(data)}
			if code == http.StatusUnauthorized && protocol.SignedBeforeStart(err.(*protocol.StatusError).Message) {
				// A driver that has just started, and this host's clock behind its own:
				// sign again, a second later, until the clocks' gap has passed.
				if firstEarly.IsZero() {
					firstEarly = time.Now()
				}
				if time.Since(firstEarly) < protocol.DefaultReplayWindow {
					delay = time.Second
					continue
				}
			}
			if code < 500 {
				return 0, nil, err
			}
		}
		if ctx.Err() != nil {
			return 0, nil, fmt.Errorf("%s %s: %w", method, target, ctx.Err())
		}
		if firstErr.IsZero() {
			firstErr = time.Now()
		}
		if len(errs) < 8 { // a driver away for minutes: keep the first few, not every one
			errs = append(errs, err)
		}
		if c.driverWait > 0 {
			if time.Since(firstErr) >= c.driverWait {
				return 0, nil, fmt.Errorf("gave up after %d attempts over %v (the driver's wait): %w", attempt+1, c.driverWait, err)
			}
			delay = min(2*delay, 2*time.Second)
			continue
		}
		if attempt >= c.retries {
			return 0, nil, fmt.Errorf("gave up after %d attempts, %v apart: %w", attempt+1, c.retryDelay, err)
		}
	}
}

func (c *Client) once(ctx context.Context, method, target string, body []byte, wait time.Duration) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout+wait)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+target, rd)
	if err != nil {
		return 0, nil, err
	}
	c.auth.Sign(req, body)
	if body != nil {
		req.Header.Set("Content-Type", "application/octet-stream")
		if method == http.MethodPost {
			req.Header.Set("Content-Type", "application/json")
		}
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	limit := int64(maxErrorBody)
	if resp.StatusCode == http.StatusOK {
		limit = maxResponseBody
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return 0, nil, fmt.Errorf("read answer: %w", err)
	}
	if int64(len(data)) > limit {
		if resp.StatusCode != http.StatusOK {
			data = data[:limit]
		} else {
			return 0, nil, fmt.Errorf("answer longer than %d bytes", limit)
		}
	}
	return resp.StatusCode, data, nil
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 {
		r, size := utf8.DecodeLastRuneInString(s)
		if r != utf8.RuneError || size > 1 {
			break
		}
		s = s[:len(s)-1]
	}
	return s
}
