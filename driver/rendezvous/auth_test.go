package rendezvous_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/protocol"
	rdzvclient "github.com/elasticd/elasticd/worker/rendezvous"
)

// TestAuth: every way a request can fail authentication gets 401 with a one-line reason and
// nothing else, before the request is routed (an unknown path is 401, not 404).
func TestAuth(t *testing.T) {
	e := newEnv(t, func(c *rendezvous.ServerConfig) { c.ReplayWindow = 10 * time.Second })
	hosts := "/v1/hosts/version?after=0&wait_ms=0"
	state := "/v1/workers/" + url.PathEscape("h/0") + "/state"
	body := []byte(`{"generation":1,"state":"READY"}`)
	drop := func(name string) func(http.Header) { return func(h http.Header) { h.Del(name) } }
	flip := func(h http.Header) {
		s := []byte(h.Get("X-Elasticd-Signature"))
		if s[10] == '0' { // another hex digit: well formed, wrong
			s[10] = '1'
		} else {
			s[10] = '0'
		}
		h.Set("X-Elasticd-Signature", string(s))
	}
	for _, tc := range []struct {
		name string
		req  signed
		msg  string // "" = authenticated
	}{
		{"valid GET", signed{method: "GET", target: hosts}, ""},
		{"valid POST", signed{method: "POST", target: state, body: body}, ""},
		{"bad MAC", signed{method: "GET", target: hosts, mutate: flip}, "bad signature"},
		{"wrong secret", signed{method: "GET", target: hosts, secret: []byte("another-secret-of-16+")}, "bad signature"},
		{"missing timestamp", signed{method: "GET", target: hosts, mutate: drop("X-Elasticd-Timestamp")}, "missing X-Elasticd-Timestamp header"},
		{"missing nonce", signed{method: "GET", target: hosts, mutate: drop("X-Elasticd-Nonce")}, "missing X-Elasticd-Nonce header"},
		{"missing body hash", signed{method: "GET", target: hosts, mutate: drop("X-Elasticd-Content-Sha256")}, "missing X-Elasticd-Content-Sha256 header"},
		{"missing signature", signed{method: "GET", target: hosts, mutate: drop("X-Elasticd-Signature")}, "missing X-Elasticd-Signature header"},
		{"old timestamp", signed{method: "GET", target: hosts, at: time.Now().Add(-30 * time.Second)}, "timestamp outside the replay window"},
		{"future timestamp", signed{method: "GET", target: hosts, at: time.Now().Add(30 * time.Second)}, "timestamp outside the replay window"},
		{"malformed timestamp", signed{method: "GET", target: hosts, mutate: func(h http.Header) { h.Set("X-Elasticd-Timestamp", "yesterday") }}, "malformed X-Elasticd-Timestamp"},
		{"short nonce", signed{method: "GET", target: hosts, nonce: "abcd"}, "malformed X-Elasticd-Nonce"},
		{"body not the one signed", signed{method: "POST", target: state, body: body, bodySent: []byte(`{"generation":1,"state":"FAILURE"}`)}, "body does not match"},
		{"method not the one signed", signed{method: "GET", target: hosts, sendMethod: "DELETE"}, "bad signature"},
		{"unknown path, unsigned", signed{method: "GET", target: "/v1/secrets", mutate: func(h http.Header) {
			for k := range h {
				h.Del(k)
			}
		}}, "missing X-Elasticd-Timestamp header"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, msg := e.send(t, tc.req)
			if tc.msg == "" {
				if code/100 != 2 {
					t.Fatalf("got %d %q; want success", code, msg)
				}
				return
			}
			if code != http.StatusUnauthorized || !strings.Contains(msg, tc.msg) {
				t.Fatalf("got %d %q; want 401 %q", code, msg, tc.msg)
			}
			if strings.Count(msg, "\n") != 1 || len(msg) > 200 {
				t.Fatalf("401 answer %q is not one short line", msg)
			}
		})
	}

	t.Run("replayed", func(t *testing.T) {
		req := signed{method: "POST", target: state, body: body, nonce: "00112233445566778899aabbccddeeff"}
		if code, msg := e.send(t, req); code != http.StatusNoContent {
			t.Fatalf("first: %d %q", code, msg)
		}
		if code, msg := e.send(t, req); code != http.StatusUnauthorized || !strings.Contains(msg, "replayed") {
			t.Fatalf("replay: %d %q; want 401 replayed", code, msg)
		}
		// The same nonce under another timestamp is a replay too.
		req.at = time.Now().Add(2 * time.Second)
		if code, msg := e.send(t, req); code != http.StatusUnauthorized || !strings.Contains(msg, "replayed") {
			t.Fatalf("replay, new timestamp: %d %q; want 401 replayed", code, msg)
		}
	})

	t.Run("signed for another target", func(t *testing.T) {
		req := signed{method: "GET", target: "/v1/hosts/version?after=5&wait_ms=0"}.request(t, e.ts.URL)
		req.URL.RawQuery = "after=0&wait_ms=0"
		resp, err := e.ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("query changed after signing: %d; want 401", resp.StatusCode)
		}
	})

	t.Run("client with the wrong secret", func(t *testing.T) {
		c := rdzvclient.NewClient(e.ts.URL, []byte("not-the-job-secret!"), wid("h", 0), e.ts.Client())
		before := e.reqs.Load()
		err := c.Report(t.Context(), 1, protocol.Ready, "")
		if se, ok := errors.AsType[*protocol.StatusError](err); !ok || se.Code != 401 || se.Message != "bad signature" {
			t.Fatalf("Report = %v; want 401 bad signature", err)
		}
		if n := e.reqs.Load() - before; n != 1 {
			t.Fatalf("a 401 was tried %d times; want once", n)
		}
	})
	// The events of the authenticated POSTs reached the driver, and only those.
	for _, want := range []int{1, 1} {
		select {
		case ev := <-e.srv.Events():
			if ev.State != protocol.Ready || ev.Worker != wid("h", 0) {
				t.Fatalf("event %+v", ev)
			}
		case <-time.After(time.Second):
			t.Fatalf("missing event %d", want)
		}
	}
	select {
	case ev := <-e.srv.Events():
		t.Fatalf("an unauthenticated report reached the driver: %+v", ev)
	case <-time.After(50 * time.Millisecond):
	}
}

