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

// maxNoticeBackoff caps the pause after failed notice polls.
const maxNoticeBackoff = 30 * time.Second

// RunNotices polls the provider's notices every Interval, each poll bounded by Timeout, and
// sends every notice once (providers.WatchNotices: the loop the agents run too) until ctx
// ends. A provider without notices (not a providers.Noticer) makes it return nil at once.
// Failures are logged and polling goes on after a bounded backoff: missing a notice costs a
// rollback, not the job.
func (w *Watcher) RunNotices(ctx context.Context, out chan<- providers.Notice) error {
	n, ok := w.Provider.(providers.Noticer)
	if !ok {
		return nil
	}
	interval, timeout, log := w.settings()
	cfg := providers.WatchConfig{
		Interval: interval, Timeout: timeout, MaxBackoff: maxNoticeBackoff,
		Seen: &providers.Seen{Memory: noticeMemory, Max: maxNoticeMemory},
		Failed: func(err error, failures int, retryIn time.Duration) {
			log.Warn("notice poll failed", "err", err, "failures_in_a_row", failures, "retry_in", retryIn)
		},
		Recovered: func(failures int) { log.Info("notice polls answer again", "after_failures", failures) },
	}
	return providers.WatchNotices(ctx, n, cfg, func(ctx context.Context, nt providers.Notice) error {
		select {
		case out <- nt:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}
