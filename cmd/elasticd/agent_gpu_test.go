//go:build linux && cgo

package main_test

import (
	"context"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/elasticd/elasticd/worker/agent"
	"github.com/elasticd/elasticd/worker/agent/gpu"
)

// dgx is go-nvml's DGX A100 mock (8 GPUs) whose NVML event set delivers the events a test
// injects.
type dgx struct {
	srv    *dgxa100.Server
	events chan nvml.EventData
}

func newDGX() *dgx {
	d := &dgx{srv: dgxa100.New(), events: make(chan nvml.EventData, 4)}
	es := &mock.EventSet{
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
			select {
			case ev := <-d.events:
				return ev, nvml.SUCCESS
			case <-time.After(10 * time.Millisecond):
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		},
	}
	d.srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return es, nvml.SUCCESS }
	for _, dev := range d.srv.Devices {
		dev := dev.(*dgxa100.Device)
		dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
			return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError, nvml.SUCCESS
		}
		dev.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 80}, nvml.SUCCESS }
	}
	return d
}

// xid raises XID x on GPU i, as the driver's event set reports it.
func (d *dgx) xid(i int, x uint64) {
	d.events <- nvml.EventData{Device: d.srv.Devices[i], EventType: nvml.EventTypeXidCriticalError, EventData: x}
}

// TestAgentGPUXIDFailsSlot: a real driver with --launcher agent and one agent (in this
// process) on a DGX A100 mock: 8 GPUs, so 8 slots, of which the job uses 2. An application
// XID (13) changes nothing; XID 79 on the GPU of a worker's slot then takes that slot out as
// a failure: the worker is stopped, the slot blacklisted, and the job goes on with a spare
// slot and completes.
func TestAgentGPUXIDFailsSlot(t *testing.T) {
	secret := writeSecret(t)
	drv := startJob(t, append([]string{"run", "-np", "2", "--min-np", "1", "--launcher", "agent",
		"--agent-secret-file", secret, "--listen", "127.0.0.1:0", "--blacklist-cooldown-range", "5m,10m"},
		trainArgs("--steps", "800", "--step-delay", "5ms", "--events")...)...)
	url := driverURL(drv)

	d := newDGX()
	lg := slog.New(slog.NewTextHandler(&logBuf{t: t}, nil))
	mon, err := gpu.New(d.srv, lg)
	if err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(secret)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(ctx, agent.Config{DriverURL: url, Secret: []byte(strings.TrimSpace(string(key))),
			HostID: "dgx-1", Addr: "127.0.0.2", GPUs: mon, Logger: lg, StopGrace: 2 * time.Second})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("agent did not stop")
		}
		mon.Close()
	})

	drv.waitFor(`generation 1: world size 2`, 60*time.Second)
	victim := drv.waitFor(`launched worker" worker=dgx-1/(\d) rank=1 `, 10*time.Second)[1]
	i := int(victim[0] - '0')
	d.xid(i, 13) // the application's fault: ignored
	d.xid(i, 79) // fallen off the bus
	drv.waitFor(`generation 2: world size 2, resuming`, 60*time.Second)
	if code := drv.wait(2 * time.Minute); code != 0 {
		t.Fatalf("job exit %d, want 0", code)
	}
	out := drv.output()
	if !regexp.MustCompile(`hardware fault: its slots leave the job as failed" host=dgx-1 slots=1 reason="GPU ` + victim + ` \(GPU-[^)]+\) on dgx-1: XID 79`).MatchString(out) {
		t.Fatalf("no hardware fault for GPU %s with XID 79 in the driver's log", victim)
	}
	if n := strings.Count(out, "hardware fault"); n != 1 {
		t.Fatalf("%d hardware faults in the driver's log, want 1: the application XID must not count", n)
	}
	if !strings.Contains(out, "resets 1 of which 1 after failures") {
		t.Fatal("the GPU fault did not count as one failure reset")
	}
	if regexp.MustCompile(`launched worker" worker=dgx-1/` + victim + ` rank=\d+ generation=2`).MatchString(out) {
		t.Fatal("the failed GPU's slot was used again")
	}
}

// logBuf sends a log to t.Log.
type logBuf struct{ t *testing.T }

func (l *logBuf) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
