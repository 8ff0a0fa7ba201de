package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/elasticd/elasticd/allreduce"
	"github.com/urfave/cli/v2"
)

// benchRankCommand is one rank of `bench allreduce`, started by it; not for people.
func benchRankCommand() *cli.Command {
	return &cli.Command{
		Name:   "allreduce-rank",
		Hidden: true,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "rank"}, &cli.IntFlag{Name: "np"}, &cli.StringFlag{Name: "store"},
			&cli.StringFlag{Name: "sizes"}, &cli.IntFlag{Name: "iters"}, &cli.IntFlag{Name: "chunk-bytes"},
			&cli.IntFlag{Name: "small-bytes"}, &cli.DurationFlag{Name: "timeout"}, &cli.StringFlag{Name: "cpuprofile"},
		},
		Action: benchRank,
	}
}

func benchRank(c *cli.Context) error {
	ctx := c.Context
	rank, np := c.Int("rank"), c.Int("np")
	if path := c.String("cpuprofile"); path != "" {
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
		Rank: rank, Size: np, Generation: 1,
		Store:      &allreduce.FileStore{Dir: c.String("store")},
		Timeout:    c.Duration("timeout"),
		ChunkBytes: c.Int("chunk-bytes"),
		SmallBytes: c.Int("small-bytes"),
	})
	if err != nil {
		return err
	}
	defer comm.Close()
	enc := json.NewEncoder(os.Stdout)
	for _, f := range strings.Split(c.String("sizes"), ",") {
		size, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return fmt.Errorf("size %q: %w", f, err)
		}
		iters := c.Int("iters")
		if iters == 0 {
			iters = autoIters(size)
		}
		res, err := timeAllreduce(c, comm, size, iters)
		if err != nil {
			return err
		}
		if rank == 0 {
			if err := enc.Encode(res); err != nil {
				return err
			}
		}
	}
	return nil
}

// timeAllreduce checks one result, then times iters allreduces of size bytes. Each
// iteration starts after a barrier; its time is the slowest rank's (an allreduce(max) of
// the per-iteration times at the end, outside the timed region).
func timeAllreduce(c *cli.Context, comm *allreduce.Comm, size int64, iters int) (allreduceResult, error) {
	ctx := c.Context
	n := comm.Size()
	buf := make([]float32, size/4)
	for i := range buf {
		buf[i] = float32(comm.Rank() + 1)
	}
	if err := comm.Allreduce(ctx, buf, allreduce.Sum); err != nil {
		return allreduceResult{}, err
	}
	want := float32(n * (n + 1) / 2)
	for i, v := range buf {
		if v != want {
			return allreduceResult{}, fmt.Errorf("wrong result at element %d of %d: %v, want %v", i, len(buf), v, want)
		}
	}
	clear(buf) // zeros stay zeros however often they are summed
	for range 2 {
		if err := comm.Allreduce(ctx, buf, allreduce.Sum); err != nil {
			return allreduceResult{}, err
		}
	}
	times := make([]float64, iters)
	for i := range times {
		if err := comm.Barrier(ctx); err != nil {
			return allreduceResult{}, err
		}
		t0 := time.Now()
		if err := comm.Allreduce(ctx, buf, allreduce.Sum); err != nil {
			return allreduceResult{}, err
		}
		times[i] = time.Since(t0).Seconds()
	}
	if err := comm.Allreduce(ctx, times, allreduce.Max); err != nil {
		return allreduceResult{}, err
	}
	med := median(times)
	res := allreduceResult{SizeBytes: size, Ranks: n, Iters: iters, MedianS: med}
	if med > 0 {
		res.AlgbwGbps = float64(size) / med / 1e9
		res.BusbwGbps = busbw(res.AlgbwGbps, n)
	}
	return res, nil
}

// busbw is the bus bandwidth of an allreduce of n ranks at algbw: algbw·2(n−1)/n, the bytes
// each rank sends in a ring.
func busbw(algbw float64, n int) float64 {
	return algbw * 2 * float64(n-1) / float64(n)
}
