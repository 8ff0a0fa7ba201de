package protocol

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// State is what a worker reports about itself.
type State string

const (
	Ready   State = "READY"   // waiting at the barrier for the next generation
	Success State = "SUCCESS" // training finished; the process exits 0
	Failure State = "FAILURE" // the worker failed; Message says why
)

// Valid reports whether s is one of the states a worker may report.
func (s State) Valid() bool { return s == Ready || s == Success || s == Failure }

// Assignment is a worker's place in one generation.
type Assignment struct {
	Generation uint64 `json:"generation"`
	Rank       int    `json:"rank"`
	Size       int    `json:"size"`
	LocalRank  int    `json:"local_rank"`
	LocalSize  int    `json:"local_size"`
	CrossRank  int    `json:"cross_rank"`
	CrossSize  int    `json:"cross_size"`
	// Removed: the worker has no place in this generation (its host was removed, or the job
	// is over); it should exit 0.
	Removed bool `json:"removed"`
	// HostsVersion is the host-update version (see Server.NotifyHostsUpdated) when the
	// generation was published, set by the server: the plan already reflects updates up to
	// it, so a worker that joins this generation need not reset for them.
	HostsVersion uint64 `json:"hosts_version"`
}

// ReadyReport is what a worker says with READY besides the generation it leaves.
type ReadyReport struct {
	Message    string
	Rollback   Rollback
	SilentPeer bool
	// Unreachable are the ranks of the generation left whose hosts did not answer this
	// worker's probe after its collective or connect failed: a network cut between them.
	// Reached are those whose hosts did answer (or that it was connected to).
	Unreachable, Reached []int
}

// MaxUnreachable is the most ranks a READY may name as unreachable.
const MaxUnreachable = 1024

// Rollback is work a worker threw away by restoring its last commit after a failure: the
// steps since that commit, and the wall-clock seconds they had taken.
type Rollback struct {
	Steps   uint64  `json:"rolled_back_steps,omitempty"`
	Seconds float64 `json:"rolled_back_seconds,omitempty"`
}

// MaxMessage is the longest report message, in bytes. The client truncates longer ones; the
// server refuses them.
const MaxMessage = 4096

// Wire names. See docs/protocol.md §2.
const (
	HeaderTimestamp = "X-Elasticd-Timestamp"      // decimal Unix seconds
	HeaderNonce     = "X-Elasticd-Nonce"          // 32 hex digits, random, never reused
	HeaderBodyHash  = "X-Elasticd-Content-Sha256" // hex SHA-256 of the request body
	HeaderSignature = "X-Elasticd-Signature"      // hex HMAC-SHA256, see signature()

	signingScheme = "ELASTICD-HMAC-SHA256"
	nonceBytes    = 16
)

// RendezvousAuthLabel keys the rendezvous protocol's MACs (see NewAuth).
const RendezvousAuthLabel = "elasticd rendezvous v1"

// ProtocolVersion is the version of the protocol this package defines (docs/protocol.md) that
// this driver and its clients speak: the Go worker and the Python package (python/elasticd)
// send it with every state report; the driver refuses another version, so a worker built
// against another release fails at once with a
// clear error instead of misreading the answers. A message without it (older clients) is taken
// as version 1.
const ProtocolVersion = 1

// StateReport is the body of POST /v1/workers/{id}/state.
type StateReport struct {
	Protocol   int     `json:"protocol,omitempty"`
	Generation *uint64 `json:"generation"`
	State      State   `json:"state"`
	Message    string  `json:"message,omitempty"`
	// ReportID is random per report and the same across the client's retries of it, so a
	// retry of a report the server already queued is not delivered twice.
	ReportID string `json:"report_id,omitempty"`
	Rollback
	SilentPeer bool `json:"silent_peer,omitempty"`
	// Unreachable, with READY: ranks of the generation left whose hosts did not answer the
	// worker's probe (ReadyReport.Unreachable). Added in version 1; older clients omit it.
	Unreachable []int `json:"unreachable_ranks,omitempty"`
	// Reached, with unreachable_ranks: the ranks whose hosts answered the probe, or that
	// the worker was connected to.
	Reached []int `json:"reached_ranks,omitempty"`
}

// ProgressReport is the body of POST /v1/workers/{id}/progress.
//
// Loss and TotalSteps came later in version 1: both are optional and omitted when the
// training program gives none, so reports of older clients (without them) mean "unknown"
// and are accepted as before. JSON has no NaN or infinity: a client drops a loss that is not
// a finite number rather than send it, and the driver refuses a report it cannot decode.
type ProgressReport struct {
	Generation uint64 `json:"generation"`
	Step       uint64 `json:"step"`
	Committed  uint64 `json:"committed_step"`
	// Loss is the training loss of the latest step, as the program computed it.
	Loss *float64 `json:"loss,omitempty"`
	// TotalSteps is how many steps the job trains in all (0: unknown), for "step X of N"
	// and the time to go.
	TotalSteps uint64 `json:"total_steps,omitempty"`
}

