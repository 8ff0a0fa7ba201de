//go:build !linux

package allreduce

import "net"

// tcpStream is goStream where poll and eventfd are not at hand.
func (c *Comm) tcpStream(o *opInfo, next, prev *peer, first int, sends, recvs []unit, dt dtype, op Op) error {
	return c.goStream(o, next, prev, first, sends, recvs, dt, op)
}

func (c *Comm) kickWaker()  {}
func (c *Comm) closeWaker() {}

// tcpCall is tcpStream's reused state on Linux.
type tcpCall struct{}

// vethAddrs finds no veth interface where ethtool is not at hand.
func vethAddrs() []net.IP { return nil }

// congestionControl is not read where vethAddrs finds no veth.
func congestionControl(p *peer) string { return "" }
