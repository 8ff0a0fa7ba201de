package bench

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sync"
	"time"
)

// UsageError is bad input: a flag's value (Flag names it) or, with no Flag, an argument.
// elasticd exits 2 on it.
type UsageError struct {
	Flag string
	Msg  string
}

func (e *UsageError) Error() string {
	if e.Flag == "" {
		return e.Msg
	}
	return "--" + e.Flag + ": " + e.Msg
}

func usageError(flag, format string, args ...any) error {
	return &UsageError{Flag: flag, Msg: fmt.Sprintf(format, args...)}
}

// executable is exe, or this process's own binary when exe is "".
func executable(exe string) (string, error) {
	if exe != "" {
		return exe, nil
	}
	return os.Executable()
}

// writers replaces nil writers with io.Discard.
func writers(out, err io.Writer) (io.Writer, io.Writer) {
	if out == nil {
		out = io.Discard
	}
	if err == nil {
		err = io.Discard
	}
	return out, err
}

func fmtSize(b int64) string {
	switch {
	case b >= 1<<30 && b%(1<<30) == 0:
		return fmt.Sprintf("%dGB", b>>30)
	case b >= 1<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%dMB", b>>20)
	case b >= 1<<10 && b%(1<<10) == 0:
		return fmt.Sprintf("%dKB", b>>10)
	}
	return fmt.Sprintf("%dB", b)
}

func fmtDur(s float64) string {
	return time.Duration(math.Round(s * 1e9)).Round(100 * time.Nanosecond).String()
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// percentile is the value below which fraction q of xs lies (nearest rank).
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// lockedWriter lets several child processes' output copiers share one writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// shared makes w safe for the output copiers of several children at once; a file needs no
// copier, exec hands it to the children as it is.
func shared(w io.Writer) io.Writer {
	if _, ok := w.(*os.File); ok {
		return w
	}
	return &lockedWriter{w: w}
}
