package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/agents"
	"github.com/elasticd/elasticd/protocol"
	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/worker/agent"
	"github.com/elasticd/elasticd/worker/agent/gpu"
	"github.com/elasticd/elasticd/worker/agent/metadata"
)

// want is a check expected by name: its status, and text its detail (and fix) must hold.
type want struct {
	name   string
	status providers.CheckStatus
	detail []string
	fix    string // "" when any fix will do (a failure must still have one)
}

// expect compares checks with wants, in order.
func expect(t *testing.T, got providers.Checks, wants ...want) {
	t.Helper()
	if len(got) != len(wants) {
		t.Errorf("%d checks, want %d:\n%s", len(got), len(wants), lines(got))
		return
	}
	for i, w := range wants {
		c := got[i]
		if c.Name != w.name || c.Status != w.status {
			t.Errorf("check %d is %s, want %s %s:\n%s", i, c, w.status, w.name, lines(got))
			continue
		}
		for _, d := range w.detail {
			if !strings.Contains(c.Detail, d) {
				t.Errorf("%s: detail %q lacks %q", c.Name, c.Detail, d)
			}
		}
		if c.Status == providers.CheckFail && c.Fix == "" {
			t.Errorf("%s failed without a fix", c.Name)
		}
		if !strings.Contains(c.Fix, w.fix) {
			t.Errorf("%s: fix %q lacks %q", c.Name, c.Fix, w.fix)
		}
		if strings.Contains(c.Detail, "\n") {
			t.Errorf("%s: detail of several lines: %q", c.Name, c.Detail)
		}
	}
}

func lines(cs providers.Checks) string {
	var b strings.Builder
	for _, c := range cs {
		b.WriteString("  " + c.String() + "\n")
	}
	return b.String()
}

