// Package proc is process handling shared by the driver's launchers (driver/launch) and the
// per-host agent (worker/agent): what a worker process is (Spec, Process, ExitStatus, the
// Launcher interface), the local launcher that starts one in its own process group with a guard
// that kills the group if the starter dies however it dies (NewLocal), the Group every launcher
// builds on, and PrefixWriter, which prefixes a worker's output lines.
package proc

import (
	"context"
	"fmt"
	"io"
	"time"
)

// DefaultGrace is the time between SIGTERM and SIGKILL when a worker is stopped because the
// context passed to Start was cancelled (Horovod's safe_shell_exec waits as long).
const DefaultGrace = 5 * time.Second

// Spec describes one worker process.
type Spec struct {
	Name string // for errors and logs, e.g. "rank 3 (local-2/0)"
	Host string // address to run on; used by the ssh and agent launchers, ignored by the local one
	// Slot is the worker's slot on its host; the agent launcher gives slot s the GPU s (modulo
	// the host's GPU count), at position LOCAL_RANK of CUDA_VISIBLE_DEVICES.
	Slot    int
	Command []string // argv; Command[0] is looked up in PATH (local) / the remote PATH (ssh)
	// Env is added to the worker's environment as KEY=VALUE. It carries the job secret, so it
	// never appears in any argv, locally or remotely.
	Env []string
	// Dir is the working directory; "" means the driver's current directory, for ssh too
	// (the same path on the remote host, as Horovod does). A directory that does not exist
	// there makes Start fail.
	Dir string
	// Stdout and Stderr receive the worker's output (nil discards it); its stdin is /dev/null.
	// Once the output has ended, a writer with a Flush() error method (PrefixWriter,
	// bufio.Writer) is flushed, so the last line arrives even without a trailing newline.
	// They may be the same writer. A writer that fails is given no more output.
	Stdout, Stderr io.Writer
}

// Launcher starts workers. The process lives until it exits or is stopped; cancelling ctx stops
// it as Stop(DefaultGrace) would.
type Launcher interface {
	Start(ctx context.Context, s Spec) (Process, error)
}

// Process is a started worker.
type Process interface {
	// PID is the local process: the worker itself, or the ssh client.
	PID() int
	// Wait blocks until the worker has exited and its output is flushed. It may be called from
	// several goroutines; all get the same result. The error is non-nil when the worker's exit
	// status could not be learned (for ssh: the connection was lost); ExitStatus then
	// describes the local process.
	Wait() (ExitStatus, error)
	// Stop sends SIGTERM to the worker's whole process group, SIGKILL after grace, and returns
	// once the worker has exited. It is idempotent and safe to call concurrently with Wait and
	// with itself: SIGTERM is sent once, and each call escalates after its own grace.
	Stop(grace time.Duration)
}

// ExitNotifier is a Process that can say when it has exited without a goroutine blocked in
// its Wait: OnExit runs f once, in a goroutine of its own, after the process has exited (at
// once if it has). The agent launcher's processes, entries in the driver's registry of which
// a job of thousands of hosts holds tens of thousands, implement it, so that a driver
// watching them holds no goroutine per worker.
type ExitNotifier interface {
	OnExit(f func())
}

// ExitStatus is how a worker ended.
type ExitStatus struct {
	Code   int    // exit code; -1 when killed by a signal
	Signal string // "SIGKILL" etc. when killed by a signal, else ""
}

// Success reports whether the worker exited with code 0.
func (e ExitStatus) Success() bool { return e.Code == 0 && e.Signal == "" }

func (e ExitStatus) String() string {
	if e.Signal != "" {
		return "killed by " + e.Signal
	}
	return fmt.Sprintf("exit %d", e.Code)
}

// PortFinder is a Launcher that can find a TCP port free on a host it launches on: the
// MASTER_PORT where a torchrun-style rank 0 opens its store. The port is chosen on that host
// for each generation, so two jobs sharing a machine never meet, and a port that an earlier
// generation's store left in TIME_WAIT is not reused.
type PortFinder interface {
	FreePort(ctx context.Context, host string) (int, error)
}
