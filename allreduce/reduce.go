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
	switch {
	case op == Sum && !srcFirst:
		sumInto(dst, src)
	case op == Sum:
		sumIntoRev(dst, src)
	case op == Max && !srcFirst:
		for i := range dst {
			dst[i] = max(dst[i], src[i])
		}
	case op == Max:
		for i := range dst {
			dst[i] = max(src[i], dst[i])
		}
	case op == Min && !srcFirst:
		for i := range dst {
			dst[i] = min(dst[i], src[i])
		}
	default:
		for i := range dst {
			dst[i] = min(src[i], dst[i])
		}
	}
}

// sumInto is the hot loop of a large allreduce; unrolled by eight with the bounds checks
// hoisted, it runs near memory speed.
func sumInto[T number](dst, src []T) {
	src = src[:len(dst)]
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		d := dst[i : i+8 : i+8]
		s := src[i : i+8 : i+8]
		d[0] += s[0]
		d[1] += s[1]
		d[2] += s[2]
		d[3] += s[3]
		d[4] += s[4]
		d[5] += s[5]
		d[6] += s[6]
		d[7] += s[7]
	}
	for ; i < len(dst); i++ {
		dst[i] += src[i]
	}
}

func sumIntoRev[T number](dst, src []T) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = src[i] + dst[i]
	}
}