// TestMalformed: authenticated requests that make no sense get 400 with a message that says
// what is wrong, and are not retried by the client.
func TestMalformed(t *testing.T) {
	e := newEnv(t, nil)
	e.srv.Publish(1, nil)
	state := "/v1/workers/" + url.PathEscape("h/0") + "/state"
	for _, tc := range []struct {
		name, method, target, body string
		code                       int
		msg                        string
	}{
		{"worker ID without slot", "POST", "/v1/workers/justahost/state", `{"generation":1,"state":"READY"}`, 400, `bad worker ID "justahost": want <host>/<slot>`},
		{"worker ID negative slot", "GET", "/v1/workers/" + url.PathEscape("h/-1") + "/assignment?after=0", "", 400, `slot "-1" is not a non-negative decimal`},
		{"worker ID empty host", "GET", "/v1/workers/" + url.PathEscape("/1") + "/assignment?after=0", "", 400, "empty host"},
		{"bad after", "GET", "/v1/workers/" + url.PathEscape("h/0") + "/assignment?after=-1", "", 400, `bad query parameter after="-1"`},
		{"missing after", "GET", "/v1/hosts/version", "", 400, `missing query parameter "after"`},
		{"bad wait", "GET", "/v1/hosts/version?after=0&wait_ms=soon", "", 400, `bad query parameter wait_ms="soon"`},
		{"bad kv generation", "GET", "/v1/kv/one/key", "", 400, `bad generation "one"`},
		{"huge kv generation", "PUT", "/v1/kv/18446744073709551616/key", "v", 400, `bad generation "18446744073709551616"`},
		{"control character in key", "PUT", "/v1/kv/1/a%00b", "v", 400, "control character"},
		{"bad JSON", "POST", state, `{"generation":1,`, 400, "bad JSON body"},
		{"not JSON", "POST", state, `READY`, 400, "bad JSON body: invalid character"},
		{"empty body", "POST", state, ``, 400, "empty body: want a JSON object"},
		{"trailing data", "POST", state, `{"generation":1,"state":"READY"} {}`, 400, "data after the JSON object"},
		{"unknown state", "POST", state, `{"generation":1,"state":"RUNNING"}`, 400, `unknown state "RUNNING": want READY, SUCCESS or FAILURE`},
		{"missing generation", "POST", state, `{"state":"READY"}`, 400, `missing "generation"`},
		{"another protocol version", "POST", state, `{"protocol":2,"generation":1,"state":"READY"}`, 400, "rendezvous protocol version 2 is not spoken by this driver, which speaks version 1"},
		{"generation of the wrong type", "POST", state, `{"generation":"1","state":"READY"}`, 400, `field "generation": JSON string where a number was expected`},
		{"negative generation", "POST", state, `{"generation":-1,"state":"READY"}`, 400, `field "generation"`},
		{"message too long", "POST", state, `{"generation":1,"state":"FAILURE","message":"` + strings.Repeat("x", protocol.MaxMessage+1) + `"}`, 400, "message of 4097 bytes is longer than 4096"},
		{"wrong method", "GET", state, "", 405, "Method Not Allowed"},
		{"unknown path", "GET", "/v1/nothing", "", 404, "404 page not found"},
		{"old API", "GET", "/rank_and_size/h:0", "", 404, "404 page not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body []byte
			if tc.body != "" {
				body = []byte(tc.body)
			}
			code, msg := e.send(t, signed{method: tc.method, target: tc.target, body: body})
			if code != tc.code || !strings.Contains(msg, tc.msg) {
				t.Fatalf("got %d %q; want %d %q", code, msg, tc.code, tc.msg)
			}
		})
	}
	select {
	case ev := <-e.srv.Events():
		t.Fatalf("a malformed report reached the driver: %+v", ev)
	default:
	}

	c := e.client(wid("h", 0))
	before := e.reqs.Load()
	err := c.Report(t.Context(), 1, protocol.State("RUNNING"), "")
	if err == nil || !strings.Contains(err.Error(), `400 unknown state "RUNNING"`) {
		t.Fatalf("Report(RUNNING) = %v", err)
	}
	if n := e.reqs.Load() - before; n != 1 {
		t.Fatalf("a 400 was tried %d times; want once", n)
	}
}

