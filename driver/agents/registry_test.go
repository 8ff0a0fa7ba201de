package agents_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/agents"
	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/proc"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

// These tests speak the agents' protocol on the wire, as an agent would: signed requests over
// loopback HTTP, signed answers checked with the same rendezvous.Auth an agent uses.

var secret = []byte("0123456789abcdef-agent-secret")

const jobID = "job-42"

// testLog routes the registry's log to t.Log until the test's cleanup has stopped everything
// that logs.
type testLog struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

// env is a registry behind a real HTTP server on loopback.
type env struct {
	reg *agents.Registry
	srv *httptest.Server
}

// newEnv starts a registry with a short poll and lease; tweak adjusts its config. Cleanup
// closes the registry (ending long-polls and failing processes), then the HTTP server.
func newEnv(t *testing.T, tweak func(*agents.Config)) *env {
	t.Helper()
	tl := &testLog{t: t}
	t.Cleanup(func() {
		tl.mu.Lock()
		tl.done = true
		tl.mu.Unlock()
	})
	cfg := agents.Config{
		Secret: secret, JobID: jobID, PollWait: 300 * time.Millisecond, Lease: time.Second,
		Logger: slog.New(slog.NewTextHandler(tl, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	reg, err := agents.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(reg)
	t.Cleanup(srv.Close)
	t.Cleanup(reg.Close)
	return &env{reg: reg, srv: srv}
}

// client signs requests with secret, as an agent does.
func (e *env) client(t *testing.T, secret []byte) *client {
	t.Helper()
	auth, err := protocol.NewAuth(secret, protocol.AgentAuthLabel, 0)
	if err != nil {
		t.Fatalf("NewAuth: %v", err)
	}
	hc := e.srv.Client()
	hc.Timeout = 10 * time.Second
	return &client{base: e.srv.URL, auth: auth, hc: hc}
}

type client struct {
	base string
	auth *protocol.Auth
	hc   *http.Client
}

// reply is an answer as received, with the nonce of the request it answers.
type reply struct {
	status int
	header http.Header
	body   []byte
	nonce  string
}

func (r reply) String() string {
	return fmt.Sprintf("%d %q", r.status, strings.TrimSpace(string(r.body)))
}

// newRequest builds a signed request and returns it with its nonce.
func (c *client) newRequest(method, target string, body []byte) (*http.Request, string, error) {
	req, err := http.NewRequest(method, c.base+target, bytes.NewReader(body))
	if err != nil {
		return nil, "", err
	}
	return req, c.auth.Sign(req, body), nil
}

// roundTrip sends req and reads the whole answer; it does not check the answer's signature.
func (c *client) roundTrip(req *http.Request, nonce string) (reply, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(resp.Body); err != nil {
		return reply{}, err
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b.Bytes(), nonce: nonce}, nil
}

// send signs and sends one request and returns its answer, unchecked. Safe off the test's
// goroutine.
func (c *client) send(method, target string, body []byte) (reply, error) {
	req, nonce, err := c.newRequest(method, target, body)
	if err != nil {
		return reply{}, err
	}
	return c.roundTrip(req, nonce)
}

func (c *client) verify(r reply) error {
	return c.auth.VerifyAnswer(r.header, r.nonce, r.status, r.body)
}

// call sends in (raw []byte, or JSON-encoded), requires a signed answer of status want and
// decodes a 200 answer into out.
func (c *client) call(t *testing.T, method, target string, in any, want int, out any) reply {
	t.Helper()
	var body []byte
	switch in := in.(type) {
	case nil:
	case []byte:
		body = in
	default:
		var err error
		if body, err = json.Marshal(in); err != nil {
			t.Fatal(err)
		}
	}
	r, err := c.send(method, target, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	if err := c.verify(r); err != nil {
		t.Fatalf("%s %s: answer %v: %v", method, target, r, err)
	}
	if r.status != want {
		t.Fatalf("%s %s: answer %v, want status %d", method, target, r, want)
	}
	if out != nil {
		dec := json.NewDecoder(bytes.NewReader(r.body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(out); err != nil {
			t.Fatalf("%s %s: decode answer %s: %v", method, target, r.body, err)
		}
	}
	return r
}

// fakeAgent is one registered session, driven by hand.
type fakeAgent struct {
	c       *client
	info    protocol.AgentRegisterRequest
	session string
	seq     uint64 // last event sequence number sent
}

func (c *client) register(t *testing.T, in protocol.AgentRegisterRequest) *fakeAgent {
	t.Helper()
	if in.AgentID == "" {
		in.AgentID = "agent-" + in.HostID
	}
	var ans protocol.AgentRegisterAnswer
	c.call(t, http.MethodPost, protocol.AgentPathRegister, in, http.StatusOK, &ans)
	if ans.Session == "" {
		t.Fatalf("register %s: no session in %+v", in.HostID, ans)
	}
	return &fakeAgent{c: c, info: in, session: ans.Session}
}

func (a *fakeAgent) commandsTarget(after uint64, waitMS int) string {
	return fmt.Sprintf("%s%s/commands?after=%d&wait_ms=%d", protocol.AgentPathPrefix, a.session, after, waitMS)
}

func (a *fakeAgent) eventsTarget() string { return protocol.AgentPathPrefix + a.session + "/events" }

// poll asks for the commands after after, holding the poll at most waitMS.
func (a *fakeAgent) poll(t *testing.T, after uint64, waitMS int) []protocol.AgentCommand {
	t.Helper()
	var ans protocol.AgentCommandsAnswer
	a.c.call(t, http.MethodGet, a.commandsTarget(after, waitMS), nil, http.StatusOK, &ans)
	return ans.Commands
}

// next polls until a command after after arrives and returns the first.
func (a *fakeAgent) next(t *testing.T, after uint64) protocol.AgentCommand {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if cmds := a.poll(t, after, 1000); len(cmds) > 0 {
			return cmds[0]
		}
	}
	t.Fatalf("no command after %d within 3s", after)
	return protocol.AgentCommand{}
}

// emit numbers evs after the last event sent, sends them as one batch (204 expected) and
// returns the batch as sent, for a retry.
func (a *fakeAgent) emit(t *testing.T, evs ...protocol.AgentEvent) protocol.AgentEventsRequest {
	t.Helper()
	for i := range evs {
		a.seq++
		evs[i].Seq = a.seq
	}
	batch := protocol.AgentEventsRequest{Events: evs}
	a.c.call(t, http.MethodPost, a.eventsTarget(), batch, http.StatusNoContent, nil)
	return batch
}

// syncBuffer is a worker's stdout or stderr; it counts flushes.
type syncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	flushes int
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushes++
	return nil
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type exit struct {
	st  proc.ExitStatus
	err error
}

// waitExit returns the process's exit, failing the test when it takes longer than d.
func waitExit(t *testing.T, p proc.Process, d time.Duration) exit {
	t.Helper()
	ch := make(chan exit, 1)
	go func() {
		st, err := p.Wait()
		ch <- exit{st, err}
	}()
	select {
	case e := <-ch:
		return e
	case <-time.After(d):
		t.Fatalf("Wait did not return within %v", d)
		return exit{}
	}
}

// notExited fails the test if p has already exited.
func notExited(t *testing.T, p proc.Process) {
	t.Helper()
	ch := make(chan struct{})
	go func() {
		p.Wait()
		close(ch)
	}()
	select {
	case <-ch:
		t.Fatal("the process has already exited")
	default:
	}
}

// waitFor polls cond every few milliseconds for at most d.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func oneLine(t *testing.T, r reply) string {
	t.Helper()
	msg := strings.TrimSuffix(string(r.body), "\n")
	if msg == "" || strings.Contains(msg, "\n") {
		t.Errorf("answer body %q: want one line", r.body)
	}
	return msg
}

func TestRegister(t *testing.T) {
	e := newEnv(t, nil)
	c := e.client(t, secret)
	in := protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion,
		AgentID: "a1", HostID: "i-1", Addr: "10.0.0.1", Metadata: "aws",
		GPUs: []protocol.AgentGPU{{Index: 0, UUID: "GPU-0", Model: "H100"}, {Index: 1, UUID: "GPU-1", Model: "H100"}},
	}
	body, _ := json.Marshal(in)
	r, err := c.send(http.MethodPost, protocol.AgentPathRegister, body)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusOK {
		t.Fatalf("register: %v", r)
	}
	if err := c.verify(r); err != nil {
		t.Fatalf("the answer does not verify: %v", err)
	}
	var ans protocol.AgentRegisterAnswer
	if err := json.Unmarshal(r.body, &ans); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
	if ans.Session == "" || ans.JobID != jobID || ans.PollWaitMS != 300 || ans.LeaseMS != 1000 {
		t.Errorf("answer %+v: want a session, job %q, poll 300ms, lease 1000ms", ans, jobID)
	}

	// The signature covers the body, the status and the request's nonce.
	tampered := slices.Clone(r.body)
	tampered[bytes.IndexByte(tampered, ':')+2] ^= 1
	if err := c.auth.VerifyAnswer(r.header, r.nonce, r.status, tampered); err == nil {
		t.Error("a tampered answer body verifies")
	}
	if err := c.auth.VerifyAnswer(r.header, r.nonce, http.StatusAccepted, r.body); err == nil {
		t.Error("an answer with another status verifies")
	}
	other, _, _ := c.newRequest(http.MethodPost, protocol.AgentPathRegister, body)
	if err := c.auth.VerifyAnswer(r.header, other.Header.Get(protocol.HeaderNonce), r.status, r.body); err == nil {
		t.Error("the answer verifies for another request's nonce")
	}
	forger := e.client(t, []byte("another-secret-0123456789"))
	if err := forger.auth.VerifyAnswer(r.header, r.nonce, r.status, r.body); err == nil {
		t.Error("the answer verifies with another secret")
	}

	got := e.reg.Agents()
	if len(got) != 1 {
		t.Fatalf("Agents() = %+v, want the one registered", got)
	}
	if a := got[0]; a.Session != ans.Session || a.HostID != "i-1" || a.Addr != "10.0.0.1" || a.Slots != 2 || len(a.GPUs) != 2 || a.Metadata != "aws" || a.Processes != 0 {
		t.Errorf("Agents()[0] = %+v", a)
	}
	// LastSeen adds the agent's time to what the caller heard, unless the caller heard later.
	heard := map[string]time.Time{"i-2": time.Unix(1, 0)}
	e.reg.LastSeen(heard)
	if len(heard) != 2 || !heard["i-1"].Equal(got[0].LastSeen) || heard["i-1"].IsZero() {
		t.Errorf("LastSeen: %v, want i-1 at %v and i-2 kept", heard, got[0].LastSeen)
	}
	later := got[0].LastSeen.Add(time.Hour)
	heard["i-1"] = later
	if e.reg.LastSeen(heard); !heard["i-1"].Equal(later) {
		t.Errorf("LastSeen replaced a later time: %v", heard["i-1"])
	}
}

func TestRefusals(t *testing.T) {
	e := newEnv(t, nil)
	c := e.client(t, secret)
	valid, _ := json.Marshal(protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, AgentID: "a1", HostID: "i-1", Addr: "10.0.0.1"})

	t.Run("another secret", func(t *testing.T) {
		r, err := e.client(t, []byte("not-the-agent-secret-0123")).send(http.MethodPost, protocol.AgentPathRegister, valid)
		if err != nil {
			t.Fatal(err)
		}
		if r.status != http.StatusUnauthorized {
			t.Fatalf("answer %v, want 401", r)
		}
		if msg := oneLine(t, r); !strings.Contains(msg, "bad signature") {
			t.Errorf("reason %q: want it to say bad signature", msg)
		}
		if h := r.header.Get(protocol.HeaderAnswerSignature); h != "" {
			t.Errorf("a refusal carries an answer signature %q", h)
		}
		if a := e.reg.Agents(); len(a) != 0 {
			t.Errorf("the refused agent registered: %+v", a)
		}
	})

	t.Run("unsigned", func(t *testing.T) {
		resp, err := c.hc.Post(e.srv.URL+protocol.AgentPathRegister, "application/json", bytes.NewReader(valid))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get(protocol.HeaderAnswerSignature) != "" {
			t.Errorf("unsigned request: %d with answer signature %q, want 401 unsigned", resp.StatusCode, resp.Header.Get(protocol.HeaderAnswerSignature))
		}
	})

	t.Run("replayed", func(t *testing.T) {
		req, nonce, err := c.newRequest(http.MethodPost, protocol.AgentPathRegister, valid)
		if err != nil {
			t.Fatal(err)
		}
		again, err := http.NewRequest(http.MethodPost, req.URL.String(), bytes.NewReader(valid))
		if err != nil {
			t.Fatal(err)
		}
		again.Header = req.Header.Clone()
		r, err := c.roundTrip(req, nonce)
		if err != nil {
			t.Fatal(err)
		}
		if r.status != http.StatusOK || c.verify(r) != nil {
			t.Fatalf("first sending: %v, want a signed 200", r)
		}
		r, err = c.roundTrip(again, nonce)
		if err != nil {
			t.Fatal(err)
		}
		if r.status != http.StatusUnauthorized {
			t.Fatalf("replay: %v, want 401", r)
		}
		if msg := oneLine(t, r); !strings.Contains(msg, "replayed") {
			t.Errorf("reason %q: want it to say replayed", msg)
		}
		if h := r.header.Get(protocol.HeaderAnswerSignature); h != "" {
			t.Errorf("a refusal carries an answer signature %q", h)
		}
	})

	for _, tc := range []struct {
		name, body, want string
	}{
		{"malformed JSON", `{"agent_id": "a1", `, "malformed JSON"},
		{"unknown field", `{"protocol":2,"agent_id":"a1","host_id":"i-1","addr":"10.0.0.1","colour":"red"}`, "colour"},
		{"missing host_id", `{"protocol":2,"agent_id":"a1","addr":"10.0.0.1"}`, "host_id"},
		{"missing addr", `{"protocol":2,"agent_id":"a1","host_id":"i-1"}`, "addr"},
		{"missing agent_id", `{"protocol":2,"host_id":"i-1","addr":"10.0.0.1"}`, "agent_id"},
		{"negative slots", `{"protocol":2,"agent_id":"a1","host_id":"i-1","addr":"10.0.0.1","slots":-1}`, "slots"},
		{"another protocol version", `{"protocol":99,"agent_id":"a1","host_id":"i-1","addr":"10.0.0.1"}`, "protocol version 99"},
		{"the previous protocol version", `{"protocol":1,"agent_id":"a1","host_id":"i-1","addr":"10.0.0.1"}`, "agent protocol version 1 is not spoken by this driver, which speaks version 2: run the agents and the driver from the same elasticd release"},
		{"no protocol version (older still)", `{"agent_id":"a1","host_id":"i-1","addr":"10.0.0.1"}`, "agent protocol version 1 is not spoken"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := c.call(t, http.MethodPost, protocol.AgentPathRegister, []byte(tc.body), http.StatusBadRequest, nil)
			if msg := oneLine(t, r); !strings.Contains(msg, tc.want) {
				t.Errorf("reason %q: want it to name %q", msg, tc.want)
			}
		})
	}

	t.Run("unknown session", func(t *testing.T) {
		for _, target := range []string{protocol.AgentPathPrefix + "no-such-session/commands?after=0&wait_ms=10", protocol.AgentPathPrefix + "no-such-session/events"} {
			method, body := http.MethodGet, []byte(nil)
			if strings.HasSuffix(target, "/events") {
				method, body = http.MethodPost, []byte(`{"events":[]}`)
			}
			r := c.call(t, method, target, body, http.StatusNotFound, nil)
			if msg := oneLine(t, r); !strings.Contains(msg, "register again") {
				t.Errorf("%s: reason %q: want it to say register again", target, msg)
			}
		}
	})

	t.Run("bad events body", func(t *testing.T) {
		a := c.register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, AgentID: "a2", HostID: "i-2", Addr: "10.0.0.2"})
		r := c.call(t, http.MethodPost, a.eventsTarget(), []byte(`{"events":[{"seq":1,"kind":"started","surprise":1}]}`), http.StatusBadRequest, nil)
		if msg := oneLine(t, r); !strings.Contains(msg, "surprise") {
			t.Errorf("reason %q: want it to name the unknown field", msg)
		}
		r = c.call(t, http.MethodGet, a.commandsTarget(0, 10)+"x", nil, http.StatusBadRequest, nil)
		if msg := oneLine(t, r); !strings.Contains(msg, "wait_ms") {
			t.Errorf("reason %q: want it to name wait_ms", msg)
		}
	})
}

