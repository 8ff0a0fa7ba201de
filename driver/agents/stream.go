// The session stream's driver side (docs/protocol.md §4.6): an agent's requests, and its
// workers' that its relay carries, arrive as frames on one connection and are served by the
// driver's own handler, each as if it had come alone; their answers go back on the stream.

package agents

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/elasticd/elasticd/protocol"
)

const (
	// streamIdle is how long a stream may stay silent before the driver takes it as dead:
	// the agent pings every streamPing when it has nothing else to send.
	streamIdle = 45 * time.Second
	// streamWriteTimeout bounds one frame's write: an agent that stopped reading is dropped
	// rather than allowed to hold up the answers.
	streamWriteTimeout = 10 * time.Second
	// maxStreamRequests is how many of its requests one stream may have under way at once:
	// the agent's two long-polls and events, and its workers' relayed requests (a few each
	// while a generation forms), as many as an HTTP/2 connection to the driver may carry.
	// More are answered 503 at once.
	maxStreamRequests = 1000
	// streamReadBuffer is the size of a stream's read buffer.
	streamReadBuffer = 1024
	// streamCloseGrace is how long Close waits for the answers under way on the streams.
	streamCloseGrace = 2 * time.Second
)

// SetHandler gives the registry the handler that serves the requests arriving on session
// streams: the driver's whole API, as its listener serves it. Until it is set a stream is
// refused with 404, and the agent speaks HTTP/2 instead.
func (r *Registry) SetHandler(h http.Handler) {
	r.mu.Lock()
	r.handler = h
	r.mu.Unlock()
}

// Streams is how many session streams are open now.
func (r *Registry) Streams() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.streams)
}

// stream is one agent's session stream.
type stream struct {
	r       *Registry
	conn    net.Conn
	br      *bufio.Reader
	handler http.Handler
	remote  string
	host    string
	ctx     context.Context
	cancel  context.CancelFunc

	wmu sync.Mutex // one frame written at a time

	mu       sync.Mutex
	inflight map[uint64]func() // requests under way, by ID: what calls each off
	closing  bool              // closeStreams waits for served: no more start
	served   sync.WaitGroup
}

// openStream answers GET protocol.AgentPathStream, whose signature ServeHTTP checked: it
// takes the connection over and serves its frames until it closes.
func (r *Registry) openStream(a protocol.Answer, w http.ResponseWriter, req *http.Request) {
	if !strings.EqualFold(req.Header.Get("Upgrade"), protocol.StreamUpgrade) {
		a.Error(http.StatusBadRequest, "a session stream is asked for with Upgrade: "+protocol.StreamUpgrade)
		return
	}
	r.mu.Lock()
	h := r.handler
	r.mu.Unlock()
	if h == nil {
		a.Error(http.StatusNotFound, "this driver serves no session streams: use HTTP/2")
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil { // HTTP/2: the stream takes an HTTP/1.1 connection of its own
		a.Error(http.StatusBadRequest, "a session stream needs an HTTP/1.1 connection: "+err.Error())
		return
	}
	br := brw.Reader
	if br.Buffered() == 0 { // as it should be: the agent waits for the 101
		// A small buffer: most frames are a few hundred bytes, a larger one is read past it,
		// and a driver holds one per host.
		br = bufio.NewReaderSize(conn, streamReadBuffer)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st := &stream{r: r, conn: conn, br: br, handler: h, remote: req.RemoteAddr, host: req.Host,
		ctx: ctx, cancel: cancel, inflight: map[uint64]func(){}}
	r.mu.Lock()
	if r.isClosing() {
		r.mu.Unlock()
		conn.Close()
		cancel()
		return
	}
	if r.streams == nil {
		r.streams = map[*stream]struct{}{}
	}
	r.streams[st] = struct{}{}
	r.mu.Unlock()
	conn.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	if _, err := conn.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + protocol.StreamUpgrade + "\r\n\r\n")); err != nil {
		st.close()
		return
	}
	go st.serve()
}

// serve reads the stream's frames until it closes or goes silent for streamIdle.
func (st *stream) serve() {
	defer st.close()
	for {
		st.conn.SetReadDeadline(time.Now().Add(streamIdle))
		f, err := protocol.ReadFrame(st.br, protocol.MaxStreamFrame)
		if err != nil {
			return
		}
		switch f.Kind {
		case protocol.FramePing:
			if st.write(protocol.Frame{Kind: protocol.FramePing, ID: f.ID}) != nil {
				return
			}
		case protocol.FrameCancel:
			st.mu.Lock()
			callOff := st.inflight[f.ID]
			st.mu.Unlock()
			if callOff != nil {
				callOff()
			}
		case protocol.FrameRequest:
			st.start(f)
		}
	}
}

