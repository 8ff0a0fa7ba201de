package allreduce

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
)

// Hierarchical allreduce for worlds whose hosts hold several ranks each (docs/protocol.md
// §1.7). Ranks of one host reduce among themselves over shared memory, and only the sums of
// whole hosts cross the network: each host's buffer is cut into M slices (M: the most ranks
// any host has), slice j belongs on host h to its local rank j mod L_h, and the owners of
// slice j, one per host, run a ring allreduce on it. So every rank of a host carries part of
// the host's traffic, where a leader per host would carry all of it through one rank.
//
//   A. reduce-scatter inside the host: every rank sends each owner the owner's slices of its
//      buffer; the owner reduces them into its own, in local-rank order;
//   B. for each slice j in turn, its owners' ring allreduce across hosts (all ranks take the
//      slices in the same order, so ring j waits only on rings before it: no deadlock);
//   C. allgather inside the host: every owner sends its finished slices to the others.
//
// Each element is reduced once (A on its owner, then the ring of B reduces each piece once)
// and copied from there, so every rank ends with the same bits, as with the flat ring.

// maxHostID bounds Config.HostID: it travels in the shm offer (maxShmOffer).
const maxHostID = 128

// topology is which ranks share a host, the same on every rank: rank 0 reads every rank's
// record and publishes the grouping, every other rank reads it (one store read each, not n).
type topology struct {
	host  []int   // host index of each rank
	hosts [][]int // ranks of each host, ascending; hosts ordered by their lowest rank
	// leaders cuts the buffer into one slice: each host's lowest rank carries all of its
	// traffic. Only the benchmark sets it, after New (its connections are a subset), to
	// measure the scheme the slices replace.
	leaders bool
}

func hostsKey(gen uint64) string { return fmt.Sprintf("allreduce/g%d/hosts", gen) }

// groupHosts numbers the hosts of the published host IDs by their lowest rank. An empty ID
// (TCP forced, or no way to tell the host) is a host of its own.
func groupHosts(ids []string) []int {
	label := make([]int, len(ids))
	seen := map[string]int{}
	next := 0
	for r, id := range ids {
		h, ok := seen[id]
		if !ok || id == "" {
			h = next
			next++
			seen[id] = h
		}
		label[r] = h
	}
	return label
}

// newTopology checks a published grouping and indexes it.
func newTopology(label []int) (topology, error) {
	t := topology{host: label}
	for r, h := range label {
		switch {
		case h < 0 || h > len(t.hosts):
			return topology{}, fmt.Errorf("rank %d on host %d: hosts must be numbered by their lowest rank", r, h)
		case h == len(t.hosts):
			t.hosts = append(t.hosts, nil)
		}
		t.hosts[h] = append(t.hosts[h], r)
	}
	return t, nil
}

