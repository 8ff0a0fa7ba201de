package agent_test

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/proc"
	"github.com/elasticd/elasticd/worker/agent"
	"github.com/elasticd/elasticd/worker/agent/gpu"
)

// fourGPUs is a host as NVML lists it: indices 0-3, each with a UUID.
func fourGPUs() *busyGPUs {
	return &busyGPUs{fakeGPUs: fakeGPUs{gpus: []gpu.GPU{
		{Index: 0, UUID: "GPU-0aaa"}, {Index: 1, UUID: "GPU-1bbb"}, {Index: 2, UUID: "GPU-2ccc"}, {Index: 3, UUID: "GPU-2cdd"},
	}, faults: make(chan gpu.Event)}, busy: []float64{0.1, 0.2, 0.3, 0.4}}
}

// The agent's CUDA_VISIBLE_DEVICES picks GPUs by index or UUID (a prefix will do), in its
// order; a negative index ends the list, as in CUDA; what names no GPU, or one twice, or a MIG
// device, is an error that names the entry.
func TestVisibleGPUs(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want []int  // the NVML indices offered, in order
		err  string // part of the error, when one is wanted
	}{
		{"2,3", []int{2, 3}, ""},
		{"3, 0", []int{3, 0}, ""},
		{"GPU-1bbb,GPU-0", []int{1, 0}, ""},
		{"gpu-2cc", []int{2}, ""},
		{"1,-1,2", []int{1}, ""},
		{"-1", nil, ""},
		{"4", nil, "no GPU 4 on this host (NVML lists 0, 1, 2, 3)"},
		{"GPU-9", nil, `no GPU with UUID "GPU-9"`},
		{"GPU-2c", nil, `"GPU-2c" is the start of more than one GPU's UUID (GPU-2ccc, GPU-2cdd)`},
		{"1,GPU-1bbb", nil, `"GPU-1bbb" names GPU 1 again`},
		{"MIG-abcd", nil, "is a MIG device"},
		{"first", nil, `"first" is neither a GPU index nor a UUID`},
	} {
		v, err := agent.VisibleGPUs(fourGPUs(), tc.spec)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "CUDA_VISIBLE_DEVICES="+tc.spec) {
				t.Errorf("%q: error %v, want one containing %q and the value", tc.spec, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.spec, err)
			continue
		}
		var got []int
		for _, g := range v.GPUs() {
			got = append(got, g.Index)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: offers GPUs %v, want %v", tc.spec, got, tc.want)
		}
	}
}

// Through the narrowed source the agent registers the operator's GPUs alone, workers see only
// them, a fault of one of them reaches the driver as the slot that uses it, a fault of another
// GPU does not, and the busy fraction is the mean of the offered GPUs'.
func TestAgentOffersVisibleGPUs(t *testing.T) {
	d := startDriver(t, "127.0.0.1:0", "job-1")
	all := fourGPUs()
	v, err := agent.VisibleGPUs(all, "3,1")
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, agent.Config{DriverURL: d.url(), GPUs: v, LoadEvery: 20 * time.Millisecond})
	info := d.waitAgents(1)
	if info[0].Slots != 2 || len(info[0].GPUs) != 2 || info[0].GPUs[0].UUID != "GPU-2cdd" || info[0].GPUs[1].UUID != "GPU-1bbb" {
		t.Fatalf("agent registered %d slots and GPUs %+v; want 2: GPU 3, then GPU 1", info[0].Slots, info[0].GPUs)
	}
	for slot, want := range []string{"GPU-2cdd,GPU-1bbb", "GPU-1bbb,GPU-2cdd"} {
		var out logBuf
		p, err := d.reg.Launcher().Start(t.Context(), proc.Spec{
			Name: "rank", Host: "127.0.0.2", Slot: slot, Env: []string{"LOCAL_RANK=0"},
			Command: []string{"sh", "-c", `echo "$CUDA_VISIBLE_DEVICES"`}, Stdout: &out,
		})
		if err != nil {
			t.Fatal(err)
		}
		if st, err := p.Wait(); err != nil || st.Code != 0 {
			t.Fatalf("Wait = %v, %v", st, err)
		}
		if got := strings.TrimSpace(out.String()); got != want {
			t.Errorf("slot %d: CUDA_VISIBLE_DEVICES=%q, want %q", slot, got, want)
		}
	}
	// GPU 2 is not offered: its fault is dropped. GPU 1 is the second offered: slot 1's.
	all.faults <- gpu.Event{GPU: 2, UUID: "GPU-2ccc", Kind: gpu.KindXID, XID: 79}
	all.faults <- gpu.Event{GPU: 1, UUID: "GPU-1bbb", Kind: gpu.KindXID, XID: 79, Detail: "XID 79"}
	select {
	case f := <-d.reg.Faults():
		if len(f.Slots) != 1 || f.Slots[0] != 1 || !strings.Contains(f.Reason, "GPU-1bbb") {
			t.Fatalf("fault %+v: want slot 1, GPU-1bbb (the fault of GPU 2 is not this agent's)", f)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no fault reached the driver")
	}
	waitFor(t, "the offered GPUs' busy fraction", 10*time.Second, func() bool { return math.Abs(d.reg.GPUBusy()["host-a"]-0.3) < 1e-9 })
}

// Watch ends when its context does, as the source's does.
func TestVisibleGPUsWatchEnds(t *testing.T) {
	v, err := agent.VisibleGPUs(fourGPUs(), "0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- v.Watch(ctx, make(chan gpu.Event)) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Watch = %v, want nil once its context ended", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Watch did not return after its context ended")
	}
}
