package main_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/agents"
)

// `elasticd agent --check` against a real driver registry in this process, over loopback, with
// a fake IMDSv2, a fake sysfs (--sys-root) and an NVML library that is not there
// (--nvml-library), so that what it finds does not depend on the machine the test runs on.

// checkDriver is a driver's agent registry on loopback, holding the secret in writeSecret's file.
func checkDriver(t *testing.T) (string, *agents.Registry) {
	t.Helper()
	key, err := os.ReadFile(writeSecret(t))
	if err != nil {
		t.Fatal(err)
	}
	reg, err := agents.New(agents.Config{Secret: bytes.TrimSpace(key), JobID: "job-check", Version: "v9.9.9"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(reg)
	t.Cleanup(srv.Close)
	t.Cleanup(reg.Close)
	return srv.URL, reg
}

// sysRoot is a fake sysfs: a PCI bus with the given NVIDIA GPUs (by address) and an ENA card.
func sysRoot(t *testing.T, nvidia ...string) string {
	t.Helper()
	root := t.TempDir()
	devs := map[string][2]string{"0000:00:05.0": {"0x1d0f", "0x020000"}}
	for _, a := range nvidia {
		devs[a] = [2]string{"0x10de", "0x030200"}
	}
	for addr, vc := range devs {
		dir := filepath.Join(root, "bus", "pci", "devices", addr)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, v := range map[string]string{"vendor": vc[0], "class": vc[1]} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

// agentCheckArgs are `agent --check` with the test seams; more come after.
func agentCheckArgs(t *testing.T, sys string, more ...string) []string {
	return append([]string{"agent", "--check", "--sys-root", sys, "--nvml-library", filepath.Join(t.TempDir(), "libnvidia-ml.so.1")}, more...)
}

// checkOutput is the check's lines: name -> the line (with its fix line, if any).
func checkOutput(t *testing.T, stdout string) map[string]string {
	t.Helper()
	out := map[string]string{}
	line := regexp.MustCompile(`^(✔|✘|-) ([^:]+(?:: GPU \d+)?): `)
	var last string
	for _, l := range strings.Split(strings.TrimRight(stdout, "\n"), "\n") {
		if strings.HasPrefix(l, "  fix: ") && last != "" {
			out[last] += "\n" + l
			continue
		}
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("line %q is not a check's:\n%s", l, stdout)
		}
		last = m[2]
		out[last] = l
	}
	return out
}

// wantLine checks that the line of check name starts with mark and holds words.
func wantLine(t *testing.T, lines map[string]string, name, mark string, words ...string) {
	t.Helper()
	l, ok := lines[name]
	if !ok {
		t.Errorf("no %q line in %v", name, lines)
		return
	}
	if !strings.HasPrefix(l, mark+" "+name+": ") {
		t.Errorf("%q: want it marked %s", l, mark)
	}
	if mark == "✘" && !strings.Contains(l, "\n  fix: ") {
		t.Errorf("%q: a failure without a fix line", l)
	}
	for _, w := range words {
		if !strings.Contains(l, w) {
			t.Errorf("%q lacks %q", l, w)
		}
	}
}

// runCheck runs `elasticd agent --check ...`, bounded.
func runCheck(t *testing.T, args ...string) (map[string]string, string, int) {
	t.Helper()
	start := time.Now()
	stdout, stderr, code := elasticd(t, []string{"CUDA_VISIBLE_DEVICES=0"}, args...)
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("agent --check took %v", took)
	}
	if code == 2 {
		t.Fatalf("exit 2 (bad flags): %s", stderr)
	}
	return checkOutput(t, stdout), stderr, code
}

// All well: the driver reachable and accepting the secret (and no host registered), the
// metadata service answering, and a CPU host's GPU lines skipped.
func TestAgentCheckAllWell(t *testing.T) {
	url, reg := checkDriver(t)
	imds := newFakeIMDS(t, "i-0abc")
	lines, stderr, code := runCheck(t, agentCheckArgs(t, sysRoot(t), "--driver", url, "--agent-secret-file", writeSecret(t),
		"--metadata", "aws", "--metadata-url", imds.srv.URL)...)
	if code != 0 {
		t.Fatalf("exit %d, want 0: %v\n%s", code, lines, stderr)
	}
	wantLine(t, lines, "NVIDIA driver", "-", "skipped: no NVIDIA GPU on this machine's PCI bus", "a CPU host")
	wantLine(t, lines, "GPUs", "-", "skipped")
	wantLine(t, lines, "GPU health", "-", "skipped")
	wantLine(t, lines, "metadata service", "✔", "IMDSv2 at "+imds.srv.URL, "instance i-0abc", "no notice now")
	wantLine(t, lines, "agent-secret", "✔", "48 bytes, mode 0600")
	wantLine(t, lines, "driver", "✔", strings.TrimPrefix(url, "http://")+" answers in", "elasticd v9.9.9, job job-check")
	wantLine(t, lines, "secret", "✔", "accepts this secret")
	wantLine(t, lines, "clock", "✔", "of the driver's")
	if len(lines) != 8 {
		t.Errorf("%d lines, want 8: %v", len(lines), lines)
	}
	if a := reg.Agents(); len(a) != 0 {
		t.Errorf("the check registered %d agents with the driver", len(a))
	}
}

// What a host gets wrong, each alone: the driver unreachable, a wrong secret, the metadata
// service failing, an NVIDIA GPU without its driver. Each fails its own line with its fix,
// leaves the others as they are, and exits 1.
func TestAgentCheckFailures(t *testing.T) {
	url, _ := checkDriver(t)
	secret := writeSecret(t)
	imds := newFakeIMDS(t, "i-0abc")
	wrong := filepath.Join(t.TempDir(), "wrong-secret")
	if err := os.WriteFile(wrong, []byte("YW5vdGhlci1zZWNyZXQtbm90LXRoZS1kcml2ZXJzLW9uZQ==\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	closed := freeAddr(t)
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "metadata service unavailable", http.StatusInternalServerError)
	}))
	t.Cleanup(failing.Close)

	for _, tc := range []struct {
		name             string
		sys              []string
		args             []string
		check, mark      string
		words            []string
		secret, metadata string // the marks of the secret and metadata lines
	}{
		{"unreachable driver", nil, []string{"--driver", "http://" + closed, "--agent-secret-file", secret, "--metadata", "aws", "--metadata-url", imds.srv.URL},
			"driver", "✘", []string{closed + " unreachable", "connection refused", "fix: start the driver", "security group"}, "-", "✔"},
		{"wrong secret", nil, []string{"--driver", url, "--agent-secret-file", wrong, "--metadata", "aws", "--metadata-url", imds.srv.URL},
			"secret", "✘", []string{"the driver refuses this secret (bad signature)", "fix: " + wrong + " must hold the driver's secret"}, "✘", "✔"},
		{"metadata failing", nil, []string{"--driver", url, "--agent-secret-file", secret, "--metadata", "aws", "--metadata-url", failing.URL},
			"metadata service", "✘", []string{"IMDSv2 token", "500", "fix: check --metadata-url", "hop limit", "--metadata none"}, "✔", "✘"},
		{"metadata unreachable", nil, []string{"--driver", url, "--agent-secret-file", secret, "--metadata", "aws", "--metadata-url", "http://" + closed},
			"metadata service", "✘", []string{"connection refused"}, "✔", "✘"},
		{"NVIDIA GPU without driver", []string{"0000:00:1e.0"}, []string{"--driver", url, "--agent-secret-file", secret, "--metadata", "none"},
			"NVIDIA driver", "✘", []string{"1 NVIDIA GPU on the PCI bus (0000:00:1e.0)", "fix: "}, "✔", "-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines, stderr, code := runCheck(t, agentCheckArgs(t, sysRoot(t, tc.sys...), tc.args...)...)
			if code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			wantLine(t, lines, tc.check, tc.mark, tc.words...)
			wantLine(t, lines, "secret", tc.secret)
			wantLine(t, lines, "metadata service", tc.metadata)
			wantLine(t, lines, "agent-secret", "✔")
			if !strings.Contains(stderr, "agent --check: ") || !strings.Contains(stderr, "checks failed") {
				t.Errorf("stderr %q does not count the failures", stderr)
			}
			if t.Failed() {
				t.Logf("output: %v", lines)
			}
		})
	}

	// The NVIDIA line says which of its failures it is: this binary's NVML missing, or no cgo.
	lines, _, _ := runCheck(t, agentCheckArgs(t, sysRoot(t, "0000:00:1e.0"), "--metadata", "none")...)
	if l := lines["NVIDIA driver"]; !strings.Contains(l, "an image without the NVIDIA driver") && !strings.Contains(l, "built without cgo") {
		t.Errorf("NVIDIA line %q names neither a missing driver nor a build without cgo", l)
	}
	// No flags at all: every line still printed, the missing ones failed with the flag to give.
	wantLine(t, lines, "driver", "✘", "no --driver given", "fix: --driver http://DRIVER_IP:29400")
	wantLine(t, lines, "agent-secret", "✘", "no --agent-secret-file given")
}

