package protocol_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"reflect"
	"testing"

	"github.com/elasticd/elasticd/protocol"
)

// Frames read back as written, one after another on one stream.
func TestFramesRoundTrip(t *testing.T) {
	frames := []protocol.Frame{
		{Kind: protocol.FrameRequest, ID: 1, Head: protocol.StreamHead{Method: "POST", Target: "/v1/workers/h%2F0/state", Header: http.Header{"X-Elasticd-Nonce": {"ab"}}}, Body: []byte(`{"generation":3}`)},
		{Kind: protocol.FrameAnswer, ID: 1, Head: protocol.StreamHead{Status: 204, Header: http.Header{}}},
		{Kind: protocol.FrameCancel, ID: 1 << 40},
		{Kind: protocol.FramePing},
	}
	var b []byte
	for _, f := range frames {
		var err error
		if b, err = protocol.AppendFrame(b, f); err != nil {
			t.Fatal(err)
		}
	}
	r := bytes.NewReader(b)
	for _, want := range frames {
		got, err := protocol.ReadFrame(r, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if want.Kind == protocol.FrameAnswer && got.Head.Header == nil {
			got.Head.Header = http.Header{} // an empty header is omitted
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("read %+v, want %+v", got, want)
		}
	}
	if _, err := protocol.ReadFrame(r, 1<<20); err != io.EOF {
		t.Errorf("after the last frame: %v, want io.EOF", err)
	}
}

// A frame larger than the reader's limit, cut short, or whose head overruns it is an error,
// not a read of whatever follows.
func TestFrameRefusals(t *testing.T) {
	big, _ := protocol.AppendFrame(nil, protocol.Frame{Kind: protocol.FrameRequest, ID: 2, Body: make([]byte, 1000)})
	if _, err := protocol.ReadFrame(bytes.NewReader(big), 500); !errors.Is(err, protocol.ErrFrameTooLarge) {
		t.Errorf("a frame over the limit: %v, want ErrFrameTooLarge", err)
	}
	if _, err := protocol.ReadFrame(bytes.NewReader(big[:len(big)-1]), 1<<20); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("a frame cut short: %v, want io.ErrUnexpectedEOF", err)
	}
	bad := bytes.Clone(big)
	binary.BigEndian.PutUint32(bad[13:17], 5000) // the head's length, past the frame's end
	if _, err := protocol.ReadFrame(bytes.NewReader(bad), 1<<20); err == nil {
		t.Error("a head longer than its frame was read")
	}
	tiny := []byte{0, 0, 0, 3, 1, 0, 0}
	if _, err := protocol.ReadFrame(bytes.NewReader(tiny), 1<<20); err == nil {
		t.Error("a frame shorter than its fixed part was read")
	}
	if _, err := protocol.AppendFrame(nil, protocol.Frame{Kind: protocol.FrameAnswer, Body: make([]byte, protocol.MaxStreamFrame)}); err == nil {
		t.Error("a frame over MaxStreamFrame was written")
	}
}
