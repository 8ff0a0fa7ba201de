// The agent's session stream: one connection per host that carries the agent's requests and
// its workers' (relayed), each answered on it, in place of an HTTP/2 connection
// (docs/protocol.md §4.6). A driver of thousands of hosts then holds, per host, one
// connection and its reader rather than HTTP/2's buffers, header tables and a goroutine per
// request.

package protocol

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

const (
	// AgentPathStream is where an agent asks (GET, signed, with Upgrade: StreamUpgrade over
	// HTTP/1.1) for its session stream; the driver answers 101 and the connection carries
	// frames from then on.
	AgentPathStream = AgentPathPrefix + "stream"
	// StreamUpgrade is the Upgrade token of the session stream.
	StreamUpgrade = "elasticd-session/1"
	// MaxStreamFrame is the largest frame either side reads.
	MaxStreamFrame = 64 << 20
)

// Stream frame kinds.
const (
	// FrameRequest carries a request: its head (method, target, header) and body.
	FrameRequest byte = 1
	// FrameAnswer answers the request of the same ID: status, header and body.
	FrameAnswer byte = 2
	// FrameCancel: the agent no longer waits for the request of that ID (a long-poll it
	// called off); the driver ends it and need not answer.
	FrameCancel byte = 3
	// FramePing is sent by the agent when it has sent nothing for a while; the driver answers
	// with a ping. Either side takes a stream it heard nothing on for long as dead.
	FramePing byte = 4
)

// StreamHead is the head of a request or answer frame.
type StreamHead struct {
	Method string      `json:"method,omitempty"`
	Target string      `json:"target,omitempty"` // path and query, escaped as sent
	Status int         `json:"status,omitempty"`
	Header http.Header `json:"header,omitempty"`
}

// Frame is one frame of a session stream.
type Frame struct {
	Kind byte
	ID   uint64
	Head StreamHead // requests and answers only
	Body []byte
}

// frameFixed is the fixed part after the length: kind, ID and the head's length.
const frameFixed = 1 + 8 + 4

// AppendFrame appends f's encoding to b: a 4-byte big-endian length of what follows, the
// kind, an 8-byte ID, a 4-byte length of the head, the head as JSON (requests and answers
// only), and the body.
func AppendFrame(b []byte, f Frame) ([]byte, error) {
	var head []byte
	if f.Kind == FrameRequest || f.Kind == FrameAnswer {
		var err error
		if head, err = json.Marshal(f.Head); err != nil {
			return b, err
		}
	}
	n := frameFixed + len(head) + len(f.Body)
	if n > MaxStreamFrame {
		return b, fmt.Errorf("a stream frame of %d bytes: the most is %d", n, MaxStreamFrame)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	b = append(b, f.Kind)
	b = binary.BigEndian.AppendUint64(b, f.ID)
	b = binary.BigEndian.AppendUint32(b, uint32(len(head)))
	b = append(b, head...)
	return append(b, f.Body...), nil
}

// frameBufs are the buffers WriteFrame encodes frames in: shared by every stream, so that a
// driver of thousands of streams keeps none per stream between frames.
var frameBufs = sync.Pool{New: func() any { return new([]byte) }}

// WriteFrame writes f to w in one Write. The caller writes one frame at a time per stream.
func WriteFrame(w io.Writer, f Frame) error {
	bp := frameBufs.Get().(*[]byte)
	b, err := AppendFrame((*bp)[:0], f)
	if err == nil {
		_, err = w.Write(b)
	}
	if cap(b) <= 64<<10 { // not the rare large frame's buffer
		*bp = b
		frameBufs.Put(bp)
	}
	return err
}

// ErrFrameTooLarge is a frame longer than the reader takes.
var ErrFrameTooLarge = errors.New("stream frame too large")

// ReadFrame reads one frame of at most limit bytes (after its length) from r.
func ReadFrame(r io.Reader, limit int) (Frame, error) {
	var n4 [4]byte
	if _, err := io.ReadFull(r, n4[:]); err != nil {
		return Frame{}, err
	}
	n := int(binary.BigEndian.Uint32(n4[:]))
	switch {
	case n > limit:
		return Frame{}, fmt.Errorf("%w: %d bytes, the most is %d", ErrFrameTooLarge, n, limit)
	case n < frameFixed:
		return Frame{}, fmt.Errorf("malformed stream frame: %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return Frame{}, unexpected(err)
	}
	f := Frame{Kind: b[0], ID: binary.BigEndian.Uint64(b[1:9])}
	hl := int(binary.BigEndian.Uint32(b[9:13]))
	if hl > n-frameFixed {
		return Frame{}, fmt.Errorf("malformed stream frame: a head of %d bytes in a frame of %d", hl, n)
	}
	if hl > 0 && (f.Kind == FrameRequest || f.Kind == FrameAnswer) { // others have none to read
		if err := json.Unmarshal(b[frameFixed:frameFixed+hl], &f.Head); err != nil {
			return Frame{}, fmt.Errorf("malformed stream frame head: %w", err)
		}
	}
	if rest := b[frameFixed+hl:]; len(rest) > 0 {
		f.Body = rest
	}
	return f, nil
}

// unexpected turns an EOF inside a frame into io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// Recorder is the http.ResponseWriter of a request served away from its connection (inside
// a batch, or from a session stream): it keeps the status, header and body to send back.
type Recorder struct {
	header http.Header
	status int
	body   []byte
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder { return &Recorder{header: http.Header{}} }

func (r *Recorder) Header() http.Header { return r.header }

func (r *Recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *Recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	r.body = append(r.body, b...)
	return len(b), nil
}

// Result is what was written: the status (200 when only a body was), the header and body.
func (r *Recorder) Result() (int, http.Header, []byte) {
	return cmp.Or(r.status, http.StatusOK), r.header, r.body
}
