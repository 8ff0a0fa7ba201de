package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure collectives and the machine they run on",
		Subcommands: []*cli.Command{
			benchAllreduceCommand(),
			benchRecoveryCommand(),
			benchNoticeCommand(),
			benchReportCommand(),
			benchRankCommand(),
			benchPeerCommand(),
		},
	}
}

// allreduceResult is one line of `elasticd bench allreduce --json`.
type allreduceResult struct {
	SizeBytes  int64   `json:"size_bytes"`
	Ranks      int     `json:"ranks"`
	Iters      int     `json:"iters"`
	MedianS    float64 `json:"median_s"`
	AlgbwGbps  float64 `json:"algbw_gbps"`
	BusbwGbps  float64 `json:"busbw_gbps"`
	MemcpyGbps float64 `json:"memcpy_gbps,omitempty"`
	TCPGbps    float64 `json:"tcp_gbps,omitempty"`
	RTTS       float64 `json:"rtt_s,omitempty"`
	// Ratios measured side by side in this run (0 when --no-baseline).
	BusbwVsTCP    float64 `json:"busbw_vs_tcp,omitempty"`
	BusbwVsMemcpy float64 `json:"busbw_vs_memcpy,omitempty"`
	MedianVsRTT   float64 `json:"median_vs_rtt,omitempty"`
}

func benchAllreduceCommand() *cli.Command {
	return &cli.Command{
		Name:  "allreduce",
		Usage: "time float32 sum allreduce across N local processes over loopback TCP",
		Description: `Starts --np rank processes on this machine, connected over loopback TCP as they
would be across hosts, and times a float32 sum Allreduce of each size (median of
--iters iterations; each iteration's time is the slowest rank's). In the same run it
measures the machine's own limits: single-core memcpy bandwidth, one loopback TCP
stream between two processes, and the loopback round trip, and reports the
allreduce as fractions of them, so results compare across machines.

   algbw = size / median time
   busbw = algbw * 2(n-1)/n     (bytes each rank moves in a ring; compare with links)

Sizes take B, KB, MB, GB (powers of 1024) and must be multiples of 4 bytes.
Example: elasticd bench allreduce --np 4 --sizes 4KB,64MB,256MB --json`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "np", Value: 2, Usage: "number of rank processes (1-64)", EnvVars: []string{"ELASTICD_NP"}},
			&cli.StringFlag{Name: "sizes", Value: "4KB,64KB,1MB,16MB,64MB", Usage: "comma-separated message sizes", EnvVars: []string{"ELASTICD_SIZES"}},
			&cli.IntFlag{Name: "iters", Usage: "timed iterations per size (0: about 1 GB of traffic per size, 5 to 500)", EnvVars: []string{"ELASTICD_ITERS"}},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object per size instead of a table", EnvVars: []string{"ELASTICD_JSON"}},
			&cli.BoolFlag{Name: "no-baseline", Usage: "skip measuring memcpy, loopback TCP and round trip", EnvVars: []string{"ELASTICD_NO_BASELINE"}},
			&cli.IntFlag{Name: "chunk-bytes", Usage: "ring pipelining chunk (0: library default)", EnvVars: []string{"ELASTICD_CHUNK_BYTES"}},
			&cli.IntFlag{Name: "small-bytes", Usage: "largest message sent by recursive doubling (0: library default)", EnvVars: []string{"ELASTICD_SMALL_BYTES"}},
			&cli.DurationFlag{Name: "timeout", Value: time.Minute, Usage: "how long a rank waits on a silent peer", EnvVars: []string{"ELASTICD_TIMEOUT"}},
			&cli.StringFlag{Name: "cpuprofile", Usage: "write each rank's CPU profile to `DIR`/rank-N.pprof (for go tool pprof)", EnvVars: []string{"ELASTICD_CPUPROFILE"}},
		},
		Action: benchAllreduce,
	}
}

type benchOptions struct {
	np, iters, chunk, small int
	sizes                   []int64
	timeout                 time.Duration
	profileDir              string
}

func parseBenchFlags(c *cli.Context) (benchOptions, error) {
	o := benchOptions{np: c.Int("np"), iters: c.Int("iters"), chunk: c.Int("chunk-bytes"), small: c.Int("small-bytes"), timeout: c.Duration("timeout"), profileDir: c.String("cpuprofile")}
	var err error
	switch {
	case o.np < 1 || o.np > 64:
		return o, usageError("np", "%d ranks: must be between 1 and 64", o.np)
	case o.iters < 0 || o.iters > 100000:
		return o, usageError("iters", "%d: must be between 0 (automatic) and 100000", o.iters)
	case o.chunk < 0 || (o.chunk > 0 && o.chunk < 64) || o.chunk > 64<<20:
		return o, usageError("chunk-bytes", "%d: must be 0 (default) or between 64 and %d", o.chunk, 64<<20)
	case o.small < 0:
		return o, usageError("small-bytes", "%d: must not be negative", o.small)
	case o.timeout <= 0:
		return o, usageError("timeout", "%v: must be positive, e.g. 30s", o.timeout)
	}
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return o, usageError("cpuprofile", "%v", err)
		}
	}
	if o.sizes, err = parseSizes(c.String("sizes")); err != nil {
		return o, usageError("sizes", "%v", err)
	}
	return o, nil
}

