//go:build linux && cgo

package gpu_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/elasticd/elasticd/worker/agent/gpu"
)

func TestInventory(t *testing.T) {
	srv := dgxa100.New()
	m, err := gpu.New(srv, testLogger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	got := m.GPUs()
	if len(got) != 8 {
		t.Fatalf("got %d GPUs, want 8", len(got))
	}
	for i, g := range got {
		d := srv.Devices[i].(*dgxa100.Device)
		want := gpu.GPU{Index: i, UUID: d.UUID, Model: "Mock NVIDIA A100-SXM4-40GB", MemoryBytes: 40 << 30}
		if g != want {
			t.Errorf("GPU %d = %+v, want %+v", i, g, want)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n := len(srv.ShutdownCalls()); n != 1 {
		t.Fatalf("Shutdown called %d times, want 1", n)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestInventoryLeavesOutLostGPU(t *testing.T) {
	srv := dgxa100.New()
	srv.Devices[2].(*dgxa100.Device).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST
	}
	m, err := gpu.New(srv, testLogger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer m.Close()
	var idx []int
	for _, g := range m.GPUs() {
		idx = append(idx, g.Index)
	}
	if want := []int{0, 1, 3, 4, 5, 6, 7}; !slices.Equal(idx, want) {
		t.Fatalf("indexes = %v, want %v", idx, want)
	}
}

func TestInitFailure(t *testing.T) {
	for _, tc := range []struct {
		init    nvml.Return
		wantErr bool
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, false},
		{nvml.ERROR_DRIVER_NOT_LOADED, false},
		{nvml.ERROR_NO_PERMISSION, true},
	} {
		t.Run(tc.init.Error(), func(t *testing.T) {
			// Only Init is mocked: any other call would panic, as real unresolved symbols could crash.
			lib := &mock.Interface{InitFunc: func() nvml.Return { return tc.init }}
			m, err := gpu.New(lib, testLogger(t))
			if tc.wantErr {
				if !errors.Is(err, tc.init) {
					t.Fatalf("New error = %v, want %v", err, tc.init)
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if g := m.GPUs(); len(g) != 0 {
				t.Fatalf("GPUs = %v, want none", g)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
			defer cancel()
			if err := m.Watch(ctx, make(chan gpu.Event)); err != nil {
				t.Fatalf("Watch: %v", err)
			}
			if err := m.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
		})
	}
}

// rig is a DGX A100 mock whose event set delivers what the test injects.
type rig struct {
	srv    *dgxa100.Server
	events chan nvml.EventData
	waits  chan nvml.Return // a queued non-SUCCESS result for the next Wait, ahead of events
	es     *mock.EventSet

	mu   sync.Mutex
	regd map[int]uint64 // GPU index → registered event mask
}

func newRig() *rig {
	r := &rig{
		srv:    dgxa100.New(),
		events: make(chan nvml.EventData, 16),
		waits:  make(chan nvml.Return, 16),
		regd:   make(map[int]uint64),
	}
	r.es = &mock.EventSet{
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
			// Short, whatever NVML timeout Watch asks for, so tests see ctx end quickly.
			select {
			case ret := <-r.waits:
				return nvml.EventData{}, ret
			default:
			}
			select {
			case ev := <-r.events:
				return ev, nvml.SUCCESS
			case <-time.After(5 * time.Millisecond):
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		},
	}
	r.srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return r.es, nvml.SUCCESS }
	for i, d := range r.srv.Devices {
		d := d.(*dgxa100.Device)
		d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
			return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError, nvml.SUCCESS
		}
		d.RegisterEventsFunc = func(mask uint64, _ nvml.EventSet) nvml.Return {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.regd[i] = mask
			return nvml.SUCCESS
		}
	}
	return r
}

func (r *rig) uuid(i int) string { return r.srv.Devices[i].(*dgxa100.Device).UUID }

// watchRun is one Watch call in the background.
type watchRun struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when Watch has returned; err is then set
	err    error
}

// start runs Watch over the rig until the test ends.
func (r *rig) start(t *testing.T) (<-chan gpu.Event, *watchRun) {
	t.Helper()
	m, err := gpu.New(r.srv, testLogger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	out := make(chan gpu.Event)
	w := &watchRun{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.err = m.Watch(ctx, out)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-w.done:
		case <-time.After(5 * time.Second):
			t.Error("Watch did not return after cancel")
			return
		}
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return out, w
}

func next(t *testing.T, out <-chan gpu.Event) gpu.Event {
	t.Helper()
	select {
	case e := <-out:
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5s")
		return gpu.Event{}
	}
}

func TestWatchEvents(t *testing.T) {
	xid := func(r *rig, i int, x uint64) nvml.EventData {
		return nvml.EventData{Device: r.srv.Devices[i], EventType: nvml.EventTypeXidCriticalError, EventData: x}
	}
	for _, tc := range []struct {
		name   string
		inject func(r *rig) []nvml.EventData
		want   func(r *rig) gpu.Event
	}{{
		name:   "xid 79 fallen off the bus",
		inject: func(r *rig) []nvml.EventData { return []nvml.EventData{xid(r, 3, 79)} },
		want: func(r *rig) gpu.Event {
			return gpu.Event{GPU: 3, UUID: r.uuid(3), Kind: gpu.KindXID, XID: 79, Detail: "XID 79: GPU has fallen off the bus"}
		},
	}, {
		// Every application XID goes first; the first Event out must be the hardware one after them.
		name: "application xids ignored",
		inject: func(r *rig) []nvml.EventData {
			var evs []nvml.EventData
			for _, x := range []uint64{13, 31, 43, 45, 68, 109} {
				evs = append(evs, xid(r, 1, x))
			}
			return append(evs, xid(r, 6, 48))
		},
		want: func(r *rig) gpu.Event {
			return gpu.Event{GPU: 6, UUID: r.uuid(6), Kind: gpu.KindXID, XID: 48, Detail: "XID 48: double-bit ECC error"}
		},
	}, {
		name: "double-bit ecc",
		inject: func(r *rig) []nvml.EventData {
			return []nvml.EventData{{Device: r.srv.Devices[0], EventType: nvml.EventTypeDoubleBitEccError}}
		},
		want: func(r *rig) gpu.Event {
			return gpu.Event{GPU: 0, UUID: r.uuid(0), Kind: gpu.KindECC, Detail: "double-bit ECC error"}
		},
	}, {
		name: "unknown xid",
		inject: func(r *rig) []nvml.EventData {
			return []nvml.EventData{xid(r, 7, 1234)}
		},
		want: func(r *rig) gpu.Event {
			return gpu.Event{GPU: 7, UUID: r.uuid(7), Kind: gpu.KindXID, XID: 1234, Detail: "XID 1234"}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig()
			for _, ev := range tc.inject(r) {
				r.events <- ev
			}
			out, _ := r.start(t)
			if got, want := next(t, out), tc.want(r); got != want {
				t.Fatalf("event = %+v, want %+v", got, want)
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			for i := range 8 {
				if want := uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError); r.regd[i] != want {
					t.Errorf("GPU %d registered mask %#x, want %#x (no single-bit ECC)", i, r.regd[i], want)
				}
			}
		})
	}
}

func TestWatchGPULost(t *testing.T) {
	r := newRig()
	// GPU 5 answers the inventory, then is gone; the wait reports a lost GPU twice.
	var calls atomic.Int32
	r.srv.Devices[5].(*dgxa100.Device).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		if calls.Add(1) > 1 {
			return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST
		}
		return nvml.Memory{Total: 40 << 30}, nvml.SUCCESS
	}
	r.waits <- nvml.ERROR_GPU_IS_LOST
	r.waits <- nvml.ERROR_GPU_IS_LOST
	r.events <- nvml.EventData{Device: r.srv.Devices[2], EventType: nvml.EventTypeXidCriticalError, EventData: 79}
	out, _ := r.start(t)

	if got, want := next(t, out), (gpu.Event{GPU: 5, UUID: r.uuid(5), Kind: gpu.KindLost, Detail: "ERROR_GPU_IS_LOST"}); got != want {
		t.Fatalf("event = %+v, want %+v", got, want)
	}
	// The second report names no new GPU, so the next Event is the XID, not GPU 5 again.
	if got := next(t, out); got.GPU != 2 || got.Kind != gpu.KindXID || got.XID != 79 {
		t.Fatalf("event = %+v, want XID 79 on GPU 2", got)
	}
}

func TestWatchStopsOnCancel(t *testing.T) {
	r := newRig()
	_, w := r.start(t)
	time.Sleep(20 * time.Millisecond) // let it reach the wait loop
	w.cancel()
	select {
	case <-w.done:
		if w.err != nil {
			t.Fatalf("Watch: %v", w.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Watch did not return after cancel")
	}
	if n := len(r.es.FreeCalls()); n != 1 {
		t.Fatalf("EventSet.Free called %d times, want 1", n)
	}
}

func TestWatchNVMLFailure(t *testing.T) {
	r := newRig()
	r.waits <- nvml.ERROR_UNKNOWN
	_, w := r.start(t)
	select {
	case <-w.done:
		if !errors.Is(w.err, nvml.ERROR_UNKNOWN) {
			t.Fatalf("Watch error = %v, want %v", w.err, nvml.ERROR_UNKNOWN)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Watch did not return the NVML error")
	}
}

// Open against the host's real NVML: no driver here gives zero GPUs, a GPU host gives its GPUs;
// neither is an error.
func TestOpenHost(t *testing.T) {
	m, err := gpu.Open(testLogger(t))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Logf("GPUs: %+v", m.GPUs())
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}
