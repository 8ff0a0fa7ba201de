package allreduce

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:noescape
func addF32AVX2(dst, src unsafe.Pointer, blocks int)

//go:noescape
func addF64AVX2(dst, src unsafe.Pointer, blocks int)

//go:noescape
func addI64AVX2(dst, src unsafe.Pointer, blocks int)

//go:noescape
func addF32AVX2Rev(dst, src unsafe.Pointer, blocks int)

//go:noescape
func addF64AVX2Rev(dst, src unsafe.Pointer, blocks int)

// useAVX2 is a variable so tests can compare the vector kernels with the Go loop.
var useAVX2 = cpu.X86.HasAVX2

// sumBytes adds src into dst element-wise, src as the first operand when srcFirst; it
// returns the number of bytes done, a multiple of 128, leaving the rest to the Go loop.
func sumBytes(dst, src []byte, dt dtype, srcFirst bool) int {
	blocks := min(len(dst), len(src)) / 128
	if !useAVX2 || blocks == 0 {
		return 0
	}
	d, s := unsafe.Pointer(unsafe.SliceData(dst)), unsafe.Pointer(unsafe.SliceData(src))
	switch {
	case dt == dtFloat32 && srcFirst:
		addF32AVX2Rev(d, s, blocks)
	case dt == dtFloat32:
		addF32AVX2(d, s, blocks)
	case dt == dtFloat64 && srcFirst:
		addF64AVX2Rev(d, s, blocks)
	case dt == dtFloat64:
		addF64AVX2(d, s, blocks)
	case dt == dtInt64: // exact: the order of the operands cannot show
		addI64AVX2(d, s, blocks)
	default:
		return 0
	}
	return blocks * 128
}
