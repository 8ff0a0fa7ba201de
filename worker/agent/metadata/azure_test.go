package metadata_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/worker/agent/metadata"
)

const azureVM = "gpu-spot-vmss_3"

// fakeAzureIMDS is Azure's instance metadata service: Metadata: true on every request (400
// without), the VM name as text, Scheduled Events as JSON, and POSTed acknowledgements.
type fakeAzureIMDS struct {
	mu        sync.Mutex
	events    string // the scheduled events document
	status    int    // non-zero: the events answer this
	nameAsks  int
	acks      []string // POSTed bodies
	ackHeader http.Header
	slow      bool
}

func (f *fakeAzureIMDS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Metadata") != "true" {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":"Bad request. Required metadata header not specified"}`)
		return
	}
	f.mu.Lock()
	if f.slow {
		f.mu.Unlock()
		hang(w, r)
		return
	}
	defer f.mu.Unlock()
	q := r.URL.Query()
	switch {
	case r.URL.Path == "/metadata/instance/compute/name" && q.Get("api-version") == "2021-02-01" && q.Get("format") == "text":
		f.nameAsks++
		fmt.Fprint(w, azureVM)
	case r.URL.Path == "/metadata/scheduledevents" && q.Get("api-version") == "2020-07-01" && r.Method == http.MethodGet:
		if f.status != 0 {
			w.WriteHeader(f.status)
			fmt.Fprint(w, `{"error":"Service temporarily unavailable"}`)
			return
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		fmt.Fprint(w, f.events)
	case r.URL.Path == "/metadata/scheduledevents" && q.Get("api-version") == "2020-07-01" && r.Method == http.MethodPost:
		b, _ := io.ReadAll(r.Body)
		f.acks = append(f.acks, string(b))
		f.ackHeader = r.Header.Clone()
	default:
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":"Invalid request %s %s"}`, r.Method, r.URL)
	}
}

