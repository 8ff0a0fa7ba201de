package allreduce

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
	ntSetting, ntSettingOK = parseNonTemporal(value)
	return func() { ntSetting, ntSettingOK = p, ok }
}

// NonTemporalFor is Stats.NonTemporalFrom as the current setting makes it for ranks sharing
// this machine's memory.
func NonTemporalFor(ranks int) int64 { return ntFrom(ntSetting, ntHardware, machineLLC(), ranks) }

// NonTemporalNow says whether c's last collective copied into its rings with non-temporal
// stores.
func NonTemporalNow(c *Comm) bool { return c.ntOn.Load() }
