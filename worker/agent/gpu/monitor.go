//go:build linux && cgo

package gpu

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// waitTimeout bounds one nvml EventSet wait, and so how long Watch takes to see ctx end:
// the wait is a blocking C call that ctx cannot interrupt.
const waitTimeout = time.Second

// watchedEvents are the events that mean a GPU is unfit. Single-bit ECC errors are corrected
// by the hardware and are left out.
const watchedEvents = uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)

// Monitor holds an initialised NVML and the GPUs found at Open.
// Close it after Watch has returned.
type Monitor struct {
	lib  nvml.Interface // nil when NVML is unavailable: no call may reach it then
	log  *slog.Logger
	gpus []GPU
	devs []nvml.Device // devs[i] is gpus[i]
}

// Open initialises the host's NVML. A host without the library or the kernel driver
// gets a Monitor with zero GPUs, not an error.
func Open(log *slog.Logger) (*Monitor, error) {
	return New(nvml.New(), log)
}

// New is Open over a given NVML, such as go-nvml's mocks.
func New(lib nvml.Interface, log *slog.Logger) (*Monitor, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Monitor{log: log}
	switch r := lib.Init(); r {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED:
		// After a failed Init the C symbols are unresolved, so lib must never be called again.
		log.Info("NVML unavailable; reporting no GPUs", "reason", r.Error())
		return m, nil
	default:
		return nil, fmt.Errorf("init nvml: %w", r)
	}
	m.lib = lib
	if err := m.inventory(); err != nil {
		lib.Shutdown()
		return nil, err
	}
	log.Info("NVML ready", "gpus", len(m.gpus))
	return m, nil
}

func (m *Monitor) inventory() error {
	n, r := m.lib.DeviceGetCount()
	if r != nvml.SUCCESS {
		return fmt.Errorf("count gpus: %w", r)
	}
	for i := range n {
		g, d, r := m.describe(i)
		if r == nvml.ERROR_GPU_IS_LOST {
			// A lost GPU is not a slot; the rest of the host still is.
			m.log.Warn("GPU is lost; leaving it out", "gpu", i)
			continue
		}
		if r != nvml.SUCCESS {
			return fmt.Errorf("describe gpu %d: %w", i, r)
		}
		m.gpus = append(m.gpus, g)
		m.devs = append(m.devs, d)
	}
	return nil
}

func (m *Monitor) describe(i int) (GPU, nvml.Device, nvml.Return) { return describe(m.lib, i) }

// describe reads GPU i's inventory (Inspect's too).
func describe(lib nvml.Interface, i int) (GPU, nvml.Device, nvml.Return) {
	d, r := lib.DeviceGetHandleByIndex(i)
	if r != nvml.SUCCESS {
		return GPU{}, nil, r
	}
	g := GPU{Index: i}
	if g.UUID, r = d.GetUUID(); r != nvml.SUCCESS {
		return GPU{}, nil, r
	}
	if g.Model, r = d.GetName(); r != nvml.SUCCESS {
		return GPU{}, nil, r
	}
	mem, r := d.GetMemoryInfo()
	if r != nvml.SUCCESS {
		return GPU{}, nil, r
	}
	g.MemoryBytes = mem.Total
	return g, d, nvml.SUCCESS
}

// GPUs returns the GPUs found at Open, in NVML index order.
func (m *Monitor) GPUs() []GPU { return slices.Clone(m.gpus) }

// Utilization returns each GPU's busy fraction (0 to 1) over NVML's last sample period, in
// the order of GPUs(); nil without NVML.
func (m *Monitor) Utilization() ([]float64, error) {
	if m.lib == nil {
		return nil, nil
	}
	out := make([]float64, len(m.devs))
	for i, d := range m.devs {
		u, r := d.GetUtilizationRates()
		if r != nvml.SUCCESS {
			return nil, fmt.Errorf("utilization of gpu %d: %w", i, r)
		}
		out[i] = float64(u.Gpu) / 100
	}
	return out, nil
}

// Close shuts NVML down. Call it once Watch has returned.
func (m *Monitor) Close() error {
	if m.lib == nil {
		return nil
	}
	r := m.lib.Shutdown()
	m.lib = nil
	if r != nvml.SUCCESS {
		return fmt.Errorf("shutdown nvml: %w", r)
	}
	return nil
}