// parseSizes reads "4KB,64MB,1GB"; units are powers of 1024.
func parseSizes(s string) ([]int64, error) {
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

func benchAllreduce(c *cli.Context) error {
	o, err := parseBenchFlags(c)
	if err != nil {
		return err
	}
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("bench allreduce takes no arguments, got %q (sizes go in --sizes)", c.Args().First()), 2)
	}
	ctx := c.Context
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable to start ranks: %w", err)
	}
	var m machine
	if !c.Bool("no-baseline") {
		if m, err = measureMachine(ctx, self); err != nil {
			return fmt.Errorf("measure machine: %w", err)
		}
	}
	results, err := runRanks(ctx, self, o)
	if err != nil {
		return err
	}
	for i := range results {
		results[i].addBaseline(m)
	}
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		for _, r := range results {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	printTable(c.App.Writer, o.np, m, results)
	return nil
}

func (r *allreduceResult) addBaseline(m machine) {
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
func runRanks(ctx context.Context, self string, o benchOptions) ([]allreduceResult, error) {
	dir, err := os.MkdirTemp("", "elasticd-bench-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	sizes := make([]string, len(o.sizes))
	for i, s := range o.sizes {
		sizes[i] = strconv.FormatInt(s, 10)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		errs    []error
		results []allreduceResult
	)
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for r := range o.np {
		args := []string{"bench", "allreduce-rank", "--rank", strconv.Itoa(r), "--np", strconv.Itoa(o.np),
			"--store", dir, "--sizes", strings.Join(sizes, ","), "--iters", strconv.Itoa(o.iters),
			"--chunk-bytes", strconv.Itoa(o.chunk), "--small-bytes", strconv.Itoa(o.small), "--timeout", o.timeout.String()}
		if o.profileDir != "" {
			args = append(args, "--cpuprofile", filepath.Join(o.profileDir, fmt.Sprintf("rank-%d.pprof", r)))
		}
		cmd := exec.CommandContext(ctx, self, args...)
		cmd.SysProcAttr = childProcAttr()
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start rank %d: %w", r, err)
		}
		wg.Go(func() {
			var lines []allreduceResult
			sc := bufio.NewScanner(out)
			var perr error
			for sc.Scan() {
				var res allreduceResult
				if err := json.Unmarshal(sc.Bytes(), &res); err != nil {
					perr = fmt.Errorf("rank %d printed %q: %w", r, sc.Text(), err)
					continue
				}
				lines = append(lines, res)
			}
			err := cmd.Wait()
			mu.Lock()
			defer mu.Unlock()
			if err != nil || perr != nil {
				errs = append(errs, fmt.Errorf("rank %d: %w", r, cmp.Or(err, perr)))
				cancel() // one rank failing dooms the run: stop the others now
				return
			}
			if r == 0 {
				results = lines
			}
		})
	}
	wg.Wait()
	if err := parent.Err(); err != nil {
		return nil, fmt.Errorf("allreduce benchmark interrupted: %w", err)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("allreduce benchmark failed: %w", errs[0]) // the first to fail; the rest were stopped
	}
	if len(results) != len(o.sizes) {
		return nil, fmt.Errorf("allreduce benchmark: rank 0 reported %d results for %d sizes", len(results), len(o.sizes))
	}
	return results, nil
}

func printTable(w io.Writer, np int, m machine, results []allreduceResult) {
	fmt.Fprintf(w, "allreduce: float32 sum, %d rank processes on loopback TCP, median of iterations\n", np)
	if m.memcpyGbps > 0 {
		fmt.Fprintf(w, "machine:   memcpy %.2f GB/s (one core), TCP %.2f GB/s (one loopback stream), round trip %s\n\n",
			m.memcpyGbps, m.tcpGbps, fmtDur(m.rttS))
	} else {
		fmt.Fprintln(w)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "size\titers\tmedian\talgbw GB/s\tbusbw GB/s\t"
	if m.memcpyGbps > 0 {
		head += "busbw/tcp\tbusbw/memcpy\tmedian/rtt\t"
	}
	fmt.Fprintln(tw, head)
	for _, r := range results {
		line := fmt.Sprintf("%s\t%d\t%s\t%.3f\t%.3f\t", fmtSize(r.SizeBytes), r.Iters, fmtDur(r.MedianS), r.AlgbwGbps, r.BusbwGbps)
		if m.memcpyGbps > 0 {
			line += fmt.Sprintf("%.2f\t%.2f\t%.1f\t", r.BusbwVsTCP, r.BusbwVsMemcpy, r.MedianVsRTT)
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
}

func fmtSize(b int64) string {
	switch {
	case b >= 1<<30 && b%(1<<30) == 0:
		return fmt.Sprintf("%dGB", b>>30)
	case b >= 1<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%dMB", b>>20)
	case b >= 1<<10 && b%(1<<10) == 0:
		return fmt.Sprintf("%dKB", b>>10)
	}
	return fmt.Sprintf("%dB", b)
}

func fmtDur(s float64) string {
	return time.Duration(math.Round(s * 1e9)).Round(100 * time.Nanosecond).String()
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
