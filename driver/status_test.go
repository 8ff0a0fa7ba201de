package driver

import (
	"fmt"
	"reflect"
	"testing"
	"time"
)

// workersOf renders a snapshot's workers as "id:rank:state", in the snapshot's order.
func workersOf(s Status) []string {
	var out []string
	for _, w := range s.Workers {
		out = append(out, fmt.Sprintf("%s:%d:%s", w.ID, w.Rank, w.State))
	}
	return out
}

func TestSnapshotFollowsTheJob(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, MaxNP: 3})
	if st := s.m.Snapshot(); st.Phase != "starting" || st.Generation != 0 || len(st.Hosts) != 0 || len(st.Workers) != 0 {
		t.Fatalf("before any host: %+v", st)
	}
	s.hosts("a", "b", "c")
	st := s.m.Snapshot()
	if st.Generation != 1 || st.WorldSize != 3 || st.Phase != "running" || st.MinNP != 2 || st.MaxNP != 3 || len(st.Hosts) != 3 {
		t.Fatalf("generation 1: %+v", st)
	}
	if got, want := workersOf(st), []string{"a/0:0:starting", "b/0:1:starting", "c/0:2:starting"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("launched workers %v, want %v", got, want)
	}
	s.ready(0, "a", "b", "c")
	if got, want := workersOf(s.m.Snapshot()), []string{"a/0:0:running", "b/0:1:running", "c/0:2:running"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("registered workers %v, want %v", got, want)
	}

	// b fails: its slot is blacklisted, the others reset to generation 2.
	s.after(time.Second).exit("b", 1)
	st = s.m.Snapshot()
	if st.Phase != "resetting" || st.Hosts[1].ID != "b" || st.Hosts[1].Blacklisted != 1 || st.Hosts[0].Blacklisted != 0 {
		t.Fatalf("after b failed: %+v", st)
	}
	s.ready(1, "a", "c")
	st = s.m.Snapshot()
	if st.Generation != 2 || st.WorldSize != 2 || st.Resets != 1 {
		t.Fatalf("generation 2: %+v", st)
	}

	// c leaves discovery and d comes: once the survivors reset, c's worker is stopping,
	// outside the ranks, and d's is starting.
	s.hosts("a", "b", "d")
	s.ready(2, "a", "c")
	if got, want := workersOf(s.m.Snapshot()), []string{"a/0:0:running", "d/0:1:starting", "c/0:-1:stopping"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after c left: %v, want %v", got, want)
	}

	// Taking a snapshot changes nothing the machine decides on.
	before := s.m.NextDeadline(s.now)
	a, b := s.m.Snapshot(), s.m.Snapshot()
	if !reflect.DeepEqual(a, b) || !s.m.NextDeadline(s.now).Equal(before) {
		t.Fatal("Snapshot changed the machine")
	}
}

func TestStatusBoard(t *testing.T) {
	var b StatusBoard
	if b.Load() != nil {
		t.Fatal("an empty board has a status")
	}
	b.store(Status{Generation: 3})
	b.store(Status{Generation: 4})
	if b.Load().Generation != 4 {
		t.Fatalf("the board holds generation %d, want the latest, 4", b.Load().Generation)
	}
}
