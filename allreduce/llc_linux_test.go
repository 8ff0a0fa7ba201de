package allreduce

import (
	"os"
	"path/filepath"
	"testing"
)

// A fake sysfs: cpu0's L1 data, L1 instruction, L2 and L3 caches, as the kernel lists them.
func fakeCaches(t *testing.T, l3Size, l3CPUs string) string {
	root := t.TempDir()
	for i, c := range []struct{ level, typ, size, cpus string }{
		{"1", "Data", "48K", "0"}, {"1", "Instruction", "32K", "0"},
		{"2", "Unified", "2048K", "0"}, {"3", "Unified", l3Size, l3CPUs},
	} {
		d := filepath.Join(root, "cpu0", "cache", "index"+string(rune('0'+i)))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, v := range map[string]string{"level": c.level, "type": c.typ, "size": c.size, "shared_cpu_list": c.cpus} {
			if err := os.WriteFile(filepath.Join(d, name), []byte(v+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

func TestReadLLC(t *testing.T) {
	cpus := func(n int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = i
		}
		return s
	}
	for _, c := range []struct {
		name         string
		size, shared string
		cpus         []int
		want         cacheInfo
	}{
		{"one L3 for all", "307200K", "0-15", cpus(16), cacheInfo{size: 300 << 20, shared: true}},
		{"affinity inside it", "32M", "0-7,16-23", []int{0, 3, 17}, cacheInfo{size: 32 << 20, shared: true}},
		{"two L3s", "32768K", "0-7", cpus(16), cacheInfo{size: 32 << 20, shared: false}},
		{"bad size", "lots", "0-15", cpus(16), cacheInfo{}},
		{"bad list", "32M", "0-x", cpus(16), cacheInfo{}},
	} {
		if got := readLLC(fakeCaches(t, c.size, c.shared), c.cpus); got != c.want {
			t.Errorf("%s: readLLC = %+v, want %+v", c.name, got, c.want)
		}
	}
	// A kernel that does not describe its caches (this project's test VM).
	if got := readLLC(t.TempDir(), cpus(2)); got != (cacheInfo{}) {
		t.Errorf("no cache directory: readLLC = %+v, want unknown", got)
	}
	if got := readLLC(fakeCaches(t, "32M", "0-15"), nil); got != (cacheInfo{}) {
		t.Errorf("no CPUs: readLLC = %+v, want unknown", got)
	}
}
