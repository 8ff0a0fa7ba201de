package sim

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/elasticd/elasticd/providers"
)

// Provider is one group of a Cloud as the driver sees a cloud's group: its hosts
// (providers.Provider), interruption and scale-in notices (providers.Noticer,
// providers.NoticeCompleter), its size and launch failures (providers.Capacity), the claim of
// the driver that steers it (providers.Claimer) and its spot prices (providers.SpotPricer). Each call is one answer from the cloud's loop; a Provider
// starts no goroutines.
type Provider struct {
	c    *Cloud
	name string
}

var (
	_ providers.Provider        = (*Provider)(nil)
	_ providers.Noticer         = (*Provider)(nil)
	_ providers.NoticeCompleter = (*Provider)(nil)
	_ providers.Capacity        = (*Provider)(nil)
	_ providers.Claimer         = (*Provider)(nil)
	_ providers.SpotPricer      = (*Provider)(nil)
)

// call runs fn on the cloud's loop with the group, as the cloud's API would answer op: failing
// in an outage, refusing a call that needs a permission (perm, "" for none) while denied,
// hanging while stalled. Its errors read "sim: group "spot": op: …".
func (p *Provider) call(ctx context.Context, op, perm string, fn func(now time.Time, g *group) error) error {
	var err error
	stalled, refused := false, false
	e := p.c.do(ctx, func(now time.Time) {
		w := &p.c.w
		switch {
		case w.stalled:
			stalled = true
		case w.outage:
			err = ErrOutage
		case perm != "" && w.denied:
			err, refused = providers.Refused(op, perm, errDenied), true
		default:
			err = fn(now, w.groups[slices.IndexFunc(w.groups, func(g *group) bool { return g.cfg.Name == p.name })])
		}
	})
	if e == nil && stalled {
		select {
		case <-ctx.Done():
			e = ctx.Err()
		case <-p.c.quit:
			e = ErrClosed
		}
	}
	if e == nil {
		e = err
	}
	switch {
	case refused:
		return fmt.Errorf("sim: group %q: %w", p.name, e) // Refused names op
	case e != nil:
		return fmt.Errorf("sim: group %q: %s: %w", p.name, op, e)
	}
	return nil
}

