package providers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
)

// memTag is a TagStore in memory that counts its writes and can let another driver write
// between this one's write and its read back.
type memTag struct {
	v      string
	writes int
	after  func(m *memTag) // run after each write
}

func (m *memTag) ReadTag(context.Context) (string, error) { return m.v, nil }
func (m *memTag) WriteTag(_ context.Context, v string) error {
	m.v = v
	m.writes++
	if m.after != nil {
		m.after(m)
	}
	return nil
}
func (m *memTag) DeleteTag(context.Context) error { m.v = ""; return nil }

func TestClaimValue(t *testing.T) {
	at := time.Date(2026, 9, 1, 12, 0, 0, 0, time.FixedZone("CEST", 2*3600))
	c := providers.GroupClaim{Owner: "0a1b2c3d", Host: "gpu-driver.internal", At: at}
	if got, want := c.Value(), "job=0a1b2c3d;host=gpu-driver.internal;at=2026-09-01T10:00:00Z"; got != want {
		t.Errorf("Value %q; want %q", got, want)
	}
	back, err := providers.ParseClaim(c.Value())
	if err != nil || back.Owner != c.Owner || back.Host != c.Host || !back.At.Equal(at) {
		t.Errorf("ParseClaim(Value) = %+v, %v; want %+v", back, err, c)
	}
	odd := providers.GroupClaim{Owner: "a;b=c", Host: strings.Repeat("h", 400) + "é", At: at}
	if v := odd.Value(); len(v) > 256 || strings.Count(v, ";") != 2 || strings.Count(v, "=") != 3 {
		t.Errorf("Value of odd names %q: want at most 256 characters and no extra separators", v)
	}
	for _, bad := range []string{"", "gpu-pool", "job=x;at=yesterday", "host=h;at=2026-09-01T10:00:00Z", "job=x;job=y;at=2026-09-01T10:00:00Z"} {
		if _, err := providers.ParseClaim(bad); err == nil {
			t.Errorf("ParseClaim(%q): no error", bad)
		}
	}
}

func TestClaimTag(t *testing.T) {
	now := time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)
	a := providers.GroupClaim{Owner: "a", Host: "ha", At: now}
	b := providers.GroupClaim{Owner: "b", Host: "hb", At: now.Add(time.Second)}
	ctx := t.Context()

	// A value that is not a claim (someone's own use of the key) is taken over.
	m := &memTag{v: "reserved for the night shift"}
	if held, err := providers.ClaimTag(ctx, m, a); held != nil || err != nil || m.v != a.Value() {
		t.Errorf("Claim over a value that is not a claim: %v, %v, tag %q", held, err, m.v)
	}
	// A claim that lapses exactly now no longer holds; one a second younger does.
	m = &memTag{v: providers.GroupClaim{Owner: "a", Host: "ha", At: now.Add(-providers.ClaimLapse)}.Value()}
	if held, _ := providers.ClaimTag(ctx, m, providers.GroupClaim{Owner: "b", At: now}); held != nil {
		t.Errorf("a claim at its lapse held: %v", held)
	}
	m = &memTag{v: providers.GroupClaim{Owner: "a", Host: "ha", At: now.Add(-providers.ClaimLapse + time.Second)}.Value()}
	if held, _ := providers.ClaimTag(ctx, m, providers.GroupClaim{Owner: "b", At: now}); held == nil || m.writes != 0 {
		t.Errorf("a claim a second before its lapse: held %v after %d writes; want it held, nothing written", held, m.writes)
	}
	// The race narrowed: b's write lands between a's write and a's read back.
	m = &memTag{after: func(m *memTag) {
		if m.writes == 1 {
			m.v = b.Value()
		}
	}}
	if held, err := providers.ClaimTag(ctx, m, a); err != nil || held == nil || held.Owner != "b" {
		t.Errorf("a claim overwritten before its read back: held %v, %v; want b's", held, err)
	}
	// Something that is no claim overwrites it: an error, not a claim.
	m = &memTag{after: func(m *memTag) { m.v = "gpu-pool" }}
	if held, err := providers.ClaimTag(ctx, m, a); err == nil || held != nil {
		t.Errorf("a claim overwritten by a non-claim: held %v, %v; want an error", held, err)
	}
	// Unclaim leaves another's claim and a value that is no claim.
	for _, v := range []string{b.Value(), "gpu-pool"} {
		m = &memTag{v: v}
		if err := providers.UnclaimTag(ctx, m, "a"); err != nil || m.v != v {
			t.Errorf("Unclaim by a of %q: %v, tag now %q", v, err, m.v)
		}
	}
}
