package allreduce

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// lastLevelCache reads the last-level cache of the CPUs this process may run on from sysfs;
// the zero cacheInfo where the kernel does not describe its caches (some VMs).
func lastLevelCache() cacheInfo {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return cacheInfo{}
	}
	var cpus []int
	for i := 0; i < len(set)*64; i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return readLLC("/sys/devices/system/cpu", cpus)
}

// readLLC finds, under root (/sys/devices/system/cpu), the highest-level data or unified
// cache of cpus[0], its size, and whether its shared_cpu_list holds every one of cpus.
func readLLC(root string, cpus []int) cacheInfo {
	if len(cpus) == 0 {
		return cacheInfo{}
	}
	dirs, _ := filepath.Glob(filepath.Join(root, "cpu"+strconv.Itoa(cpus[0]), "cache", "index*"))
	best, bestLevel := "", 0
	for _, d := range dirs {
		level, err := strconv.Atoi(readSys(d, "level"))
		if t := readSys(d, "type"); err != nil || (t != "Data" && t != "Unified") {
			continue
		}
		if level > bestLevel {
			best, bestLevel = d, level
		}
	}
	if best == "" {
		return cacheInfo{}
	}
	size := parseCacheSize(readSys(best, "size"))
	shared, ok := parseCPUList(readSys(best, "shared_cpu_list"))
	if size <= 0 || !ok {
		return cacheInfo{}
	}
	all := true
	for _, c := range cpus {
		all = all && shared[c]
	}
	return cacheInfo{size: size, shared: all}
}

func readSys(dir, name string) string {
	b, _ := os.ReadFile(filepath.Join(dir, name))
	return strings.TrimSpace(string(b))
}

// parseCacheSize reads sysfs's cache size: a number of bytes with a K, M or G suffix.
func parseCacheSize(s string) int64 {
	mult := int64(1)
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'K':
			mult, s = 1<<10, s[:n-1]
		case 'M':
			mult, s = 1<<20, s[:n-1]
		case 'G':
			mult, s = 1<<30, s[:n-1]
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v <= 0 {
		return 0
	}
	return v * mult
}

// parseCPUList reads a kernel CPU list such as "0-3,8,10-11".
func parseCPUList(s string) (map[int]bool, bool) {
	set := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, false
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a || b-a > 1<<16 {
				return nil, false
			}
		}
		for i := a; i <= b; i++ {
			set[i] = true
		}
	}
	return set, true
}
