package gpu

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// A one-time look at the host's GPUs, for `elasticd agent --check`: what NVML reports, what
// the agent would offer, and what its monitor would count as failed, read from NVML's
// counters instead of waited for as events.

// More kinds of Fault, besides KindECC and KindLost, that only Inspect reads: they are states a
// GPU is in, not events the monitor hears.
const (
	// KindRetiredPages: memory pages wait to be retired, which happens at the next reset.
	KindRetiredPages = "retired-pages"
	// KindRowRemap: a row remapping waits for the next reset, or failed (the GPU is out of
	// spare rows).
	KindRowRemap = "row-remap"
)

// Inventory is what Inspect found.
type Inventory struct {
	// Loaded says whether NVML loaded and initialised. Why says why not; Missing is set when
	// NVML's library or the NVIDIA kernel driver is not on the machine (as opposed to NVML
	// failing), and Unsupported when this build cannot use NVML at all (no cgo).
	Loaded      bool
	Why         string
	Missing     bool
	Unsupported bool
	// DriverVersion, NVMLVersion and CUDAVersion ("12.4") are empty when NVML cannot say.
	DriverVersion, NVMLVersion, CUDAVersion string
	// Devices are every GPU NVML counts, in index order, lost ones included.
	Devices []Device
}

// Device is one GPU and what makes it unfit to train on.
type Device struct {
	GPU
	// Faults are empty for a healthy GPU.
	Faults []Fault
}

// Fault is one reason a GPU is unfit: KindLost, KindECC, KindRetiredPages or KindRowRemap.
type Fault struct {
	Kind   string
	Detail string
}

// Lost reports whether NVML lost the GPU: the monitor leaves such a GPU out of its inventory.
func (d Device) Lost() bool {
	return slices.ContainsFunc(d.Faults, func(f Fault) bool { return f.Kind == KindLost })
}

// GPUs are the GPUs the monitor would report (Monitor.GPUs): every device but the lost ones.
func (inv Inventory) GPUs() []GPU {
	var out []GPU
	for _, d := range inv.Devices {
		if !d.Lost() {
			out = append(out, d.GPU)
		}
	}
	return out
}

// cudaVersion formats NVML's CUDA driver version (12040) as CUDA does (12.4).
func cudaVersion(v int) string {
	if v <= 0 {
		return ""
	}
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}

// NVIDIAVendor is NVIDIA's PCI vendor ID, as sysfs writes it.
const NVIDIAVendor = "0x10de"

// PCIDevice is an NVIDIA device on the PCI bus.
type PCIDevice struct {
	Address string // 0000:00:1e.0
	Class   string // 0x030200; "" when sysfs does not say
}

// IsGPU reports whether the device is a display or 3D controller (PCI class 0x03), not one of
// the other functions NVIDIA boards have (audio, USB, NVSwitch bridges).
func (d PCIDevice) IsGPU() bool { return d.Class == "" || strings.HasPrefix(d.Class, "0x03") }

// NVIDIAPCI lists the NVIDIA devices that sysfs, mounted at sysRoot ("/sys" on a host), shows on
// the PCI bus: the GPUs the machine has, whether or not a driver is installed to use them. A
// machine without a PCI bus in sysfs has none.
func NVIDIAPCI(sysRoot string) ([]PCIDevice, error) {
	dir := filepath.Join(sysRoot, "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list PCI devices: %w", err)
	}
	var out []PCIDevice
	for _, e := range entries {
		vendor, err := os.ReadFile(filepath.Join(dir, e.Name(), "vendor"))
		if err != nil || !strings.EqualFold(strings.TrimSpace(string(vendor)), NVIDIAVendor) {
			continue
		}
		class, _ := os.ReadFile(filepath.Join(dir, e.Name(), "class"))
		out = append(out, PCIDevice{Address: e.Name(), Class: strings.ToLower(strings.TrimSpace(string(class)))})
	}
	return out, nil
}
