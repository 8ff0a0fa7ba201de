package launch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/elasticd/elasticd/proc"
)

// Warm starts: in restart mode every change of membership relaunches every worker, and for
// a PyTorch script most of a relaunch is the interpreter starting and importing torch again
// (seconds). A Warm launcher keeps, for each slot it has launched on, a spare interpreter
// that has already imported torch and waits; the slot's next launch hands it the worker's
// environment and argv, and it runs the script at once (runpy, as `python script.py` would).
// The spare is not a worker until then: it joins no process group and holds no port. It costs
// one idle interpreter's memory per slot (a few hundred MB with torch on a CPU).
//
// Only the local launcher's workers can be warm: the hand-over is a file in a private
// directory of this machine plus SIGUSR1 to the spare's PID. Commands other than
// `python[3[.N]] script.py ...` or `python -m module ...` start cold.

// zygote is the spare's program (python -c). SIGUSR1 is blocked before anything is imported,
// and only then does the spare say it is ready for one (FILE.ready: a signal before that
// would kill it); the file is looked for after the import, and every half second. The
// environment is replaced by the worker's whole environment, and OMP_NUM_THREADS, which torch
// reads when imported, is applied again.
const zygote = `import os, sys, json, signal, runpy
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
_f = os.environ["ELASTICD_WARM_FILE"]
open(_f + ".ready", "w").close()
try:
    import torch, torch.distributed, torch.nn.parallel
except Exception:
    torch = None
while not os.path.exists(_f):
    signal.sigtimedwait({signal.SIGUSR1}, 0.5)
signal.sigtimedwait({signal.SIGUSR1}, 0)  # a wake-up sent while torch loaded: drop it
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
with open(_f) as _h:
    _spec = json.load(_h)
os.unlink(_f)
os.environ.clear()
os.environ.update(_spec["env"])
if torch is not None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
    torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
sys.argv = _spec["argv"]
del _f, _h, _spec
if sys.argv[0] == "-m":
    sys.argv = sys.argv[1:]
    sys.path[0] = os.getcwd()
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    runpy.run_path(sys.argv[0], run_name="__main__")
`

var pythonName = regexp.MustCompile(`^python[0-9.]*$`)

// warmable reports whether argv runs a Python script or module that a spare can take over.
func warmable(argv []string) bool {
	if len(argv) < 2 || !pythonName.MatchString(filepath.Base(argv[0])) {
		return false
	}
	if argv[1] == "-m" {
		return len(argv) > 2
	}
	return filepath.Ext(argv[1]) == ".py"
}

// Warm is a Launcher with spare interpreters; make it with NewWarm, and Close it.
type Warm struct {
	inner proc.Launcher
	dir   string // private: the hand-over files hold the job secret
	log   *slog.Logger

	mu     sync.Mutex
	spares map[string]*spare // by host and slot
	closed bool
	seq    int
}

type spare struct {
	p       proc.Process
	file    string
	python  string // the interpreter; the script and its arguments come with the hand-over
	dir     string
	out, er *switchWriter
	done    chan struct{} // closed when the spare has exited
}

