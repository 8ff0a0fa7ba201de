package discovery

import (
	"context"
	"time"

	"github.com/elasticd/elasticd/providers"
)

// noticeMemory is how long a notice ID is remembered for de-duplication, and how many at
// most: queues redeliver within minutes, and memory must stay bounded.
const (
	noticeMemory    = time.Hour
	maxNoticeMemory = 100000
)

// RunNotices polls the provider's notices every Interval, each poll bounded by Timeout, and
// sends every notice once (de-duplicated by ID) until ctx ends. A provider without notices
// (not a providers.Noticer) makes it return nil at once. Failures are logged and polling goes
// on: missing a notice costs a rollback, not the job.
func (w *Watcher) RunNotices(ctx context.Context, out chan<- providers.Notice) error {
	n, ok := w.Provider.(providers.Noticer)
	if !ok {
		return nil
	}
	interval, timeout, log := w.settings()
	seen := map[string]time.Time{}
	failures := 0
	for {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		notices, err := n.Notices(pctx)
		cancel()
		now := time.Now()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			failures++
			log.Warn("notice poll failed", "err", err, "failures_in_a_row", failures)
		default:
			failures = 0
			for id, at := range seen {
				if now.Sub(at) > noticeMemory || len(seen) > maxNoticeMemory {
					delete(seen, id)
				}
			}
			for _, nt := range notices {
				if _, dup := seen[nt.ID]; dup && nt.ID != "" {
					continue
				}
				seen[nt.ID] = now
				select {
				case out <- nt:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}
