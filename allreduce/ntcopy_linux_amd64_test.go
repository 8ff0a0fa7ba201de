package allreduce

import (
	"bytes"
	"testing"
)

// The allreduce suite runs with non-temporal stores where the CPU has AVX; this runs the
// shared-memory ring with both paths and checks they deliver the same bytes.
func TestShmRingBothCopies(t *testing.T) {
	hasNT := useNT
	defer func() { useNT = hasNT }()
	for _, nt := range []bool{false, true} {
		useNT = nt && hasNT
		a, b := linkPair(t, 64<<10)
		msg := make([]byte, 200<<10+13)
		for i := range msg {
			msg[i] = byte(i % 253)
		}
		got := make([]byte, len(msg))
		errc := make(chan error, 1)
		go func() { errc <- b.read(got) }()
		if _, err := a.write([][]byte{msg}, true); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("non-temporal %t: bytes differ through the ring", nt)
		}
	}
}