func TestStartOutputExit(t *testing.T) {
	e := newEnv(t, nil)
	a := e.client(t, secret).register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "i-1", Addr: "10.0.0.1", GPUs: []protocol.AgentGPU{{Index: 0}, {Index: 1}}})

	var stdout, stderr syncBuffer
	p, err := e.reg.Launcher().Start(t.Context(), proc.Spec{
		Name: "rank 1", Host: "10.0.0.1", Slot: 1, Command: []string{"python", "train.py", "--lr", "0.1"},
		Env: []string{"A=1", "ELASTICD_SECRET=the-job-secret", "ELASTICD_WORKER_ID=i-1/1", "B=x=y"}, Dir: "/work/job",
		Stdout: &stdout, Stderr: &stderr,
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if p.PID() != 0 {
		t.Errorf("PID() = %d before the agent started it, want 0", p.PID())
	}

	cmds := a.poll(t, 0, 1000)
	if len(cmds) != 1 {
		t.Fatalf("commands %+v: want one start", cmds)
	}
	c := cmds[0]
	if c.Seq != 1 || c.Op != protocol.OpStart || c.Proc == 0 || c.Slot != 1 || c.Dir != "/work/job" || c.Worker != "i-1/1" {
		t.Errorf("start command %+v", c)
	}
	if want := []string{"python", "train.py", "--lr", "0.1"}; !slices.Equal(c.Argv, want) {
		t.Errorf("argv %q, want %q", c.Argv, want)
	}
	if want := []string{"A=1", "ELASTICD_WORKER_ID=i-1/1", "B=x=y"}; !slices.Equal(c.Env, want) {
		t.Errorf("env %q, want %q (the job secret never crosses the network)", c.Env, want)
	}
	// Until acknowledged, the command is offered again; after it, the poll is held and empty.
	if again := a.poll(t, 0, 1000); len(again) != 1 || again[0].Seq != c.Seq {
		t.Errorf("commands after 0 again = %+v, want the same start", again)
	}
	held := time.Now()
	if rest := a.poll(t, c.Seq, 100); len(rest) != 0 {
		t.Errorf("commands after %d = %+v, want none", c.Seq, rest)
	}
	if d := time.Since(held); d < 80*time.Millisecond {
		t.Errorf("an empty poll with wait_ms=100 answered after %v: not held", d)
	}

	a.emit(t, protocol.AgentEvent{Kind: protocol.KindStarted, Proc: c.Proc, PID: 4242})
	if p.PID() != 4242 {
		t.Errorf("PID() = %d, want 4242", p.PID())
	}
	batch := a.emit(t,
		protocol.AgentEvent{Kind: protocol.KindOutput, Proc: c.Proc, Stream: "stdout", Data: []byte("hello ")},
		protocol.AgentEvent{Kind: protocol.KindOutput, Proc: c.Proc, Stream: "stderr", Data: []byte("warning: x\n")},
		protocol.AgentEvent{Kind: protocol.KindOutput, Proc: c.Proc, Stream: "stdout", Data: []byte("world\n")},
	)
	// A retry of a batch the driver took (its answer was lost) is taken once.
	a.c.call(t, http.MethodPost, a.eventsTarget(), batch, http.StatusNoContent, nil)
	notExited(t, p)
	if got := e.reg.Agents(); len(got) != 1 || got[0].Processes != 1 {
		t.Errorf("Agents() = %+v, want one process", got)
	}

	a.emit(t,
		protocol.AgentEvent{Kind: protocol.KindOutput, Proc: c.Proc, Stream: "stdout", Data: []byte("bye")},
		protocol.AgentEvent{Kind: protocol.KindExited, Proc: c.Proc, Code: 3},
	)
	x := waitExit(t, p, 2*time.Second)
	if x.err != nil || x.st != (proc.ExitStatus{Code: 3}) {
		t.Errorf("Wait() = %+v, %v; want exit 3, nil", x.st, x.err)
	}
	if got, want := stdout.String(), "hello world\nbye"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	if got, want := stderr.String(), "warning: x\n"; got != want {
		t.Errorf("stderr %q, want %q", got, want)
	}
	if stdout.flushes == 0 || stderr.flushes == 0 {
		t.Errorf("flushes: stdout %d, stderr %d; want both flushed at exit", stdout.flushes, stderr.flushes)
	}
	if got := e.reg.Agents(); len(got) != 1 || got[0].Processes != 0 {
		t.Errorf("Agents() = %+v, want no process left", got)
	}
	// Events of a process that has exited are ignored.
	a.emit(t, protocol.AgentEvent{Kind: protocol.KindOutput, Proc: c.Proc, Stream: "stdout", Data: []byte("late")})
	if got := stdout.String(); strings.Contains(got, "late") {
		t.Errorf("stdout %q: output after the exit was written", got)
	}
}

func TestAgentCannotStart(t *testing.T) {
	e := newEnv(t, nil)
	a := e.client(t, secret).register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "i-1", Addr: "10.0.0.1"})
	var stderr syncBuffer
	p, err := e.reg.Launcher().Start(t.Context(), proc.Spec{Name: "rank 0", Host: "i-1", Command: []string{"nope"}, Stderr: &stderr})
	if err != nil {
		t.Fatalf("Start by host ID: %v", err)
	}
	c := a.next(t, 0)
	a.emit(t, protocol.AgentEvent{Kind: protocol.KindExited, Proc: c.Proc, Code: 127, Error: `exec: "nope": not found`})
	x := waitExit(t, p, 2*time.Second)
	if x.st.Code != 127 {
		t.Errorf("Wait() = %+v, %v; want exit 127", x.st, x.err)
	}
	if got := stderr.String(); !strings.Contains(got, `exec: "nope": not found`) {
		t.Errorf("stderr %q: want the agent's reason", got)
	}
}