// --json: one object, ok as the exit status says, every check with its status and the
// failures with their fix; and nothing else on stdout.
func TestAgentCheckJSON(t *testing.T) {
	url, _ := checkDriver(t)
	secret := writeSecret(t)
	for _, tc := range []struct {
		name   string
		sys    []string
		ok     bool
		failed []string
	}{
		{"all well", nil, true, nil},
		{"NVIDIA GPU without driver", []string{"0000:00:1e.0", "0000:00:1f.0"}, false, []string{"NVIDIA driver"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := elasticd(t, nil, agentCheckArgs(t, sysRoot(t, tc.sys...), "--json", "--driver", url, "--agent-secret-file", secret, "--metadata", "none")...)
			var doc struct {
				OK     *bool `json:"ok"`
				Checks []struct {
					Name   string  `json:"name"`
					Status string  `json:"status"`
					Detail string  `json:"detail"`
					Fix    *string `json:"fix"`
				} `json:"checks"`
			}
			dec := json.NewDecoder(strings.NewReader(stdout))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&doc); err != nil {
				t.Fatalf("stdout is not the JSON object: %v\n%s\nstderr: %s", err, stdout, stderr)
			}
			if dec.More() {
				t.Errorf("more than one JSON value on stdout:\n%s", stdout)
			}
			if doc.OK == nil || *doc.OK != tc.ok || (code == 0) != tc.ok {
				t.Fatalf("ok %v, exit %d; want ok %v:\n%s", doc.OK, code, tc.ok, stdout)
			}
			var names, failed []string
			for _, c := range doc.Checks {
				names = append(names, c.Name)
				switch c.Status {
				case "fail":
					failed = append(failed, c.Name)
					if c.Fix == nil || *c.Fix == "" {
						t.Errorf("%s failed without a fix", c.Name)
					}
				case "ok", "skipped":
				default:
					t.Errorf("%s: status %q", c.Name, c.Status)
				}
				if c.Detail == "" {
					t.Errorf("%s: no detail", c.Name)
				}
			}
			want := []string{"NVIDIA driver", "GPUs", "GPU health", "metadata service", "agent-secret", "driver", "secret", "clock"}
			if fmt.Sprint(names) != fmt.Sprint(want) {
				t.Errorf("checks %q, want %q", names, want)
			}
			if fmt.Sprint(failed) != fmt.Sprint(tc.failed) {
				t.Errorf("failed %q, want %q", failed, tc.failed)
			}
		})
	}
}

