package admin_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver"
	"github.com/elasticd/elasticd/driver/admin"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

var secret = []byte("an-admin-secret-of-enough-bytes")

// api is an admin API over a fixed group (127.0.0.2 with 2 slots, --min-np 2) and a driver
// status the test sets, served on loopback.
type api struct {
	srv     *httptest.Server
	overlay *admin.Overlay
	board   driver.Status
	client  *admin.Client
}

func newAPI(t *testing.T) *api {
	t.Helper()
	a := &api{overlay: admin.NewOverlay(providers.NewFixed([]providers.Host{host("127.0.0.2", 2)}), 2)}
	if _, err := a.overlay.Hosts(context.Background()); err != nil {
		t.Fatal(err)
	}
	a.board = driver.Status{
		Generation: 1, WorldSize: 2, Phase: "running", MinNP: 2, MaxNP: 4,
		Hosts: []driver.HostStatus{{ID: "127.0.0.2", Addr: "127.0.0.2", Slots: 2, Blacklisted: 1}},
		Workers: []driver.WorkerStatus{
			{ID: "127.0.0.2/1", Host: "127.0.0.2", Slot: 1, Rank: 1, State: "running"},
			{ID: "127.0.0.2/0", Host: "127.0.0.2", Slot: 0, Rank: 0, State: "running"},
			{ID: "10.0.0.9/0", Host: "10.0.0.9", Slot: 0, Rank: -1, State: "stopping"},
		},
	}
	h, err := admin.NewHandler(secret, a.overlay, func() *driver.Status { s := a.board; return &s }, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.srv = httptest.NewServer(h)
	t.Cleanup(a.srv.Close)
	if a.client, err = admin.NewClient(a.srv.URL, secret, nil); err != nil {
		t.Fatal(err)
	}
	return a
}

func refused(t *testing.T, err error, code int, parts ...string) {
	t.Helper()
	var r *admin.Refused
	if !errors.As(err, &r) || r.Code != code {
		t.Fatalf("error %v, want a signed %d refusal", err, code)
	}
	for _, p := range parts {
		if !strings.Contains(r.Msg, p) {
			t.Fatalf("refusal %q lacks %q", r.Msg, p)
		}
	}
}

func TestHandlerAddRemoveStatus(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()

	s, err := a.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Generation != 1 || s.WorldSize != 2 || s.Phase != "running" || s.MinNP != 2 || len(s.Hosts) != 2 {
		t.Fatalf("status %+v", s)
	}
	h := s.Hosts[0]
	if h.ID != "127.0.0.2" || h.State != admin.StateActive || h.Slots != 2 || h.BlacklistedSlots != 1 || len(h.Workers) != 2 ||
		h.Workers[0].ID != "127.0.0.2/0" || h.Workers[0].Rank != 0 || h.Workers[1].Rank != 1 {
		t.Fatalf("host %+v", h)
	}
	if g := s.Hosts[1]; g.ID != "10.0.0.9" || g.State != admin.StateGone || len(g.Workers) != 1 || g.Workers[0].State != "stopping" {
		t.Fatalf("the stopping worker's host: %+v", g)
	}

	ch, err := a.client.AddHost(ctx, "127.0.0.3", 2)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Action != "added" || ch.Host.ID != "127.0.0.3" || ch.Host.Slots != 2 || len(ch.Status.Hosts) != 3 {
		t.Fatalf("add: %+v", ch)
	}
	if p := ch.Status.Hosts[1]; p.ID != "127.0.0.3" || p.State != admin.StatePending || !p.Added {
		t.Fatalf("the added host before discovery sees it: %+v", p)
	}
	_, err = a.client.AddHost(ctx, "127.0.0.3", 0)
	refused(t, err, http.StatusConflict, "host 127.0.0.3 is already part of the job")

	ch, err = a.client.RemoveHost(ctx, "127.0.0.3", false)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Action != "removed" || ch.Host.ID != "127.0.0.3" {
		t.Fatalf("remove: %+v", ch)
	}
	s, _ = a.client.Status(ctx)
	if st := s.Hosts[1]; st.ID != "127.0.0.3" || st.State != admin.StateStopped {
		t.Fatalf("the removed host: %+v", st)
	}
	_, err = a.client.RemoveHost(ctx, "127.0.0.2", false)
	refused(t, err, http.StatusConflict, "would leave 0 usable slots, fewer than --min-np 2: use --force")
	_, err = a.client.RemoveHost(ctx, "10.9.9.9", false)
	refused(t, err, http.StatusNotFound, `unknown host "10.9.9.9"`, "127.0.0.2", "stopped: 127.0.0.3")
	_, err = a.client.RemoveHost(ctx, "127.0.0.3", false)
	refused(t, err, http.StatusConflict, "already stopped")

	ch, err = a.client.AddHost(ctx, "127.0.0.3", 0)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Action != "restarted" || ch.Host.Slots != 2 {
		t.Fatalf("re-add: %+v", ch)
	}
	if _, err := a.client.RemoveHost(ctx, "127.0.0.2", true); err != nil { // forced, and 2 are left anyway
		t.Fatal(err)
	}
	if got := ids(a.overlay.Current()); len(got) != 1 || got[0] != "127.0.0.3:2" {
		t.Fatalf("overlay after the removals: %v", got)
	}
}

// send signs and sends one request with a client of the admin protocol's Auth, and returns
// the answer with its body and the request's nonce.
func send(t *testing.T, auth *protocol.Auth, method, url string, body []byte) (*http.Response, []byte, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	nonce := ""
	if auth != nil {
		nonce = auth.Sign(req, body)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b, nonce
}

// Every answer to a signed request is signed, bound to that request's nonce; errors are
// one line.
func TestHandlerAnswersSignedWithCodes(t *testing.T) {
	a := newAPI(t)
	auth, err := protocol.NewAuth(secret, admin.Label, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		method, path, body string
		code               int
		want               string
	}{
		{"GET", "/v1/admin/status", "", 200, `"world_size":2`},
		{"POST", "/v1/admin/hosts", `{"host": "10.0.0.5", "slots": 4}`, 200, `"action":"added"`},
		{"POST", "/v1/admin/hosts", `{"host": "10.0.0.5"}`, 409, "already part of the job"},
		{"POST", "/v1/admin/hosts", `{"host": "10.0.0.6", "gpus": 4}`, 400, "malformed JSON body"},
		{"POST", "/v1/admin/hosts", `{"host": "10.0.0.6:4"}`, 400, `give the slot count in "slots"`},
		{"POST", "/v1/admin/hosts", `{"host": "10.0.0.256"}`, 400, `"host" "10.0.0.256": "10.0.0.256" is not a valid IPv4 address`},
		{"POST", "/v1/admin/hosts", `{"host": ""}`, 400, `"host" is required`},
		{"POST", "/v1/admin/hosts", `{"host": "gpu-9", "slots": -1}`, 400, `"slots" -1`},
		{"POST", "/v1/admin/hosts", `{"host": "fd00::7", "slots": 2}`, 200, `"id":"fd00::7"`},
		{"DELETE", "/v1/admin/hosts/10.9.9.9", "", 404, "unknown host"},
		{"DELETE", "/v1/admin/hosts/10.0.0.5?force=maybe", "", 400, "force="},
		{"DELETE", "/v1/admin/hosts/10.0.0.5?force=1", "", 200, `"action":"removed"`},
		{"PUT", "/v1/admin/hosts", "", 405, "not part of the admin API"},
		{"GET", "/v1/admin/nothing", "", 404, "no /v1/admin/nothing in the admin API"},
	} {
		resp, body, nonce := send(t, auth, tc.method, a.srv.URL+tc.path, []byte(tc.body))
		if resp.StatusCode != tc.code || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s %s %s: %d %q, want %d with %q", tc.method, tc.path, tc.body, resp.StatusCode, body, tc.code, tc.want)
			continue
		}
		if err := auth.VerifyAnswer(resp.Header, nonce, resp.StatusCode, body); err != nil {
			t.Errorf("%s %s: answer not signed: %v", tc.method, tc.path, err)
		}
		if tc.code != 200 && strings.Count(strings.TrimSpace(string(body)), "\n") != 0 {
			t.Errorf("%s %s: error of more than one line: %q", tc.method, tc.path, body)
		}
	}
}

func TestHandlerRefusesUnsignedForgedReplayed(t *testing.T) {
	a := newAPI(t)
	url := a.srv.URL + "/v1/admin/status"

	resp, body, _ := send(t, nil, "GET", url, nil)
	if resp.StatusCode != 401 || !strings.Contains(string(body), "missing") {
		t.Fatalf("unsigned: %d %q", resp.StatusCode, body)
	}

	other, _ := protocol.NewAuth([]byte("another-secret-of-enough-bytes"), admin.Label, 0)
	resp, body, _ = send(t, other, "GET", url, nil)
	if resp.StatusCode != 401 || !strings.Contains(string(body), "bad signature") || resp.Header.Get(protocol.HeaderAnswerSignature) != "" {
		t.Fatalf("wrong secret: %d %q", resp.StatusCode, body)
	}
	// The agents' protocol keyed with the same secret is another protocol.
	agents, _ := protocol.NewAuth(secret, "elasticd agent v1", 0)
	if resp, _, _ = send(t, agents, "GET", url, nil); resp.StatusCode != 401 {
		t.Fatalf("another protocol's MAC: %d", resp.StatusCode)
	}

	// A captured request sent again is refused, even a harmless one.
	auth, _ := protocol.NewAuth(secret, admin.Label, 0)
	req, _ := http.NewRequest("DELETE", a.srv.URL+"/v1/admin/hosts/10.9.9.9", nil)
	auth.Sign(req, nil)
	for i, want := range []int{404, 401} {
		r2, _ := http.NewRequest(req.Method, req.URL.String(), nil)
		r2.Header = req.Header.Clone()
		resp, err := http.DefaultClient.Do(r2)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || i == 1 && !strings.Contains(string(b), "replayed") {
			t.Fatalf("send %d of the same request: %d %q, want %d", i+1, resp.StatusCode, b, want)
		}
	}

	// A body other than the one signed.
	req, _ = http.NewRequest("POST", a.srv.URL+"/v1/admin/hosts", strings.NewReader(`{"host": "10.6.6.6"}`))
	auth.Sign(req, []byte(`{"host": "10.0.0.7"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || len(a.overlay.Added()) != 0 {
		t.Fatalf("altered body: %d, added %v", resp.StatusCode, a.overlay.Added())
	}

	// The client explains a refused signature.
	c, _ := admin.NewClient(a.srv.URL, []byte("another-secret-of-enough-bytes"), nil)
	_, err = c.Status(context.Background())
	if err == nil || !strings.Contains(err.Error(), "--admin-secret-file") {
		t.Fatalf("client with the wrong secret: %v", err)
	}
}

// The client drops an answer that was altered on the way, or that is not signed at all.
func TestClientChecksAnswers(t *testing.T) {
	a := newAPI(t)
	h, _ := admin.NewHandler(secret, a.overlay, nil, nil)
	tamper := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(bytes.Replace(rec.Body.Bytes(), []byte(`"starting"`), []byte(`"running!"`), 1))
	}))
	defer tamper.Close()
	c, _ := admin.NewClient(tamper.URL, secret, nil)
	if _, err := c.Status(context.Background()); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("altered answer: %v", err)
	}

	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"generation": 9}`))
	}))
	defer plain.Close()
	c, _ = admin.NewClient(plain.URL, secret, nil)
	if _, err := c.Status(context.Background()); err == nil || !strings.Contains(err.Error(), "without a signature") {
		t.Fatalf("unsigned answer: %v", err)
	}

	if _, err := admin.NewClient(a.srv.URL, []byte("short"), nil); err == nil {
		t.Fatal("a 5-byte secret was accepted")
	}
	if _, err := admin.NewHandler([]byte("short"), a.overlay, nil, nil); err == nil {
		t.Fatal("a 5-byte secret was accepted")
	}
}

