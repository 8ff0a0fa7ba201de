package gpu_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/elasticd/elasticd/worker/agent/gpu"
)

// fakeSys writes a sysfs with PCI devices: address -> vendor and class.
func fakeSys(t *testing.T, devices map[string][2]string) string {
	t.Helper()
	root := t.TempDir()
	for addr, vc := range devices {
		dir := filepath.Join(root, "bus", "pci", "devices", addr)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, v := range map[string]string{"vendor": vc[0], "class": vc[1]} {
			if v == "" {
				continue
			}
			if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

func TestNVIDIAPCI(t *testing.T) {
	root := fakeSys(t, map[string][2]string{
		"0000:00:1e.0": {"0x10de", "0x030200"}, // an A100
		"0000:00:1e.1": {"0x10DE", "0x040300"}, // its audio function
		"0000:00:1f.0": {"0x10de", ""},         // no class file
		"0000:00:03.0": {"0x1d0f", "0x020000"}, // an ENA network card
		"0000:00:04.0": {"", ""},               // no vendor file
	})
	got, err := gpu.NVIDIAPCI(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []gpu.PCIDevice{{Address: "0000:00:1e.0", Class: "0x030200"}, {Address: "0000:00:1e.1", Class: "0x040300"}, {Address: "0000:00:1f.0"}}
	if !slices.Equal(got, want) {
		t.Fatalf("NVIDIAPCI = %+v, want %+v", got, want)
	}
	var gpus []string
	for _, d := range got {
		if d.IsGPU() {
			gpus = append(gpus, d.Address)
		}
	}
	if !slices.Equal(gpus, []string{"0000:00:1e.0", "0000:00:1f.0"}) {
		t.Errorf("GPUs among them: %v", gpus)
	}

	// A machine without a PCI bus in sysfs (a container, another OS) has no NVIDIA device.
	if got, err := gpu.NVIDIAPCI(t.TempDir()); err != nil || len(got) != 0 {
		t.Errorf("no sysfs: %v, %v; want none and no error", got, err)
	}
	// A PCI directory that cannot be read is an error, not "no GPU".
	bad := t.TempDir()
	if err := os.MkdirAll(filepath.Join(bad, "bus", "pci"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "bus", "pci", "devices"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := gpu.NVIDIAPCI(bad); err == nil {
		t.Error("an unreadable PCI device list gave no error")
	}
}
