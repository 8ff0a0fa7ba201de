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
//   - an ended context makes each call return promptly with an error wrapping ctx.Err().
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
		for name, op := range map[string]func(context.Context) error{
			"GroupSize":      func(ctx context.Context) error { _, err := c.GroupSize(ctx); return err },
			"SetDesired":     func(ctx context.Context) error { return c.SetDesired(ctx, 1) },
			"Replace":        func(ctx context.Context) error { return c.Replace(ctx, member) },
			"LaunchFailures": func(ctx context.Context) error { _, err := c.LaunchFailures(ctx); return err },
		} {
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
