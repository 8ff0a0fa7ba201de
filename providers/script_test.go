//go:build linux

package providers_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/elasticd/elasticd/providers"
	"github.com/elasticd/elasticd/providers/providertest"
)

// writeScript writes an executable shell script into a fresh directory and returns its path.
func writeScript(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "discover.sh")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestScriptConformance(t *testing.T) {
	providertest.Run(t, providertest.Harness{NewGroup: func(t *testing.T) providertest.Group {
		// The script lists the hosts file beside it; marker files make it fail or stall.
		path := writeScript(t, `d=$(dirname "$0")
if [ -e "$d/fail" ]; then echo "told to fail" >&2; exit 3; fi
if [ -e "$d/stall" ]; then sleep 60; fi
cat "$d/hosts"
`)
		dir := filepath.Dir(path)
		write := func(t *testing.T, name, content string) {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write(t, "hosts", "gpu-1:4\ngpu-2\n")
		return providertest.Group{
			Provider: providers.NewScript(path, 2, 10*time.Second),
			Want: []providers.Host{
				{ID: "gpu-1", Addr: "gpu-1", Slots: 4},
				{ID: "gpu-2", Addr: "gpu-2", Slots: 2},
			},
			Change: func(t *testing.T) []providers.Host {
				write(t, "hosts", "gpu-2:8\ngpu-3\n")
				return []providers.Host{
					{ID: "gpu-2", Addr: "gpu-2", Slots: 8},
					{ID: "gpu-3", Addr: "gpu-3", Slots: 2},
				}
			},
			Fail:  func(t *testing.T) { write(t, "fail", "") },
			Stall: func(t *testing.T) { write(t, "stall", "") },
		}
	}})
}

func TestScriptOutput(t *testing.T) {
	h := func(id string, slots int) providers.Host { return providers.Host{ID: id, Addr: id, Slots: slots} }
	tests := []struct {
		name, out string
		want      []providers.Host
	}{
		{"plain", "a:2\nb\n", []providers.Host{h("a", 2), h("b", 1)}},
		{"no final newline", "a:2\nb", []providers.Host{h("a", 2), h("b", 1)}},
		{"empty group", "", nil},
		{"only comments", "# nothing running\n\n", nil},
		{"comments blanks whitespace", "# group gpu\n\n  a:2  \n\t\nb # on-demand\n   # indented comment\n", []providers.Host{h("a", 2), h("b", 1)}},
		{"CRLF", "a:2\r\nb\r\n", []providers.Host{h("a", 2), h("b", 1)}},
		{"exact duplicates", "a:2\nb\na:2\nb\nb:1\n", []providers.Host{h("a", 2), h("b", 1)}},
		{"same host two spellings", "Gpu-A:2\ngpu-a:2\n[::1]\n[0::1]:1\n", []providers.Host{h("gpu-a", 2), h("::1", 1)}},
		{"output order kept", "c\na\nb\n", []providers.Host{h("c", 1), h("a", 1), h("b", 1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			if err := os.WriteFile(out, []byte(tt.out), 0o644); err != nil {
				t.Fatal(err)
			}
			p := providers.NewScript(writeScript(t, "cat "+out+"\n"), 1, 5*time.Second)
			got, err := p.Hosts(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("hosts %v; want %v", got, tt.want)
			}
		})
	}
}

func TestScriptMalformedOutput(t *testing.T) {
	tests := []struct{ name, out, want string }{
		{"bad slots", "a:2\n\nb:x\n", `line 3 "b:x": slots "x" is not a positive integer`},
		{"zero slots", "a:0\n", `line 1 "a:0": slots 0`},
		{"unbracketed IPv6", "# c\nfd00::1:2\n", `line 2 "fd00::1:2": an IPv6 address must be in brackets`},
		{"two words", "a b\n", `line 1 "a b": host "a b" contains ' '`},
		{"host with port-like junk", "a:2:3\n", `line 1 "a:2:3"`},
		{"conflicting slots", "a:2\nb\na:4\n", `line 3 "a:4": host a has 4 slots here but 2 on line 1`},
		{"conflict through default", "a\na:2\n", `line 2 "a:2": host a has 2 slots here but 1 on line 1`},
		{"long line clipped", strings.Repeat("x", 300) + "/\n", "…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			if err := os.WriteFile(out, []byte(tt.out), 0o644); err != nil {
				t.Fatal(err)
			}
			path := writeScript(t, "cat "+out+"\n")
			got, err := providers.NewScript(path, 1, 5*time.Second).Hosts(t.Context())
			if err == nil {
				t.Fatalf("hosts %v, no error; want one containing %q", got, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), path) {
				t.Errorf("error:\n %v\nwant it to name the script and contain %q", err, tt.want)
			}
		})
	}
}

