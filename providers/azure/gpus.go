package azure

// gpus is the GPU count of Azure's GPU VM sizes, the slots of a host when --slots-per-host
// is not given. Keys are lower case: Azure compares size names without regard to case.
// Sizes that share one GPU among several VMs (NVadsA10_v5 under 36 vCPUs, NVv4, NGads V620)
// are left out and get one slot. docs/providers/azure.md lists the same table; a test
// checks that the two agree.
var gpus = map[string]int{
	// NCv3: NVIDIA V100 16 GB.
	"standard_nc6s_v3":   1,
	"standard_nc12s_v3":  2,
	"standard_nc24s_v3":  4,
	"standard_nc24rs_v3": 4,
	// NCasT4_v3: NVIDIA T4.
	"standard_nc4as_t4_v3":  1,
	"standard_nc8as_t4_v3":  1,
	"standard_nc16as_t4_v3": 1,
	"standard_nc64as_t4_v3": 4,
	// NC A100 v4: NVIDIA A100 80 GB PCIe.
	"standard_nc24ads_a100_v4": 1,
	"standard_nc48ads_a100_v4": 2,
	"standard_nc96ads_a100_v4": 4,
	// NCads H100 v5 and NCCads H100 v5 (confidential): NVIDIA H100 NVL.
	"standard_nc40ads_h100_v5":  1,
	"standard_nc80adis_h100_v5": 2,
	"standard_ncc40ads_h100_v5": 1,
	// NVv3: NVIDIA M60; NVadsA10_v5 sizes with whole A10 GPUs.
	"standard_nv12s_v3":        1,
	"standard_nv24s_v3":        2,
	"standard_nv48s_v3":        4,
	"standard_nv36ads_a10_v5":  1,
	"standard_nv36adms_a10_v5": 1,
	"standard_nv72ads_a10_v5":  2,
	// NDv2: 8 NVIDIA V100 32 GB.
	"standard_nd40rs_v2": 8,
	// ND A100 v4 and NDm A100 v4: 8 NVIDIA A100 40 GB / 80 GB.
	"standard_nd96asr_v4":       8,
	"standard_nd96amsr_a100_v4": 8,
	// ND H100 v5, ND H200 v5, ND MI300X v5: 8 GPUs each.
	"standard_nd96isr_h100_v5":   8,
	"standard_nd96isr_h200_v5":   8,
	"standard_nd96isr_mi300x_v5": 8,
	// ND GB200 v6: 4 NVIDIA Blackwell GPUs.
	"standard_nd128isr_ndr_gb200_v6": 4,
}