func TestStop(t *testing.T) {
	e := newEnv(t, nil)
	a := e.client(t, secret).register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "i-1", Addr: "10.0.0.1"})
	p, err := e.reg.Launcher().Start(t.Context(), proc.Spec{Name: "rank 0", Host: "10.0.0.1", Command: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	start := a.next(t, 0)
	a.emit(t, protocol.AgentEvent{Kind: protocol.KindStarted, Proc: start.Proc, PID: 7})

	// A long grace: Stop must return on the exited event, not on its timer.
	stopped := make(chan struct{})
	go func() {
		p.Stop(20 * time.Second)
		close(stopped)
	}()
	stop := a.next(t, start.Seq)
	if stop.Op != protocol.OpStop || stop.Proc != start.Proc || stop.GraceMS != 20000 || stop.Seq != start.Seq+1 {
		t.Errorf("stop command %+v: want stop of proc %d with grace_ms 20000", stop, start.Proc)
	}
	select {
	case <-stopped:
		t.Fatal("Stop returned before the agent reported the exit")
	default:
	}
	a.emit(t, protocol.AgentEvent{Kind: protocol.KindExited, Proc: start.Proc, Code: -1, Signal: "SIGTERM"})
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		t.Fatal("Stop did not return within 2s of the exited event")
	}
	x := waitExit(t, p, time.Second)
	if x.err != nil || x.st != (proc.ExitStatus{Code: -1, Signal: "SIGTERM"}) {
		t.Errorf("Wait() = %+v, %v; want killed by SIGTERM", x.st, x.err)
	}
	// Stop is idempotent: no second stop command, and it returns at once.
	p.Stop(time.Second)
	if cmds := a.poll(t, stop.Seq, 50); len(cmds) != 0 {
		t.Errorf("commands after a second Stop: %+v, want none", cmds)
	}
}

