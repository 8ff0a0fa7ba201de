package providers_test

import (
	"strings"
	"testing"

	"github.com/elasticd/elasticd/providers"
)

func TestParseHosts(t *testing.T) {
	h := func(id string, slots int) providers.Host { return providers.Host{ID: id, Addr: id, Slots: slots} }
	tests := []struct {
		spec string
		want []providers.Host
	}{
		{"a", []providers.Host{h("a", 3)}},
		{"a:1", []providers.Host{h("a", 1)}},
		{"gpu-1:4,gpu-2", []providers.Host{h("gpu-1", 4), h("gpu-2", 3)}},
		{" gpu-1:4 , gpu-2 ", []providers.Host{h("gpu-1", 4), h("gpu-2", 3)}},
		{"Node-A.Example.COM:2", []providers.Host{h("node-a.example.com", 2)}},
		{"10.0.0.2:8,10.0.0.10", []providers.Host{h("10.0.0.2", 8), h("10.0.0.10", 3)}},
		{"[::1]:2", []providers.Host{h("::1", 2)}},
		{"[::1]", []providers.Host{h("::1", 3)}},
		{"[FD00:0:0::02]:4", []providers.Host{h("fd00::2", 4)}},
		{"[fe80::1%eth0]:1", []providers.Host{h("fe80::1%eth0", 1)}},
		{"host_1:4096", []providers.Host{h("host_1", 4096)}},
		{"localhost,127.0.0.1", []providers.Host{h("localhost", 3), h("127.0.0.1", 3)}},
	}
	for _, tt := range tests {
		got, err := providers.ParseHosts(tt.spec, 3)
		if err != nil {
			t.Errorf("ParseHosts(%q): %v", tt.spec, err)
			continue
		}
		if len(got) != len(tt.want) {
			t.Errorf("ParseHosts(%q) = %v; want %v", tt.spec, got, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("ParseHosts(%q)[%d] = %+v; want %+v", tt.spec, i, got[i], tt.want[i])
			}
		}
	}
}

func TestParseHostsErrors(t *testing.T) {
	// Every error names the entry and says what is allowed.
	tests := []struct{ spec, want string }{
		{"", "host list is empty"},
		{"  ", "host list is empty"},
		{"a,,b", "entry 2 is empty"},
		{"a,", "entry 2 is empty"},
		{"a:0", `entry 1 "a:0": slots 0`},
		{"a:-1", `entry 1 "a:-1": slots "-1" is not a positive integer`},
		{"a:+2", `slots "+2" is not a positive integer`},
		{"a:x", `slots "x" is not a positive integer`},
		{"a:1.5", `slots "1.5" is not a positive integer`},
		{"a:", `nothing after ':'`},
		{"a:4097", "slots 4097 is more than 4096"},
		{"a:99999999999999999999999", "is more than 4096"},
		{"b,a:2,b:3", `entry 3 "b:3": host b is already entry 1`},
		{"B,b", `entry 2 "b": host b is already entry 1`},
		{"[::1],[0::1]:2", `host ::1 is already entry 1`},
		{"::1", "an IPv6 address must be in brackets"},
		{"fd00::1:2", "an IPv6 address must be in brackets"},
		{"[::1", "without a closing ']'"},
		{"[::1]2", `unexpected "2" after ']'`},
		{"[10.0.0.1]:2", `"10.0.0.1" in brackets is not an IPv6 address`},
		{"[nope]", "not an IPv6 address"},
		{"10.0.0.256", `"10.0.0.256" is not a valid IPv4 address`},
		{"1.2.3", "not a valid IPv4 address"},
		{":4", "the host is empty"},
		{"a b", `contains ' '`},
		{"gpu/1", `contains '/'`},
		{"-a", "starts or ends with '-'"},
		{"a..b", "empty label"},
		{"a.", "empty label"},
		{strings.Repeat("a", 64) + ".com", "longer than 63"},
		{strings.Repeat("a.", 127) + "bb", "at most 253"},
	}
	for _, tt := range tests {
		got, err := providers.ParseHosts(tt.spec, 1)
		if err == nil {
			t.Errorf("ParseHosts(%q) = %v; want an error containing %q", tt.spec, got, tt.want)
			continue
		}
		allowed := strings.Contains(err.Error(), "want host[:slots]") || strings.Contains(err.Error(), "list each host once")
		if !strings.Contains(err.Error(), tt.want) || !allowed {
			t.Errorf("ParseHosts(%q) error:\n %v\nwant it to contain %q and what is allowed", tt.spec, err, tt.want)
		}
	}
}

func TestParseHostsDefaultSlots(t *testing.T) {
	for _, n := range []int{0, -2, providers.MaxSlots + 1} {
		if _, err := providers.ParseHosts("a", n); err == nil || !strings.Contains(err.Error(), "default slots") {
			t.Errorf("ParseHosts with default slots %d: error %v; want one about the default slots", n, err)
		}
	}
}
