package rendezvous_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/protocol"
	rdzvclient "github.com/elasticd/elasticd/worker/rendezvous"
)

var secret = []byte("0123456789abcdef-test-secret")

// testLogger routes a server's log to t.Log.
func testLogger(t testing.TB, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: level}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// env is a rendezvous server behind a real HTTP server on loopback.
type env struct {
	srv  *rendezvous.Server
	ts   *httptest.Server
	read atomic.Int64 // bytes the HTTP server has read from its connections
	reqs atomic.Int64 // requests that reached the handler
}

// newEnv starts a server; tweak adjusts its config. Cleanup closes the rendezvous server
// first (ending long-polls) and then the HTTP server.
func newEnv(t testing.TB, tweak func(*rendezvous.ServerConfig)) *env {
	t.Helper()
	cfg := rendezvous.ServerConfig{Secret: secret, PollTimeout: 5 * time.Second, Logger: testLogger(t, slog.LevelInfo)}
	if tweak != nil {
		tweak(&cfg)
	}
	srv, err := rendezvous.NewServer(cfg)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	e := &env{srv: srv}
	e.ts = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.reqs.Add(1)
		srv.ServeHTTP(w, r)
	}))
	e.ts.Listener = countingListener{e.ts.Listener, &e.read}
	e.ts.Start()
	t.Cleanup(func() {
		srv.Close()
		e.ts.Close()
	})
	return e
}

func (e *env) client(id protocol.WorkerID) *rdzvclient.Client {
	return rdzvclient.NewClient(e.ts.URL, secret, id, e.ts.Client())
}

func wid(host string, slot int) protocol.WorkerID {
	return protocol.WorkerID{Host: host, Slot: slot}
}

// waitFor polls cond every few milliseconds for at most d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// countingListener counts the bytes the server reads, to prove what it did not read.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{c.(*net.TCPConn), l.n}, nil
}

type countingConn struct {
	*net.TCPConn // keeps CloseWrite, which net/http uses to close without a reset
	n            *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.TCPConn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// signed is a request signed as docs/protocol.md §2 says, written independently of the package so
// that the tests check the documented wire format, not the package against itself.
type signed struct {
	method, target string
	body           []byte
	secret         []byte
	at             time.Time
	nonce          string
	mutate         func(h http.Header) // after signing
	bodySent       []byte              // when set, sent instead of body (which was signed)
	sendMethod     string              // when set, sent instead of method (which was signed)
}

func (s signed) request(t testing.TB, base string) *http.Request {
	t.Helper()
	if s.secret == nil {
		s.secret = secret
	}
	if s.at.IsZero() {
		s.at = time.Now()
	}
	if s.nonce == "" {
		var b [16]byte
		rand.Read(b[:])
		s.nonce = hex.EncodeToString(b[:])
	}
	sum := sha256.Sum256(s.body)
	bh := hex.EncodeToString(sum[:])
	ts := strconv.FormatInt(s.at.Unix(), 10)
	km := hmac.New(sha256.New, s.secret)
	km.Write([]byte("elasticd rendezvous v1"))
	m := hmac.New(sha256.New, km.Sum(nil))
	m.Write([]byte(strings.Join([]string{"ELASTICD-HMAC-SHA256", s.method, s.target, ts, s.nonce, bh}, "\n")))
	sent := s.body
	if s.bodySent != nil {
		sent = s.bodySent
	}
	method := s.method
	if s.sendMethod != "" {
		method = s.sendMethod
	}
	req, err := http.NewRequest(method, base+s.target, bytes.NewReader(sent))
	if err != nil {
		t.Fatal(err)
	}
	if got := req.URL.RequestURI(); got != s.target {
		t.Fatalf("target %q would be sent as %q", s.target, got)
	}
	req.Header.Set("X-Elasticd-Timestamp", ts)
	req.Header.Set("X-Elasticd-Nonce", s.nonce)
	req.Header.Set("X-Elasticd-Content-Sha256", bh)
	req.Header.Set("X-Elasticd-Signature", hex.EncodeToString(m.Sum(nil)))
	if s.mutate != nil {
		s.mutate(req.Header)
	}
	return req
}

// send sends s and returns the status and the body.
func (e *env) send(t testing.TB, s signed) (int, string) {
	t.Helper()
	resp, err := e.ts.Client().Do(s.request(t, e.ts.URL))
	if err != nil {
		t.Fatalf("%s %s: %v", s.method, s.target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}
