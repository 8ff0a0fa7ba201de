package protocol_test

import (
	"testing"

	"github.com/elasticd/elasticd/protocol"
)

// FuzzParseWorkerID: whatever the input, parsing does not panic, and an ID it accepts prints
// back to a string that parses to the same ID.
func FuzzParseWorkerID(f *testing.F) {
	for _, s := range []string{"10.0.0.5/0", "local-3/12", "i-0abc/1", "[::1]/0", "h/", "/0", "h/01", "h/-1", "a/b/c", "h/99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := protocol.ParseWorkerID(s)
		if err != nil {
			return
		}
		again, err := protocol.ParseWorkerID(id.String())
		if err != nil || again != id {
			t.Fatalf("%q parsed to %+v, which prints as %q and parses to %+v (%v)", s, id, id.String(), again, err)
		}
	})
}