func TestScriptExitStatus(t *testing.T) {
	// Only the last few lines of stderr are kept; stdout of a failed run is not used.
	path := writeScript(t, `echo a:1
for i in 1 2 3 4 5 6 7 8 9 10; do echo "complaint $i" >&2; done
exit 3
`)
	start := time.Now()
	_, err := providers.NewScript(path, 1, 5*time.Second).Hosts(t.Context())
	if err == nil {
		t.Fatal("no error from a script that exits 3")
	}
	msg := err.Error()
	for _, want := range []string{path, "exit status 3", "complaint 6 | complaint 7 | complaint 8 | complaint 9 | complaint 10"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not contain %q", msg, want)
		}
	}
	if strings.Contains(msg, "complaint 5") {
		t.Errorf("error %q keeps more than the last five lines of stderr", msg)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("took %v", took)
	}
}

func TestScriptHugeStderrTail(t *testing.T) {
	path := writeScript(t, `yes "noise noise noise" | head -n 200000 >&2; echo "the real reason" >&2; exit 1`)
	_, err := providers.NewScript(path, 1, 5*time.Second).Hosts(t.Context())
	if err == nil || !strings.Contains(err.Error(), "exit status 1") || !strings.HasSuffix(err.Error(), "| the real reason") {
		t.Fatalf("error %v; want the exit status and the last stderr line at its end", err)
	}
	if len(err.Error()) > 2000 {
		t.Errorf("error is %d bytes long", len(err.Error()))
	}
}

func TestScriptCannotStart(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "plain.sh")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\necho a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "missing.sh"), notExec, dir} {
		_, err := providers.NewScript(path, 1, time.Second).Hosts(t.Context())
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "start") {
			t.Errorf("script %s: error %v; want a start error naming it", path, err)
		}
	}
}

// TestScriptTimeoutKillsGroup: a script that hangs, having started a child that sleeps too,
// is killed with its whole process group at the timeout, and nothing it started survives.
func TestScriptTimeoutKillsGroup(t *testing.T) {
	tests := []struct{ name, body string }{
		{"script sleeps", `echo $$ > "$d/pids"; echo a:1; sleep 30`},
		{"grandchild sleeps", `echo $$ > "$d/pids"; sleep 30 & echo $! >> "$d/pids"; wait`},
		{"grandchild ignores TERM", `echo $$ > "$d/pids"; sh -c 'trap "" TERM; sleep 30' & echo $! >> "$d/pids"; wait`},
		{"stdout closed, then hangs", `echo $$ > "$d/pids"; exec >&-; sleep 30`},
		{"endless stderr", `echo $$ > "$d/pids"; yes "still thinking" >&2`},
	}
	const timeout = 300 * time.Millisecond
	for _, tt := range tests {
		// Written before any subtest runs: writing an executable while another goroutine
		// forks can make exec fail with "text file busy" (golang/go#22315).
		path := writeScript(t, "d=$(dirname \"$0\")\n"+tt.body+"\n")
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			hosts, err := providers.NewScript(path, 1, timeout).Hosts(t.Context())
			took := time.Since(start)
			if err == nil {
				t.Fatalf("hosts %v, no error from a script that hangs", hosts)
			}
			if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer within 300ms") {
				t.Errorf("error %v; want a timeout that wraps context.DeadlineExceeded", err)
			}
			if took < timeout || took > timeout+time.Second {
				t.Errorf("returned after %v; want the timeout %v plus a little", took, timeout)
			}
			assertAllDead(t, filepath.Join(filepath.Dir(path), "pids"))
		})
	}
}