// POST /v1/admin/stop hands the operator's reason to the job; a malformed or multi-line
// reason is refused, and so is a stop no job takes.
func TestStop(t *testing.T) {
	h, err := admin.NewHandler(secret, admin.NewOverlay(providers.NewFixed(nil), 1), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	c, err := admin.NewClient(srv.URL, secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stop(t.Context(), "x"); err == nil || !strings.Contains(err.Error(), "cannot be stopped") {
		t.Fatalf("stop with no job: %v", err)
	}
	stops := make(chan string, 1)
	h.Stops(stops)
	if _, err := c.Stop(t.Context(), "line one\nline two"); err == nil || !strings.Contains(err.Error(), "one line") {
		t.Fatalf("a two-line reason: %v", err)
	}
	ans, err := c.Stop(t.Context(), "loss plateaued")
	if err != nil || !ans.Stopping {
		t.Fatalf("stop: %+v, %v", ans, err)
	}
	if got := <-stops; got != "loss plateaued" {
		t.Fatalf("the job got %q", got)
	}
}

// A driver that has just started refuses requests stamped before its start second; ctl on a
// host whose clock is behind signs again a second later, and the request goes through once.
// Any other refusal of the signature is final.
func TestClientSignsAgainForADriverJustStarted(t *testing.T) {
	a := newAPI(t)
	h, _ := admin.NewHandler(secret, a.overlay, nil, nil)
	var early, served atomic.Int64
	early.Store(2)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if early.Add(-1) >= 0 {
			http.Error(w, protocol.ReasonSignedBeforeStart, http.StatusUnauthorized)
			return
		}
		served.Add(1)
		h.ServeHTTP(w, r)
	}))
	defer ts.Close()
	c, _ := admin.NewClient(ts.URL, secret, nil)
	start := time.Now()
	if _, err := c.AddHost(context.Background(), "127.0.0.9", 2); err != nil {
		t.Fatalf("add-host through two refusals of an early stamp: %v", err)
	}
	if d := time.Since(start); d < 1900*time.Millisecond {
		t.Fatalf("signed again after %v: want a second between tries", d)
	}
	if served.Load() != 1 {
		t.Fatalf("the handler saw the request %d times, want once", served.Load())
	}
	bad, _ := admin.NewClient(ts.URL, []byte("another secret, another signature"), nil)
	start = time.Now()
	if _, err := bad.Status(context.Background()); err == nil || !strings.Contains(err.Error(), "refused the request's signature") {
		t.Fatalf("Status with the wrong secret = %v, want the signature refused", err)
	}
	if d := time.Since(start); d > 900*time.Millisecond {
		t.Fatalf("a wrong secret's refusal took %v: it must not be tried again", d)
	}
}

// A driver that has just started has not listed its hosts: add-host and remove-host get 503
// with the reason, and the client tries again each second until the first poll is in, within
// its context.
func TestClientWaitsForTheFirstDiscovery(t *testing.T) {
	g := &group{hosts: []providers.Host{host("127.0.0.2", 2), host("127.0.0.3", 2)}}
	o := admin.NewOverlay(g, 1)
	h, _ := admin.NewHandler(secret, o, nil, nil)
	ts := httptest.NewServer(h)
	defer ts.Close()
	c, _ := admin.NewClient(ts.URL, secret, nil)

	short, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	_, err := c.RemoveHost(short, "127.0.0.3", false)
	refused(t, err, http.StatusServiceUnavailable, "has not listed its hosts yet")

	time.AfterFunc(1200*time.Millisecond, func() { o.Hosts(context.Background()) })
	start := time.Now()
	if _, err := c.RemoveHost(context.Background(), "127.0.0.3", false); err != nil {
		t.Fatalf("remove-host across the first discovery: %v", err)
	}
	if d := time.Since(start); d < time.Second {
		t.Fatalf("removed after %v, before the first discovery", d)
	}
	want(t, "stopped", ids(o.Stopped()), "127.0.0.3:2")
}
