//go:build linux

package launch_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/elasticd/elasticd/driver/launch"
	"github.com/elasticd/elasticd/driver/launch/sshdtest"
	"github.com/elasticd/elasticd/proc"
)

// The ports a launcher finds are free where they are found: rank 0 can listen on them. The
// ssh launcher looks on the remote host (here a real sshd on loopback), and avoids a port
// that a socket there holds.
func TestFreePort(t *testing.T) {
	t.Parallel()
	sshd := sshdtest.Start(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for name, l := range map[string]proc.Launcher{"local": proc.NewLocal(), "ssh": launch.NewSSH(sshd.Config())} {
		f, ok := l.(proc.PortFinder)
		if !ok {
			t.Fatalf("%s launcher finds no ports", name)
		}
		seen := map[int]bool{}
		for range 5 {
			port, err := f.FreePort(t.Context(), sshdtest.Hosts[1])
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if port == busy.Addr().(*net.TCPAddr).Port {
				t.Fatalf("%s: found the port a listener holds", name)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
			if err != nil {
				t.Fatalf("%s: port %d is not free: %v", name, port, err)
			}
			ln.Close()
			seen[port] = true
		}
		if len(seen) < 3 {
			t.Fatalf("%s: ports %v: want different ports from one call to the next", name, seen)
		}
	}
	if _, err := launch.NewSSH(sshd.Config()).(proc.PortFinder).FreePort(t.Context(), "-oProxyCommand=x"); err == nil {
		t.Fatal("a host that reads as an ssh option was accepted")
	}
}
