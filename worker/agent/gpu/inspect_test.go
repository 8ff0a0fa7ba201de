//go:build linux && cgo

package gpu_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/elasticd/elasticd/worker/agent/gpu"
)

// health sets GPU i's health counters: uncorrectable ECC errors, pages pending retirement,
// row remapping pending and failed.
func health(srv *dgxa100.Server, i int, ecc uint64, pages bool, pending, failed bool) {
	d := srv.Devices[i].(*dgxa100.Device)
	d.GetTotalEccErrorsFunc = func(typ nvml.MemoryErrorType, counter nvml.EccCounterType) (uint64, nvml.Return) {
		if typ != nvml.MEMORY_ERROR_TYPE_UNCORRECTED || counter != nvml.VOLATILE_ECC {
			return 99, nvml.SUCCESS // a count Inspect must not read
		}
		return ecc, nvml.SUCCESS
	}
	d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
		if pages {
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_DISABLED, nvml.SUCCESS
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 3, pending, failed, nvml.SUCCESS }
}

// Inspect reads a DGX A100's versions, inventory and health: one healthy GPU, one with ECC
// errors, pages pending, a row remap pending, one failed, one lost, and counters a GPU does
// not have.
func TestInspect(t *testing.T) {
	srv := dgxa100.New()
	for i := range srv.Devices {
		health(srv, i, 0, false, false, false)
	}
	health(srv, 1, 2, false, false, false)
	health(srv, 2, 0, true, false, false)
	health(srv, 3, 0, false, true, false)
	health(srv, 4, 0, false, false, true)
	srv.Devices[5].(*dgxa100.Device).GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
	d6 := srv.Devices[6].(*dgxa100.Device)
	d6.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	d6.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	d6.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 0, false, false, nvml.ERROR_NOT_SUPPORTED }
	srv.Devices[7].(*dgxa100.Device).GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_GPU_IS_LOST }

	inv := gpu.InspectNVML(srv, "")
	if !inv.Loaded || inv.Why != "" || inv.DriverVersion != "550.54.15" || inv.NVMLVersion != "12.550.54.15" || inv.CUDAVersion != "12.4" {
		t.Fatalf("Inspect = %+v", inv)
	}
	if len(inv.Devices) != 8 {
		t.Fatalf("%d devices, want 8 (the lost ones too)", len(inv.Devices))
	}
	kinds := func(d gpu.Device) []string {
		var k []string
		for _, f := range d.Faults {
			k = append(k, f.Kind)
		}
		return k
	}
	want := [][]string{nil, {gpu.KindECC}, {gpu.KindRetiredPages}, {gpu.KindRowRemap}, {gpu.KindRowRemap}, {gpu.KindLost}, nil, {gpu.KindLost}}
	for i, d := range inv.Devices {
		if d.Index != i || !slices.Equal(kinds(d), want[i]) {
			t.Errorf("GPU %d: index %d, faults %+v; want %v", i, d.Index, d.Faults, want[i])
		}
	}
	if d := inv.Devices[0]; d.UUID == "" || d.Model != "Mock NVIDIA A100-SXM4-40GB" || d.MemoryBytes != 40<<30 {
		t.Errorf("GPU 0: %+v", d.GPU)
	}
	if f := inv.Devices[1].Faults[0].Detail; !strings.Contains(f, "2 uncorrectable ECC errors") {
		t.Errorf("ECC fault: %q", f)
	}
	if f := inv.Devices[4].Faults[0].Detail; !strings.Contains(f, "failed") {
		t.Errorf("failed remap: %q", f)
	}
	if f := inv.Devices[3].Faults[0].Detail; !strings.Contains(f, "waiting for the next GPU reset (3 rows") {
		t.Errorf("pending remap: %q", f)
	}
	// The monitor's view: every GPU but the lost.
	if n := len(inv.GPUs()); n != 6 {
		t.Errorf("GPUs() = %d, want 6", n)
	}
	if n := len(srv.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times, want 1", n)
	}
}

func TestInspectFailures(t *testing.T) {
	for _, tc := range []struct {
		init    nvml.Return
		missing bool
		why     string
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, true, "NVML's library libnvidia-ml.so.1 is not installed"},
		{nvml.ERROR_DRIVER_NOT_LOADED, true, "kernel driver is not loaded"},
		{nvml.ERROR_NO_PERMISSION, false, "NVML did not initialise"},
	} {
		t.Run(tc.init.Error(), func(t *testing.T) {
			// Only Init is mocked: any other call would panic, as unresolved symbols could crash.
			inv := gpu.InspectNVML(&mock.Interface{InitFunc: func() nvml.Return { return tc.init }}, "")
			if inv.Loaded || inv.Missing != tc.missing || !strings.Contains(inv.Why, tc.why) || len(inv.Devices) != 0 {
				t.Fatalf("Inspect = %+v, want missing %v, why %q", inv, tc.missing, tc.why)
			}
		})
	}

	// An inventory NVML cannot complete: the monitor would give up on the GPUs.
	srv := dgxa100.New()
	for i := range srv.Devices {
		health(srv, i, 0, false, false, false)
	}
	srv.Devices[2].(*dgxa100.Device).GetNameFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
	inv := gpu.InspectNVML(srv, "")
	if !inv.Loaded || !strings.Contains(inv.Why, "describe GPU 2") {
		t.Fatalf("Inspect = %+v, want loaded, and why the GPUs could not be listed", inv)
	}
	if n := len(srv.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times, want 1", n)
	}

	// The real loader, pointed at a library that is not there.
	path := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	inv = gpu.Inspect(path)
	if inv.Loaded || !inv.Missing || !strings.Contains(inv.Why, path) {
		t.Fatalf("Inspect(%s) = %+v, want missing, naming it", path, inv)
	}
}
