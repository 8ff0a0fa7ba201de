package rendezvous

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

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
	for i, it := range in.Requests {
		out.Answers[i] = s.serveItem(r, it)
	}
	b, err := json.Marshal(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
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
	rec := &recorder{header: http.Header{}}
	s.ServeHTTP(rec, req)
	return protocol.BatchReply{Status: cmp.Or(rec.status, http.StatusOK), Header: rec.header, Body: rec.body.Bytes()}
}

func replyError(status int, msg string) protocol.BatchReply {
	return protocol.BatchReply{Status: status, Header: http.Header{"Content-Type": {"text/plain; charset=utf-8"}}, Body: []byte(msg + "\n")}
}

// recorder is the http.ResponseWriter of a request served inside a batch.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(b)
}
