package main_test

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// partition is one way to cut host h off: the blackhole routes it adds, and how soon the job
// must go on without h (0: as soon as the driver finds out, only measured and logged). steps
// bounds the job's length from below (20 ms a step): long enough to see the cut, the heal
// and the growth back to 3 before it ends.
type partition struct {
	name  string
	cut   func(t *testing.T, l *lan, cut, peers []string)
	bound time.Duration
	steps int
	hosts int  // 3 unless given
	cuts  int  // how many hosts are cut off: 1 unless given
	torch bool // PyTorch in-process (bench/pytorch/soak_train.py, elasticd.torch on gloo) instead of the Go demo trainer
}

const partitionCommTimeout = 2 * time.Second

// TestNetworkPartitions runs the real binaries across network namespaces: a driver and three
// agent hosts, each in its own namespace, joined through a bridge in a switch namespace. A
// 3-worker job (--min-np 2, a commit per step) trains; one host that does not hold rank 0 is
// then cut off with blackhole routes: from the driver, from its peers, or on one side only.
// The job must go on with the other two (within --comm-timeout + 2 s where the peers see the
// cut; when only the driver does, as soon as it finds out, which is measured), never train a
// step twice beyond the one uncommitted step, never train two generations at once, take the
// host back once the cut heals (the job grows to 3 again), finish with exit 0, and leave no
// process behind in any namespace.
//
// Loss and delay on a link (rather than a cut) come from tc's token bucket (slowLinkJob): this
// kernel has no netem.
func TestNetworkPartitions(t *testing.T) {
	cases := []partition{
		// The driver finds out when the agent's lease (--agent-lease, 6 s here) runs out: it
		// counts the worker lost and tells the others to reset at their next step.
		{name: "from-driver", steps: 1500, cut: func(t *testing.T, l *lan, cut, _ []string) {
			l.blackhole(t, cut[0], "driver")
			l.blackhole(t, "driver", cut[0])
		}},
		// The agent's requests still reach the driver on connections it had open, each
		// until the agent's own timeout gives it up (with the default 30 s lease this took
		// 65 s; with 6 s, the lease ends it first).
		{name: "asymmetric-driver-to-host", steps: 1500, cut: func(t *testing.T, l *lan, cut, _ []string) {
			l.blackhole(t, "driver", cut[0]) // the host's packets reach the driver; no answer comes back
		}},
		{name: "from-peers", bound: partitionCommTimeout + 2*time.Second, steps: 1000, cut: cutBothWays},
		{name: "asymmetric-host-to-peers", bound: partitionCommTimeout + 2*time.Second, steps: 1000, cut: func(t *testing.T, l *lan, cut, peers []string) {
			for _, p := range peers {
				l.blackhole(t, cut[0], p) // the peers' packets reach the host; none of its own leave
			}
		}},
		// Two hosts of four cut off at once, from the others and from each other (a rack
		// losing its uplink, say): the largest group that reaches itself, the other two, goes on.
		{name: "two-hosts-from-peers", bound: partitionCommTimeout + 2*time.Second, steps: 1000, hosts: 4, cuts: 2, cut: cutBothWays},
		// A split in halves, each still whole: of two equal groups, rank 0's goes on.
		{name: "split-in-halves", bound: partitionCommTimeout + 2*time.Second, steps: 1000, hosts: 4, cuts: 2, cut: func(t *testing.T, l *lan, cut, peers []string) {
			for _, h := range cut {
				for _, p := range peers {
					l.blackhole(t, h, p)
					l.blackhole(t, p, h)
				}
			}
		}},
		// The same cut under PyTorch workers: gloo's timeout, then the Python runtime's probe
		// of its ring neighbours' hosts.
		{name: "from-peers-pytorch", bound: partitionCommTimeout + 3*time.Second, steps: 700, torch: true, cut: cutBothWays},
	}
	for _, tc := range cases {
		tc.hosts, tc.cuts = cmp.Or(tc.hosts, 3), cmp.Or(tc.cuts, 1)
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			partitionJob(t, tc)
		})
	}
	t.Run("slow-lossy-link", func(t *testing.T) {
		t.Parallel()
		slowLinkJob(t)
	})
}

