package driver

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/rendezvous"
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

// A progress history fed a point a second for 28 hours stays within maxProgressPoints, still
// starts at the job's start and ends near its end, evenly spaced, with the steps and cost
// accumulated and the rate and loss averaged.
func TestProgressHistoryBounded(t *testing.T) {
	var h progressHistory
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const n = 100_000
	for i := range n {
		p := ProgressPoint{T: start.Add(time.Duration(i) * time.Second), Step: uint64(10 * i), StepsPerSecond: 10, Cost: new(0.01 * float64(i))}
		if i >= 1000 { // the program reports a loss from step 10000 on
			p.Loss = new(1.0)
		}
		h.add(p)
		if len(h.pts) > maxProgressPoints || cap(h.pts) > 2*maxProgressPoints {
			t.Fatalf("after %d points the history holds %d (capacity %d), want at most %d", i+1, len(h.pts), cap(h.pts), maxProgressPoints)
		}
	}
	pts := h.points()
	if len(pts) < maxProgressPoints/2 {
		t.Fatalf("%d points left, want at least %d", len(pts), maxProgressPoints/2)
	}
	end := start.Add((n - 1) * time.Second)
	if !pts[0].T.Equal(start) || end.Sub(pts[len(pts)-1].T) > h.every {
		t.Errorf("history from %v to %v, want from the start %v to within %v of the end %v", pts[0].T, pts[len(pts)-1].T, start, h.every, end)
	}
	for i := 1; i < len(pts); i++ {
		a, b := pts[i-1], pts[i]
		if b.T.Sub(a.T) < h.every/2 || b.T.Sub(a.T) > 2*h.every {
			t.Fatalf("points %d and %d are %v apart, want about the spacing %v", i-1, i, b.T.Sub(a.T), h.every)
		}
		if b.Step <= a.Step || *b.Cost < *a.Cost {
			t.Fatalf("point %d (step %d, cost %v) is behind point %d (step %d, cost %v)", i, b.Step, *b.Cost, i-1, a.Step, *a.Cost)
		}
		if b.StepsPerSecond != 10 {
			t.Fatalf("point %d has rate %v, want the constant 10", i, b.StepsPerSecond)
		}
	}
	if last := pts[len(pts)-1]; last.Loss == nil || *last.Loss != 1 || *last.Cost < 0.01*(n-1)-0.01*h.every.Seconds() {
		t.Errorf("last point %+v: want loss 1 and the cost near %v", last, 0.01*(n-1))
	}
	if pts[0].Loss != nil {
		t.Errorf("the first point has a loss %v: none was reported then", *pts[0].Loss)
	}

	// A point not after the last, or closer than the spacing, is not taken.
	before := len(h.pts)
	h.add(ProgressPoint{T: pts[len(pts)-1].T})
	if len(h.pts) != before {
		t.Errorf("a point at the last one's time was added")
	}
}

func TestMergeProgressPoints(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	a := ProgressPoint{T: t0, Step: 10, StepsPerSecond: 4, Loss: new(3.0), Cost: new(1.0)}
	b := ProgressPoint{T: t0.Add(time.Second), Step: 20, StepsPerSecond: 8, Loss: new(1.0), Cost: new(1.5)}
	m := merge(a, b)
	if !m.T.Equal(b.T) || m.Step != 20 || m.StepsPerSecond != 6 || *m.Loss != 2 || *m.Cost != 1.5 {
		t.Errorf("merge = %+v (loss %v, cost %v), want b's time, step and cost, mean rate 6 and loss 2", m, *m.Loss, *m.Cost)
	}
	b.Loss, b.Cost = nil, nil
	if m := merge(a, b); m.Loss == nil || *m.Loss != 3 || m.Cost == nil || *m.Cost != 1 {
		t.Errorf("merge with b lacking loss and cost = %+v: want a's", m)
	}
}

