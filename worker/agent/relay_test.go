package agent_test

import (
	"context"
	"encoding/hex"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/agents"
	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/proc"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/worker/agent"
	wrdzv "github.com/elasticd/elasticd/worker/rendezvous"
)

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// fullDriver serves the rendezvous and the agents' protocol on one listener, as the driver
// does: HTTP/1.1 and HTTP/2 with prior knowledge.
type fullDriver struct {
	url  string
	srv  *rendezvous.Server
	reg  *agents.Registry
	ln   *countingListener
	jobS []byte
}

func startFullDriver(t *testing.T, jobID string, config ...func(*agents.Config)) *fullDriver {
	t.Helper()
	jobSecret := protocol.JobSecret(secret, jobID)
	srv, err := rendezvous.NewServer(rendezvous.ServerConfig{Secret: jobSecret})
	if err != nil {
		t.Fatal(err)
	}
	lg, _ := logger(t, "driver")
	cfg := agents.Config{Secret: secret, JobID: jobID, PollWait: 300 * time.Millisecond, Lease: 2 * time.Second, Logger: lg}
	for _, f := range config {
		f(&cfg)
	}
	reg, err := agents.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	reg.SetViewer(srv)
	mux := http.NewServeMux()
	mux.Handle("/v1/", srv)
	mux.Handle(protocol.AgentPathPrefix, reg)
	reg.SetHandler(mux) // the session stream's requests: as the driver serves them
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: inner}
	hs := &http.Server{Handler: mux, Protocols: new(http.Protocols)}
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	done := make(chan struct{})
	go func() { defer close(done); hs.Serve(ln) }()
	t.Cleanup(func() {
		hs.Close()
		<-done
		reg.Close()
		srv.Close()
	})
	return &fullDriver{url: "http://" + inner.Addr().String(), srv: srv, reg: reg, ln: ln, jobS: jobSecret}
}

// heldLauncher "starts" a worker by handing its spec to the test, which plays the worker with
// the real rendezvous client; the process ends when the test says so, or is stopped.
type heldLauncher struct {
	specs chan proc.Spec
}

type heldProc struct {
	once sync.Once
	done chan struct{}
}

func (l heldLauncher) Start(_ context.Context, s proc.Spec) (proc.Process, error) {
	l.specs <- s
	return &heldProc{done: make(chan struct{})}, nil
}

func (p *heldProc) PID() int { return 1 }
func (p *heldProc) Wait() (proc.ExitStatus, error) {
	<-p.done
	return proc.ExitStatus{}, nil
}
func (p *heldProc) Stop(time.Duration) { p.once.Do(func() { close(p.done) }) }

func envOf(s proc.Spec, name string) string {
	v := ""
	for _, kv := range s.Env {
		if rest, ok := strings.CutPrefix(kv, name+"="); ok {
			v = rest
		}
	}
	return v
}

