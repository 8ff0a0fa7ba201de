package aws_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestEndToEndSpotInterruption runs the real binaries: `elasticd run --provider aws` against
// the fake (3 spot instances on 127.0.0.2-4; the local launcher runs their workers here), the
// demo trainer with a line per step. Once generation 1 trains with 3 workers, a spot
// interruption warning for one instance goes into the queue: the job must move off that
// host at the next commit, to generation 2 with 2 workers, resuming at or after the last step
// printed (no rollback), long before the warning's 2-minute deadline. SIGTERM then ends it.
func TestEndToEndSpotInterruption(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs elasticd and the demo trainer")
	}
	bin := t.TempDir()
	for _, b := range []struct{ out, pkg string }{
		{"elasticd", "github.com/elasticd/elasticd/cmd/elasticd"},
		{"train", "github.com/elasticd/elasticd/examples/train"},
	} {
		build := exec.Command("go", "build", "-o", filepath.Join(bin, b.out), b.pkg)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}

	var insts []*fakeInst
	for i := range 3 {
		in := inst(i + 1)
		in.IP, in.Type, in.Spot = "127.0.0."+strconv.Itoa(i+2), "g5.xlarge", true
		insts = append(insts, in)
	}
	f := newFake(t, insts...)

	cmd := exec.Command(filepath.Join(bin, "elasticd"), "run",
		"--provider", "aws", "--asg", fakeGroup, "--region", "us-east-1",
		"--endpoint", f.srv.URL, "--sqs-queue-url", f.queueURL,
		"--launcher", "local", // the fake's instances are this machine's loopback addresses
		"-np", "3", "--min-np", "2",
		"--", filepath.Join(bin, "train"), "--steps", "100000", "--step-delay", "5ms", "--events")
	cmd.Dir = t.TempDir()
	// TestMain left dummy credentials, no config files and no instance metadata in the
	// environment.
	cmd.Env = append(os.Environ(), "AWS_EC2_METADATA_DISABLED=true")
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill() // by PID; its workers die with it (Pdeathsig)
		<-done
		if t.Failed() {
			t.Logf("elasticd output:\n%s", out.String())
		}
	})

	gen1 := regexp.MustCompile(`generation 1: world size 3, resuming at step \d+`)
	gen2 := regexp.MustCompile(`generation (\d+): world size 2, resuming at step (\d+)`)
	event := regexp.MustCompile(`event step=(\d+) world=3 `)
	waitFor := func(what string, timeout time.Duration, ok func(string) bool) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for !ok(out.String()) {
			select {
			case err := <-done:
				done <- err
				t.Fatalf("elasticd exited (%v) before %s", err, what)
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s within %v", what, timeout)
			}
		}
	}
	lastStep := func(s string) int {
		n := -1
		for _, m := range event.FindAllStringSubmatch(s, -1) {
			n = max(n, atoi(m[1]))
		}
		return n
	}
	waitFor("generation 1 with 3 workers", 60*time.Second, gen1.MatchString)
	waitFor("20 steps of generation 1", 30*time.Second, func(s string) bool { return lastStep(s) >= 20 })

	doomed := insts[1]
	before := lastStep(out.String())
	warned := time.Now()
	f.send("spot_interruption.json", eventData{ID: "e2e-spot-1", Instance: doomed.ID, Time: warned.UTC().Format(time.RFC3339)})
	waitFor("generation 2 with 2 workers", 60*time.Second, gen2.MatchString)
	took := time.Since(warned)
	s := out.String()
	m := gen2.FindStringSubmatch(s)
	resumed, lastGen1 := atoi(m[2]), lastStep(s[:gen2.FindStringIndex(s)[0]])
	t.Logf("spot warning for %s at step %d; generation %s with 2 workers after %v, resuming at step %d (last step printed before: %d)",
		doomed.ID, before, m[1], took.Round(time.Millisecond), resumed, lastGen1)
	if resumed < before || resumed < lastGen1 {
		t.Errorf("resumed at step %d, before the last steps printed (%d when warned, %d before the reset): a rollback", resumed, before, lastGen1)
	}
	if took > 30*time.Second {
		t.Errorf("the job took %v to move off the interrupted host; the warning gives 2 min", took)
	}
	if f.queued() != 0 {
		t.Errorf("%d messages left in the queue; the notice must be deleted", f.queued())
	}

	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		done <- err
		t.Logf("elasticd exited after SIGTERM: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("elasticd did not exit within 30 s of SIGTERM")
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// syncBuffer collects a process's output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
