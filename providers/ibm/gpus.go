package ibm

import (
	"github.com/IBM/vpc-go-sdk/vpcv1"
	"github.com/elasticd/elasticd/providers"
)

// gpuTable is the accelerator count of the VPC GPU profiles (IBM Cloud docs, "x86-64
// instance profiles", GPU gx2 and gx3 tabs). A profile name spells it too
// (gx3-48x240x2l40s: 48 vCPU, 240 GiB, 2× L40S), but the table is the contract; profiles
// missing from it fall back to the instance's own gpu.count from the API.
var gpuTable = map[string]int{
	// gx2: NVIDIA V100 16 GB.
	"gx2-8x64x1v100":   1,
	"gx2-16x128x1v100": 1,
	"gx2-16x128x2v100": 2,
	"gx2-32x256x2v100": 2,
	// gx3: NVIDIA L4 and L40S.
	"gx3-16x80x1l4":    1,
	"gx3-32x160x2l4":   2,
	"gx3-64x320x4l4":   4,
	"gx3-24x120x1l40s": 1,
	"gx3-48x240x2l40s": 2,
	// gx3d: NVIDIA A100 PCIe, H100, H200; Intel Gaudi 3; AMD MI300X (with instance storage).
	"gx3d-24x120x1a100p":    1,
	"gx3d-48x240x2a100p":    2,
	"gx3d-160x1792x8h100":   8,
	"gx3d-160x1792x8h200":   8,
	"gx3d-160x1792x8gaudi3": 8,
	"gx3d-208x1792x8mi300x": 8,
}

// slotsFor is a host's slot count: the override when positive, else the GPU table, else the
// instance's gpu.count as the API reports it (a profile newer than the table), else 1.
func slotsFor(profile string, gpu *vpcv1.InstanceGpu, override int) int {
	if override <= 0 && gpuTable[profile] == 0 && gpu != nil && gpu.Count != nil && *gpu.Count > 0 {
		return int(min(*gpu.Count, providers.MaxSlots))
	}
	return providers.SlotsFor(profile, gpuTable, override)
}
