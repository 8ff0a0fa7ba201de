// HTTP plumbing shared by the handlers: the long-poll, parameters, JSON.

package rendezvous

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/elasticd/elasticd/protocol"
)

// longPoll holds a request until look has an answer for it. look runs under s.mu and returns
// either answer, which writes the reply (outside the lock), or the channel that is closed when
// there may be one. The request is held at most PollTimeout (less if the client asked for less
// with wait_ms), then answered 204 No Content; polls counts the requests held (Stats).
func (s *Server) longPoll(w http.ResponseWriter, r *http.Request, polls *atomic.Int64, look func() (answer func(), ch <-chan struct{})) {
	timer, ok := s.pollTimer(w, r)
	if !ok {
		return
	}
	defer timer.Stop()
	polls.Add(1)
	defer polls.Add(-1)
	for {
		s.mu.Lock()
		answer, ch := look()
		s.mu.Unlock()
		if answer != nil {
			answer()
			return
		}
		if !s.await(w, r, ch, timer) {
			return
		}
	}
}

// await waits for ch, the end of the poll, the end of the request or Close. It reports
// whether the caller should look again; when it returns false it has answered the request
// (or the client has gone).
func (s *Server) await(w http.ResponseWriter, r *http.Request, ch <-chan struct{}, timer *time.Timer) bool {
	select {
	case <-ch:
		return true
	case <-timer.C:
		w.WriteHeader(http.StatusNoContent)
	case <-r.Context().Done():
	case <-s.closing:
		http.Error(w, errShuttingDown.Error(), http.StatusServiceUnavailable)
	}
	return false
}

// pollTimer starts the timer of a long-poll: PollTimeout, or less if the client asked for
// less with wait_ms.
func (s *Server) pollTimer(w http.ResponseWriter, r *http.Request) (*time.Timer, bool) {
	d := s.cfg.PollTimeout
	if r.URL.Query().Has("wait_ms") {
		ms, ok := uintParam(w, r, "wait_ms", true)
		if !ok {
			return nil, false
		}
		if ms < uint64(d/time.Millisecond) {
			d = time.Duration(ms) * time.Millisecond
		}
	}
	return time.NewTimer(d), true
}

func workerParam(w http.ResponseWriter, r *http.Request) (protocol.WorkerID, bool) {
	id, err := protocol.ParseWorkerID(r.PathValue("id"))
	if err != nil {
		http.Error(w, "bad "+err.Error(), http.StatusBadRequest)
		return protocol.WorkerID{}, false
	}
	return id, true
}

func uintParam(w http.ResponseWriter, r *http.Request, name string, required bool) (uint64, bool) {
	q := r.URL.Query()
	if !q.Has(name) {
		if required {
			http.Error(w, fmt.Sprintf("missing query parameter %q", name), http.StatusBadRequest)
			return 0, false
		}
		return 0, true
	}
	v := q.Get(name)
	n, err := parseUint(v)
	if err != nil {
		http.Error(w, fmt.Sprintf("bad query parameter %s=%q: want a non-negative decimal", name, v), http.StatusBadRequest)
		return 0, false
	}
	return n, true
}

func parseUint(v string) (uint64, error) {
	if v == "" || v[0] == '+' {
		return 0, errors.New("not a decimal")
	}
	return strconv.ParseUint(v, 10, 64)
}

func decodeJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	body, _ := io.ReadAll(r.Body) // already in memory, and bounded
	if err := decodeBody(body, v); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

// decodeBody decodes a request's JSON body into v; the error is a 400's text.
func decodeBody(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return errors.New("empty body: want a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("data after the JSON object")
	}
	if err != nil {
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
			err = fmt.Errorf("field %q: JSON %s where %s was expected", te.Field, te.Value, jsonKind(te.Type.Kind().String()))
		}
		return errors.New("bad JSON body: " + protocol.OneLine(err.Error()))
	}
	return nil
}

func jsonKind(goKind string) string {
	switch {
	case strings.HasPrefix(goKind, "int"), strings.HasPrefix(goKind, "uint"), strings.HasPrefix(goKind, "float"):
		return "a number"
	case goKind == "string":
		return "a string"
	case goKind == "bool":
		return "a boolean"
	}
	return "another type"
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil { // only plain structs are written here
		http.Error(w, "encode answer: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(b, '\n'))
}
