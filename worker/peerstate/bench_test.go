package peerstate_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/allreduce"
	"github.com/elasticd/elasticd/worker/peerstate"
)

// BenchmarkJoin measures how long it takes to bring M joiners up to date with S bytes of
// state held by H holders, two ways, in the same run and on the same machine (all ranks in
// this process, over loopback TCP):
//
//   - peer: each of the H holders publishes a new version (its manifest, the CRC-32C of
//     every chunk, is computed on first request and counted), and the M joiners fetch it
//     concurrently into memory they already have, verifying every chunk;
//   - bcast: the baseline, allreduce.Comm.Broadcast of S bytes from rank 0 over H+M ranks,
//     as worker.State.Sync does.
//
// Each iteration also fetches the same version a second time, when the holders' manifests
// are ready (as when they were computed at commit, before the joiners came): peer-warm.
//
// Metrics: peer-ms, peer-warm-ms and bcast-ms are medians over the iterations (ms until the
// last joiner has the state), bcast/peer and bcast/peer-warm their ratios (above 1: the peer
// fetch is faster). Run with -benchtime=5x or so; set ELASTICD_BENCH_1GB=1 to add S = 1 GB.
func BenchmarkJoin(b *testing.B) {
	sizes := []struct {
		name  string
		bytes int
	}{{"10MB", 10 << 20}, {"100MB", 100 << 20}}
	if os.Getenv("ELASTICD_BENCH_1GB") != "" {
		sizes = append(sizes, struct {
			name  string
			bytes int
		}{"1GB", 1 << 30})
	}
	for _, hm := range [][2]int{{1, 1}, {2, 1}, {2, 2}, {4, 4}} {
		for _, size := range sizes {
			b.Run(fmt.Sprintf("S=%s/H=%d/M=%d", size.name, hm[0], hm[1]), func(b *testing.B) {
				benchJoin(b, size.bytes, hm[0], hm[1])
			})
		}
	}
}

func benchJoin(b *testing.B, size, nHolders, nJoiners int) {
	data := blob(size, 11)
	var holders []peerstate.Holder
	var srvs []*peerstate.Server
	for range nHolders {
		srv, err := peerstate.Listen(peerstate.ServerConfig{Secret: secret}, "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { srv.Close() })
		srvs = append(srvs, srv)
		holders = append(holders, peerstate.Holder{Addr: srv.Addr(), Host: "127.0.0.1"})
	}
	f, err := peerstate.NewFetcher(peerstate.FetcherConfig{Secret: secret})
	if err != nil {
		b.Fatal(err)
	}
	comms := world(b, nHolders+nJoiners)
	bufs := make([][]byte, len(comms))
	for r := range bufs {
		if r == 0 {
			bufs[r] = data
		} else {
			bufs[r] = make([]byte, size)
		}
	}
	ctx, cancel := context.WithTimeout(b.Context(), 10*time.Minute)
	defer cancel()

	into := make([][]byte, nJoiners) // each joiner's state memory, reused as the ranks' buffers are
	for j := range into {
		into[j] = make([]byte, size)
	}
	var peer, warm, bcast []time.Duration
	var busy, waits int
	b.SetBytes(int64(size) * int64(nJoiners))
	b.ResetTimer()
	for i := range b.N {
		version := uint64(i + 1)
		start := time.Now()
		for _, s := range srvs {
			s.Publish(version, data)
		}
		errs := make([]error, nJoiners)
		got := make([][]byte, nJoiners)
		var wg sync.WaitGroup
		var mu sync.Mutex
		fetchAll := func() {
			for j := range nJoiners {
				wg.Go(func() {
					var st peerstate.FetchStats
					got[j], st, errs[j] = f.FetchInto(ctx, version, holders, into[j])
					mu.Lock()
					busy, waits = busy+st.Busy, waits+st.Waits
					mu.Unlock()
				})
			}
			wg.Wait()
			for j, err := range errs {
				if err != nil {
					b.Fatalf("joiner %d: %v", j, err)
				}
			}
		}
		fetchAll()
		peer = append(peer, time.Since(start))
		start = time.Now() // again, the holders' manifests ready (computed at commit, say)
		fetchAll()
		warm = append(warm, time.Since(start))

		start = time.Now()
		berrs := make([]error, len(comms))
		for r, c := range comms {
			wg.Go(func() { berrs[r] = c.Broadcast(ctx, bufs[r], 0) })
		}
		wg.Wait()
		bcast = append(bcast, time.Since(start))
		for _, err := range berrs {
			if err != nil {
				b.Fatalf("broadcast: %v", err)
			}
		}
		b.StopTimer()
		if !bytes.Equal(got[0], data) || !bytes.Equal(bufs[len(bufs)-1], data) {
			b.Fatal("a joiner got different state")
		}
		b.StartTimer()
	}
	b.StopTimer()
	pm, wm, bm := median(peer), median(warm), median(bcast)
	b.ReportMetric(float64(pm.Microseconds())/1000, "peer-ms")
	b.ReportMetric(float64(wm.Microseconds())/1000, "peer-warm-ms")
	b.ReportMetric(float64(bm.Microseconds())/1000, "bcast-ms")
	b.ReportMetric(bm.Seconds()/pm.Seconds(), "bcast/peer")
	b.ReportMetric(bm.Seconds()/wm.Seconds(), "bcast/peer-warm")
	b.ReportMetric(float64(busy)/float64(2*b.N), "busy/fetch")
	b.ReportMetric(float64(waits)/float64(2*b.N), "waits/fetch")
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// world builds n communicators of one generation over loopback, as allreduce's tests do.
func world(b *testing.B, n int) []*allreduce.Comm {
	b.Helper()
	store := allreduce.NewMemStore()
	ctx, cancel := context.WithTimeout(b.Context(), 20*time.Second)
	defer cancel()
	comms := make([]*allreduce.Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			comms[r], errs[r] = allreduce.New(ctx, allreduce.Config{Rank: r, Size: n, Generation: 1, Store: store, Secret: secret})
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			b.Fatalf("rank %d: %v", r, err)
		}
	}
	b.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}
