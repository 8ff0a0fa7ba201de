package allreduce

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// buildIDs builds generation gen of four members "m0".."m3" in rank order, each carrying
// over from prev[rank] when prev is set.
func buildIDs(t *testing.T, store Store, gen uint64, prev []*Comm) []*Comm {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	const n = 4
	comms := make([]*Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			cfg := Config{Rank: r, Size: n, Generation: gen, Store: store, Timeout: 10 * time.Second, ID: fmt.Sprintf("m%d", r)}
			if prev != nil {
				cfg.Previous = prev[r]
			}
			comms[r], errs[r] = New(ctx, cfg)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("generation %d, rank %d: %v", gen, r, err)
		}
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}

// A connection whose write stopped mid-frame on one side is never carried over: that side
// does not offer it, so both sides connect afresh, while the other pairs reuse theirs.
func TestHandOverSkipsBrokenConnection(t *testing.T) {
	store := NewMemStore()
	g1 := buildIDs(t, store, 1, nil)
	g1[0].peers[1].broken = true // as a write cut off mid-frame leaves it
	g2 := buildIDs(t, store, 2, g1)
	for _, c := range g1 {
		c.Close()
	}
	want := []Stats{{Reused: 2, Fresh: 1}, {Reused: 2, Fresh: 1}, {Reused: 3}, {Reused: 3}}
	for r, c := range g2 {
		want[r].SharedMemory = 3 * shmOn
		want[r].Hosts, want[r].HostRanks = 1, 4
		SetMachineRules(&want[r], 4)
		if got := c.Stats(); got != want[r] {
			t.Errorf("rank %d: %+v, want %+v", r, got, want[r])
		}
	}
	if p := g2[0].peers[1]; p.reused || p.conn == g1[0].peers[1].conn {
		t.Fatal("the broken connection went to the new generation")
	}
	var wg sync.WaitGroup
	errs := make([]error, len(g2))
	for r, c := range g2 {
		wg.Go(func() { errs[r] = c.Barrier(t.Context()) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: Barrier: %v", r, err)
		}
	}
}

func TestRecordCompatible(t *testing.T) {
	for _, rec := range []record{
		{Addr: "10.0.0.1:4000"},
		{Addr: "10.0.0.1:4000", ID: "host/0"},
		{Addr: "[::1]:4000", ID: "host/1", Prev: 7, Keep: []string{"host/0", "host/2"}},
	} {
		v := rec.encode()
		if rec.ID == "" && string(v) != rec.Addr {
			t.Errorf("%+v: published %q, want the bare address as before", rec, v)
		}
		got, err := parseRecord(v)
		if err != nil || got.Addr != rec.Addr || got.ID != rec.ID || got.Prev != rec.Prev || !slices.Equal(got.Keep, rec.Keep) {
			t.Errorf("%+v: round trip gave %+v, %v", rec, got, err)
		}
	}
	if _, err := parseRecord([]byte(`{"id":"x"}`)); err == nil {
		t.Error("a record without an address parsed")
	}
}
