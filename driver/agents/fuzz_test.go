package agents_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/agents"
	"github.com/elasticd/elasticd/protocol"
)

// FuzzAgentRequest sends the driver's side of the agents' protocol requests built from the
// input, signed with the agent secret: it never panics and never answers 500, whatever the
// body or path. "SESSION" in the path stands for a live session's ID.
func FuzzAgentRequest(f *testing.F) {
	reg, err := agents.New(agents.Config{Secret: secret, JobID: jobID, PollWait: 5 * time.Millisecond, Lease: time.Hour,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(reg.Close)
	go func() {
		for range reg.Notices() {
		}
	}()
	go func() {
		for range reg.Faults() {
		}
	}()
	auth, err := protocol.NewAuth(secret, protocol.AgentAuthLabel, 0)
	if err != nil {
		f.Fatal(err)
	}
	send := func(method, target string, body []byte) *httptest.ResponseRecorder {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, "http://driver"+target, bytes.NewReader(body))
		if err != nil {
			return nil
		}
		req.RequestURI = req.URL.RequestURI()
		auth.Sign(req, body)
		rec := httptest.NewRecorder()
		reg.ServeHTTP(rec, req)
		return rec
	}
	rec := send("POST", protocol.AgentPathRegister, []byte(`{"protocol":2,"agent_id":"a1","host_id":"h1","addr":"127.0.0.1","gpus":[]}`))
	var ans protocol.AgentRegisterAnswer
	if rec == nil || rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &ans) != nil {
		f.Fatalf("register: %v", rec)
	}
	f.Add("POST", protocol.AgentPathRegister, []byte(`{"protocol":2,"agent_id":"a2","host_id":"h2","addr":"10.0.0.2","slots":2,"gpus":[{"index":0,"uuid":"GPU-1","model":"A100","memory_bytes":1}],"metadata":"aws"}`))
	f.Add("POST", protocol.AgentPathRegister, []byte(`{"agent_id":"","host_id":"h/1","addr":"","slots":-3}`))
	f.Add("POST", "/v1/agents/SESSION/events", []byte(`{"events":[{"seq":1,"kind":"started","proc":1,"pid":42}]}`))
	f.Add("POST", "/v1/agents/SESSION/events", []byte(`{"events":[{"seq":2,"kind":"exited","proc":1,"code":1,"signal":"SIGKILL"},{"seq":3,"kind":"output","proc":1,"stream":"stdout","data":"aGVsbG8K"}]}`))
	f.Add("POST", "/v1/agents/SESSION/events", []byte(`{"events":[{"seq":4,"kind":"notice","notice":{"kind":"spot","deadline":"2026-11-25T00:00:00Z"}},{"seq":5,"kind":"gpu","gpu":{"index":0,"reason":"xid 79"}},{"seq":6,"kind":"load","gpu_busy":2.5},{"seq":7,"kind":"port","proc":9,"port":70000}]}`))
	f.Add("GET", "/v1/agents/SESSION/commands?after=0&wait_ms=1", []byte(nil))
	f.Add("GET", "/v1/agents/nosuch/commands?after=x", []byte(nil))
	f.Fuzz(func(t *testing.T, method, target string, body []byte) {
		if !strings.HasPrefix(target, "/") || strings.ContainsAny(target, " \t\r\n") {
			return
		}
		target = strings.ReplaceAll(target, "SESSION", ans.Session)
		if rec := send(method, target, body); rec != nil && rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("%s %s %q: %d %s", method, target, body, rec.Code, rec.Body)
		}
	})
}