// slowLinkJob throttles one host's link (tc's token bucket on its egress: a low rate, and
// packets that would queue past a few milliseconds dropped: delay and loss, where the kernel
// has no netem) while a 3-worker job trains, then heals it. Whether the job resets or
// crawls on, nothing may be trained twice beyond the uncommitted step, it must keep going,
// and it must end with exit 0 and nothing left running.
func slowLinkJob(t *testing.T) {
	const steps = 900
	hosts := []string{"host-1", "host-2", "host-3"}
	l := newLAN(t, append([]string{"driver"}, hosts...)...)
	if err := l.Throttle("host-1", "1mbit", "8kb", "10ms"); err != nil {
		t.Skipf("tc's tbf qdisc is not available here: %v", err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(l.Unthrottle("host-1"))
	secret := writeSecret(t)
	listen := l.addrs["driver"] + ":29400"
	drv := l.startJobIn(t, "driver", append([]string{"run", "-np", "3", "--min-np", "2", "--launcher", "agent",
		"--agent-secret-file", secret, "--listen", listen,
		"--comm-timeout", partitionCommTimeout.String(), "--blacklist-cooldown-range", "1s,2s", "--agent-lease", "6s"},
		trainArgs("--steps", strconv.Itoa(steps), "--step-delay", "20ms", "--events", "--commit-every", "1")...)...)
	agents := map[string]agentProc{}
	for _, h := range hosts {
		agents[h] = agentProc{l.startJobIn(t, h, "agent", "--driver", "http://"+listen, "--agent-secret-file", secret,
			"--addr", l.addrs[h], "--host-id", h, "--slots", "1", "--metadata", "none")}
	}
	drv.waitFor(`event step=\d+ world=3 gen=1 `, 2*time.Minute)
	rank0 := drv.waitFor(`launched worker" worker=(host-\d)/\d+ rank=0 `, 10*time.Second)[1]
	slow := "host-1"
	if slow == rank0 {
		slow = "host-2"
	}
	drv.waitFor(`event step=100 `, time.Minute)
	// 64 kbit/s, at most 5 ms of queue: a few hundred bytes in flight, the rest dropped.
	must(l.Throttle(slow, "64kbit", "2kb", "5ms"))
	slowAt, before := time.Now(), len(stepEvents(drv.output()))
	// The job must keep training through it: 100 more steps within two minutes.
	drv.waitFor(`event step=(3\d\d|[4-9]\d\d) `, 2*time.Minute)
	during := len(stepEvents(drv.output())) - before
	must(l.Unthrottle(slow))
	t.Logf("%s's link at 64 kbit/s, 5 ms of queue: %d steps in %v", slow, during, time.Since(slowAt).Round(time.Millisecond))
	if code := drv.wait(2 * time.Minute); code != 0 {
		t.Fatalf("job exit %d, want 0\n%s", code, tail(drv.output(), 4000))
	}
	checkStepsOnce(t, stepEvents(drv.output()), steps)
	for _, h := range hosts {
		agents[h].stop(t)
	}
	for _, name := range append([]string{"driver"}, hosts...) {
		if pids := l.pids(t, name); len(pids) > 0 {
			t.Errorf("processes %v still run in %s's namespace after the job and its agents ended", pids, name)
		}
	}
}

// cutBothWays cuts each host of cut off from every other host, both ways: from the peers
// and from the other cut hosts; the driver still reaches them all.
func cutBothWays(t *testing.T, l *lan, cut, peers []string) {
	for i, h := range cut {
		for _, p := range append(slices.Clone(peers), cut[i+1:]...) {
			l.blackhole(t, h, p)
			l.blackhole(t, p, h)
		}
	}
}

func partitionJob(t *testing.T, tc partition) {
	var hosts []string
	for i := range tc.hosts {
		hosts = append(hosts, fmt.Sprintf("host-%d", i+1))
	}
	np, left := strconv.Itoa(tc.hosts), tc.hosts-tc.cuts
	l := newLAN(t, append([]string{"driver"}, hosts...)...)
	secret := writeSecret(t)
	listen := l.addrs["driver"] + ":29400"
	program := trainArgs("--steps", strconv.Itoa(tc.steps), "--step-delay", "20ms", "--events", "--commit-every", "1")
	var env []string
	if tc.torch {
		program = []string{"--", findTorchPython(t), "-u", repoPath(t, "bench/pytorch/soak_train.py"), "--history", t.TempDir(),
			"--steps", strconv.Itoa(tc.steps), "--step-delay", "0.02", "--events", "--commit-every", "1"}
		env = []string{"GLOO_SOCKET_IFNAME=eth0"} // each host's one link, not loopback
	}
	drv := l.startJobIn(t, "driver", append([]string{"run", "-np", np, "--min-np", "2", "--launcher", "agent",
		"--agent-secret-file", secret, "--listen", listen,
		"--comm-timeout", partitionCommTimeout.String(), "--blacklist-cooldown-range", "1s,2s", "--agent-lease", "6s"},
		program...)...)
	agents := map[string]agentProc{}
	for _, h := range hosts {
		agents[h] = agentProc{l.startJobInEnv(t, h, env, "agent", "--driver", "http://"+listen, "--agent-secret-file", secret,
			"--addr", l.addrs[h], "--host-id", h, "--slots", "1", "--metadata", "none")}
	}
	drv.waitFor(`event step=\d+ world=`+np+` gen=1 `, 2*time.Minute)
	rank0 := drv.waitFor(`launched worker" worker=(host-\d)/\d+ rank=0 `, 10*time.Second)[1]
	var cut, peers []string
	for _, h := range hosts {
		if h != rank0 && len(cut) < tc.cuts {
			cut = append(cut, h)
		} else {
			peers = append(peers, h)
		}
	}
	// waitEvent waits for rank 0's first step event after since that ok accepts.
	waitEvent := func(what string, since time.Time, timeout time.Duration, ok func(stepEvent) bool) stepEvent {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for {
			for _, e := range stepEvents(drv.output()) {
				if e.at.After(since) && ok(e) {
					return e
				}
			}
			select {
			case <-drv.done:
				t.Fatalf("the job ended (%v) before %s\n%s", drv.err, what, tail(drv.output(), 4000))
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("not within %v: %s\n%s", timeout, what, tail(drv.output(), 4000))
			}
		}
	}
	start := waitEvent("step 30", time.Time{}, time.Minute, func(e stepEvent) bool { return e.step >= 30 })

	cutAt := time.Now()
	tc.cut(t, l, cut, peers)
	on := waitEvent("training without the cut hosts", cutAt, 90*time.Second, func(e stepEvent) bool { return e.world == left && e.gen > start.gen })
	tookOn := on.at.Sub(cutAt)
	t.Logf("%s: %v cut off at step %d; training went on with %d workers after %v (generation %d, step %d)",
		tc.name, cut, start.step, left, tookOn.Round(time.Millisecond), on.gen, on.step)
	if tc.bound > 0 && tookOn > tc.bound {
		t.Errorf("the job went on %v after the cut; the peers see it, so within --comm-timeout + 2 s (%v)", tookOn.Round(time.Millisecond), tc.bound)
	}

	healAt := time.Now()
	l.heal(t)
	back := waitEvent("training with every worker again", healAt, 90*time.Second, func(e stepEvent) bool { return e.world == tc.hosts && e.gen > on.gen })
	t.Logf("%s: healed; training went on with %d workers again after %v (generation %d, step %d)",
		tc.name, tc.hosts, back.at.Sub(healAt).Round(time.Millisecond), back.gen, back.step)

	// Where the peers see the cut, the driver learns it from their probes.
	if tc.bound > 0 && !strings.Contains(drv.output(), "could not be reached over the network by") {
		t.Errorf("the driver failed a worker without its peers' probes naming it cut off")
	}
	// The hosts cut off are the ones the driver took out, never a healthy peer.
	failed := regexp.MustCompile(`worker failed; its slot is [^"]*"(?: rank=\d+)? worker=(host-\d)/`).FindAllStringSubmatch(drv.output(), -1)
	if len(failed) == 0 {
		t.Error("no worker was failed")
	}
	for _, m := range failed {
		if !slices.Contains(cut, m[1]) {
			t.Errorf("%s's worker was failed; only those of the hosts cut off, %v, should be", m[1], cut)
		}
	}
	if code := drv.wait(2 * time.Minute); code != 0 {
		t.Fatalf("job exit %d, want 0\n%s", code, tail(drv.output(), 4000))
	}
	checkStepsOnce(t, stepEvents(drv.output()), tc.steps)
	for _, h := range hosts {
		agents[h].stop(t)
	}
	for _, name := range append([]string{"driver"}, hosts...) {
		if pids := l.pids(t, name); len(pids) > 0 {
			t.Errorf("processes %v still run in %s's namespace after the job and its agents ended", pids, name)
		}
	}
}

// checkStepsOnce checks rank 0's step events across generations: in time order the
// generations never interleave (no two train at once), steps inside one are consecutive, a
// new generation starts at the step after its predecessor's last or redoes that one step (it
// was not committed: a commit per step), and the job ends at step total.
func checkStepsOnce(t *testing.T, evs []stepEvent, total int) {
	t.Helper()
	if len(evs) == 0 {
		t.Fatal("no step events")
	}
	byTime := slices.Clone(evs)
	slices.SortStableFunc(byTime, func(a, b stepEvent) int { return a.at.Compare(b.at) })
	var gens []string
	for i := 1; i < len(byTime); i++ {
		prev, e := byTime[i-1], byTime[i]
		switch {
		case e.gen < prev.gen:
			t.Fatalf("generation %d trained step %d after generation %d had trained step %d: two generations trained at once", e.gen, e.step, prev.gen, prev.step)
		case e.gen == prev.gen && e.step != prev.step+1:
			t.Fatalf("generation %d: step %d after step %d", e.gen, e.step, prev.step)
		case e.gen > prev.gen:
			if e.step != prev.step+1 && e.step != prev.step {
				t.Fatalf("generation %d started at step %d after generation %d's last step %d: steps lost or trained twice beyond the uncommitted one",
					e.gen, e.step, prev.gen, prev.step)
			}
			gens = append(gens, fmt.Sprintf("gen %d: world %d from step %d (redone %d)", e.gen, e.world, e.step, prev.step+1-e.step))
		}
	}
	if last := byTime[len(byTime)-1]; last.step != total {
		t.Fatalf("last step %d, want %d", last.step, total)
	}
	t.Logf("generations after the first: %s", strings.Join(gens, "; "))
}
