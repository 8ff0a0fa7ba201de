// Package discovery owns the poll loop over a providers.Provider: it bounds each poll, keeps
// the last good host set through failures, and reports only changes.
package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/elasticd/elasticd/providers"
)

// Defaults of Watcher.
const (
	DefaultInterval = time.Second
	DefaultTimeout  = 10 * time.Second
)

// Watcher polls a provider. Providers answer one poll per call; the Watcher is the one place
// that loops, times polls out, retries and de-duplicates.
type Watcher struct {
	Provider providers.Provider
	// Interval is the pause between the end of one poll and the start of the next (default
	// 1s). Timing from the end means a slow poll delays the next one instead of piling up
	// behind it, and a slow discovery script is never run back to back.
	Interval time.Duration
	// Timeout bounds each poll (default 10s).
	Timeout time.Duration
	// Logger receives poll failures and recoveries; nil discards them.
	Logger *slog.Logger
	// Poke, when set, makes the next poll start at once when it receives (an operator just
	// changed the hosts); nil: polls follow Interval only.
	Poke <-chan struct{}
}

// Validate reports the first invalid field; zero durations take their defaults.
func (w *Watcher) Validate() error {
	switch {
	case w.Provider == nil:
		return errors.New("discovery watcher: Provider is nil")
	case w.Interval < 0:
		return fmt.Errorf("discovery interval %v: must be positive (0 for the default %v)", w.Interval, DefaultInterval)
	case w.Timeout < 0:
		return fmt.Errorf("discovery timeout %v: must be positive (0 for the default %v)", w.Timeout, DefaultTimeout)
	}
	return nil
}

// Run polls until ctx ends. The first poll's failure is returned at once: a job must not start
// on a broken discovery. Later failures are logged, with how many in a row and for how long,
// and the last good set is kept. A poll fails when the provider returns an error, when it
// takes longer than Timeout, or when its hosts are malformed (an empty or repeated ID, no
// slots, no address).
//
// Run sends on out only when the set of hosts (every field; not their order) differs from the
// last one sent; the first good poll is always sent. Each send is a fresh slice, sorted by
// ID, that the receiver owns. While the receiver is not ready, polling goes on and only the
// latest set waits to be sent, so a slow receiver gets the current group, not a backlog. Run
// never blocks on out past the end of ctx, and returns an error wrapping ctx.Err() when ctx
// ends.
//
// The provider must honour its context (providertest checks that): a poll runs in Run's
// goroutine, so Run returns only once the provider does.
func (w *Watcher) Run(ctx context.Context, out chan<- []providers.Host) error {
	if err := w.Validate(); err != nil {
		return err
	}
	interval, timeout, log := w.settings()

	var (
		current  []providers.Host // the latest good set, sorted by ID; nil before the first
		sent     []providers.Host // the last set sent; nil before the first send
		failures int              // consecutive failed polls
		failing  time.Time        // when the first of them started
	)
	timer := time.NewTimer(0) // the first poll at once
	defer timer.Stop()
	for {
		var send chan<- []providers.Host // nil, so never ready, when there is nothing new
		var msg []providers.Host
		if current != nil && (sent == nil || !slices.EqualFunc(current, sent, providers.SameHost)) {
			send, msg = out, slices.Clone(current)
			// A receiver that is ready gets the news before the next poll starts.
			select {
			case send <- msg:
				sent = current
				continue
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("discovery: %w", ctx.Err())
		case send <- msg:
			sent = current
		case <-w.Poke:
			timer.Reset(0)
		case <-timer.C:
			start := time.Now()
			hosts, err := w.poll(ctx, timeout)
			if ctx.Err() != nil {
				return fmt.Errorf("discovery: %w", ctx.Err())
			}
			switch {
			case err != nil && current == nil:
				return fmt.Errorf("discovery: first poll: %w", err)
			case err != nil:
				if failures == 0 {
					failing = start
				}
				failures++
				log.Warn("discovery poll failed; keeping the last good host set",
					"error", err, "failures", failures, "failing_for", time.Since(failing).Round(time.Millisecond),
					"hosts", len(current))
			default:
				if failures > 0 {
					log.Info("discovery recovered", "failures", failures, "failed_for", time.Since(failing).Round(time.Millisecond))
					failures = 0
				}
				current = hosts
			}
			timer.Reset(interval)
		}
	}
}

// poll polls once under its own timeout and returns the hosts sorted by ID, never nil.
func (w *Watcher) poll(ctx context.Context, timeout time.Duration) ([]providers.Host, error) {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hosts, err := w.Provider.Hosts(pctx)
	if err != nil {
		if ctx.Err() == nil && pctx.Err() != nil {
			return nil, fmt.Errorf("no answer within %v: %w", timeout, err)
		}
		return nil, err
	}
	hosts = slices.Clone(hosts)
	if hosts == nil {
		hosts = []providers.Host{} // an empty group is a good result, unlike no result
	}
	slices.SortFunc(hosts, func(a, b providers.Host) int { return cmp.Compare(a.ID, b.ID) })
	for i, h := range hosts {
		switch {
		case h.ID == "":
			return nil, fmt.Errorf("provider returned a host with no ID (address %q)", h.Addr)
		case i > 0 && hosts[i-1].ID == h.ID:
			return nil, fmt.Errorf("provider returned host %q twice", h.ID)
		case h.Slots < 1:
			return nil, fmt.Errorf("provider returned host %q with %d slots", h.ID, h.Slots)
		case h.Addr == "":
			return nil, fmt.Errorf("provider returned host %q with no address", h.ID)
		}
	}
	return hosts, nil
}

// settings returns the interval, timeout and logger with their defaults applied.
func (w *Watcher) settings() (time.Duration, time.Duration, *slog.Logger) {
	log := w.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return cmp.Or(w.Interval, DefaultInterval), cmp.Or(w.Timeout, DefaultTimeout), log
}
