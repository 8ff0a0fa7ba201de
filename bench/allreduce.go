package bench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/elasticd/elasticd/allreduce"
)

// AllreduceResult is one size of an allreduce benchmark: one line of
// `elasticd bench allreduce --json`.
type AllreduceResult struct {
	SizeBytes int64   `json:"size_bytes"`
	Ranks     int     `json:"ranks"`
	Iters     int     `json:"iters"`
	MedianS   float64 `json:"median_s"`
	// P10S and P90S are the 10th and 90th percentiles of the iterations: on a shared machine
	// (and over veth) the times are often bimodal, and the median alone hides which mode won.
	P10S       float64 `json:"p10_s"`
	P90S       float64 `json:"p90_s"`
	AlgbwGbps  float64 `json:"algbw_gbps"`
	BusbwGbps  float64 `json:"busbw_gbps"`
	MemcpyGbps float64 `json:"memcpy_gbps,omitempty"`
	TCPGbps    float64 `json:"tcp_gbps,omitempty"`
	RTTS       float64 `json:"rtt_s,omitempty"`
	// ShmPeers is how many of rank 0's peers it reached over shared memory (0: all over TCP),
	// TCPPeers how many over TCP.
	ShmPeers int `json:"shm_peers"`
	TCPPeers int `json:"tcp_peers"`
	// The same counts for every rank, indexed by rank: which pairs shared memory is a
	// property of the whole world, not of rank 0 alone.
	RankShmPeers []int `json:"rank_shm_peers,omitempty"`
	RankTCPPeers []int `json:"rank_tcp_peers,omitempty"`
	// NonTemporal says whether rank 0 copied this size into shared memory with non-temporal
	// stores (allreduce.Stats.NonTemporalFrom; ELASTICD_SHM_NONTEMPORAL).
	NonTemporal bool `json:"non_temporal,omitempty"`
	// Direct says whether the ranks reduced this size by reading each other's buffers
	// (allreduce.Stats.DirectFrom; --direct-bytes, ELASTICD_SHM_DIRECT) rather than through
	// the shared-memory rings.
	Direct bool `json:"direct,omitempty"`
	// Hosts and PerHost describe a cross-host run (AllreduceOptions.Hosts): Hosts network
	// namespaces with PerHost ranks each; 0 when every rank ran in this one.
	Hosts   int `json:"hosts,omitempty"`
	PerHost int `json:"per_host,omitempty"`
	// Ratios measured side by side in this run (0 when --no-baseline).
	BusbwVsTCP    float64 `json:"busbw_vs_tcp,omitempty"`
	BusbwVsMemcpy float64 `json:"busbw_vs_memcpy,omitempty"`
	MedianVsRTT   float64 `json:"median_vs_rtt,omitempty"`
}

// AllreduceOptions configure Allreduce; the flags of `elasticd bench allreduce`.
type AllreduceOptions struct {
	Exe        string  // the elasticd binary the ranks and the peer run as ("": this process's)
	NP         int     // rank processes, 1 to 64
	Sizes      []int64 // message sizes in bytes, multiples of 4 (ParseSizes reads them)
	Iters      int     // timed iterations per size (0: about 1 GB of traffic per size, 5 to 500)
	ChunkBytes int     // ring pipelining chunk (0: library default)
	SmallBytes int     // largest message sent by recursive doubling (0: library default)
	// TCPSendBuffer is allreduce.Config.TCPSendBuffer: 0 the library's default (256 KiB on
	// veth under BBR), negative the kernel's autotuning, positive this size.
	TCPSendBuffer int
	// DirectBytes is allreduce.Config.DirectBytes: the smallest message that ranks on one
	// host reduce by reading each other's buffers (0: as the machine suggests, -1: never).
	DirectBytes int
	Transport   string        // allreduce.Config.Transport: "auto" (""), or "tcp" to keep ranks off shared memory
	Timeout     time.Duration // how long a rank waits on a silent peer
	ProfileDir  string        // each rank's CPU profile goes to ProfileDir/rank-N.pprof ("": none)
	NoBaseline  bool          // skip measuring memcpy, loopback TCP and round trip
	// Hosts, when set, simulates that many hosts: NP/len(Hosts) ranks run in each host's
	// network namespace (ranks 0 to NP/len(Hosts)-1 in the first, and so on), started through
	// `ip netns exec` and listening on the host's address, so that ranks of different hosts
	// talk TCP over whatever joins the namespaces. The ranks still meet in a directory on the
	// shared filesystem. The machine baseline is not measured (it would be loopback's).
	Hosts []NetnsHost
	JSON  bool      // one JSON object per size instead of a table
	Out   io.Writer // the results (nil: discarded)
	Err   io.Writer // the ranks' and the peer's stderr, written to one at a time (nil: discarded)
}

