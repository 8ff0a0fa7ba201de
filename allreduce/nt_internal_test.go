package allreduce

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParsePolicy(t *testing.T) {
	for _, c := range []struct {
		env  string
		want policy
		ok   bool
	}{
		{"", policyAuto, true}, {"auto", policyAuto, true}, {" AUTO ", policyAuto, true},
		{"1", policyAlways, true}, {"on", policyAlways, true}, {"yes", policyAlways, true}, {"True", policyAlways, true},
		{"0", policyNever, true}, {" OFF ", policyNever, true}, {"false", policyNever, true}, {"no", policyNever, true},
		{"2", policyAuto, false}, {"sometimes", policyAuto, false},
	} {
		if got, ok := parsePolicy(c.env); got != c.want || ok != c.ok {
			t.Errorf("parsePolicy(%q) = %v, %t; want %v, %t", c.env, got, ok, c.want, c.ok)
		}
	}
}

func TestNTFrom(t *testing.T) {
	shared := cacheInfo{size: 300 << 20, shared: true}
	for _, c := range []struct {
		name  string
		p     policy
		hw    bool
		llc   cacheInfo
		ranks int
		want  int64
	}{
		{"no AVX", policyAlways, false, cacheInfo{}, 2, -1},
		{"off", policyNever, true, cacheInfo{}, 2, -1},
		{"on, even with one cache", policyAlways, true, shared, 2, 0},
		{"auto, caches unknown", policyAuto, true, cacheInfo{}, 2, 0},
		{"auto, caches split", policyAuto, true, cacheInfo{size: 32 << 20}, 2, 0},
		{"auto, one cache, 2 ranks", policyAuto, true, shared, 2, 150 << 20},
		{"auto, one cache, 8 ranks", policyAuto, true, shared, 8, 300 << 20 / 8},
		{"auto, one cache, no count", policyAuto, true, shared, 0, 300 << 20},
	} {
		if got := ntFrom(c.p, c.hw, c.llc, c.ranks); got != c.want {
			t.Errorf("%s: ntFrom = %d, want %d", c.name, got, c.want)
		}
	}
}

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
