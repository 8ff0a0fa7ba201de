package bench_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/elasticd/elasticd/bench"
	"github.com/elasticd/elasticd/internal/browsertest"
)

// A small run of the scale benchmark: the real driver, simulated hosts over HTTP/2, every
// phase measured, one JSON object with the fields scripts hold it to.
func TestScale(t *testing.T) {
	var out, errw syncBuffer
	res, err := bench.Scale(bounded(t), bench.ScaleOptions{Exe: binary, Hosts: 20, Slots: 4, JSON: true, Out: &out, Err: &errw})
	if err != nil {
		t.Fatalf("%v\n%s", err, errw.String())
	}
	t.Logf("%s\n%s", out.String(), errw.String())
	if res.Hosts != 20 || res.Workers != 80 || res.ReclaimHosts != 2 {
		t.Errorf("ran %d hosts, %d workers, %d reclaimed; want 20, 80, 2", res.Hosts, res.Workers, res.ReclaimHosts)
	}
	if res.FormS <= 0 || res.ResetS <= 0 || res.ReclaimResetS <= 0 || res.ReclaimGenerations < 1 {
		t.Errorf("phases not measured: %+v", res)
	}
	if res.DriverRSSBytes < 1<<20 || res.DriverFDs < 20 || res.DriverHeapBytes <= 0 || res.Goroutines <= 0 {
		t.Errorf("the driver's resources not measured: %+v", res)
	}
	if res.StatusBytes <= 0 || res.MetricsBytes <= 0 || res.PageBytes <= 0 || res.StatusMS < 0 {
		t.Errorf("status, metrics or page not fetched: %+v", res)
	}
	if res.PageStatusBytes <= 0 || res.PageStatusMS < 0 {
		t.Errorf("the live page's status not fetched: %+v", res)
	}
	if _, err := browsertest.Find(); err == nil && res.PagePaintMS <= 0 {
		t.Errorf("the live page's first paint not measured, with a Chromium here: %+v", res)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(out.String())), &obj); err != nil {
		t.Fatalf("--json output %q: %v", out.String(), err)
	}
	for _, k := range []string{"hosts", "workers", "reset_s", "reclaim_reset_s", "driver_rss_bytes", "driver_fds", "status_ms"} {
		if _, ok := obj[k]; !ok {
			t.Errorf("--json output lacks %q", k)
		}
	}

	var ue *bench.UsageError
	if _, err := bench.Scale(bounded(t), bench.ScaleOptions{Exe: binary, Hosts: 1, Slots: 4}); !errors.As(err, &ue) || ue.Flag != "hosts" {
		t.Errorf("--hosts 1: %v, want a usage error naming --hosts", err)
	}
}
