//go:build linux && cgo

package gpu

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Inspect loads NVML (from libPath; "": the system's libnvidia-ml.so.1), reads the host's GPUs
// and their health once, and shuts NVML down. It never fails: what it could not read is in
// the Inventory.
func Inspect(libPath string) Inventory {
	var opts []nvml.LibraryOption
	if libPath != "" {
		opts = append(opts, nvml.WithLibraryPath(libPath))
	}
	return InspectNVML(nvml.New(opts...), libPath)
}

// InspectNVML is Inspect over a given NVML, such as go-nvml's mocks; libPath only names the
// library in what it says.
func InspectNVML(lib nvml.Interface, libPath string) Inventory {
	if libPath == "" {
		libPath = "libnvidia-ml.so.1"
	}
	switch r := lib.Init(); r {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		// After a failed Init no call may reach lib: its C symbols are unresolved.
		return Inventory{Missing: true, Why: "NVML's library " + libPath + " is not installed"}
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return Inventory{Missing: true, Why: "NVML is installed but the NVIDIA kernel driver is not loaded"}
	default:
		return Inventory{Why: fmt.Sprintf("NVML did not initialise: %v", r)}
	}
	defer lib.Shutdown()
	inv := Inventory{Loaded: true}
	if v, r := lib.SystemGetDriverVersion(); r == nvml.SUCCESS {
		inv.DriverVersion = v
	}
	if v, r := lib.SystemGetNVMLVersion(); r == nvml.SUCCESS {
		inv.NVMLVersion = v
	}
	if v, r := lib.SystemGetCudaDriverVersion(); r == nvml.SUCCESS {
		inv.CUDAVersion = cudaVersion(v)
	}
	n, r := lib.DeviceGetCount()
	if r != nvml.SUCCESS {
		inv.Why = fmt.Sprintf("count GPUs: %v", r)
		return inv
	}
	for i := range n {
		g, d, r := describe(lib, i)
		switch r {
		case nvml.SUCCESS:
		case nvml.ERROR_GPU_IS_LOST:
			inv.Devices = append(inv.Devices, Device{GPU: GPU{Index: i}, Faults: []Fault{lost()}})
			continue
		default:
			// The monitor gives up on the whole inventory then (gpu.Open fails).
			inv.Why = fmt.Sprintf("describe GPU %d: %v", i, r)
			return inv
		}
		inv.Devices = append(inv.Devices, Device{GPU: g, Faults: health(d)})
	}
	return inv
}

func lost() Fault {
	return Fault{Kind: KindLost, Detail: "NVML reports the GPU lost (fallen off the bus, or its driver state is broken)"}
}

// health reads the counters that say a GPU is unfit: the uncorrectable ECC errors since the
// driver loaded (each also raised the event the monitor fails a GPU for), pages waiting to be
// retired, and row remappings pending or failed. A counter the GPU does not have (no ECC, a
// generation without page retirement or row remapping) is no fault.
func health(d nvml.Device) []Fault {
	var out []Fault
	n, r := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	switch {
	case r == nvml.ERROR_GPU_IS_LOST:
		return []Fault{lost()}
	case r == nvml.SUCCESS && n > 0:
		out = append(out, Fault{Kind: KindECC, Detail: fmt.Sprintf("%d uncorrectable ECC errors since the driver loaded", n)})
	}
	st, r := d.GetRetiredPagesPendingStatus()
	switch {
	case r == nvml.ERROR_GPU_IS_LOST:
		return []Fault{lost()}
	case r == nvml.SUCCESS && st == nvml.FEATURE_ENABLED:
		out = append(out, Fault{Kind: KindRetiredPages, Detail: "memory pages are waiting to be retired at the next GPU reset"})
	}
	_, unc, pending, failed, r := d.GetRemappedRows()
	switch {
	case r == nvml.ERROR_GPU_IS_LOST:
		return []Fault{lost()}
	case r != nvml.SUCCESS:
	case failed:
		out = append(out, Fault{Kind: KindRowRemap, Detail: "a row remapping failed: the GPU has no spare memory rows left"})
	case pending:
		out = append(out, Fault{Kind: KindRowRemap, Detail: fmt.Sprintf("a row remapping is waiting for the next GPU reset (%d rows remapped for uncorrectable errors)", unc)})
	}
	return out
}
