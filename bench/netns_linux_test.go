package bench_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/bench"
	"github.com/elasticd/elasticd/internal/netnstest"
)

// Two network namespaces joined by a veth are two hosts to allreduce: with two ranks in each,
// every rank shares memory with the other rank of its namespace and talks TCP across, and with
// one rank in each there is nothing to share. The sums are checked by the ranks themselves.
func TestAllreduceAcrossNetnsHosts(t *testing.T) {
	hosts := vethHosts(t)
	for _, tc := range []struct {
		np, perHost int
	}{{4, 2}, {2, 1}} {
		t.Run(fmt.Sprintf("%dx%d", len(hosts), tc.perHost), func(t *testing.T) {
			var out bytes.Buffer
			var stderr syncBuffer
			res, err := bench.Allreduce(bounded(t), bench.AllreduceOptions{Exe: binary, NP: tc.np, Hosts: hosts,
				Sizes: []int64{4 << 10, 1<<20 + 4}, Iters: 3, Timeout: 30 * time.Second, Out: &out, Err: &stderr})
			if err != nil {
				t.Fatalf("%v: %s", err, stderr.String())
			}
			if !strings.Contains(out.String(), fmt.Sprintf("on 2 hosts (network namespaces) x %d", tc.perHost)) {
				t.Errorf("table does not say where the ranks ran:\n%s", out.String())
			}
			for _, r := range res {
				if r.Hosts != 2 || r.PerHost != tc.perHost || len(r.RankShmPeers) != tc.np || len(r.RankTCPPeers) != tc.np {
					t.Fatalf("%d bytes: %+v, want hosts 2, per_host %d and counts for %d ranks", r.SizeBytes, r, tc.perHost, tc.np)
				}
				tcpByHost := make([]int, 2)
				for rank := range tc.np {
					// Same namespace: shared memory with each other rank there; another
					// namespace: never, whatever the algorithm's neighbours are.
					if got := r.RankShmPeers[rank]; got != tc.perHost-1 {
						t.Errorf("%d bytes: rank %d reached %d peers over shared memory, want %d (its namespace's other ranks): %v",
							r.SizeBytes, rank, got, tc.perHost-1, r.RankShmPeers)
					}
					tcpByHost[rank/tc.perHost] += r.RankTCPPeers[rank]
				}
				// The hosts' sums only meet over TCP: some rank of each host has a TCP peer.
				if tcpByHost[0] == 0 || tcpByHost[1] == 0 {
					t.Errorf("%d bytes: TCP peers by rank %v: a host with no TCP peer", r.SizeBytes, r.RankTCPPeers)
				}
			}
		})
	}
}

// vethHosts makes two network namespaces joined by one veth pair (eth0 in each, 10.251.255.1
// and .2), deleted when the test ends along with any process left in them, or skips the test
// where namespaces cannot be made (no root, no iproute2, a sandbox without the permission).
func vethHosts(t *testing.T) []bench.NetnsHost {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skipf("ip (iproute2) not found: %v", err)
	}
	prefix := fmt.Sprintf("elasticd-test-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)
	a, b := prefix+"-a", prefix+"-b"
	ip := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if err := ip("netns", "add", a); err != nil {
		t.Skipf("cannot create a network namespace here (needs root or CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() { netnstest.Delete(t, a) })
	if err := ip("netns", "add", b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netnstest.Delete(t, b) })
	for _, args := range [][]string{
		{"-n", a, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", b},
		{"-n", a, "addr", "add", "10.251.255.1/24", "dev", "eth0"},
		{"-n", b, "addr", "add", "10.251.255.2/24", "dev", "eth0"},
		{"-n", a, "link", "set", "eth0", "up"},
		{"-n", b, "link", "set", "eth0", "up"},
		{"-n", a, "link", "set", "lo", "up"},
		{"-n", b, "link", "set", "lo", "up"},
	} {
		if err := ip(args...); err != nil {
			t.Fatal(err)
		}
	}
	return []bench.NetnsHost{{Netns: a, Addr: "10.251.255.1"}, {Netns: b, Addr: "10.251.255.2"}}
}