// learnHosts returns the world's grouping into hosts: rank 0 makes it from every rank's
// record and publishes it; the others read that.
func (c *Comm) learnHosts(ctx context.Context, self record) (topology, error) {
	n, gen := c.cfg.Size, c.cfg.Generation
	if c.cfg.Rank != 0 {
		v, err := c.cfg.Store.Get(ctx, hostsKey(gen))
		if err != nil {
			return topology{}, fmt.Errorf("learn the hosts from rank 0: %w", err)
		}
		var label []int
		if err := json.Unmarshal(v, &label); err != nil || len(label) != n {
			return topology{}, fmt.Errorf("rank 0 published hosts %q: want %d host numbers", v, n)
		}
		t, err := newTopology(label)
		if err != nil {
			return topology{}, fmt.Errorf("rank 0 published hosts %q: %w", v, err)
		}
		return t, nil
	}
	ids := make([]string, n)
	ids[0] = self.Host
	errs := make([]error, n)
	var wg sync.WaitGroup
	for q := 1; q < n; q++ {
		wg.Go(func() {
			rec, err := c.lookup(ctx, q)
			ids[q], errs[q] = rec.Host, err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return topology{}, fmt.Errorf("learn the hosts: %w", err)
		}
	}
	label := groupHosts(ids)
	v, _ := json.Marshal(label) // ints: cannot fail
	if err := c.cfg.Store.Set(ctx, hostsKey(gen), v); err != nil {
		return topology{}, fmt.Errorf("publish the hosts: %w", err)
	}
	return newTopology(label)
}

// hierarchical reports whether allreduce goes through the hosts: some pairs share a host
// and some do not. One host, or one rank per host, keeps the flat algorithms.
func (t topology) hierarchical() bool {
	return len(t.hosts) > 1 && len(t.hosts) < len(t.host)
}

// slices is M, the number of slices a buffer is cut into: the most ranks on one host.
func (t topology) slices() int {
	if t.leaders {
		return 1
	}
	m := 0
	for _, rs := range t.hosts {
		m = max(m, len(rs))
	}
	return m
}

// owner is the rank of host h that owns slice j.
func (t topology) owner(h, j int) int {
	rs := t.hosts[h]
	return rs[j%len(rs)]
}

// neighbours lists the ranks that r connects to: those of the flat algorithms, which
// Broadcast, Allgather and small allreduces still use, and, when the world is
// hierarchical, r's host and the ranks before and after it in the rings of its slices.
// Like the flat set the relation is symmetric: r is next to q in slice j's ring exactly
// when q is before r.
func (t topology) neighbours(r int) []int {
	n := len(t.host)
	nb := neighbours(r, n)
	if !t.hierarchical() {
		return nb
	}
	h, hs := t.host[r], len(t.hosts)
	for _, q := range t.hosts[h] {
		if q != r {
			nb = append(nb, q)
		}
	}
	for j := range t.slices() {
		if t.owner(h, j) == r {
			nb = append(nb, t.owner((h+1)%hs, j), t.owner((h+hs-1)%hs, j))
		}
	}
	slices.Sort(nb)
	return slices.Compact(nb)
}

// hierAllreduce is the hierarchical allreduce; o numbers phase A, and phases B (one per
// slice) and C take the next numbers on every rank, whether it takes part or not.
func (c *Comm) hierAllreduce(o *opInfo, data []byte, dt dtype, op Op) error {
	c.hierOps.Add(1)
	t, r := c.topo, c.cfg.Rank
	es := dt.size()
	elems := len(data) / es
	m := t.slices()
	h := t.host[r]
	local := t.hosts[h]
	me := slices.Index(local, r)
	slice := func(j int) []byte {
		return data[partStart(elems, m, j)*es : partStart(elems, m, j+1)*es]
	}
	// units lists, in the order they travel, the chunks of the slices owned by local rank i.
	chunk := max(1, c.cfg.ChunkBytes/es) * es
	units := func(i int) [][]byte {
		var us [][]byte
		for j := i; j < m; j += len(local) {
			s := slice(j)
			for a := 0; a < len(s); a += chunk {
				us = append(us, s[a:min(a+chunk, len(s))])
			}
			if len(s) == 0 {
				us = append(us, s) // an empty slice is one empty frame, as on the ring
			}
		}
		return us
	}

	if len(local) > 1 { // A: reduce-scatter inside the host
		var fns []func() error
		for i, q := range local {
			if q != r {
				fns = append(fns, func() error { return c.sendAll(c.peers[q], o, units(i)) })
			}
		}
		fns = append(fns, func() error {
			for u, buf := range units(me) {
				for _, q := range local {
					if q == r {
						continue
					}
					if err := c.recvReduce(c.peers[q], o, u, buf, dt, op); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err := c.fanOut(fns); err != nil {
			return err
		}
	}

	hs := len(t.hosts)
	for j := range m { // B: one ring across hosts per slice
		oj := c.nextOp(o.code, o.dtype, int(o.total))
		if t.owner(h, j) != r {
			continue
		}
		sends, recvs := c.ringPlan(hs, h, slice(j), es)
		next, prev := c.peers[t.owner((h+1)%hs, j)], c.peers[t.owner((h+hs-1)%hs, j)]
		if err := c.streamPeers(oj, next, prev, 0, sends, recvs, dt, op); err != nil {
			return err
		}
	}

	oc := c.nextOp(o.code, o.dtype, int(o.total))
	if len(local) == 1 {
		return nil
	}
	var fns []func() error // C: allgather inside the host
	for i, q := range local {
		if q == r {
			continue
		}
		p := c.peers[q]
		fns = append(fns,
			func() error { return c.sendAll(p, oc, units(me)) },
			func() error {
				for u, buf := range units(i) {
					if err := c.recv(p, oc, u, buf); err != nil {
						return err
					}
				}
				return nil
			})
	}
	return c.fanOut(fns)
}

// sendAll sends bufs to p as units 0, 1, … of o.
func (c *Comm) sendAll(p *peer, o *opInfo, bufs [][]byte) error {
	for u, b := range bufs {
		if err := c.send(p, o, u, b); err != nil {
			return err
		}
	}
	return nil
}

// fanOut runs fns concurrently, each talking to its own peer in its own direction; the
// first error interrupts the others' waits, as in stream, and is the one returned.
func (c *Comm) fanOut(fns []func() error) error {
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for _, fn := range fns {
		wg.Go(func() {
			if err := fn(); err != nil {
				once.Do(func() {
					first = err
					c.interrupt(err)
				})
			}
		})
	}
	wg.Wait()
	return first
}
