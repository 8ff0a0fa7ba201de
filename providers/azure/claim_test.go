package azure_test

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
)

// TestClaimRequests: the claim is the scale set's elasticd-driver tag, a PATCH of "tags" that
// keeps the set's other tags (a PATCH replaces them all), read back, and removed by its owner
// alone with a PATCH of the others.
func TestClaimRequests(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"))
	f.setTag("team", "ml-infra")
	p := f.provider(t)
	at := time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)
	c := providers.GroupClaim{Owner: "0a1b2c3d", Host: "driver-1", At: at}
	if held, err := p.Claim(capCtx(t), c); err != nil || held != nil {
		t.Fatalf("Claim of a free set: held %v, %v; want it claimed", held, err)
	}
	const value = "job=0a1b2c3d;host=driver-1;at=2026-09-01T12:00:00Z"
	want := []string{`{"tags":{"elasticd":"gpu-pool","elasticd-driver":"` + value + `","team":"ml-infra"}}`}
	if got := f.requestBodies(epUpdate); !slices.Equal(got, want) {
		t.Fatalf("PATCH bodies %q; want %q", got, want)
	}
	if n := f.count(epSet); n != 3 {
		t.Errorf("%d GETs of the set; want 3 (the read, the SDK's at the end of the PATCH's operation, the read back)", n)
	}
	if u := f.last(epUpdate); u == nil || u.Query().Get("api-version") == "" {
		t.Errorf("the PATCH's URL %v has no api-version", u)
	}

	other := providers.GroupClaim{Owner: "ffee0011", Host: "driver-2", At: at.Add(time.Minute)}
	if held, err := p.Claim(capCtx(t), other); err != nil || held == nil || *held != c {
		t.Fatalf("another owner's Claim: held %v, %v; want %+v", held, err, c)
	}
	if err := p.Unclaim(capCtx(t), other.Owner); err != nil || len(f.requestBodies(epUpdate)) != 1 {
		t.Fatalf("Unclaim by another owner: %v, PATCHes %q; want nil and no PATCH", err, f.requestBodies(epUpdate))
	}
	if err := p.Unclaim(capCtx(t), c.Owner); err != nil {
		t.Fatalf("Unclaim: %v", err)
	}
	want = append(want, `{"tags":{"elasticd":"gpu-pool","team":"ml-infra"}}`)
	if got := f.requestBodies(epUpdate); !slices.Equal(got, want) {
		t.Errorf("PATCH bodies %q; want %q", got, want)
	}
	if got := f.tagsNow(); !maps.Equal(got, map[string]string{"elasticd": "gpu-pool", "team": "ml-infra"}) {
		t.Errorf("the set's tags after Unclaim: %v", got)
	}
}

// TestClaimLostRace: another driver's PATCH lands between this one's and its read back.
func TestClaimLostRace(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"))
	p := f.provider(t)
	f.mu.Lock()
	f.afterPatch = func() { f.setTag("elasticd-driver", "job=ffee0011;host=driver-2;at=2026-09-01T12:00:01Z") }
	f.mu.Unlock()
	held, err := p.Claim(capCtx(t), providers.GroupClaim{Owner: "0a1b2c3d", Host: "driver-1", At: time.Now()})
	if err != nil || held == nil || held.Owner != "ffee0011" || held.Host != "driver-2" {
		t.Fatalf("Claim that lost the race: held %v, %v; want the other driver's claim", held, err)
	}
}

// TestClaimErrors: a PATCH the identity may not make is refused, naming the action.
func TestClaimErrors(t *testing.T) {
	f := newFake(t, vm("0", "10.0.0.4"))
	f.denyWrites()
	p := f.provider(t)
	_, err := p.Claim(capCtx(t), providers.GroupClaim{Owner: "0a1b2c3d", Host: "driver-1", At: time.Now()})
	if !errors.Is(err, providers.ErrRefused) || !strings.Contains(err.Error(), "update scale set tags refused (needs Microsoft.Compute/virtualMachineScaleSets/write") ||
		!strings.Contains(err.Error(), "AuthorizationFailed") {
		t.Fatalf("Claim without the set's write: %v; want refused, naming the action", err)
	}
	t.Logf("the refusal reads: %v", err)
	if n := f.count(epUpdate); n != 1 {
		t.Errorf("%d PATCHes; want 1 (a refusal is not retried)", n)
	}

	g := newFake(t, vm("0", "10.0.0.4"))
	g.queue(epUpdate, reply{status: 400, raw: []byte(`{"error":{"code":"InvalidTag","message":"The tag names or values are invalid."}}`)})
	_, err = g.provider(t).Claim(capCtx(t), providers.GroupClaim{Owner: "0a1b2c3d", Host: "driver-1", At: time.Now()})
	if !errors.Is(err, providers.ErrRefused) || !strings.Contains(err.Error(), "InvalidTag") {
		t.Errorf("Claim of a tag ARM refuses: %v; want refused", err)
	}
}