// NetnsHost is one simulated host of a cross-host run: a named network namespace (one that
// `ip netns add` made) and an address of it that the other namespaces reach.
type NetnsHost struct {
	Netns string
	Addr  string // an IP address, without a port
}

// ParseNetnsHosts reads "NS=ADDR,NS=ADDR", e.g. "h1=10.99.0.1,h2=10.99.0.2".
func ParseNetnsHosts(s string) ([]NetnsHost, error) {
	var out []NetnsHost
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		ns, addr, ok := strings.Cut(f, "=")
		if !ok || ns == "" || strings.ContainsAny(ns, "/ ") || net.ParseIP(addr) == nil {
			return nil, fmt.Errorf("%q: want NAMESPACE=IP, e.g. h1=10.99.0.1", f)
		}
		out = append(out, NetnsHost{Netns: ns, Addr: addr})
	}
	return out, nil
}

// Validate checks the options that do not depend on Sizes, in the order the command reports
// them; Allreduce checks Sizes too.
func (o *AllreduceOptions) Validate() error {
	switch {
	case o.NP < 1 || o.NP > 64:
		return usageError("np", "%d ranks: must be between 1 and 64", o.NP)
	case o.Iters < 0 || o.Iters > 100000:
		return usageError("iters", "%d: must be between 0 (automatic) and 100000", o.Iters)
	case o.ChunkBytes < 0 || (o.ChunkBytes > 0 && o.ChunkBytes < 64) || o.ChunkBytes > 64<<20:
		return usageError("chunk-bytes", "%d: must be 0 (default) or between 64 and %d", o.ChunkBytes, 64<<20)
	case o.SmallBytes < 0:
		return usageError("small-bytes", "%d: must not be negative", o.SmallBytes)
	case o.TCPSendBuffer > 64<<20:
		return usageError("tcp-send-buffer", "%d: must be at most %d (0: the default, -1: the kernel's autotuning)", o.TCPSendBuffer, 64<<20)
	case o.DirectBytes < -1:
		return usageError("direct-bytes", "%d: must be 0 (as the machine suggests), a size in bytes, or -1 (never)", o.DirectBytes)
	case o.Transport != "" && o.Transport != allreduce.TransportAuto && o.Transport != allreduce.TransportTCP:
		return usageError("transport", "%q: must be %s or %s", o.Transport, allreduce.TransportAuto, allreduce.TransportTCP)
	case o.Timeout <= 0:
		return usageError("timeout", "%v: must be positive, e.g. 30s", o.Timeout)
	case len(o.Hosts) > 0 && o.NP%len(o.Hosts) != 0:
		return usageError("netns-hosts", "%d ranks do not divide among %d hosts: give --np a multiple of the host count", o.NP, len(o.Hosts))
	}
	for _, h := range o.Hosts {
		if h.Netns == "" || net.ParseIP(h.Addr) == nil {
			return usageError("netns-hosts", "%q=%q: want a namespace name and an IP address", h.Netns, h.Addr)
		}
	}
	return nil
}

// MakeProfileDir creates ProfileDir when one is set.
func (o *AllreduceOptions) MakeProfileDir() error {
	if o.ProfileDir == "" {
		return nil
	}
	if err := os.MkdirAll(o.ProfileDir, 0o755); err != nil {
		return usageError("cpuprofile", "%v", err)
	}
	return nil
}

// ParseSizes reads "4KB,64MB,1GB"; units are powers of 1024.
func ParseSizes(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := parseSize(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%q: give at least one size, e.g. 4KB,64MB", s)
	}
	return out, nil
}

