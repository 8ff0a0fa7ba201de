// Package providertest is the conformance suite every providers.Provider must pass, so the
// discovery watcher and host manager can rely on the same behaviour from each of them.
package providertest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
)

// Harness makes the providers under test.
type Harness struct {
	// NewGroup returns a provider for a fresh group of at least one host. Each subtest calls
	// it once.
	NewGroup func(t *testing.T) Group
}

// Group is one provider under test and what the harness can do to its group. The optional
// fields are nil when the provider cannot do that; the subtests that need them are skipped.
type Group struct {
	Provider providers.Provider
	// Want is the group the provider must list (in any order), or nil when not known ahead.
	Want []providers.Host
	// Change alters the group and returns the new Want; the next poll must list it.
	Change func(t *testing.T) []providers.Host
	// Fail makes every later poll fail.
	Fail func(t *testing.T)
	// Stall makes every later poll wait until its context ends.
	Stall func(t *testing.T)

	// The notice cases run when Provider is a providers.Noticer; those that need a notice
	// announced are skipped when Announce is nil.
	//
	// Announce makes the cloud announce that one of the group's hosts goes away (a spot
	// interruption); the polls that follow must return it. It returns a func that delivers
	// the same announcement again (a queue's redelivery, a metadata service answering
	// again), after which the polls must return it under the same ID.
	Announce func(t *testing.T) (again func(t *testing.T))
	// AnnounceAnswerable is Announce for a notice that must be answered (a scale-in
	// lifecycle action), for the CompleteNotice cases; nil when the cloud has none.
	AnnounceAnswerable func(t *testing.T)
	// Answered is how many answers the cloud has taken (nil: not known).
	Answered func(t *testing.T) int
}

// NoticeHarness makes noticers that are not providers (a host's metadata service, which
// the agent watches), for RunNotices.
type NoticeHarness struct {
	// NewSource returns a fresh noticer with nothing announced. Each subtest calls it once.
	NewSource func(t *testing.T) NoticeSource
}

// NoticeSource is one noticer under test and what the harness can do to it; the fields
// mean what Group's fields of the same names mean.
type NoticeSource struct {
	Noticer providers.Noticer
	// HostIDs are the hosts its notices may name; nil: any.
	HostIDs            []string
	Announce           func(t *testing.T) (again func(t *testing.T))
	AnnounceAnswerable func(t *testing.T)
	Answered           func(t *testing.T) int
	Stall              func(t *testing.T)
}

// RunNotices runs the notice cases of the suite (see runNotices) on noticers that are not
// providers.
func RunNotices(t *testing.T, h NoticeHarness) {
	t.Helper()
	runNotices(t, func(t *testing.T) NoticeSource { return h.NewSource(t) })
}

// prompt is how long a provider may take to notice that its context has ended.
const prompt = 2 * time.Second

