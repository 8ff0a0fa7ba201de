package rendezvous

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/elasticd/elasticd/protocol"
)

// serveBatch answers POST protocol.PathBatch: several workers' POSTs (an agent's relay sends
// its workers' reports together), each served as if it came alone, with its own signature
// checked. A reset of a large job is then one request per host, not one per worker. Only
// POSTs are taken: they are answered at once, where a long-poll would hold the whole batch.
func (s *Server) serveBatch(w http.ResponseWriter, r *http.Request) {
	limit := s.cfg.MaxBody * 2 // base64 of up to MaxBatch small bodies
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		http.Error(w, fmt.Sprintf("read the batch (limit %d bytes): %v", limit, err), http.StatusRequestEntityTooLarge)
		return
	}
	var in protocol.BatchRequest
	if err := json.Unmarshal(body, &in); err != nil {
		http.Error(w, "malformed batch: "+err.Error(), http.StatusBadRequest)
		return
	}
	if n := len(in.Requests); n == 0 || n > protocol.MaxBatch {
		http.Error(w, fmt.Sprintf("a batch of %d requests: want 1 to %d", n, protocol.MaxBatch), http.StatusBadRequest)
		return
	}
	out := protocol.BatchAnswer{Answers: make([]protocol.BatchReply, len(in.Requests))}
	// State reports, which are what a relay batches, are checked one by one and queued
	// together (queueReports); any other request is served alone, after the reports before
	// it are queued, so that the batch's order is kept.
	var reps []stateReport
	var at []int // the index of each of reps in the batch
	flush := func() {
		for k, err := range s.queueReports(reps) {
			if err != nil {
				out.Answers[at[k]] = replyError(http.StatusServiceUnavailable, err.Error())
			} else {
				out.Answers[at[k]] = protocol.BatchReply{Status: http.StatusNoContent, Header: http.Header{}}
			}
		}
		reps, at = reps[:0], at[:0]
	}
	now := time.Now()
	for i, it := range in.Requests {
		rep, reply, ok := s.stateItem(r, it, now)
		switch {
		case !ok:
			flush()
			out.Answers[i] = s.serveItem(r, it)
		case reply != nil:
			out.Answers[i] = *reply
		default:
			reps, at = append(reps, rep), append(at, i)
		}
	}
	flush()
	b, err := json.Marshal(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// stateItem checks a batch's request when it is a worker's state report (POST
// /v1/workers/{id}/state) as ServeHTTP and handleState would: its signature, its size, its
// report. It returns the report to queue, or the answer to a report refused; ok is false for
// any other request (serveItem serves it, and answers what stateItem would not decide).
func (s *Server) stateItem(outer *http.Request, it protocol.BatchItem, now time.Time) (rep stateReport, reply *protocol.BatchReply, ok bool) {
	id, ok := stateTarget(it)
	if !ok || int64(len(it.Body)) > s.cfg.MaxBody {
		return stateReport{}, nil, false
	}
	refuse := func(status int, err error) (stateReport, *protocol.BatchReply, bool) {
		a := replyError(status, err.Error())
		return stateReport{}, &a, true
	}
	header := func(name string) string { return it.Header[name] }
	if _, err := s.auth.VerifyFields(it.Method, it.Target, header, now); err != nil {
		s.refused(outer, it.Method, it.Target, err)
		return refuse(http.StatusUnauthorized, err)
	}
	if err := protocol.CheckBodyHash(header(protocol.HeaderBodyHash), it.Body); err != nil {
		s.refused(outer, it.Method, it.Target, err)
		return refuse(http.StatusUnauthorized, err)
	}
	if s.isClosing() {
		return refuse(http.StatusServiceUnavailable, errShuttingDown)
	}
	s.hear(id.Host)
	rep, err := parseState(id, it.Body)
	if err != nil {
		return refuse(http.StatusBadRequest, err)
	}
	return rep, nil, true
}

// stateTarget is the worker of a batch's request that is a state report, with its headers
// named as Go names them (the relay sends them so); ok is false for any other request.
func stateTarget(it protocol.BatchItem) (protocol.WorkerID, bool) {
	rest, ok := strings.CutPrefix(it.Target, "/v1/workers/")
	if !ok || it.Method != http.MethodPost {
		return protocol.WorkerID{}, false
	}
	seg, ok := strings.CutSuffix(rest, "/state")
	if !ok || strings.ContainsAny(seg, "/?#") {
		return protocol.WorkerID{}, false
	}
	for k := range it.Header {
		if k != http.CanonicalHeaderKey(k) {
			return protocol.WorkerID{}, false
		}
	}
	raw, err := url.PathUnescape(seg)
	if err != nil {
		return protocol.WorkerID{}, false
	}
	id, err := protocol.ParseWorkerID(raw)
	return id, err == nil
}

// serveItem serves one request of a batch.
func (s *Server) serveItem(outer *http.Request, it protocol.BatchItem) protocol.BatchReply {
	if it.Method != http.MethodPost {
		return replyError(http.StatusBadRequest, fmt.Sprintf("%s %s in a batch: a batch takes POSTs only", it.Method, it.Target))
	}
	req, err := http.NewRequestWithContext(outer.Context(), it.Method, it.Target, bytes.NewReader(it.Body))
	if err != nil || req.URL.Host != "" || len(it.Target) == 0 || it.Target[0] != '/' || req.URL.Path == protocol.PathBatch {
		return replyError(http.StatusBadRequest, fmt.Sprintf("target %q in a batch: want a path", it.Target))
	}
	req.RequestURI, req.RemoteAddr, req.Host = it.Target, outer.RemoteAddr, outer.Host
	req.Proto, req.ProtoMajor, req.ProtoMinor = outer.Proto, outer.ProtoMajor, outer.ProtoMinor
	for k, v := range it.Header {
		req.Header.Set(k, v)
	}
	req.ContentLength = int64(len(it.Body))
	rec := protocol.NewRecorder()
	s.ServeHTTP(rec, req)
	status, header, body := rec.Result()
	return protocol.BatchReply{Status: status, Header: header, Body: body}
}

func replyError(status int, msg string) protocol.BatchReply {
	return protocol.BatchReply{Status: status, Header: http.Header{"Content-Type": {"text/plain; charset=utf-8"}}, Body: []byte(msg + "\n")}
}
