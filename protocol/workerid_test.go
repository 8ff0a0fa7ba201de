package protocol_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/elasticd/elasticd/protocol"
)

func TestParseWorkerID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want protocol.WorkerID
	}{
		{"node-1/0", wid("node-1", 0)},
		{"10.0.0.7:22/3", wid("10.0.0.7:22", 3)},
		{"[fe80::1%eth0]/7", wid("[fe80::1%eth0]", 7)},
		{"i-0abc.ec2.internal/15", wid("i-0abc.ec2.internal", 15)},
		{"zone/a/b/2", wid("zone/a/b", 2)}, // split at the last '/'
		{"h/007", wid("h", 7)},
	} {
		got, err := protocol.ParseWorkerID(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseWorkerID(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if back, err := protocol.ParseWorkerID(got.String()); err != nil || back != got {
			t.Errorf("round trip of %q through %q: %+v, %v", tc.in, got.String(), back, err)
		}
	}
	for _, tc := range []struct{ in, msg string }{
		{"", "want <host>/<slot>"},
		{"node", "want <host>/<slot>"},
		{"/0", "empty host"},
		{"node/", "empty slot"},
		{"node/-1", "not a non-negative decimal"},
		{"node/+1", "not a non-negative decimal"},
		{"node/1x", "not a non-negative decimal"},
		{"node/ 1", "not a non-negative decimal"},
		{"node/99999999999999999999", "out of range"},
		{"no de/1", "space or control"},
		{"no\x00de/1", "space or control"},
		{strings.Repeat("h", 256) + "/1", "longer than"},
	} {
		_, err := protocol.ParseWorkerID(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("ParseWorkerID(%q) = %v; want an error containing %q", tc.in, err, tc.msg)
		}
	}
}

func TestWorkerIDJSON(t *testing.T) {
	m := map[protocol.WorkerID]int{wid("a:1", 0): 1, wid("[::1]", 2): 2}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var back map[protocol.WorkerID]int
	if err := json.Unmarshal(b, &back); err != nil || len(back) != 2 || back[wid("[::1]", 2)] != 2 {
		t.Fatalf("JSON %s came back as %v, %v", b, back, err)
	}
	if _, err := json.Marshal(wid("", 1)); err == nil {
		t.Fatal("an ID with an empty host marshalled")
	}
}

func wid(host string, slot int) protocol.WorkerID { return protocol.WorkerID{Host: host, Slot: slot} }

// Compare orders as the text forms do, hosts that are prefixes of each other and slots of
// different lengths included, and allocates nothing.
func TestWorkerIDCompare(t *testing.T) {
	hosts := []string{"a", "a-b", "a.b", "a/b", "a0", "ab", "local-1", "local-10", "ip-10-0-0-1", "ip-10-0-0-1.ec2", "[::1]:22", "b"}
	slots := []int{0, 1, 2, 9, 10, 11, 100}
	var ids []protocol.WorkerID
	for _, h := range hosts {
		for _, s := range slots {
			ids = append(ids, protocol.WorkerID{Host: h, Slot: s})
		}
	}
	for _, a := range ids {
		for _, b := range ids {
			if got, want := a.Compare(b), strings.Compare(a.String(), b.String()); got != want {
				t.Errorf("%v.Compare(%v) = %d, want %d", a, b, got, want)
			}
		}
	}
	a, b := protocol.WorkerID{Host: "ip-10-0-0-1", Slot: 7}, protocol.WorkerID{Host: "ip-10-0-0-1.ec2", Slot: 12}
	if n := testing.AllocsPerRun(100, func() { a.Compare(b) }); n != 0 {
		t.Errorf("Compare allocates %v times", n)
	}
}
