package agent

import (
	"context"
	"slices"
	"time"

	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/worker/agent/gpu"
)

// maxNotices bounds the notices remembered (and sent again to each new session).
const maxNotices = 64

// watchNotices polls the metadata service until ctx ends and sends each new notice to the
// driver: providers.WatchNotices, the loop the driver runs over its provider too. Failures
// are logged and retried with bounded backoff.
func (a *agent) watchNotices(ctx context.Context) {
	cfg := providers.WatchConfig{
		Interval: a.cfg.NoticeInterval, MinBackoff: minBackoff, MaxBackoff: a.cfg.MaxBackoff,
		Seen: &providers.Seen{Memory: time.Hour, Max: maxNotices},
		Failed: func(err error, failures int, retryIn time.Duration) {
			a.log.Warn("metadata service: cannot read interruption notices; retrying", "metadata", a.cfg.Metadata, "err", err, "retry_in", retryIn)
		},
		Recovered: func(failures int) {
			a.log.Info("metadata service answers again", "metadata", a.cfg.Metadata, "after_failures", failures)
		},
	}
	_ = providers.WatchNotices(ctx, a.cfg.Notices, cfg, func(_ context.Context, n providers.Notice) error {
		a.notice(n)
		return nil
	})
}

// notice records a notice and sends it to the driver; the watch loop hands it each notice
// once (again only when it changed, which replaces the one recorded).
func (a *agent) notice(n providers.Notice) {
	wn := protocol.AgentNotice{ID: n.ID, Kind: string(n.Kind), Deadline: n.Deadline, Detail: n.Detail}
	a.mu.Lock()
	i := slices.IndexFunc(a.notices, func(old protocol.AgentNotice) bool { return old.ID == n.ID })
	switch {
	case i >= 0:
		a.notices[i] = wn
	case len(a.notices) >= maxNotices:
		a.notices = append(a.notices[1:], wn)
	default:
		a.notices = append(a.notices, wn)
	}
	a.mu.Unlock()
	a.log.Warn("interruption notice", "kind", n.Kind, "deadline", n.Deadline, "detail", n.Detail, "id", n.ID)
	a.emit(protocol.AgentEvent{Kind: protocol.KindNotice, Notice: &wn})
}

// completeNotice answers a notice once the driver says the host's workers are gone. It runs
// on its own goroutine, which Run waits for: a completion in progress is not cut short by the
// agent stopping (it has 30 s, whatever ctx does).
func (a *agent) completeNotice(ctx context.Context, id string) {
	c, ok := a.cfg.Notices.(providers.NoticeCompleter)
	if !ok {
		return
	}
	a.mu.Lock()
	var n *providers.Notice
	for _, wn := range a.notices {
		if wn.ID == id {
			n = &providers.Notice{ID: wn.ID, HostID: a.cfg.HostID, Kind: providers.NoticeKind(wn.Kind), Deadline: wn.Deadline, Detail: wn.Detail}
		}
	}
	a.mu.Unlock()
	if n == nil {
		a.log.Warn("the driver completed a notice this agent does not know", "notice", id)
		return
	}
	a.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := c.CompleteNotice(ctx, *n); err != nil {
			a.log.Warn("could not complete the notice", "notice", id, "err", err)
			return
		}
		a.log.Info("notice completed: this host's workers are gone", "notice", id)
	})
}

// DefaultLoadEvery is Config.LoadEvery when it is not given.
const DefaultLoadEvery = 10 * time.Second

// reportLoad sends the mean GPU busy fraction every Config.LoadEvery, when the GPU source can say
// (gpu.Monitor can) and the driver reads it (its slot policy is loadaware); a failing read is
// logged once per run of failures.
func (a *agent) reportLoad(ctx context.Context) {
	u, ok := a.cfg.GPUs.(interface{ Utilization() ([]float64, error) })
	if !ok {
		return
	}
	t := time.NewTicker(a.cfg.LoadEvery)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if a.noLoads.Load() {
			continue
		}
		busy, err := u.Utilization()
		if err != nil {
			if !failing {
				a.log.Warn("cannot read GPU utilization; --slot-policy loadaware will not know it", "err", err)
			}
			failing = true
			continue
		}
		failing = false
		if len(busy) == 0 {
			continue
		}
		sum := 0.0
		for _, b := range busy {
			sum += b
		}
		a.emit(protocol.AgentEvent{Kind: protocol.KindLoad, GPUBusy: sum / float64(len(busy))})
	}
}

// watchGPUs sends GPU faults to the driver until ctx ends; a failing NVML is retried.
func (a *agent) watchGPUs(ctx context.Context) {
	ch := make(chan gpu.Event)
	done := make(chan error, 1)
	for attempt := 0; ctx.Err() == nil; attempt++ {
		go func() { done <- a.cfg.GPUs.Watch(ctx, ch) }()
	watch:
		for {
			select {
			case ev := <-ch:
				a.log.Warn("GPU fault", "gpu", ev.GPU, "uuid", ev.UUID, "kind", ev.Kind, "xid", ev.XID, "detail", ev.Detail)
				a.emit(protocol.AgentEvent{Kind: protocol.KindGPU, GPU: &protocol.GPUFault{Index: ev.GPU, UUID: ev.UUID, Kind: ev.Kind, XID: ev.XID, Detail: ev.Detail}})
			case err := <-done:
				if err == nil || ctx.Err() != nil {
					return
				}
				a.log.Error("GPU health watch failed; GPU health is unknown until it recovers", "err", err, "retry_in", a.pause(attempt))
				break watch
			}
		}
		if !a.backoff(ctx, attempt) {
			return
		}
	}
}
