package rendezvous_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/protocol"
	rdzvclient "github.com/elasticd/elasticd/worker/rendezvous"
)

// TestCloseEndsLongPolls: Close answers every pending long-poll at once with 503 "rendezvous
// shutting down", closes Events, and refuses later requests the same way.
func TestCloseEndsLongPolls(t *testing.T) {
	e := newEnv(t, func(c *rendezvous.ServerConfig) { c.PollTimeout = time.Minute })
	e.srv.Publish(1, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	polls := []func(c *rdzvclient.Client) error{
		func(c *rdzvclient.Client) error { _, err := c.Assignment(ctx, 1); return err },
		func(c *rdzvclient.Client) error { _, err := c.HostsUpdated(ctx, 0); return err },
		func(c *rdzvclient.Client) error { _, err := c.Store(1).Get(ctx, "never"); return err },
	}
	const each = 5
	errs := make(chan error, each*len(polls))
	for i := range each * len(polls) {
		go func() { errs <- polls[i%len(polls)](e.client(wid("h", i))) }()
	}
	// One raw long-poll too, to see the answer itself rather than the client's retries.
	raw := make(chan *http.Response, 1)
	go func() {
		resp, err := e.ts.Client().Do(signed{method: "GET", target: "/v1/hosts/version?after=0"}.request(t, e.ts.URL))
		if err != nil {
			t.Error(err)
		}
		raw <- resp
	}()
	waitFor(t, 5*time.Second, "every long-poll to be held", func() bool {
		st := e.srv.Stats()
		return st.AssignmentPolls == each && st.HostPolls == each+1 && st.KVPolls == each
	})

	start := time.Now()
	e.srv.Close()
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v", d)
	}
	resp := <-raw
	body := make([]byte, 100)
	n, _ := resp.Body.Read(body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || string(body[:n]) != "rendezvous shutting down\n" {
		t.Fatalf("long-poll at Close: %d %q", resp.StatusCode, body[:n])
	}
	for range each * len(polls) {
		select {
		case err := <-errs:
			if err == nil || !strings.Contains(err.Error(), "503 rendezvous shutting down") {
				t.Fatalf("long-poll at Close: %v", err)
			}
		case <-time.After(2 * time.Second): // the client retries 3 times, 100ms apart
			t.Fatal("a long-poll outlived Close by 2s")
		}
	}
	if _, ok := <-e.srv.Events(); ok {
		t.Fatal("Events still open after Close")
	}
	if code, msg := e.send(t, signed{method: "GET", target: "/v1/hosts/version?after=0"}); code != 503 || !strings.Contains(msg, "shutting down") {
		t.Fatalf("request after Close: %d %q", code, msg)
	}
	e.srv.Close() // idempotent
}

// TestLongPollEndsWithClient: when the worker's context ends, its long-poll ends on both
// sides.
func TestLongPollEndsWithClient(t *testing.T) {
	e := newEnv(t, func(c *rendezvous.ServerConfig) { c.PollTimeout = time.Minute })
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := e.client(wid("h", 0)).Assignment(ctx, 0)
		done <- err
	}()
	waitFor(t, 5*time.Second, "the poll to be held", func() bool { return e.srv.Stats().AssignmentPolls == 1 })
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Assignment after cancel = %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("Assignment did not return within 1s of its context ending")
	}
	waitFor(t, time.Second, "the server to let the poll go", func() bool { return e.srv.Stats().AssignmentPolls == 0 })
}

// TestNoGoroutineLeak runs a whole life (reports, polls, keys, a reset, Close) and checks
// that the goroutine count comes back to where it was.
func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		srv, err := rendezvous.NewServer(rendezvous.ServerConfig{Secret: secret, PollTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(srv)
		defer ts.Close()
		defer srv.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		var clients []*rdzvclient.Client
		for i := range 8 {
			c := rdzvclient.NewClient(ts.URL, secret, wid("h", i), nil) // clients of their own
			defer c.CloseIdleConnections()
			clients = append(clients, c)
			wg.Go(func() {
				c.Report(ctx, 0, protocol.Ready, "")
				c.Assignment(ctx, 0)
				c.Store(1).Get(ctx, "k")
				c.HostsUpdated(ctx, 0) // still pending at Close
			})
		}
		go func() {
			for range srv.Events() { // the driver: drains until Close closes the channel
			}
		}()
		waitFor(t, 5*time.Second, "assignment polls", func() bool { return srv.Stats().AssignmentPolls == 8 })
		srv.Publish(1, nil)
		waitFor(t, 5*time.Second, "key polls", func() bool { return srv.Stats().KVPolls == 8 })
		if err := clients[0].Store(1).Set(ctx, "k", []byte("v")); err != nil {
			t.Error(err)
		}
		waitFor(t, 5*time.Second, "host polls", func() bool { return srv.Stats().HostPolls == 8 })
		srv.Close()
		wg.Wait()
	}()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if after := runtime.NumGoroutine(); after > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines: %d before, %d after\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
}
