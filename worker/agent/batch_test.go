package agent_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/worker/agent"
	wrdzv "github.com/elasticd/elasticd/worker/rendezvous"
)

// batchDriver is a rendezvous server that counts the requests it gets by path; with noBatch
// it answers a batch 404, as a driver without batches would.
type batchDriver struct {
	srv     *rendezvous.Server
	ts      *httptest.Server
	mu      sync.Mutex
	paths   map[string]int
	noBatch bool
}

func startBatchDriver(t *testing.T, noBatch bool) *batchDriver {
	t.Helper()
	srv, err := rendezvous.NewServer(rendezvous.ServerConfig{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	d := &batchDriver{srv: srv, paths: map[string]int{}, noBatch: noBatch}
	d.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		d.paths[r.URL.Path]++
		d.mu.Unlock()
		if d.noBatch && r.URL.Path == protocol.PathBatch {
			http.NotFound(w, r)
			return
		}
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.Close()
		d.ts.Close()
	})
	return d
}

func (d *batchDriver) count(path string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.paths[path]
}

// reportAll has 8 workers of one host report READY at once through one BatchTransport and
// waits for the driver to have all 8.
func reportAll(t *testing.T, d *batchDriver) {
	t.Helper()
	u, _ := url.Parse(d.ts.URL)
	hc := &http.Client{Transport: &agent.BatchTransport{Base: d.ts.Client().Transport, Driver: u, Window: 200 * time.Millisecond}}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range 8 {
		c := wrdzv.NewClient(d.ts.URL, secret, protocol.WorkerID{Host: "h", Slot: i}, hc)
		wg.Go(func() { errs[i] = c.Report(t.Context(), 0, protocol.Ready, "") })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("worker h/%d: %v", i, err)
		}
	}
	got := map[string]bool{}
	timeout := time.After(5 * time.Second)
	for len(got) < 8 {
		select {
		case ev := <-d.srv.Events():
			if ev.State == protocol.Ready {
				got[ev.Worker.String()] = true
			}
		case <-timeout:
			t.Fatalf("the driver has the reports of %d workers, want 8", len(got))
		}
	}
}

// A host's workers reporting together reach the driver as one request, each report checked
// and answered as if alone; a driver without batches gets them one by one.
func TestBatchTransport(t *testing.T) {
	d := startBatchDriver(t, false)
	reportAll(t, d)
	if b, s := d.count(protocol.PathBatch), d.count("/v1/workers/h/0/state"); b != 1 || s != 0 {
		t.Errorf("the driver got %d batches and %d reports of h/0 alone; want the 8 reports in 1 batch", b, s)
	}

	old := startBatchDriver(t, true)
	reportAll(t, old)
	if b, s := old.count(protocol.PathBatch), old.count("/v1/workers/h/0/state"); b != 1 || s != 1 {
		t.Errorf("a driver without batches got %d batches and %d reports of h/0 alone; want 1 batch tried, then each report alone", b, s)
	}
}
