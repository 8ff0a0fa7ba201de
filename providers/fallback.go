package providers

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// WithFallback is a job's two groups of one cloud seen as one provider: its spot group and an
// on-demand group that the driver grows only while spot capacity has run out
// (--fallback-asg …). Hosts lists both, the fallback group's with Fallback set; notices come
// from both, and each is completed by the group that listed its host; spot prices are the
// spot group's. Either group's failed poll fails the poll: both are the same cloud, reached
// with the same credentials.
type WithFallback struct {
	Spot, Fallback Provider

	mu       sync.Mutex
	fallback map[string]bool // host IDs the fallback group listed at the last poll
}

// Hosts lists both groups' hosts.
func (w *WithFallback) Hosts(ctx context.Context) ([]Host, error) {
	spot, err := w.Spot.Hosts(ctx)
	if err != nil {
		return nil, err
	}
	fb, err := w.Fallback.Hosts(ctx)
	if err != nil {
		return nil, fmt.Errorf("the fallback group: %w", err)
	}
	ids := make(map[string]bool, len(fb))
	out := make([]Host, 0, len(spot)+len(fb))
	for _, h := range spot {
		h.Fallback = false
		out = append(out, h)
	}
	for _, h := range fb {
		h.Fallback = true
		ids[h.ID] = true
		out = append(out, h)
	}
	w.mu.Lock()
	w.fallback = ids
	w.mu.Unlock()
	return out, nil
}

// Notices polls both groups' notices.
func (w *WithFallback) Notices(ctx context.Context) ([]Notice, error) {
	var out []Notice
	var errs []error
	for _, p := range []Provider{w.Spot, w.Fallback} {
		if n, ok := p.(Noticer); ok {
			ns, err := n.Notices(ctx)
			errs = append(errs, err)
			out = append(out, ns...)
		}
	}
	return out, errors.Join(errs...)
}

// CompleteNotice answers n through the group that listed its host.
func (w *WithFallback) CompleteNotice(ctx context.Context, n Notice) error {
	w.mu.Lock()
	fb := w.fallback[n.HostID]
	w.mu.Unlock()
	p := w.Spot
	if fb {
		p = w.Fallback
	}
	if c, ok := p.(NoticeCompleter); ok {
		return c.CompleteNotice(ctx, n)
	}
	return nil
}

// SpotPrices are the spot group's.
func (w *WithFallback) SpotPrices(ctx context.Context, types []string) (map[string]map[string]float64, error) {
	if sp, ok := w.Spot.(SpotPricer); ok {
		return sp.SpotPrices(ctx, types)
	}
	return map[string]map[string]float64{}, nil
}

var (
	_ Provider        = (*WithFallback)(nil)
	_ Noticer         = (*WithFallback)(nil)
	_ NoticeCompleter = (*WithFallback)(nil)
	_ SpotPricer      = (*WithFallback)(nil)
)
