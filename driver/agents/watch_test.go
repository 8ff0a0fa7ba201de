package agents_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/protocol"
)

// The watch answers at once when the generation or the host-update version is past the
// agent's, else after the poll wait; it names each worker asked about with its assignment,
// or removed; it waits for a change rather than polling.
func TestWatch(t *testing.T) {
	e := newEnv(t, nil)
	c := e.client(t, secret)
	a := c.register(t, protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, HostID: "i-1", Addr: "10.0.0.1"})
	path := protocol.AgentPathPrefix + a.session + "/watch"
	q := func(gen, hosts string, wait string, workers ...string) string {
		v := url.Values{"generation": {gen}, "hosts_version": {hosts}, "wait_ms": {wait}, "worker": workers}
		return path + "?" + v.Encode()
	}
	c.call(t, http.MethodGet, q("0", "0", "0", "i-1/0"), nil, http.StatusServiceUnavailable, nil)

	srv, err := rendezvous.NewServer(rendezvous.ServerConfig{Secret: []byte("job-secret-0123456789")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	e.reg.SetViewer(srv)
	srv.Publish(1, map[protocol.WorkerID]protocol.Assignment{{Host: "i-1", Slot: 0}: {Rank: 3, Size: 4}})

	var v protocol.AgentWatchAnswer
	c.call(t, http.MethodGet, q("0", "0", "5000", "i-1/0", "i-1/1"), nil, http.StatusOK, &v)
	if v.Generation != 1 || len(v.Assignments) != 2 ||
		v.Assignments[0].Worker != "i-1/0" || v.Assignments[0].Assignment.Rank != 3 || v.Assignments[0].Assignment.Removed ||
		v.Assignments[1].Worker != "i-1/1" || !v.Assignments[1].Assignment.Removed || v.Assignments[1].Assignment.Generation != 1 {
		t.Fatalf("watch after generation 0: %+v; want generation 1, i-1/0 rank 3, i-1/1 removed", v)
	}

	// Nothing new: the current view after the wait.
	began := time.Now()
	c.call(t, http.MethodGet, q("1", "0", "150", "i-1/0"), nil, http.StatusOK, &v)
	if waited := time.Since(began); waited < 150*time.Millisecond || v.Generation != 1 {
		t.Fatalf("watch with nothing new: %+v after %v; want generation 1 after the 150ms wait", v, waited)
	}

	// A host update ends a held watch at once.
	done := make(chan protocol.AgentWatchAnswer, 1)
	go func() {
		var v protocol.AgentWatchAnswer
		c.call(t, http.MethodGet, q("1", "0", "5000", "i-1/0"), nil, http.StatusOK, &v)
		done <- v
	}()
	for e.reg.Watches() == 0 {
		time.Sleep(time.Millisecond)
	}
	srv.NotifyHostsUpdated()
	select {
	case v := <-done:
		if v.HostsVersion != 1 || v.Generation != 1 {
			t.Fatalf("watch after a host update: %+v", v)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("a host update did not end the held watch")
	}

	for _, tc := range []struct {
		target string
		status int
		reason string
	}{
		{q("x", "0", "0"), http.StatusBadRequest, `generation="x"`},
		{q("0", "-1", "0"), http.StatusBadRequest, `hosts_version="-1"`},
		{q("0", "0", "soon"), http.StatusBadRequest, `wait_ms="soon"`},
		{q("0", "0", "0", "no-slot"), http.StatusBadRequest, `worker="no-slot"`},
		{q("0", "0", "0", strings.Split(strings.Repeat("i-1/0,", protocol.MaxWatchedWorkers+1), ",")[:protocol.MaxWatchedWorkers+1]...), http.StatusBadRequest, "at most 4096"},
		{protocol.AgentPathPrefix + "no-such-session/watch", http.StatusNotFound, "register again"},
	} {
		r := c.call(t, http.MethodGet, tc.target, nil, tc.status, nil)
		if msg := oneLine(t, r); !strings.Contains(msg, tc.reason) {
			t.Errorf("GET %.80s: %q, want it to say %q", tc.target, msg, tc.reason)
		}
	}
}