// checkDriver runs CheckDriver with a short timeout, and bounds it.
func checkDriver(t *testing.T, dc agent.DriverCheck) providers.Checks {
	t.Helper()
	if dc.Timeout == 0 {
		dc.Timeout = 2 * time.Second
	}
	start := time.Now()
	cs := agent.CheckDriver(t.Context(), dc)
	if took := time.Since(start); took > 2*dc.Timeout+time.Second {
		t.Errorf("CheckDriver took %v with a timeout of %v", took, dc.Timeout)
	}
	return cs
}

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// A real registry over loopback: the secret accepted, the version and the clock read, and
// no agent registered; a wrong secret, a closed port, a bad URL.
func TestCheckDriverAgainstRegistry(t *testing.T) {
	lg, logs := logger(t, "driver")
	reg, err := agents.New(agents.Config{Secret: secret, JobID: "job-7", Version: "v9.9.9", Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(reg)
	t.Cleanup(srv.Close)
	t.Cleanup(reg.Close)

	t.Run("ok", func(t *testing.T) {
		cs := checkDriver(t, agent.DriverCheck{URL: srv.URL, Secret: secret, Host: "gpu-1"})
		expect(t, cs,
			want{name: "driver", status: providers.CheckOK, detail: []string{srv.Listener.Addr().String(), "elasticd v9.9.9, job job-7"}},
			want{name: "secret", status: providers.CheckOK, detail: []string{"accepts this secret"}},
			want{name: "clock", status: providers.CheckOK, detail: []string{"of the driver's", "signatures allow 1m0s"}})
		if a := reg.Agents(); len(a) != 0 {
			t.Errorf("the check registered %d agents", len(a))
		}
		if !strings.Contains(logs.String(), "an agent checked its setup") || !strings.Contains(logs.String(), "host=gpu-1") {
			t.Error("the driver's log does not show the check")
		}
	})
	t.Run("wrong secret", func(t *testing.T) {
		cs := checkDriver(t, agent.DriverCheck{URL: srv.URL + "/", Secret: []byte("another-secret-of-32-bytes......"), SecretFile: "/etc/elasticd/agent-secret"})
		expect(t, cs,
			want{name: "driver", status: providers.CheckOK, detail: []string{"as the agents' protocol"}},
			want{name: "secret", status: providers.CheckFail, detail: []string{"refuses this secret", "bad signature"}, fix: "/etc/elasticd/agent-secret must hold the driver's secret"},
			want{name: "clock", status: providers.CheckOK, detail: []string{"Date header"}})
	})
	t.Run("no secret", func(t *testing.T) {
		cs := checkDriver(t, agent.DriverCheck{URL: srv.URL})
		expect(t, cs,
			want{name: "driver", status: providers.CheckOK, detail: []string{"as the agents' protocol"}},
			want{name: "secret", status: providers.CheckSkipped, detail: []string{"no secret to send"}},
			want{name: "clock", status: providers.CheckOK})
	})
	t.Run("clock", func(t *testing.T) {
		// This host's clock two minutes behind the driver's: the request is signed with the
		// real time, so the driver answers; its answer's time shows the skew.
		cs := checkDriver(t, agent.DriverCheck{URL: srv.URL, Secret: secret, Now: func() time.Time { return time.Now().Add(-2 * time.Minute) }})
		expect(t, cs,
			want{name: "driver", status: providers.CheckOK},
			want{name: "secret", status: providers.CheckOK},
			want{name: "clock", status: providers.CheckFail, detail: []string{"2m0s behind the driver's"}, fix: "NTP"})
	})
	t.Run("unreachable", func(t *testing.T) {
		addr := closedPort(t)
		cs := checkDriver(t, agent.DriverCheck{URL: "http://" + addr, Secret: secret})
		_, port, _ := net.SplitHostPort(addr)
		expect(t, cs,
			want{name: "driver", status: providers.CheckFail, detail: []string{addr + " unreachable", "connection refused"}, fix: "let TCP " + port + " in"},
			want{name: "secret", status: providers.CheckSkipped, detail: []string{"unreachable"}},
			want{name: "clock", status: providers.CheckSkipped})
	})
	for name, u := range map[string]string{"no URL": "", "not http": "ftp://10.0.0.5:29400", "no host": "http://:29400", "not a URL": "http://[::1"} {
		t.Run(name, func(t *testing.T) {
			expect(t, checkDriver(t, agent.DriverCheck{URL: u, Secret: secret}),
				want{name: "driver", status: providers.CheckFail, fix: "--driver http://DRIVER_IP:29400"},
				want{name: "secret", status: providers.CheckSkipped},
				want{name: "clock", status: providers.CheckSkipped})
		})
	}
}

// What else may answer at --driver: a driver of an older release, one without --launcher agent,
// another web server, a port that accepts and never answers, a driver that refuses the
// request's time.
func TestCheckDriverOtherAnswers(t *testing.T) {
	auth, err := protocol.NewAuth(secret, protocol.AgentAuthLabel, 0)
	if err != nil {
		t.Fatal(err)
	}
	serve := func(h http.HandlerFunc) string {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return srv.URL
	}
	older := serve(func(w http.ResponseWriter, r *http.Request) {
		nonce, err := auth.Verify(r, nil, time.Now())
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		protocol.Answer{W: w, Auth: auth, Nonce: nonce}.Error(http.StatusNotFound, "no GET /v1/agents/check in the agents' protocol")
	})
	expect(t, checkDriver(t, agent.DriverCheck{URL: older, Secret: secret}),
		want{name: "driver", status: providers.CheckFail, detail: []string{"older than this agent", "would refuse this agent's registration"}, fix: "same elasticd release"},
		want{name: "secret", status: providers.CheckOK},
		want{name: "clock", status: providers.CheckOK, detail: []string{"Date header"}})

	// The release before this one: it answers the check, with the agents' protocol 1.
	previous := serve(func(w http.ResponseWriter, r *http.Request) {
		nonce, err := auth.Verify(r, nil, time.Now())
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		protocol.Answer{W: w, Auth: auth, Nonce: nonce}.JSON(protocol.AgentCheckAnswer{Protocol: 1, Version: "v0.9.0", JobID: "job-1", Time: time.Now()})
	})
	expect(t, checkDriver(t, agent.DriverCheck{URL: previous, Secret: secret}),
		want{name: "driver", status: providers.CheckFail, detail: []string{"elasticd v0.9.0", "protocol version 1, this agent version 2"}, fix: "same elasticd release"},
		want{name: "secret", status: providers.CheckOK},
		want{name: "clock", status: providers.CheckOK})

	rendezvous := serve(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "bad signature", http.StatusUnauthorized) })
	expect(t, checkDriver(t, agent.DriverCheck{URL: rendezvous, Secret: secret}),
		want{name: "driver", status: providers.CheckOK, detail: []string{"without naming the agents' protocol"}},
		want{name: "secret", status: providers.CheckFail, detail: []string{"bad signature"}, fix: "--launcher agent"},
		want{name: "clock", status: providers.CheckOK})

	web := serve(func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	expect(t, checkDriver(t, agent.DriverCheck{URL: web, Secret: secret}),
		want{name: "driver", status: providers.CheckFail, detail: []string{"answers 404", "not an elasticd driver"}, fix: "--launcher agent"},
		want{name: "secret", status: providers.CheckSkipped},
		want{name: "clock", status: providers.CheckSkipped})

	skewed := serve(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(protocol.HeaderAgentsProtocol, "1")
		http.Error(w, "timestamp outside the replay window of 1m0s (clocks differ by 3m0s?)", http.StatusUnauthorized)
	})
	expect(t, checkDriver(t, agent.DriverCheck{URL: skewed, Secret: secret}),
		want{name: "driver", status: providers.CheckOK},
		want{name: "secret", status: providers.CheckSkipped, detail: []string{"refused the request's time"}},
		want{name: "clock", status: providers.CheckFail, detail: []string{"clocks differ by 3m0s"}, fix: "NTP"})

	// A port that accepts connections and never answers: bounded by the timeout.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 4)
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-accepted
		close(held)
		for c := range held {
			c.Close()
		}
	})
	start := time.Now()
	expect(t, checkDriver(t, agent.DriverCheck{URL: "http://" + ln.Addr().String(), Secret: secret, Timeout: 300 * time.Millisecond}),
		want{name: "driver", status: providers.CheckFail, detail: []string{"accepts connections but gave no HTTP answer within 300ms"}},
		want{name: "secret", status: providers.CheckSkipped},
		want{name: "clock", status: providers.CheckSkipped})
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("a silent driver held the check %v", took)
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "  "+string(secret)+"\n", 0o600)
	c, s := agent.ReadSecretFile(good)
	expect(t, providers.Checks{c}, want{name: "agent-secret", status: providers.CheckOK, detail: []string{"32 bytes, mode 0600"}})
	if string(s) != string(secret) {
		t.Errorf("secret %q, want the file's without whitespace", s)
	}
	c, s = agent.ReadSecretFile(write("open", string(secret), 0o644))
	expect(t, providers.Checks{c}, want{name: "agent-secret", status: providers.CheckOK, detail: []string{"WARNING: mode 0644 lets other users read it: chmod 600"}})
	if s == nil {
		t.Error("a readable secret was not returned")
	}
	for name, path := range map[string]string{
		"short":   write("short", "tooshort\n", 0o600),
		"missing": filepath.Join(dir, "nonexistent"),
		"none":    "",
	} {
		c, s := agent.ReadSecretFile(path)
		expect(t, providers.Checks{c}, want{name: "agent-secret", status: providers.CheckFail})
		if s != nil {
			t.Errorf("%s: a secret returned from a failed check", name)
		}
	}
}

