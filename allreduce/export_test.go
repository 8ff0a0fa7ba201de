package allreduce

import "sync"

// Neighbours exposes, to the black-box tests, which ranks connect to which.
var Neighbours = neighbours

// ShmSupported says whether ranks on one machine use shared memory by default here.
const ShmSupported = shmSupported

// Flatten makes c use the flat algorithms, whatever its hosts, until restore is called:
// the benchmark compares both on one world. Call it only between collectives.
func Flatten(c *Comm) (restore func()) {
	t := c.topo
	c.topo = topology{}
	return func() { c.topo = t }
}

// Leaders makes c's hierarchical allreduce go through one leader per host, until restore
// is called: the benchmark compares that with the slices. Call it only between collectives.
func Leaders(c *Comm) (restore func()) {
	c.topo.leaders = true
	return func() { c.topo.leaders = false }
}

// SetNonTemporal makes communicators made from now on read ELASTICD_SHM_NONTEMPORAL as
// value, until restore is called.
func SetNonTemporal(value string) (restore func()) {
	p, ok := ntSetting, ntSettingOK
	ntSetting, ntSettingOK = parsePolicy(value)
	return func() { ntSetting, ntSettingOK = p, ok }
}

// NonTemporalFor is Stats.NonTemporalFrom as the current setting makes it for ranks sharing
// this machine's memory.
func NonTemporalFor(ranks int) int64 { return ntFrom(ntSetting, ntHardware, machineLLC(), ranks) }

// NonTemporalNow says whether c's last collective copied into its rings with non-temporal
// stores.
func NonTemporalNow(c *Comm) bool { return c.ntOn.Load() }

// SetDirect makes communicators made from now on read ELASTICD_SHM_DIRECT as value, until
// restore is called.
func SetDirect(value string) (restore func()) {
	p, ok := directSetting, directSettingOK
	directSetting, directSettingOK = parsePolicy(value)
	return func() { directSetting, directSettingOK = p, ok }
}

// DirectMaxRanks is the largest world that reads directly.
const DirectMaxRanks = directMaxRanks

// DirectAutoBytes is the smallest allreduce that reads directly when the machine decides.
const DirectAutoBytes = directAutoBytes

// DirectAuto is Stats.DirectFrom as auto makes it, on this machine, for a world that can read
// directly: directAutoBytes where the kernel's copies measure fast enough, else -1.
func DirectAuto() int64 { return directAgree([]int64{directAuto}, machineReadRatio()) }

// SetMachineRules sets s.NonTemporalFrom and s.DirectFrom to what this machine's rules, and
// the current settings, give a communicator of a ranks-rank world with default Config whose
// other fields are s's: both depend on the machine, so tests that compare whole Stats take
// them from here.
func SetMachineRules(s *Stats, ranks int) {
	s.NonTemporalFrom = -1
	if s.SharedMemory > 0 {
		s.NonTemporalFrom = ntFrom(ntSetting, ntHardware, machineLLC(), s.SharedMemory+1)
	}
	s.DirectFrom = -1
	if ranks >= 2 && ranks <= directMaxRanks && s.Hosts == 1 && s.SharedMemory == ranks-1 {
		s.DirectFrom = directFloor(directAgree([]int64{directWish(directSetting, 0)}, machineReadRatio()), defaultSmallBytes, ranks)
	}
}

// ForgetEnvWarnings lets the next communicator warn again about ELASTICD_SHM_NONTEMPORAL and
// ELASTICD_SHM_DIRECT values it does not understand.
func ForgetEnvWarnings() { ntWarnOnce, directWarnOnce = sync.Once{}, sync.Once{} }