// Run runs the suite. The contract it checks:
//   - hosts have non-empty, unique IDs, an Addr without spaces or a port, and Slots >= 1;
//   - repeated and concurrent polls of an unchanged group return the same set;
//   - the returned slice belongs to the caller: changing it does not change the next poll;
//   - a context that has ended (before or during a poll) makes Hosts return promptly, with
//     no hosts and an error that wraps ctx.Err();
//   - a failed poll returns no hosts; a changed group shows on the next poll;
//
// and, for a providers.Noticer (see runNotices), of Notices and CompleteNotice.
func Run(t *testing.T, h Harness) {
	t.Helper()
	runNotices(t, func(t *testing.T) NoticeSource {
		g := h.NewGroup(t)
		n, ok := g.Provider.(providers.Noticer)
		if !ok {
			t.Skip("the provider has no notices")
		}
		var ids []string
		if g.Announce != nil || g.AnnounceAnswerable != nil {
			for _, h := range poll(t, g.Provider) { // also tells the provider its group
				ids = append(ids, h.ID)
			}
		}
		return NoticeSource{Noticer: n, HostIDs: ids, Announce: g.Announce,
			AnnounceAnswerable: g.AnnounceAnswerable, Answered: g.Answered, Stall: g.Stall}
	})
	t.Run("ValidHosts", func(t *testing.T) {
		g := h.NewGroup(t)
		got := poll(t, g.Provider)
		if len(got) == 0 {
			t.Fatal("Hosts returned no hosts for a group of at least one")
		}
		if g.Want != nil {
			sameSet(t, "Hosts", got, g.Want)
		}
	})
	t.Run("RepeatedPollsAgree", func(t *testing.T) {
		g := h.NewGroup(t)
		first := poll(t, g.Provider)
		for i := range 3 {
			sameSet(t, fmt.Sprintf("poll %d", i+2), poll(t, g.Provider), first)
		}
	})
	t.Run("CallerOwnsResult", func(t *testing.T) {
		g := h.NewGroup(t)
		first := poll(t, g.Provider)
		keep := slices.Clone(first)
		for i := range first {
			first[i].ID += "-changed-by-caller"
			first[i].Slots = 0
		}
		_ = append(first[:0], providers.Host{ID: "intruder", Addr: "intruder", Slots: 1})
		sameSet(t, "poll after the caller changed the first result", poll(t, g.Provider), keep)
	})
	t.Run("ConcurrentPolls", func(t *testing.T) {
		g := h.NewGroup(t)
		want := poll(t, g.Provider)
		const n = 8
		results := make([][]providers.Host, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				defer cancel()
				results[i], errs[i] = g.Provider.Hosts(ctx)
			})
		}
		wg.Wait()
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("concurrent poll %d: %v", i, errs[i])
			}
			sameSet(t, fmt.Sprintf("concurrent poll %d", i), results[i], want)
		}
	})
	// A context that has ended before the poll, or ends during it (when the harness can stall
	// the provider so that the poll is still running then).
	for _, c := range []struct {
		name   string
		during bool
		want   error
	}{
		{"CancelledContext", false, context.Canceled},
		{"ExpiredDeadline", false, context.DeadlineExceeded},
		{"CancelDuringPoll", true, context.Canceled},
		{"DeadlineDuringPoll", true, context.DeadlineExceeded},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := h.NewGroup(t)
			var after time.Duration
			if c.during {
				if g.Stall == nil {
					t.Skip("the harness cannot stall this provider")
				}
				g.Stall(t)
				after = 50 * time.Millisecond
			}
			var ctx context.Context
			var cancel context.CancelFunc
			switch {
			case c.want == context.DeadlineExceeded:
				ctx, cancel = context.WithTimeout(t.Context(), after) // 0: expired already
			case c.during:
				ctx, cancel = context.WithCancel(t.Context())
				time.AfterFunc(after, cancel)
			default:
				ctx, cancel = context.WithCancel(t.Context())
				cancel()
			}
			defer cancel()
			ended(t, "Hosts", g.Provider.Hosts, ctx, c.want)
		})
	}
	t.Run("Change", func(t *testing.T) {
		g := h.NewGroup(t)
		if g.Change == nil {
			t.Skip("the harness cannot change this provider's group")
		}
		poll(t, g.Provider)
		want := g.Change(t)
		sameSet(t, "poll after the group changed", poll(t, g.Provider), want)
	})
	t.Run("Failure", func(t *testing.T) {
		g := h.NewGroup(t)
		if g.Fail == nil {
			t.Skip("the harness cannot make this provider fail")
		}
		poll(t, g.Provider)
		g.Fail(t)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		hosts, err := g.Provider.Hosts(ctx)
		if err == nil {
			t.Fatalf("Hosts after Fail: no error, hosts %v", hosts)
		}
		if len(hosts) != 0 {
			t.Errorf("Hosts returned hosts %v with its error %v; a failed poll must return none", hosts, err)
		}
		t.Logf("the failure reads: %v", err)
	})
}