// TestOversized: a body over MaxBody gets 413, and the server reads at most about MaxBody of
// it (net/http may discard up to 256 KiB more while closing), not the whole thing.
func TestOversized(t *testing.T) {
	const maxBody = 1 << 10
	const huge = 64 << 20
	e := newEnv(t, func(c *rendezvous.ServerConfig) { c.MaxBody = maxBody })
	e.srv.Publish(1, nil)
	s := e.client(wid("h", 0)).Store(1)
	if err := s.Set(t.Context(), "fits", make([]byte, maxBody)); err != nil {
		t.Fatalf("a body of exactly MaxBody: %v", err)
	}
	err := s.Set(t.Context(), "too-big", make([]byte, maxBody+1))
	if se, ok := errors.AsType[*protocol.StatusError](err); !ok || se.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body of MaxBody+1: %v; want 413", err)
	}

	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			readBefore := e.read.Load()
			conn, err := net.Dial("tcp", e.ts.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			// Headers of a signed PUT, then a body the server must refuse, written
			// until the server closes the connection.
			req := signed{method: "PUT", target: "/v1/kv/1/huge"}.request(t, e.ts.URL)
			fmt.Fprintf(conn, "PUT /v1/kv/1/huge HTTP/1.1\r\nHost: x\r\n")
			for k, v := range req.Header {
				fmt.Fprintf(conn, "%s: %s\r\n", k, v[0])
			}
			if chunked {
				fmt.Fprintf(conn, "Transfer-Encoding: chunked\r\n\r\n")
			} else {
				fmt.Fprintf(conn, "Content-Length: %d\r\n\r\n", huge)
			}
			written := make(chan int64, 1)
			go func() {
				var n int64
				chunk := make([]byte, 64<<10)
				for n < huge {
					if chunked {
						if _, err := fmt.Fprintf(conn, "%x\r\n", len(chunk)); err != nil {
							break
						}
					}
					m, err := conn.Write(chunk)
					n += int64(m)
					if err != nil {
						break
					}
					if chunked {
						conn.Write([]byte("\r\n"))
					}
				}
				written <- n
			}()
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("read answer: %v", err)
			}
			msg, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(msg), "exceeds the limit of 1024") {
				t.Fatalf("got %d %q; want 413", resp.StatusCode, msg)
			}
			conn.Close()
			n := <-written
			read := e.read.Load() - readBefore
			t.Logf("client wrote %d bytes before the server closed; server read %d", n, read)
			if limit := int64(maxBody + 256<<10 + 64<<10); read > limit {
				t.Fatalf("server read %d bytes of an oversized body; want at most %d", read, limit)
			}
		})
	}
}

