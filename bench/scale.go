// The scale benchmark: one driver, thousands of simulated hosts.

package bench

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/elasticd/elasticd/internal/browsertest"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/worker/agent"
	wrdzv "github.com/elasticd/elasticd/worker/rendezvous"
)

// ScaleOptions configures Scale.
type ScaleOptions struct {
	Exe   string // the elasticd binary the driver runs as (`Exe run`); "": this process's
	Hosts int    // simulated hosts, each an agent
	Slots int    // workers per host
	// Reclaim is the share of hosts given a spot notice at once, within one second (0: 10 %).
	Reclaim float64
	// Timeout bounds each phase (the job's forming, the reset, the reclaim); 0: 10 minutes.
	Timeout time.Duration
	JSON    bool
	Out     io.Writer
	Err     io.Writer
}

// ScaleResult is one run. The times are from the bench's clock: when the change was made to
// when the last worker held its place in the generation that follows it.
type ScaleResult struct {
	Hosts   int `json:"hosts"`
	Workers int `json:"workers"`
	// FormS: the driver started -> every worker placed in one generation of them all.
	FormS float64 `json:"form_s"`
	// ResetS: a worker fails (its exit and every other worker's READY, as their collectives
	// fail) -> every survivor holds its place in the next generation. ResetCPUS is the
	// driver's CPU time (user + system) over that.
	ResetS    float64 `json:"reset_s"`
	ResetCPUS float64 `json:"reset_cpu_s"`
	// ReclaimHosts were given notices within a second; ReclaimResetS: the first notice -> every
	// worker of the other hosts holds its place in a generation without them;
	// ReclaimGenerations: how many generations that took (1: one reset).
	ReclaimHosts       int     `json:"reclaim_hosts"`
	ReclaimResetS      float64 `json:"reclaim_reset_s"`
	ReclaimGenerations int     `json:"reclaim_generations"`
	ReclaimCPUS        float64 `json:"reclaim_cpu_s"`
	// The driver's process, at its largest over the run (RSS, descriptors) and its Go heap
	// and goroutines once the job formed.
	DriverRSSBytes  int64 `json:"driver_rss_bytes"`
	DriverFDs       int   `json:"driver_fds"`
	DriverHeapBytes int64 `json:"driver_heap_bytes"`
	Goroutines      int   `json:"driver_goroutines"`
	// GET /v1/status and /metrics: median time over 5 requests, and size.
	StatusMS     float64 `json:"status_ms"`
	StatusBytes  int     `json:"status_bytes"`
	MetricsMS    float64 `json:"metrics_ms"`
	MetricsBytes int     `json:"metrics_bytes"`
	PageBytes    int     `json:"page_bytes"`
	// What the live page costs: GET /v1/status?limit=100, the page of hosts it asks for each
	// second (median of 5, and size), and its first paint in headless Chromium, from the
	// navigation to the job drawn (median of 3; -1 without a Chromium).
	PageStatusMS    float64 `json:"page_status_ms"`
	PageStatusBytes int     `json:"page_status_bytes"`
	PagePaintMS     float64 `json:"page_paint_ms"`
}

// Scale runs the driver (`elasticd run --launcher agent`, in its own process) with
// o.Hosts simulated agents on loopback, each holding one session stream and running
// o.Slots simulated workers that speak the real worker protocol over it, and measures what a
// job of that size costs the driver. See the `bench scale` command for what it does.
func Scale(ctx context.Context, o ScaleOptions) (ScaleResult, error) {
	switch {
	case o.Hosts < 2 || o.Hosts > 100000:
		return ScaleResult{}, usageError("hosts", "%d: want 2 to 100000", o.Hosts)
	case o.Slots < 1 || o.Slots > 64:
		return ScaleResult{}, usageError("slots", "%d: want 1 to 64", o.Slots)
	case o.Reclaim < 0 || o.Reclaim >= 0.5:
		return ScaleResult{}, usageError("reclaim", "%v: want a share of the hosts below 0.5 (0 for 10 %%)", o.Reclaim)
	}
	o.Reclaim = cmp.Or(o.Reclaim, 0.1)
	o.Timeout = cmp.Or(o.Timeout, 10*time.Minute)
	o.Out, o.Err = writers(o.Out, o.Err)
	exe, err := executable(o.Exe)
	if err != nil {
		return ScaleResult{}, err
	}
	o.Exe = exe
	raiseFileLimit()
	s, err := newScale(o)
	if err != nil {
		return ScaleResult{}, err
	}
	defer s.close()
	res, err := s.run(ctx)
	if err != nil {
		return res, err
	}
	if o.JSON {
		b, _ := json.Marshal(res)
		fmt.Fprintln(o.Out, string(b))
	} else {
		printScale(o.Out, res)
	}
	return res, nil
}