// Flags the agent would refuse exit 2 with one line naming the flag, and check nothing.
func TestAgentCheckUsageErrors(t *testing.T) {
	secret := writeSecret(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"agent", "--check", "--metadata", "oracle"}, `--metadata: "oracle": use auto, aws, gcp, azure or none`},
		{[]string{"agent", "--check", "--slots", "-1"}, "--slots: -1: must not be negative"},
		{[]string{"agent", "--check", "--metadata", "aws", "--metadata-url", "169.254.169.254"}, "--metadata-url: "},
		{[]string{"agent", "--check", "--metadata", "none", "--metadata-url", "http://127.0.0.1:1"}, "--metadata-url: given with --metadata none"},
		{[]string{"agent", "--check", "now"}, `unexpected argument "now"`},
		{[]string{"agent", "--check", "--slots", "many"}, "--slots"},
		{[]string{"agent", "--json", "--driver", "http://127.0.0.1:1", "--agent-secret-file", secret}, "--json: only with --check"},
	} {
		stdout, stderr, code := elasticd(t, nil, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("elasticd %v: exit %d, stderr %q; want exit 2 and %q", tc.args, code, stderr, tc.want)
		}
		if strings.Contains(stdout, "✔") || strings.Contains(stdout, "✘") {
			t.Errorf("elasticd %v checked with bad flags:\n%s", tc.args, stdout)
		}
	}
}

func TestAgentCheckHelp(t *testing.T) {
	stdout, _, code := elasticd(t, nil, "agent", "--help")
	for _, want := range []string{"--check", "--json", "elasticd agent --check --driver", "/var/log/elasticd-agent-check.log", "Exit status: 0 no check failed, 1 a check failed"} {
		if code != 0 || !strings.Contains(stdout, want) {
			t.Errorf("agent --help lacks %q (exit %d)", want, code)
		}
	}
	for _, hidden := range []string{"--sys-root", "--nvml-library"} {
		if strings.Contains(stdout, hidden) {
			t.Errorf("agent --help shows the test seam %s", hidden)
		}
	}
}
