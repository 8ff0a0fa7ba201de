package bench_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/bench"
	"golang.org/x/sys/cpu"
)

// A real run: rank processes over loopback, JSON out, with the fields users track.
func TestAllreduceJSON(t *testing.T) {
	var out bytes.Buffer
	var stderr syncBuffer
	_, err := bench.Allreduce(bounded(t), bench.AllreduceOptions{Exe: binary, NP: 3, Sizes: []int64{4 << 10, 1048580}, Iters: 3,
		Timeout: time.Minute, JSON: true, Out: &out, Err: &stderr})
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 JSON lines, got %d:\n%s", len(lines), out.String())
	}
	for i, line := range lines {
		var raw map[string]any
		if err := json.Unmarshal([]byte(line), &raw); err != nil {
			t.Fatalf("line %d %q: %v", i, line, err)
		}
		r := map[string]float64{} // the numbers; the per-rank lists are checked below
		for k, v := range raw {
			if f, ok := v.(float64); ok {
				r[k] = f
			}
		}
		wantSize := []float64{4096, 1048580}[i]
		if r["size_bytes"] != wantSize || r["ranks"] != 3 || r["iters"] != 3 {
			t.Errorf("line %d: %v", i, r)
		}
		for _, k := range []string{"median_s", "algbw_gbps", "busbw_gbps", "memcpy_gbps", "tcp_gbps", "rtt_s", "busbw_vs_tcp"} {
			if !(r[k] > 0) {
				t.Errorf("line %d: %s = %v, want > 0", i, k, r[k])
			}
		}
		// Rank 0 of 3 has two peers, both on this machine: shared memory where the OS has it.
		// Every rank says the same of its own two peers.
		shm := map[bool]float64{true: 2}[runtime.GOOS == "linux"]
		if r["shm_peers"] != shm || r["tcp_peers"] != 2-shm {
			t.Errorf("line %d: shm_peers = %v, tcp_peers = %v, want %v and %v", i, r["shm_peers"], r["tcp_peers"], shm, 2-shm)
		}
		for k, want := range map[string]float64{"rank_shm_peers": shm, "rank_tcp_peers": 2 - shm} {
			if got := fmt.Sprint(raw[k]); got != fmt.Sprint([]any{want, want, want}) {
				t.Errorf("line %d: %s = %s, want %v for each of 3 ranks", i, k, got, want)
			}
		}
		if !(r["p10_s"] > 0 && r["p10_s"] <= r["median_s"] && r["median_s"] <= r["p90_s"]) {
			t.Errorf("line %d: p10 %v, median %v, p90 %v: want 0 < p10 <= median <= p90", i, r["p10_s"], r["median_s"], r["p90_s"])
		}
		if got, want := r["algbw_gbps"], r["size_bytes"]/r["median_s"]/1e9; !near(got, want) {
			t.Errorf("algbw %v, want size/median = %v", got, want)
		}
		if got, want := r["busbw_gbps"], r["algbw_gbps"]*2*2/3; !near(got, want) {
			t.Errorf("busbw %v, want algbw*2(n-1)/n = %v", got, want)
		}
		if got, want := r["busbw_vs_tcp"], r["busbw_gbps"]/r["tcp_gbps"]; !near(got, want) {
			t.Errorf("busbw_vs_tcp %v, want %v", got, want)
		}
	}
}

func TestAllreduceTableOneRank(t *testing.T) {
	var out bytes.Buffer
	var stderr syncBuffer
	res, err := bench.Allreduce(bounded(t), bench.AllreduceOptions{Exe: binary, NP: 1, Sizes: []int64{4 << 10}, Iters: 2,
		Timeout: time.Minute, NoBaseline: true, Out: &out, Err: &stderr})
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	if !strings.Contains(out.String(), "1 rank processes") || !strings.Contains(out.String(), "4KB") {
		t.Fatalf("table:\n%s", out.String())
	}
	if len(res) != 1 || res[0].SizeBytes != 4096 || res[0].Iters != 2 || res[0].MemcpyGbps != 0 {
		t.Errorf("results %+v, want one of 4096 bytes, 2 iterations, no baseline", res)
	}
}

