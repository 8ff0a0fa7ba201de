package rendezvous

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/protocol"
)

// FuzzServerRequest sends the rendezvous server requests built from the input, signed with
// the job's key or not: it never panics, never answers 500, and accepts nothing unsigned.
func FuzzServerRequest(f *testing.F) {
	f.Add("POST", "/v1/workers/h%2F0/state", []byte(`{"protocol":1,"generation":0,"state":"READY","silent_peer":true}`), true)
	f.Add("POST", "/v1/workers/h%2F0/state", []byte(`{"generation":1,"state":"SUCCESS","rolled_back_seconds":-1}`), true)
	f.Add("POST", "/v1/workers/h%2F0/progress", []byte(`{"generation":1,"step":5,"committed_step":9}`), true)
	f.Add("POST", "/v1/workers/h%2F0/load", []byte(`{"step_seconds":0.5}`), true)
	f.Add("GET", "/v1/assignment/h%2F0?after=0&wait_ms=5", []byte(nil), true)
	f.Add("GET", "/v1/hosts?after=0&wait_ms=1", []byte(nil), true)
	f.Add("PUT", "/v1/kv/1/torch%2Fstore", []byte("127.0.0.1:1234"), true)
	f.Add("GET", "/v1/kv/1/torch%2Fstore?wait_ms=1", []byte(nil), true)
	f.Add("POST", "/v1/workers/h%2F0/state", []byte(`{"generation":0,"state":"READY"}`), false)
	f.Add("DELETE", "/v1/x", []byte("{"), true)
	secret := bytes.Repeat([]byte{7}, 32)
	srv, err := NewServer(ServerConfig{Secret: secret, PollTimeout: 5 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(srv.Close)
	go func() { // the driver's side: take the events, so that reports never back up
		for range srv.Events() {
		}
	}()
	auth, err := protocol.NewAuth(secret, protocol.RendezvousAuthLabel, 0)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, method, target string, body []byte, sign bool) {
		if !strings.HasPrefix(target, "/") || strings.ContainsAny(target, " \t\r\n") {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, "http://driver"+target, bytes.NewReader(body))
		if err != nil {
			return
		}
		req.RequestURI = req.URL.RequestURI()
		if sign {
			auth.Sign(req, body)
		}
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		switch {
		case rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable:
			t.Fatalf("%s %s %q: %d %s", method, target, body, rec.Code, rec.Body)
		case !sign && rec.Code < 300:
			t.Fatalf("unsigned %s %s accepted: %d", method, target, rec.Code)
		}
	})
}
