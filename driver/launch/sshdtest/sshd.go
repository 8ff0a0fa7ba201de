//go:build linux

// Package sshdtest runs a real OpenSSH sshd on loopback for tests: generated host and client
// keys, its own config, listening on Hosts (distinct 127.0.0.x addresses standing for hosts),
// stopped by PID when the test ends.
package sshdtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/launch"
)

const (
	sshdPath    = "/usr/sbin/sshd"
	installHint = "run scripts/install-test-deps.sh (installs openssh-server and openssh-client, creates /run/sshd)"
)

// Hosts are the loopback addresses the sshd listens on, standing for two hosts.
var Hosts = []string{"127.0.0.2", "127.0.0.3"}

// SSHD is a real OpenSSH sshd on loopback, run by the test and killed at its end.
type SSHD struct {
	Dir  string
	Port int
	User string
	Key  string // the authorised client key
}

// Start starts sshd on Hosts at one free port. Where sshd or ssh-keygen is missing the
// test is skipped, or fails when $CI is set.
func Start(t testing.TB) *SSHD {
	t.Helper()
	Require(t)
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	s := &SSHD{Dir: t.TempDir(), User: u.Username}
	hostKey := filepath.Join(s.Dir, "host_key")
	s.Key = filepath.Join(s.Dir, "client_key")
	Keygen(t, hostKey)
	Keygen(t, s.Key)
	pub, err := os.ReadFile(s.Key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "authorized_keys"), pub, 0o600); err != nil {
		t.Fatal(err)
	}
	// The port is free when chosen but may be taken before sshd binds it: then sshd exits at
	// once and another port is tried.
	for range 5 {
		s.Port = freePort(t)
		if s.run(t, hostKey) {
			return s
		}
	}
	t.Fatal("sshd did not start")
	return nil
}

// Require skips the test (fails it when $CI is set) unless sshd and the ssh client tools exist.
func Require(t testing.TB) {
	t.Helper()
	var missing []string
	if _, err := os.Stat(sshdPath); err != nil {
		missing = append(missing, sshdPath)
	}
	for _, bin := range []string{"ssh", "ssh-keygen"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	if len(missing) == 0 {
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil { // sshd's privilege separation
			missing = append(missing, "/run/sshd ("+err.Error()+")")
		}
	}
	if len(missing) > 0 {
		msg := fmt.Sprintf("ssh tests need %s: %s", strings.Join(missing, ", "), installHint)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// Keygen writes a new passphrase-less ed25519 key pair to path and path.pub.
func Keygen(t testing.TB, path string) {
	t.Helper()
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
}

// freePort returns a port that is free on every one of Hosts.
func freePort(t testing.TB) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", Hosts[0]+":0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		free := true
		for _, h := range Hosts[1:] {
			l2, err := net.Listen("tcp", fmt.Sprintf("%s:%d", h, port))
			if err != nil {
				free = false
				break
			}
			l2.Close()
		}
		l.Close()
		if free {
			return port
		}
	}
	t.Fatal("no port free on all of", Hosts)
	return 0
}

// run starts sshd and waits until it accepts connections; false if it exited first.
func (s *SSHD) run(t testing.TB, hostKey string) bool {
	t.Helper()
	var conf strings.Builder
	for _, h := range Hosts {
		fmt.Fprintf(&conf, "ListenAddress %s:%d\n", h, s.Port)
	}
	fmt.Fprintf(&conf, `HostKey %s
AuthorizedKeysFile %s
PidFile %s
StrictModes no
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
PrintMotd no
LogLevel VERBOSE
MaxStartups 100
`, hostKey, filepath.Join(s.Dir, "authorized_keys"), filepath.Join(s.Dir, "sshd.pid"))
	confPath := filepath.Join(s.Dir, "sshd_config")
	if err := os.WriteFile(confPath, []byte(conf.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	var log lockedBuffer
	cmd := exec.Command(sshdPath, "-D", "-e", "-f", confPath)
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	stop := func() {
		syscall.Kill(cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(3 * time.Second):
			syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, h := range Hosts {
		for {
			c, err := net.DialTimeout("tcp", fmt.Sprintf("%s:%d", h, s.Port), time.Second)
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-exited:
				t.Logf("sshd exited: %s", log.String())
				return false
			default:
			}
			if time.Now().After(deadline) {
				stop()
				t.Fatalf("sshd does not accept connections on %s:%d: %s", h, s.Port, log.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("sshd log:\n%s", log.String())
		}
	})
	return true
}

// Config is a client configuration for this sshd.
func (s *SSHD) Config() launch.SSHConfig {
	return launch.SSHConfig{
		Port:            s.Port,
		IdentityFile:    s.Key,
		User:            s.User,
		StartTimeout:    10 * time.Second,
		DisconnectGrace: time.Second,
	}
}

// lockedBuffer collects sshd's log, written by its process and read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
