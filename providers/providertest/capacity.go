package providertest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
)

// CapacityHarness makes the groups for RunCapacity.
type CapacityHarness struct {
	// NewGroup returns a provider for a fresh group of at least one host (listed by Hosts),
	// with a maximum of at least Desired+2 and, where the cloud has minimums, a minimum of at
	// least 1. Each subtest calls it once.
	NewGroup func(t *testing.T) CapacityGroup
}

// CapacityGroup is one provider under test and what the harness can see and do to its cloud.
// Every field but Provider may be nil when the cloud or its fake cannot; the cases that need
// it are skipped then.
type CapacityGroup struct {
	// Provider implements providers.Provider and providers.Capacity.
	Provider providers.Provider
	// Desired is the group's desired size as the cloud (the fake) holds it now.
	Desired func(t *testing.T) int
	// Min is the group's minimum as the cloud holds it now (clouds without one: nil).
	Min func(t *testing.T) int
	// Replaced lists the instances handed back so far, in order.
	Replaced func(t *testing.T) []string
	// RunOut makes the cloud fail the group's launches for want of capacity (a spot
	// stockout), as it reports such failures: after it, LaunchFailures must list one.
	RunOut func(t *testing.T)
	// Deny makes the cloud refuse every later mutating call for want of a permission.
	Deny func(t *testing.T)
	// Stall makes every later request wait until its context ends.
	Stall func(t *testing.T)
}

