package rendezvous_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/protocol"
	rdzvclient "github.com/elasticd/elasticd/worker/rendezvous"
)

// BenchmarkReset measures one rendezvous reset at scale. N simulated workers (goroutines,
// each with its own Client, over real HTTP on loopback) report READY and long-poll their
// assignment; then the driver publishes generation g+1. Reported:
//
//	s/reset    time from Publish until every worker holds its assignment
//	s/ready    time from the start of the READY reports until every long-poll is held (polled
//	           every 5 ms; the first round, which also opens the connections, is left out)
//	MiB-heap   the server's heap in use (after a GC) with all N long-polls held
//	MiB-stack  the server's goroutine stacks at that moment (net/http's goroutine per connection)
//
// The server runs in a child process (this test binary, see TestServerProcess), so that its
// heap is measured apart from the N clients'. On a small machine the two still share the CPUs.
func BenchmarkReset(b *testing.B) {
	for _, n := range []int{64, 256, 1024, 4096, 16384} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) { benchReset(b, n) })
	}
}

func benchReset(b *testing.B, n int) {
	if err := raiseFileLimit(uint64(n) + 256); err != nil {
		b.Skipf("file descriptors for %d connections: %v", n, err)
	}
	child := startServerProcess(b)
	ids := benchIDs(n)
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		MaxIdleConnsPerHost: n, // one keep-alive connection per worker, as N processes would have
		// and no more: a worker's report connection is not always back in the pool when its
		// long-poll starts, and a second one each ran this process out of descriptors at
		// 16,384 workers (20,000 here).
		MaxConnsPerHost: n,
		IdleConnTimeout: time.Minute,
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	clients := make([]*rdzvclient.Client, n)
	for i, id := range ids {
		clients[i] = rdzvclient.NewClient("http://"+child.addr, secret, id, hc)
	}
	ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
	defer cancel()

	var total, ready time.Duration
	var readyRounds int
	var heap, stack float64
	b.ResetTimer()
	b.StopTimer()
	for i := range b.N {
		gen := uint64(i) // the generation the workers hold; the reset makes gen+1
		child.cmd(b, fmt.Sprintf("prepare %d %d", gen+1, n))
		got := make([]protocol.Assignment, n)
		errs := make([]error, n)
		began := time.Now()
		var wg sync.WaitGroup
		var failed atomic.Pointer[error] // the first worker's error: no wait for a poll that is not coming
		for w, c := range clients {
			wg.Go(func() {
				if errs[w] = c.Report(ctx, gen, protocol.Ready, ""); errs[w] == nil {
					got[w], errs[w] = c.Assignment(ctx, gen)
				}
				if errs[w] != nil {
					failed.CompareAndSwap(nil, &errs[w])
				}
			})
		}
		// Publish only once every worker is waiting, as after a real barrier.
		deadline := time.Now().Add(2 * time.Minute)
		for child.cmd(b, "polls") != strconv.Itoa(n) {
			if err := failed.Load(); err != nil {
				b.Fatalf("a worker failed before every worker was long-polling: %v", *err)
			}
			if time.Now().After(deadline) {
				b.Fatalf("not all %d workers long-polling after 2 minutes", n)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if i > 0 || b.N == 1 {
			ready += time.Since(began)
			readyRounds++
		}
		fmt.Sscan(child.cmd(b, "mem"), &heap, &stack)

		b.StartTimer()
		start := time.Now()
		child.cmd(b, "publish")
		wg.Wait()
		total += time.Since(start)
		b.StopTimer()

		for w := range n {
			if errs[w] != nil {
				b.Fatalf("worker %v: %v", ids[w], errs[w])
			}
			if a := got[w]; a.Generation != gen+1 || a.Rank != w || a.Size != n || a.Removed {
				b.Fatalf("worker %v got %+v", ids[w], a)
			}
		}
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s/reset")
	b.ReportMetric(ready.Seconds()/float64(readyRounds), "s/ready")
	b.ReportMetric(heap/(1<<20), "MiB-heap")
	b.ReportMetric(stack/(1<<20), "MiB-stack")
}

// benchIDs names n workers as hosts of 8 slots.
func benchIDs(n int) []protocol.WorkerID {
	ids := make([]protocol.WorkerID, n)
	for i := range ids {
		ids[i] = wid(fmt.Sprintf("ip-10-0-%d-%d.ec2.internal", i/8/250, i/8%250), i%8)
	}
	return ids
}

func benchPlan(gen uint64, n int) map[protocol.WorkerID]protocol.Assignment {
	plan := make(map[protocol.WorkerID]protocol.Assignment, n)
	hosts := (n + 7) / 8
	for i, id := range benchIDs(n) {
		plan[id] = protocol.Assignment{
			Generation: gen, Rank: i, Size: n,
			LocalRank: i % 8, LocalSize: min(8, n-i/8*8),
			CrossRank: i / 8, CrossSize: hosts,
		}
	}
	return plan
}

// serverProcess is a rendezvous server in a child process, driven line by line on stdin.
type serverProcess struct {
	addr string
	in   io.Writer
	out  *bufio.Scanner
}

const serverProcessEnv = "ELASTICD_RENDEZVOUS_SERVER_PROCESS"

func startServerProcess(b *testing.B) *serverProcess {
	cmd := exec.Command(os.Args[0], "-test.run=^TestServerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), serverProcessEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		in.Close() // the child exits at the end of its input
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	p := &serverProcess{in: in, out: bufio.NewScanner(out)}
	p.addr = p.read(b)
	return p
}

// cmd sends one command and returns the child's answer.
func (p *serverProcess) cmd(b *testing.B, line string) string {
	if _, err := fmt.Fprintln(p.in, line); err != nil {
		b.Fatalf("server process: %v", err)
	}
	return p.read(b)
}

func (p *serverProcess) read(b *testing.B) string {
	for p.out.Scan() {
		if s, ok := strings.CutPrefix(p.out.Text(), "rdzv: "); ok {
			return s
		}
	}
	b.Fatalf("server process ended: %v", p.out.Err())
	return ""
}

// TestServerProcess is the server side of BenchmarkReset, run in a child process; it is
// skipped otherwise. It answers each command on stdin with one "rdzv: " line on stdout.
func TestServerProcess(t *testing.T) {
	if os.Getenv(serverProcessEnv) != "1" {
		t.Skip("only run as BenchmarkReset's server process")
	}
	srv, err := rendezvous.NewServer(rendezvous.ServerConfig{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	go hs.Serve(ln)
	drained := make(chan struct{})
	go func() { // the driver's side of Events
		defer close(drained)
		for range srv.Events() {
		}
	}()
	defer func() {
		srv.Close()
		hs.Close()
		<-drained
	}()

	fmt.Printf("rdzv: %s\n", ln.Addr())
	var (
		gen  uint64
		plan map[protocol.WorkerID]protocol.Assignment
	)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		var answer string
		switch f[0] {
		case "prepare": // prepare <gen> <workers>
			gen, _ = strconv.ParseUint(f[1], 10, 64)
			n, _ := strconv.Atoi(f[2])
			plan = benchPlan(gen, n)
			answer = "ok"
		case "publish":
			srv.Publish(gen, plan)
			answer = "ok"
		case "polls":
			answer = strconv.Itoa(srv.Stats().AssignmentPolls)
		case "mem":
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			answer = fmt.Sprintf("%d %d", ms.HeapInuse, ms.StackInuse)
			if path := os.Getenv("ELASTICD_RENDEZVOUS_HEAP_PROFILE"); path != "" {
				if f, err := os.Create(path); err == nil {
					pprof.WriteHeapProfile(f)
					f.Close()
				}
			}
		default:
			answer = "unknown command " + f[0]
		}
		fmt.Printf("rdzv: %s\n", answer)
	}
}
