package metadata_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/worker/agent/metadata"
)

// The fakes below speak each metadata service's wire format on loopback. Each is a struct
// guarded by a mutex that the test edits between polls, and counts what it was asked.

// logWriter routes the package's log to t.Log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// clock is a settable Config.Now.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Date(2026, 11, 22, 1, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// hang answers nothing until the client gives up (or 10 s pass, so Close never waits long).
func hang(w http.ResponseWriter, r *http.Request) {
	// The server notices a client leaving only once the body is read.
	io.Copy(io.Discard, r.Body)
	select {
	case <-r.Context().Done():
	case <-time.After(10 * time.Second):
	}
}

func serve(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// checkSlow asserts that poll, under a context that ends after 200 ms, returns promptly with
// an error that says the deadline passed.
func checkSlow(t *testing.T, poll func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := poll(ctx)
	took := time.Since(start)
	if err == nil {
		t.Fatal("poll of a service that never answers succeeded")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v: want one wrapping context.DeadlineExceeded", err)
	}
	if took > 2*time.Second {
		t.Errorf("poll took %v after a 200ms deadline", took)
	}
	t.Logf("the error reads: %v", err)
}

func wantErrContains(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not contain %q", err, p)
		}
	}
	t.Logf("the error reads: %v", err)
}

func kinds(ns []providers.Notice) []providers.NoticeKind {
	var out []providers.NoticeKind
	for _, n := range ns {
		out = append(out, n.Kind)
	}
	return out
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  metadata.Config
		want string // "" = valid
	}{
		{"zero", metadata.Config{}, ""},
		{"base", metadata.Config{BaseURL: "http://127.0.0.1:8080/"}, ""},
		{"relative", metadata.Config{BaseURL: "169.254.169.254"}, "http(s)"},
		{"query", metadata.Config{BaseURL: "http://h/?a=b"}, "query"},
		{"ttl small", metadata.Config{TokenTTL: time.Millisecond}, "TTL"},
		{"ttl large", metadata.Config{TokenTTL: 7 * time.Hour}, "TTL"},
		{"wait negative", metadata.Config{MaxWait: -time.Second}, "wait"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			wantErrContains(t, err, tc.want)
			if _, err := metadata.NewAWS(tc.cfg); err == nil {
				t.Error("NewAWS accepted an invalid config")
			}
		})
	}
}

// The watchers are notice sources like the providers; Azure's notices must be answered.
var (
	_ providers.Noticer         = (*metadata.AWS)(nil)
	_ providers.Noticer         = (*metadata.GCP)(nil)
	_ providers.Noticer         = (*metadata.Azure)(nil)
	_ providers.NoticeCompleter = (*metadata.Azure)(nil)
)
