package protocol_test

import (
	"bytes"
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

// FuzzReadFrame: whatever a peer sends, reading a frame does not panic, and a frame read
// writes back to bytes that read as the same frame.
func FuzzReadFrame(f *testing.F) {
	for _, fr := range []protocol.Frame{
		{Kind: protocol.FrameRequest, ID: 7, Head: protocol.StreamHead{Method: "GET", Target: "/v1/x"}, Body: []byte("b")},
		{Kind: protocol.FramePing},
	} {
		b, _ := protocol.AppendFrame(nil, fr)
		f.Add(b)
	}
	f.Add([]byte{0, 0, 0, 13, 2, 0, 0, 0, 0, 0, 0, 0, 1, 255, 255, 255, 255})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := protocol.ReadFrame(bytes.NewReader(b), 1<<16)
		if err != nil {
			return
		}
		again, err := protocol.AppendFrame(nil, fr)
		if err != nil {
			t.Fatalf("frame %+v read but not written: %v", fr, err)
		}
		back, err := protocol.ReadFrame(bytes.NewReader(again), 1<<16)
		if err != nil || back.Kind != fr.Kind || back.ID != fr.ID || !bytes.Equal(back.Body, fr.Body) || back.Head.Method != fr.Head.Method || back.Head.Target != fr.Head.Target || back.Head.Status != fr.Head.Status {
			t.Fatalf("frame %+v wrote back as %+v (%v)", fr, back, err)
		}
	})
}
