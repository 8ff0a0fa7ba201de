package allreduce

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"
)

// ErrPeerUnreachable is wrapped, with ErrPeerLost, when building or using a communicator
// failed and the hosts of some neighbours then did not answer a probe: a network cut
// between this rank and them rather than a dead or hung peer, whose host still answers.
var ErrPeerUnreachable = errors.New("peer unreachable")

// UnreachableError is a failure after which the hosts of Ranks did not answer a probe;
// Reached are the neighbours that did, or that this rank was connected to.
type UnreachableError struct {
	Ranks, Reached []int
	Err            error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("%v; the hosts of ranks %v did not answer a probe (cut off from this rank?)", e.Err, e.Ranks)
}

// Unwrap matches ErrPeerLost (the worker resets), ErrPeerUnreachable and the failure itself.
func (e *UnreachableError) Unwrap() []error { return []error{ErrPeerLost, ErrPeerUnreachable, e.Err} }

// Unreachable returns the unreachable and the reached ranks of err's UnreachableError, nil
// when it has none.
func Unreachable(err error) (unreachable, reached []int) {
	var u *UnreachableError
	if errors.As(err, &u) {
		return u.Ranks, u.Reached
	}
	return nil, nil
}

// ProbeNeighbours asks whether the host of each neighbour still answers, after a collective
// found a peer silent, and returns the ranks whose host did not, and those whose host did:
// one dial each, at once, of up to probeTimeout. A host that answers, even by refusing the connection, is reachable; a
// silent peer there is hung, not cut off. Neighbours over shared memory are dialed too: on
// this machine they answer at once, and network namespaces on one kernel share memory
// while a route may cut them apart. Call it before Close.
func (c *Comm) ProbeNeighbours(ctx context.Context) (unreachable, reached []int) {
	addrs := map[int]string{}
	for _, p := range c.peers {
		if p != nil && p.addr != "" {
			addrs[p.rank] = p.addr
		}
	}
	unreachable = probeHosts(ctx, addrs, c.probeTimeout())
	for r := range addrs {
		if !slices.Contains(unreachable, r) {
			reached = append(reached, r)
		}
	}
	slices.Sort(reached)
	return unreachable, reached
}

// probeTimeout is how long a probe waits for a host: a quarter of Config.Timeout, from
// 200 ms to 1 s. A host that answers does so within a round trip.
func (c *Comm) probeTimeout() time.Duration {
	return min(max(c.cfg.Timeout/4, 200*time.Millisecond), time.Second)
}

// probeHosts dials every address at once, each for up to timeout, and returns, sorted, the
// ranks whose host did not answer: the dial timed out, or the network said the host cannot
// be reached. A connection made or refused (nothing listens on that port any more) is an
// answer. Other errors (this process out of descriptors) say nothing and count as answers.
func probeHosts(ctx context.Context, addrs map[int]string, timeout time.Duration) []int {
	var (
		mu  sync.Mutex
		out []int
		wg  sync.WaitGroup
	)
	for rank, addr := range addrs {
		wg.Go(func() {
			if !hostAnswers(ctx, addr, timeout) && ctx.Err() == nil {
				mu.Lock()
				out = append(out, rank)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(out)
	return out
}

// hostAnswers reports whether the host at addr answers a TCP dial within timeout.
func hostAnswers(ctx context.Context, addr string, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err == nil {
		conn.Close()
		return true
	}
	return !unreachable(err)
}

// unreachable reports whether a dial's error means its host cannot be reached.
func unreachable(err error) bool {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return true
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.Is(err, syscall.EHOSTDOWN), errors.Is(err, syscall.ENETDOWN):
		return true
	case errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		// What Linux answers to a dial through a blackhole, prohibit or firewall rule.
		return true
	}
	return false
}
