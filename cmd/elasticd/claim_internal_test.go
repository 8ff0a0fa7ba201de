package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/elasticd/elasticd/driver"
	"github.com/elasticd/elasticd/providers"
)

// tagGroup is a steerable group whose claim tag lives in memory; deny refuses its writes.
type tagGroup struct {
	mu   sync.Mutex
	tag  string
	deny bool
}

func (g *tagGroup) GroupSize(context.Context) (providers.GroupSize, error) {
	return providers.GroupSize{Desired: 1, Max: 4}, nil
}
func (g *tagGroup) SetDesired(context.Context, int) error { return nil }
func (g *tagGroup) Replace(context.Context, string) error { return nil }
func (g *tagGroup) LaunchFailures(context.Context) ([]providers.LaunchFailure, error) {
	return nil, nil
}
func (g *tagGroup) Claim(ctx context.Context, c providers.GroupClaim) (*providers.GroupClaim, error) {
	return providers.ClaimTag(ctx, g, c)
}
func (g *tagGroup) Unclaim(ctx context.Context, owner string) error {
	return providers.UnclaimTag(ctx, g, owner)
}
func (g *tagGroup) ReadTag(context.Context) (string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tag, nil
}
func (g *tagGroup) WriteTag(_ context.Context, v string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.deny {
		return providers.Refused("tag the group", "test:CreateOrUpdateTags", errors.New("AccessDenied"))
	}
	g.tag = v
	return nil
}
func (g *tagGroup) DeleteTag(ctx context.Context) error { return g.WriteTag(ctx, "") }

// untagged is a steerable group whose cloud takes no tag (GCP, IBM): only its Capacity shows.
type untagged struct{ providers.Capacity }

func claimOptions(spot, fallback providers.Capacity) driver.Options {
	o := driver.Options{
		Logger:   slog.New(slog.DiscardHandler),
		Capacity: spot,
		Config:   driver.Config{Capacity: &driver.CapacityConfig{Group: "aws group spot"}},
	}
	if fallback != nil {
		o.Fallback = fallback
		o.Config.Capacity.Fallback = &driver.FallbackConfig{Group: "aws group od"}
	}
	return o
}

func TestClaimGroups(t *testing.T) {
	ctx := t.Context()
	t.Run("Free", func(t *testing.T) {
		spot, od := &tagGroup{}, &tagGroup{}
		o := claimOptions(spot, od)
		if err := claimGroups(ctx, &o); err != nil {
			t.Fatal(err)
		}
		if len(o.JobID) != 8 || o.Claim == nil || o.FallbackClaim == nil || o.Claim.Owner != o.JobID {
			t.Fatalf("job %q, claims %+v %+v; want an 8-hex-digit job ID owning both", o.JobID, o.Claim, o.FallbackClaim)
		}
		if !strings.HasPrefix(spot.tag, "job="+o.JobID+";host=") || !strings.HasPrefix(od.tag, "job="+o.JobID+";host=") {
			t.Errorf("tags %q, %q; want this job's claims", spot.tag, od.tag)
		}
	})
	t.Run("HeldByAnother", func(t *testing.T) {
		at := time.Now().Add(-30 * time.Second).Truncate(time.Second)
		theirs := providers.GroupClaim{Owner: "feedf00d", Host: "ml-driver-7", At: at}
		spot, od := &tagGroup{}, &tagGroup{tag: theirs.Value()}
		o := claimOptions(spot, od)
		o.JobID = "0a1b2c3d"
		err := claimGroups(ctx, &o)
		var ec cli.ExitCoder
		if !errors.As(err, &ec) || ec.ExitCode() != 2 {
			t.Fatalf("error %v; want exit status 2", err)
		}
		want := "--manage-capacity: aws group od is steered by job feedf00d on host ml-driver-7 (claimed at " + at.UTC().Format(time.RFC3339) +
			"); stop that driver, or wait until its claim lapses at " + at.Add(providers.ClaimLapse).UTC().Format(time.RFC3339)
		if err.Error() != want {
			t.Errorf("error\n %v\nwant\n %s", err, want)
		}
		if spot.tag != "" || od.tag != theirs.Value() {
			t.Errorf("tags %q, %q; want the spot group's claim released and the other's left", spot.tag, od.tag)
		}
	})
	t.Run("RefusedGoesOn", func(t *testing.T) {
		o := claimOptions(&tagGroup{deny: true}, nil)
		if err := claimGroups(ctx, &o); err != nil || o.Claim != nil {
			t.Fatalf("claim refused: %v, claim %+v; want the job to go on without one", err, o.Claim)
		}
	})
	t.Run("Untagged", func(t *testing.T) {
		o := claimOptions(untagged{&tagGroup{}}, nil)
		if err := claimGroups(ctx, &o); err != nil || o.Claim != nil {
			t.Fatalf("an untagged cloud: %v, claim %+v; want no claim, no error", err, o.Claim)
		}
	})
	t.Run("SameJobAgain", func(t *testing.T) { // a driver taken up again on its --state-dir
		mine := providers.GroupClaim{Owner: "0a1b2c3d", Host: "old-host", At: time.Now()}
		spot := &tagGroup{tag: mine.Value()}
		o := claimOptions(spot, nil)
		o.JobID = "0a1b2c3d"
		if err := claimGroups(ctx, &o); err != nil || o.Claim == nil {
			t.Fatalf("the job's own claim: %v, %+v; want it taken again", err, o.Claim)
		}
	})
}
