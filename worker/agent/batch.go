package agent

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticd/elasticd/protocol"
)

// DefaultBatchWindow is how long a BatchTransport holds a worker's report for the others of
// its host: they fail the same collective, so they report within a millisecond or two.
const DefaultBatchWindow = 2 * time.Millisecond

// BatchTransport carries workers' reports (POST /v1/workers/{id}/state) to the driver
// together: the reports made within Window of the first go as one POST protocol.PathBatch,
// and each report's answer comes back as if it had gone alone. Every other request goes
// through Base unchanged. The agent's relay sends its workers' requests through one, so that
// a reset of a host of 8 workers is one request to the driver, not 8. A driver without
// batches (it answers one 404 or 401) gets the reports one by one from then on.
type BatchTransport struct {
	Base   http.RoundTripper // nil: http.DefaultTransport
	Driver *url.URL          // the driver's scheme and host
	Window time.Duration     // 0: DefaultBatchWindow

	mu      sync.Mutex
	pending []*batchCall
	timer   *time.Timer
	off     atomic.Bool // the driver has no batches
}

type batchCall struct {
	req  *http.Request
	item protocol.BatchItem
	done chan batchResult
}

type batchResult struct {
	resp *http.Response
	err  error
}

func (t *BatchTransport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return http.DefaultTransport
}

// isReport reports whether req is a worker's report.
func isReport(req *http.Request) bool {
	path, _, _ := strings.Cut(req.URL.RequestURI(), "?")
	return req.Method == http.MethodPost && strings.HasPrefix(path, "/v1/workers/") && strings.HasSuffix(path, "/state")
}

// readBody reads and closes a request's body, for a transport that sends it whole: nil
// when it has none.
func readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil {
		return nil, nil
	}
	defer req.Body.Close()
	return io.ReadAll(req.Body)
}

// RoundTrip implements http.RoundTripper.
func (t *BatchTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !isReport(req) || t.off.Load() {
		return t.base().RoundTrip(req)
	}
	body, err := readBody(req)
	if err != nil {
		return nil, err
	}
	item := protocol.BatchItem{Method: req.Method, Target: req.URL.RequestURI(), Header: map[string]string{}, Body: body}
	for k, vs := range req.Header {
		if len(vs) > 0 && (strings.HasPrefix(k, "X-Elasticd-") || k == "Content-Type") {
			item.Header[k] = vs[0]
		}
	}
	c := &batchCall{req: req, item: item, done: make(chan batchResult, 1)}
	t.mu.Lock()
	t.pending = append(t.pending, c)
	switch n := len(t.pending); {
	case n >= protocol.MaxBatch:
		if t.timer != nil {
			t.timer.Stop()
		}
		go t.flush()
	case n == 1:
		t.timer = time.AfterFunc(cmp.Or(t.Window, DefaultBatchWindow), t.flush)
	}
	t.mu.Unlock()
	select {
	case r := <-c.done:
		return r.resp, r.err
	case <-req.Context().Done():
		return nil, req.Context().Err() // the report may still be sent: reports carry IDs, a resend is no double
	}
}

// flush sends the reports waiting, as one batch.
func (t *BatchTransport) flush() {
	t.mu.Lock()
	calls := t.pending
	t.pending, t.timer = nil, nil
	t.mu.Unlock()
	if len(calls) == 0 {
		return
	}
	answers, err := t.send(calls)
	if errors.Is(err, errNoBatches) {
		t.off.Store(true)
		for _, c := range calls {
			go func() {
				r := c.req.Clone(c.req.Context())
				r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(c.item.Body)), int64(len(c.item.Body))
				resp, err := t.base().RoundTrip(r)
				c.done <- batchResult{resp, err}
			}()
		}
		return
	}
	for i, c := range calls {
		if err != nil {
			c.done <- batchResult{nil, err}
			continue
		}
		a := answers[i]
		c.done <- batchResult{resp: &http.Response{
			Status: fmt.Sprintf("%d %s", a.Status, http.StatusText(a.Status)), StatusCode: a.Status,
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: http.Header(a.Header),
			Body: io.NopCloser(bytes.NewReader(a.Body)), ContentLength: int64(len(a.Body)), Request: c.req,
		}}
	}
}

var errNoBatches = errors.New("the driver takes no batches")

// send posts one batch and returns its answers, in the calls' order.
func (t *BatchTransport) send(calls []*batchCall) ([]protocol.BatchReply, error) {
	in := protocol.BatchRequest{Requests: make([]protocol.BatchItem, len(calls))}
	for i, c := range calls {
		in.Requests[i] = c.item
	}
	b, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	// Not any one worker's context: the batch is all of theirs.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.Driver.Scheme+"://"+t.Driver.Host+protocol.PathBatch, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.base().RoundTrip(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	switch {
	case err != nil:
		return nil, err
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusUnauthorized:
		// A driver without batches: the path is unknown to it, or its rendezvous asks the
		// unsigned batch for a signature.
		return nil, errNoBatches
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("the driver refused a batch of %d reports: %s: %s", len(calls), resp.Status, protocol.OneLine(string(body)))
	}
	var out protocol.BatchAnswer
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("the driver's answer to a batch: %w", err)
	}
	if len(out.Answers) != len(calls) {
		return nil, fmt.Errorf("the driver answered %d of a batch of %d reports", len(out.Answers), len(calls))
	}
	return out.Answers, nil
}
