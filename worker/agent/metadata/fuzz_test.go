package metadata_test

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/worker/agent/metadata"
)

// The notice bodies of each cloud's metadata service, fuzzed through the fakes that speak
// its wire format: a poll never panics, and what it returns is a well-formed notice for this
// host, or an error.

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func checkNotices(t *testing.T, host string, ns []providers.Notice, err error) {
	t.Helper()
	if err != nil {
		return
	}
	for _, n := range ns {
		switch {
		case n.HostID != host:
			t.Fatalf("notice %+v for host %q, want %q", n, n.HostID, host)
		case n.Kind != providers.Interruption && n.Kind != providers.Rebalance && n.Kind != providers.ScaleIn && n.Kind != providers.Maintenance:
			t.Fatalf("notice %+v of unknown kind", n)
		case n.ID == "":
			t.Fatalf("notice %+v without an ID", n)
		}
	}
}

func FuzzAWSNotices(f *testing.F) {
	f.Add(`{"action": "terminate", "time": "2026-11-22T01:02:03Z"}`, "", "")
	f.Add(`{"action": "stop", "time": "not a time"}`, `{"noticeTime": "2026-11-22T01:00:00Z"}`, "Warmed:Terminated")
	f.Add(`{"action": 7}`, `[]`, "Terminated")
	f.Add("", "", "InService")
	fake := newFakeIMDS()
	srv := httptest.NewServer(fake)
	f.Cleanup(srv.Close)
	w, err := metadata.NewAWS(metadata.Config{BaseURL: srv.URL, Logger: quiet()})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, spot, rebalance, lifecycle string) {
		fake.set(func(f *fakeIMDS) { f.spot, f.rebalance, f.lifecycle = spot, rebalance, lifecycle })
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ns, err := w.Notices(ctx)
		checkNotices(t, awsInstance, ns, err)
	})
}

func FuzzGCPNotices(f *testing.F) {
	f.Add("TRUE", "NONE")
	f.Add("FALSE", "TERMINATE_ON_HOST_MAINTENANCE")
	f.Add("maybe", "MIGRATE_ON_HOST_MAINTENANCE")
	f.Add("", "")
	fake := newFakeGCE()
	srv := httptest.NewServer(fake)
	f.Cleanup(srv.Close)
	w, err := metadata.NewGCP(metadata.Config{BaseURL: srv.URL, Logger: quiet(), MaxWait: time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, preempted, maintenance string) {
		fake.set(func(f *fakeGCE) { f.preempted, f.maintenance = preempted, maintenance })
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ns, err := w.Notices(ctx)
		checkNotices(t, gcpInstance, ns, err)
	})
}

func FuzzAzureNotices(f *testing.F) {
	f.Add(`{"DocumentIncarnation":1,"Events":[{"EventId":"E1","EventType":"Preempt","ResourceType":"VirtualMachine","Resources":["gpu-spot-vmss_3"],"EventStatus":"Scheduled","NotBefore":"Mon, 19 Sep 2016 18:29:47 GMT"}]}`)
	f.Add(`{"DocumentIncarnation":2,"Events":[{"EventId":"E2","EventType":"Terminate","Resources":["other"],"NotBefore":""},{"EventId":"","EventType":"Reboot","Resources":null}]}`)
	f.Add(`{"Events":"nope"}`)
	f.Add(``)
	fake := &fakeAzureIMDS{}
	srv := httptest.NewServer(fake)
	f.Cleanup(srv.Close)
	w, err := metadata.NewAzure(metadata.Config{BaseURL: srv.URL, Logger: quiet()})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		fake.set(func(f *fakeAzureIMDS) { f.events = doc })
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ns, err := w.Notices(ctx)
		checkNotices(t, azureVM, ns, err)
	})
}