// poll polls once, fails the test on an error, and checks every host.
func poll(t *testing.T, p providers.Provider) []providers.Host {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	hosts, err := p.Hosts(ctx)
	if err != nil {
		t.Fatalf("Hosts: %v", err)
	}
	seen := make(map[string]bool, len(hosts))
	for _, h := range hosts {
		if h.ID == "" {
			t.Errorf("host %+v has an empty ID", h)
		}
		if seen[h.ID] {
			t.Errorf("host ID %q is listed twice", h.ID)
		}
		seen[h.ID] = true
		if h.Slots < 1 {
			t.Errorf("host %q has %d slots; a listed host has at least 1", h.ID, h.Slots)
		}
		if h.Addr == "" || strings.ContainsAny(h.Addr, " \t\r\n") {
			t.Errorf("host %q has Addr %q; it must be a host name or IP without spaces", h.ID, h.Addr)
		}
		if _, port, err := net.SplitHostPort(h.Addr); err == nil {
			t.Errorf("host %q has Addr %q with port %s; Addr is a host name or IP only", h.ID, h.Addr, port)
		}
	}
	return hosts
}

// ended checks that a poll (Hosts or Notices, named what) under a context that has ended, or
// soon ends, returns promptly with an error wrapping want and nothing else.
func ended[T any](t *testing.T, what string, poll func(context.Context) ([]T, error), ctx context.Context, want error) {
	t.Helper()
	type result struct {
		got []T
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		got, err := poll(ctx)
		done <- result{got, err}
	}()
	timer := time.NewTimer(prompt + 30*time.Second)
	defer timer.Stop()
	var r result
	select {
	case r = <-done:
	case <-timer.C:
		t.Fatalf("%s did not return after its context ended", what) // the goroutine is leaked: the provider is broken
	}
	if took := time.Since(start); took > prompt {
		t.Errorf("%s took %v to notice that its context ended; want under %v", what, took, prompt)
	}
	if !errors.Is(r.err, want) {
		t.Errorf("%s with an ended context: error %v; want one wrapping %v", what, r.err, want)
	}
	if len(r.got) != 0 {
		t.Errorf("%s with an ended context returned %v", what, r.got)
	}
}

// sameSet compares hosts as sets keyed by ID, all fields included.
func sameSet(t *testing.T, what string, got, want []providers.Host) {
	t.Helper()
	byID := func(a, b providers.Host) int { return cmp.Compare(a.ID, b.ID) }
	g, w := slices.SortedFunc(slices.Values(got), byID), slices.SortedFunc(slices.Values(want), byID)
	if !slices.EqualFunc(g, w, providers.SameHost) {
		t.Errorf("%s:\n got  %v\n want %v", what, g, w)
	}
}

