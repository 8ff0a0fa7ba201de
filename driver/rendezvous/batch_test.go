package rendezvous_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/protocol"
)

// item is s as one request of a batch, signed as the worker would sign it alone.
func item(t testing.TB, s signed) protocol.BatchItem {
	t.Helper()
	req := s.request(t, "http://driver.invalid")
	it := protocol.BatchItem{Method: req.Method, Target: req.URL.RequestURI(), Header: map[string]string{}}
	for k := range req.Header {
		it.Header[k] = req.Header.Get(k)
	}
	it.Body, _ = io.ReadAll(req.Body)
	return it
}

// postBatch sends a batch and returns the status and the decoded answer.
func postBatch(t *testing.T, e *env, body []byte) (int, protocol.BatchAnswer, string) {
	t.Helper()
	resp, err := e.ts.Client().Post(e.ts.URL+protocol.PathBatch, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out protocol.BatchAnswer
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("batch answer %q: %v", b, err)
		}
	}
	return resp.StatusCode, out, string(b)
}

// A batch serves each of its requests as if it came alone: a worker's report is queued, a
// request signed with another secret is refused as it would be alone, and neither a GET (a
// long-poll would hold the batch) nor a batch inside the batch is served.
func TestBatch(t *testing.T) {
	e := newEnv(t, nil)
	report := func() []byte {
		gen := uint64(0)
		b, _ := json.Marshal(protocol.StateReport{Generation: &gen, State: protocol.Ready})
		return b
	}
	in := protocol.BatchRequest{Requests: []protocol.BatchItem{
		item(t, signed{method: "POST", target: "/v1/workers/h%2F0/state", body: report()}),
		item(t, signed{method: "POST", target: "/v1/workers/h%2F1/state", body: report(), secret: []byte("another secret, not the job's")}),
		item(t, signed{method: "GET", target: "/v1/workers/h%2F2/assignment?after=0"}),
		item(t, signed{method: "POST", target: protocol.PathBatch, body: []byte(`{"requests":[]}`)}),
	}}
	body, _ := json.Marshal(in)
	code, out, raw := postBatch(t, e, body)
	if code != http.StatusOK || len(out.Answers) != 4 {
		t.Fatalf("batch: %d %s", code, raw)
	}
	for i, want := range []int{http.StatusNoContent, http.StatusUnauthorized, http.StatusBadRequest, http.StatusBadRequest} {
		if a := out.Answers[i]; a.Status != want {
			t.Errorf("answer %d: %d %q, want %d", i, a.Status, a.Body, want)
		}
	}
	if b := string(out.Answers[2].Body); !strings.Contains(b, "POSTs only") {
		t.Errorf("the GET's answer %q: want it to say a batch takes POSTs only", b)
	}
	select {
	case ev := <-e.srv.Events():
		if ev.Worker.String() != "h/0" || ev.State != protocol.Ready {
			t.Errorf("event %+v, want h/0 READY", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the batched report was not queued")
	}
	select {
	case ev := <-e.srv.Events():
		t.Errorf("a second event %+v: the forged report was queued", ev)
	case <-time.After(100 * time.Millisecond):
	}

	// The batch itself: well formed, 1 to MaxBatch requests.
	many, _ := json.Marshal(protocol.BatchRequest{Requests: make([]protocol.BatchItem, protocol.MaxBatch+1)})
	for name, b := range map[string][]byte{"empty": []byte(`{"requests":[]}`), "too many": many, "malformed": []byte(`{"requests":`)} {
		if code, _, raw := postBatch(t, e, b); code != http.StatusBadRequest {
			t.Errorf("%s batch: %d %s, want 400", name, code, raw)
		}
	}
}

// Every request of a batch is answered as it would be alone, state reports included (which
// a batch checks one by one and queues together): the same status and text for a good report,
// a retry, a malformed or incomplete one, a forged or altered one, a stranger's path, and a
// full queue; and the events queued are the same, in the batch's order.
func TestBatchAnswersAsAlone(t *testing.T) {
	gen := uint64(2)
	good := func(id string) []byte {
		b, _ := json.Marshal(protocol.StateReport{Generation: &gen, State: protocol.Ready, ReportID: id, Message: "reset " + id})
		return b
	}
	progress, _ := json.Marshal(protocol.ProgressReport{Generation: gen, Step: 5})
	reqs := []signed{
		{method: "POST", target: "/v1/workers/h%2F0/state", body: good("a")},
		{method: "POST", target: "/v1/workers/h%2F0/state", body: good("a")}, // a retry: answered, not queued again
		{method: "POST", target: "/v1/workers/h%2F1/progress", body: progress},
		{method: "POST", target: "/v1/workers/h%2F1/state", body: good("b")},
		{method: "POST", target: "/v1/workers/h%2F2/state", body: []byte(`{"generation":`)},
		{method: "POST", target: "/v1/workers/h%2F2/state", body: []byte(`{"state":"READY"}`)},
		{method: "POST", target: "/v1/workers/h%2F2/state", body: []byte(`{"generation":1,"state":"DONE"}`)},
		{method: "POST", target: "/v1/workers/h%2F2/state", body: good("c"), bodySent: good("d")},
		{method: "POST", target: "/v1/workers/h%2F2/state", body: good("e"), secret: []byte("another secret, not the job's")},
		{method: "POST", target: "/v1/workers/nohost/state", body: good("f")},
		{method: "POST", target: "/v1/workers/h%2F3/state", body: good("g")},
	}
	events := func(e *env) []string {
		var out []string
		for {
			select {
			case ev := <-e.srv.Events():
				out = append(out, ev.Worker.String()+" "+ev.Message)
			case <-time.After(200 * time.Millisecond):
				return out
			}
		}
	}

	alone := newEnv(t, nil)
	var want []protocol.BatchReply
	for _, r := range reqs {
		code, body := alone.send(t, r)
		want = append(want, protocol.BatchReply{Status: code, Body: []byte(body)})
	}
	wantEvents := events(alone)
	if len(wantEvents) != 3 {
		t.Fatalf("alone, events %q: want 3", wantEvents)
	}

	batched := newEnv(t, nil)
	in := protocol.BatchRequest{}
	for _, r := range reqs {
		it := item(t, r)
		if r.bodySent != nil {
			it.Body = r.bodySent
		}
		in.Requests = append(in.Requests, it)
	}
	body, _ := json.Marshal(in)
	code, out, raw := postBatch(t, batched, body)
	if code != http.StatusOK || len(out.Answers) != len(reqs) {
		t.Fatalf("batch: %d %s", code, raw)
	}
	for i, a := range out.Answers {
		if a.Status != want[i].Status || string(a.Body) != string(want[i].Body) {
			t.Errorf("request %d (%s %s): in a batch %d %q, alone %d %q", i, reqs[i].method, reqs[i].target, a.Status, a.Body, want[i].Status, want[i].Body)
		}
	}
	if got := events(batched); !slices.Equal(got, wantEvents) {
		t.Errorf("events queued from the batch %q, alone %q", got, wantEvents)
	}
	if a, b := alone.srv.Stats().Unauthorized, batched.srv.Stats().Unauthorized; a != b || a != 2 {
		t.Errorf("requests refused for their signature: alone %d, in a batch %d; want 2", a, b)
	}

	// A batch's reports are queued together: those beyond a full queue are refused, as one
	// alone would be, and the driver's relay sends them again.
	full := newEnv(t, func(c *rendezvous.ServerConfig) { c.MaxQueuedEvents = 2 })
	in = protocol.BatchRequest{}
	for _, id := range []string{"0", "1", "2", "3"} {
		in.Requests = append(in.Requests, item(t, signed{method: "POST", target: "/v1/workers/h%2F" + id + "/state", body: good(id)}))
	}
	body, _ = json.Marshal(in)
	if code, out, raw = postBatch(t, full, body); code != http.StatusOK || len(out.Answers) != 4 {
		t.Fatalf("batch: %d %s", code, raw)
	}
	for i, want := range []int{http.StatusNoContent, http.StatusNoContent, http.StatusServiceUnavailable, http.StatusServiceUnavailable} {
		if a := out.Answers[i]; a.Status != want || (want == http.StatusServiceUnavailable && !strings.Contains(string(a.Body), "retry")) {
			t.Errorf("report %d beside a queue of 2: %d %q, want %d", i, a.Status, a.Body, want)
		}
	}
}

// BenchmarkBatchOfReports measures the driver's cost of one host's READY reports at a reset:
// a batch of 8 signed state reports (a host of 8 workers, relayed by its agent), served by
// Server.ServeHTTP and drained from Events. ns/op is per batch; signing is left out.
func BenchmarkBatchOfReports(b *testing.B) {
	const perHost = 8
	e := newEnv(b, nil)
	go func() {
		for range e.srv.Events() {
		}
	}()
	gen := uint64(3)
	batch := func(i int) *http.Request {
		report, _ := json.Marshal(protocol.StateReport{Generation: &gen, State: protocol.Ready, ReportID: fmt.Sprint(i)})
		in := protocol.BatchRequest{Requests: make([]protocol.BatchItem, perHost)}
		for k := range in.Requests {
			in.Requests[k] = item(b, signed{method: "POST", target: fmt.Sprintf("/v1/workers/host-%d%%2F%d/state", i%4096, k), body: report})
		}
		body, _ := json.Marshal(in)
		return httptest.NewRequest(http.MethodPost, protocol.PathBatch, bytes.NewReader(body))
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		req := batch(i)
		rec := httptest.NewRecorder()
		b.StartTimer()
		e.srv.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("batch: %d %s", rec.Code, rec.Body)
		}
	}
}
