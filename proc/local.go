package proc

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// NewLocal returns a Launcher that runs workers on this machine.
//
// Each worker leads its own process group, so Stop reaches everything it started, and terminal
// signals meant for the driver do not reach it. If the driver dies without stopping it (even by
// SIGKILL), the kernel kills the worker (Pdeathsig, Linux) and a guard process kills the rest
// of its group: the guard is a tiny sh that blocks reading a pipe whose only writer is the
// driver, and kills the group when the pipe reports EOF, which the kernel guarantees when the
// driver dies however it dies.
func NewLocal() Launcher { return localLauncher{} }

type localLauncher struct{}

// guardScript is the guard's program, with stdin from the driver and the worker's process group
// as $1. It ignores the signals a terminal or a shutdown would send it, because its job is to
// outlive the driver; it is stopped with SIGKILL when its worker has been reaped.
//
// sh reads it from a pipe on fd 3 rather than from `-c`, so that `ps` shows the guard as
// `elasticd-guard /dev/fd/3 <pgid> <worker>`, plainly not the worker, instead of a line of
// shell that looks like part of the job.
const guardScript = `trap "" HUP INT QUIT TERM; while read -r _; do :; done; kill -s KILL -- -"$1"
`

// guardName is the guard's argv[0], what ps and top show for it.
const guardName = "elasticd-guard"

func (localLauncher) Start(ctx context.Context, s Spec) (Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	if len(s.Command) == 0 {
		return nil, fmt.Errorf("start %s: empty command", s.Name)
	}
	if s.Dir != "" {
		// Checked here because exec reports a missing directory as a missing program.
		if fi, err := os.Stat(s.Dir); err != nil {
			return nil, fmt.Errorf("start %s: working directory: %w", s.Name, err)
		} else if !fi.IsDir() {
			return nil, fmt.Errorf("start %s: working directory %s: not a directory", s.Name, s.Dir)
		}
	}
	cmd := exec.Command(s.Command[0], s.Command[1:]...)
	cmd.Env = append(os.Environ(), s.Env...) // later entries win
	cmd.Dir = s.Dir
	cmd.SysProcAttr = GroupAttr()
	p, err := StartGroup(cmd, s.Stdout, s.Stderr)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	lp := &localProcess{g: p, supervised: make(chan struct{})}

	guard, guardIn, err := startGuard(cmd.Process.Pid, s.Name)
	if err != nil {
		p.Signal(syscall.SIGKILL)
		p.Reap(nil)
		return nil, fmt.Errorf("start %s: guard: %w", s.Name, err)
	}
	go p.Reap(func() {
		guard.Process.Kill()
		guard.Wait()
		guardIn.Close()
	})
	go func() {
		defer close(lp.supervised)
		lp.supervise(ctx)
	}()
	return lp, nil
}

// startGuard starts the guard of process group pgid, which runs the worker called name.
func startGuard(pgid int, name string) (*exec.Cmd, *os.File, error) {
	script, err := scriptPipe(guardScript)
	if err != nil {
		return nil, nil, err
	}
	defer script.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	defer r.Close()
	g := &exec.Cmd{
		Path: "/bin/sh",
		Args: []string{guardName, "/dev/fd/3", strconv.Itoa(pgid), name},
	}
	g.ExtraFiles = []*os.File{script}
	g.Stdin = r
	g.Env = []string{"PATH=/usr/bin:/bin"}
	// Its own group, so that a Ctrl-C meant for the driver does not reach it either; and no
	// Pdeathsig, since it must survive the driver.
	g.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := g.Start(); err != nil {
		w.Close()
		return nil, nil, err
	}
	return g, w, nil
}

// scriptPipe returns the read end of a pipe that holds text and then EOF: small enough for the
// pipe's buffer, so nothing waits on a reader.
func scriptPipe(text string) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	_, err = w.WriteString(text)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

type localProcess struct {
	g        *Group
	termOnce sync.Once
	// supervised is closed when supervise has returned: Wait waits for it (and Reap, through
	// Done), so that no goroutine of the process outlives Wait.
	supervised chan struct{}
}

func (p *localProcess) PID() int { return p.g.PID() }

func (p *localProcess) Wait() (ExitStatus, error) {
	<-p.g.Done()
	<-p.supervised
	if err := p.g.Err(); err != nil {
		return p.g.Status(), fmt.Errorf("wait for pid %d: %w", p.PID(), err)
	}
	return p.g.Status(), nil
}

func (p *localProcess) Stop(grace time.Duration) {
	p.termOnce.Do(func() { p.g.Signal(syscall.SIGTERM) })
	if !p.g.WaitDone(grace) {
		p.g.Signal(syscall.SIGKILL)
		<-p.g.Done()
	}
}

// supervise stops the process when ctx is cancelled; it returns once the process has exited.
func (p *localProcess) supervise(ctx context.Context) {
	select {
	case <-ctx.Done():
		p.Stop(DefaultGrace)
	case <-p.g.Done():
	}
}

// FreePort asks the kernel for a port that is free on this machine, where the local launcher
// starts every worker.
func (localLauncher) FreePort(ctx context.Context, _ string) (int, error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", ":0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