func printScale(w io.Writer, r ScaleResult) {
	fmt.Fprintf(w, "%d hosts, %d workers\n", r.Hosts, r.Workers)
	fmt.Fprintf(w, "  form                 %8.2f s   every worker placed\n", r.FormS)
	fmt.Fprintf(w, "  reset                %8.2f s   a worker fails -> every survivor placed (driver CPU %.2f s)\n", r.ResetS, r.ResetCPUS)
	fmt.Fprintf(w, "  reclaim              %8.2f s   %d hosts' notices within 1 s -> the rest placed without them, in %d generation(s) (driver CPU %.2f s)\n", r.ReclaimResetS, r.ReclaimHosts, r.ReclaimGenerations, r.ReclaimCPUS)
	fmt.Fprintf(w, "  driver RSS           %8.1f MiB  (%.1f KiB per host)\n", float64(r.DriverRSSBytes)/(1<<20), float64(r.DriverRSSBytes)/1024/float64(r.Hosts))
	fmt.Fprintf(w, "  driver heap          %8.1f MiB\n", float64(r.DriverHeapBytes)/(1<<20))
	fmt.Fprintf(w, "  driver descriptors   %8d\n", r.DriverFDs)
	fmt.Fprintf(w, "  driver goroutines    %8d\n", r.Goroutines)
	fmt.Fprintf(w, "  GET /v1/status       %8.1f ms   %d bytes\n", r.StatusMS, r.StatusBytes)
	fmt.Fprintf(w, "  GET /metrics         %8.1f ms   %d bytes\n", r.MetricsMS, r.MetricsBytes)
	fmt.Fprintf(w, "  GET / (live page)    %8d bytes\n", r.PageBytes)
	fmt.Fprintf(w, "  the page's status    %8.1f ms   %d bytes (GET /v1/status?limit=100)\n", r.PageStatusMS, r.PageStatusBytes)
	if r.PagePaintMS >= 0 {
		fmt.Fprintf(w, "  the page's paint     %8.1f ms   navigation -> the job drawn, headless Chromium\n", r.PagePaintMS)
	}
}

// raiseFileLimit lifts this process's descriptor limit to its hard limit: each simulated host
// holds a connection, and so does the driver (its child, which inherits the limit).
func raiseFileLimit() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil && l.Cur < l.Max {
		l.Cur = l.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}

type scale struct {
	o         ScaleOptions
	dir       string
	url       string
	secret    []byte
	jobSecret []byte
	reg       *http.Client // registrations: HTTP/1.1, a few connections
	driver    *child
	procs     sync.WaitGroup
	start     time.Time
	agents    []*simAgent

	mu     sync.Mutex
	cond   chan struct{} // closed and replaced whenever a worker is placed or leaves
	placed map[uint64]int
	last   map[uint64]time.Time // when the last worker of each generation was placed
	stats  chan scaleStats      // the driver's "runtime stats" lines
}

type scaleStats struct {
	goroutines int
	heap       int64
}

var scaleStatsLine = regexp.MustCompile(`msg="runtime stats" goroutines=(\d+) heap_bytes=(\d+)`)

