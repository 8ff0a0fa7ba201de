package main_test

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/internal/netnstest"
)

// lan is a small network of namespaces: a switch namespace holding bridge br0, and one
// namespace per machine with a veth eth0 (SUBNET.i/24) whose other end is a port of br0, as
// bench/baselines/run.sh's HOSTS mode builds it. Nothing is added to this machine's own
// namespace, so every lan may use the same subnet.
type lan struct {
	prefix string
	nss    map[string]string // machine name → namespace
	addrs  map[string]string // machine name → address
}

const lanSubnet = "10.251.7"

// ipCmd runs ip with args and says what failed.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newLAN makes the switch and one namespace per name (addresses SUBNET.1, .2, … in order),
// deleted when the test ends with whatever still runs in them (killed by PID, and reported).
// It skips where namespaces cannot be made (no root or CAP_SYS_ADMIN, a sandbox), as bench's
// netns test does; a missing ip fails under CI (scripts/install-test-deps.sh installs it).
func newLAN(t *testing.T, names ...string) *lan {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		msg := fmt.Sprintf("ip (iproute2) not found: %v: scripts/install-test-deps.sh installs it", err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	l := &lan{prefix: fmt.Sprintf("edpart-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9), nss: map[string]string{}, addrs: map[string]string{}}
	sw := l.prefix + "-sw"
	if err := ipCmd("netns", "add", sw); err != nil {
		t.Skipf("cannot create a network namespace here (needs root or CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() { netnstest.Delete(t, sw) })
	must := func(args ...string) {
		t.Helper()
		if err := ipCmd(args...); err != nil {
			t.Fatal(err)
		}
	}
	must("-n", sw, "link", "set", "lo", "up")
	must("-n", sw, "link", "add", "br0", "type", "bridge")
	must("-n", sw, "link", "set", "br0", "up")
	for i, name := range names {
		ns := fmt.Sprintf("%s-%d", l.prefix, i+1)
		must("netns", "add", ns)
		t.Cleanup(func() { netnstest.Delete(t, ns) })
		port := fmt.Sprintf("p%d", i+1)
		addr := fmt.Sprintf("%s.%d", lanSubnet, i+1)
		must("-n", ns, "link", "set", "lo", "up")
		must("-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
		must("-n", sw, "link", "set", port, "master", "br0", "up")
		must("-n", ns, "addr", "add", addr+"/24", "dev", "eth0")
		must("-n", ns, "link", "set", "eth0", "up")
		l.nss[name], l.addrs[name] = ns, addr
	}
	return l
}

// blackhole drops, in machine from's namespace, everything it sends to machine to: one
// direction of a partition (the kernel has no iptables or netem here; a route does it).
func (l *lan) blackhole(t *testing.T, from, to string) {
	t.Helper()
	if err := ipCmd("-n", l.nss[from], "route", "add", "blackhole", l.addrs[to]+"/32"); err != nil {
		t.Fatal(err)
	}
}

// heal removes every blackhole route of the lan.
func (l *lan) heal(t *testing.T) {
	t.Helper()
	for _, ns := range l.nss {
		out, err := exec.Command("ip", "-n", ns, "route", "show", "type", "blackhole").Output()
		if err != nil {
			t.Fatalf("ip -n %s route show: %v", ns, err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "blackhole" {
				if err := ipCmd("-n", ns, "route", "del", "blackhole", f[1]); err != nil {
					t.Fatal(err)
				}
			}
		}
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
