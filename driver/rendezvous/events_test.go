package rendezvous_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/protocol"
)

// TestEventsUnderLoad: 200 workers report concurrently, 5 reports each, while nobody reads
// Events; every report returns promptly anyway. Then every event arrives, each worker's in
// the order it sent them, none lost and none twice.
func TestEventsUnderLoad(t *testing.T) {
	const workers, reports = 200, 5
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	start := time.Now()
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			c := e.client(wid(fmt.Sprintf("node-%d", w/8), w%8))
			for g := range uint64(reports) {
				if err := c.Report(ctx, g+1, protocol.Ready, fmt.Sprintf("w%d g%d", w, g+1)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait() // nobody has read Events yet: reports must not wait for a reader
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d reports sent in %v with nobody reading", workers*reports, time.Since(start))
	if q := e.srv.Stats().QueuedEvents; q < workers*reports-1 { // the feeder may hold one
		t.Fatalf("%d events queued; want %d", q, workers*reports)
	}
	time.Sleep(100 * time.Millisecond) // "a while"

	last := map[protocol.WorkerID]uint64{}
	for i := range workers * reports {
		select {
		case ev := <-e.srv.Events():
			if ev.Generation != last[ev.Worker]+1 {
				t.Fatalf("event %d: worker %v generation %d after %d: out of order or lost", i, ev.Worker, ev.Generation, last[ev.Worker])
			}
			last[ev.Worker] = ev.Generation
			if want := fmt.Sprintf("w%d g%d", ev.Worker.Slot+8*atoiSuffix(ev.Worker.Host), ev.Generation); ev.Message != want || ev.State != protocol.Ready || ev.At.Before(start) {
				t.Fatalf("event %+v; want message %q", ev, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("only %d of %d events arrived", i, workers*reports)
		}
	}
	if len(last) != workers {
		t.Fatalf("events from %d workers; want %d", len(last), workers)
	}
	select {
	case ev := <-e.srv.Events():
		t.Fatalf("an extra event: %+v", ev)
	case <-time.After(50 * time.Millisecond):
	}
}

func atoiSuffix(host string) int {
	var n int
	fmt.Sscanf(strings.TrimPrefix(host, "node-"), "%d", &n)
	return n
}

// TestEventsArrivalOrder: reports from different workers come out in the order the server
// received them.
func TestEventsArrivalOrder(t *testing.T) {
	e := newEnv(t, nil)
	states := []protocol.State{protocol.Ready, protocol.Failure, protocol.Success}
	for i := range 30 {
		c := e.client(wid(fmt.Sprintf("h%d", i%4), 0))
		if err := c.Report(t.Context(), uint64(i), states[i%3], ""); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 30 {
		ev := <-e.srv.Events()
		if ev.Generation != uint64(i) || ev.Worker.Host != fmt.Sprintf("h%d", i%4) || ev.State != states[i%3] {
			t.Fatalf("event %d is %+v", i, ev)
		}
	}
}

// TestReportRetryDelivered once: a report sent twice with the same report ID (a retry after
// a lost answer) reaches the driver once.
func TestReportRetryDeliveredOnce(t *testing.T) {
	e := newEnv(t, nil)
	target := "/v1/workers/" + url.PathEscape("h/0") + "/state"
	body := []byte(`{"generation":3,"state":"FAILURE","message":"oom","report_id":"r1"}`)
	for range 2 {
		if code, msg := e.send(t, signed{method: "POST", target: target, body: body}); code != http.StatusNoContent {
			t.Fatalf("%d %q", code, msg)
		}
	}
	if code, msg := e.send(t, signed{method: "POST", target: target, body: []byte(`{"generation":3,"state":"FAILURE","message":"oom again","report_id":"r2"}`)}); code != http.StatusNoContent {
		t.Fatalf("%d %q", code, msg)
	}
	for _, want := range []string{"oom", "oom again"} {
		if ev := <-e.srv.Events(); ev.Message != want {
			t.Fatalf("event %+v; want message %q", ev, want)
		}
	}
	select {
	case ev := <-e.srv.Events():
		t.Fatalf("the retry was delivered again: %+v", ev)
	case <-time.After(50 * time.Millisecond):
	}
}

// TestEventQueueBound: with nobody reading, reports beyond MaxQueuedEvents are refused (503,
// so the client retries and then says so), never dropped silently.
func TestEventQueueBound(t *testing.T) {
	e := newEnv(t, func(c *rendezvous.ServerConfig) { c.MaxQueuedEvents = 3 })
	c := e.client(wid("h", 0))
	var refused error
	for i := range 5 {
		if err := c.Report(t.Context(), uint64(i), protocol.Ready, ""); err != nil {
			refused = err
			break
		}
	}
	if refused == nil || !strings.Contains(refused.Error(), "503 driver is behind on reports") {
		t.Fatalf("reports beyond the queue bound: %v", refused)
	}
	for i := range 3 { // the feeder holds one, the queue three
		if ev := <-e.srv.Events(); ev.Generation != uint64(i) {
			t.Fatalf("event %+v; want generation %d", ev, i)
		}
	}
}

func TestReportTruncatesMessage(t *testing.T) {
	e := newEnv(t, nil)
	msg := strings.Repeat("é", protocol.MaxMessage) // 2 bytes each
	if err := e.client(wid("h", 0)).Report(t.Context(), 1, protocol.Failure, msg+"\xff"); err != nil {
		t.Fatal(err)
	}
	ev := <-e.srv.Events()
	if len(ev.Message) != protocol.MaxMessage || !strings.HasPrefix(msg, ev.Message) {
		t.Fatalf("message of %d bytes arrived as %d bytes", len(msg), len(ev.Message))
	}
}

// A worker's step time reaches the driver; a nonsense one is refused.
func TestReportLoad(t *testing.T) {
	e := newEnv(t, nil)
	id := wid("h", 1)
	c := e.client(id)
	if err := c.ReportLoad(t.Context(), 250*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got := e.srv.StepTimes()[id]; got != 250*time.Millisecond {
		t.Fatalf("step time %v, want 250ms", got)
	}
	if err := c.ReportLoad(t.Context(), 0); err == nil || !strings.Contains(err.Error(), "step_seconds") {
		t.Fatalf("a zero step time: %v, want a 400 naming step_seconds", err)
	}
}

// Rank 0's progress reaches the driver with a step rate; a late report of an older
// generation, or one behind in the same generation, does not move it back; a rollback does,
// with its new generation, and the rate starts over.
func TestReportProgress(t *testing.T) {
	e := newEnv(t, nil)
	c := e.client(wid("h", 0))
	if p := e.srv.Progress(); !p.At.IsZero() || p.Step != 0 {
		t.Fatalf("progress before any report: %+v", p)
	}
	report := func(gen, step, committed uint64) {
		t.Helper()
		if err := c.ReportProgress(t.Context(), protocol.ProgressReport{Generation: gen, Step: step, Committed: committed}); err != nil {
			t.Fatal(err)
		}
	}
	report(1, 100, 100)
	time.Sleep(200 * time.Millisecond)
	report(1, 140, 130)
	p := e.srv.Progress()
	if p.Generation != 1 || p.Step != 140 || p.Committed != 130 || p.At.IsZero() {
		t.Fatalf("progress %+v, want generation 1, step 140, committed 130", p)
	}
	// 40 steps in a little over 0.2 s.
	if p.StepsPerSecond < 100 || p.StepsPerSecond > 200 {
		t.Fatalf("rate %v steps/s, want about 40/0.2 s", p.StepsPerSecond)
	}
	report(1, 120, 120) // delayed: behind
	report(0, 500, 500) // an older generation
	if p := e.srv.Progress(); p.Step != 140 || p.Generation != 1 {
		t.Fatalf("a stale report moved progress to %+v", p)
	}
	report(2, 130, 130) // rolled back to the last commit, in the next generation
	if p := e.srv.Progress(); p.Step != 130 || p.Generation != 2 || p.StepsPerSecond != 0 {
		t.Fatalf("after the rollback: %+v, want step 130 of generation 2 and no rate yet", p)
	}
	if err := c.ReportProgress(t.Context(), protocol.ProgressReport{Generation: 2, Step: 10, Committed: 11}); err == nil || !strings.Contains(err.Error(), "committed_step") {
		t.Fatalf("committed past the step: %v, want a 400 naming committed_step", err)
	}
}

// The loss and total steps of a report reach Progress and stay until a report gives new ones;
// an old client's report, without them, is accepted and changes neither; a loss that JSON
// cannot carry (NaN, or a number past float64) is refused with a 400, and moves nothing.
func TestReportProgressLossAndTotal(t *testing.T) {
	e := newEnv(t, nil)
	c := e.client(wid("h", 0))
	loss := 2.5
	if err := c.ReportProgress(t.Context(), protocol.ProgressReport{Generation: 1, Step: 10, Committed: 10, Loss: &loss, TotalSteps: 1000}); err != nil {
		t.Fatal(err)
	}
	loss = 99 // the server keeps its own copy
	p := e.srv.Progress()
	if p.Loss == nil || *p.Loss != 2.5 || p.TotalSteps != 1000 {
		t.Fatalf("progress %+v (loss %v), want loss 2.5 and 1000 steps in all", p, p.Loss)
	}

	// An old client's report: the exact body of protocol 1 before loss and total_steps.
	const target = "/v1/workers/h%2F0/progress"
	if code, body := e.send(t, signed{method: "POST", target: target, body: []byte(`{"generation": 1, "step": 20, "committed_step": 20}`)}); code != 204 {
		t.Fatalf("a report without loss and total_steps: %d %s, want 204", code, body)
	}
	if p := e.srv.Progress(); p.Step != 20 || p.Loss == nil || *p.Loss != 2.5 || p.TotalSteps != 1000 {
		t.Fatalf("after an old-style report: %+v, want step 20 with the loss and total kept", p)
	}
	for _, body := range []string{
		`{"generation": 1, "step": 30, "committed_step": 30, "loss": NaN}`,
		`{"generation": 1, "step": 30, "committed_step": 30, "loss": Infinity}`,
		`{"generation": 1, "step": 30, "committed_step": 30, "loss": 1e999}`,
		`{"generation": 1, "step": 30, "committed_step": 30, "loss": "0.5"}`,
		`{"generation": 1, "step": 30, "committed_step": 30, "total_steps": -1}`,
	} {
		if code, msg := e.send(t, signed{method: "POST", target: target, body: []byte(body)}); code != 400 {
			t.Errorf("%s: %d %s, want 400", body, code, msg)
		}
	}
	if p := e.srv.Progress(); p.Step != 20 || *p.Loss != 2.5 {
		t.Fatalf("a refused report moved progress to %+v", p)
	}
	loss = 0.75
	if err := c.ReportProgress(t.Context(), protocol.ProgressReport{Generation: 1, Step: 40, Committed: 40, Loss: &loss}); err != nil {
		t.Fatal(err)
	}
	if p := e.srv.Progress(); *p.Loss != 0.75 || p.TotalSteps != 1000 {
		t.Fatalf("progress %+v, want the new loss 0.75 and the total kept", p)
	}
}

// Each host's workers are heard from whenever they make a request; other hosts are not.
func TestHeard(t *testing.T) {
	e := newEnv(t, nil)
	before := time.Now()
	if err := e.client(wid("a", 1)).ReportLoad(t.Context(), time.Second); err != nil {
		t.Fatal(err)
	}
	h := e.srv.Heard()
	if at, ok := h["a"]; !ok || at.Before(before) || len(h) != 1 {
		t.Fatalf("heard %v, want host a only, at or after %v", h, before)
	}
}

// A READY report carries the work its sender rolled back and whether a peer went silent; a
// nonsense one is refused.
func TestReportReadyRollback(t *testing.T) {
	e := newEnv(t, nil)
	c := e.client(wid("h", 0))
	rb := protocol.Rollback{Steps: 9, Seconds: 1.25}
	if err := c.ReportReady(t.Context(), 3, protocol.ReadyReport{Message: "peer lost", Rollback: rb}); err != nil {
		t.Fatal(err)
	}
	if ev := <-e.srv.Events(); ev.State != protocol.Ready || ev.Generation != 3 || ev.Rollback != rb || ev.SilentPeer {
		t.Fatalf("event %+v, want READY for 3 with rollback %+v and no silent peer", ev, rb)
	}
	if err := c.ReportReady(t.Context(), 4, protocol.ReadyReport{Message: "timed out", SilentPeer: true}); err != nil {
		t.Fatal(err)
	}
	if ev := <-e.srv.Events(); ev.Generation != 4 || !ev.SilentPeer {
		t.Fatalf("event %+v, want READY for 4 that names a silent peer", ev)
	}
	if err := c.ReportReady(t.Context(), 3, protocol.ReadyReport{Message: "x", Rollback: protocol.Rollback{Seconds: -1}}); err == nil || !strings.Contains(err.Error(), "rolled_back_seconds") {
		t.Fatalf("negative seconds: %v, want a 400 naming rolled_back_seconds", err)
	}
}