func newScale(o ScaleOptions) (*scale, error) {
	dir, err := os.MkdirTemp("", "elasticd-scale-")
	if err != nil {
		return nil, err
	}
	secret := make([]byte, 32)
	rand.Read(secret)
	if err := os.WriteFile(filepath.Join(dir, "agent-secret"), []byte(hex.EncodeToString(secret)), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	tr := &http.Transport{Proxy: nil, MaxConnsPerHost: 32, MaxIdleConnsPerHost: 32}
	return &scale{o: o, dir: dir, secret: []byte(hex.EncodeToString(secret)), reg: &http.Client{Transport: tr},
		cond: make(chan struct{}), placed: map[uint64]int{}, last: map[uint64]time.Time{}, stats: make(chan scaleStats, 4)}, nil
}

// close ends the job (SIGINT: the driver stops every worker, which the hosts, still there,
// answer at once), then the hosts.
func (s *scale) close() {
	if s.driver != nil && !s.driver.exited() {
		s.driver.cmd.Process.Signal(syscall.SIGINT)
		if s.driver.wait(30*time.Second) < 0 {
			s.driver.cmd.Process.Kill()
		}
	}
	for _, a := range s.agents { // all at once: one at a time, the others go on asking a gone driver
		a.stop()
	}
	for _, a := range s.agents {
		a.loops.Wait()
		a.hc.CloseIdleConnections()
	}
	s.procs.Wait()
	s.reg.CloseIdleConnections()
	os.RemoveAll(s.dir)
}

func (s *scale) say(format string, a ...any) {
	fmt.Fprintf(s.o.Err, "scale +%6.1fs "+format+"\n", append([]any{time.Since(s.start).Seconds()}, a...)...)
}

// freePort picks a loopback port for the driver.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (s *scale) run(ctx context.Context) (ScaleResult, error) {
	o := s.o
	workers := o.Hosts * o.Slots
	reclaim := max(1, int(math.Round(float64(o.Hosts)*o.Reclaim)))
	res := ScaleResult{Hosts: o.Hosts, Workers: workers, ReclaimHosts: reclaim}
	addr, err := freePort()
	if err != nil {
		return res, err
	}
	s.url = "http://" + addr
	s.start = time.Now()
	// Every host but those the reclaim takes and one more (the failed worker's) may go.
	minNP := workers - (reclaim+1)*o.Slots
	args := []string{"run", "--launcher", "agent", "--agent-secret-file", filepath.Join(s.dir, "agent-secret"), "--listen", addr,
		"--mode", "inprocess", "-np", strconv.Itoa(workers), "--min-np", strconv.Itoa(max(1, minNP)), "--max-np", strconv.Itoa(workers),
		"--blacklist-cooldown-range", "10m,10m", "--", "simulated-worker"}
	cmd, out, err := startChild(ctx, &s.procs, o.Exe, args...)
	if err != nil {
		return res, err
	}
	s.driver = &child{cmd: cmd, done: make(chan struct{})}
	s.procs.Go(func() {
		defer close(s.driver.done)
		s.readDriver(out)
	})
	s.say("driver pid %d on %s; %d simulated hosts × %d slots", cmd.Process.Pid, addr, o.Hosts, o.Slots)
	if err := s.waitListening(ctx, 30*time.Second); err != nil {
		return res, err
	}

	// The hosts register (at most 32 at a time, as agents booting together would be spread),
	// and each holds its session.
	s.agents = make([]*simAgent, o.Hosts)
	for i := range s.agents {
		s.agents[i] = newSimAgent(s, i)
	}
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	var regErr atomic.Value
	for _, a := range s.agents {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := a.register(ctx); err != nil {
				regErr.CompareAndSwap(nil, err)
				return
			}
			a.run(ctx)
		})
	}
	wg.Wait()
	if err, _ := regErr.Load().(error); err != nil {
		return res, err
	}
	s.say("%d hosts registered", o.Hosts)

	// The job forms: every worker placed in one generation of them all.
	g, err := s.waitWorld(ctx, 0, workers, nil)
	if err != nil {
		return res, fmt.Errorf("forming: %w", err)
	}
	res.FormS = time.Since(s.start).Seconds()
	s.say("generation %d: all %d workers placed", g, workers)
	s.sample(&res, true)

	// A worker fails: its exit reaches the driver, and the others report READY as their
	// collectives fail.
	victim := s.agents[o.Hosts-1]
	cpu0 := procCPU(cmd.Process.Pid)
	t0 := time.Now()
	victim.fail(ctx, victim.ids[0], g)
	for _, a := range s.agents {
		a.readyAll(ctx, g, victim.ids[0])
	}
	g2, err := s.waitWorld(ctx, g, workers-1, nil)
	if err != nil {
		return res, fmt.Errorf("the reset after a failed worker: %w", err)
	}
	res.ResetS, res.ResetCPUS = s.lastPlaced(g2).Sub(t0).Seconds(), procCPU(cmd.Process.Pid)-cpu0
	s.say("generation %d: %d survivors placed %.2f s after the failure", g2, workers-1, res.ResetS)
	s.sample(&res, false)

	res.StatusMS, res.StatusBytes = s.timeGET(ctx, "/v1/status")
	res.MetricsMS, res.MetricsBytes = s.timeGET(ctx, "/metrics")
	_, res.PageBytes = s.timeGET(ctx, "/")
	res.PageStatusMS, res.PageStatusBytes = s.timeGET(ctx, "/v1/status?limit=100")
	res.PagePaintMS = s.firstPaint(ctx)

	// A zone reclaims reclaim hosts: their notices within one second.
	leaving := s.agents[:reclaim]
	cpu0 = procCPU(cmd.Process.Pid)
	t0 = time.Now()
	for i, a := range leaving {
		at := t0.Add(time.Duration(i) * time.Second / time.Duration(reclaim))
		wg.Go(func() {
			time.Sleep(time.Until(at))
			a.notice(ctx)
		})
	}
	wg.Wait()
	gone := map[string]bool{}
	for _, a := range leaving {
		gone[a.host] = true
	}
	g3, err := s.waitWorld(ctx, g2, workers-1-reclaim*o.Slots, gone)
	if err != nil {
		return res, fmt.Errorf("the reclaim: %w", err)
	}
	res.ReclaimResetS, res.ReclaimCPUS = s.lastPlaced(g3).Sub(t0).Seconds(), procCPU(cmd.Process.Pid)-cpu0
	res.ReclaimGenerations = int(g3 - g2)
	s.say("generation %d: %d workers placed %.2f s after the first notice, %d generation(s) later", g3, workers-1-reclaim*o.Slots, res.ReclaimResetS, res.ReclaimGenerations)
	s.sample(&res, false)
	return res, nil
}

