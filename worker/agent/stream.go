// The session stream's agent side (docs/protocol.md §4.6).

package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticd/elasticd/protocol"
)

const (
	// streamPing is how often the agent pings its stream; the driver answers each.
	streamPing = 10 * time.Second
	// streamDead is how long the agent waits for any frame (an answer, a ping's answer)
	// before it takes the stream as dead, as HTTP/2's ping timeout would.
	streamDead = 25 * time.Second
	// streamOpenTimeout bounds dialling the driver and its answer to the upgrade.
	streamOpenTimeout = 10 * time.Second
)

// errNoStream: the driver does not serve session streams (an older release).
var errNoStream = errors.New("the driver serves no session streams")

// StreamTransport carries requests to the driver over the agent's session stream: one
// connection, opened by the first request and again by the first after it broke, on which
// every request (the agent's long-polls, events, its workers' relayed requests) goes as a
// frame and is answered as one. A driver that refuses the stream (a release without it, or
// one behind an HTTPS proxy) gets every request through Fallback from then on.
type StreamTransport struct {
	Driver   *url.URL          // the driver's scheme and host; only http streams
	Auth     *protocol.Auth    // signs the request that opens the stream
	Fallback http.RoundTripper // HTTP/2 to the same driver

	dial   sync.Mutex // one opening at a time
	mu     sync.Mutex
	cur    *streamConn
	off    atomic.Bool
	nextID atomic.Uint64
}

// RoundTrip implements http.RoundTripper.
func (t *StreamTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.off.Load() || t.Driver.Scheme != "http" {
		return t.Fallback.RoundTrip(req)
	}
	c, err := t.conn(req.Context())
	if errors.Is(err, errNoStream) {
		t.off.Store(true)
		return t.Fallback.RoundTrip(req)
	}
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	return c.roundTrip(req, t.nextID.Add(1))
}

// CloseIdleConnections closes the stream (http.Client.CloseIdleConnections calls it when
// the agent is done) and the fallback's idle connections.
func (t *StreamTransport) CloseIdleConnections() {
	t.mu.Lock()
	c := t.cur
	t.cur = nil
	t.mu.Unlock()
	if c != nil {
		c.fail(errors.New("closed by the agent"))
	}
	if ci, ok := t.Fallback.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// Streaming reports whether requests go over a stream (not yet known before the first).
func (t *StreamTransport) Streaming() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cur != nil && !t.off.Load()
}

// conn is the open stream, opened now if there is none.
func (t *StreamTransport) conn(ctx context.Context) (*streamConn, error) {
	t.dial.Lock()
	defer t.dial.Unlock()
	t.mu.Lock()
	c := t.cur
	t.mu.Unlock()
	if c != nil && c.alive() {
		return c, nil
	}
	c, err := t.open(ctx)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	t.cur = c
	t.mu.Unlock()
	return c, nil
}

// open dials the driver and asks for the stream.
func (t *StreamTransport) open(ctx context.Context) (*streamConn, error) {
	ctx, cancel := context.WithTimeout(ctx, streamOpenTimeout)
	defer cancel()
	hostport := t.Driver.Host
	if t.Driver.Port() == "" {
		hostport = net.JoinHostPort(t.Driver.Hostname(), "80")
	}
	conn, err := (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext(ctx, "tcp", hostport)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) }) // a called-off opening ends
	defer stop()
	req, err := http.NewRequest(http.MethodGet, (&url.URL{Scheme: t.Driver.Scheme, Host: t.Driver.Host, Path: protocol.AgentPathStream}).String(), nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", protocol.StreamUpgrade)
	t.Auth.Sign(req, nil)
	br := bufio.NewReader(conn)
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, fmt.Errorf("open the session stream: %w", err)
	}
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("open the session stream: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		conn.Close()
		reason := protocol.ErrorReason(b)
		switch resp.StatusCode {
		case http.StatusNotFound, http.StatusBadRequest, http.StatusMethodNotAllowed:
			return nil, fmt.Errorf("%w (%d: %s)", errNoStream, resp.StatusCode, reason)
		case http.StatusUnauthorized:
			return nil, &errRefused{reason: reason}
		}
		return nil, fmt.Errorf("open the session stream: the driver answered %d: %s", resp.StatusCode, reason)
	}
	if stop(); ctx.Err() != nil {
		conn.Close()
		return nil, ctx.Err()
	}
	conn.SetDeadline(time.Time{})
	c := &streamConn{conn: conn, br: br, pending: map[uint64]chan streamAnswer{}, done: make(chan struct{})}
	go c.read()
	go c.ping()
	return c, nil
}

