package metadata_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/worker/agent/metadata"
)

const awsInstance = "i-0abc1234def567890"

// fakeIMDS is EC2's IMDSv2: a PUT for a token, then GETs that carry it. An empty document
// answers 404, as the real service does when there is nothing to announce.
type fakeIMDS struct {
	mu         sync.Mutex
	tokens     int             // PUTs answered
	valid      map[string]bool // tokens the service accepts
	ttlAsked   string
	idAsks     int
	instanceID string
	spot       string // spot/instance-action
	rebalance  string // events/recommendations/rebalance
	lifecycle  string // autoscaling/target-lifecycle-state
	status     map[string]int
	slow       bool
}

func newFakeIMDS() *fakeIMDS {
	return &fakeIMDS{valid: map[string]bool{}, instanceID: awsInstance, status: map[string]int{}}
}

func (f *fakeIMDS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	if f.slow {
		f.mu.Unlock()
		hang(w, r)
		return
	}
	defer f.mu.Unlock()
	if r.URL.Path == "/latest/api/token" {
		if r.Method != http.MethodPut {
			http.Error(w, "", http.StatusMethodNotAllowed)
			return
		}
		f.ttlAsked = r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds")
		if f.ttlAsked == "" {
			http.Error(w, "", http.StatusBadRequest)
			return
		}
		f.tokens++
		tok := fmt.Sprintf("AQAEAtoken%d==", f.tokens)
		f.valid[tok] = true
		w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", f.ttlAsked)
		fmt.Fprint(w, tok)
		return
	}
	if r.Method != http.MethodGet {
		http.Error(w, "", http.StatusMethodNotAllowed)
		return
	}
	if !f.valid[r.Header.Get("X-aws-ec2-metadata-token")] {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if code := f.status[r.URL.Path]; code != 0 {
		w.WriteHeader(code)
		fmt.Fprint(w, "<html><body>Internal Error</body></html>")
		return
	}
	var doc string
	switch r.URL.Path {
	case "/latest/meta-data/instance-id":
		f.idAsks++
		doc = f.instanceID
	case "/latest/meta-data/spot/instance-action":
		doc = f.spot
	case "/latest/meta-data/events/recommendations/rebalance":
		doc = f.rebalance
	case "/latest/meta-data/autoscaling/target-lifecycle-state":
		doc = f.lifecycle
	}
	if doc == "" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprint(w, doc)
}

func (f *fakeIMDS) set(fn func(f *fakeIMDS)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeIMDS) tokenCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tokens
}

func newAWS(t *testing.T, f *fakeIMDS, cfg metadata.Config) *metadata.AWS {
	t.Helper()
	cfg.BaseURL = serve(t, f).URL
	cfg.Logger = testLogger(t)
	w, err := metadata.NewAWS(cfg)
	if err != nil {
		t.Fatalf("NewAWS: %v", err)
	}
	return w
}

func TestAWSSpotInterruption(t *testing.T) {
	f := newFakeIMDS()
	f.spot = `{"action": "terminate", "time": "2026-11-22T01:02:03Z"}`
	w := newAWS(t, f, metadata.Config{})
	got, err := w.Notices(t.Context())
	if err != nil {
		t.Fatalf("Notices: %v", err)
	}
	if len(got) != 1 {
		t.Fatalf("notices %+v: want one interruption", got)
	}
	n := got[0]
	want := time.Date(2026, 11, 22, 1, 2, 3, 0, time.UTC)
	if n.Kind != providers.Interruption || n.HostID != awsInstance || !n.Deadline.Equal(want) || n.ID == "" {
		t.Errorf("notice %+v: want an interruption of %s at %v with an ID", n, awsInstance, want)
	}
	again, err := w.Notices(t.Context())
	if err != nil || len(again) != 1 || again[0].ID != n.ID {
		t.Errorf("second poll %+v, %v: want the same notice ID %q", again, err, n.ID)
	}
	f.set(func(f *fakeIMDS) { f.spot = `{"action": "stop", "time": "2026-11-22T05:00:00Z"}` })
	other, err := w.Notices(t.Context())
	if err != nil || len(other) != 1 || other[0].ID == n.ID {
		t.Errorf("poll after a new action %+v, %v: want a notice with a new ID", other, err)
	}
	f.set(func(f *fakeIMDS) {
		if f.idAsks != 1 || f.tokens != 1 {
			t.Errorf("instance ID asked %d times, %d tokens: want 1 and 1 (both cached)", f.idAsks, f.tokens)
		}
		if f.ttlAsked != "3600" {
			t.Errorf("token TTL asked %q: want 3600", f.ttlAsked)
		}
	})
}

