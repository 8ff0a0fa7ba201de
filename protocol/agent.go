package protocol

import (
	"crypto/hmac"
	"crypto/sha256"
	"time"
)

// The agents' protocol (docs/protocol.md §4): `elasticd agent` on each GPU host dials the
// driver, registers, long-polls for commands and posts events. Wire names:
const (
	// AgentAuthLabel keys the agents' protocol; see NewAuth.
	AgentAuthLabel = "elasticd agent v1"

	AgentPathRegister = "/v1/agents/register"
	// AgentPathPrefix is where the agents' endpoints live on the driver's listener:
	// POST /v1/agents/register, GET /v1/agents/{session}/commands?after=N&wait_ms=M,
	// POST /v1/agents/{session}/events,
	// GET /v1/agents/{session}/watch?generation=G&hosts_version=V&worker=ID...&wait_ms=M.
	AgentPathPrefix = "/v1/agents/"
	// AgentPathCheck is GET AgentPathCheck?host=NAME, signed: an agent checking its setup
	// (`elasticd agent --check`) asks whether the driver accepts its secret, without
	// registering (no session, no host offered to the job). The signed 200 answer is an
	// AgentCheckAnswer; a driver of an older release answers a signed 404, which proves the
	// secret as well. host, optional, names the asking host in the driver's log.
	AgentPathCheck = AgentPathPrefix + "check"
	// HeaderAgentsProtocol, on every answer of the agents' endpoints, refusals included, is
	// the protocol version the driver speaks. A 401 without it comes from a driver that does
	// not serve the agents' protocol (no --launcher agent), or from an older release.
	HeaderAgentsProtocol = "X-Elasticd-Agents-Protocol"
)

// AgentProtocolVersion is the version of the agents' protocol (docs/protocol.md §4) this
// driver and its agents speak; an agent sends it with its registration, and the driver, which
// says its own on every answer (HeaderAgentsProtocol), refuses another. Version 2 carries a
// session over one HTTP/2 connection and adds the watch through which an agent's relay
// answers its workers' long-polls; version 1 agents (whose workers each held their own
// connections to the driver) are refused. The rendezvous protocol's version
// (ProtocolVersion) is apart: workers speak it unchanged, to the driver or to their agent.
const AgentProtocolVersion = 2

// MaxWatchedWorkers bounds the workers one watch asks about: an agent runs at most one
// worker per slot, and a host has at most 4096 slots.
const MaxWatchedWorkers = 4096

// AgentWatchAnswer is the 200 answer to a watch: the current generation and host-update
// version, and each worker asked about's assignment in that generation (Removed when it has
// no place in it), in the order asked. Generation 0: none published yet.
type AgentWatchAnswer struct {
	Generation   uint64            `json:"generation"`
	HostsVersion uint64            `json:"hosts_version"`
	Assignments  []WorkerPlacement `json:"assignments"`
}

// WorkerPlacement is one worker's assignment in a watch answer.
type WorkerPlacement struct {
	Worker     string     `json:"worker"`
	Assignment Assignment `json:"assignment"`
}

// AgentCheckAnswer is the body of the 200 answer to GET AgentPathCheck.
type AgentCheckAnswer struct {
	Protocol int    `json:"protocol"`
	Version  string `json:"version,omitempty"`
	JobID    string `json:"job_id"`
	// Time is the driver's clock as it answered: signatures allow DefaultReplayWindow
	// between the agent's clock and the driver's.
	Time time.Time `json:"time"`
}

// Command operations.
const (
	OpStart          = "start"           // start a worker process
	OpStop           = "stop"            // SIGTERM a worker, SIGKILL after GraceMS
	OpCompleteNotice = "complete-notice" // the host's workers are gone: answer the notice (Azure: StartRequests)
	OpFindPort       = "find-port"       // find a TCP port free on the host (a MASTER_PORT); answered by a KindPort event with the same Proc
)

// Event kinds.
const (
	KindStarted = "started" // a process started (PID)
	KindExited  = "exited"  // a process ended (Code, Signal; Error when it could not start or be waited for)
	KindOutput  = "output"  // a piece of a process's stdout or stderr (Stream, Data)
	KindNotice  = "notice"  // the cloud will take this host (Notice)
	KindGPU     = "gpu"     // a GPU is unfit to train on (GPU)
	KindLoad    = "load"    // the host's mean GPU busy fraction (GPUBusy), for --slot-policy loadaware
	KindPort    = "port"    // the answer to OpFindPort (Proc): Port, or Error
)

// AgentGPU is one device of an agent's host.
type AgentGPU struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Model       string `json:"model"`
	MemoryBytes uint64 `json:"memory_bytes"`
}

// AgentRegisterRequest is the body of POST /v1/agents/register.
type AgentRegisterRequest struct {
	// Protocol is the AgentProtocolVersion the agent speaks; the driver refuses another
	// (0: 1).
	Protocol int `json:"protocol,omitempty"`
	// AgentID is random per agent process: a new one means the agent restarted, and its
	// earlier session's processes are gone.
	AgentID string `json:"agent_id"`
	// HostID is the host's ID as the cloud knows it (an instance ID), or its hostname.
	HostID string `json:"host_id"`
	// Addr is where workers on this host listen and peers connect.
	Addr string `json:"addr"`
	// Slots overrides the slot count (--slots); 0: one per GPU, or the provider's count when
	// the host has no GPU.
	Slots    int        `json:"slots,omitempty"`
	GPUs     []AgentGPU `json:"gpus"`
	Hostname string     `json:"hostname,omitempty"`
	Version  string     `json:"version,omitempty"`
	// Metadata names the interruption watcher the agent runs: aws, gcp, azure or none.
	Metadata string `json:"metadata,omitempty"`
	// Procs are the workers an earlier session of this agent started and still holds (the
	// driver went away, or restarted): a driver that took up their job (--state-dir) adopts
	// them, and the agent stops those it does not adopt.
	Procs []HeldProc `json:"procs,omitempty"`
}

