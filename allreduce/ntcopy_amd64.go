package allreduce

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:noescape
func copyNT(dst, src unsafe.Pointer, blocks int)

// ntHardware says whether the CPU has the stores ringCopy's non-temporal path uses (AVX).
var ntHardware = cpu.X86.HasAVX

// ntMin is the shortest copy that ringCopy makes with non-temporal stores.
const ntMin = 4 << 10

// ringCopy is copy(dst, src) for bytes going into a shared-memory ring, which the other
// rank reads next; with nt, by non-temporal stores, which go to memory instead of this
// core's cache (the communicator decides when: ntFrom). A normal store must first take each
// line of the ring back from the core that read it the last time round (the peer's), a
// round trip between cores per line; the peer then takes it back. With 2 ranks on a 2-vCPU
// VM that made 256 KB–64 MB allreduces 1.4–2.5× slower (docs/design-notes/allreduce-tuning.md §9), though not
// where one cache serves both cores (§19). The ends that are not whole aligned blocks are
// copied normally.
func ringCopy(dst, src []byte, nt bool) int {
	n := min(len(dst), len(src))
	if !nt || !ntHardware || n < ntMin {
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