// RunCapacity runs the capacity cases. The contract:
//   - GroupSize reads a size with 0 <= Min <= Desired <= Max, as the cloud holds it;
//   - SetDesired(n) within Min..Max makes the cloud hold n, and the next GroupSize say so;
//   - SetDesired(0) on a group whose minimum is above zero lowers the minimum too;
//   - SetDesired above Max is refused with ErrAboveMax, changing nothing;
//   - Replace of a listed host reaches the cloud and leaves the desired size as it was;
//     Replace of an instance not in the group returns ErrNotInGroup;
//   - after a stockout, LaunchFailures lists a NoCapacity failure with a non-empty ID and
//     the cloud's Code, under the same ID in the next poll;
//   - a refused call's error wraps ErrRefused and names what it needs;
//   - an ended context makes each call return promptly with an error wrapping ctx.Err();
//   - a provider that is a providers.Claimer passes RunClaim's cases too.
func RunCapacity(t *testing.T, h CapacityHarness) {
	t.Helper()
	capOf := func(t *testing.T, g CapacityGroup) providers.Capacity {
		t.Helper()
		c, ok := g.Provider.(providers.Capacity)
		if !ok {
			t.Fatalf("%T does not implement providers.Capacity", g.Provider)
		}
		return c
	}
	t.Run("GroupSize", func(t *testing.T) {
		g := h.NewGroup(t)
		s := size(t, capOf(t, g))
		if s.Min < 0 || s.Min > s.Desired || s.Desired > s.Max {
			t.Errorf("GroupSize %+v: want 0 <= Min <= Desired <= Max", s)
		}
		if g.Desired != nil && s.Desired != g.Desired(t) {
			t.Errorf("GroupSize says desired %d; the cloud holds %d", s.Desired, g.Desired(t))
		}
	})
	t.Run("SetDesired", func(t *testing.T) {
		g := h.NewGroup(t)
		c := capOf(t, g)
		before := size(t, c)
		for _, n := range []int{before.Desired + 1, before.Desired} {
			if err := call(t, func(ctx context.Context) error { return c.SetDesired(ctx, n) }); err != nil {
				t.Fatalf("SetDesired(%d) from %v: %v", n, before, err)
			}
			if got := size(t, c).Desired; got != n {
				t.Errorf("after SetDesired(%d), GroupSize says desired %d", n, got)
			}
			if g.Desired != nil && g.Desired(t) != n {
				t.Errorf("after SetDesired(%d), the cloud holds desired %d", n, g.Desired(t))
			}
		}
	})
	t.Run("SetDesiredZero", func(t *testing.T) {
		g := h.NewGroup(t)
		c := capOf(t, g)
		if err := call(t, func(ctx context.Context) error { return c.SetDesired(ctx, 0) }); err != nil {
			t.Fatalf("SetDesired(0) from %v: %v", size(t, c), err)
		}
		s := size(t, c)
		if s.Desired != 0 || s.Min != 0 {
			t.Errorf("after SetDesired(0), GroupSize %v; want desired 0 and min 0", s)
		}
		if g.Desired != nil && g.Desired(t) != 0 {
			t.Errorf("after SetDesired(0), the cloud holds desired %d", g.Desired(t))
		}
		if g.Min != nil && g.Min(t) != 0 {
			t.Errorf("after SetDesired(0), the cloud holds min %d", g.Min(t))
		}
	})
	t.Run("SetDesiredAboveMax", func(t *testing.T) {
		g := h.NewGroup(t)
		c := capOf(t, g)
		before := size(t, c)
		if before.Max >= providers.MaxUnknown {
			t.Skip("the group has no maximum")
		}
		err := call(t, func(ctx context.Context) error { return c.SetDesired(ctx, before.Max+1) })
		if !errors.Is(err, providers.ErrAboveMax) {
			t.Errorf("SetDesired(max+1 = %d): error %v; want one wrapping ErrAboveMax", before.Max+1, err)
		}
		if after := size(t, c); after.Desired != before.Desired || after.Max != before.Max {
			t.Errorf("a refused SetDesired changed the group: %v, then %v", before, after)
		}
	})
	t.Run("Replace", func(t *testing.T) {
		g := h.NewGroup(t)
		c := capOf(t, g)
		hosts := poll(t, g.Provider)
		before := size(t, c)
		id := hosts[0].ID
		if err := call(t, func(ctx context.Context) error { return c.Replace(ctx, id) }); err != nil {
			t.Fatalf("Replace(%s): %v", id, err)
		}
		if g.Replaced != nil && !slices.Contains(g.Replaced(t), id) {
			t.Errorf("after Replace(%s), the cloud handed back %v", id, g.Replaced(t))
		}
		if after := size(t, c); after.Desired != before.Desired {
			t.Errorf("Replace changed the desired size: %d, then %d", before.Desired, after.Desired)
		}
	})
	t.Run("ReplaceNotInGroup", func(t *testing.T) {
		g := h.NewGroup(t)
		c := capOf(t, g)
		poll(t, g.Provider)
		err := call(t, func(ctx context.Context) error { return c.Replace(ctx, "not-a-member-0000") })
		if !errors.Is(err, providers.ErrNotInGroup) {
			t.Errorf("Replace of an instance not in the group: error %v; want one wrapping ErrNotInGroup", err)
		}
	})
	t.Run("LaunchFailures", func(t *testing.T) {
		g := h.NewGroup(t)
		c := capOf(t, g)
		if fs := failures(t, c); slices.ContainsFunc(fs, func(f providers.LaunchFailure) bool { return f.Kind == providers.NoCapacity }) {
			t.Errorf("a healthy group lists no-capacity failures: %+v", fs)
		}
		if g.RunOut == nil {
			t.Skip("the harness cannot run the cloud out of capacity")
		}
		g.RunOut(t)
		var first []providers.LaunchFailure
		deadline := time.Now().Add(10 * time.Second)
		for {
			fs := failures(t, c)
			for _, f := range fs {
				if f.Kind == providers.NoCapacity {
					first = append(first, f)
				}
			}
			if len(first) > 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if len(first) == 0 {
			t.Fatal("after a stockout, LaunchFailures lists no NoCapacity failure")
		}
		for _, f := range first {
			if f.ID == "" || f.Code == "" {
				t.Errorf("failure %+v: want a non-empty ID and the cloud's Code", f)
			}
		}
		again := failures(t, c)
		for _, f := range first {
			if !slices.ContainsFunc(again, func(g providers.LaunchFailure) bool { return g.ID == f.ID }) {
				t.Errorf("failure %q is not listed again under the same ID: %+v", f.ID, again)
			}
		}
	})
	t.Run("Refused", func(t *testing.T) {
		g := h.NewGroup(t)
		c := capOf(t, g)
		if g.Deny == nil {
			t.Skip("the harness cannot deny permissions")
		}
		before := size(t, c)
		g.Deny(t)
		err := call(t, func(ctx context.Context) error { return c.SetDesired(ctx, before.Desired+1) })
		if !errors.Is(err, providers.ErrRefused) {
			t.Errorf("SetDesired without permission: error %v; want one wrapping ErrRefused", err)
		}
		t.Logf("the refusal reads: %v", err)
		hosts := poll(t, g.Provider)
		err = call(t, func(ctx context.Context) error { return c.Replace(ctx, hosts[0].ID) })
		if !errors.Is(err, providers.ErrRefused) {
			t.Errorf("Replace without permission: error %v; want one wrapping ErrRefused", err)
		}
		if cl, ok := g.Provider.(providers.Claimer); ok {
			claim := providers.GroupClaim{Owner: "job-denied", Host: "driver-1", At: time.Now()}
			err = call(t, func(ctx context.Context) error { _, err := cl.Claim(ctx, claim); return err })
			if !errors.Is(err, providers.ErrRefused) {
				t.Errorf("Claim without permission: error %v; want one wrapping ErrRefused", err)
			}
			t.Logf("the claim's refusal reads: %v", err)
		}
	})
	t.Run("CancelledContext", func(t *testing.T) {
		g := h.NewGroup(t)
		c := capOf(t, g)
		member := poll(t, g.Provider)[0].ID // a Replace that has to ask the cloud
		after := time.Duration(0)           // without a stall, the context has ended before the call
		if g.Stall != nil {
			g.Stall(t)
			after = 50 * time.Millisecond
		}
		ops := map[string]func(context.Context) error{
			"GroupSize":      func(ctx context.Context) error { _, err := c.GroupSize(ctx); return err },
			"SetDesired":     func(ctx context.Context) error { return c.SetDesired(ctx, 1) },
			"Replace":        func(ctx context.Context) error { return c.Replace(ctx, member) },
			"LaunchFailures": func(ctx context.Context) error { _, err := c.LaunchFailures(ctx); return err },
		}
		if cl, ok := g.Provider.(providers.Claimer); ok {
			ops["Claim"] = func(ctx context.Context) error {
				_, err := cl.Claim(ctx, providers.GroupClaim{Owner: "job-a", Host: "h", At: time.Now()})
				return err
			}
			ops["Unclaim"] = func(ctx context.Context) error { return cl.Unclaim(ctx, "job-a") }
		}
		for name, op := range ops {
			ctx, cancel := context.WithTimeout(t.Context(), after)
			start := time.Now()
			err := op(ctx)
			cancel()
			if took := time.Since(start); took > prompt {
				t.Errorf("%s took %v after its context ended; want under %v", name, took, prompt)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s with an ended context: error %v; want one wrapping context.DeadlineExceeded", name, err)
			}
		}
	})
	t.Run("Claim", func(t *testing.T) { RunClaim(t, h) })
}

// RunClaim runs the cases of a providers.Claimer (skipped for a provider that is not one).
// The contract:
//   - a group no one claimed is claimed, and Claim returns no claim held;
//   - another owner's claim, before it lapses, is returned, and the group stays its;
//   - the owner claims again (a refresh) and keeps the group;
//   - a claim older than providers.ClaimLapse is taken over;
//   - Unclaim by an owner that does not hold the claim leaves it; by the owner, frees it.
func RunClaim(t *testing.T, h CapacityHarness) {
	t.Helper()
	claimer := func(t *testing.T) providers.Claimer {
		t.Helper()
		cl, ok := h.NewGroup(t).Provider.(providers.Claimer)
		if !ok {
			t.Skip("the provider does not implement providers.Claimer")
		}
		return cl
	}
	now := time.Now().Truncate(time.Second) // the tag keeps seconds
	a := providers.GroupClaim{Owner: "job-a", Host: "driver-a", At: now}
	b := providers.GroupClaim{Owner: "job-b", Host: "driver-b", At: now.Add(time.Second)}
	t.Run("FreeThenHeld", func(t *testing.T) {
		cl := claimer(t)
		mustClaim(t, cl, a)
		held := claimOf(t, cl, b)
		if held == nil || held.Owner != a.Owner || held.Host != a.Host || !held.At.Equal(a.At) {
			t.Fatalf("a second owner's Claim while the first holds the group: held %v; want %v", held, a)
		}
		// The first owner again: a refresh, which keeps the group from the second.
		refresh := a
		refresh.At = now.Add(providers.ClaimLapse - time.Second)
		mustClaim(t, cl, refresh)
		later := b
		later.At = now.Add(providers.ClaimLapse + time.Second) // the first claim's lapse, not the refresh's
		if held := claimOf(t, cl, later); held == nil || held.Owner != a.Owner || !held.At.Equal(refresh.At) {
			t.Errorf("after the first owner's refresh, a second owner's Claim: held %v; want the refreshed claim", held)
		}
	})
	t.Run("Lapsed", func(t *testing.T) {
		cl := claimer(t)
		stale := a
		stale.At = now.Add(-providers.ClaimLapse - time.Minute) // a driver that died an hour of checks ago
		mustClaim(t, cl, stale)
		mustClaim(t, cl, b)
		if held := claimOf(t, cl, a); held == nil || held.Owner != b.Owner {
			t.Errorf("after the take-over, the first owner's Claim: held %v; want the second owner's", held)
		}
	})
	t.Run("Unclaim", func(t *testing.T) {
		cl := claimer(t)
		mustClaim(t, cl, a)
		if err := call(t, func(ctx context.Context) error { return cl.Unclaim(ctx, b.Owner) }); err != nil {
			t.Fatalf("Unclaim by an owner that does not hold the claim: %v", err)
		}
		if held := claimOf(t, cl, b); held == nil || held.Owner != a.Owner {
			t.Fatalf("after another owner's Unclaim, a Claim: held %v; want the first owner's claim, left as it was", held)
		}
		if err := call(t, func(ctx context.Context) error { return cl.Unclaim(ctx, a.Owner) }); err != nil {
			t.Fatalf("Unclaim by the owner: %v", err)
		}
		mustClaim(t, cl, b) // freed
		if err := call(t, func(ctx context.Context) error { return cl.Unclaim(ctx, b.Owner) }); err != nil {
			t.Fatalf("Unclaim: %v", err)
		}
		if err := call(t, func(ctx context.Context) error { return cl.Unclaim(ctx, b.Owner) }); err != nil {
			t.Errorf("Unclaim of a group no one claims: %v; want nil", err)
		}
	})
}

// claimOf is Claim's answer, failing the test on an error.
func claimOf(t *testing.T, cl providers.Claimer, c providers.GroupClaim) *providers.GroupClaim {
	t.Helper()
	var held *providers.GroupClaim
	if err := call(t, func(ctx context.Context) (err error) { held, err = cl.Claim(ctx, c); return err }); err != nil {
		t.Fatalf("Claim(%v): %v", c, err)
	}
	return held
}

// mustClaim claims the group for c, which must get it.
func mustClaim(t *testing.T, cl providers.Claimer, c providers.GroupClaim) {
	t.Helper()
	if held := claimOf(t, cl, c); held != nil {
		t.Fatalf("Claim(%v): the group is held by %v; want it claimed", c, held)
	}
}

func size(t *testing.T, c providers.Capacity) providers.GroupSize {
	t.Helper()
	var s providers.GroupSize
	if err := call(t, func(ctx context.Context) (err error) { s, err = c.GroupSize(ctx); return err }); err != nil {
		t.Fatalf("GroupSize: %v", err)
	}
	return s
}

func failures(t *testing.T, c providers.Capacity) []providers.LaunchFailure {
	t.Helper()
	var fs []providers.LaunchFailure
	if err := call(t, func(ctx context.Context) (err error) { fs, err = c.LaunchFailures(ctx); return err }); err != nil {
		t.Fatalf("LaunchFailures: %v", err)
	}
	return fs
}

func call(t *testing.T, op func(context.Context) error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	return op(ctx)
}
