package bench

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"time"
)

// jobLog holds the patterns the recovery and notice benchmarks read from the log of the
// job they run (elasticd run, its agents and the demo trainer).
type jobLog struct {
	event        *regexp.Regexp // the demo trainer's --events line: step, world, time (ns)
	resume       *regexp.Regexp // a worker resuming: world size, step
	launched     *regexp.Regexp // the driver launching a worker of generation 1: worker, rank, pid
	listening    *regexp.Regexp // the driver's rendezvous address
	rank0Host    *regexp.Regexp // the host of rank 0 in generation 1
	agentNotice  *regexp.Regexp // the driver has an agent's notice
	hostsChanged *regexp.Regexp // the driver sees the hosts change
}

func newJobLog() *jobLog {
	return &jobLog{
		event:        regexp.MustCompile(`event step=(\d+) world=(\d+) gen=\d+ t=(\d+)`),
		resume:       regexp.MustCompile(`world size (\d+), resuming at step (\d+)`),
		launched:     regexp.MustCompile(`launched worker" worker=(\S+) rank=(\d+) generation=1 pid=(\d+)`),
		listening:    regexp.MustCompile(`rendezvous listening" addr=(\S+)`),
		rank0Host:    regexp.MustCompile(`launched worker" worker=(\S+)/\d+ rank=0 generation=1`),
		agentNotice:  regexp.MustCompile(`msg="agent notice"`),
		hostsChanged: regexp.MustCompile(`msg="hosts changed`),
	}
}

// demoTrainer is trainer, or the demo trainer beside self (make build puts it there).
func demoTrainer(trainer, self string) (string, error) {
	if trainer == "" {
		trainer = filepath.Join(filepath.Dir(self), "train")
	}
	if st, err := os.Stat(trainer); err != nil || st.IsDir() {
		return "", usageError("trainer", "%q not found: run make build, or give the demo trainer's path", trainer)
	}
	return trainer, nil
}

// startChild starts this binary (self) with args, its stdout and stderr together on the
// returned reader, which ends once the process has exited; wg waits for that. The end of ctx
// sends it SIGTERM, and SIGKILL 10 s later.
func startChild(ctx context.Context, wg *sync.WaitGroup, self string, args ...string) (*exec.Cmd, io.Reader, error) {
	return startChildEnv(ctx, wg, nil, self, args...)
}

// startChildEnv is startChild with env added to this process's environment.
func startChildEnv(ctx context.Context, wg *sync.WaitGroup, env []string, self string, args ...string) (*exec.Cmd, io.Reader, error) {
	cmd := exec.CommandContext(ctx, self, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = childProcAttr()
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	wg.Go(func() { cmd.Wait(); pw.Close() })
	return cmd, pr, nil
}
