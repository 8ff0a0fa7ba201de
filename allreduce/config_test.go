package allreduce_test

import (
	"strings"
	"testing"

	"github.com/elasticd/elasticd/allreduce"
)

// TestConfigValidate: a bad field is refused with its name, its value and what it must be.
func TestConfigValidate(t *testing.T) {
	good := func() allreduce.Config {
		return allreduce.Config{Rank: 0, Size: 2, Store: allreduce.NewMemStore()}
	}
	for _, tc := range []struct {
		name  string
		tweak func(*allreduce.Config)
		want  string // "" for valid
	}{
		{"defaults", func(*allreduce.Config) {}, ""},
		{"send buffer set", func(c *allreduce.Config) { c.TCPSendBuffer = 1 << 20 }, ""},
		{"send buffer left to the kernel", func(c *allreduce.Config) { c.TCPSendBuffer = -1 }, ""},
		{"send buffer too large", func(c *allreduce.Config) { c.TCPSendBuffer = 65 << 20 }, "TCPSendBuffer 68157440: must be at most 64 MiB"},
		{"direct reads never", func(c *allreduce.Config) { c.DirectBytes = -1 }, ""},
		{"direct reads from a size", func(c *allreduce.Config) { c.DirectBytes = 8 << 20 }, ""},
		{"direct reads below never", func(c *allreduce.Config) { c.DirectBytes = -2 }, "DirectBytes -2: must be at least 0, or -1 for never"},
		{"chunk too small", func(c *allreduce.Config) { c.ChunkBytes = 8 }, "ChunkBytes 8"},
		{"transport", func(c *allreduce.Config) { c.Transport = "udp" }, `Transport "udp"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good()
			tc.tweak(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
