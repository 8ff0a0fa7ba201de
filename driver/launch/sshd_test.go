//go:build linux

package launch_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/launch"
)

const (
	sshdPath    = "/usr/sbin/sshd"
	installHint = "run scripts/install-test-deps.sh (installs openssh-server and openssh-client, creates /run/sshd)"
)

// sshHosts are the loopback addresses the test sshd listens on, standing for two hosts.
var sshHosts = []string{"127.0.0.2", "127.0.0.3"}

// testSSHD is a real OpenSSH sshd on loopback, run by the test and killed at its end.
type testSSHD struct {
	dir  string
	port int
	user string
	key  string // the authorised client key
}

// startSSHD starts sshd on sshHosts at one free port. Where sshd or ssh-keygen is missing the
// test is skipped, or fails when $CI is set.
func startSSHD(t *testing.T) *testSSHD {
	t.Helper()
	requireSSH(t)
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	s := &testSSHD{dir: t.TempDir(), user: u.Username}
	hostKey := filepath.Join(s.dir, "host_key")
	s.key = filepath.Join(s.dir, "client_key")
	keygen(t, hostKey)
	keygen(t, s.key)
	pub, err := os.ReadFile(s.key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.dir, "authorized_keys"), pub, 0o600); err != nil {
		t.Fatal(err)
	}
	// The port is free when chosen but may be taken before sshd binds it: then sshd exits at
	// once and another port is tried.
	for range 5 {
		s.port = freePort(t)
		if s.run(t, hostKey) {
			return s
		}
	}
	t.Fatal("sshd did not start")
	return nil
}

func requireSSH(t *testing.T) {
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

func keygen(t *testing.T, path string) {
	t.Helper()
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
}

// freePort returns a port that is free on every one of sshHosts.
func freePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", sshHosts[0]+":0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		free := true
		for _, h := range sshHosts[1:] {
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
	t.Fatal("no port free on all of", sshHosts)
	return 0
}

// run starts sshd and waits until it accepts connections; false if it exited first.
func (s *testSSHD) run(t *testing.T, hostKey string) bool {
	t.Helper()
	var conf strings.Builder
	for _, h := range sshHosts {
		fmt.Fprintf(&conf, "ListenAddress %s:%d\n", h, s.port)
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
`, hostKey, filepath.Join(s.dir, "authorized_keys"), filepath.Join(s.dir, "sshd.pid"))
	confPath := filepath.Join(s.dir, "sshd_config")
	if err := os.WriteFile(confPath, []byte(conf.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	var log buffer
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
	for _, h := range sshHosts {
		for {
			c, err := net.DialTimeout("tcp", fmt.Sprintf("%s:%d", h, s.port), time.Second)
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
				t.Fatalf("sshd does not accept connections on %s:%d: %s", h, s.port, log.String())
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

// config is a client configuration for this sshd.
func (s *testSSHD) config() launch.SSHConfig {
	return launch.SSHConfig{
		Port:            s.port,
		IdentityFile:    s.key,
		User:            s.user,
		StartTimeout:    10 * time.Second,
		DisconnectGrace: time.Second,
	}
}
