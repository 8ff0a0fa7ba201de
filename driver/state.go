package driver

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/elasticd/elasticd/driver/hosts"
	"github.com/elasticd/elasticd/internal/atomicfile"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
)

// The driver's state on disk (--state-dir): what a driver started again on the same
// directory needs to take up the job where the last one left it. It is written atomically
// whenever it changes, and before the workers can see a change (a generation is saved before
// it is published, a host-update version before it is announced), so that a driver killed at
// any moment leaves a state no worker is ahead of. A job that ends (finished or failed)
// removes it; one that is interrupted keeps it, marked WorkersStopped.

// StateFile is the file under --state-dir that holds the job's state; LockFile is held by
// the driver that owns the directory.
const (
	StateFile    = "state.json"
	LockFile     = "lock"
	stateVersion = 1
)

// SavedState is the job's state in --state-dir.
type SavedState struct {
	Version int    `json:"version"`
	JobID   string `json:"job_id"`
	// SecretFrom says where the job secret comes from: "agents" (derived from the agent
	// secret and the job ID, so a restarted driver has it again) or "random" (new at each
	// start: the workers died with the driver that knew it). SecretCheck is the start of the
	// secret's SHA-256: a restart with another --agent-secret-file is refused.
	SecretFrom  string `json:"secret_from"`
	SecretCheck string `json:"secret_check"`
	// URL is the rendezvous URL the workers were given: a driver that adopts them must be
	// reachable there.
	URL string `json:"url"`

	Generation uint64 `json:"generation"`
	InProcess  bool   `json:"in_process"`
	// Workers are the current generation's members in rank order; PlanHosts is the
	// host-update version their assignments carry, HostsVersion the newest announced.
	Workers      []SavedWorker `json:"workers"`
	PlanHosts    uint64        `json:"plan_hosts_version"`
	HostsVersion uint64        `json:"hosts_version"`
	// Resetting is set when the generation was resetting: its members stopped training and
	// wait for the next one, which the restarted driver plans once it has found them.
	Resetting bool   `json:"resetting"`
	Step      uint64 `json:"step"`
	Committed uint64 `json:"committed_step"`

	// Hosts is the latest discovery result; Blacklist and Quarantined the slots held out.
	Hosts       []providers.Host       `json:"hosts"`
	Blacklist   []hosts.BlacklistEntry `json:"blacklist"`
	Quarantined []string               `json:"quarantined"`
	// OperatorAdded and OperatorStopped are the hosts an operator added and removed
	// (elasticd ctl add-host, remove-host): a restarted driver keeps them so.
	OperatorAdded   []providers.Host `json:"operator_added,omitempty"`
	OperatorStopped []providers.Host `json:"operator_stopped,omitempty"`

	Resets        int `json:"resets"`
	FailureResets int `json:"failure_resets"`
	CountedResets int `json:"counted_resets"`
	// WorkersStopped is set when the driver stopped every worker itself (it was
	// interrupted): there is nothing to adopt, only the checkpoint to resume from.
	WorkersStopped bool `json:"workers_stopped"`
	// Journal and Progress are what the status page, the metrics and the cost show of the
	// job's past: a restarted driver goes on from them rather than from its own start. They are
	// refreshed at most every journalEvery (and at the driver's end), not at every save.
	Journal  *SavedJournal   `json:"journal,omitempty"`
	Progress []ProgressPoint `json:"progress,omitempty"`
	SavedAt  time.Time       `json:"saved_at"`
}

// SavedWorker is a member of the saved generation.
type SavedWorker struct {
	Worker     string              `json:"worker"`
	Addr       string              `json:"addr"` // the address it was launched on
	Assignment protocol.Assignment `json:"assignment"`
}

// LoadState reads the job's state from dir; nil, nil when there is none (a new job).
func LoadState(dir string) (*SavedState, error) {
	path := filepath.Join(dir, StateFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the job's state: %w", err)
	}
	var st SavedState
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return nil, fmt.Errorf("%s is not a job state this elasticd can read (%v): move it away to start a new job", path, err)
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("%s has state version %d, this elasticd reads version %d: move it away to start a new job", path, st.Version, stateVersion)
	}
	if st.JobID == "" {
		return nil, fmt.Errorf("%s has no job ID: move it away to start a new job", path)
	}
	for _, w := range st.Workers {
		if _, err := protocol.ParseWorkerID(w.Worker); err != nil {
			return nil, fmt.Errorf("%s: worker %q: %v: move it away to start a new job", path, w.Worker, err)
		}
	}
	return &st, nil
}

// secretCheck is what SavedState.SecretCheck holds for secret.
func secretCheck(secret []byte) string {
	sum := sha256.Sum256(secret)
	return hex.EncodeToString(sum[:8])
}

// stateDir is an open --state-dir: locked against a second driver, and written only when
// the state changed.
type stateDir struct {
	dir  string
	lock *os.File
	last []byte // the last state written, without SavedAt
}

// openStateDir creates dir if needed and takes its lock; a second driver on the same
// directory is refused.
func openStateDir(dir string) (*stateDir, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, LockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b := make([]byte, 32)
		n, _ := f.ReadAt(b, 0)
		f.Close()
		holder := strings.TrimSpace(string(b[:n]))
		return nil, fmt.Errorf("--state-dir %s: another driver (pid %s) holds it; one driver per job: stop that one, or give this job its own directory", dir, holder)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return &stateDir{dir: dir, lock: f}, nil
}

// save writes st when it differs from what was last written.
func (s *stateDir) save(st SavedState) error {
	st.Version, st.SavedAt = stateVersion, time.Time{}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if bytes.Equal(b, s.last) {
		return nil
	}
	st.SavedAt = time.Now().UTC()
	out, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(s.dir, StateFile), append(out, '\n'), 0o600, "state"); err != nil {
		return err
	}
	s.last = b
	return nil
}

// remove deletes the state: the job is over.
func (s *stateDir) remove() error {
	err := os.Remove(filepath.Join(s.dir, StateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// close releases the lock.
func (s *stateDir) close() { s.lock.Close() }