// The board completes the status with the reported loss, total steps and time to go, each
// host's uptime, heartbeat and failures, and the progress history; in JSON, what is unknown
// is null.
func TestStatusProgressAndHostFields(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, MaxNP: 3})
	s.hosts("a", "b", "c")
	s.ready(0, "a", "b", "c")
	s.after(time.Second).exit("b", 1)
	s.ready(1, "a", "c")
	s.after(10 * time.Second)

	now := s.now
	var pr rendezvous.Progress
	b := &StatusBoard{
		progress: func() rendezvous.Progress { return pr },
		heard:    func() map[string]time.Time { return map[string]time.Time{"a": now.Add(-3 * time.Second)} },
	}
	b.store(s.m.Snapshot())

	// Nothing reported yet: no loss, total or time to go.
	st := b.Current(now)
	if st.Progress.Loss != nil || st.Progress.TotalSteps != 0 || st.Progress.ETASeconds != nil {
		t.Errorf("before any report: progress %+v", st.Progress)
	}
	js, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"loss":null`, `"total_steps":0`, `"eta_seconds":null`, `"progress_history":[{"t":`} {
		if !strings.Contains(string(js), want) {
			t.Errorf("JSON lacks %s: %s", want, js)
		}
	}

	pr = rendezvous.Progress{Generation: 2, Step: 400, Committed: 390, At: now.Add(-time.Second), StepsPerSecond: 50, Loss: new(0.5), TotalSteps: 1000}
	st = b.Current(now)
	if p := st.Progress; p.Loss == nil || *p.Loss != 0.5 || p.TotalSteps != 1000 || p.ETASeconds == nil || *p.ETASeconds != 12 {
		t.Errorf("progress %+v, want loss 0.5, 1000 steps in all and 12 s to go (600 steps at 50/s)", p)
	}
	byID := map[string]HostStatus{}
	for _, h := range st.Hosts {
		byID[h.ID] = h
	}
	if a := byID["a"]; a.LastHeartbeat == nil || *a.HeartbeatAgeSeconds != 3 || a.UptimeSeconds < 11 || a.Count != 0 || a.Last != nil {
		t.Errorf("host a: %+v, want a heartbeat 3 s ago, up 11 s or more, no failures", a)
	}
	if b := byID["b"]; b.Count != 1 || b.Last == nil || b.Last.Worker != "b/0" || b.Last.Cause != "exit 1" || b.LastHeartbeat != nil {
		t.Errorf("host b: %+v (last failure %+v), want one failure, exit 1 of b/0, and no heartbeat", b, b.Last)
	}
	if c := byID["c"]; c.Count != 0 || c.LastHeartbeat != nil || c.HeartbeatAgeSeconds != nil {
		t.Errorf("host c: %+v, want no failures and no heartbeat", c)
	}

	// Not stepping (the last report is stale): no rate, so no time to go; past the total: 0.
	pr.At = now.Add(-time.Minute)
	if st := b.Current(now); st.Progress.ETASeconds != nil {
		t.Errorf("stale report: time to go %v, want unknown", *st.Progress.ETASeconds)
	}
	pr.Step, pr.Committed = 1000, 1000
	if st := b.Current(now); st.Progress.ETASeconds == nil || *st.Progress.ETASeconds != 0 {
		t.Errorf("at the total: time to go %v, want 0", st.Progress.ETASeconds)
	}

	// Record adds points; Current ends the history with its own moment.
	pr.At = now
	b.Record(now)
	b.Record(now.Add(time.Second))
	st = b.Current(now.Add(1500 * time.Millisecond))
	if h := st.ProgressHistory; len(h) != 3 || !h[2].T.Equal(now.Add(1500*time.Millisecond)) || h[0].Step != 1000 || h[0].Loss == nil || *h[0].Loss != 0.5 {
		t.Errorf("history %+v: want the two records and the answer's own point", h)
	}
}

// A page of the status lists the hosts asked for and their workers, and keeps the job's
// totals and counts by state; the status API takes the page from its query and refuses a
// bad one, saying which parameter and what it wants.
func TestStatusPage(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 2, MaxNP: 3})
	s.hosts("a", "b", "c", "d", "e")
	st := s.m.Snapshot()
	wantStates := map[string]int{"active": 3, "idle": 2, "leaving": 0, "blacklisted": 0, "quarantined": 0}
	if st.HostsTotal != 5 || st.HostsMatching != 5 || st.WorkersTotal != 3 || !reflect.DeepEqual(st.HostStates, wantStates) ||
		!reflect.DeepEqual(st.WorkerStates, map[string]int{"running": 0, "starting": 3, "stopping": 0}) {
		t.Fatalf("totals: hosts %d (%d matching) %v, workers %d %v", st.HostsTotal, st.HostsMatching, st.HostStates, st.WorkersTotal, st.WorkerStates)
	}
	idsOf := func(p Status) string {
		var hs []string
		for _, h := range p.Hosts {
			hs = append(hs, h.ID)
		}
		return strings.Join(hs, ",") + " | " + strings.Join(workersOf(p), ",")
	}
	for _, tc := range []struct {
		state         string
		offset, limit int
		want          string
		matching      int
	}{
		{"", 0, -1, "a,b,c,d,e | a/0:0:starting,b/0:1:starting,c/0:2:starting", 5},
		{"", 1, 2, "b,c | b/0:1:starting,c/0:2:starting", 5},
		{"idle", 0, -1, "d,e | ", 2},
		{"active", 2, 10, "c | c/0:2:starting", 3},
		{"", 9, 3, " | ", 5},
		{"leaving", 0, 0, " | ", 0},
	} {
		p := st.Page(tc.state, tc.offset, tc.limit)
		if got := idsOf(p); got != tc.want || p.HostsMatching != tc.matching || p.HostsTotal != 5 || p.WorkersTotal != 3 || p.HostStates["idle"] != 2 {
			t.Errorf("Page(%q, %d, %d) = %q, %d matching (totals %d, %d); want %q, %d", tc.state, tc.offset, tc.limit, got, p.HostsMatching, p.HostsTotal, p.WorkersTotal, tc.want, tc.matching)
		}
	}
	if got := idsOf(st); got != "a,b,c,d,e | a/0:0:starting,b/0:1:starting,c/0:2:starting" {
		t.Errorf("Page changed the status it was taken from: %q", got)
	}

	board := &StatusBoard{}
	board.store(st)
	srv := httptest.NewServer(statusHandler(board))
	defer srv.Close()
	get := func(query string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + "/v1/status" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("?state=idle&limit=1&offset=1")
	var got Status
	if err := json.Unmarshal([]byte(body), &got); code != http.StatusOK || err != nil {
		t.Fatalf("GET ?state=idle&limit=1&offset=1: %d %s (%v)", code, body, err)
	}
	if ids := idsOf(got); ids != "e | " || got.HostsMatching != 2 || got.HostsTotal != 5 || got.HostStates["active"] != 3 {
		t.Errorf("GET ?state=idle&limit=1&offset=1: %q, %d matching, %d in all, %v", ids, got.HostsMatching, got.HostsTotal, got.HostStates)
	}
	if code, body = get(""); code != http.StatusOK || !strings.Contains(body, `"id":"e"`) || !strings.Contains(body, `"hosts_total":5`) {
		t.Errorf("GET without a page: %d %s, want every host", code, body)
	}
	for query, want := range map[string]string{
		"?state=gone":   `state="gone": want a host state, one of active, leaving, blacklisted, quarantined, idle`,
		"?limit=-1":     `limit="-1": want a number of hosts, 0 or more`,
		"?offset=first": `offset="first": want a number of hosts, 0 or more`,
	} {
		if code, body := get(query); code != http.StatusBadRequest || strings.TrimSpace(body) != want {
			t.Errorf("GET %s: %d %q, want 400 %q", query, code, body, want)
		}
	}
}
