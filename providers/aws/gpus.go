package aws

import "maps"

// gpuSlots is the GPU count of the common EC2 GPU instance types: one worker per GPU. A type
// that is not listed gets 1 slot (or --slots-per-host). Accelerators that are not GPUs
// (Trainium, Inferentia) and fractional-GPU types (g6f) are left out on purpose: their worker
// count is the user's call.
var gpuSlots = map[string]int{
	// P6: NVIDIA B200.
	"p6-b200.48xlarge": 8,
	// P5, P5e, P5en: NVIDIA H100 / H200.
	"p5.4xlarge":    1,
	"p5.48xlarge":   8,
	"p5e.48xlarge":  8,
	"p5en.48xlarge": 8,
	// P4d, P4de: NVIDIA A100.
	"p4d.24xlarge":  8,
	"p4de.24xlarge": 8,
	// P3, P3dn: NVIDIA V100.
	"p3.2xlarge":    1,
	"p3.8xlarge":    4,
	"p3.16xlarge":   8,
	"p3dn.24xlarge": 8,
	// P2: NVIDIA K80 (each board counts as one GPU per chip, as nvidia-smi shows).
	"p2.xlarge":   1,
	"p2.8xlarge":  8,
	"p2.16xlarge": 16,
	// G6e: NVIDIA L40S.
	"g6e.xlarge":   1,
	"g6e.2xlarge":  1,
	"g6e.4xlarge":  1,
	"g6e.8xlarge":  1,
	"g6e.16xlarge": 1,
	"g6e.12xlarge": 4,
	"g6e.24xlarge": 4,
	"g6e.48xlarge": 8,
	// G6, Gr6: NVIDIA L4.
	"g6.xlarge":   1,
	"g6.2xlarge":  1,
	"g6.4xlarge":  1,
	"g6.8xlarge":  1,
	"g6.16xlarge": 1,
	"g6.12xlarge": 4,
	"g6.24xlarge": 4,
	"g6.48xlarge": 8,
	"gr6.4xlarge": 1,
	"gr6.8xlarge": 1,
	// G5: NVIDIA A10G.
	"g5.xlarge":   1,
	"g5.2xlarge":  1,
	"g5.4xlarge":  1,
	"g5.8xlarge":  1,
	"g5.16xlarge": 1,
	"g5.12xlarge": 4,
	"g5.24xlarge": 4,
	"g5.48xlarge": 8,
	// G5g: NVIDIA T4G (Graviton).
	"g5g.xlarge":   1,
	"g5g.2xlarge":  1,
	"g5g.4xlarge":  1,
	"g5g.8xlarge":  1,
	"g5g.16xlarge": 2,
	"g5g.metal":    2,
	// G4dn: NVIDIA T4.
	"g4dn.xlarge":   1,
	"g4dn.2xlarge":  1,
	"g4dn.4xlarge":  1,
	"g4dn.8xlarge":  1,
	"g4dn.16xlarge": 1,
	"g4dn.12xlarge": 4,
	"g4dn.metal":    8,
	// G4ad: AMD Radeon Pro V520.
	"g4ad.xlarge":   1,
	"g4ad.2xlarge":  1,
	"g4ad.4xlarge":  1,
	"g4ad.8xlarge":  2,
	"g4ad.16xlarge": 4,
	// G3: NVIDIA M60.
	"g3s.xlarge":  1,
	"g3.4xlarge":  1,
	"g3.8xlarge":  2,
	"g3.16xlarge": 4,
}

// GPUTable is a copy of the table: instance type → GPUs, hence slots.
func GPUTable() map[string]int { return maps.Clone(gpuSlots) }