// --transport tcp keeps ranks of one machine off shared memory, and the table says so.
func TestAllreduceTransportTCP(t *testing.T) {
	var out bytes.Buffer
	var stderr syncBuffer
	res, err := bench.Allreduce(bounded(t), bench.AllreduceOptions{Exe: binary, NP: 2, Sizes: []int64{64 << 10}, Iters: 2,
		Transport: "tcp", Timeout: time.Minute, NoBaseline: true, Out: &out, Err: &stderr})
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	if len(res) != 1 || res[0].ShmPeers != 0 || !strings.Contains(out.String(), "on loopback TCP") {
		t.Fatalf("results %+v, table:\n%s", res, out.String())
	}
}

// Bad options are a *UsageError that names the flag and what is allowed, before anything runs.
func TestBadOptionsAreUsageErrors(t *testing.T) {
	ok := bench.AllreduceOptions{Exe: "/nonexistent/elasticd", NP: 2, Sizes: []int64{4096}, Timeout: time.Minute}
	for _, tc := range []struct {
		name string
		edit func(o *bench.AllreduceOptions)
		want string
	}{
		{"np 0", func(o *bench.AllreduceOptions) { o.NP = 0 }, "--np: 0 ranks: must be between 1 and 64"},
		{"np 65", func(o *bench.AllreduceOptions) { o.NP = 65 }, "--np: 65 ranks"},
		{"iters", func(o *bench.AllreduceOptions) { o.Iters = -1 }, "--iters: -1"},
		{"chunk", func(o *bench.AllreduceOptions) { o.ChunkBytes = 3 }, "--chunk-bytes: 3"},
		{"transport", func(o *bench.AllreduceOptions) { o.Transport = "udp" }, "--transport: \"udp\""},
		{"small", func(o *bench.AllreduceOptions) { o.SmallBytes = -1 }, "--small-bytes: -1"},
		{"send buffer", func(o *bench.AllreduceOptions) { o.TCPSendBuffer = 65 << 20 }, "--tcp-send-buffer: 68157440: must be at most"},
		{"direct bytes", func(o *bench.AllreduceOptions) { o.DirectBytes = -2 }, "--direct-bytes: -2: must be 0 (as the machine suggests), a size in bytes, or -1 (never)"},
		{"timeout", func(o *bench.AllreduceOptions) { o.Timeout = -time.Second }, "--timeout: "},
		{"no sizes", func(o *bench.AllreduceOptions) { o.Sizes = nil }, "--sizes: "},
		{"odd size", func(o *bench.AllreduceOptions) { o.Sizes = []int64{1001} }, "--sizes: 1001 bytes"},
		{"ranks per host", func(o *bench.AllreduceOptions) {
			o.NP, o.Hosts = 3, []bench.NetnsHost{{Netns: "h1", Addr: "10.0.0.1"}, {Netns: "h2", Addr: "10.0.0.2"}}
		}, "--netns-hosts: 3 ranks do not divide among 2 hosts"},
		{"host address", func(o *bench.AllreduceOptions) { o.Hosts = []bench.NetnsHost{{Netns: "h1", Addr: "h1.example"}} }, "--netns-hosts: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.edit(&o)
			_, err := bench.Allreduce(bounded(t), o)
			var ue *bench.UsageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v (%T), want a *UsageError containing %q", err, err, tc.want)
			}
		})
	}
	for _, tc := range []struct{ in, want string }{
		{"4XB", `"4XB" is not a size`},
		{"1001", "not a multiple of 4 bytes"},
		{",", "give at least one size"},
		{"5GB", "larger than 4GB"},
	} {
		if _, err := bench.ParseSizes(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseSizes(%q): %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
	for _, in := range []string{"h1", "h1=", "=10.0.0.1", "h1=10.0.0.1:99", "a/b=10.0.0.1"} {
		if _, err := bench.ParseNetnsHosts(in); err == nil || !strings.Contains(err.Error(), "want NAMESPACE=IP") {
			t.Errorf("ParseNetnsHosts(%q): %v, want an error that shows the form", in, err)
		}
	}
	hosts, err := bench.ParseNetnsHosts("h1=10.0.0.1, h2=fd00::2")
	if want := []bench.NetnsHost{{Netns: "h1", Addr: "10.0.0.1"}, {Netns: "h2", Addr: "fd00::2"}}; err != nil || !slices.Equal(hosts, want) {
		t.Errorf("ParseNetnsHosts: %v, %v, want %v", hosts, err, want)
	}
	got, err := bench.ParseSizes("4096, 4KB,64mb,1GiB")
	if want := []int64{4096, 4 << 10, 64 << 20, 1 << 30}; err != nil || !slices.Equal(got, want) {
		t.Errorf("ParseSizes: %v, %v, want %v", got, err, want)
	}
	_, err = bench.Recovery(bounded(t), bench.RecoveryOptions{Exe: binary, Trainer: trainer, NP: 3, Runs: 1, Fault: "pause", CommTimeout: time.Second})
	if ue := (*bench.UsageError)(nil); !errors.As(err, &ue) || err.Error() != `--fault: "pause": want kill or stop` {
		t.Errorf("Recovery with fault pause: %v", err)
	}
	_, err = bench.Notice(bounded(t), bench.NoticeOptions{Exe: binary, Trainer: "/nonexistent/train", Runs: 1})
	if ue := (*bench.UsageError)(nil); !errors.As(err, &ue) || !strings.Contains(err.Error(), "--trainer: ") {
		t.Errorf("Notice without a trainer: %v", err)
	}
}

// non_temporal says how each size was copied into shared memory, as ELASTICD_SHM_NONTEMPORAL
// (inherited by the rank processes) asks: never with 0, at every size with 1 where the CPU
// has the stores.
func TestAllreduceReportsNonTemporal(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared memory between ranks is Linux's")
	}
	for _, setting := range []string{"0", "1"} {
		t.Setenv("ELASTICD_SHM_NONTEMPORAL", setting)
		var stderr syncBuffer
		res, err := bench.Allreduce(bounded(t), bench.AllreduceOptions{Exe: binary, NP: 2, Sizes: []int64{4 << 10, 1 << 20}, Iters: 2,
			Timeout: time.Minute, NoBaseline: true, JSON: true, Out: io.Discard, Err: &stderr})
		if err != nil {
			t.Fatalf("%v: %s", err, stderr.String())
		}
		want := setting == "1" && runtime.GOARCH == "amd64" && cpu.X86.HasAVX
		for _, r := range res {
			if r.ShmPeers != 1 || r.NonTemporal != want {
				t.Errorf("ELASTICD_SHM_NONTEMPORAL=%s, %d bytes: shm peers %d, non_temporal %t; want 1 and %t", setting, r.SizeBytes, r.ShmPeers, r.NonTemporal, want)
			}
		}
	}
}

// direct says which sizes the ranks reduced by reading each other's buffers: with
// --direct-bytes 1, every size above recursive doubling's; with -1, none.
func TestAllreduceReportsDirect(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared memory between ranks is Linux's")
	}
	for _, direct := range []int{1, -1} {
		var stderr syncBuffer
		res, err := bench.Allreduce(bounded(t), bench.AllreduceOptions{Exe: binary, NP: 3, Sizes: []int64{4 << 10, 1 << 20}, Iters: 2,
			DirectBytes: direct, Timeout: time.Minute, NoBaseline: true, JSON: true, Out: io.Discard, Err: &stderr})
		if err != nil {
			t.Fatalf("%v: %s", err, stderr.String())
		}
		if len(res) != 2 {
			t.Fatalf("--direct-bytes %d: %d results, want 2", direct, len(res))
		}
		for _, r := range res {
			if want := direct == 1 && r.SizeBytes > 64<<10; r.Direct != want {
				t.Errorf("--direct-bytes %d, %d bytes: direct %t, want %t", direct, r.SizeBytes, r.Direct, want)
			}
		}
	}
}