// HostsVersion is the body of a 200 answer to GET /v1/hosts/version.
type HostsVersion struct {
	Version uint64 `json:"version"`
}

// LoadReport is the body of POST /v1/workers/{id}/load.
type LoadReport struct {
	StepSeconds float64 `json:"step_seconds"`
}

// deriveKey turns a secret into the key for the protocol named by label (RendezvousAuthLabel for
// rendezvous), so that the same secret can key other protocols (the collectives' hello MAC,
// the agents', the admin API's) without one MAC ever standing for another.
func deriveKey(secret []byte, label string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	return m.Sum(nil)
}

// signature is HMAC-SHA256(key, scheme \n method \n target \n timestamp \n nonce \n bodyHash),
// where target is the request-target exactly as sent (escaped path, and "?query" if any).
func signature(key []byte, method, target, timestamp, nonce, bodyHash string) []byte {
	m := hmac.New(sha256.New, key)
	for i, s := range []string{signingScheme, method, target, timestamp, nonce, bodyHash} {
		if i > 0 {
			m.Write([]byte{'\n'})
		}
		m.Write([]byte(s))
	}
	return m.Sum(nil)
}

func bodyHash(body []byte) string {
	h := sha256.Sum256(body)
	return hex.EncodeToString(h[:])
}

// authError is a reason for a 401; its text is the whole answer.
type authError string

func (e authError) Error() string { return string(e) }

// checkSignature verifies a request's headers against key. It returns the decoded nonce for
// the replay check; the body hash is checked later, once the body has been read.
func checkSignature(key []byte, method, target string, get func(string) string, now time.Time, window time.Duration) ([nonceBytes]byte, error) {
	var nonce [nonceBytes]byte
	ts, nc, bh, sig := get(HeaderTimestamp), get(HeaderNonce), get(HeaderBodyHash), get(HeaderSignature)
	for _, h := range []struct{ name, v string }{{HeaderTimestamp, ts}, {HeaderNonce, nc}, {HeaderBodyHash, bh}, {HeaderSignature, sig}} {
		if h.v == "" {
			return nonce, authError("missing " + h.name + " header")
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || strings.HasPrefix(ts, "+") {
		return nonce, authError("malformed " + HeaderTimestamp + " header")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > window || d < -window {
		return nonce, authError(fmt.Sprintf("timestamp outside the replay window of %v (clocks differ by %v?)", window, d.Round(time.Second)))
	}
	if len(nc) != 2*nonceBytes {
		return nonce, authError("malformed " + HeaderNonce + " header")
	}
	if _, err := hex.Decode(nonce[:], []byte(nc)); err != nil {
		return nonce, authError("malformed " + HeaderNonce + " header")
	}
	if len(bh) != 2*sha256.Size || !isHex(bh) {
		return nonce, authError("malformed " + HeaderBodyHash + " header")
	}
	got, err := hex.DecodeString(sig)
	if err != nil || len(got) != sha256.Size {
		return nonce, authError("malformed " + HeaderSignature + " header")
	}
	if !hmac.Equal(got, signature(key, method, target, ts, nc, bh)) {
		return nonce, authError("bad signature")
	}
	return nonce, nil
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// errBodyHash is returned when the body read does not match the signed hash.
var errBodyHash = errors.New("body does not match " + HeaderBodyHash)

// PathBatch is where an agent's relay sends its workers' reports together (docs/protocol.md
// §2.5): POST a BatchRequest, answered 200 with a BatchAnswer. Each request in it is the
// worker's own, signed by the worker and checked by the driver as if it came alone; the batch
// itself carries no authority.
const PathBatch = "/v1/batch"

// MaxBatch bounds the requests of one batch.
const MaxBatch = 256

// BatchRequest is several workers' requests sent as one.
type BatchRequest struct {
	Requests []BatchItem `json:"requests"`
}

// BatchItem is one worker's request, exactly as the worker sent and signed it.
type BatchItem struct {
	Method string `json:"method"`
	// Target is the request's path and query, escaped as sent ("/v1/workers/h%2F0/state").
	Target string `json:"target"`
	// Header holds the request's X-Elasticd-* headers and its Content-Type.
	Header map[string]string `json:"header"`
	Body   []byte            `json:"body"` // base64 in JSON: the bytes the signature covers
}

// BatchAnswer holds the answers to a BatchRequest's requests, in their order.
type BatchAnswer struct {
	Answers []BatchReply `json:"answers"`
}

// BatchReply is the driver's answer to one request of a batch, as it would have answered it
// alone.
type BatchReply struct {
	Status int                 `json:"status"`
	Header map[string][]string `json:"header"`
	Body   []byte              `json:"body"`
}