// fakeIMDS speaks IMDSv2 for one instance; fail makes every answer a 500.
func fakeIMDS(t *testing.T, fail bool, spot string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case fail:
			http.Error(w, "internal error", http.StatusInternalServerError)
		case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
			fmt.Fprint(w, "tok")
		case r.Header.Get("X-aws-ec2-metadata-token") != "tok":
			http.Error(w, "", http.StatusUnauthorized)
		case r.URL.Path == "/latest/meta-data/instance-id":
			fmt.Fprint(w, "i-0abc")
		case r.URL.Path == "/latest/meta-data/spot/instance-action" && spot != "":
			fmt.Fprint(w, spot)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func awsCheck(t *testing.T, base string) agent.MetadataCheck {
	t.Helper()
	w, err := metadata.NewAWS(metadata.Config{BaseURL: base})
	if err != nil {
		t.Fatal(err)
	}
	return agent.MetadataCheck{Kind: "aws", BaseURL: base, ID: w.InstanceID, Notices: w, Timeout: 3 * time.Second}
}

func TestCheckMetadata(t *testing.T) {
	ctx := t.Context()
	ok := fakeIMDS(t, false, "")
	expect(t, providers.Checks{agent.CheckMetadata(ctx, awsCheck(t, ok))},
		want{name: "metadata service", status: providers.CheckOK, detail: []string{"IMDSv2 at " + ok, "instance i-0abc", "no notice now"}})

	at := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Second)
	notice := fakeIMDS(t, false, `{"action":"terminate","time":"`+at.Format(time.RFC3339)+`"}`)
	expect(t, providers.Checks{agent.CheckMetadata(ctx, awsCheck(t, notice))},
		want{name: "metadata service", status: providers.CheckOK, detail: []string{"a notice now: EC2 spot instance-action terminate", at.Format(time.RFC3339)}})

	failing := fakeIMDS(t, true, "")
	expect(t, providers.Checks{agent.CheckMetadata(ctx, awsCheck(t, failing))},
		want{name: "metadata service", status: providers.CheckFail, detail: []string{"no instance name", "IMDSv2 token", "500"}, fix: "--http-put-response-hop-limit 2"})

	closed := "http://" + closedPort(t)
	expect(t, providers.Checks{agent.CheckMetadata(ctx, awsCheck(t, closed))},
		want{name: "metadata service", status: providers.CheckFail, detail: []string{"connection refused"}, fix: "check --metadata-url " + closed})

	// The ID answers, the poll does not.
	half := agent.MetadataCheck{Kind: "gcp", ID: func(context.Context) (string, error) { return "1234", nil },
		Notices: noticer(func(context.Context) ([]providers.Notice, error) { return nil, errors.New("preempted: HTTP 503") })}
	expect(t, providers.Checks{agent.CheckMetadata(ctx, half)},
		want{name: "metadata service", status: providers.CheckFail, detail: []string{"instance 1234, but polling its notices failed: preempted: HTTP 503"}, fix: "metadata.google.internal"})

	expect(t, providers.Checks{agent.CheckMetadata(ctx, agent.MetadataCheck{Kind: "none"}), agent.CheckMetadata(ctx, agent.MetadataCheck{Kind: "none", Auto: true})},
		want{name: "metadata service", status: providers.CheckSkipped, detail: []string{"--metadata none"}},
		want{name: "metadata service", status: providers.CheckSkipped, detail: []string{"--metadata auto", "names no cloud"}})
}

