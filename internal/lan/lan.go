// Package lan builds a small network of Linux network namespaces on this machine, for the
// tests and the soak that cut, throttle and heal links between hosts: a switch namespace
// holding bridge br0, and one namespace per machine with a veth eth0 (SUBNET.i/24, i from 1
// in the order given) whose other end is a port of br0, as bench/baselines/run.sh's HOSTS
// mode builds it. Nothing is added to this machine's own namespace, so every LAN may use the
// same subnet. It needs root (or CAP_SYS_ADMIN) and iproute2; Throttle needs tc.
package lan

import (
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// ErrUnavailable wraps the reason New cannot make namespaces here (no iproute2, no root, a
// sandbox): callers skip what needs them.
var ErrUnavailable = errors.New("network namespaces are not available here")

// LAN is a switch and its machines, each in its own namespace.
type LAN struct {
	sw    string
	names []string          // in the order given to New
	nss   map[string]string // machine name → namespace
	addrs map[string]string // machine name → address
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// New makes the switch namespace PREFIX-sw and a namespace PREFIX-i per name, addressed
// SUBNET.i (subnet: three octets, e.g. "10.251.7"). The prefix must be unique on this machine
// (a PID in it); namespace names are limited to 255 bytes. On an error, what was made is
// deleted again.
func New(prefix, subnet string, names ...string) (*LAN, error) {
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("%w: ip (iproute2) not found: %v", ErrUnavailable, err)
	}
	l := &LAN{sw: prefix + "-sw", nss: map[string]string{}, addrs: map[string]string{}}
	if err := ip("netns", "add", l.sw); err != nil {
		return nil, fmt.Errorf("%w (needs root or CAP_SYS_ADMIN): %v", ErrUnavailable, err)
	}
	steps := [][]string{
		{"-n", l.sw, "link", "set", "lo", "up"},
		{"-n", l.sw, "link", "add", "br0", "type", "bridge"},
		{"-n", l.sw, "link", "set", "br0", "up"},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			l.Close()
			return nil, err
		}
	}
	for i, name := range names {
		if _, dup := l.nss[name]; dup {
			l.Close()
			return nil, fmt.Errorf("lan: machine %q named twice", name)
		}
		ns := prefix + "-" + strconv.Itoa(i+1)
		if err := ip("netns", "add", ns); err != nil {
			l.Close()
			return nil, err
		}
		l.names = append(l.names, name)
		l.nss[name], l.addrs[name] = ns, subnet+"."+strconv.Itoa(i+1)
		port := "p" + strconv.Itoa(i+1)
		for _, s := range [][]string{
			{"-n", ns, "link", "set", "lo", "up"},
			{"-n", l.sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns},
			{"-n", l.sw, "link", "set", port, "master", "br0", "up"},
			{"-n", ns, "addr", "add", l.addrs[name] + "/24", "dev", "eth0"},
			{"-n", ns, "link", "set", "eth0", "up"},
		} {
			if err := ip(s...); err != nil {
				l.Close()
				return nil, err
			}
		}
	}
	return l, nil
}

// NS is machine name's namespace; Addr its address.
func (l *LAN) NS(name string) string   { return l.nss[name] }
func (l *LAN) Addr(name string) string { return l.addrs[name] }

// Namespaces are every namespace of the LAN, the switch's last.
func (l *LAN) Namespaces() []string {
	out := make([]string, 0, len(l.names)+1)
	for _, n := range l.names {
		out = append(out, l.nss[n])
	}
	return append(out, l.sw)
}

// Command is the argv that runs prog with args inside machine name's namespace: ip netns
// exec execs prog, so the process started is prog itself, with its own PID.
func (l *LAN) Command(name, prog string, args ...string) []string {
	return append([]string{"ip", "netns", "exec", l.nss[name], prog}, args...)
}

// Blackhole drops, in machine from's namespace, everything it sends to machine to: one
// direction of a partition (a route does it where the kernel has no iptables or netem).
func (l *LAN) Blackhole(from, to string) error {
	return ip("-n", l.nss[from], "route", "add", "blackhole", l.addrs[to]+"/32")
}

// Heal removes every blackhole route of the LAN.
func (l *LAN) Heal() error {
	var errs []error
	for _, name := range l.names {
		ns := l.nss[name]
		out, err := exec.Command("ip", "-n", ns, "route", "show", "type", "blackhole").Output()
		if err != nil {
			errs = append(errs, fmt.Errorf("ip -n %s route show type blackhole: %v", ns, err))
			continue
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "blackhole" {
				if err := ip("-n", ns, "route", "del", "blackhole", f[1]); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// Throttle puts tc's token bucket on machine name's egress (eth0): rate, burst, and
// packets that would queue past latency dropped, which is delay and loss where the kernel
// has no netem. Unthrottle takes it away.
func (l *LAN) Throttle(name, rate, burst, latency string) error {
	return tc(l.nss[name], "add", "dev", "eth0", "root", "tbf", "rate", rate, "burst", burst, "latency", latency)
}

// Unthrottle removes Throttle's token bucket from machine name's eth0.
func (l *LAN) Unthrottle(name string) error { return tc(l.nss[name], "del", "dev", "eth0", "root") }

func tc(ns string, args ...string) error {
	out, err := exec.Command("tc", append([]string{"-n", ns, "qdisc"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("tc -n %s qdisc %s: %v: %s", ns, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Pids lists the processes running in namespace ns.
func Pids(ns string) ([]int, error) {
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// Close deletes every namespace of the LAN; the veths go with them. Stop what runs in them
// first (Pids): a namespace is deleted from view at once, but lives on while a process holds it.
func (l *LAN) Close() error {
	var errs []error
	for _, ns := range l.Namespaces() {
		if err := ip("netns", "delete", ns); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
