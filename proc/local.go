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

// guardScript runs as `sh -c guardScript elasticd-guard <pgid>` with stdin from the driver. It
// ignores the signals a terminal or a shutdown would send it, because its job is to outlive
// the driver; it is stopped with SIGKILL when its worker has been reaped.
const guardScript = `trap "" HUP INT QUIT TERM; while read -r _; do :; done; kill -s KILL -- -"$1"`

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

	guard, guardIn, err := startGuard(cmd.Process.Pid)
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

func startGuard(pgid int) (*exec.Cmd, *os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	defer r.Close()
	g := exec.Command("/bin/sh", "-c", guardScript, "elasticd-guard", strconv.Itoa(pgid))
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
