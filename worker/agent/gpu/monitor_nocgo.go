//go:build !(linux && cgo)

package gpu

import (
	"context"
	"log/slog"
)

// Monitor is the stand-in for builds without NVML: it sees no GPUs.
type Monitor struct{}

// Open returns a Monitor with zero GPUs: go-nvml needs cgo on Linux.
func Open(log *slog.Logger) (*Monitor, error) {
	if log != nil {
		log.Info("NVML needs cgo on linux; this build reports no GPUs")
	}
	return &Monitor{}, nil
}

// GPUs returns nothing.
func (m *Monitor) GPUs() []GPU { return nil }

// Watch waits for ctx to end and returns nil; with no GPUs there is nothing to watch.
func (m *Monitor) Watch(ctx context.Context, out chan<- Event) error {
	<-ctx.Done()
	return nil
}

// Close does nothing.
func (m *Monitor) Close() error { return nil }

// Utilization is nil: no NVML without cgo.
func (m *Monitor) Utilization() ([]float64, error) { return nil, nil }
