package metadata_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/worker/agent/metadata"
)

const gcpInstance = "4567890123456789012"

// fakeGCE is Compute Engine's metadata server: Metadata-Flavor: Google both ways, an ETag
// on every value, and wait_for_change=true&last_etag=…&timeout_sec=… held until the value
// changes, the timeout passes or the client leaves.
type fakeGCE struct {
	mu          sync.Mutex
	changed     chan struct{} // closed and replaced on every set
	preempted   string
	maintenance string
	noFlavor    bool // answers without the Metadata-Flavor header (not the real server)
	status      int  // non-zero: every value answers this
	waits       []string
	slow        bool
}

func newFakeGCE() *fakeGCE {
	return &fakeGCE{changed: make(chan struct{}), preempted: "FALSE", maintenance: "NONE"}
}

func etag(v string) string {
	s := sha256.Sum256([]byte(v))
	return hex.EncodeToString(s[:8])
}

func (f *fakeGCE) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Metadata-Flavor") != "Google" {
		http.Error(w, "Missing Metadata-Flavor:Google header.", http.StatusForbidden)
		return
	}
	f.mu.Lock()
	if f.slow {
		f.mu.Unlock()
		hang(w, r)
		return
	}
	value := func() string {
		switch r.URL.Path {
		case "/computeMetadata/v1/instance/id":
			return gcpInstance
		case "/computeMetadata/v1/instance/preempted":
			return f.preempted
		case "/computeMetadata/v1/instance/maintenance-event":
			return f.maintenance
		}
		return ""
	}
	v, changed := value(), f.changed
	q := r.URL.Query()
	if q.Get("wait_for_change") == "true" {
		f.waits = append(f.waits, q.Get("timeout_sec"))
		if q.Get("last_etag") == etag(v) {
			secs, _ := strconv.Atoi(q.Get("timeout_sec"))
			f.mu.Unlock()
			select {
			case <-changed:
			case <-time.After(time.Duration(secs) * time.Second):
			case <-r.Context().Done():
				return
			}
			f.mu.Lock()
			v = value()
		}
	}
	status, noFlavor := f.status, f.noFlavor
	f.mu.Unlock()
	if v == "" {
		http.NotFound(w, r)
		return
	}
	if !noFlavor {
		w.Header().Set("Metadata-Flavor", "Google")
	}
	if status != 0 {
		w.WriteHeader(status)
		fmt.Fprint(w, "upstream connect error or disconnect/reset before headers")
		return
	}
	w.Header().Set("ETag", etag(v))
	w.Header().Set("Content-Type", "application/text")
	fmt.Fprint(w, v)
}

func (f *fakeGCE) set(fn func(f *fakeGCE)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeGCE) waitsSeen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.waits...)
}

func newGCP(t *testing.T, f *fakeGCE, cfg metadata.Config) *metadata.GCP {
	t.Helper()
	cfg.BaseURL = serve(t, f).URL
	cfg.Logger = testLogger(t)
	w, err := metadata.NewGCP(cfg)
	if err != nil {
		t.Fatalf("NewGCP: %v", err)
	}
	return w
}

func TestGCPNotices(t *testing.T) {
	clk := newClock()
	for _, tc := range []struct {
		name                   string
		preempted, maintenance string
		want                   []providers.NoticeKind
	}{
		{"none", "FALSE", "NONE", nil},
		{"live migration", "FALSE", "MIGRATE_ON_HOST_MAINTENANCE", nil},
		{"preempted", "TRUE", "NONE", []providers.NoticeKind{providers.Interruption}},
		{"maintenance", "FALSE", "TERMINATE_ON_HOST_MAINTENANCE", []providers.NoticeKind{providers.Maintenance}},
		{"both", "TRUE", "TERMINATE_ON_HOST_MAINTENANCE", []providers.NoticeKind{providers.Maintenance, providers.Interruption}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeGCE()
			f.preempted, f.maintenance = tc.preempted, tc.maintenance
			w := newGCP(t, f, metadata.Config{Now: clk.Now})
			got, err := w.Notices(t.Context())
			if err != nil {
				t.Fatalf("Notices: %v", err)
			}
			if k := kinds(got); fmt.Sprint(k) != fmt.Sprint(tc.want) {
				t.Fatalf("kinds %v: want %v", k, tc.want)
			}
			for _, n := range got {
				if n.HostID != gcpInstance || n.ID == "" {
					t.Errorf("notice %+v: want host %s and an ID", n, gcpInstance)
				}
				if n.Kind == providers.Interruption && !n.Deadline.Equal(clk.Now().Add(30*time.Second)) {
					t.Errorf("preemption deadline %v: want now+30s", n.Deadline)
				}
			}
			if len(f.waitsSeen()) != 0 {
				t.Errorf("the first poll waited for a change (%v): it has no ETag to wait on", f.waitsSeen())
			}
		})
	}
}

