package providers_test

import (
	"context"
	"slices"
	"testing"

	"github.com/elasticd/elasticd/providers"
)

// noticing is a fixed group that announces one notice and records completions.
type noticing struct {
	providers.Provider
	notices   []providers.Notice
	completed []string
}

func (n *noticing) Notices(context.Context) ([]providers.Notice, error) { return n.notices, nil }
func (n *noticing) CompleteNotice(_ context.Context, x providers.Notice) error {
	n.completed = append(n.completed, x.ID)
	return nil
}

// The two groups are one provider: the fallback group's hosts marked, notices from both, each
// completed by the group that listed its host.
func TestWithFallback(t *testing.T) {
	spot := &noticing{Provider: providers.NewFixed([]providers.Host{{ID: "s0", Addr: "10.0.0.1", Slots: 2, Spot: true}}),
		notices: []providers.Notice{{ID: "n-spot", HostID: "s0", Kind: providers.Interruption}}}
	od := &noticing{Provider: providers.NewFixed([]providers.Host{{ID: "f0", Addr: "10.0.0.2", Slots: 2}}),
		notices: []providers.Notice{{ID: "n-od", HostID: "f0", Kind: providers.ScaleIn}}}
	w := &providers.WithFallback{Spot: spot, Fallback: od}
	hs, err := w.Hosts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 2 || hs[0].ID != "s0" || hs[0].Fallback || hs[1].ID != "f0" || !hs[1].Fallback {
		t.Fatalf("hosts %+v: want s0, then f0 marked Fallback", hs)
	}
	ns, err := w.Notices(t.Context())
	if err != nil || len(ns) != 2 {
		t.Fatalf("notices %+v, %v", ns, err)
	}
	for _, n := range ns {
		if err := w.CompleteNotice(t.Context(), n); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(spot.completed, []string{"n-spot"}) || !slices.Equal(od.completed, []string{"n-od"}) {
		t.Fatalf("completed: spot %v, fallback %v", spot.completed, od.completed)
	}
}