func TestAWSRebalanceAndScaleIn(t *testing.T) {
	f := newFakeIMDS()
	f.rebalance = `{"noticeTime": "2026-11-22T00:59:00Z"}`
	f.lifecycle = "Terminated"
	got, err := newAWS(t, f, metadata.Config{}).Notices(t.Context())
	if err != nil {
		t.Fatalf("Notices: %v", err)
	}
	if k := kinds(got); !slices.Equal(k, []providers.NoticeKind{providers.Rebalance, providers.ScaleIn}) {
		t.Fatalf("kinds %v: want rebalance, scale-in", k)
	}
	for _, n := range got {
		if n.HostID != awsInstance || n.ID == "" || !n.Deadline.IsZero() {
			t.Errorf("notice %+v: want host %s, an ID, no deadline", n, awsInstance)
		}
	}
	if got[0].ID == got[1].ID {
		t.Errorf("two notices share the ID %q", got[0].ID)
	}
}

func TestAWSNone(t *testing.T) {
	for _, lifecycle := range []string{"", "InService", "Pending:Wait"} {
		t.Run("lifecycle="+lifecycle, func(t *testing.T) {
			f := newFakeIMDS()
			f.lifecycle = lifecycle
			got, err := newAWS(t, f, metadata.Config{}).Notices(t.Context())
			if err != nil || len(got) != 0 {
				t.Errorf("Notices = %+v, %v: want none", got, err)
			}
		})
	}
}

func TestAWSTokenRefreshedBeforeExpiry(t *testing.T) {
	f := newFakeIMDS()
	clk := newClock()
	w := newAWS(t, f, metadata.Config{TokenTTL: time.Minute, Now: clk.Now})
	poll := func() {
		t.Helper()
		if _, err := w.Notices(t.Context()); err != nil {
			t.Fatalf("Notices: %v", err)
		}
	}
	poll()
	clk.Advance(40 * time.Second)
	poll()
	f.set(func(f *fakeIMDS) {
		if f.tokens != 1 || f.ttlAsked != "60" {
			t.Errorf("%d tokens with TTL %q after 40s of a 60s token: want 1 with TTL 60", f.tokens, f.ttlAsked)
		}
	})
	// 50 s in, the token has less than the 15 s margin left.
	clk.Advance(10 * time.Second)
	poll()
	if n := f.tokenCount(); n != 2 {
		t.Fatalf("%d tokens after 50s of a 60s token: want 2", n)
	}
}

func TestAWSTokenRefreshedOn401(t *testing.T) {
	f := newFakeIMDS()
	f.spot = `{"action":"hibernate","time":"2026-11-22T01:02:03Z"}`
	w := newAWS(t, f, metadata.Config{})
	if _, err := w.Notices(t.Context()); err != nil {
		t.Fatalf("Notices: %v", err)
	}
	// The service forgets every token (it restarted, or the instance was stopped and started).
	f.set(func(f *fakeIMDS) { clear(f.valid) })
	got, err := w.Notices(t.Context())
	if err != nil || len(got) != 1 {
		t.Fatalf("Notices after the tokens were revoked = %+v, %v: want the interruption", got, err)
	}
	if n := f.tokenCount(); n != 2 {
		t.Errorf("%d tokens: want 2 (one new token after the 401, not one per request)", n)
	}
}

func TestAWSGarbage(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(f *fakeIMDS)
		parts []string
		// partial: the other endpoints' notices still come back.
		partial int
	}{
		{"spot html", func(f *fakeIMDS) { f.spot = "<html>oops</html>"; f.rebalance = `{"noticeTime":"2026-11-22T00:59:00Z"}` },
			[]string{"spot/instance-action", "<html>oops</html>"}, 1},
		{"spot bad time", func(f *fakeIMDS) { f.spot = `{"action":"terminate","time":"soon"}` },
			[]string{"spot/instance-action", "RFC 3339", "soon"}, 0},
		{"rebalance 500", func(f *fakeIMDS) { f.status["/latest/meta-data/events/recommendations/rebalance"] = 500 },
			[]string{"recommendations/rebalance", "HTTP 500", "Internal Error"}, 0},
		{"lifecycle json", func(f *fakeIMDS) { f.lifecycle = `{"state":"Terminated"}` },
			[]string{"target-lifecycle-state", "lifecycle state"}, 0},
		{"instance id", func(f *fakeIMDS) { f.instanceID = "<!DOCTYPE html>" + string(make([]byte, 500)) },
			[]string{"instance-id", "instance ID", "(515 bytes)"}, 0},
		{"instance id 403", func(f *fakeIMDS) { f.status["/latest/meta-data/instance-id"] = http.StatusForbidden },
			[]string{"instance-id", "HTTP 403"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeIMDS()
			tc.edit(f)
			got, err := newAWS(t, f, metadata.Config{}).Notices(t.Context())
			wantErrContains(t, err, tc.parts...)
			if len(got) != tc.partial {
				t.Errorf("%d notices alongside the error: want %d", len(got), tc.partial)
			}
		})
	}
}

func TestAWSSlow(t *testing.T) {
	f := newFakeIMDS()
	f.slow = true
	w := newAWS(t, f, metadata.Config{})
	checkSlow(t, func(ctx context.Context) error { _, err := w.Notices(ctx); return err })
}
