package protocol

import "strings"

// Environment the driver gives every worker process (docs/protocol.md §3).
const (
	EnvRendezvous  = "ELASTICD_RENDEZVOUS"   // base URL of the driver's rendezvous
	EnvSecret      = "ELASTICD_SECRET"       // per-job secret, hex; never crosses the network
	EnvJobID       = "ELASTICD_JOB_ID"       // for logs
	EnvWorkerID    = "ELASTICD_WORKER_ID"    // stable "<host>/<slot>"
	EnvGeneration  = "ELASTICD_GENERATION"   // the generation the process was launched for
	EnvHostAddr    = "ELASTICD_HOST_ADDR"    // the address peers reach this host at
	EnvCommTimeout = "ELASTICD_COMM_TIMEOUT" // allreduce.Config.Timeout, a Go duration
	// EnvCommTransport is allreduce.Config.Transport: "auto" (shared memory with ranks on the
	// same machine) or "tcp" (TCP with every peer).
	EnvCommTransport = "ELASTICD_COMM_TRANSPORT"
	// EnvCheckpointDir and EnvCheckpointEvery are --checkpoint-dir and --checkpoint-every:
	// rank 0 writes its commit there every N commits, and a rank 0 with no commit of its own
	// (every worker was lost) resumes from the newest valid one.
	EnvCheckpointDir   = "ELASTICD_CHECKPOINT_DIR"
	EnvCheckpointEvery = "ELASTICD_CHECKPOINT_EVERY"
	// DefaultCheckpointEvery is ELASTICD_CHECKPOINT_EVERY (--checkpoint-every) when it is not given.
	DefaultCheckpointEvery = 10
	// EnvDriverWait, set by an agent to its --driver-timeout (a Go duration), is how long a
	// worker keeps asking a driver that does not answer before it gives up: the driver may be
	// restarting, and the agent keeps the worker that long anyway. Unset (the local and ssh
	// launchers, whose workers die with the driver): a few quick retries.
	EnvDriverWait = "ELASTICD_DRIVER_WAIT"
	// EnvLoadEvery is how often a worker tells the driver its mean step time (a Go duration),
	// which only --slot-policy loadaware reads: the driver sets it to "0s", no reports,
	// under any other policy, since 80,000 workers reporting every 5 s are 16,000 requests a
	// second. Unset: the worker's default (worker.DefaultLoadEvery).
	EnvLoadEvery = "ELASTICD_LOAD_EVERY"
)

// EnvValue is name's value in env (KEY=VALUE entries) and whether it is there; the last entry
// wins, as os/exec has it.
func EnvValue(env []string, name string) (string, bool) {
	v, ok := "", false
	for _, kv := range env {
		if rest, found := strings.CutPrefix(kv, name+"="); found {
			v, ok = rest, true
		}
	}
	return v, ok
}