// HeldProc is a worker an agent kept through the end of its session.
type HeldProc struct {
	Proc   uint64 `json:"proc"`   // its number in the earlier session
	Worker string `json:"worker"` // its worker ID (ELASTICD_WORKER_ID)
	JobID  string `json:"job_id"` // the job that started it
	PID    int    `json:"pid,omitempty"`
	// Exited is set when it ended while no driver was there to hear it, with its status.
	Exited bool   `json:"exited,omitempty"`
	Code   int    `json:"code,omitempty"`
	Signal string `json:"signal,omitempty"`
}

// Adoption is a held worker the driver took over, under its number in the new session.
type Adoption struct {
	Old uint64 `json:"old"`
	New uint64 `json:"new"`
}

// AgentRegisterAnswer is the 200 answer to a registration.
type AgentRegisterAnswer struct {
	Session string `json:"session"`
	JobID   string `json:"job_id"`
	// PollWaitMS is how long the driver holds a commands long-poll; LeaseMS is how long it
	// waits without hearing from the agent before it counts the agent lost.
	PollWaitMS int64 `json:"poll_wait_ms"`
	LeaseMS    int64 `json:"lease_ms"`
	// Adopted are the held workers (AgentRegisterRequest.Procs) the driver took over; the agent
	// stops the others.
	Adopted []Adoption `json:"adopted,omitempty"`
	// NoLoads says the driver reads no GPU busy fractions (its slot policy is not
	// loadaware): the agent sends none, sparing a driver of thousands of hosts a request per
	// host every few seconds.
	NoLoads bool `json:"no_loads,omitempty"`
}

// AgentCommand is one thing the driver asks of an agent. Seq increases by one per command of a
// session; the agent acknowledges what it has done by asking for commands after it.
type AgentCommand struct {
	Seq  uint64 `json:"seq"`
	Op   string `json:"op"`
	Proc uint64 `json:"proc,omitempty"` // the process (start, stop), numbered by the driver
	// Start: the worker's ID (host/slot), slot, argv, extra environment (never the job
	// secret: the agent derives it) and working directory.
	Worker string   `json:"worker,omitempty"`
	Slot   int      `json:"slot,omitempty"`
	Argv   []string `json:"argv,omitempty"`
	Env    []string `json:"env,omitempty"`
	Dir    string   `json:"dir,omitempty"`
	// Stop: SIGTERM, then SIGKILL after GraceMS.
	GraceMS int64 `json:"grace_ms,omitempty"`
	// CompleteNotice: the notice's ID as the agent sent it.
	Notice string `json:"notice,omitempty"`
}

// AgentCommandsAnswer is the 200 answer to a commands poll: every command after the one asked
// for, oldest first; empty when the poll timed out.
type AgentCommandsAnswer struct {
	Commands []AgentCommand `json:"commands"`
}

// AgentNotice is an interruption the agent saw on its host's metadata service.
type AgentNotice struct {
	ID       string    `json:"id"`
	Kind     string    `json:"kind"` // providers.NoticeKind
	Deadline time.Time `json:"deadline,omitzero"`
	Detail   string    `json:"detail,omitempty"`
}

// GPUFault is a GPU the agent found unfit: a critical XID, an uncorrectable ECC error or a
// lost device.
type GPUFault struct {
	Index  int    `json:"index"` // -1: NVML did not say which
	UUID   string `json:"uuid,omitempty"`
	Kind   string `json:"kind"` // xid, ecc, lost
	XID    uint64 `json:"xid,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// AgentEvent is one thing an agent tells the driver. Seq increases by one per event of a session
// and makes retries harmless: the driver ignores an event it has already taken.
type AgentEvent struct {
	Seq    uint64       `json:"seq"`
	Kind   string       `json:"kind"`
	Proc   uint64       `json:"proc,omitempty"`
	PID    int          `json:"pid,omitempty"`
	Code   int          `json:"code,omitempty"`
	Signal string       `json:"signal,omitempty"`
	Error  string       `json:"error,omitempty"`
	Stream string       `json:"stream,omitempty"` // stdout or stderr
	Data   []byte       `json:"data,omitempty"`
	Notice *AgentNotice `json:"notice,omitempty"`
	GPU    *GPUFault    `json:"gpu,omitempty"`
	// GPUBusy is the mean busy fraction (0 to 1) of the host's GPUs.
	GPUBusy float64 `json:"gpu_busy,omitempty"`
	// Port answers OpFindPort.
	Port int `json:"port,omitempty"`
}

// AgentEventsRequest is the body of POST /v1/agents/{session}/events.
type AgentEventsRequest struct {
	Events []AgentEvent `json:"events"`
}

// JobSecret derives a job's secret from the agent secret and the job's ID, so that the driver
// and every agent know it without sending it: the agent puts it in the environment of the
// workers it starts.
func JobSecret(agentSecret []byte, jobID string) []byte {
	m := hmac.New(sha256.New, agentSecret)
	m.Write([]byte("elasticd job secret\n" + jobID))
	return m.Sum(nil)
}

// MinAgentSecret is the shortest agent secret accepted, in bytes.
const MinAgentSecret = 16
