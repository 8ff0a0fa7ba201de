package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/pprof"
	"time"

	"github.com/elasticd/elasticd/allreduce"
)

// RankCommand is the hidden subcommand of `elasticd bench` that runs Rank; Allreduce starts
// it with the flags --rank, --np, --store, --sizes (bytes, comma-separated), --iters,
// --chunk-bytes, --small-bytes, --tcp-send-buffer, --direct-bytes, --transport, --timeout, --cpuprofile and --listen, one per
// field of RankOptions.
const RankCommand = "allreduce-rank"

// RankOptions configure Rank: one rank process of Allreduce.
type RankOptions struct {
	Rank, NP      int
	Store         string  // the allreduce.FileStore directory the ranks meet in
	Sizes         []int64 // bytes
	Iters         int     // 0: autoIters
	ChunkBytes    int
	SmallBytes    int
	TCPSendBuffer int    // allreduce.Config.TCPSendBuffer
	DirectBytes   int    // allreduce.Config.DirectBytes
	Transport     string // allreduce.Config.Transport
	Listen        string // the IP address to listen on and advertise ("": loopback)
	Timeout       time.Duration
	CPUProfile    string    // this rank's CPU profile file ("": none)
	Out           io.Writer // every rank prints one AllreduceResult per size here as a JSON line
}

// listenAddr is allreduce.Config.ListenAddr for an IP address: any port of it, or the default.
func listenAddr(ip string) string {
	if ip == "" {
		return ""
	}
	return net.JoinHostPort(ip, "0")
}

// Rank is one rank of Allreduce, started by it as `Exe bench allreduce-rank`; not for people.
func Rank(ctx context.Context, o RankOptions) error {
	if path := o.CPUProfile; path != "" {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	comm, err := allreduce.New(ctx, allreduce.Config{
		Rank: o.Rank, Size: o.NP, Generation: 1,
		Store:         &allreduce.FileStore{Dir: o.Store},
		Timeout:       o.Timeout,
		ChunkBytes:    o.ChunkBytes,
		SmallBytes:    o.SmallBytes,
		TCPSendBuffer: o.TCPSendBuffer,
		DirectBytes:   o.DirectBytes,
		Transport:     o.Transport,
		ListenAddr:    listenAddr(o.Listen),
	})
	if err != nil {
		return err
	}
	defer comm.Close()
	out, _ := writers(o.Out, nil)
	enc := json.NewEncoder(out)
	for _, size := range o.Sizes {
		iters := o.Iters
		if iters == 0 {
			iters = autoIters(size)
		}
		res, err := timeAllreduce(ctx, comm, size, iters)
		if err != nil {
			return err
		}
		st := comm.Stats()
		res.ShmPeers, res.TCPPeers = st.SharedMemory, st.Fresh+st.Reused-st.SharedMemory
		res.NonTemporal = st.NonTemporal(size)
		res.Direct = st.Direct(size)
		if err := enc.Encode(res); err != nil {
			return err
		}
	}
	return nil
}

// timeAllreduce checks one result, then times iters allreduces of size bytes. Each
// iteration starts after a barrier; its time is the slowest rank's (an allreduce(max) of
// the per-iteration times at the end, outside the timed region).
func timeAllreduce(ctx context.Context, comm *allreduce.Comm, size int64, iters int) (AllreduceResult, error) {
	n := comm.Size()
	buf := make([]float32, size/4)
	for i := range buf {
		buf[i] = float32(comm.Rank() + 1)
	}
	if err := comm.Allreduce(ctx, buf, allreduce.Sum); err != nil {
		return AllreduceResult{}, err
	}
	want := float32(n * (n + 1) / 2)
	for i, v := range buf {
		if v != want {
			return AllreduceResult{}, fmt.Errorf("wrong result at element %d of %d: %v, want %v", i, len(buf), v, want)
		}
	}
	clear(buf) // zeros stay zeros however often they are summed
	if err := warmUp(ctx, comm, buf); err != nil {
		return AllreduceResult{}, err
	}
	times := make([]float64, iters)
	for i := range times {
		if err := comm.Barrier(ctx); err != nil {
			return AllreduceResult{}, err
		}
		t0 := time.Now()
		if err := comm.Allreduce(ctx, buf, allreduce.Sum); err != nil {
			return AllreduceResult{}, err
		}
		times[i] = time.Since(t0).Seconds()
	}
	if err := comm.Allreduce(ctx, times, allreduce.Max); err != nil {
		return AllreduceResult{}, err
	}
	med := median(times)
	res := AllreduceResult{SizeBytes: size, Ranks: n, Iters: iters, MedianS: med,
		P10S: percentile(times, 0.1), P90S: percentile(times, 0.9)}
	if med > 0 {
		res.AlgbwGbps = float64(size) / med / 1e9
		res.BusbwGbps = busbw(res.AlgbwGbps, n)
	}
	return res, nil
}

// warmUpTime is how long every size is reduced untimed before it is timed. Two iterations
// were too few for the first size of a run: ranks just started, 4 KB took 34 µs over shared
// memory as the first size and 4-6 µs as a later one (2 vCPUs; the kernel had not yet spread
// the rank processes over the cores), and a short size's 500 iterations last only a few ms.
const warmUpTime = 200 * time.Millisecond

// warmUp runs allreduces of buf, at least two, until warmUpTime has passed on the slowest
// rank; the ranks agree on when to stop through an allreduce(max) of their elapsed times
// every few iterations, outside any timed region.
func warmUp(ctx context.Context, comm *allreduce.Comm, buf []float32) error {
	start := time.Now()
	for {
		for range 2 {
			if err := comm.Allreduce(ctx, buf, allreduce.Sum); err != nil {
				return err
			}
		}
		elapsed := []float64{time.Since(start).Seconds()}
		if err := comm.Allreduce(ctx, elapsed, allreduce.Max); err != nil {
			return err
		}
		if elapsed[0] >= warmUpTime.Seconds() {
			return nil
		}
	}
}

// busbw is the bus bandwidth of an allreduce of n ranks at algbw: algbw·2(n−1)/n, the bytes
// each rank sends in a ring.
func busbw(algbw float64, n int) float64 {
	return algbw * 2 * float64(n-1) / float64(n)
}
