package allreduce

import (
	"fmt"
	"unsafe"
)

// Op is a reduction operation.
type Op uint8

const (
	Sum Op = iota + 1
	Max
	Min
)

func (o Op) String() string {
	switch o {
	case Sum:
		return "sum"
	case Max:
		return "max"
	case Min:
		return "min"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

type dtype uint8

const (
	dtBytes dtype = iota + 1
	dtFloat32
	dtFloat64
	dtInt64
)

func (d dtype) size() int {
	switch d {
	case dtFloat32:
		return 4
	case dtFloat64, dtInt64:
		return 8
	}
	return 1
}

func (d dtype) String() string {
	return [...]string{"invalid", "bytes", "float32", "float64", "int64"}[min(int(d), 4)]
}

// asBytes views a supported slice as bytes without copying.
func asBytes(data any) ([]byte, dtype, error) {
	switch s := data.(type) {
	case []byte:
		return s, dtBytes, nil
	case []float32:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*4), dtFloat32, nil
	case []float64:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*8), dtFloat64, nil
	case []int64:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*8), dtInt64, nil
	}
	return nil, 0, fmt.Errorf("unsupported buffer type %T: use []float32, []float64 or []int64 ([]byte for Broadcast)", data)
}

func view[T any](b []byte) []T {
	if len(b) == 0 {
		// An empty piece (the hierarchical allreduce's rings may have some) can point into a
		// tiny allocation not aligned for T, which checkptr rejects even with no element.
		return nil
	}
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(z)))
}

// reduceInto sets dst[i] = dst[i] op src[i], or src[i] op dst[i] when srcFirst. The operand
// order matters only for NaN payloads, but it is what keeps every rank bit-identical.
func reduceInto(dst, src []byte, dt dtype, op Op, srcFirst bool) {
	if op == Sum {
		n := sumBytes(dst, src, dt, srcFirst) // vector kernel, where the CPU has one
		dst, src = dst[n:], src[n:]
	}
	switch dt {
	case dtFloat32:
		reduceT(view[float32](dst), view[float32](src), op, srcFirst)
	case dtFloat64:
		reduceT(view[float64](dst), view[float64](src), op, srcFirst)
	case dtInt64:
		reduceT(view[int64](dst), view[int64](src), op, srcFirst)
	default:
		panic("allreduce: reduce on " + dt.String())
	}
}

type number interface{ ~float32 | ~float64 | ~int64 }

func reduceT[T number](dst, src []T, op Op, srcFirst bool) {
	first, second := dst, src
	if srcFirst {
		first, second = src, dst
	}
	switch op {
	case Sum:
		sumOrdered(dst, first, second)
	case Max:
		maxOrdered(dst, first, second)
	default:
		minOrdered(dst, first, second)
	}
}

// sumOrdered sets out[i] = a[i] + b[i] (out is a or b), with a's payload when both are NaN,
// as the vector kernels (and x86's add) give it: a rank may reduce one element with the
// kernel and its partner with this loop (where pieces end differs between them), so the
// two must agree bit for bit. The compiler may put a float add's operands either way
// round, so a NaN a is returned explicitly (a + a: quieted, its payload kept). Unrolled by
// eight with the bounds checks hoisted.
func sumOrdered[T number](out, a, b []T) {
	a, b = a[:len(out)], b[:len(out)]
	i := 0
	for ; i+8 <= len(out); i += 8 {
		o := out[i : i+8 : i+8]
		x := a[i : i+8 : i+8]
		y := b[i : i+8 : i+8]
		o[0] = add(x[0], y[0])
		o[1] = add(x[1], y[1])
		o[2] = add(x[2], y[2])
		o[3] = add(x[3], y[3])
		o[4] = add(x[4], y[4])
		o[5] = add(x[5], y[5])
		o[6] = add(x[6], y[6])
		o[7] = add(x[7], y[7])
	}
	for ; i < len(out); i++ {
		out[i] = add(a[i], b[i])
	}
}

// add is a + b with a's payload when a is NaN, whichever way the compiler orders the add.
func add[T number](a, b T) T {
	if a != a { // NaN; never for int64
		return a + a
	}
	return a + b
}

// maxOrdered sets out[i] = max(a[i], b[i]). Max and min have no vector kernel: every
// element of a buffer goes through this one body, never inlined, so the two ranks of an
// exchange, calling it as (dst, dst, src) and (dst, src, dst), run the same instructions on
// the same operands, whichever NaN Go's max keeps.
//
//go:noinline
func maxOrdered[T number](out, a, b []T) {
	b = b[:len(a)]
	for i := range out {
		out[i] = max(a[i], b[i])
	}
}

// minOrdered is maxOrdered for min.
//
//go:noinline
func minOrdered[T number](out, a, b []T) {
	b = b[:len(a)]
	for i := range out {
		out[i] = min(a[i], b[i])
	}
}
