package allreduce

import (
	"bytes"
	"sync/atomic"
	"testing"
)

// The rest of the suite copies into rings with whichever stores this machine's caches choose
// (ntFrom); this runs the shared-memory ring with both paths and checks they deliver the same
// bytes.
func TestShmRingBothCopies(t *testing.T) {
	for _, nt := range []bool{false, true} {
		a, b := linkPair(t, 64<<10)
		var on atomic.Bool
		on.Store(nt)
		a.nt = &on
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