// streamConn is one open session stream.
type streamConn struct {
	conn net.Conn
	br   *bufio.Reader

	wmu sync.Mutex // one frame written at a time

	mu      sync.Mutex
	pending map[uint64]chan streamAnswer // requests awaiting their answers, by ID
	err     error                        // why the stream ended; nil while it is open
	done    chan struct{}                // closed when it ends
}

type streamAnswer struct {
	f   protocol.Frame
	err error
}

func (c *streamConn) alive() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err == nil
}

// roundTrip sends req as request id and waits for its answer or req's end.
func (c *streamConn) roundTrip(req *http.Request, id uint64) (*http.Response, error) {
	body, err := readBody(req)
	if err != nil {
		return nil, err
	}
	ch := make(chan streamAnswer, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.pending[id] = ch
	c.mu.Unlock()
	head := protocol.StreamHead{Method: req.Method, Target: req.URL.RequestURI(), Header: req.Header}
	if err := c.write(protocol.Frame{Kind: protocol.FrameRequest, ID: id, Head: head, Body: body}); err != nil {
		c.fail(err)
		return nil, err
	}
	select {
	case a := <-ch:
		if a.err != nil {
			return nil, a.err
		}
		h := a.f.Head.Header
		if h == nil {
			h = http.Header{}
		}
		st := a.f.Head.Status
		return &http.Response{Status: strconv.Itoa(st) + " " + http.StatusText(st), StatusCode: st,
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: h, ContentLength: int64(len(a.f.Body)),
			Body: io.NopCloser(bytes.NewReader(a.f.Body)), Request: req}, nil
	case <-req.Context().Done():
		c.mu.Lock()
		_, waiting := c.pending[id]
		delete(c.pending, id)
		c.mu.Unlock()
		if waiting { // tell the driver, which ends the request (a long-poll) unanswered
			go c.write(protocol.Frame{Kind: protocol.FrameCancel, ID: id})
		}
		return nil, req.Context().Err()
	}
}

// write sends one frame, whole.
func (c *streamConn) write(f protocol.Frame) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.conn.SetWriteDeadline(time.Now().Add(streamDead))
	return protocol.WriteFrame(c.conn, f)
}

// read delivers the driver's answers until the stream ends or goes silent for streamDead.
func (c *streamConn) read() {
	for {
		c.conn.SetReadDeadline(time.Now().Add(streamDead))
		f, err := protocol.ReadFrame(c.br, protocol.MaxStreamFrame)
		if err != nil {
			c.fail(err)
			return
		}
		if f.Kind != protocol.FrameAnswer {
			continue // a ping's answer: the deadline moved
		}
		c.mu.Lock()
		ch := c.pending[f.ID]
		delete(c.pending, f.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- streamAnswer{f: f}
		}
	}
}

// ping keeps the stream heard from both ways while it is idle.
func (c *streamConn) ping() {
	t := time.NewTicker(streamPing)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
			if err := c.write(protocol.Frame{Kind: protocol.FramePing}); err != nil {
				c.fail(err)
				return
			}
		}
	}
}

// fail ends the stream: every request waiting on it gets err.
func (c *streamConn) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = fmt.Errorf("the session stream to the driver broke: %w", err)
	for id, ch := range c.pending {
		ch <- streamAnswer{err: c.err}
		delete(c.pending, id)
	}
	close(c.done)
	c.conn.Close()
}
