package launch

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/proc"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The second launch of a slot is run by the spare interpreter the first one left, with the
// second launch's environment and arguments, as `python script.py` would run it.
func TestWarmHandsTheNextLaunchToTheSpare(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	script := filepath.Join(t.TempDir(), "w.py")
	os.WriteFile(script, []byte("import os, sys\nprint(__name__, sys.argv[1:], os.environ['X'], os.path.basename(sys.path[0] or 'cwd'))\nsys.exit(3)\n"), 0o644)
	w, err := NewWarm(nil)
	if err != nil {
		t.Fatal(err)
	}
	run := func(x, arg string) (proc.Process, string) {
		t.Helper()
		var out syncBuf
		p, err := w.Start(t.Context(), proc.Spec{Name: "w", Host: "h", Slot: 0, Command: []string{py, script, arg}, Env: []string{"X=" + x}, Stdout: &out, Stderr: &out})
		if err != nil {
			t.Fatal(err)
		}
		if st, err := p.Wait(); err != nil || st.Code != 3 {
			t.Fatalf("exit %v, %v; output %q", st, err, out.String())
		}
		return p, out.String()
	}
	if _, out := run("1", "a"); out != "__main__ ['a'] 1 "+filepath.Base(filepath.Dir(script))+"\n" {
		t.Fatalf("cold start printed %q", out)
	}
	w.mu.Lock()
	sp := w.spares["h\x000"]
	w.mu.Unlock()
	if sp == nil {
		t.Fatal("no spare after a launch")
	}
	deadline := time.Now().Add(time.Minute)
	for _, err := os.Stat(sp.file + ".ready"); err != nil; _, err = os.Stat(sp.file + ".ready") {
		if time.Now().After(deadline) {
			t.Fatal("the spare never got ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	p, out := run("2", "b")
	if p.PID() != sp.p.PID() {
		t.Fatalf("second launch ran as PID %d, not the spare %d", p.PID(), sp.p.PID())
	}
	if out != "__main__ ['b'] 2 "+filepath.Base(filepath.Dir(script))+"\n" {
		t.Fatalf("warm start printed %q, want what a cold start of the second launch prints", out)
	}
	// Not a Python script: cold, and no spare.
	var out2 syncBuf
	p, err = w.Start(t.Context(), proc.Spec{Name: "sh", Host: "h", Slot: 1, Command: []string{"sh", "-c", "exit 0"}, Stdout: &out2})
	if err != nil {
		t.Fatal(err)
	}
	p.Wait()
	w.mu.Lock()
	_, spare1 := w.spares["h\x001"]
	left := w.spares["h\x000"]
	w.mu.Unlock()
	if spare1 || left == nil {
		t.Fatalf("spares: slot 1 %v (want none), slot 0 %v (want the next one)", spare1, left)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-left.done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close left a spare running")
	}
	if _, err := os.Stat(w.dir); !os.IsNotExist(err) {
		t.Fatalf("hand-over directory still there: %v", err)
	}
	if !warmable([]string{"/usr/bin/python3", "-m", "train"}) || warmable([]string{"python3", "-u", "t.py"}) || warmable([]string{"./train"}) {
		t.Fatal("warmable")
	}
}
