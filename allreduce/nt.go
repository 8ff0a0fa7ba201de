package allreduce

import (
	"os"
	"strings"
	"sync"
)

// envNonTemporal chooses how ranks copy into shared-memory rings (docs/protocol.md §1.6):
// unset, empty or "auto" lets the communicator decide from the machine's caches (ntFrom);
// 1 (true, on, yes) always uses non-temporal stores where the CPU has them; 0 (false, off,
// no) never does. Read once, when the package loads.
const envNonTemporal = "ELASTICD_SHM_NONTEMPORAL"

// policy is the setting of envNonTemporal or envDirect: let the communicator decide, always
// (where it can), or never.
type policy uint8

const (
	policyAuto policy = iota
	policyAlways
	policyNever
)

func (p policy) String() string {
	return [...]string{"auto", "always", "never"}[p]
}

// parsePolicy reads envNonTemporal's or envDirect's value; ok is false for a value it does
// not know, which counts as auto (New logs it).
func parsePolicy(env string) (p policy, ok bool) {
	switch strings.ToLower(strings.TrimSpace(env)) {
	case "", "auto":
		return policyAuto, true
	case "1", "true", "on", "yes":
		return policyAlways, true
	case "0", "false", "off", "no":
		return policyNever, true
	}
	return policyAuto, false
}

var envNT = os.Getenv(envNonTemporal)

// ntSetting is envNonTemporal's policy for this process; a variable so tests can change it.
var ntSetting, ntSettingOK = parsePolicy(envNT)

// ntWarnOnce says once per process, not at every generation's New, that envNonTemporal's
// value was not understood.
var ntWarnOnce sync.Once

// cacheInfo describes the last-level cache of the CPUs this process may run on.
type cacheInfo struct {
	size   int64 // bytes; 0: unknown
	shared bool  // one instance of it serves every one of those CPUs
}

// machineLLC is lastLevelCache's answer, read once per process.
var machineLLC = sync.OnceValue(lastLevelCache)

// ntFrom returns the smallest collective (Stats.NonTemporal) whose ring copies use
// non-temporal stores, or -1 for none, given the policy, whether the CPU has such stores, the
// last-level cache, and how many ranks share this machine's memory (this one included).
//
// A non-temporal store skips the cache: the line goes to memory, and the reader fetches it
// from there. That wins where taking the line back from the reader's core costs more than
// memory does — cores with caches of their own (an AMD EPYC's CCXs, the 2-vCPU VM of
// docs/design-notes/allreduce-tuning.md §9: 256 KB–64 MB 1.4–2.5× faster) — and where the ranks' buffers
// together overflow the cache anyway. Where one cache serves every core the process may run
// on, ordinary stores hand lines over inside it: on a 16-core Xeon they were 1.1–1.6× faster
// from 64 KB to 16 MB, and non-temporal ones only won with 8 ranks at 64 MB, 512 MB of
// buffers against a 300 MiB cache (docs/design-notes/allreduce-tuning.md §11). So: with one shared cache,
// non-temporal stores once the ranks' buffers exceed it; with split or unknown caches, always.
func ntFrom(p policy, hw bool, llc cacheInfo, ranksOnHost int) int64 {
	switch {
	case !hw || p == policyNever:
		return -1
	case p == policyAlways || !llc.shared || llc.size <= 0:
		return 0
	}
	return llc.size / int64(max(ranksOnHost, 1))
}
