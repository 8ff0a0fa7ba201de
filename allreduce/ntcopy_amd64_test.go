package allreduce

import (
	"bytes"
	"testing"
)

// ringCopy must copy exactly what copy does, whatever the lengths and the alignment of
// either end: the non-temporal body covers only whole aligned blocks of dst.
func TestRingCopyMatchesCopy(t *testing.T) {
	if !ntHardware {
		t.Skip("no AVX: ringCopy is copy")
	}
	src := make([]byte, 3*ntMin+1000)
	for i := range src {
		src[i] = byte(i*7 + i/251)
	}
	dst := make([]byte, len(src)+64)
	for _, n := range []int{0, 1, ntMin - 1, ntMin, ntMin + 1, ntMin + 127, ntMin + 128, 2*ntMin + 77, 3 * ntMin} {
		for _, do := range []int{0, 1, 8, 31, 32, 33} {
			for _, so := range []int{0, 3, 32} {
				clear(dst)
				got := ringCopy(dst[do:do+n], src[so:so+n], true)
				if got != n || !bytes.Equal(dst[do:do+n], src[so:so+n]) {
					t.Fatalf("n %d, dst offset %d, src offset %d: copied %d, bytes differ: %t", n, do, so, got, !bytes.Equal(dst[do:do+n], src[so:so+n]))
				}
				if bytes.ContainsFunc(dst[:do], func(r rune) bool { return r != 0 }) || bytes.ContainsFunc(dst[do+n:], func(r rune) bool { return r != 0 }) {
					t.Fatalf("n %d, dst offset %d, src offset %d: wrote outside dst", n, do, so)
				}
			}
		}
	}
	// Shorter of the two, as copy.
	if got := ringCopy(dst[:ntMin], src[:2*ntMin], true); got != ntMin {
		t.Fatalf("copied %d of a %d-byte dst", got, ntMin)
	}
}
