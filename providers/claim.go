package providers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Claiming a group: two drivers steering one group would undo each other's sizes, and the
// first to end would set the other's group to zero. So a driver that steers a group first
// claims it, in a tag on the group that every other driver reads before it steers, and
// refreshes the claim while it steers. A cloud whose groups take no tag of their own (a GCP
// managed instance group has no labels; an IBM instance group's tags live in a separate
// service) does not implement Claimer, and one driver per group is then the user's to keep.

const (
	// ClaimTagKey is the key of the group's tag that holds its claim.
	ClaimTagKey = "elasticd-driver"
	// ClaimLapse is how long a claim holds without a refresh: three of the driver's 30 s
	// checks of the group (driver.DefaultCapacityCheck), so that a check or two that fails
	// (a throttle, a brief outage) does not free the group, while a driver that died
	// (SIGKILL, a lost machine) holds it no longer than this.
	ClaimLapse = 2 * time.Minute
)

// ErrClaimed marks a group that another driver has claimed: Claim's caller must not steer it.
var ErrClaimed = errors.New("claimed by another driver")

// GroupClaim is a driver's claim on its group.
type GroupClaim struct {
	Owner string    // the job's ID: a driver taken up again on its --state-dir is the same owner
	Host  string    // the driver's host name, for the person who has to find that driver
	At    time.Time // when it was made or last refreshed, by the claimant's clock
}

// Value encodes c as the tag's value, "job=<owner>;host=<host>;at=<RFC 3339, UTC>": at most
// 256 characters (AWS's and Azure's limit on a tag value), none outside what both allow.
func (c GroupClaim) Value() string {
	clean := func(s string, n int) string {
		s = strings.Map(func(r rune) rune {
			if r == ';' || r == '=' || r < 0x20 || r > 0x7e {
				return '_'
			}
			return r
		}, s)
		return s[:min(len(s), n)]
	}
	return "job=" + clean(c.Owner, 64) + ";host=" + clean(c.Host, 150) + ";at=" + c.At.UTC().Format(time.RFC3339)
}

// ParseClaim reads a tag's value as Value writes it.
func ParseClaim(v string) (GroupClaim, error) {
	var c GroupClaim
	seen := map[string]bool{}
	for _, part := range strings.Split(v, ";") {
		k, val, ok := strings.Cut(part, "=")
		if !ok || seen[k] {
			return GroupClaim{}, fmt.Errorf("claim %q: want job=<id>;host=<host>;at=<time>", v)
		}
		seen[k] = true
		switch k {
		case "job":
			c.Owner = val
		case "host":
			c.Host = val
		case "at":
			at, err := time.Parse(time.RFC3339, val)
			if err != nil {
				return GroupClaim{}, fmt.Errorf("claim %q: at: %w", v, err)
			}
			c.At = at
		}
	}
	if c.Owner == "" || c.At.IsZero() {
		return GroupClaim{}, fmt.Errorf("claim %q: want job=<id>;host=<host>;at=<time>", v)
	}
	return c, nil
}

// Lapses is when c stops holding unless it is refreshed.
func (c GroupClaim) Lapses() time.Time { return c.At.Add(ClaimLapse) }

func (c GroupClaim) String() string {
	return fmt.Sprintf("job %s on host %s (claimed at %s)", c.Owner, c.Host, c.At.UTC().Format(time.RFC3339))
}

// Claimer is implemented by the Capacity providers whose cloud lets elasticd tag the group
// (AWS, Azure, the simulated cloud).
type Claimer interface {
	// Claim claims the group for c.Owner, or refreshes the claim. The group's tag is read:
	// when it holds no claim, c.Owner's, one that does not parse, or one that lapsed by c.At
	// (c.At is the claimant's now), c is written and Claim returns nil, nil. When another
	// owner's claim holds at c.At, nothing is written and that claim is returned: the caller
	// must not steer the group. A tag the cloud refuses to write (a permission) is an error
	// wrapping ErrRefused.
	Claim(ctx context.Context, c GroupClaim) (held *GroupClaim, err error)
	// Unclaim removes the group's claim if owner holds it; another owner's claim, or none, is
	// left as it is, and is not an error.
	Unclaim(ctx context.Context, owner string) error
}

// TagStore is a group's ClaimTagKey tag as its cloud holds it: what ClaimTag and UnclaimTag
// need of a cloud. Its errors are returned as they are, so they carry the cloud's prefix.
type TagStore interface {
	// ReadTag reads the tag's value; "" when the group has none.
	ReadTag(ctx context.Context) (string, error)
	// WriteTag sets the tag to value, keeping the group's other tags.
	WriteTag(ctx context.Context, value string) error
	// DeleteTag removes the tag, keeping the others; a tag already gone is not an error.
	DeleteTag(ctx context.Context) error
}

// ClaimTag is Claimer.Claim over a cloud's tag: read, decide, write, read back.
//
// The tag is not a lock: no cloud offers a conditional write of a group's tag. Two drivers
// that start within the same second can both read no claim, and both write theirs; the last
// write wins. The read after the write narrows that race: the driver whose write was
// overwritten before it read back sees the other's claim and refuses. It does not close it:
// when one driver reads back before the other writes, both go on, until the loser's next
// refresh (within a check, 30 s) finds the winner's claim and it stops steering. A cloud
// whose reads lag its writes (AWS tags are eventually consistent) widens the window by that
// lag. Start one driver per group and the tag is only ever a guard against a mistake.
func ClaimTag(ctx context.Context, s TagStore, c GroupClaim) (*GroupClaim, error) {
	cur, err := s.ReadTag(ctx)
	if err != nil {
		return nil, err
	}
	if held := holds(cur, c); held != nil {
		return held, nil
	}
	v := c.Value()
	if err := s.WriteTag(ctx, v); err != nil {
		return nil, err
	}
	after, err := s.ReadTag(ctx)
	if err != nil {
		return nil, err
	}
	if after == v {
		return nil, nil
	}
	if got, err := ParseClaim(after); err == nil {
		if got.Owner == c.Owner {
			return nil, nil // a refresh of ours crossed this one
		}
		return &got, nil // another driver wrote after this one: it has the group
	}
	return nil, fmt.Errorf("the group's %s tag read %q just after %q was written to it: something else changes it", ClaimTagKey, after, v)
}

// holds is the claim in the tag's value cur that keeps c from the group, or nil.
func holds(cur string, c GroupClaim) *GroupClaim {
	if cur == "" {
		return nil
	}
	held, err := ParseClaim(cur)
	if err != nil || held.Owner == c.Owner || !c.At.Before(held.Lapses()) {
		return nil // not a claim (taken over), ours, or lapsed
	}
	return &held
}

// UnclaimTag is Claimer.Unclaim over a cloud's tag: the tag is removed only when owner's.
func UnclaimTag(ctx context.Context, s TagStore, owner string) error {
	cur, err := s.ReadTag(ctx)
	if err != nil || cur == "" {
		return err
	}
	if held, err := ParseClaim(cur); err != nil || held.Owner != owner {
		return nil
	}
	return s.DeleteTag(ctx)
}