// TestClientRetries: connection errors and 5xx are retried a bounded number of times, then
// the error says what was tried; a 5xx that clears is invisible to the caller.
func TestClientRetries(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	c := rdzvclient.NewClient("http://"+addr, secret, wid("h", 0), nil)
	defer c.CloseIdleConnections()
	start := time.Now()
	err = c.Report(t.Context(), 1, protocol.Ready, "")
	if err == nil || !strings.Contains(err.Error(), "gave up after 4 attempts, 100ms apart") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Report to nothing = %v", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 5*time.Second {
		t.Fatalf("4 attempts 100ms apart took %v", d)
	}

	// A server that answers 503 twice, then works.
	e := newEnv(t, nil)
	var failNext atomic.Int64
	failNext.Store(2)
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failNext.Add(-1) >= 0 {
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
			return
		}
		e.srv.ServeHTTP(w, r)
	}))
	defer flaky.Close()
	c = rdzvclient.NewClient(flaky.URL, secret, wid("h", 0), flaky.Client())
	if err := c.Report(t.Context(), 1, protocol.Failure, "boom"); err != nil {
		t.Fatalf("Report through two 503s: %v", err)
	}
	if ev := <-e.srv.Events(); ev.State != protocol.Failure || ev.Message != "boom" {
		t.Fatalf("event %+v", ev)
	}
	if n := failNext.Load(); n != -1 {
		t.Fatalf("%d requests; want 3", 2-n)
	}

	// A context that ends during the retries stops them.
	failNext.Store(1000)
	ctx, cancel := context.WithTimeout(t.Context(), 150*time.Millisecond)
	defer cancel()
	if err := c.Report(ctx, 1, protocol.Ready, ""); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Report with a context that ends during retries = %v", err)
	}
}

// With a driver wait (ELASTICD_DRIVER_WAIT, set by agents), a worker keeps asking a driver
// that is down, backing off, until one answers on its address: a driver restarting; past the
// wait, it gives up saying so.
func TestClientWaitsForADriverThatRestarts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: the driver is down
	c := rdzvclient.NewClient("http://"+addr, secret, wid("h", 0), nil)
	c.SetDriverWait(30 * time.Second)
	e := newEnv(t, nil)
	up := make(chan *http.Server, 1)
	go func() {
		time.Sleep(1500 * time.Millisecond) // well past the 4 quick attempts without a wait
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Error(err)
			up <- nil
			return
		}
		hs := &http.Server{Handler: e.srv}
		up <- hs
		hs.Serve(ln)
	}()
	start := time.Now()
	if err := c.Report(t.Context(), 1, protocol.Ready, "waited"); err != nil {
		t.Fatalf("Report to a driver back after 1.5 s: %v", err)
	}
	if hs := <-up; hs != nil {
		defer hs.Close()
	}
	if d := time.Since(start); d < 1400*time.Millisecond {
		t.Fatalf("answered after %v, before the driver was back", d)
	}
	if ev := <-e.srv.Events(); ev.Message != "waited" {
		t.Fatalf("event %+v", ev)
	}

	gone := rdzvclient.NewClient("http://127.0.0.1:1", secret, wid("h", 0), nil)
	gone.SetDriverWait(700 * time.Millisecond)
	start = time.Now()
	err = gone.Report(t.Context(), 1, protocol.Ready, "")
	if err == nil || !strings.Contains(err.Error(), "over 700ms (the driver's wait)") {
		t.Fatalf("Report to no driver with a 700ms wait = %v", err)
	}
	if d := time.Since(start); d < 700*time.Millisecond || d > 5*time.Second {
		t.Fatalf("gave up after %v, want the 700ms wait and a backoff", d)
	}
}

