package rendezvous

import (
	"time"

	"github.com/elasticd/elasticd/protocol"
)

// Event is one report from a worker, delivered to the driver in arrival order.
type Event struct {
	Worker     protocol.WorkerID
	Generation uint64
	State      protocol.State
	Message    string
	At         time.Time // when the server received it
	// Rollback is what the worker threw away since its last commit before this READY (a
	// failure's restore); zero otherwise.
	Rollback protocol.Rollback
	// SilentPeer, with READY: the worker left its generation because a collective timed out
	// on a peer that stopped answering (hung or stopped), not because one was lost.
	SilentPeer bool
	// Unreachable and Reached, with READY: ranks of the generation whose hosts did not
	// answer the worker's probe, and those that did (or that it was connected to).
	Unreachable, Reached []int
}

// Progress is how far training has got, as rank 0 of the newest generation last reported:
// Step counts the training steps of the job (State.Step calls, carried across resets and
// rolled back with the state), Committed is the step of the last commit.
type Progress struct {
	Generation     uint64
	Step           uint64
	Committed      uint64
	At             time.Time // when the server received it; zero before the first report
	StepsPerSecond float64   // over the reports of the last ProgressWindow, 0 when unknown
	// Loss is the training loss of the newest report that had one; nil before any. It is
	// never written through: a new loss gets a new pointer.
	Loss *float64
	// TotalSteps is the job's steps in all, from the newest report that gave it; 0: unknown.
	TotalSteps uint64
}

// ProgressWindow is how far back the step rate looks.
const ProgressWindow = 10 * time.Second
