package allreduce

import (
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:noescape
func copyNT(dst, src unsafe.Pointer, blocks int)

// envNonTemporal, set to 0, makes this rank copy into shared-memory rings with ordinary
// stores instead of non-temporal ones: a way back, and a way to compare the two on another
// machine (docs/protocol.md §1.6). Read once, when the package loads.
const envNonTemporal = "ELASTICD_SHM_NONTEMPORAL"

// useNT is a variable so tests can compare both paths of ringCopy.
var useNT = nonTemporal(os.Getenv(envNonTemporal), cpu.X86.HasAVX)

// nonTemporal says whether ringCopy uses non-temporal stores, given envNonTemporal's value and
// whether the CPU has them: unless the variable says 0 (or false, off, no).
func nonTemporal(env string, has bool) bool {
	switch strings.ToLower(strings.TrimSpace(env)) {
	case "0", "false", "off", "no":
		return false
	}
	return has
}

// ntMin is the shortest copy that ringCopy makes with non-temporal stores.
const ntMin = 4 << 10

// ringCopy is copy(dst, src) for bytes going into a shared-memory ring, which the other
// rank reads next: with non-temporal stores, which go to memory instead of this core's
// cache. A normal store must first take each line of the ring back from the core that read
// it the last time round (the peer's), a round trip between cores per line; the peer then
// takes it back. With 2 ranks on this 2-vCPU VM that made 256 KB–64 MB allreduces 1.4–2.5×
// slower (docs/benchmarks.md §17). The ends that are not whole aligned blocks are copied
// normally.
func ringCopy(dst, src []byte) int {
	n := min(len(dst), len(src))
	if !useNT || n < ntMin {
		return copy(dst, src)
	}
	head := int(-uintptr(unsafe.Pointer(unsafe.SliceData(dst))) & 31)
	blocks := (n - head) / 128
	copy(dst[:head], src[:head])
	copyNT(unsafe.Pointer(&dst[head]), unsafe.Pointer(&src[head]), blocks)
	done := head + blocks*128
	copy(dst[done:n], src[done:n])
	return n
}
