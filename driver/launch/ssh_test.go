//go:build linux

package launch_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/launch"
	"github.com/elasticd/elasticd/driver/launch/sshdtest"
	"github.com/elasticd/elasticd/proc"
)

func startSSH(t *testing.T, ctx context.Context, cfg launch.SSHConfig, s proc.Spec) proc.Process {
	t.Helper()
	if s.Name == "" {
		s.Name = "worker"
	}
	p, err := launch.NewSSH(cfg).Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(0) })
	return p
}

func remotePID(t *testing.T, p proc.Process) int {
	t.Helper()
	r, ok := p.(interface{ RemotePID() int })
	if !ok {
		t.Fatalf("%T has no RemotePID", p)
	}
	return r.RemotePID()
}

// The command runs on the host named, in the directory asked for, with the environment (quoted
// right, whatever it holds), the secret in no process's argv on either side, and its exit code
// comes back.
func TestSSHRunsRemotely(t *testing.T) {
	t.Parallel()
	sshd := sshdtest.Start(t)
	secret := randomSecret(t)
	weird := "it's \"quoted\" $HOME `x` \\n \\ ;|&<>*?\nsecond line\n"
	dir := t.TempDir()
	var out, errOut buffer
	p := startSSH(t, t.Context(), sshd.Config(), proc.Spec{
		Host: sshdtest.Hosts[1],
		Command: sh(`printf '%s' "$WEIRD" >weird.out; printf 'secret=%s\n' "$ELASTICD_SECRET"; pwd; ` +
			`echo "$SSH_CONNECTION"; echo "pid $$"; echo "vars $m $p $l $PATH"; echo to-stderr >&2; echo ready; ` +
			`while [ ! -e proceed ]; do /bin/sleep 0.01; done; exit 7`),
		// Names a shell script might use for itself, and a PATH without the usual tools.
		Env:    []string{"ELASTICD_SECRET=" + secret, "WEIRD=" + weird, "m=M", "p=P", "l=L", "PATH=/nonexistent"},
		Dir:    dir,
		Stdout: &out,
		Stderr: &errOut,
	})
	refs := waitPIDs(t, &out, 1)
	if found := cmdlinesWith(t, secret); len(found) > 0 {
		t.Errorf("secret in argv: %q", found)
	}
	if got := remotePID(t, p); got != refs[0].pid {
		t.Errorf("RemotePID %d, want the worker's %d", got, refs[0].pid)
	}
	if err := os.WriteFile(filepath.Join(dir, "proceed"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait()
	if err != nil || st != (proc.ExitStatus{Code: 7}) {
		t.Errorf("status %v, %v; want exit 7", st, err)
	}
	lines := out.lines()
	if len(lines) != 6 || lines[0] != "secret="+secret || lines[1] != dir || !strings.Contains(lines[2], fmt.Sprintf(" %s %d", sshdtest.Hosts[1], sshd.Port)) ||
		lines[4] != "vars M P L /nonexistent" {
		t.Errorf("output %q: want the secret, %s, a connection to %s, and the environment as given", lines, dir, sshdtest.Hosts[1])
	}
	if got := errOut.String(); got != "to-stderr\n" {
		t.Errorf("stderr %q, want only the worker's", got)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "weird.out")); err != nil || string(got) != weird {
		t.Errorf("WEIRD arrived as %q (%v), want %q", got, err, weird)
	}
}

// Dir "" means the driver's directory; each host is reached at its own address.
func TestSSHDefaultDirTwoHosts(t *testing.T) {
	t.Parallel()
	sshd := sshdtest.Start(t)
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, host := range sshdtest.Hosts {
		wg.Go(func() {
			var out buffer
			p, err := launch.NewSSH(sshd.Config()).Start(t.Context(), proc.Spec{
				Name: host, Host: host, Command: sh(`pwd; echo "$SSH_CONNECTION"`), Stdout: &out,
			})
			if err != nil {
				t.Error(err)
				return
			}
			if st, err := p.Wait(); err != nil || !st.Success() {
				t.Errorf("%s: status %v, %v", host, st, err)
			}
			lines := out.lines()
			if len(lines) != 2 || lines[0] != wd || !strings.Contains(lines[1], fmt.Sprintf(" %s %d", host, sshd.Port)) {
				t.Errorf("%s: output %q, want %s and a connection to %s", host, lines, wd, host)
			}
		})
	}
	wg.Wait()
}

// Output arrives whole, with the wrapper's markers taken out, last lines without a newline too.
func TestSSHOutput(t *testing.T) {
	t.Parallel()
	sshd := sshdtest.Start(t)
	var out buffer
	p := startSSH(t, t.Context(), sshd.Config(), proc.Spec{
		Host:    sshdtest.Hosts[0],
		Command: sh(`seq 1 5000; printf 'e1\ne2' >&2; printf last`),
		Stdout:  proc.NewPrefixWriter(&out, "[0] "),
		Stderr:  proc.NewPrefixWriter(&out, "[0 err] "),
	})
	if st, err := p.Wait(); err != nil || !st.Success() {
		t.Fatalf("status %v, %v", st, err)
	}
	var n int
	var stderr []string
	for _, l := range out.lines() {
		switch {
		case strings.HasPrefix(l, "[0] "):
			n++
			if want := fmt.Sprint(n); n <= 5000 && l != "[0] "+want {
				t.Fatalf("stdout line %d is %q", n, l)
			}
		case strings.HasPrefix(l, "[0 err] "):
			stderr = append(stderr, strings.TrimPrefix(l, "[0 err] "))
		default:
			t.Fatalf("line without prefix: %q", l)
		}
	}
	if n != 5001 || !strings.Contains(out.String(), "[0] last\n") {
		t.Errorf("got %d stdout lines, want 5001 ending with \"last\"", n)
	}
	if strings.Join(stderr, ",") != "e1,e2" {
		t.Errorf("stderr lines %q, want e1, e2", stderr)
	}
}

// Stop reaches the remote worker's whole tree: SIGTERM, then SIGKILL after the grace for a tree
// that ignores SIGTERM. Wait, called meanwhile, returns the remote status.
func TestSSHStop(t *testing.T) {
	t.Parallel()
	sshd := sshdtest.Start(t)
	for _, tc := range []struct {
		name   string
		script string
		grace  time.Duration
		code   int
	}{
		{"obeys SIGTERM", `sleep 60 & echo "pid $!"; (sleep 60 & echo "pid $!"; wait) & echo "pid $!"; echo "pid $$"; echo ready; wait`, 10 * time.Second, 128 + 15},
		{"ignores SIGTERM", treeScript, 500 * time.Millisecond, 128 + 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out buffer
			p := startSSH(t, t.Context(), sshd.Config(), proc.Spec{Host: sshdtest.Hosts[0], Command: sh(tc.script), Stdout: &out})
			refs := waitPIDs(t, &out, 4)
			waited := make(chan proc.ExitStatus)
			go func() {
				st, err := p.Wait()
				if err != nil {
					t.Error(err)
				}
				waited <- st
			}()
			start := time.Now()
			p.Stop(tc.grace)
			if d := time.Since(start); d > tc.grace+3*time.Second || (tc.code == 137 && d < tc.grace) {
				t.Errorf("Stop took %v with grace %v", d, tc.grace)
			}
			if st := <-waited; st != (proc.ExitStatus{Code: tc.code}) {
				t.Errorf("status %v, want exit %d", st, tc.code)
			}
			waitGone(t, 2*time.Second, refs)
		})
	}
}

