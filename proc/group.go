package proc

import (
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// drainTimeout bounds how long output is still read after a process group is gone: only a
// process that left the group (setsid) can hold the pipes open that long, and it must not make
// Wait hang.
const drainTimeout = 2 * time.Second

// Group is a local child process that leads its own process group, with its stdout and stderr
// copied to writers. The launchers build on it: the local one (and so the agent) runs the
// worker as a Group, the ssh one the ssh client.
type Group struct {
	cmd     *exec.Cmd
	outputs []*os.File  // read ends of the output pipes
	sinks   []io.Writer // where each output goes

	mu     sync.Mutex
	reaped bool // set, under mu, before the leader is reaped: its PID may then be reused

	copiers sync.WaitGroup
	done    chan struct{} // closed when state is set and the output is flushed
	state   *os.ProcessState
	err     error
}

// StartGroup starts cmd in a new process group (its SysProcAttr must ask for one, see
// GroupAttr) with stdout and stderr copied to the given writers (nil discards). The caller must
// then call Reap, once.
func StartGroup(cmd *exec.Cmd, stdout, stderr io.Writer) (*Group, error) {
	if SameWriter(stdout, stderr) {
		w := NewLockedWriter(stdout)
		stdout, stderr = w, w
	}
	p := &Group{cmd: cmd, done: make(chan struct{})}
	var childEnds []*os.File
	pipeTo := func(w io.Writer) (*os.File, error) {
		if w == nil {
			return nil, nil
		}
		r, cw, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		p.outputs = append(p.outputs, r)
		p.sinks = append(p.sinks, w)
		childEnds = append(childEnds, cw)
		return cw, nil
	}
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	out, err := pipeTo(stdout)
	if err == nil {
		var errOut *os.File
		errOut, err = pipeTo(stderr)
		// Assigned only when non-nil: a nil *os.File in the interface would not read as nil.
		if out != nil {
			cmd.Stdout = out
		}
		if errOut != nil {
			cmd.Stderr = errOut
		}
	}
	if err == nil {
		err = cmd.Start()
	}
	closeAll(childEnds)
	if err != nil {
		closeAll(p.outputs)
		return nil, err
	}
	for i, r := range p.outputs {
		p.copiers.Add(1)
		go func() {
			defer p.copiers.Done()
			// A writer that fails must not stall the worker on a full pipe: keep reading.
			io.Copy(&tolerantWriter{w: p.sinks[i]}, r)
		}()
	}
	return p, nil
}

// PID is the leader's process ID, which is also the group's.
func (p *Group) PID() int { return p.cmd.Process.Pid }

// Done is closed once Reap has reaped the leader and flushed the output.
func (p *Group) Done() <-chan struct{} { return p.done }

// Err is the error of waiting for the leader, once Done is closed.
func (p *Group) Err() error { return p.err }

// Signal sends sig to the process group, unless the leader has already been reaped.
func (p *Group) Signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.reaped {
		syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// Reap waits for the leader and reaps it, then runs afterReap (if any), then waits for the
// output and flushes it, and closes Done. Whatever the leader left running in its group is killed when the leader
// exits: with the leader gone it would be an orphan.
func (p *Group) Reap(afterReap func()) {
	pid := p.cmd.Process.Pid
	killLeftovers := func() {
		p.mu.Lock()
		syscall.Kill(-pid, syscall.SIGKILL)
		p.reaped = true
		p.mu.Unlock()
	}
	if waitExited(pid) {
		// The leader is a zombie until reaped, so the group's ID cannot have been reused.
		killLeftovers()
		p.state, p.err = p.cmd.Process.Wait()
	} else {
		p.state, p.err = p.cmd.Process.Wait()
		killLeftovers()
	}
	if afterReap != nil {
		afterReap()
	}

	copied := make(chan struct{})
	go func() {
		p.copiers.Wait()
		close(copied)
	}()
	select {
	case <-copied:
	case <-time.After(drainTimeout):
		for _, r := range p.outputs {
			r.Close() // unblocks the copiers' reads
		}
		<-copied
	}
	for _, r := range p.outputs {
		r.Close()
	}
	for _, w := range p.sinks {
		if f, ok := w.(interface{ Flush() error }); ok {
			f.Flush()
		}
	}
	close(p.done)
}

// WaitDone reports whether the process is done within d (d <= 0: now).
func (p *Group) WaitDone(d time.Duration) bool {
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-p.done:
			return true
		case <-t.C:
			return false
		}
	}
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Status is the exit status of a reaped process.
func (p *Group) Status() ExitStatus {
	if p.state == nil {
		return ExitStatus{Code: -1}
	}
	if ws, ok := p.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		name := unix.SignalName(ws.Signal())
		if name == "" {
			name = ws.Signal().String()
		}
		return ExitStatus{Code: -1, Signal: name}
	}
	return ExitStatus{Code: p.state.ExitCode()}
}

// SameWriter reports whether a and b are the same non-nil writer. Writers of uncomparable
// types are never the same.
func SameWriter(a, b io.Writer) (same bool) {
	defer func() { _ = recover() }()
	return a != nil && a == b
}

// NewLockedWriter returns a writer that serialises writes (and Flush) to w.
func NewLockedWriter(w io.Writer) *LockedWriter { return &LockedWriter{w: w} }

// LockedWriter serialises the stdout and stderr copiers when both write to one writer.
type LockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *LockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func (l *LockedWriter) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if f, ok := l.w.(interface{ Flush() error }); ok {
		return f.Flush()
	}
	return nil
}

// tolerantWriter forwards to w until w fails, then discards, always reporting success.
type tolerantWriter struct {
	w      io.Writer
	failed bool
}

func (t *tolerantWriter) Write(b []byte) (int, error) {
	if !t.failed {
		if _, err := t.w.Write(b); err != nil {
			t.failed = true
		}
	}
	return len(b), nil
}