type noticer func(context.Context) ([]providers.Notice, error)

func (n noticer) Notices(ctx context.Context) ([]providers.Notice, error) { return n(ctx) }

// dgx is an inventory of n healthy A100s.
func dgx(n int) gpu.Inventory {
	inv := gpu.Inventory{Loaded: true, DriverVersion: "550.54.15", NVMLVersion: "12.550.54.15", CUDAVersion: "12.4"}
	for i := range n {
		inv.Devices = append(inv.Devices, gpu.Device{GPU: gpu.GPU{Index: i, UUID: fmt.Sprintf("GPU-%02d", i), Model: "NVIDIA A100-SXM4-40GB", MemoryBytes: 40 << 30}})
	}
	return inv
}

func pci(n int) []gpu.PCIDevice {
	var out []gpu.PCIDevice
	for i := range n {
		out = append(out, gpu.PCIDevice{Address: fmt.Sprintf("0000:%02x:00.0", i+0x10), Class: "0x030200"}, gpu.PCIDevice{Address: fmt.Sprintf("0000:%02x:00.1", i+0x10), Class: "0x040300"})
	}
	return out
}

func TestCheckGPUs(t *testing.T) {
	faulty := dgx(4)
	faulty.Devices[1].Faults = []gpu.Fault{{Kind: gpu.KindECC, Detail: "2 uncorrectable ECC errors since the driver loaded"}}
	faulty.Devices[2].Faults = []gpu.Fault{{Kind: gpu.KindRetiredPages, Detail: "memory pages are waiting to be retired at the next GPU reset"}}
	lost := dgx(4)
	lost.Devices[3] = gpu.Device{GPU: gpu.GPU{Index: 3}, Faults: []gpu.Fault{{Kind: gpu.KindLost, Detail: "NVML reports the GPU lost"}}}

	nvidiaOK := want{name: "NVIDIA driver", status: providers.CheckOK, detail: []string{"driver 550.54.15, NVML 12.550.54.15, CUDA 12.4"}}
	cases := map[string]struct {
		host  agent.GPUHost
		wants []want
	}{
		"healthy": {agent.GPUHost{Inventory: dgx(8), PCI: pci(8)}, []want{nvidiaOK,
			{name: "GPUs", status: providers.CheckOK, detail: []string{"8 GPUs: 8 × NVIDIA A100-SXM4-40GB (40 GiB); the agent offers all 8, as 8 slots"}},
			{name: "GPU health", status: providers.CheckOK, detail: []string{"8 GPUs: no uncorrectable ECC errors"}}}},
		"slots": {agent.GPUHost{Inventory: dgx(2), PCI: pci(2), Slots: 4}, []want{nvidiaOK,
			{name: "GPUs", status: providers.CheckOK, detail: []string{"offers all 2, as --slots 4"}},
			{name: "GPU health", status: providers.CheckOK}}},
		"faulty": {agent.GPUHost{Inventory: faulty, PCI: pci(4)}, []want{nvidiaOK,
			{name: "GPUs", status: providers.CheckOK},
			{name: "GPU health: GPU 1", status: providers.CheckFail, detail: []string{"GPU-01 (NVIDIA A100-SXM4-40GB): 2 uncorrectable ECC errors"}, fix: "hand the host back"},
			{name: "GPU health: GPU 2", status: providers.CheckFail, detail: []string{"waiting to be retired"}, fix: "nvidia-smi -r -i 2"}}},
		"faulty, not offered": {agent.GPUHost{Inventory: faulty, PCI: pci(4), Visible: "3,GPU-00", VisibleSet: true}, []want{nvidiaOK,
			{name: "GPUs", status: providers.CheckOK, detail: []string{"CUDA_VISIBLE_DEVICES=3,GPU-00 offers GPU 3, 0, as 2 slots"}},
			{name: "GPU health", status: providers.CheckOK, detail: []string{"2 GPUs"}},
			{name: "GPU health: GPU 1", status: providers.CheckSkipped, detail: []string{"not offered"}},
			{name: "GPU health: GPU 2", status: providers.CheckSkipped, detail: []string{"not offered"}}}},
		"lost": {agent.GPUHost{Inventory: lost, PCI: pci(4)}, []want{nvidiaOK,
			{name: "GPUs", status: providers.CheckOK, detail: []string{"4 GPUs: 3 × NVIDIA A100", "(lost, left out: GPU 3)", "offers all 3, as 3 slots"}},
			{name: "GPU health: GPU 3", status: providers.CheckFail, detail: []string{"lost"}, fix: "hand the host back"}}},
		"fewer than the bus": {agent.GPUHost{Inventory: dgx(7), PCI: pci(8)}, []want{nvidiaOK,
			{name: "GPUs", status: providers.CheckFail, detail: []string{"NVML lists 7 GPUs, but this machine has 8 NVIDIA GPUs on the PCI bus"}, fix: "hand the host back"},
			{name: "GPU health", status: providers.CheckOK}}},
		"hidden": {agent.GPUHost{Inventory: dgx(2), PCI: pci(2), Visible: "", VisibleSet: true}, []want{nvidiaOK,
			{name: "GPUs", status: providers.CheckOK, detail: []string{"offers none: the agent offers --slots, or the driver's count"}},
			{name: "GPU health", status: providers.CheckOK, detail: []string{"no GPU offered"}}}},
		"bad CUDA_VISIBLE_DEVICES": {agent.GPUHost{Inventory: dgx(2), PCI: pci(2), Visible: "5", VisibleSet: true}, []want{nvidiaOK,
			{name: "GPUs", status: providers.CheckFail, detail: []string{"no GPU 5 on this host", "refuse to start"}, fix: "nvidia-smi -L"},
			{name: "GPU health", status: providers.CheckOK, detail: []string{"2 GPUs"}}}},
		"no driver": {agent.GPUHost{Inventory: gpu.Inventory{Missing: true, Why: "NVML's library libnvidia-ml.so.1 is not installed"}, PCI: pci(2)}, []want{
			{name: "NVIDIA driver", status: providers.CheckFail, detail: []string{"not installed", "2 NVIDIA GPUs on the PCI bus (0000:10:00.0, 0000:11:00.0)", "an image without the NVIDIA driver"}, fix: "nvidia-smi"},
			{name: "GPUs", status: providers.CheckSkipped},
			{name: "GPU health", status: providers.CheckSkipped}}},
		"module not loaded": {agent.GPUHost{Inventory: gpu.Inventory{Missing: true, Why: "NVML is installed but the NVIDIA kernel driver is not loaded"}, PCI: pci(1)}, []want{
			{name: "NVIDIA driver", status: providers.CheckFail, detail: []string{"not loaded", "1 NVIDIA GPU on the PCI bus"}, fix: "modprobe nvidia"},
			{name: "GPUs", status: providers.CheckSkipped},
			{name: "GPU health", status: providers.CheckSkipped}}},
		"CPU host": {agent.GPUHost{Inventory: gpu.Inventory{Missing: true, Why: "NVML's library libnvidia-ml.so.1 is not installed"}, PCI: []gpu.PCIDevice{{Address: "0000:00:05.0", Class: "0x040300"}}}, []want{
			{name: "NVIDIA driver", status: providers.CheckSkipped, detail: []string{"a CPU host"}},
			{name: "GPUs", status: providers.CheckSkipped, detail: []string{"--slots, or the driver's count"}},
			{name: "GPU health", status: providers.CheckSkipped}}},
		"no cgo, GPUs": {agent.GPUHost{Inventory: gpu.Inventory{Unsupported: true, Why: "this elasticd was built without cgo"}, PCI: pci(1)}, []want{
			{name: "NVIDIA driver", status: providers.CheckFail, detail: []string{"built without cgo", "1 NVIDIA GPU"}, fix: "CGO_ENABLED=1"},
			{name: "GPUs", status: providers.CheckSkipped},
			{name: "GPU health", status: providers.CheckSkipped}}},
		"no cgo, CPU host": {agent.GPUHost{Inventory: gpu.Inventory{Unsupported: true, Why: "this elasticd was built without cgo"}}, []want{
			{name: "NVIDIA driver", status: providers.CheckSkipped, detail: []string{"a CPU host", "cannot read GPUs"}},
			{name: "GPUs", status: providers.CheckSkipped},
			{name: "GPU health", status: providers.CheckSkipped}}},
		"NVML fails": {agent.GPUHost{Inventory: gpu.Inventory{Why: "NVML did not initialise: ERROR_NO_PERMISSION"}, PCI: pci(1)}, []want{
			{name: "NVIDIA driver", status: providers.CheckFail, detail: []string{"ERROR_NO_PERMISSION"}},
			{name: "GPUs", status: providers.CheckSkipped},
			{name: "GPU health", status: providers.CheckSkipped}}},
		"inventory fails": {agent.GPUHost{Inventory: gpu.Inventory{Loaded: true, DriverVersion: "550.54.15", NVMLVersion: "12.550.54.15", CUDAVersion: "12.4", Why: "describe GPU 2: ERROR_UNKNOWN"}, PCI: pci(4)}, []want{nvidiaOK,
			{name: "GPUs", status: providers.CheckFail, detail: []string{"describe GPU 2", "without GPUs"}},
			{name: "GPU health", status: providers.CheckSkipped}}},
		"PCI unreadable": {agent.GPUHost{Inventory: gpu.Inventory{Missing: true, Why: "NVML's library libnvidia-ml.so.1 is not installed"}, PCIErr: errors.New("list PCI devices: permission denied")}, []want{
			{name: "NVIDIA driver", status: providers.CheckSkipped, detail: []string{"unknown: list PCI devices: permission denied"}},
			{name: "GPUs", status: providers.CheckSkipped},
			{name: "GPU health", status: providers.CheckSkipped}}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) { expect(t, agent.CheckGPUs(c.host), c.wants...) })
	}
}
