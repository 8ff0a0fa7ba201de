package rendezvous_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/protocol"
)

// item is s as one request of a batch, signed as the worker would sign it alone.
func item(t *testing.T, s signed) protocol.BatchItem {
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
