package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/agents"
	"github.com/elasticd/elasticd/proc"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/worker/agent"
	wrdzv "github.com/elasticd/elasticd/worker/rendezvous"
)

// streamClient is a session-stream client of the test's driver, signing as an agent.
func streamClient(t *testing.T, driverURL string) (*agent.StreamTransport, *http.Client, *protocol.Auth) {
	t.Helper()
	u, err := url.Parse(driverURL)
	if err != nil {
		t.Fatal(err)
	}
	auth := protocol.NewSigner(secret, protocol.AgentAuthLabel)
	fallback := &http.Transport{Proxy: nil, Protocols: new(http.Protocols)}
	fallback.Protocols.SetUnencryptedHTTP2(true)
	st := &agent.StreamTransport{Driver: u, Auth: auth, Fallback: fallback}
	hc := &http.Client{Transport: st}
	t.Cleanup(hc.CloseIdleConnections)
	return st, hc, auth
}

func register(t *testing.T, hc *http.Client, auth *protocol.Auth, base string) protocol.AgentRegisterAnswer {
	t.Helper()
	in := protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, AgentID: "a-1", HostID: "host-a", Addr: "127.0.0.2", Slots: 2, GPUs: []protocol.AgentGPU{}, Metadata: "none"}
	r, err := auth.Exchange(t.Context(), hc, http.MethodPost, base+protocol.AgentPathRegister, in, 1<<20)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("register over the stream: %v, %d %s", err, r.Status, r.Reason)
	}
	var ans protocol.AgentRegisterAnswer
	if err := json.Unmarshal(r.Body, &ans); err != nil {
		t.Fatal(err)
	}
	return ans
}