func TestStopGivesUp(t *testing.T) {
	// An agent that stays connected but never reports the exit: Stop gives up after the
	// grace period plus a lease, while discovery goes on.
	e := newEnv(t, func(c *agents.Config) { c.PollWait, c.Lease = 100*time.Millisecond, 400*time.Millisecond })
	a := e.client(t, secret).register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "i-1", Addr: "10.0.0.1"})
	p, err := e.reg.Launcher().Start(t.Context(), proc.Spec{Name: "rank 0", Host: "10.0.0.1", Command: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	start := a.next(t, 0)
	stopped := make(chan time.Duration, 1)
	t0 := time.Now()
	go func() {
		p.Stop(200 * time.Millisecond)
		stopped <- time.Since(t0)
	}()
	stop := a.next(t, start.Seq)
	w := e.reg.Wrap(nil)
	for done := false; !done; {
		select {
		case d := <-stopped:
			if d < 550*time.Millisecond {
				t.Errorf("Stop gave up after %v, before grace 200ms + lease 400ms", d)
			}
			done = true
		case <-time.After(3 * time.Second):
			t.Fatal("Stop did not give up within 3s")
		default:
			a.poll(t, stop.Seq, 20) // the agent stays connected
			if _, err := w.Hosts(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
	}
	notExited(t, p)
}

func TestStartCancelledStops(t *testing.T) {
	e := newEnv(t, nil)
	a := e.client(t, secret).register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "i-1", Addr: "10.0.0.1"})
	ctx, cancel := context.WithCancel(t.Context())
	p, err := e.reg.Launcher().Start(ctx, proc.Spec{Name: "rank 0", Host: "10.0.0.1", Command: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	start := a.next(t, 0)
	cancel()
	stop := a.next(t, start.Seq)
	if stop.Op != protocol.OpStop || stop.Proc != start.Proc || stop.GraceMS != proc.DefaultGrace.Milliseconds() {
		t.Errorf("command after cancelling Start's ctx: %+v, want stop with the default grace", stop)
	}
	a.emit(t, protocol.AgentEvent{Kind: protocol.KindExited, Proc: start.Proc, Code: -1, Signal: "SIGTERM"})
	waitExit(t, p, 2*time.Second)
}

func TestStartWithoutAgent(t *testing.T) {
	e := newEnv(t, nil)
	e.client(t, secret).register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "i-1", Addr: "10.0.0.1"})
	_, err := e.reg.Launcher().Start(t.Context(), proc.Spec{Name: "rank 0", Host: "10.0.0.9", Command: []string{"true"}})
	if err == nil || !strings.Contains(err.Error(), "no agent is connected") || !strings.Contains(err.Error(), "10.0.0.9") {
		t.Errorf("Start on a host without agent: %v; want an error saying no agent is connected for 10.0.0.9", err)
	}
	if _, err := e.reg.Launcher().Start(t.Context(), proc.Spec{Name: "rank 0", Host: "10.0.0.1"}); err == nil {
		t.Error("Start with an empty command succeeded")
	}
}

func TestLeaseExpiry(t *testing.T) {
	e := newEnv(t, func(c *agents.Config) { c.PollWait, c.Lease = 100*time.Millisecond, 500*time.Millisecond })
	c := e.client(t, secret)
	a := c.register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "i-1", Addr: "10.0.0.1"})
	p, err := e.reg.Launcher().Start(t.Context(), proc.Spec{Name: "rank 0", Host: "10.0.0.1", Command: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	start := a.next(t, 0)

	// An agent that keeps polling outlives several leases.
	for until := time.Now().Add(1200 * time.Millisecond); time.Now().Before(until); {
		a.poll(t, start.Seq, 100)
	}
	notExited(t, p)

	// Then it falls silent.
	silent := time.Now()
	x := waitExit(t, p, 2*time.Second)
	if d := time.Since(silent); d < 400*time.Millisecond {
		t.Errorf("the agent was counted lost %v after its last request, before its lease of 500ms", d)
	}
	if x.err == nil || !strings.Contains(x.err.Error(), "lost") {
		t.Errorf("Wait() = %+v, %v; want an error saying the agent was lost", x.st, x.err)
	}
	if got := e.reg.Agents(); len(got) != 0 {
		t.Errorf("Agents() = %+v after the lease, want none", got)
	}
	r := c.call(t, http.MethodGet, a.commandsTarget(start.Seq, 10), nil, http.StatusNotFound, nil)
	oneLine(t, r)
	c.call(t, http.MethodPost, a.eventsTarget(), protocol.AgentEventsRequest{Events: []protocol.AgentEvent{{Seq: 1, Kind: protocol.KindStarted}}}, http.StatusNotFound, nil)
	if _, err := e.reg.Launcher().Start(t.Context(), proc.Spec{Name: "rank 0", Host: "10.0.0.1", Command: []string{"true"}}); err == nil {
		t.Error("Start on the lost agent's host succeeded")
	}
}

func TestReregistration(t *testing.T) {
	for _, tc := range []struct {
		name   string
		second protocol.AgentRegisterRequest
	}{
		{"agent restarted", protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, AgentID: "a2", HostID: "i-1", Addr: "10.0.0.1"}},
		{"same agent registers again", protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, AgentID: "a1", HostID: "i-1", Addr: "10.0.0.1"}},
		{"same address", protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, AgentID: "a2", HostID: "renamed", Addr: "10.0.0.1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			c := e.client(t, secret)
			first := c.register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, AgentID: "a1", HostID: "i-1", Addr: "10.0.0.1"})
			other := c.register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, AgentID: "b1", HostID: "i-2", Addr: "10.0.0.2"})
			p, err := e.reg.Launcher().Start(t.Context(), proc.Spec{Name: "rank 0", Host: "10.0.0.1", Command: []string{"sleep", "1000"}})
			if err != nil {
				t.Fatal(err)
			}
			q, err := e.reg.Launcher().Start(t.Context(), proc.Spec{Name: "rank 1", Host: "10.0.0.2", Command: []string{"sleep", "1000"}})
			if err != nil {
				t.Fatal(err)
			}
			first.next(t, 0)

			second := c.register(t, tc.second)
			x := waitExit(t, p, 2*time.Second)
			if x.err == nil {
				t.Errorf("Wait() of the first session's process = %+v, nil; want an error", x.st)
			}
			notExited(t, q)
			c.call(t, http.MethodGet, first.commandsTarget(1, 10), nil, http.StatusNotFound, nil)
			got := e.reg.Agents()
			if len(got) != 2 || !slices.ContainsFunc(got, func(a agents.AgentInfo) bool { return a.Session == second.session }) ||
				!slices.ContainsFunc(got, func(a agents.AgentInfo) bool { return a.Session == other.session }) {
				t.Errorf("Agents() = %+v, want the new session and the other host's", got)
			}
			// Workers now start through the new session.
			if _, err := e.reg.Launcher().Start(t.Context(), proc.Spec{Name: "rank 0", Host: "10.0.0.1", Command: []string{"true"}}); err != nil {
				t.Fatal(err)
			}
			if c := second.next(t, 0); c.Op != protocol.OpStart || c.Seq != 1 {
				t.Errorf("first command of the new session: %+v", c)
			}
		})
	}
}