// Watch sends an Event on out for every critical XID, double-bit ECC error or lost GPU until
// ctx ends, then returns nil. XIDs caused by the application are dropped. GPUs too old to
// report events are logged and skipped. An NVML failure other than a lost GPU is returned:
// the caller should then treat every GPU's health as unknown.
func (m *Monitor) Watch(ctx context.Context, out chan<- Event) error {
	if m.lib == nil || len(m.devs) == 0 {
		<-ctx.Done()
		return nil
	}
	es, r := m.lib.EventSetCreate()
	if r != nvml.SUCCESS {
		return fmt.Errorf("create nvml event set: %w", r)
	}
	defer es.Free()

	w := &watch{m: m, out: out, lost: make(map[int]bool)}
	for i, d := range m.devs {
		if err := w.register(ctx, i, d, es); err != nil {
			return err
		}
	}
	for ctx.Err() == nil {
		ev, r := es.Wait(uint32(waitTimeout.Milliseconds()))
		switch r {
		case nvml.SUCCESS:
			w.handle(ctx, ev)
		case nvml.ERROR_TIMEOUT:
		case nvml.ERROR_GPU_IS_LOST:
			// The wait does not say which GPU; ask each. If none answers lost (or all already
			// are) the next wait may fail at once, so pause rather than spin.
			if !w.probe(ctx) {
				pause(ctx, waitTimeout)
			}
		default:
			return fmt.Errorf("wait for nvml events: %w", r)
		}
	}
	return nil
}

// watch is the state of one Watch call, owned by its goroutine.
type watch struct {
	m    *Monitor
	out  chan<- Event
	lost map[int]bool // GPUs already reported lost
}

func (w *watch) register(ctx context.Context, i int, d nvml.Device, es nvml.EventSet) error {
	sup, r := d.GetSupportedEventTypes()
	if r == nvml.SUCCESS {
		if sup&watchedEvents == 0 {
			r = nvml.ERROR_NOT_SUPPORTED
		} else {
			r = d.RegisterEvents(sup&watchedEvents, es)
		}
	}
	switch r {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_NOT_SUPPORTED:
		w.m.log.Warn("GPU cannot report health events; not watched", "gpu", i)
		return nil
	case nvml.ERROR_GPU_IS_LOST:
		w.markLost(ctx, i)
		return nil
	default:
		return fmt.Errorf("register events for gpu %d: %w", i, r)
	}
}

func (w *watch) handle(ctx context.Context, ev nvml.EventData) {
	i, uuid := w.identify(ev.Device)
	e := Event{GPU: i, UUID: uuid}
	switch ev.EventType {
	case nvml.EventTypeXidCriticalError:
		if applicationXIDs[ev.EventData] {
			w.m.log.Debug("application XID ignored", "gpu", i, "xid", ev.EventData)
			return
		}
		e.Kind, e.XID, e.Detail = KindXID, ev.EventData, xidDetail(ev.EventData)
	case nvml.EventTypeDoubleBitEccError:
		e.Kind, e.Detail = KindECC, "double-bit ECC error"
	default:
		return
	}
	w.send(ctx, e)
}

// identify finds which of our GPUs d is, by UUID, or by handle when the UUID cannot be read.
func (w *watch) identify(d nvml.Device) (int, string) {
	if d == nil {
		return -1, ""
	}
	if uuid, r := d.GetUUID(); r == nvml.SUCCESS {
		for i, g := range w.m.gpus {
			if g.UUID == uuid {
				return i, uuid
			}
		}
		return -1, uuid
	}
	if reflect.TypeOf(d).Comparable() {
		for i, dd := range w.m.devs {
			if reflect.TypeOf(dd) == reflect.TypeOf(d) && dd == d {
				return i, w.m.gpus[i].UUID
			}
		}
	}
	return -1, ""
}

// probe asks every GPU not yet known lost whether it still answers, reporting those that
// don't. It says whether any newly lost GPU was found.
func (w *watch) probe(ctx context.Context) bool {
	found := false
	for i, d := range w.m.devs {
		if w.lost[i] {
			continue
		}
		if _, r := d.GetMemoryInfo(); r == nvml.ERROR_GPU_IS_LOST {
			w.markLost(ctx, i)
			found = true
		}
	}
	return found
}

func (w *watch) markLost(ctx context.Context, i int) {
	w.lost[i] = true
	w.send(ctx, Event{GPU: i, UUID: w.m.gpus[i].UUID, Kind: KindLost, Detail: nvml.ERROR_GPU_IS_LOST.Error()})
}

func (w *watch) send(ctx context.Context, e Event) {
	w.m.log.Warn("GPU unhealthy", "gpu", e.GPU, "uuid", e.UUID, "kind", e.Kind, "detail", e.Detail)
	select {
	case w.out <- e:
	case <-ctx.Done():
	}
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
