package providers

import (
	"strings"
	"testing"
)

func checkHosts(t *testing.T, in string, hs []Host) {
	t.Helper()
	seen := map[string]bool{}
	for _, h := range hs {
		switch {
		case h.ID == "" || h.Addr == "":
			t.Fatalf("%q gave a host without ID or address: %+v", in, h)
		case h.Slots < 1 || h.Slots > MaxSlots:
			t.Fatalf("%q gave %d slots: %+v", in, h.Slots, h)
		case seen[h.ID]:
			t.Fatalf("%q gave host %s twice", in, h.ID)
		case strings.ContainsAny(h.ID, " \t\n#"):
			t.Fatalf("%q gave an ID with blanks or a comment: %q", in, h.ID)
		}
		seen[h.ID] = true
	}
}

// FuzzParseHosts: -H lists. Never a panic; what is accepted is hosts with an ID, an address
// and 1..MaxSlots slots, each once.
func FuzzParseHosts(f *testing.F) {
	for _, s := range []string{"10.0.0.5:4,10.0.0.6:4", "gpu1", "[::1]:2", "h:0", "h:99999", "a:1,a:2", ",", "[fe80::1%eth0]:3", "h:-1", "::1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		hs, err := ParseHosts(s, 1)
		if err == nil {
			checkHosts(t, s, hs)
		}
	})
}

// FuzzDiscoveryScriptOutput: a discovery script's stdout, line by line, as --host-discovery-script
// reads it. Never a panic; accepted output gives well-formed hosts, each once.
func FuzzDiscoveryScriptOutput(f *testing.F) {
	for _, s := range []string{"10.0.0.5:4\n10.0.0.6:4\n", "# none\n\n", "h:2 # comment\nh:2\n", "h:2\nh:3\n", "h:x\n", "\x00\n", "[::1]:1\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, out []byte) {
		hs, err := parseScriptOutput(out, 2)
		if err == nil {
			checkHosts(t, string(out), hs)
		}
	})
}
