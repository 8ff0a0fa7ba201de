package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"
)

// logStatsOnSIGUSR1 logs, each time the process gets SIGUSR1 until ctx ends, one line of its
// runtime figures: goroutines, heap in use and open descriptors. An operator (or the soak)
// asks a long-running driver or agent this way whether it leaks, without a debug endpoint.
func logStatsOnSIGUSR1(ctx context.Context, log *slog.Logger) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	go func() {
		defer signal.Stop(ch)
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				fds := -1 // unknown where /proc is not
				if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
					fds = len(ents) - 1 // less the directory ReadDir opened
				}
				log.Info("runtime stats", "goroutines", runtime.NumGoroutine(), "heap_bytes", ms.HeapInuse, "fds", fds)
			}
		}
	}()
}