// start serves request frame f: an agent's commands poll or watch is held without a
// goroutine (Registry.poll); any other request is served in a goroutine of its own.
func (st *stream) start(f protocol.Frame) {
	st.mu.Lock()
	_, dup := st.inflight[f.ID]
	busy := len(st.inflight) >= maxStreamRequests || st.closing
	if dup || busy {
		st.mu.Unlock()
		msg := fmt.Sprintf("more than %d requests under way on one session stream; retry", maxStreamRequests)
		if st.closing {
			msg = "driver shutting down"
		}
		if dup {
			msg = fmt.Sprintf("request %d is already under way on this stream", f.ID)
		}
		st.answer(f.ID, http.StatusServiceUnavailable, http.Header{"Content-Type": {"text/plain; charset=utf-8"}}, []byte(msg+"\n"))
		return
	}
	st.served.Add(1)
	if kind, session, ok := pollTarget(f); ok {
		st.inflight[f.ID] = func() {} // until the poll is held: it is served here, before the next frame
		st.mu.Unlock()
		st.r.poll(st, f, kind, session)
		return
	}
	ctx, cancel := context.WithCancel(st.ctx)
	st.inflight[f.ID] = cancel
	st.mu.Unlock()
	go func() {
		status, header, body := st.serveRequest(ctx, f)
		called := ctx.Err() != nil
		cancel()
		if !called { // a request called off is not answered: nobody waits for it
			st.answer(f.ID, status, header, body)
		}
		st.finish(f.ID)
	}()
}

// hold sets what calls off request id, held (a poll): false when it was called off already.
func (st *stream) hold(id uint64, callOff func()) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, ok := st.inflight[id]; !ok {
		return false
	}
	st.inflight[id] = callOff
	return true
}

// finish marks request id done: answered, or called off.
func (st *stream) finish(id uint64) {
	st.mu.Lock()
	_, ok := st.inflight[id]
	delete(st.inflight, id)
	st.mu.Unlock()
	if ok {
		st.served.Done()
	}
}

// serveRequest serves one request of the stream with the driver's handler.
func (st *stream) serveRequest(ctx context.Context, f protocol.Frame) (int, http.Header, []byte) {
	h := f.Head
	req, err := http.NewRequestWithContext(ctx, h.Method, h.Target, bytes.NewReader(f.Body))
	if err != nil || req.URL.Host != "" || !strings.HasPrefix(h.Target, "/v1/") || req.URL.Path == protocol.AgentPathStream || strings.HasPrefix(req.URL.Path, "/v1/admin/") {
		// What an agent and its workers ask for, no more: not the operator's admin API.
		return http.StatusBadRequest, http.Header{"Content-Type": {"text/plain; charset=utf-8"}}, []byte(fmt.Sprintf("target %q on a session stream: want a path of the agents' or the workers' protocol\n", h.Target))
	}
	req.RequestURI, req.RemoteAddr, req.Host = h.Target, st.remote, st.host
	req.Proto, req.ProtoMajor, req.ProtoMinor = "HTTP/1.1", 1, 1
	for k, vs := range h.Header {
		req.Header[http.CanonicalHeaderKey(k)] = vs
	}
	req.ContentLength = int64(len(f.Body))
	rec := protocol.NewRecorder()
	st.handler.ServeHTTP(rec, req)
	return rec.Result()
}

// answer writes the answer to request id; a failed write ends the stream.
func (st *stream) answer(id uint64, status int, header http.Header, body []byte) {
	if st.write(protocol.Frame{Kind: protocol.FrameAnswer, ID: id, Head: protocol.StreamHead{Status: status, Header: header}, Body: body}) != nil {
		st.conn.Close() // serve sees it and ends the stream
	}
}

// write sends one frame, whole, in one write.
func (st *stream) write(f protocol.Frame) error {
	st.wmu.Lock()
	defer st.wmu.Unlock()
	st.conn.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	return protocol.WriteFrame(st.conn, f)
}

// close ends the stream: its requests under way are called off (a commands poll ended so
// counts as the agent's connection dropped, as on HTTP/2) and the connection is closed.
func (st *stream) close() {
	st.cancel()
	st.conn.Close()
	st.mu.Lock()
	held := make([]func(), 0, len(st.inflight))
	for _, callOff := range st.inflight {
		held = append(held, callOff)
	}
	st.mu.Unlock()
	for _, callOff := range held { // the held polls; the others end with st.ctx
		callOff()
	}
	st.r.mu.Lock()
	delete(st.r.streams, st)
	st.r.mu.Unlock()
}

// closeStreams closes every stream once its answers under way are written, or after
// streamCloseGrace: Close answers the held polls before it comes here.
func (r *Registry) closeStreams() {
	r.mu.Lock()
	sts := make([]*stream, 0, len(r.streams))
	for st := range r.streams {
		sts = append(sts, st)
	}
	r.mu.Unlock()
	deadline := time.Now().Add(streamCloseGrace)
	for _, st := range sts {
		st.mu.Lock()
		st.closing = true // from here on no request starts: served's count only falls
		st.mu.Unlock()
		done := make(chan struct{})
		go func() {
			st.served.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(time.Until(deadline)):
		}
		st.close()
	}
}
