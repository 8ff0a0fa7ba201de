package proc

import (
	"bytes"
	"errors"
	"io"
	"sync"
)

// MaxLine bounds the partial line a PrefixWriter holds: a worker that never writes a newline
// (a progress bar redrawn with \r) gets its output cut into lines of this size instead.
const MaxLine = 64 << 10

// PrefixWriter writes each complete line to w with a prefix ("[3] "), holding a partial line
// until its newline arrives or Flush or Close is called. It is safe for concurrent use. Each
// write to w is of whole lines, so PrefixWriters that share one w never interleave inside a
// line as long as w serialises its writes: share a *LockedWriter (NewLockedWriter).
type PrefixWriter struct {
	w      io.Writer
	prefix func() string

	mu     sync.Mutex
	line   []byte // partial line
	closed bool
}

// NewPrefixWriter returns a PrefixWriter that writes to w.
func NewPrefixWriter(w io.Writer, prefix string) *PrefixWriter {
	return NewPrefixWriterFunc(w, func() string { return prefix })
}

// NewPrefixWriterFunc returns a PrefixWriter whose prefix is prefix() at the time each line is
// written (a worker's rank changes when the job resets). prefix must not call the PrefixWriter.
func NewPrefixWriterFunc(w io.Writer, prefix func() string) *PrefixWriter {
	return &PrefixWriter{w: w, prefix: prefix}
}

var errClosed = errors.New("launch: write to a closed PrefixWriter")

func (p *PrefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, errClosed
	}
	n := len(b)
	var out []byte
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			p.line = append(p.line, b...)
			if len(p.line) >= MaxLine {
				out = p.appendLine(out, p.line)
				p.line = p.line[:0]
			}
			break
		}
		if len(p.line) > 0 {
			p.line = append(p.line, b[:i]...)
			out = p.appendLine(out, p.line)
			p.line = p.line[:0]
		} else {
			out = p.appendLine(out, b[:i])
		}
		b = b[i+1:]
	}
	return n, p.emit(out)
}

// Flush writes the partial line, if any, as a line of its own.
func (p *PrefixWriter) Flush() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.flush()
}

// Close flushes the partial line; later writes fail.
func (p *PrefixWriter) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	return p.flush()
}

func (p *PrefixWriter) flush() error {
	if len(p.line) == 0 {
		return nil
	}
	out := p.appendLine(nil, p.line)
	p.line = p.line[:0]
	return p.emit(out)
}

func (p *PrefixWriter) appendLine(out, line []byte) []byte {
	out = append(out, p.prefix()...)
	out = append(out, line...)
	return append(out, '\n')
}

func (p *PrefixWriter) emit(out []byte) error {
	if len(out) == 0 {
		return nil
	}
	_, err := p.w.Write(out)
	return err
}
