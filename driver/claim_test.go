package driver_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver"
	"github.com/elasticd/elasticd/proc"
	"github.com/elasticd/elasticd/providers"
)

// claimGroup is a fakeGroup whose cloud tags it: its claim is one tag in memory.
type claimGroup struct {
	fakeGroup
	tag     string
	claims  int // Claim calls
	unclaim int // Unclaim calls
}

func (g *claimGroup) Claim(ctx context.Context, c providers.GroupClaim) (*providers.GroupClaim, error) {
	g.mu.Lock()
	g.claims++
	g.mu.Unlock()
	return providers.ClaimTag(ctx, g, c)
}

func (g *claimGroup) Unclaim(ctx context.Context, owner string) error {
	g.mu.Lock()
	g.unclaim++
	g.mu.Unlock()
	return providers.UnclaimTag(ctx, g, owner)
}

func (g *claimGroup) ReadTag(context.Context) (string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tag, nil
}

func (g *claimGroup) WriteTag(_ context.Context, v string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.tag = v
	return nil
}

func (g *claimGroup) DeleteTag(context.Context) error { return g.WriteTag(context.Background(), "") }

// claimedJob runs a job of two one-slot hosts for about a second and a half on g, claimed
// by job "job-1", its group read every 100ms; during runs alongside it.
func claimedJob(t *testing.T, g *claimGroup, during func()) driver.Result {
	t.Helper()
	claim := providers.GroupClaim{Owner: "job-1", Host: "driver-1", At: time.Now()}
	g.tag = claim.Value() // as the command line left it
	hs := []providers.Host{{ID: "a", Addr: "127.0.0.1", Slots: 1}, {ID: "b", Addr: "127.0.0.1", Slots: 1}}
	o := driver.Options{
		Config: driver.Config{
			NP: 2, MinNP: 1, Mode: driver.ModeRestart,
			ElasticTimeout: time.Minute, StartTimeout: time.Minute, BarrierTimeout: time.Minute,
			Capacity: &driver.CapacityConfig{Group: "test group g", CheckEvery: 100 * time.Millisecond},
		},
		JobID:             "job-1",
		Capacity:          g,
		Claim:             &claim,
		Provider:          providers.NewFixed(hs),
		DiscoveryInterval: 100 * time.Millisecond,
		Launcher:          proc.NewLocal(),
		Command:           []string{"/bin/sh", "-c", "sleep 1.5"},
		StopGrace:         2 * time.Second,
		Logger:            slog.New(slog.NewTextHandler(tWriter{t}, nil)),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		during()
	}()
	res, err := driver.Run(t.Context(), o)
	<-done
	if err != nil || res.Code != driver.ExitOK {
		t.Fatalf("job: %+v, %v", res, err)
	}
	return res
}

// The claim taken before the job is refreshed with each read of the group, and removed once
// the group is at zero.
func TestClaimRefreshedAndReleased(t *testing.T) {
	g := &claimGroup{fakeGroup: fakeGroup{size: providers.GroupSize{Desired: 1, Min: 1, Max: 4, Instances: 1}}}
	var seen []string // the tag's values while the job ran
	claimedJob(t, g, func() {
		for range 10 {
			time.Sleep(100 * time.Millisecond)
			v, _ := g.ReadTag(context.Background())
			if len(seen) == 0 || seen[len(seen)-1] != v {
				seen = append(seen, v)
			}
		}
	})
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.claims < 2 || g.unclaim != 1 || g.tag != "" {
		t.Errorf("%d claims, %d unclaims, the tag left %q; want refreshes, one release, no tag", g.claims, g.unclaim, g.tag)
	}
	for _, v := range seen {
		if c, err := providers.ParseClaim(v); err != nil || c.Owner != "job-1" || c.Host != "driver-1" {
			t.Errorf("the tag read %q while the job ran; want job-1's claim", v)
		}
	}
	if !slices.Equal(g.calls, []string{"set 2", "set 0"}) {
		t.Errorf("calls %v; want the group sized for 2 hosts, then zero", g.calls)
	}
}

// Another driver that holds the group since (job-1's claim lapsed, or the two raced) is left
// to it: job-1 stops steering, does not set the group to zero at its end, and leaves the tag.
func TestClaimLostStopsSteering(t *testing.T) {
	g := &claimGroup{fakeGroup: fakeGroup{size: providers.GroupSize{Desired: 1, Min: 1, Max: 4, Instances: 1}}}
	theirs := providers.GroupClaim{Owner: "job-2", Host: "driver-2", At: time.Now().Add(time.Hour)}.Value()
	res := claimedJob(t, g, func() {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			g.mu.Lock()
			sized := len(g.calls) > 0
			if sized {
				g.tag = theirs
			}
			g.mu.Unlock()
			if sized {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	g.mu.Lock()
	defer g.mu.Unlock()
	if !slices.Equal(g.calls, []string{"set 2"}) {
		t.Errorf("calls %v; want the group sized for 2 hosts, and no zero at the end (it is job-2's now)", g.calls)
	}
	if g.tag != theirs || g.unclaim != 0 {
		t.Errorf("the tag %q after %d unclaims; want job-2's, untouched", g.tag, g.unclaim)
	}
	if cs := res.Status.Capacity; cs == nil || !strings.Contains(cs.Refused, "job job-2 on host driver-2") {
		t.Errorf("capacity status %+v; want it no longer managed, naming job-2", cs)
	}
}
