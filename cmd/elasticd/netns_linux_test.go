package main_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	netlan "github.com/elasticd/elasticd/internal/lan"
	"github.com/elasticd/elasticd/internal/netnstest"
)

// lan is a small network of namespaces (internal/lan): a switch, and one namespace per
// machine with its address on SUBNET.i/24.
type lan struct {
	*netlan.LAN
	nss   map[string]string // machine name → namespace
	addrs map[string]string // machine name → address
}

const lanSubnet = "10.251.7"

// newLAN makes the switch and one namespace per name (addresses SUBNET.1, .2, … in order),
// deleted when the test ends with whatever still runs in them (killed by PID, and reported).
// It skips where namespaces cannot be made (no root or CAP_SYS_ADMIN, a sandbox), as bench's
// netns test does; a missing ip fails under CI (scripts/install-test-deps.sh installs it).
func newLAN(t *testing.T, names ...string) *lan {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil && os.Getenv("CI") != "" {
		t.Fatalf("ip (iproute2) not found: %v: scripts/install-test-deps.sh installs it", err)
	}
	n, err := netlan.New(fmt.Sprintf("edpart-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9), lanSubnet, names...)
	if errors.Is(err, netlan.ErrUnavailable) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, ns := range n.Namespaces() {
			netnstest.Delete(t, ns)
		}
	})
	l := &lan{LAN: n, nss: map[string]string{}, addrs: map[string]string{}}
	for _, name := range names {
		l.nss[name], l.addrs[name] = n.NS(name), n.Addr(name)
	}
	return l
}

// blackhole drops, in machine from's namespace, everything it sends to machine to: one
// direction of a partition.
func (l *lan) blackhole(t *testing.T, from, to string) {
	t.Helper()
	if err := l.Blackhole(from, to); err != nil {
		t.Fatal(err)
	}
}

// heal removes every blackhole route of the lan.
func (l *lan) heal(t *testing.T) {
	t.Helper()
	if err := l.Heal(); err != nil {
		t.Fatal(err)
	}
}

// pids lists the processes running in machine name's namespace.
func (l *lan) pids(t *testing.T, name string) []int {
	t.Helper()
	pids, err := netnstest.Pids(l.nss[name])
	if err != nil {
		t.Fatalf("ip netns pids %s: %v", l.nss[name], err)
	}
	return pids
}

// startJobIn is startJob inside machine name's namespace (ip netns exec execs elasticd, so
// the job's PID is elasticd's own).
func (l *lan) startJobIn(t *testing.T, name string, args ...string) *job {
	t.Helper()
	return l.startJobInEnv(t, name, nil, args...)
}

// startJobInEnv is startJobIn with env added to the process's environment.
func (l *lan) startJobInEnv(t *testing.T, name string, env []string, args ...string) *job {
	t.Helper()
	j := &job{t: t, done: make(chan struct{})}
	j.cmd = exec.Command("ip", append([]string{"netns", "exec", l.nss[name], binary}, args...)...)
	if env != nil {
		j.cmd.Env = append(os.Environ(), env...)
	}
	j.cmd.Stdout, j.cmd.Stderr = lockedWriter{j}, lockedWriter{j}
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { j.err = j.cmd.Wait(); close(j.done) }()
	t.Cleanup(func() {
		j.cmd.Process.Kill()
		<-j.done
		if t.Failed() {
			t.Logf("%s (%s) output:\n%s", name, strings.Join(args[:1], " "), j.output())
		}
	})
	return j
}

// stepEvent is one "event step=N world=W gen=G t=NANOS" line of rank 0.
type stepEvent struct {
	step, world, gen int
	at               time.Time
}

var stepEventRe = regexp.MustCompile(`event step=(\d+) world=(\d+) gen=(\d+) t=(\d+)`)

func stepEvents(out string) []stepEvent {
	var evs []stepEvent
	for _, m := range stepEventRe.FindAllStringSubmatch(out, -1) {
		var n [4]int64
		for i := range n {
			n[i], _ = strconv.ParseInt(m[i+1], 10, 64)
		}
		evs = append(evs, stepEvent{int(n[0]), int(n[1]), int(n[2]), time.Unix(0, n[3])})
	}
	return evs
}
