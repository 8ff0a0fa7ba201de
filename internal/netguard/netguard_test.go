package netguard

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A flood of idle connections on loopback: the pending ones stay within the per-address cap
// (the oldest are closed), and a real client is still served.
func TestFloodOfIdleConnections(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := New(inner, Config{MaxPending: 100, MaxPendingPerIP: 50})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		ConnState: ln.ConnState, ReadHeaderTimeout: time.Minute}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	const flood = 600
	conns := make([]net.Conn, 0, flood)
	for range flood {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + inner.Addr().String() + "/v1/status")
	if err != nil {
		t.Fatalf("a real client under the flood: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "ok" {
		t.Fatalf("answer %q", body)
	}
	// The flood's connections still open: at most the per-address cap (they are all from
	// 127.0.0.1); the others were closed by the server.
	open := 0
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, c := range conns {
		wg.Go(func() {
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err := c.Read(make([]byte, 1))
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				mu.Lock()
				open++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if open > 50 || ln.Pending() > 50 {
		t.Fatalf("%d flood connections still open, %d pending; want at most the per-address cap 50", open, ln.Pending())
	}
	t.Logf("%d of %d idle connections left open; %d pending", open, flood, ln.Pending())
}

// fakeListener fails its first errs Accepts with err, then gives conns.
type fakeListener struct {
	net.Listener
	errs int
	err  error
}

func (f *fakeListener) Accept() (net.Conn, error) {
	if f.errs > 0 {
		f.errs--
		return nil, f.err
	}
	a, b := net.Pipe()
	go io.Copy(io.Discard, b)
	return a, nil
}

func (f *fakeListener) Close() error   { return nil }
func (f *fakeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// Out of file descriptors: Accept retries with a growing backoff, returns the connection once
// one comes, and logs the errors once per interval with their count, not once per retry.
func TestAcceptErrorsBackOffAndLogOnce(t *testing.T) {
	var logs bytes.Buffer
	emfile := &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	ln := New(&fakeListener{errs: 40, err: emfile}, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	var waits []time.Duration
	now := time.Unix(1000, 0)
	ln.now = func() time.Time { return now }
	ln.sleep = func(d time.Duration) <-chan time.Time {
		waits = append(waits, d)
		now = now.Add(d)
		c := make(chan time.Time, 1)
		c <- now
		return c
	}
	c, err := ln.Accept()
	if err != nil || c == nil {
		t.Fatalf("Accept: %v", err)
	}
	if len(waits) != 40 || waits[0] != 5*time.Millisecond || waits[1] != 10*time.Millisecond || waits[39] != time.Second {
		t.Fatalf("backoffs %v: want 5ms doubling up to 1s", waits)
	}
	// 40 errors over about 34 s of backoff: a line at the first, then one per 10 s.
	lines := strings.Count(logs.String(), "connection flood?")
	if lines < 3 || lines > 5 {
		t.Fatalf("%d log lines for 40 accept errors over %v:\n%s", lines, now.Sub(time.Unix(1000, 0)), logs.String())
	}
	if !strings.Contains(logs.String(), "too many open files") {
		t.Fatalf("the log does not say what the error was:\n%s", logs.String())
	}
	ln.Listener.(*fakeListener).errs, ln.Listener.(*fakeListener).err = 1, net.ErrClosed
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a closed listener: %v, want net.ErrClosed returned", err)
	}
}

// Agents speak HTTP/2 with prior knowledge, whose connections net/http's server takes past its
// HTTP/1 request loop: they must still count as active once their first stream starts, not
// pending, or enough agents would have the oldest of them closed as a flood.
func TestHTTP2ConnectionsAreNotPending(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := New(inner, Config{MaxPending: 4, MaxPendingPerIP: 4})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.Proto) }),
		ConnState: ln.ConnState, ReadHeaderTimeout: time.Minute}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	var clients []*http.Client
	for range 12 { // each client its own connection: three times the cap
		tr := &http.Transport{Protocols: new(http.Protocols)}
		tr.Protocols.SetUnencryptedHTTP2(true)
		t.Cleanup(tr.CloseIdleConnections)
		clients = append(clients, &http.Client{Transport: tr, Timeout: 10 * time.Second})
	}
	get := func(c *http.Client) string {
		resp, err := c.Get("http://" + inner.Addr().String() + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	for _, c := range clients {
		if p := get(c); p != "HTTP/2.0" {
			t.Fatalf("served as %q, want HTTP/2.0", p)
		}
	}
	if n := ln.Pending(); n != 0 {
		t.Fatalf("%d connections pending after their HTTP/2 requests, want 0", n)
	}
	// Every connection is still open: a second request on each reuses it.
	for _, c := range clients {
		get(c)
	}
	if n := ln.Pending(); n != 0 {
		t.Fatalf("%d connections pending, want 0", n)
	}
}