// A remote process that left the worker's group (setsid) keeps the session open, but the exit
// status is back and Wait returns soon after.
func TestSSHEscapedProcess(t *testing.T) {
	t.Parallel()
	sshd := sshdtest.Start(t)
	var out buffer
	dir := t.TempDir()
	p := startSSH(t, t.Context(), sshd.Config(), proc.Spec{
		Host:    sshdtest.Hosts[0],
		Command: sh(`setsid sleep 60 </dev/null & echo "pid $!"; echo ready; while [ ! -e proceed ]; do sleep 0.01; done; exit 5`),
		Dir:     dir,
		Stdout:  &out,
	})
	waitPIDs(t, &out, 1) // and killed at cleanup
	if err := os.WriteFile(filepath.Join(dir, "proceed"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if st, err := p.Wait(); err != nil || st.Code != 5 {
		t.Errorf("status %v, %v; want exit 5", st, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Wait took %v", d)
	}
}

// A host that comes back at the same address with a new host key (a replaced spot instance) is
// still reached, as with Horovod's StrictHostKeyChecking=no, even when the user has a
// known_hosts file that remembers the old key.
func TestSSHChangedHostKey(t *testing.T) {
	t.Parallel()
	sshd := sshdtest.Start(t)
	cfg := sshd.Config()
	oldKey := filepath.Join(t.TempDir(), "old_host_key")
	sshdtest.Keygen(t, oldKey)
	pub, err := os.ReadFile(oldKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	knownHosts := filepath.Join(t.TempDir(), "known_hosts")
	line := fmt.Sprintf("[%s]:%d %s", sshdtest.Hosts[0], sshd.Port, pub)
	if err := os.WriteFile(knownHosts, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Options = []string{"UserKnownHostsFile=" + knownHosts}
	var out, errOut buffer
	p := startSSH(t, t.Context(), cfg, proc.Spec{Host: sshdtest.Hosts[0], Command: []string{"echo", "reached"}, Stdout: &out, Stderr: &errOut})
	if st, err := p.Wait(); err != nil || !st.Success() || out.String() != "reached\n" {
		t.Errorf("status %v, %v, output %q, stderr %q", st, err, out.String(), errOut.String())
	}
}

// Cancelling Start's context stops the remote worker.
func TestSSHContextCancel(t *testing.T) {
	t.Parallel()
	sshd := sshdtest.Start(t)
	ctx, cancel := context.WithCancel(t.Context())
	var out buffer
	p := startSSH(t, ctx, sshd.Config(), proc.Spec{Host: sshdtest.Hosts[0], Command: sh(`echo "pid $$"; echo ready; exec sleep 60`), Stdout: &out})
	refs := waitPIDs(t, &out, 1)
	cancel()
	done := make(chan proc.ExitStatus)
	go func() {
		st, _ := p.Wait()
		done <- st
	}()
	select {
	case st := <-done:
		if st.Code != 128+15 {
			t.Errorf("status %v, want exit 143 (SIGTERM)", st)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelling the context did not stop the worker")
	}
	waitGone(t, 2*time.Second, refs)
}

// When the local ssh client dies (kill -9), the remote tree dies too, SIGTERM-ignorers included
// after DisconnectGrace, and Wait says the connection was lost.
func TestSSHClientKilled(t *testing.T) {
	t.Parallel()
	sshd := sshdtest.Start(t)
	var out buffer
	p := startSSH(t, t.Context(), sshd.Config(), proc.Spec{Host: sshdtest.Hosts[1], Command: sh(treeScript), Stdout: &out})
	refs := waitPIDs(t, &out, 4)
	if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait()
	if err == nil || !strings.Contains(err.Error(), "connection lost") || st.Signal != "SIGKILL" {
		t.Errorf("Wait: %v, %v; want the ssh client killed and an error saying the connection was lost", st, err)
	}
	waitGone(t, 5*time.Second, refs) // DisconnectGrace 1 s, then SIGKILL
}

// A driver killed with SIGKILL takes its ssh clients with it, and so the remote trees.
func TestSSHDriverKilled(t *testing.T) {
	t.Parallel()
	sshd := sshdtest.Start(t)
	cfg := sshd.Config()
	testDriverKilled(t, driverConfig{SSH: &cfg, Host: sshdtest.Hosts[0]}, 5*time.Second)
}

// Launches that cannot work fail in Start, quickly, saying why.
func TestSSHStartErrors(t *testing.T) {
	t.Parallel()
	sshd := sshdtest.Start(t)

	// A server that accepts connections and never says a word.
	silent, err := net.Listen("tcp", "127.0.0.4:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	conns.Go(func() {
		var held []net.Conn
		for {
			c, err := silent.Accept()
			if err != nil {
				break
			}
			held = append(held, c)
		}
		for _, c := range held {
			c.Close()
		}
	})
	t.Cleanup(func() {
		silent.Close()
		conns.Wait()
	})

	otherKey := filepath.Join(t.TempDir(), "other_key")
	sshdtest.Keygen(t, otherKey)
	good := sshd.Config()
	wrongKey := good
	wrongKey.IdentityFile = otherKey
	silentPort := good
	silentPort.Port = silent.Addr().(*net.TCPAddr).Port
	silentPort.StartTimeout = time.Second
	badOption := good
	badOption.Options = []string{"-oProxyCommand=x"}

	for _, tc := range []struct {
		name string
		cfg  launch.SSHConfig
		spec proc.Spec
		want string
	}{
		{"unreachable", good, proc.Spec{Host: "127.0.0.9"}, "Connection refused"},
		{"wrong key", wrongKey, proc.Spec{Host: sshdtest.Hosts[0]}, "Permission denied"},
		{"silent server", silentPort, proc.Spec{Host: "127.0.0.4"}, "127.0.0.4"},
		{"no such command", good, proc.Spec{Host: sshdtest.Hosts[0], Command: []string{"elasticd-no-such-command"}}, "elasticd-no-such-command: command not found"},
		{"no such dir", good, proc.Spec{Host: sshdtest.Hosts[0], Dir: "/nonexistent/dir"}, "/nonexistent/dir"},
		{"bad env", good, proc.Spec{Host: sshdtest.Hosts[0], Env: []string{"1X=y"}}, `environment entry "1X"`},
		{"bad host", good, proc.Spec{Host: "-oProxyCommand=x"}, "bad host"},
		{"bad option", badOption, proc.Spec{Host: sshdtest.Hosts[0]}, `ssh option "-oProxyCommand=x": want Key=Value`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := tc.spec
			s.Name = "rank 5"
			if s.Command == nil {
				s.Command = []string{"true"}
			}
			start := time.Now()
			_, err := launch.NewSSH(tc.cfg).Start(t.Context(), s)
			t.Log(err)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "start rank 5 on "+s.Host+": ") {
				t.Errorf("error %v, want one naming the worker and host, containing %q", err, tc.want)
			}
			// Well under the 30-s StartTimeout: a failure is reported when it happens, not at the
			// timeout (with room for a loaded machine).
			if d := time.Since(start); d > 15*time.Second {
				t.Errorf("Start took %v to fail", d)
			}
		})
	}
}