func TestGCPWaitsForChange(t *testing.T) {
	f := newFakeGCE()
	w := newGCP(t, f, metadata.Config{})
	if got, err := w.Notices(t.Context()); err != nil || len(got) != 0 {
		t.Fatalf("first poll = %+v, %v: want none", got, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	go func() {
		time.Sleep(200 * time.Millisecond)
		f.set(func(f *fakeGCE) { f.preempted = "TRUE" })
	}()
	start := time.Now()
	got, err := w.Notices(ctx)
	took := time.Since(start)
	if err != nil || len(got) != 1 || got[0].Kind != providers.Interruption {
		t.Fatalf("waiting poll = %+v, %v: want the preemption", got, err)
	}
	if took < 150*time.Millisecond || took > 2*time.Second {
		t.Errorf("waiting poll returned after %v: want soon after the change at 200ms", took)
	}
	waits := f.waitsSeen()
	if len(waits) != 1 {
		t.Fatalf("waits %v: want one", waits)
	}
	// 5 s of context less a second of slack, in whole seconds.
	if n, err := strconv.Atoi(waits[0]); err != nil || n < 3 || n > 4 {
		t.Errorf("timeout_sec=%s under a 5s context: want 3 or 4", waits[0])
	}
	// A notice is pending: the next poll does not wait.
	if got, err := w.Notices(t.Context()); err != nil || len(got) != 1 || len(f.waitsSeen()) != 1 {
		t.Errorf("poll with a preemption pending = %+v, %v, waits %v: want it at once", got, err, f.waitsSeen())
	}
}

func TestGCPWaitTimesOut(t *testing.T) {
	f := newFakeGCE()
	w := newGCP(t, f, metadata.Config{MaxWait: time.Second})
	for i := range 2 {
		got, err := w.Notices(t.Context())
		if err != nil || len(got) != 0 {
			t.Fatalf("poll %d = %+v, %v: want none", i, got, err)
		}
	}
	if waits := f.waitsSeen(); len(waits) != 1 || waits[0] != "1" {
		t.Errorf("waits %v: want one of timeout_sec=1 (MaxWait)", waits)
	}
}

func TestGCPWaitEndsWithContext(t *testing.T) {
	f := newFakeGCE()
	w := newGCP(t, f, metadata.Config{MaxWait: 30 * time.Second})
	if _, err := w.Notices(t.Context()); err != nil {
		t.Fatalf("first poll: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	_, err := w.Notices(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v: want one wrapping context.Canceled", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("poll took %v after its context was cancelled at 200ms", took)
	}
	// A deadline too close to wait a whole second before it asks without waiting.
	ctx, cancel2 := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel2()
	if _, err := w.Notices(ctx); err != nil {
		t.Errorf("poll under a 1.5s deadline: %v", err)
	}
	if waits := f.waitsSeen(); len(waits) != 1 {
		t.Errorf("waits %v: want only the cancelled one", waits)
	}
}

func TestGCPGarbage(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(f *fakeGCE)
		parts []string
	}{
		{"preempted", func(f *fakeGCE) { f.preempted = "MAYBE" }, []string{"instance/preempted", "TRUE or FALSE", `"MAYBE"`}},
		{"maintenance", func(f *fakeGCE) { f.maintenance = "<html>login</html>" }, []string{"maintenance-event", "<html>login</html>"}},
		{"maintenance but preempted", func(f *fakeGCE) { f.maintenance = "SOON"; f.preempted = "TRUE" }, []string{"maintenance-event", `"SOON"`}},
		{"503", func(f *fakeGCE) { f.status = http.StatusServiceUnavailable }, []string{"instance/id", "HTTP 503", "upstream connect error"}},
		{"not google", func(f *fakeGCE) { f.noFlavor = true }, []string{"instance/id", "Metadata-Flavor"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeGCE()
			tc.edit(f)
			got, err := newGCP(t, f, metadata.Config{}).Notices(t.Context())
			wantErrContains(t, err, tc.parts...)
			// A preemption is not hidden by the other endpoint's error.
			want := 0
			if f.preempted == "TRUE" {
				want = 1
			}
			if len(got) != want {
				t.Errorf("notices %+v alongside the error: want %d", got, want)
			}
		})
	}
}

func TestGCPSlow(t *testing.T) {
	f := newFakeGCE()
	f.slow = true
	w := newGCP(t, f, metadata.Config{})
	checkSlow(t, func(ctx context.Context) error { _, err := w.Notices(ctx); return err })
}