// fakeProvider is an inner provider for Wrap.
type fakeProvider struct {
	mu        sync.Mutex
	hosts     []providers.Host
	notices   []providers.Notice
	completed []providers.Notice
}

func (f *fakeProvider) Hosts(context.Context) ([]providers.Host, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.hosts), nil
}

func (f *fakeProvider) Notices(context.Context) ([]providers.Notice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.notices), nil
}

func (f *fakeProvider) CompleteNotice(_ context.Context, n providers.Notice) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.completed = append(f.completed, n)
	return nil
}

func gpus(n int) []protocol.AgentGPU {
	out := make([]protocol.AgentGPU, n)
	for i := range out {
		out[i] = protocol.AgentGPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i)}
	}
	return out
}

func slotsByID(hs []providers.Host) map[string]int {
	m := map[string]int{}
	for _, h := range hs {
		m[h.ID+"@"+h.Addr] = h.Slots
	}
	return m
}

func TestWrapHosts(t *testing.T) {
	e := newEnv(t, nil)
	c := e.client(t, secret)
	c.register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "i-1", Addr: "10.0.0.1", Slots: 4, GPUs: gpus(2)})
	c.register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "i-2", Addr: "10.0.0.2", GPUs: gpus(2)})
	c.register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "host-3", Addr: "10.0.0.3"})
	c.register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "host-4", Addr: "10.0.0.4", Slots: 3})
	c.register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "i-5", Addr: "10.0.0.5", GPUs: gpus(8)})

	t.Run("nil inner", func(t *testing.T) {
		hs, err := e.reg.Wrap(nil).Hosts(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]int{"i-1@10.0.0.1": 4, "i-2@10.0.0.2": 2, "host-3@10.0.0.3": 1, "host-4@10.0.0.4": 3, "i-5@10.0.0.5": 8}
		if got := slotsByID(hs); !maps.Equal(got, want) {
			t.Errorf("Hosts() slots = %v, want %v", got, want)
		}
	})

	t.Run("inner", func(t *testing.T) {
		inner := &fakeProvider{hosts: []providers.Host{
			{ID: "i-1", Addr: "ip-10-0-0-1.internal", Slots: 8, Zone: "z1", Spot: true}, // by ID, --slots 4
			{ID: "i-2", Addr: "10.0.0.2", Slots: 8},                                     // by ID and addr, 2 GPUs
			{ID: "i-3", Addr: "10.0.0.3", Slots: 8},                                     // by addr, no GPU: inner's count
			{ID: "i-4", Addr: "10.0.0.4", Slots: 8},                                     // by addr, --slots 3
			{ID: "i-6", Addr: "10.0.0.6", Slots: 8},                                     // no agent
		}}
		hs, err := e.reg.Wrap(inner).Hosts(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]int{"i-1@ip-10-0-0-1.internal": 4, "i-2@10.0.0.2": 2, "i-3@10.0.0.3": 8, "i-4@10.0.0.4": 3}
		if got := slotsByID(hs); !maps.Equal(got, want) {
			t.Errorf("Hosts() slots = %v, want %v (i-5 is not the provider's, i-6 has no agent)", got, want)
		}
		if i := slices.IndexFunc(hs, func(h providers.Host) bool { return h.ID == "i-1" }); i < 0 || hs[i].Zone != "z1" || !hs[i].Spot {
			t.Errorf("Hosts() = %+v: want i-1 with the provider's zone and spot flag", hs)
		}
		// The agents now go by the provider's names: a worker starts on the provider's address.
		if _, err := e.reg.Launcher().Start(t.Context(), proc.Spec{Name: "rank 0", Host: "ip-10-0-0-1.internal", Command: []string{"true"}}); err != nil {
			t.Errorf("Start on the provider's address of a matched agent: %v", err)
		}
		ids := map[string]string{}
		for _, a := range e.reg.Agents() {
			ids[a.Session] = a.HostID + "@" + a.Addr
		}
		if !slices.Contains(slices.Collect(maps.Values(ids)), "i-3@10.0.0.3") {
			t.Errorf("Agents() = %v: want host-3 known as the provider's i-3", ids)
		}
	})
}