func (f *fakeAzureIMDS) set(fn func(f *fakeAzureIMDS)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func newAzure(t *testing.T, f *fakeAzureIMDS) *metadata.Azure {
	t.Helper()
	w, err := metadata.NewAzure(metadata.Config{BaseURL: serve(t, f).URL, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("NewAzure: %v", err)
	}
	return w
}

// The shape is that of the documented sample (azure-compute-docs, scheduled-events.md).
const azureEvents = `{
  "DocumentIncarnation": 7,
  "Events": [
    {"EventId": "A123BC45-1234-5678-AB90-ABCDEF123456", "EventStatus": "Scheduled", "EventType": "Preempt",
     "ResourceType": "VirtualMachine", "Resources": ["gpu-spot-vmss_3"], "NotBefore": "Sun, 22 Nov 2026 01:30:00 GMT",
     "Description": "", "EventSource": "Platform", "DurationInSeconds": -1},
    {"EventId": "B0000000-0000-0000-0000-000000000001", "EventStatus": "Scheduled", "EventType": "Terminate",
     "ResourceType": "VirtualMachine", "Resources": ["gpu-spot-vmss_4", "gpu-spot-vmss_5"], "NotBefore": "Sun, 22 Nov 2026 01:40:00 GMT",
     "Description": "", "EventSource": "User", "DurationInSeconds": -1},
    {"EventId": "C0000000-0000-0000-0000-000000000002", "EventStatus": "Started", "EventType": "Freeze",
     "ResourceType": "VirtualMachine", "Resources": ["gpu-spot-vmss_1", "GPU-SPOT-VMSS_3"], "NotBefore": "",
     "Description": "Host server is undergoing maintenance.", "EventSource": "Platform", "DurationInSeconds": 9},
    {"EventId": "D0000000-0000-0000-0000-000000000003", "EventStatus": "Scheduled", "EventType": "Terminate",
     "ResourceType": "VirtualMachine", "Resources": ["gpu-spot-vmss_3"], "NotBefore": "Sun, 22 Nov 2026 01:45:00 GMT",
     "Description": "", "EventSource": "User", "DurationInSeconds": -1},
    {"EventId": "E0000000-0000-0000-0000-000000000004", "EventStatus": "Scheduled", "EventType": "Hibernate",
     "ResourceType": "VirtualMachine", "Resources": ["gpu-spot-vmss_3"], "NotBefore": "Sun, 22 Nov 2026 01:45:00 GMT",
     "Description": "", "EventSource": "User", "DurationInSeconds": -1}
  ]
}`

func TestAzureNotices(t *testing.T) {
	f := &fakeAzureIMDS{events: azureEvents}
	w := newAzure(t, f)
	got, err := w.Notices(t.Context())
	if err != nil {
		t.Fatalf("Notices: %v", err)
	}
	want := []providers.Notice{
		{ID: "A123BC45-1234-5678-AB90-ABCDEF123456", Kind: providers.Interruption, Deadline: time.Date(2026, 11, 22, 1, 30, 0, 0, time.UTC)},
		{ID: "C0000000-0000-0000-0000-000000000002", Kind: providers.Maintenance},
		{ID: "D0000000-0000-0000-0000-000000000003", Kind: providers.ScaleIn, Deadline: time.Date(2026, 11, 22, 1, 45, 0, 0, time.UTC)},
	}
	if len(got) != len(want) {
		t.Fatalf("notices %+v: want %d (the event for other VMs and the unknown type skipped)", got, len(want))
	}
	for i, n := range got {
		if n.ID != want[i].ID || n.Kind != want[i].Kind || !n.Deadline.Equal(want[i].Deadline) || n.HostID != azureVM {
			t.Errorf("notice %d = %+v: want %+v on host %s", i, n, want[i], azureVM)
		}
	}
	if _, err := w.Notices(t.Context()); err != nil {
		t.Fatalf("second poll: %v", err)
	}
	f.set(func(f *fakeAzureIMDS) {
		if f.nameAsks != 1 {
			t.Errorf("VM name asked %d times: want once (cached)", f.nameAsks)
		}
	})
}

func TestAzureNone(t *testing.T) {
	for _, doc := range []string{
		`{"DocumentIncarnation": 0, "Events": []}`,
		`{"DocumentIncarnation": 3}`,
		`{"DocumentIncarnation": 4, "Events": [{"EventId": "X", "EventType": "Preempt", "Resources": ["other-vm"], "NotBefore": "Sun, 22 Nov 2026 01:30:00 GMT"}]}`,
	} {
		got, err := newAzure(t, &fakeAzureIMDS{events: doc}).Notices(t.Context())
		if err != nil || len(got) != 0 {
			t.Errorf("Notices of %s = %+v, %v: want none", doc, got, err)
		}
	}
}

func TestAzureGarbage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		f       *fakeAzureIMDS
		parts   []string
		partial int
	}{
		{"html", &fakeAzureIMDS{events: "<html><body>Gateway</body></html>"}, []string{"scheduledevents", "Gateway"}, 0},
		{"not the document", &fakeAzureIMDS{events: `{"value": []}`}, []string{"scheduledevents", "DocumentIncarnation"}, 0},
		{"503", &fakeAzureIMDS{status: http.StatusServiceUnavailable}, []string{"scheduledevents", "HTTP 503", "temporarily unavailable"}, 0},
		{"bad NotBefore", &fakeAzureIMDS{events: `{"DocumentIncarnation": 1, "Events": [
			{"EventId": "bad", "EventType": "Reboot", "Resources": ["gpu-spot-vmss_3"], "NotBefore": "2026-11-22T01:30:00Z"},
			{"EventId": "good", "EventType": "Redeploy", "Resources": ["gpu-spot-vmss_3"], "NotBefore": "Sun, 22 Nov 2026 01:30:00 GMT"}]}`},
			[]string{"event bad", "NotBefore", "RFC 1123"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := newAzure(t, tc.f).Notices(t.Context())
			wantErrContains(t, err, tc.parts...)
			if len(got) != tc.partial {
				t.Errorf("%d notices alongside the error: want %d", len(got), tc.partial)
			}
		})
	}
}

func TestAzureAck(t *testing.T) {
	f := &fakeAzureIMDS{events: azureEvents}
	w := newAzure(t, f)
	if err := w.Ack(t.Context(), "A123BC45-1234-5678-AB90-ABCDEF123456", "D0000000-0000-0000-0000-000000000003"); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	if err := w.CompleteNotice(t.Context(), providers.Notice{ID: "C0000000-0000-0000-0000-000000000002"}); err != nil {
		t.Fatalf("CompleteNotice: %v", err)
	}
	if err := w.Ack(t.Context()); err != nil {
		t.Fatalf("Ack of nothing: %v", err)
	}
	f.set(func(f *fakeAzureIMDS) {
		want := []string{
			`{"StartRequests":[{"EventId":"A123BC45-1234-5678-AB90-ABCDEF123456"},{"EventId":"D0000000-0000-0000-0000-000000000003"}]}`,
			`{"StartRequests":[{"EventId":"C0000000-0000-0000-0000-000000000002"}]}`,
		}
		if !slices.Equal(f.acks, want) {
			t.Errorf("acks POSTed:\n%q\nwant:\n%q", f.acks, want)
		}
		if ct := f.ackHeader.Get("Content-Type"); ct != "application/json" {
			t.Errorf("ack Content-Type %q: want application/json", ct)
		}
	})
	f.set(func(f *fakeAzureIMDS) { f.slow = true })
	checkSlow(t, func(ctx context.Context) error { return w.Ack(ctx, "A123BC45-1234-5678-AB90-ABCDEF123456") })
}

func TestAzureSlow(t *testing.T) {
	w := newAzure(t, &fakeAzureIMDS{slow: true})
	checkSlow(t, func(ctx context.Context) error { _, err := w.Notices(ctx); return err })
}