// Workers started by an agent reach the driver's rendezvous through its relay: the driver
// holds one connection for the host, answers no per-worker long-poll (the relay answers
// assignments and host updates from its one watch), and still checks each worker's own MAC on
// what is relayed (reports, the key-value store).
func TestWorkersReachTheDriverThroughTheAgent(t *testing.T) {
	const slots = 8
	d := startFullDriver(t, "job-r")
	specs := make(chan proc.Spec, slots)
	runAgent(t, agent.Config{DriverURL: d.url, Slots: slots, Launcher: heldLauncher{specs}})
	for d.reg.Watches() == 0 {
		time.Sleep(10 * time.Millisecond)
	}

	var clients []*wrdzv.Client
	var relayURL string
	plan := map[protocol.WorkerID]protocol.Assignment{}
	for slot := range slots {
		id := protocol.WorkerID{Host: "host-a", Slot: slot}
		_, err := d.reg.Launcher().Start(t.Context(), proc.Spec{
			Name: id.String(), Host: "127.0.0.2", Slot: slot, Command: []string{"worker"},
			Env: []string{protocol.EnvRendezvous + "=" + d.url, protocol.EnvWorkerID + "=" + id.String()},
		})
		if err != nil {
			t.Fatal(err)
		}
		s := <-specs
		url := envOf(s, protocol.EnvRendezvous)
		if url == d.url || !strings.HasPrefix(url, "http://127.0.0.1:") {
			t.Fatalf("worker's %s=%q: want the agent's relay on loopback, not the driver's %s", protocol.EnvRendezvous, url, d.url)
		}
		key, err := hex.DecodeString(envOf(s, protocol.EnvSecret))
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, wrdzv.NewClient(url, key, id, nil))
		relayURL = url
		if slot < slots-1 { // the last worker is left out of the plan: removed
			plan[id] = protocol.Assignment{Rank: slot, Size: slots - 1, LocalRank: slot, LocalSize: slots - 1, CrossSize: 1}
		}
	}
	connsBefore := d.ln.n.Load()

	// Every worker waits for its place; the driver holds none of those polls.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	got := make([]protocol.Assignment, slots)
	errs := make([]error, slots)
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() { got[i], errs[i] = c.Assignment(ctx, 0) })
	}
	time.Sleep(300 * time.Millisecond)
	if st := d.srv.Stats(); st.AssignmentPolls != 0 {
		t.Errorf("the driver holds %d assignment polls; want none (the relay holds them)", st.AssignmentPolls)
	}
	d.srv.Publish(1, plan)
	wg.Wait()
	for i := range slots {
		if errs[i] != nil {
			t.Fatalf("worker %d: %v", i, errs[i])
		}
		want := plan[protocol.WorkerID{Host: "host-a", Slot: i}]
		if i == slots-1 {
			if !got[i].Removed || got[i].Generation != 1 {
				t.Errorf("worker %d (not in the plan): %+v, want removed in generation 1", i, got[i])
			}
			continue
		}
		if got[i].Generation != 1 || got[i].Rank != want.Rank || got[i].Size != want.Size || got[i].Removed {
			t.Errorf("worker %d: %+v, want rank %d of %d in generation 1", i, got[i], want.Rank, want.Size)
		}
	}

	// Host updates reach every worker.
	vers := make([]uint64, slots)
	for i, c := range clients {
		wg.Go(func() { vers[i], errs[i] = c.HostsUpdated(ctx, 0) })
	}
	time.Sleep(100 * time.Millisecond)
	if st := d.srv.Stats(); st.HostPolls != 0 {
		t.Errorf("the driver holds %d host-update polls; want none", st.HostPolls)
	}
	v := d.srv.NotifyHostsUpdated()
	wg.Wait()
	for i := range slots {
		if errs[i] != nil || vers[i] != v {
			t.Fatalf("worker %d: host-update version %d, %v; want %d", i, vers[i], errs[i], v)
		}
	}

	// Relayed: the key-value store (a get waits for a put of another worker) and reports,
	// which the driver receives as the worker's own.
	st0, st1 := clients[0].Store(1), clients[1].Store(1)
	val := make(chan []byte, 1)
	go func() {
		b, err := st1.Get(ctx, "addr/0")
		if err != nil {
			t.Error(err)
		}
		val <- b
	}()
	time.Sleep(50 * time.Millisecond)
	if err := st0.Set(ctx, "addr/0", []byte("127.0.0.2:4000")); err != nil {
		t.Fatal(err)
	}
	if b := <-val; string(b) != "127.0.0.2:4000" {
		t.Fatalf("relayed get: %q", b)
	}
	if err := clients[3].Report(ctx, 1, protocol.Failure, "relayed"); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-d.srv.Events():
		if ev.Worker != (protocol.WorkerID{Host: "host-a", Slot: 3}) || ev.State != protocol.Failure || ev.Message != "relayed" {
			t.Errorf("the driver heard %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the relayed report did not reach the driver")
	}
	if n := d.ln.n.Load() - connsBefore; n != 0 {
		t.Errorf("the workers' requests opened %d connections to the driver; want none (the agent's one carries them)", n)
	}

	// A forged request (another secret) is refused: by the relay for a poll, by the driver
	// for what is relayed.
	forger := wrdzv.NewClient(relayURL, []byte("not-the-job-secret-0123456789ab"), protocol.WorkerID{Host: "host-a", Slot: 0}, nil)
	if _, err := forger.Assignment(ctx, 0); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("forged assignment poll: %v, want a 401", err)
	}
	if err := forger.Report(ctx, 1, protocol.Failure, "forged"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("forged report: %v, want a 401", err)
	}
	if st := d.srv.Stats(); st.Unauthorized == 0 {
		t.Error("the driver refused no forged request: the relay answered it")
	}
}
