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