func parseSize(f string) (int64, error) {
	u := strings.ToUpper(f)
	mult := int64(1)
	for _, s := range []struct {
		suffix string
		mult   int64
	}{{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(u, s.suffix) {
			u, mult = strings.TrimSuffix(u, s.suffix), s.mult
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(u), 10, 64)
	switch {
	case err != nil || n < 0:
		return 0, fmt.Errorf("%q is not a size (use e.g. 4096, 4KB, 64MB, 1GB)", f)
	case n*mult > 4<<30 || n > 4<<30:
		return 0, fmt.Errorf("%q is larger than 4GB", f)
	case n*mult%4 != 0:
		return 0, fmt.Errorf("%q is not a multiple of 4 bytes (the elements are float32)", f)
	}
	return n * mult, nil
}

// autoIters aims at about 1 GB of traffic per size, within [5, 500] iterations.
func autoIters(size int64) int {
	if size == 0 {
		return 500
	}
	return int(min(500, max(5, (1<<30)/size)))
}

// Allreduce starts NP rank processes (`Exe bench allreduce-rank`) connected over shared
// memory (or loopback TCP, with Transport "tcp"; TCP between hosts, with Hosts), times a
// float32 sum allreduce of each size, and, unless NoBaseline, measures this machine's memcpy,
// loopback TCP stream and round trip in the same run. It prints the results to Out as a table
// or JSON lines and returns them.
func Allreduce(ctx context.Context, o AllreduceOptions) ([]AllreduceResult, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if err := o.MakeProfileDir(); err != nil {
		return nil, err
	}
	if len(o.Sizes) == 0 {
		return nil, usageError("sizes", "give at least one size, e.g. 4KB,64MB")
	}
	for _, s := range o.Sizes {
		if s < 0 || s > 4<<30 || s%4 != 0 {
			return nil, usageError("sizes", "%d bytes: want a multiple of 4 bytes up to 4GB", s)
		}
	}
	out, _ := writers(o.Out, nil)
	var errw io.Writer // the ranks' and the peer's stderr; none goes to the null device
	if o.Err != nil {
		errw = shared(o.Err)
	}
	self, err := executable(o.Exe)
	if err != nil {
		return nil, fmt.Errorf("find own executable to start ranks: %w", err)
	}
	var m machine
	if !o.NoBaseline && len(o.Hosts) == 0 {
		if m, err = measureMachine(ctx, self, errw); err != nil {
			return nil, fmt.Errorf("measure machine: %w", err)
		}
	}
	results, err := runRanks(ctx, self, errw, o)
	if err != nil {
		return nil, err
	}
	for i := range results {
		results[i].addBaseline(m)
	}
	if o.JSON {
		enc := json.NewEncoder(out)
		for _, r := range results {
			if err := enc.Encode(r); err != nil {
				return nil, err
			}
		}
		return results, nil
	}
	printTable(out, o.NP, len(o.Hosts), m, results)
	return results, nil
}

func (r *AllreduceResult) addBaseline(m machine) {
	if m.memcpyGbps == 0 {
		return
	}
	r.MemcpyGbps, r.TCPGbps, r.RTTS = m.memcpyGbps, m.tcpGbps, m.rttS
	r.BusbwVsMemcpy = r.BusbwGbps / m.memcpyGbps
	r.BusbwVsTCP = r.BusbwGbps / m.tcpGbps
	r.MedianVsRTT = r.MedianS / m.rttS
}

// runRanks starts the rank processes, waits for all of them, and returns rank 0's results.
// Any rank failing fails the run; on ctx cancellation every rank is killed.
func runRanks(ctx context.Context, self string, stderr io.Writer, o AllreduceOptions) ([]AllreduceResult, error) {
	dir, err := os.MkdirTemp("", "elasticd-bench-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	sizes := make([]string, len(o.Sizes))
	for i, s := range o.Sizes {
		sizes[i] = strconv.FormatInt(s, 10)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		errs  []error
		lines = make([][]AllreduceResult, o.NP) // by rank
	)
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer wg.Wait() // however the loop ends, the ranks it started are killed (cancel) and waited for
	defer cancel()
	for r := range o.NP {
		args := []string{"bench", RankCommand, "--rank", strconv.Itoa(r), "--np", strconv.Itoa(o.NP),
			"--store", dir, "--sizes", strings.Join(sizes, ","), "--iters", strconv.Itoa(o.Iters),
			"--chunk-bytes", strconv.Itoa(o.ChunkBytes), "--small-bytes", strconv.Itoa(o.SmallBytes), "--tcp-send-buffer", strconv.Itoa(o.TCPSendBuffer), "--direct-bytes", strconv.Itoa(o.DirectBytes), "--timeout", o.Timeout.String(),
			"--transport", cmp.Or(o.Transport, allreduce.TransportAuto)}
		if o.ProfileDir != "" {
			args = append(args, "--cpuprofile", filepath.Join(o.ProfileDir, fmt.Sprintf("rank-%d.pprof", r)))
		}
		name := self
		if len(o.Hosts) > 0 {
			// ip execs the rank in the namespace: the PID is the rank's, and so is the signal on cancel.
			h := o.Hosts[r/(o.NP/len(o.Hosts))]
			name, args = "ip", append([]string{"netns", "exec", h.Netns, self}, append(args, "--listen", h.Addr)...)
		}
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.SysProcAttr = childProcAttr()
		cmd.Stderr = stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start rank %d: %w", r, err)
		}
		wg.Go(func() {
			var mine []AllreduceResult
			sc := bufio.NewScanner(out)
			var perr error
			for sc.Scan() {
				var res AllreduceResult
				if err := json.Unmarshal(sc.Bytes(), &res); err != nil {
					perr = fmt.Errorf("rank %d printed %q: %w", r, sc.Text(), err)
					continue
				}
				mine = append(mine, res)
			}
			err := cmd.Wait()
			mu.Lock()
			defer mu.Unlock()
			if err != nil || perr != nil {
				errs = append(errs, fmt.Errorf("rank %d: %w", r, cmp.Or(err, perr)))
				cancel() // one rank failing dooms the run: stop the others now
				return
			}
			lines[r] = mine
		})
	}
	wg.Wait()
	if err := parent.Err(); err != nil {
		return nil, fmt.Errorf("allreduce benchmark interrupted: %w", err)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("allreduce benchmark failed: %w", errs[0]) // the first to fail; the rest were stopped
	}
	for r, l := range lines {
		if len(l) != len(o.Sizes) {
			return nil, fmt.Errorf("allreduce benchmark: rank %d reported %d results for %d sizes", r, len(l), len(o.Sizes))
		}
	}
	results := lines[0]
	for i := range results {
		for r := range lines {
			results[i].RankShmPeers = append(results[i].RankShmPeers, lines[r][i].ShmPeers)
			results[i].RankTCPPeers = append(results[i].RankTCPPeers, lines[r][i].TCPPeers)
		}
		if len(o.Hosts) > 0 {
			results[i].Hosts, results[i].PerHost = len(o.Hosts), o.NP/len(o.Hosts)
		}
	}
	return results, nil
}

func printTable(w io.Writer, np, hosts int, m machine, results []AllreduceResult) {
	path := "on loopback TCP"
	switch {
	case hosts > 0:
		path = fmt.Sprintf("on %d hosts (network namespaces) x %d, over TCP between hosts", hosts, np/hosts)
		if len(results) > 0 && results[0].ShmPeers > 0 {
			path += " and shared memory inside"
		}
	case len(results) > 0 && results[0].ShmPeers > 0:
		path = "over shared memory"
	}
	fmt.Fprintf(w, "allreduce: float32 sum, %d rank processes %s, median of iterations\n", np, path)
	if m.memcpyGbps > 0 {
		fmt.Fprintf(w, "machine:   memcpy %.2f GB/s (one core), TCP %.2f GB/s (one loopback stream), round trip %s\n\n",
			m.memcpyGbps, m.tcpGbps, fmtDur(m.rttS))
	} else {
		fmt.Fprintln(w)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "size\titers\tmedian\tp10-p90\talgbw GB/s\tbusbw GB/s\t"
	if m.memcpyGbps > 0 {
		head += "busbw/tcp\tbusbw/memcpy\tmedian/rtt\t"
	}
	fmt.Fprintln(tw, head)
	for _, r := range results {
		line := fmt.Sprintf("%s\t%d\t%s\t%s-%s\t%.3f\t%.3f\t", fmtSize(r.SizeBytes), r.Iters, fmtDur(r.MedianS), fmtDur(r.P10S), fmtDur(r.P90S), r.AlgbwGbps, r.BusbwGbps)
		if m.memcpyGbps > 0 {
			line += fmt.Sprintf("%.2f\t%.2f\t%.1f\t", r.BusbwVsTCP, r.BusbwVsMemcpy, r.MedianVsRTT)
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
}
