package gpu

import "fmt"

// GPU is one device as NVML enumerates it.
type GPU struct {
	Index       int // NVML index, which is also the CUDA index under the default ordering
	UUID        string
	Model       string
	MemoryBytes uint64
}

// Event kinds.
const (
	KindXID  = "xid"  // a critical XID the GPU or driver raised
	KindECC  = "ecc"  // an uncorrectable (double-bit) ECC error
	KindLost = "lost" // NVML answered ERROR_GPU_IS_LOST: the device is gone until reset
)

// Event says that a GPU is no longer fit to train on.
type Event struct {
	GPU    int    // index into GPUs(); -1 when NVML did not say which device
	UUID   string // empty when unknown
	Kind   string // KindXID, KindECC or KindLost
	XID    uint64 // set for KindXID
	Detail string
}

// applicationXIDs are raised by faults in the user's program (illegal address, MMU fault on
// a bad pointer, a killed context...), not by the hardware, so they say nothing about the GPU.
// The list is NVIDIA's, as used by k8s-device-plugin.
var applicationXIDs = map[uint64]bool{13: true, 31: true, 43: true, 45: true, 68: true, 109: true}

// xidText names the XIDs an operator most often meets; the rest print as a number.
var xidText = map[uint64]string{
	48:  "double-bit ECC error",
	63:  "row remapping recorded",
	64:  "row remapping failed",
	74:  "NVLink error",
	79:  "GPU has fallen off the bus",
	92:  "high single-bit ECC error rate",
	94:  "contained ECC error",
	95:  "uncontained ECC error",
	119: "GSP RPC timeout",
	120: "GSP error",
}

func xidDetail(xid uint64) string {
	if s, ok := xidText[xid]; ok {
		return fmt.Sprintf("XID %d: %s", xid, s)
	}
	return fmt.Sprintf("XID %d", xid)
}