// noNotice fails the test if a notice is waiting: an events request is applied before its
// answer, so a notice it delivered is already queued.
func noNotice(t *testing.T, reg *agents.Registry) {
	t.Helper()
	select {
	case n := <-reg.Notices():
		t.Errorf("unexpected notice %+v", n)
	default:
	}
}

func TestNotices(t *testing.T) {
	e := newEnv(t, nil)
	c := e.client(t, secret)
	in := protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, AgentID: "a1", HostID: "host-a", Addr: "10.0.0.1"}
	a := c.register(t, in)
	inner := &fakeProvider{
		hosts:   []providers.Host{{ID: "i-abc", Addr: "10.0.0.1", Slots: 1}},
		notices: []providers.Notice{{ID: "asg-1", HostID: "i-abc", Kind: providers.ScaleIn, Token: "lifecycle-token"}},
	}
	w := e.reg.Wrap(inner)
	if _, err := w.Hosts(t.Context()); err != nil {
		t.Fatal(err)
	}

	deadline := time.Now().Add(90 * time.Second).UTC().Truncate(time.Millisecond)
	notice := protocol.AgentNotice{ID: "spot-1", Kind: string(providers.Interruption), Deadline: deadline, Detail: "spot reclaim"}
	a.emit(t, protocol.AgentEvent{Kind: protocol.KindNotice, Notice: &notice})
	var got providers.Notice
	select {
	case got = <-e.reg.Notices():
	case <-time.After(2 * time.Second):
		t.Fatal("no notice within 2s")
	}
	if got.ID != "agent:spot-1" || got.HostID != "i-abc" || got.Kind != providers.Interruption || !got.Deadline.Equal(deadline) || !strings.Contains(got.Detail, "spot reclaim") {
		t.Errorf("notice %+v: want agent:spot-1 for the provider's host i-abc, interruption at %v", got, deadline)
	}
	noNotice(t, e.reg)

	// The agent sends its active notices again in every session: each is delivered once.
	a.emit(t, protocol.AgentEvent{Kind: protocol.KindNotice, Notice: &notice})
	noNotice(t, e.reg)
	a = c.register(t, in)
	a.emit(t, protocol.AgentEvent{Kind: protocol.KindNotice, Notice: &notice})
	noNotice(t, e.reg)
	other := protocol.AgentNotice{ID: "spot-2", Kind: string(providers.Rebalance)}
	a.emit(t, protocol.AgentEvent{Kind: protocol.KindNotice, Notice: &other})
	select {
	case n := <-e.reg.Notices():
		if n.ID != "agent:spot-2" || n.Kind != providers.Rebalance {
			t.Errorf("second notice %+v, want agent:spot-2", n)
		}
	default:
		t.Error("a new notice was not delivered")
	}

	// Completing an agent's notice asks that agent, with the ID it sent.
	if err := w.(providers.NoticeCompleter).CompleteNotice(t.Context(), got); err != nil {
		t.Fatalf("CompleteNotice: %v", err)
	}
	cmd := a.next(t, 0)
	if cmd.Op != protocol.OpCompleteNotice || cmd.Notice != "spot-1" {
		t.Errorf("command %+v: want complete-notice spot-1", cmd)
	}

	// The inner provider's notices pass through, and are completed by it.
	ns, err := w.(providers.Noticer).Notices(t.Context())
	if err != nil || len(ns) != 1 || ns[0].ID != "asg-1" {
		t.Fatalf("Notices() = %+v, %v; want the inner provider's", ns, err)
	}
	if err := w.(providers.NoticeCompleter).CompleteNotice(t.Context(), ns[0]); err != nil {
		t.Fatal(err)
	}
	if len(inner.completed) != 1 || inner.completed[0].Token != "lifecycle-token" {
		t.Errorf("inner completed %+v, want asg-1", inner.completed)
	}
	if cmds := a.poll(t, cmd.Seq, 50); len(cmds) != 0 {
		t.Errorf("commands %+v: the inner provider's notice went to the agent", cmds)
	}

	// An agent that is gone cannot complete its notice.
	e.reg.Close()
	if err := w.(providers.NoticeCompleter).CompleteNotice(t.Context(), got); err == nil {
		t.Error("CompleteNotice of a notice whose agent is gone succeeded")
	}
}