// Hosts lists the group's instances whose process has started, Leaving while the group
// terminates them.
func (p *Provider) Hosts(ctx context.Context) ([]providers.Host, error) {
	var hosts []providers.Host
	err := p.call(ctx, "list hosts", "", func(_ time.Time, g *group) error {
		for _, in := range g.insts {
			if in.state != Pending {
				hosts = append(hosts, p.c.host(in))
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return hosts, nil
}

// Notices lists the open notices of the group's instances: interruptions (Deadline: the
// reclaim) and, with a lifecycle hook, scale-ins. A notice is listed until it is completed or
// its instance is gone.
func (p *Provider) Notices(ctx context.Context) ([]providers.Notice, error) {
	var ns []providers.Notice
	err := p.call(ctx, "list notices", "", func(_ time.Time, g *group) error {
		for _, in := range g.insts {
			ns = append(ns, in.notices...)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ns, nil
}

// CompleteNotice closes a notice: it is no longer listed, and an instance the lifecycle hook
// holds is terminated now. A notice the cloud no longer holds is not an error.
func (p *Provider) CompleteNotice(ctx context.Context, n providers.Notice) error {
	err := p.call(ctx, "complete notice "+n.ID, "sim:CompleteLifecycleAction", func(now time.Time, g *group) error {
		for _, in := range g.insts {
			if in.id != n.HostID {
				continue
			}
			i := slices.IndexFunc(in.notices, func(x providers.Notice) bool { return x.ID == n.ID })
			if i < 0 {
				return nil
			}
			if in.notices[i].Kind == providers.ScaleIn && !in.termSent {
				in.hookUntil = now // the loop sends SIGTERM as it reconciles
			}
			in.notices = slices.Delete(in.notices, i, i+1)
		}
		return nil
	})
	p.record(Call{Op: "complete-notice", HostID: n.HostID, NoticeID: n.ID}, err)
	return err
}

// GroupSize reads the group's size; Instances counts booting and terminating ones too.
func (p *Provider) GroupSize(ctx context.Context) (providers.GroupSize, error) {
	var s providers.GroupSize
	err := p.call(ctx, "read the group's size", "", func(_ time.Time, g *group) error {
		s = providers.GroupSize{Desired: g.desired, Min: g.min, Max: g.max, Instances: len(g.insts)}
		return nil
	})
	return s, err
}

// SetDesired sets the group's desired size, as a cloud does: above the maximum it is refused
// (ErrAboveMax), below the minimum it lowers the minimum too. The group launches or
// terminates (newest first) to reach it.
func (p *Provider) SetDesired(ctx context.Context, n int) error {
	err := p.call(ctx, fmt.Sprintf("set desired %d", n), "sim:SetDesiredCapacity", func(now time.Time, g *group) error {
		switch {
		case n < 0:
			return fmt.Errorf("%w: ValidationError: desired capacity %d must be at least 0", providers.ErrRefused, n)
		case n > g.max:
			return fmt.Errorf("%w (%d)", providers.ErrAboveMax, g.max)
		}
		if n < g.min {
			p.c.log.Info("sim: the group's minimum is lowered to its desired size", "group", g.cfg.Name, "from", g.min, "to", n)
			g.min = n
		}
		p.c.log.Info("sim: desired size set", "group", g.cfg.Name, "from", g.desired, "to", n)
		g.desired = n
		return nil
	})
	p.record(Call{Op: "set-desired", N: n}, err)
	return err
}

// Replace terminates one instance of the group, keeping the desired size: the group launches
// a replacement. An instance that is not the group's is ErrNotInGroup; one already
// terminating is left to finish.
func (p *Provider) Replace(ctx context.Context, hostID string) error {
	err := p.call(ctx, "replace "+hostID, "sim:TerminateInstanceInAutoScalingGroup", func(now time.Time, g *group) error {
		i := slices.IndexFunc(g.insts, func(in *instance) bool { return in.id == hostID })
		if i < 0 {
			return providers.ErrNotInGroup
		}
		if in := g.insts[i]; in.state != Terminating {
			p.c.terminate(now, in, "replaced")
		}
		return nil
	})
	p.record(Call{Op: "replace", HostID: hostID}, err)
	return err
}

// LaunchFailures lists the group's recent failed launch attempts, newest last (the last
// maxFailures): a spot group beyond the cloud's spot capacity fails each attempt with
// InsufficientInstanceCapacity, as AWS does.
func (p *Provider) LaunchFailures(ctx context.Context) ([]providers.LaunchFailure, error) {
	var fs []providers.LaunchFailure
	err := p.call(ctx, "list launch failures", "", func(_ time.Time, g *group) error {
		fs = slices.Clone(g.failures)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return fs, nil
}

// SpotPrices answers the configured spot price of each asked type, in every zone of the
// cloud's groups: prices[type][zone]. Types without a spot price are left out.
func (p *Provider) SpotPrices(ctx context.Context, types []string) (map[string]map[string]float64, error) {
	prices := map[string]map[string]float64{}
	err := p.call(ctx, "read spot prices", "", func(time.Time, *group) error {
		for _, t := range types {
			price := p.c.cfg.Prices[t].Spot
			if price <= 0 {
				continue
			}
			prices[t] = map[string]float64{}
			for _, g := range p.c.cfg.Groups {
				prices[t][g.Zone] = price
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return prices, nil
}

func (p *Provider) record(call Call, err error) {
	call.At, call.Group = time.Now(), p.name
	if err != nil {
		call.Err = err.Error()
	}
	p.c.record(call)
}

// Claim claims the group for c.Owner (providers.ClaimTag) through the group's tag, which the
// cloud keeps in memory, as AWS keeps a group's tags: a read, a write, a read back, each a
// call of its own, so that another driver's call can come between them.
func (p *Provider) Claim(ctx context.Context, c providers.GroupClaim) (*providers.GroupClaim, error) {
	return providers.ClaimTag(ctx, groupTag{p}, c)
}

// Unclaim removes the group's claim when owner holds it.
func (p *Provider) Unclaim(ctx context.Context, owner string) error {
	return providers.UnclaimTag(ctx, groupTag{p}, owner)
}

// groupTag is the group's claim tag (providers.TagStore). Writing it needs a permission, as
// on a cloud: SetDenied refuses it.
type groupTag struct{ p *Provider }

func (t groupTag) ReadTag(ctx context.Context) (string, error) {
	var v string
	err := t.p.call(ctx, "read the group's tags", "", func(_ time.Time, g *group) error { v = g.claim; return nil })
	return v, err
}

func (t groupTag) WriteTag(ctx context.Context, value string) error {
	return t.p.call(ctx, "tag the group "+providers.ClaimTagKey, "sim:CreateOrUpdateTags", func(_ time.Time, g *group) error {
		g.claim = value
		return nil
	})
}

func (t groupTag) DeleteTag(ctx context.Context) error {
	return t.p.call(ctx, "untag the group "+providers.ClaimTagKey, "sim:DeleteTags", func(_ time.Time, g *group) error {
		g.claim = ""
		return nil
	})
}