// An agent's requests, its own and its workers', go to the driver on one connection, each
// answered (and signed) as if it had come alone; one the agent calls off ends at the driver.
func TestStreamCarriesTheSession(t *testing.T) {
	d := startFullDriver(t, "job-s", func(c *agents.Config) { c.PollWait, c.Lease = time.Minute, 2*time.Minute })
	st, hc, auth := streamClient(t, d.url)
	ans := register(t, hc, auth, d.url)
	if !st.Streaming() || d.reg.Streams() != 1 {
		t.Fatalf("streaming %v, driver's streams %d: want the registration on a stream", st.Streaming(), d.reg.Streams())
	}
	conns := d.ln.n.Load()

	// A watch held at the driver, then called off: the driver's poll ends.
	watch := d.url + protocol.AgentPathPrefix + url.PathEscape(ans.Session) + "/watch?generation=9&hosts_version=9&wait_ms=30000&worker=host-a%2F0"
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := auth.Exchange(ctx, hc, http.MethodGet, watch, nil, 1<<20)
		errc <- err
	}()
	waitFor(t, "held watch", 5*time.Second, func() bool { return d.reg.Watches() == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("a called-off watch: %v, want context.Canceled", err)
	}
	waitFor(t, "end of the called-off watch at the driver", 5*time.Second, func() bool { return d.reg.Watches() == 0 })

	// A worker's report, relayed, is the rendezvous server's to check (signed with the job's
	// secret, which the agent's signature does not replace).
	id := protocol.WorkerID{Host: "host-a", Slot: 0}
	if err := wrdzv.NewClient(d.url, d.jobS, id, hc).Report(t.Context(), 0, protocol.Ready, ""); err != nil {
		t.Fatalf("a worker's report over the stream: %v", err)
	}
	select {
	case ev := <-d.srv.Events():
		if ev.Worker != id || ev.State != protocol.Ready {
			t.Fatalf("event %+v, want host-a/0 READY", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the report did not reach the rendezvous")
	}
	// The operator's admin API is not reachable through an agent's stream.
	r, err := auth.Exchange(t.Context(), hc, http.MethodGet, d.url+"/v1/admin/state", nil, 1<<20)
	if ue, ok := errors.AsType[*protocol.UnsignedError](err); !ok || ue.Status != http.StatusBadRequest {
		t.Fatalf("the admin API over a stream: %v, %d; want an unsigned 400", err, r.Status)
	}
	if n := d.ln.n.Load(); n != conns {
		t.Errorf("%d connections to the driver after the first request, want still %d", n, conns)
	}
}

// When the stream breaks, the requests waiting on it fail at once, and the next request
// opens another.
func TestStreamBreaksAndReopens(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// A driver that takes the stream and a request on it, then goes (each connection).
	got := make(chan protocol.Frame, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil || req.Header.Get("Upgrade") != protocol.StreamUpgrade {
					return
				}
				io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+protocol.StreamUpgrade+"\r\n\r\n")
				f, err := protocol.ReadFrame(br, protocol.MaxStreamFrame)
				if err != nil {
					return
				}
				got <- f
				if f.Head.Target == "/v1/answer" {
					b, _ := protocol.AppendFrame(nil, protocol.Frame{Kind: protocol.FrameAnswer, ID: f.ID, Head: protocol.StreamHead{Status: 200}, Body: []byte("hello")})
					c.Write(b)
					time.Sleep(time.Second)
				}
			}()
		}
	}()
	_, hc, _ := streamClient(t, "http://"+ln.Addr().String())
	t0 := time.Now()
	_, err = hc.Get("http://" + ln.Addr().String() + "/v1/hold")
	if err == nil || !strings.Contains(err.Error(), "session stream") {
		t.Fatalf("a request on a stream that broke: %v, want the stream's error", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("the broken stream's request failed after %v", d)
	}
	if f := <-got; f.Kind != protocol.FrameRequest || f.Head.Method != http.MethodGet || f.Head.Target != "/v1/hold" {
		t.Errorf("the driver read %+v", f)
	}
	resp, err := hc.Get("http://" + ln.Addr().String() + "/v1/answer")
	if err != nil {
		t.Fatalf("the request after a break: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "hello" {
		t.Errorf("answer %d %q, want 200 hello", resp.StatusCode, b)
	}
}

// A driver that serves no session streams (an older release) gets the session over HTTP/2.
func TestStreamFallsBackToHTTP2(t *testing.T) {
	d := startFullDriver(t, "job-f")
	d.reg.SetHandler(nil)
	st, hc, auth := streamClient(t, d.url)
	register(t, hc, auth, d.url)
	if st.Streaming() || d.reg.Streams() != 0 {
		t.Fatalf("streaming %v, driver's streams %d: want HTTP/2", st.Streaming(), d.reg.Streams())
	}
	register(t, hc, auth, d.url) // and again, without asking for a stream
}

// A driver shutting down answers what its streams hold, then closes them.
func TestStreamClosedWithTheDriver(t *testing.T) {
	d := startFullDriver(t, "job-c")
	_, hc, auth := streamClient(t, d.url)
	ans := register(t, hc, auth, d.url)
	commands := d.url + protocol.AgentPathPrefix + url.PathEscape(ans.Session) + "/commands?after=0&wait_ms=30000"
	type result struct {
		r   protocol.Reply
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := auth.Exchange(t.Context(), hc, http.MethodGet, commands, nil, 1<<20)
		done <- result{r, err}
	}()
	time.Sleep(200 * time.Millisecond) // the poll is held
	d.reg.Close()
	select {
	case res := <-done:
		if res.err != nil || res.r.Status != http.StatusServiceUnavailable {
			t.Fatalf("a held poll as the driver closes: %v, %d %s; want 503", res.err, res.r.Status, res.r.Reason)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the held poll was not answered within 5s of the driver closing")
	}
	waitFor(t, "close of the driver's streams", 5*time.Second, func() bool { return d.reg.Streams() == 0 })
}

// On a stream the driver holds an agent's watches and commands poll without a goroutine each,
// and answers them as it would over HTTP/2: a watch when the view moves, the commands poll
// when a command is queued.
func TestStreamHoldsPollsWithoutGoroutines(t *testing.T) {
	d := startFullDriver(t, "job-h", func(c *agents.Config) { c.PollWait, c.Lease = time.Minute, 2*time.Minute })
	_, hc, auth := streamClient(t, d.url)
	ans := register(t, hc, auth, d.url)
	base := d.url + protocol.AgentPathPrefix + url.PathEscape(ans.Session)
	type result struct {
		r   protocol.Reply
		err error
	}
	const watches = 20
	watched := make(chan result, watches)
	for range watches {
		go func() {
			r, err := auth.Exchange(t.Context(), hc, http.MethodGet, base+"/watch?generation=0&hosts_version=0&wait_ms=60000&worker=host-a%2F0", nil, 1<<20)
			watched <- result{r, err}
		}()
	}
	commands := make(chan result, 1)
	go func() {
		r, err := auth.Exchange(t.Context(), hc, http.MethodGet, base+"/commands?after=0&wait_ms=60000", nil, 1<<20)
		commands <- result{r, err}
	}()
	waitFor(t, "held watches", 5*time.Second, func() bool { return d.reg.Watches() == watches })
	time.Sleep(100 * time.Millisecond) // the commands poll, sent with them, is held too
	buf := make([]byte, 4<<20)
	if stacks := buf[:runtime.Stack(buf, true)]; bytes.Contains(stacks, []byte("agents.(*Registry).await")) {
		t.Errorf("%d goroutines of the driver wait in polls held on a stream, want none", bytes.Count(stacks, []byte("agents.(*Registry).await")))
	}

	d.srv.Publish(1, map[protocol.WorkerID]protocol.Assignment{{Host: "host-a", Slot: 0}: {Rank: 0, Size: 1, LocalSize: 1, CrossSize: 1}})
	for range watches {
		res := <-watched
		var v protocol.AgentWatchAnswer
		if res.err != nil || res.r.Status != http.StatusOK || json.Unmarshal(res.r.Body, &v) != nil || v.Generation != 1 || len(v.Assignments) != 1 || v.Assignments[0].Assignment.Size != 1 {
			t.Fatalf("a held watch as the view moved: %v, %d %s", res.err, res.r.Status, res.r.Body)
		}
	}
	select {
	case res := <-commands:
		t.Fatalf("the commands poll was answered before any command: %v, %d %s", res.err, res.r.Status, res.r.Body)
	default:
	}
	if _, err := d.reg.Launcher().Start(t.Context(), proc.Spec{Name: "w", Host: "127.0.0.2", Command: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	res := <-commands
	var c protocol.AgentCommandsAnswer
	if res.err != nil || res.r.Status != http.StatusOK || json.Unmarshal(res.r.Body, &c) != nil || len(c.Commands) != 1 || c.Commands[0].Op != protocol.OpStart {
		t.Fatalf("the held commands poll as a worker was started: %v, %d %s", res.err, res.r.Status, res.r.Body)
	}
}

// A poll on a stream is checked as it would be alone: a wrong secret, an unknown session, a
// malformed query are refused with the same answers.
func TestStreamPollRefusals(t *testing.T) {
	d := startFullDriver(t, "job-r")
	_, hc, auth := streamClient(t, d.url)
	ans := register(t, hc, auth, d.url)
	base := d.url + protocol.AgentPathPrefix + url.PathEscape(ans.Session)
	forger := protocol.NewSigner([]byte("another-secret-0123456789abcdef"), protocol.AgentAuthLabel)
	for _, c := range []struct {
		name   string
		auth   *protocol.Auth
		target string
		status int
	}{
		{"another secret", forger, base + "/commands?after=0", http.StatusUnauthorized},
		{"unknown session", auth, d.url + protocol.AgentPathPrefix + "nosuch/watch?generation=0", http.StatusNotFound},
		{"bad generation", auth, base + "/watch?generation=x", http.StatusBadRequest},
		{"bad after", auth, base + "/commands?after=-1", http.StatusBadRequest},
		{"bad wait", auth, base + "/commands?after=0&wait_ms=soon", http.StatusBadRequest},
	} {
		r, err := c.auth.Exchange(t.Context(), hc, http.MethodGet, c.target, nil, 1<<20)
		if ue, ok := errors.AsType[*protocol.UnsignedError](err); ok {
			r.Status = ue.Status
		} else if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if r.Status != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, r.Status, r.Reason, c.status)
		}
	}
	// The session still serves: a poll that waits is answered when its wait is over.
	r, err := auth.Exchange(t.Context(), hc, http.MethodGet, base+"/commands?after=0&wait_ms=50", nil, 1<<20)
	var cmds protocol.AgentCommandsAnswer
	if err != nil || r.Status != http.StatusOK || json.Unmarshal(r.Body, &cmds) != nil || cmds.Commands == nil || len(cmds.Commands) != 0 {
		t.Errorf("a poll whose wait is over: %v, %d %s; want 200 and no command", err, r.Status, r.Body)
	}
}