// NewWarm returns a launcher that starts workers through the local launcher and keeps a
// spare interpreter per slot for the slot's next launch.
func NewWarm(log *slog.Logger) (*Warm, error) {
	dir, err := os.MkdirTemp("", "elasticd-warm-*")
	if err != nil {
		return nil, fmt.Errorf("warm starts: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Warm{inner: proc.NewLocal(), dir: dir, log: log, spares: map[string]*spare{}}, nil
}

// FreePort is the local launcher's.
func (w *Warm) FreePort(ctx context.Context, host string) (int, error) {
	return w.inner.(proc.PortFinder).FreePort(ctx, host)
}

// Start hands the worker to the slot's spare when there is a live one, else starts it cold;
// either way a new spare is started for the slot's next launch.
func (w *Warm) Start(ctx context.Context, s proc.Spec) (proc.Process, error) {
	if !warmable(s.Command) {
		return w.inner.Start(ctx, s)
	}
	key := s.Host + "\x00" + strconv.Itoa(s.Slot)
	w.mu.Lock()
	sp := w.spares[key]
	delete(w.spares, key)
	w.mu.Unlock()
	var p proc.Process
	if sp != nil {
		var err error
		if p, err = w.handOver(sp, s); err != nil {
			w.log.Warn("warm start failed; starting cold", "worker", s.Name, "err", err)
			sp.p.Stop(0)
			p = nil
		}
	}
	if p == nil {
		var err error
		if p, err = w.inner.Start(ctx, s); err != nil {
			return nil, err
		}
	}
	w.prestart(key, s)
	return p, nil
}

// handOver gives a waiting spare the worker's environment and argv.
func (w *Warm) handOver(sp *spare, s proc.Spec) (proc.Process, error) {
	select {
	case <-sp.done:
		return nil, fmt.Errorf("the spare interpreter exited")
	default:
	}
	if sp.python != s.Command[0] || sp.dir != s.Dir {
		return nil, fmt.Errorf("the spare runs another interpreter or directory")
	}
	env := map[string]string{}
	for _, kv := range append(os.Environ(), s.Env...) { // later entries win, as exec's
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	b, err := json.Marshal(map[string]any{"env": env, "argv": s.Command[1:]})
	if err != nil {
		return nil, err
	}
	tmp := sp.file + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return nil, err
	}
	stdout, stderr := s.Stdout, s.Stderr
	if proc.SameWriter(stdout, stderr) {
		lw := proc.NewLockedWriter(stdout)
		stdout, stderr = lw, lw
	}
	sp.out.set(stdout)
	sp.er.set(stderr)
	if err := os.Rename(tmp, sp.file); err != nil {
		return nil, err
	}
	if _, err := os.Stat(sp.file + ".ready"); err == nil {
		syscall.Kill(sp.p.PID(), syscall.SIGUSR1) // wakes it at once; it also looks every half second
	}
	return sp.p, nil
}

// prestart starts the spare for the slot's next launch, with the environment of this one
// (what torch reads when imported is the same from one generation to the next).
func (w *Warm) prestart(key string, s proc.Spec) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.seq++
	file := filepath.Join(w.dir, fmt.Sprintf("spare-%d.json", w.seq))
	w.mu.Unlock()
	sp := &spare{file: file, python: s.Command[0], dir: s.Dir, out: &switchWriter{}, er: &switchWriter{}, done: make(chan struct{})}
	spec := s
	spec.Name = s.Name + " (spare)"
	spec.Command = []string{s.Command[0], "-c", zygote}
	spec.Env = append(slices.Clone(s.Env), "ELASTICD_WARM_FILE="+file)
	spec.Stdout, spec.Stderr = sp.out, sp.er
	// The spare outlives the launch that made it: only Close or the driver's death ends it.
	p, err := w.inner.Start(context.Background(), spec)
	if err != nil {
		w.log.Warn("could not start a spare interpreter; the next launch is cold", "worker", s.Name, "err", err)
		return
	}
	sp.p = p
	go func() { p.Wait(); close(sp.done) }()
	w.mu.Lock()
	old := w.spares[key]
	w.spares[key] = sp
	closed := w.closed
	w.mu.Unlock()
	if old != nil {
		old.p.Stop(0)
	}
	if closed {
		sp.p.Stop(0)
	}
}

// Close stops every spare and removes the hand-over directory.
func (w *Warm) Close() error {
	w.mu.Lock()
	w.closed = true
	spares := w.spares
	w.spares = map[string]*spare{}
	w.mu.Unlock()
	var wg sync.WaitGroup
	for _, sp := range spares {
		wg.Go(func() { sp.p.Stop(time.Second) })
	}
	wg.Wait()
	return os.RemoveAll(w.dir)
}

// switchWriter holds a spare's output until the worker it becomes has its own writers (a
// warning printed while torch was imported), then passes everything on.
type switchWriter struct {
	mu  sync.Mutex
	w   io.Writer
	buf bytes.Buffer
}

func (s *switchWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w == nil {
		return s.buf.Write(p)
	}
	return s.w.Write(p)
}

func (s *switchWriter) set(w io.Writer) {
	if w == nil {
		w = io.Discard
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.w = w
	if s.buf.Len() > 0 {
		w.Write(s.buf.Bytes())
		s.buf.Reset()
	}
}

// Flush passes a flush on, so that a worker's last line without a newline arrives.
func (s *switchWriter) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.w.(interface{ Flush() error }); ok {
		return f.Flush()
	}
	return nil
}