// TestScriptKillsStragglers: when the script exits, what it left in its group is killed too.
func TestScriptKillsStragglers(t *testing.T) {
	path := writeScript(t, `d=$(dirname "$0")
sleep 30 >/dev/null 2>&1 &
echo $! > "$d/pids"
echo a:2
`)
	hosts, err := providers.NewScript(path, 1, 5*time.Second).Hosts(t.Context())
	if err != nil || len(hosts) != 1 || hosts[0].Slots != 2 {
		t.Fatalf("hosts %v, %v; want a:2", hosts, err)
	}
	assertAllDead(t, filepath.Join(filepath.Dir(path), "pids"))
}

// TestScriptCancel: a poll cancelled by its caller ends the script and its group at once.
func TestScriptCancel(t *testing.T) {
	path := writeScript(t, `d=$(dirname "$0"); echo $$ > "$d/pids"; sleep 30 & echo $! >> "$d/pids"; wait`)
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := providers.NewScript(path, 1, 10*time.Second).Hosts(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v; want one wrapping context.Canceled", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("returned %v after the start, cancelled after 100ms", took)
	}
	assertAllDead(t, filepath.Join(filepath.Dir(path), "pids"))
}

// TestScriptEscapedChild: a child that leaves the group (setsid) and keeps stdout open cannot
// be killed by group, but it cannot hold the poll either.
func TestScriptEscapedChild(t *testing.T) {
	path := writeScript(t, `export d=$(dirname "$0")
setsid sh -c 'echo $$ > "$d/pids"; exec sleep 30' &
while [ ! -s "$d/pids" ]; do sleep 0.01; done
echo a
`)
	pids := filepath.Join(filepath.Dir(path), "pids")
	t.Cleanup(func() { killPIDs(t, pids) })
	start := time.Now()
	_, err := providers.NewScript(path, 1, 5*time.Second).Hosts(t.Context())
	if err == nil || !strings.Contains(err.Error(), "left its process group") {
		t.Errorf("error %v; want one saying a process left the group holding the output", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("returned after %v", took)
	}
}

func TestScriptOutputBounded(t *testing.T) {
	tests := []struct{ name, body string }{
		{"endless", `echo $$ > "$d/pids"; yes a:1`},
		{"just over 1 MiB", `echo $$ > "$d/pids"; head -c 1048577 /dev/zero | tr '\0' '\n'`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeScript(t, "d=$(dirname \"$0\")\n"+tt.body+"\n")
			start := time.Now()
			_, err := providers.NewScript(path, 1, 10*time.Second).Hosts(t.Context())
			if err == nil || !strings.Contains(err.Error(), "output is longer than 1048576 bytes") {
				t.Errorf("error %v; want one about the output's length", err)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("took %v", took)
			}
			assertAllDead(t, filepath.Join(filepath.Dir(path), "pids"))
		})
	}
	// Exactly 1 MiB of blank lines is read in full.
	path := writeScript(t, `head -c 1048575 /dev/zero | tr '\0' '\n'; printf a`)
	hosts, err := providers.NewScript(path, 1, 10*time.Second).Hosts(t.Context())
	if err != nil || len(hosts) != 1 {
		t.Errorf("1 MiB of output: hosts %v, %v; want host a", hosts, err)
	}
}

func TestScriptDefaultSlotsChecked(t *testing.T) {
	path := writeScript(t, "echo a\n")
	if _, err := providers.NewScript(path, 0, time.Second).Hosts(t.Context()); err == nil || !strings.Contains(err.Error(), "default slots") {
		t.Errorf("error %v; want one about default slots", err)
	}
}

// assertAllDead reads the PIDs a script wrote and checks that each process is gone (or a
// zombie: killed, and not yet reaped by an init that may never reap it), waiting up to a
// second for SIGKILL to land.
func assertAllDead(t *testing.T, pidFile string) {
	t.Helper()
	pids := readPIDs(t, pidFile)
	deadline := time.Now().Add(time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Errorf("process %d that the script started is still running", pid)
				syscallKill(pid)
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

func readPIDs(t *testing.T, pidFile string) []int {
	t.Helper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the script did not record its PIDs: %v", err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("PID file %q: %v", b, err)
		}
		pids = append(pids, pid)
	}
	if len(pids) == 0 {
		t.Fatal("the script recorded no PIDs")
	}
	return pids
}

func killPIDs(t *testing.T, pidFile string) {
	b, _ := os.ReadFile(pidFile)
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && alive(pid) {
			syscallKill(pid)
		}
	}
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses, which may itself hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func syscallKill(pid int) { syscall.Kill(pid, syscall.SIGKILL) }