// runNotices checks a providers.Noticer:
//   - with nothing announced, a poll answers no notices and no error;
//   - an announced notice comes within a few polls, with a non-empty ID unique in its
//     answer, a HostID of the group, a known Kind; delivered again, it has the same ID;
//   - a context that has ended (before or during a poll) makes Notices return promptly with
//     no notices and an error wrapping ctx.Err();
//
// and a providers.NoticeCompleter:
//   - completing a notice that needs an answer succeeds and reaches the cloud; completing it
//     again is harmless (no error: the cloud no longer holds it open);
//   - completing a notice that needs no answer succeeds;
//   - completing under an ended context fails with ctx's error.
func runNotices(t *testing.T, newSource func(t *testing.T) NoticeSource) {
	t.Run("NoticesEmpty", func(t *testing.T) {
		src := newSource(t)
		for i := range 2 {
			if ns := pollNotices(t, src.Noticer); len(ns) != 0 {
				t.Errorf("poll %d with nothing announced: %+v; want none", i+1, ns)
			}
		}
	})
	t.Run("NoticesStableIDs", func(t *testing.T) {
		src := newSource(t)
		if src.Announce == nil {
			t.Skip("the harness cannot announce a notice")
		}
		again := src.Announce(t)
		first := awaitNotices(t, src)
		again(t)
		second := awaitNotices(t, src)
		if !slices.Equal(noticeIDs(first), noticeIDs(second)) {
			t.Errorf("the same announcement delivered again: IDs %v, then %v; want the same", noticeIDs(first), noticeIDs(second))
		}
	})
	for _, c := range []struct {
		name string
		want error
	}{
		{"NoticesCancelledContext", context.Canceled},
		{"NoticesExpiredDeadline", context.DeadlineExceeded},
		{"NoticesCancelDuringPoll", context.Canceled},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := newSource(t)
			ctx, cancel := context.WithCancel(t.Context())
			switch c.name {
			case "NoticesExpiredDeadline":
				ctx, cancel = context.WithTimeout(t.Context(), 0)
			case "NoticesCancelDuringPoll":
				if src.Stall == nil {
					t.Skip("the harness cannot stall this provider")
				}
				src.Stall(t)
				time.AfterFunc(50*time.Millisecond, cancel)
			default:
				cancel()
			}
			defer cancel()
			ended(t, "Notices", src.Noticer.Notices, ctx, c.want)
		})
	}
	completer := func(t *testing.T) (NoticeSource, providers.NoticeCompleter) {
		src := newSource(t)
		c, ok := src.Noticer.(providers.NoticeCompleter)
		if !ok {
			t.Skip("the notices need no answer")
		}
		return src, c
	}
	t.Run("CompleteNotice", func(t *testing.T) {
		src, c := completer(t)
		if src.AnnounceAnswerable == nil {
			t.Skip("the harness cannot announce a notice that needs an answer")
		}
		src.AnnounceAnswerable(t)
		ns := awaitNotices(t, src)
		for _, nt := range ns {
			if err := complete(t, c, t.Context(), nt); err != nil {
				t.Fatalf("CompleteNotice(%s): %v", nt.ID, err)
			}
		}
		if src.Answered != nil {
			if n := src.Answered(t); n < 1 {
				t.Errorf("the cloud took %d answers; want the notice's", n)
			}
		}
		for _, nt := range ns {
			if err := complete(t, c, t.Context(), nt); err != nil {
				t.Errorf("CompleteNotice(%s) again: %v; want it harmless", nt.ID, err)
			}
		}
	})
	t.Run("CompleteNoticeWithoutAnswer", func(t *testing.T) {
		src, c := completer(t)
		if src.Announce == nil {
			t.Skip("the harness cannot announce a notice")
		}
		src.Announce(t)
		for _, nt := range awaitNotices(t, src) {
			if err := complete(t, c, t.Context(), nt); err != nil {
				t.Errorf("CompleteNotice(%s): %v", nt.ID, err)
			}
		}
	})
	t.Run("CompleteNoticeCancelledContext", func(t *testing.T) {
		_, c := completer(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		err := complete(t, c, ctx, providers.Notice{ID: "n-1", HostID: "h-1", Kind: providers.ScaleIn})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("CompleteNotice with an ended context: %v; want one wrapping context.Canceled", err)
		}
	})
}

// pollNotices polls once and fails the test on an error.
func pollNotices(t *testing.T, n providers.Noticer) []providers.Notice {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ns, err := n.Notices(ctx)
	if err != nil {
		t.Fatalf("Notices: %v", err)
	}
	return ns
}

// awaitNotices polls until an answer has notices (at most 10 polls) and checks them.
func awaitNotices(t *testing.T, src NoticeSource) []providers.Notice {
	t.Helper()
	for range 10 {
		ns := pollNotices(t, src.Noticer)
		if len(ns) == 0 {
			continue
		}
		seen := map[string]bool{}
		for _, nt := range ns {
			switch {
			case nt.ID == "":
				t.Errorf("notice %+v has no ID", nt)
			case seen[nt.ID]:
				t.Errorf("notice ID %q twice in one answer", nt.ID)
			}
			seen[nt.ID] = true
			if src.HostIDs != nil && !slices.Contains(src.HostIDs, nt.HostID) {
				t.Errorf("notice %s names host %q, not of the group", nt.ID, nt.HostID)
			}
			switch nt.Kind {
			case providers.Interruption, providers.Rebalance, providers.ScaleIn, providers.Maintenance:
			default:
				t.Errorf("notice %s has kind %q", nt.ID, nt.Kind)
			}
		}
		return ns
	}
	t.Fatal("no notice in 10 polls after the announcement")
	return nil
}

func noticeIDs(ns []providers.Notice) []string {
	ids := make([]string, 0, len(ns))
	for _, n := range ns {
		ids = append(ids, n.ID)
	}
	slices.Sort(ids)
	return ids
}

// complete completes n, bounded in time.
func complete(t *testing.T, c providers.NoticeCompleter, ctx context.Context, n providers.Notice) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return c.CompleteNotice(ctx, n)
}