// readDriver reads the driver's output: its runtime stats, and its errors for the bench's log.
func (s *scale) readDriver(out io.Reader) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := scaleStatsLine.FindStringSubmatch(line); m != nil {
			g, _ := strconv.Atoi(m[1])
			h, _ := strconv.ParseInt(m[2], 10, 64)
			select {
			case s.stats <- scaleStats{g, h}:
			default:
			}
			continue
		}
		if strings.Contains(line, "level=ERROR") || strings.HasPrefix(line, "elasticd:") {
			fmt.Fprintln(s.o.Err, "driver: "+line)
		}
	}
	io.Copy(io.Discard, out)
}

func (s *scale) waitListening(ctx context.Context, d time.Duration) error {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if s.driver.exited() {
			return fmt.Errorf("the driver exited (status %d) before it listened", s.driver.cmd.ProcessState.ExitCode())
		}
		if c, err := net.DialTimeout("tcp", strings.TrimPrefix(s.url, "http://"), time.Second); err == nil {
			c.Close()
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("the driver did not listen on %s within %v", s.url, d)
}

// sample reads the driver's RSS and descriptors (keeping the largest), and with heap its Go
// heap and goroutines (SIGUSR1 makes it log them).
func (s *scale) sample(res *ScaleResult, heap bool) {
	pid := s.driver.cmd.Process.Pid
	rss, fds := resources(pid)
	res.DriverRSSBytes = max(res.DriverRSSBytes, rss*1024)
	res.DriverFDs = max(res.DriverFDs, fds)
	if !heap {
		return
	}
	for len(s.stats) > 0 {
		<-s.stats
	}
	if syscall.Kill(pid, syscall.SIGUSR1) != nil {
		return
	}
	select {
	case st := <-s.stats:
		res.DriverHeapBytes, res.Goroutines = st.heap, st.goroutines
	case <-time.After(10 * time.Second):
	}
}

// procCPU is a process's user and system CPU time so far, in seconds.
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command (which may hold spaces) in parentheses: utime and stime are
	// the 14th and 15th fields of the line.
	rest := string(b[strings.LastIndexByte(string(b), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// firstPaint loads the live page in headless Chromium 3 times: the median time from the
// navigation to the job drawn, in ms; -1 when there is no Chromium or it fails.
func (s *scale) firstPaint(ctx context.Context) float64 {
	path, err := browsertest.Find()
	if err != nil {
		s.say("the live page's first paint is not measured: %v", err)
		return -1
	}
	tab, stop, err := browsertest.Start(ctx, path, filepath.Join(s.dir, "chromium"), func(string, ...any) {})
	if err != nil {
		s.say("the live page's first paint is not measured: %v", err)
		return -1
	}
	defer stop()
	var times []float64
	for range 3 {
		if err := browsertest.Navigate(tab, s.url+"/"); err != nil {
			s.say("the live page: %v", err)
			return -1
		}
		if err := browsertest.Wait(tab, `document.body.dataset.ready === "1"`); err != nil {
			s.say("the live page: %v", err)
			return -1
		}
		// When the page marked itself drawn, from the navigation's start.
		ms, err := browsertest.Eval[float64](tab, `Number(document.body.dataset.drawnMs)`)
		if err != nil {
			s.say("the live page: %v", err)
			return -1
		}
		times = append(times, ms)
	}
	slices.Sort(times)
	return times[1]
}

// timeGET fetches path from the driver 5 times: the median time in ms, and the body's size.
func (s *scale) timeGET(ctx context.Context, path string) (float64, int) {
	var times []float64
	size := 0
	for range 5 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+path, nil)
		t := time.Now()
		resp, err := s.reg.Do(req)
		if err != nil {
			continue
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		times = append(times, float64(time.Since(t).Microseconds())/1000)
		size = int(n)
	}
	if len(times) == 0 {
		return -1, 0
	}
	slices.Sort(times)
	return times[len(times)/2], size
}

// placed records that a worker holds its place in generation gen.
func (s *scale) place(gen uint64, at time.Time) {
	s.mu.Lock()
	s.placed[gen]++
	if at.After(s.last[gen]) {
		s.last[gen] = at
	}
	close(s.cond)
	s.cond = make(chan struct{})
	s.mu.Unlock()
}

func (s *scale) lastPlaced(gen uint64) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[gen]
}

// waitWorld waits for a generation after after whose size is size and whose size workers are
// all placed, none of them on a host in gone; it returns that generation.
func (s *scale) waitWorld(ctx context.Context, after uint64, size int, gone map[string]bool) (uint64, error) {
	end := time.NewTimer(s.o.Timeout)
	defer end.Stop()
	for {
		s.mu.Lock()
		var best uint64
		for g, n := range s.placed {
			if g > after && n >= size {
				best = max(best, g)
			}
		}
		ch := s.cond
		s.mu.Unlock()
		if best > 0 && s.worldOf(best, size, gone) {
			return best, nil
		}
		select {
		case <-ch:
		case <-time.After(time.Second):
		case <-s.driver.done:
			return 0, fmt.Errorf("the driver exited (status %d)", s.driver.cmd.ProcessState.ExitCode())
		case <-end.C:
			s.mu.Lock()
			placed := fmt.Sprint(s.placed)
			var newest uint64
			for g := range s.placed {
				newest = max(newest, g)
			}
			s.mu.Unlock()
			return 0, fmt.Errorf("no generation after %d with all %d workers placed within %v (placed per generation: %v; %s)", after, size, s.o.Timeout, placed, s.laggards(newest))
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// laggards describes up to 5 hosts with a worker not placed in gen, for a phase that did
// not end.
func (s *scale) laggards(gen uint64) string {
	var out []string
	for _, a := range s.agents {
		a.mu.Lock()
		n := 0
		for _, w := range a.workers {
			if w.gen != gen {
				n++
			}
		}
		if n > 0 || len(a.workers) < s.o.Slots {
			out = append(out, fmt.Sprintf("%s: %d workers started, %d not placed in generation %d, session %s, watch errors %d (last: %v), commands errors %d (last: %v)",
				a.host, len(a.workers), n, gen, a.session, a.watchErrs, a.watchErr, a.cmdErrs, a.cmdErr))
		}
		a.mu.Unlock()
		if len(out) == 5 {
			break
		}
	}
	if len(out) == 0 {
		return "every host's workers placed"
	}
	return "hosts behind: " + strings.Join(out, "; ")
}

// worldOf reports whether every worker placed in gen is off the hosts in gone, with size
// workers in all.
func (s *scale) worldOf(gen uint64, size int, gone map[string]bool) bool {
	n := 0
	for _, a := range s.agents {
		a.mu.Lock()
		for _, w := range a.workers {
			if w.gen == gen && !w.removed {
				if gone[a.host] {
					a.mu.Unlock()
					return false
				}
				n++
			}
		}
		a.mu.Unlock()
	}
	return n == size
}

// simAgent is one simulated host: it registers as an agent, holds its session on one
// connection (commands, events, the watch), and plays its workers.
type simAgent struct {
	s       *scale
	i       int
	host    string // its host ID, which the driver names its workers by
	addr    string
	auth    *protocol.Auth
	hc      *http.Client // the session's connection: its stream
	whc     *http.Client // the same, for its workers: their reports batched, as the agent's relay does
	session string
	wait    time.Duration
	ids     []string // its workers' IDs, slot by slot
	cancel  context.CancelFunc
	loops   sync.WaitGroup

	evMu    sync.Mutex // one events request at a time, in order
	evSeq   uint64
	mu      sync.Mutex
	wset    chan struct{}         // closed and replaced when workers changes
	procs   map[uint64]string     // the driver's process number -> worker ID
	procOf  map[string]uint64     // worker ID -> its current process number
	workers map[string]*simWorker // by worker ID
	hosts   uint64                // the host-update version last seen
	heard   bool                  // a watch answered: hosts is the driver's
	// the session's failed requests, for a phase that does not end (laggards)
	watchErrs, cmdErrs int
	watchErr, cmdErr   error
}

// simWorker is one simulated worker: the real rendezvous client over its agent's connection.
type simWorker struct {
	c       *wrdzv.Client
	gen     uint64 // the generation it holds its place in
	launch  uint64 // the generation it was launched for
	removed bool
}

func newSimAgent(s *scale, i int) *simAgent {
	host := fmt.Sprintf("sim-%05d", i)
	tr := &http.Transport{Proxy: nil, Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	auth := protocol.NewSigner(s.secret, protocol.AgentAuthLabel)
	driver, _ := url.Parse(s.url)
	// The session stream, as 'elasticd agent' opens it (HTTP/2 with a driver without).
	st := &agent.StreamTransport{Driver: driver, Auth: auth, Fallback: tr}
	a := &simAgent{s: s, i: i, host: host, addr: fmt.Sprintf("127.%d.%d.%d", 1+i/65536, i/256%256, i%256),
		auth: auth, hc: &http.Client{Transport: st},
		procs: map[uint64]string{}, procOf: map[string]uint64{}, workers: map[string]*simWorker{}, wset: make(chan struct{})}
	for slot := range s.o.Slots {
		a.ids = append(a.ids, protocol.WorkerID{Host: host, Slot: slot}.String())
	}
	a.whc = &http.Client{Transport: &agent.BatchTransport{Base: st, Driver: driver}}
	return a
}

// stop ends the host's loops; they are done when loops is.
func (a *simAgent) stop() {
	if a.cancel != nil {
		a.cancel()
	}
}

// call sends a signed request of the agents' protocol and decodes the 200 answer into out.
func (a *simAgent) call(ctx context.Context, hc *http.Client, method, target string, in, out any, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second+wait)
	defer cancel()
	r, err := a.auth.Exchange(ctx, hc, method, a.s.url+target, in, 64<<20)
	if err != nil {
		return err
	}
	switch {
	case r.Status == http.StatusOK && out != nil:
		return json.Unmarshal(r.Body, out)
	case r.Status >= 300:
		return fmt.Errorf("%s %s: %d %s", method, target, r.Status, r.Reason)
	}
	return nil
}

func (a *simAgent) register(ctx context.Context) error {
	var ans protocol.AgentRegisterAnswer
	in := protocol.AgentRegisterRequest{Protocol: protocol.AgentProtocolVersion, AgentID: a.host, HostID: a.host, Addr: a.addr,
		Slots: a.s.o.Slots, GPUs: []protocol.AgentGPU{}, Metadata: "none"}
	var err error
	for attempt := range 20 {
		if err = a.call(ctx, a.s.reg, http.MethodPost, protocol.AgentPathRegister, in, &ans, 0); err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("host %s cannot register: %w", a.host, err)
	}
	a.session, a.wait = ans.Session, time.Duration(ans.PollWaitMS)*time.Millisecond
	a.s.mu.Lock()
	if a.s.jobSecret == nil {
		a.s.jobSecret = protocol.JobSecret(a.s.secret, ans.JobID)
	}
	a.s.mu.Unlock()
	return nil
}

func (a *simAgent) path(what string) string {
	return protocol.AgentPathPrefix + url.PathEscape(a.session) + "/" + what
}

// run starts the session's loops.
func (a *simAgent) run(ctx context.Context) {
	ctx, a.cancel = context.WithCancel(ctx)
	a.loops.Go(func() { a.pollCommands(ctx) })
	a.loops.Go(func() { a.watch(ctx) })
}

func (a *simAgent) send(ctx context.Context, evs ...protocol.AgentEvent) {
	a.evMu.Lock()
	defer a.evMu.Unlock()
	for i := range evs {
		a.evSeq++
		evs[i].Seq = a.evSeq
	}
	for ctx.Err() == nil {
		if err := a.call(ctx, a.hc, http.MethodPost, a.path("events"), protocol.AgentEventsRequest{Events: evs}, nil, 0); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (a *simAgent) pollCommands(ctx context.Context) {
	var after uint64
	for ctx.Err() == nil {
		var ans protocol.AgentCommandsAnswer
		target := a.path("commands") + "?after=" + strconv.FormatUint(after, 10) + "&wait_ms=" + strconv.FormatInt(a.wait.Milliseconds(), 10)
		if err := a.call(ctx, a.hc, http.MethodGet, target, nil, &ans, a.wait); err != nil {
			a.mu.Lock()
			a.cmdErrs, a.cmdErr = a.cmdErrs+1, err
			a.mu.Unlock()
			time.Sleep(200 * time.Millisecond)
			continue
		}
		var evs []protocol.AgentEvent
		var started []*simWorker
		for _, c := range ans.Commands {
			if c.Seq <= after {
				continue
			}
			after = c.Seq
			switch c.Op {
			case protocol.OpStart:
				g, _ := protocol.EnvValue(c.Env, protocol.EnvGeneration)
				gen, _ := strconv.ParseUint(g, 10, 64)
				id, _ := protocol.ParseWorkerID(c.Worker)
				cl := wrdzv.NewClient(a.s.url, a.s.jobSecret, id, a.whc)
				cl.SetDriverWait(2 * time.Minute)
				w := &simWorker{c: cl, launch: gen}
				a.mu.Lock()
				a.procs[c.Proc], a.procOf[c.Worker], a.workers[c.Worker] = c.Worker, c.Proc, w
				a.mu.Unlock()
				evs = append(evs, protocol.AgentEvent{Kind: protocol.KindStarted, Proc: c.Proc, PID: 100000 + int(c.Proc)})
				started = append(started, w)
			case protocol.OpStop:
				a.mu.Lock()
				if id, ok := a.procs[c.Proc]; ok {
					delete(a.procs, c.Proc)
					if a.procOf[id] == c.Proc {
						delete(a.workers, id)
					}
				}
				a.mu.Unlock()
				evs = append(evs, protocol.AgentEvent{Kind: protocol.KindExited, Proc: c.Proc, Signal: "terminated", Code: -1})
			}
		}
		if len(started) > 0 { // the watch asks about the new workers
			a.mu.Lock()
			close(a.wset)
			a.wset = make(chan struct{})
			a.mu.Unlock()
		}
		if len(evs) > 0 {
			a.send(ctx, evs...)
		}
		// A worker launched for generation g registers: READY for g-1.
		for _, w := range started {
			a.loops.Go(func() { w.c.Report(ctx, w.launch-1, protocol.Ready, "") })
		}
	}
}

// watch follows the driver's view of this host's workers, as the agent's relay does, and
// plays what the workers do with it: take their place, leave when removed, and go to the
// barrier (READY) when the hosts changed.
func (a *simAgent) watch(ctx context.Context) {
	var gen, hosts uint64
	var asked []string
	for ctx.Err() == nil {
		a.mu.Lock()
		var ids []string
		for id := range a.workers {
			ids = append(ids, id)
		}
		set := a.wset
		a.mu.Unlock()
		slices.Sort(ids)
		q := url.Values{"worker": ids}
		if !slices.Equal(ids, asked) { // new workers: answer at once
			gen, hosts = 0, 0
		}
		q.Set("generation", strconv.FormatUint(gen, 10))
		q.Set("hosts_version", strconv.FormatUint(hosts, 10))
		q.Set("wait_ms", strconv.FormatInt(a.wait.Milliseconds(), 10))
		rctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-set:
				cancel()
			case <-rctx.Done():
			}
		}()
		var v protocol.AgentWatchAnswer
		err := a.call(rctx, a.hc, http.MethodGet, a.path("watch")+"?"+q.Encode(), nil, &v, a.wait)
		cancel()
		if err != nil {
			if ctx.Err() == nil && !isClosed(set) {
				a.mu.Lock()
				a.watchErrs, a.watchErr = a.watchErrs+1, err
				a.mu.Unlock()
				time.Sleep(200 * time.Millisecond)
			}
			continue
		}
		asked = ids
		now := time.Now()
		var exits []protocol.AgentEvent
		var ready []*simWorker
		a.mu.Lock()
		for _, p := range v.Assignments {
			w := a.workers[p.Worker]
			if w == nil || p.Assignment.Generation <= w.gen || w.removed {
				continue
			}
			if p.Assignment.Removed {
				if w.gen > 0 { // placed before: it exits 0
					w.removed = true
					exits = append(exits, protocol.AgentEvent{Kind: protocol.KindExited, Proc: a.procOf[p.Worker]})
					delete(a.procs, a.procOf[p.Worker])
					delete(a.workers, p.Worker)
				}
				continue
			}
			w.gen = p.Assignment.Generation
			a.s.place(w.gen, now)
		}
		if v.HostsVersion > a.hosts && a.heard {
			// The hosts changed: at their next step the ranks agree on it and go to the barrier.
			for _, w := range a.workers {
				if w.gen == v.Generation && w.gen > 0 {
					ready = append(ready, w)
				}
			}
		}
		a.hosts, a.heard = max(a.hosts, v.HostsVersion), true
		gen, hosts = v.Generation, v.HostsVersion
		a.mu.Unlock()
		if len(exits) > 0 {
			a.send(ctx, exits...)
		}
		for _, w := range ready {
			g := w.gen
			a.loops.Go(func() { w.c.Report(ctx, g, protocol.Ready, "") })
		}
	}
}

// fail makes worker id's process exit 1, as a crash would.
func (a *simAgent) fail(ctx context.Context, id string, gen uint64) {
	a.mu.Lock()
	p := a.procOf[id]
	delete(a.procs, p)
	delete(a.workers, id)
	a.mu.Unlock()
	a.send(ctx, protocol.AgentEvent{Kind: protocol.KindExited, Proc: p, Code: 1})
}

// readyAll has every worker of the host placed in gen but except report READY for gen, as
// its collective fails; it does not wait for the answers.
func (a *simAgent) readyAll(ctx context.Context, gen uint64, except string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, w := range a.workers {
		if id != except && w.gen == gen {
			a.loops.Go(func() { w.c.Report(ctx, gen, protocol.Ready, "") })
		}
	}
}

// notice has the host's metadata announce a spot interruption, two minutes ahead.
func (a *simAgent) notice(ctx context.Context) {
	a.send(ctx, protocol.AgentEvent{Kind: protocol.KindNotice, Notice: &protocol.AgentNotice{
		ID: "reclaim-" + a.host, Kind: string(providers.Interruption), Deadline: time.Now().Add(2 * time.Minute), Detail: "bench scale: a zone reclaims its spot hosts"}})
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
