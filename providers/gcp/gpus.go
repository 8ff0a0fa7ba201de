package gcp

// gpus is the GPU count of Compute Engine's accelerator-optimized machine types, for
// providers.SlotsFor. An instance's own guestAccelerators come first (N1 VMs with attached
// T4, V100, P100, P4 or L4 GPUs are known only that way); a type not listed here and with no
// accelerators gets 1 slot. Source: cloud.google.com/compute/docs/accelerator-optimized-machines
// and …/gpus.
var gpus = map[string]int{
	// A2 (A100 40 GB, A100 80 GB)
	"a2-highgpu-1g": 1, "a2-highgpu-2g": 2, "a2-highgpu-4g": 4, "a2-highgpu-8g": 8,
	"a2-megagpu-16g": 16,
	"a2-ultragpu-1g": 1, "a2-ultragpu-2g": 2, "a2-ultragpu-4g": 4, "a2-ultragpu-8g": 8,
	// A3 (H100 80 GB; Ultra: H200)
	"a3-highgpu-1g": 1, "a3-highgpu-2g": 2, "a3-highgpu-4g": 4, "a3-highgpu-8g": 8,
	"a3-megagpu-8g": 8, "a3-edgegpu-8g": 8, "a3-ultragpu-8g": 8,
	// A4 (B200), A4X (GB200)
	"a4-highgpu-8g":  8,
	"a4x-highgpu-4g": 4,
	// G2 (L4)
	"g2-standard-4": 1, "g2-standard-8": 1, "g2-standard-12": 1, "g2-standard-16": 1,
	"g2-standard-24": 2, "g2-standard-32": 1, "g2-standard-48": 4, "g2-standard-96": 8,
	// G4 (RTX PRO 6000)
	"g4-standard-48": 1, "g4-standard-96": 2, "g4-standard-192": 4, "g4-standard-384": 8,
}