func TestReregistrationKeepsProviderNames(t *testing.T) {
	// The provider knows the host as i-abc; its agent calls it host-a. A restarted agent sends
	// its GPU faults and notices as soon as it registers, before the next discovery: they
	// must name the host as the provider does, and workers must start on it by that name.
	e := newEnv(t, nil)
	c := e.client(t, secret)
	in := protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, AgentID: "a1", HostID: "host-a", Addr: "10.0.0.1", GPUs: gpus(2)}
	c.register(t, in)
	inner := &fakeProvider{hosts: []providers.Host{{ID: "i-abc", Addr: "10.0.0.1", Slots: 1}}}
	if _, err := e.reg.Wrap(inner).Hosts(t.Context()); err != nil {
		t.Fatal(err)
	}
	in.AgentID = "a2"
	a := c.register(t, in)
	a.emit(t, protocol.AgentEvent{Kind: protocol.KindGPU, GPU: &protocol.GPUFault{Index: 0, Kind: "ecc"}})
	select {
	case f := <-e.reg.Faults():
		if f.HostID != "i-abc" || !slices.Equal(f.Slots, []int{0}) {
			t.Errorf("fault %+v: want slot 0 of the provider's host i-abc", f)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no fault within 2s")
	}
	if _, err := e.reg.Launcher().Start(t.Context(), proc.Spec{Name: "rank 0", Host: "i-abc", Command: []string{"true"}}); err != nil {
		t.Errorf("Start on the provider's host ID after the agent re-registered: %v", err)
	}
	if got := e.reg.Agents(); len(got) != 1 || got[0].HostID != "i-abc" {
		t.Errorf("Agents() = %+v, want the new session known as i-abc", got)
	}
}

func TestGPUFaults(t *testing.T) {
	for _, tc := range []struct {
		name        string
		gpus, slots int
		index       int
		want        []int
	}{
		{"one slot per GPU", 2, 0, 1, []int{1}},
		{"two slots per GPU", 2, 4, 1, []int{1, 3}},
		{"GPU 0 of 4 slots", 2, 4, 0, []int{0, 2}},
		{"unknown GPU", 2, 0, -1, nil},
		{"unknown GPU, --slots", 2, 4, -1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			a := e.client(t, secret).register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "i-1", Addr: "10.0.0.1", Slots: tc.slots, GPUs: gpus(tc.gpus)})
			a.emit(t, protocol.AgentEvent{Kind: protocol.KindGPU, GPU: &protocol.GPUFault{Index: tc.index, UUID: "GPU-x", Kind: "xid", XID: 79, Detail: "fell off the bus"}})
			select {
			case f := <-e.reg.Faults():
				if f.HostID != "i-1" || !slices.Equal(f.Slots, tc.want) || (tc.want == nil) != (f.Slots == nil) {
					t.Errorf("fault %+v: want host i-1, slots %v", f, tc.want)
				}
				if !strings.Contains(f.Reason, "fell off the bus") {
					t.Errorf("reason %q: want the agent's detail", f.Reason)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("no fault within 2s")
			}
		})
	}
}

