package driver

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/cost"
	"github.com/elasticd/elasticd/driver/rendezvous"
	"github.com/elasticd/elasticd/providers"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The metrics are the board's status: a job with a failure, a notice and priced hosts reads
// back through the Prometheus text format with the values /v1/status has.
func TestMetricsFromTheBoard(t *testing.T) {
	s := newSim(t, Config{NP: 3, MinNP: 1, CooldownMin: time.Minute})
	hs := []providers.Host{
		{ID: "h0", Addr: "127.0.0.1", Slots: 1, Spot: true, Type: "g"},
		{ID: "h1", Addr: "127.0.0.1", Slots: 1, Spot: true, Type: "g"},
		{ID: "h2", Addr: "127.0.0.1", Slots: 1, Type: "g"},
	}
	s.m.Step(HostsDiscovered{Now: s.now, Hosts: hs})
	s.ready(0, "h0", "h1", "h2")
	s.after(time.Hour).exit("h2", 1)
	s.ready(1, "h0", "h1")
	s.m.Step(NoticeReceived{Now: s.now, Source: "aws", Notice: providers.Notice{ID: "n", HostID: "h1", Kind: providers.Interruption}})
	b := &StatusBoard{jobID: "job1", now: func() time.Time { return s.now }}
	b.prices = cost.NewCatalog(&cost.File{Currency: "USD", Types: map[string]cost.Rate{"g": {OnDemand: 3, Spot: 1}}}, nil, nil)
	b.progress = func() rendezvous.Progress {
		return rendezvous.Progress{Generation: 2, Step: 100, Committed: 90, At: s.now, StepsPerSecond: 10, Loss: new(0.25), TotalSteps: 1000}
	}
	b.store(s.m.Snapshot())
	m := NewMetrics(b)
	m.ObserveRendezvous(300 * time.Millisecond)

	srv := httptest.NewServer(promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		`elasticd_job_info{job_id="job1"} 1`,
		`elasticd_phase{phase="running"} 1`,
		`elasticd_phase{phase="resetting"} 0`,
		`elasticd_world_size 2`,
		`elasticd_generation 2`,
		`elasticd_hosts{state="leaving"} 1`,
		`elasticd_hosts{state="blacklisted"} 1`,
		`elasticd_hosts{state="active"} 1`,
		`elasticd_hosts{state="idle"} 0`,
		`elasticd_workers{state="running"} 2`,
		`elasticd_resets_total{cause="failure"} 1`,
		`elasticd_resets_total{cause="notice"} 0`,
		`elasticd_notices_total{kind="interruption",provider="aws"} 1`,
		`elasticd_np_limits{limit="min"} 1`,
		`elasticd_instance_seconds_total{lifecycle="on-demand",type="g"} 3600`,
		`elasticd_instance_seconds_total{lifecycle="spot",type="g"} 7200`,
		`elasticd_cost_total{currency="USD",lifecycle="spot",type="g"} 2`,
		`elasticd_on_demand_equivalent_cost_total{currency="USD"} 9`,
		`elasticd_savings{currency="USD"} 4`,
		`elasticd_rendezvous_seconds_count 1`,
		`elasticd_rendezvous_seconds_bucket{le="0.5"} 1`,
		`elasticd_rendezvous_seconds_bucket{le="0.25"} 0`,
		`elasticd_cost_total{currency="USD",lifecycle="on-demand",type="g"} 3`,
		`elasticd_unpriced_types 0`,
		`elasticd_step 100`,
		`elasticd_loss 0.25`,
		`elasticd_total_steps 1000`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", text)
	}

	// Every family exported is one Names lists, and with this status every board metric
	// has a value.
	names := m.Names()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		n := mf.GetName()
		if strings.HasPrefix(n, "elasticd_") {
			got = append(got, n)
		}
		if !slices.Contains(names, n) && !slices.Contains(names, n+"_count") {
			t.Errorf("%s is exported but Names lacks it", n)
		}
	}
	for _, n := range boardNames {
		if !slices.Contains(got, n) {
			t.Errorf("%s has no value in a job that has every kind of data", n)
		}
	}
}

// Before the job's first step the board is empty: /metrics has only the runtime's metrics.
func TestMetricsBeforeTheJob(t *testing.T) {
	m := NewMetrics(&StatusBoard{})
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if n := mf.GetName(); strings.HasPrefix(n, "elasticd_") && n != rendezvousMetric {
			t.Errorf("%s exported before the job began", n)
		}
	}
}