// A driver that has just started refuses requests stamped before its start; a worker whose
// clock is behind it signs again a second later, until its stamps are past the start.
func TestClientSignsAgainForADriverJustStarted(t *testing.T) {
	e := newEnv(t, nil)
	var early atomic.Int64
	early.Store(2)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if early.Add(-1) >= 0 {
			http.Error(w, protocol.ReasonSignedBeforeStart, http.StatusUnauthorized)
			return
		}
		e.srv.ServeHTTP(w, r)
	}))
	defer ts.Close()
	c := rdzvclient.NewClient(ts.URL, secret, wid("h", 0), ts.Client())
	start := time.Now()
	if err := c.Report(t.Context(), 1, protocol.Ready, "again"); err != nil {
		t.Fatalf("Report through two refusals of an early stamp: %v", err)
	}
	if d := time.Since(start); d < 1900*time.Millisecond {
		t.Fatalf("signed again after %v: want a second between tries", d)
	}
	if ev := <-e.srv.Events(); ev.Message != "again" {
		t.Fatalf("event %+v", ev)
	}
	// Any other 401 is final.
	early.Store(0)
	bad := rdzvclient.NewClient(ts.URL, []byte("another secret, another signature"), wid("h", 0), ts.Client())
	if err := bad.Report(t.Context(), 1, protocol.Ready, ""); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("Report with the wrong secret = %v, want a 401", err)
	}
}

// Exchange returns a signed answer, and refuses one that is unsigned or altered.
func TestExchange(t *testing.T) {
	auth, err := protocol.NewAuth(secret, "elasticd test v1", 0)
	if err != nil {
		t.Fatal(err)
	}
	var mode string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		nonce, err := auth.Verify(r, body, time.Now())
		if err != nil || mode == "unsigned" {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		if mode == "altered" {
			auth.SignAnswer(w.Header(), nonce, http.StatusOK, []byte(`{"n":1}`))
			w.Write([]byte(`{"n":2}`))
			return
		}
		protocol.Answer{W: w, Auth: auth, Nonce: nonce}.JSON(map[string]int{"n": len(body)})
	}))
	defer ts.Close()

	r, err := auth.Exchange(t.Context(), ts.Client(), http.MethodPost, ts.URL+"/x", map[string]string{"a": "b"}, 1<<10)
	if err != nil || r.Status != http.StatusOK || strings.TrimSpace(string(r.Body)) != `{"n":9}` {
		t.Fatalf("signed: %+v, %v; want 200 {\"n\":9}", r, err)
	}
	mode = "unsigned"
	_, err = auth.Exchange(t.Context(), ts.Client(), http.MethodGet, ts.URL+"/x", nil, 1<<10)
	if ue, ok := errors.AsType[*protocol.UnsignedError](err); !ok || ue.Status != http.StatusUnauthorized || ue.Reason != "bad signature" {
		t.Fatalf("unsigned 401: %v, want an UnsignedError with the reason", err)
	}
	mode = "altered"
	if _, err = auth.Exchange(t.Context(), ts.Client(), http.MethodGet, ts.URL+"/x", nil, 1<<10); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("altered answer: %v, want a signature mismatch", err)
	}
}