func TestCloseEndsPolls(t *testing.T) {
	e := newEnv(t, func(c *agents.Config) { c.PollWait, c.Lease = 10*time.Second, 20*time.Second })
	c := e.client(t, secret)
	a := c.register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "i-1", Addr: "10.0.0.1"})
	p, err := e.reg.Launcher().Start(t.Context(), proc.Spec{Name: "rank 0", Host: "10.0.0.1", Command: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	start := a.next(t, 0)

	// A held poll wakes as soon as a command is queued.
	type result struct {
		r   reply
		err error
		d   time.Duration
	}
	polled := make(chan result, 1)
	holdPoll := func(after uint64) {
		t.Helper()
		seen := e.reg.Agents()[0].LastSeen
		go func() {
			t0 := time.Now()
			r, err := c.send(http.MethodGet, a.commandsTarget(after, 10000), nil)
			polled <- result{r, err, time.Since(t0)}
		}()
		// The poll has reached its session once the agent counts as heard from.
		waitFor(t, "the poll reaches the registry", 2*time.Second, func() bool { return !e.reg.Agents()[0].LastSeen.Equal(seen) })
	}
	holdPoll(start.Seq)
	go p.Stop(time.Second)
	select {
	case res := <-polled:
		var ans protocol.AgentCommandsAnswer
		if res.err != nil || res.r.status != http.StatusOK || json.Unmarshal(res.r.body, &ans) != nil || len(ans.Commands) != 1 || ans.Commands[0].Op != protocol.OpStop {
			t.Fatalf("held poll: %v, %v; want the stop command", res.r, res.err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("a held poll did not wake within 3s of a queued command")
	}

	// wait_ms shortens the poll.
	t0 := time.Now()
	if cmds := a.poll(t, start.Seq+1, 50); len(cmds) != 0 {
		t.Errorf("commands %+v, want none", cmds)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("a poll with wait_ms=50 took %v: held for PollWait", d)
	}

	// Close ends a held poll with 503.
	holdPoll(start.Seq + 1)
	e.reg.Close()
	select {
	case res := <-polled:
		if res.err != nil || res.r.status != http.StatusServiceUnavailable || c.verify(res.r) != nil {
			t.Errorf("held poll at Close: %v, %v; want a signed 503", res.r, res.err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Close did not end a held poll within 3s")
	}
	x := waitExit(t, p, 2*time.Second)
	if x.err == nil {
		t.Errorf("Wait() after Close = %+v, nil; want an error", x.st)
	}
	c.call(t, http.MethodPost, protocol.AgentPathRegister, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, AgentID: "a9", HostID: "i-9", Addr: "10.0.0.9"}, http.StatusServiceUnavailable, nil)
	if got := e.reg.Agents(); len(got) != 0 {
		t.Errorf("Agents() after Close = %+v, want none", got)
	}
}

// A driver restarted with --state-dir adopts the workers an agent kept: those it expects, of
// its job, on the agent's host. One that exited meanwhile ends with its status; one no agent
// lists fails at the deadline; one stopped before it was listed is given up.
func TestAdopt(t *testing.T) {
	e := newEnv(t, nil)
	var out0 syncBuffer
	p0, adopted0 := e.reg.Adopt("i-1/0", proc.Spec{Name: "rank 0", Host: "10.0.0.1", Stdout: &out0, Stderr: &out0}, 5*time.Second)
	p1, adopted1 := e.reg.Adopt("i-1/1", proc.Spec{Name: "rank 1", Host: "10.0.0.1"}, 5*time.Second)
	p2, adopted2 := e.reg.Adopt("i-2/0", proc.Spec{Name: "rank 2", Host: "10.0.0.2"}, 300*time.Millisecond)
	p3, _ := e.reg.Adopt("i-3/0", proc.Spec{Name: "rank 3", Host: "10.0.0.3"}, 5*time.Second)

	p3.Stop(time.Second)
	if x := waitExit(t, p3, time.Second); x.st.Code != -1 || x.err == nil {
		t.Errorf("stopped before adoption: %+v %v", x.st, x.err)
	}
	var ans protocol.AgentRegisterAnswer
	c := e.client(t, secret)
	c.call(t, http.MethodPost, protocol.AgentPathRegister, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, AgentID: "a1", HostID: "i-1", Addr: "10.0.0.1", Procs: []protocol.HeldProc{
		{Proc: 7, Worker: "i-1/0", JobID: jobID, PID: 99},
		{Proc: 8, Worker: "i-1/1", JobID: jobID, Exited: true, Code: 0},
		{Proc: 9, Worker: "i-1/2", JobID: jobID},        // not expected
		{Proc: 10, Worker: "i-1/0", JobID: "other-job"}, // another job's
		{Proc: 11, Worker: "i-2/0", JobID: jobID},       // another host's
		{Proc: 12, Worker: "i-3/0", JobID: jobID},       // given up
	}}, http.StatusOK, &ans)
	if len(ans.Adopted) != 2 || ans.Adopted[0].Old != 7 || ans.Adopted[1].Old != 8 || ans.Adopted[0].New == ans.Adopted[1].New {
		t.Fatalf("adopted %+v: want procs 7 and 8, renumbered", ans.Adopted)
	}
	for i, ch := range []<-chan struct{}{adopted0, adopted1} {
		select {
		case <-ch:
		default:
			t.Errorf("worker %d not marked adopted", i)
		}
	}
	select {
	case <-adopted2:
		t.Error("a worker listed by another host's agent was adopted")
	default:
	}
	if p0.PID() != 99 {
		t.Errorf("PID %d, want the agent's 99", p0.PID())
	}
	if x := waitExit(t, p1, time.Second); x.st.Code != 0 || x.err != nil {
		t.Errorf("held worker that exited 0: %+v %v", x.st, x.err)
	}
	a := &fakeAgent{c: c, session: ans.Session}
	a.emit(t, protocol.AgentEvent{Kind: protocol.KindOutput, Proc: ans.Adopted[0].New, Stream: "stdout", Data: []byte("step 301\n")},
		protocol.AgentEvent{Kind: protocol.KindExited, Proc: ans.Adopted[0].New, Code: 0})
	if x := waitExit(t, p0, time.Second); x.st.Code != 0 || out0.String() != "step 301\n" {
		t.Errorf("adopted worker: %+v, output %q", x.st, out0.String())
	}
	if x := waitExit(t, p2, 3*time.Second); x.st.Code != -1 || x.err == nil || !strings.Contains(x.err.Error(), "not adopted") {
		t.Errorf("never listed: %+v %v", x.st, x.err)
	}
}

// An agent whose commands poll's connection closes under it (the agent, or its host, died) is
// lost within DropGrace, not after its lease: the job does not wait 30 s for a host that is
// gone. One that comes back within the grace keeps its session and its processes.
func TestDroppedConnectionLosesTheAgentAtOnce(t *testing.T) {
	e := newEnv(t, func(c *agents.Config) {
		c.PollWait, c.Lease, c.DropGrace = 5*time.Second, 20*time.Second, 300*time.Millisecond
	})
	c := e.client(t, secret)
	a := c.register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "i-1", Addr: "10.0.0.1"})
	p, err := e.reg.Launcher().Start(t.Context(), proc.Spec{Name: "rank 0", Host: "10.0.0.1", Command: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	start := a.next(t, 0)

	// cut starts the long polls named and cancels them after a moment, in that order, as a
	// killed agent's kernel does by closing its connections.
	srv, err := rendezvous.NewServer(rendezvous.ServerConfig{Secret: []byte("job-secret-0123456789")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	e.reg.SetViewer(srv)
	watch := protocol.AgentPathPrefix + a.session + "/watch?generation=0&hosts_version=0&wait_ms=5000"
	cut := func(targets ...string) {
		t.Helper()
		var cancels []context.CancelFunc
		var dones []chan error
		for _, target := range targets {
			ctx, cancel := context.WithCancel(t.Context())
			req, _, err := c.newRequest(http.MethodGet, target, nil)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				resp, err := c.hc.Do(req.WithContext(ctx))
				if err == nil {
					resp.Body.Close()
				}
				done <- err
			}()
			cancels, dones = append(cancels, cancel), append(dones, done)
		}
		time.Sleep(100 * time.Millisecond)
		for i, cancel := range cancels {
			cancel()
			if err := <-dones[i]; err == nil {
				t.Fatal("a poll was answered before its connection closed")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	commands := a.commandsTarget(start.Seq, 5000)

	// Dropped, then back within the grace: nothing is lost.
	cut(commands)
	time.Sleep(100 * time.Millisecond)
	a.poll(t, start.Seq, 10)
	time.Sleep(600 * time.Millisecond)
	notExited(t, p)
	if got := e.reg.Agents(); len(got) != 1 {
		t.Fatalf("Agents() = %+v after a dropped poll the agent came back from, want it", got)
	}

	// A watch cut alone is no drop: the agent cancels its watch to ask again when its
	// workers change, and may say nothing else for longer than the grace.
	cut(watch)
	time.Sleep(700 * time.Millisecond)
	notExited(t, p)
	if got := e.reg.Agents(); len(got) != 1 {
		t.Fatalf("Agents() = %+v after the agent cancelled its watch, want it", got)
	}

	// Dropped for good: lost within the grace (and the janitor's tick), long before the lease,
	// though the watch, held too, ended after the commands poll.
	cut(commands, watch)
	dropped := time.Now()
	x := waitExit(t, p, 3*time.Second)
	if d := time.Since(dropped); d < 250*time.Millisecond {
		t.Errorf("lost %v after the drop, before its grace of 300ms", d)
	}
	if x.err == nil || !strings.Contains(x.err.Error(), "connection closed") {
		t.Errorf("Wait() = %+v, %v; want an error saying the agent's connection closed", x.st, x.err)
	}
	if got := e.reg.Agents(); len(got) != 0 {
		t.Errorf("Agents() = %+v after the drop, want none", got)
	}
}

// A host the provider lists with no agent connected is reported once it has waited the
// bound, and no longer once its agent registers or the provider drops it.
func TestUnconnectedHosts(t *testing.T) {
	e := newEnv(t, nil)
	hosts := []providers.Host{{ID: "i-1", Addr: "10.0.0.1", Slots: 1}, {ID: "i-2", Addr: "10.0.0.2", Slots: 1, Fallback: true}}
	w := e.reg.Wrap(providers.NewFixed(hosts))
	e.client(t, secret).register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "i-1", Addr: "10.0.0.1"})
	if _, err := w.Hosts(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := e.reg.Unconnected(time.Hour, time.Now()); len(got) != 0 {
		t.Fatalf("reported before the bound: %+v", got)
	}
	got := e.reg.Unconnected(time.Hour, time.Now().Add(2*time.Hour))
	if len(got) != 1 || got[0].Host.ID != "i-2" || !got[0].Host.Fallback {
		t.Fatalf("Unconnected = %+v, want i-2 (its group's flag kept)", got)
	}
	e.client(t, secret).register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "i-2", Addr: "10.0.0.2"})
	if _, err := w.Hosts(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := e.reg.Unconnected(0, time.Now().Add(2*time.Hour)); len(got) != 0 {
		t.Fatalf("still reported after its agent registered: %+v", got)
	}
}
