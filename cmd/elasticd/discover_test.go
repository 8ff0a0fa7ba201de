package main_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestDiscoverPrintsScriptLinesAndJSON(t *testing.T) {
	out, stderr, code := elasticd(t, nil, "discover", "-H", "gpu2:4,gpu1,[::1]:2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if got, want := out, "::1:2\ngpu1:1\ngpu2:4\n"; got != want {
		t.Fatalf("lines %q, want %q", got, want)
	}
	out, _, _ = elasticd(t, nil, "discover", "--provider", "local", "--slots-per-host", "2", "--json")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 JSON lines:\n%s", out)
	}
	var h map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &h); err != nil || h["id"] != "local-0" || h["addr"] != "127.0.0.1" || h["slots"] != 1.0 {
		t.Fatalf("%q: %v %v", lines[0], h, err)
	}
}

func TestDiscoverErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"discover", "--provider", "nope"}, 2, `--provider: "nope": use one of local, fixed, script`},
		{[]string{"discover", "--provider", "fixed"}, 2, "--hosts"},
		{[]string{"discover", "--host-discovery-script", "/nonexistent"}, 2, "not an executable file"},
	} {
		_, stderr, code := elasticd(t, nil, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d %q, want exit %d mentioning %q", tc.args, code, stderr, tc.code, tc.want)
		}
	}
	script := filepath.Join(t.TempDir(), "d.sh")
	os.WriteFile(script, []byte("#!/bin/sh\necho 'bad line here'\n"), 0o755)
	_, stderr, code := elasticd(t, nil, "discover", "--host-discovery-script", script)
	if code != 1 || !strings.Contains(stderr, "bad line here") {
		t.Errorf("bad script output: exit %d %q", code, stderr)
	}
}

// --watch prints each change of the host set until interrupted.
func TestDiscoverWatch(t *testing.T) {
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts")
	os.WriteFile(hosts, []byte("10.0.0.1:2\n"), 0o644)
	script := filepath.Join(dir, "d.sh")
	os.WriteFile(script, []byte("#!/bin/sh\ncat "+hosts+"\n"), 0o755)
	j := startJob(t, "discover", "--host-discovery-script", script, "--watch", "--discovery-interval", "100ms")
	j.waitFor(`\+ 10\.0\.0\.1 10\.0\.0\.1:2`, 20*time.Second)
	os.WriteFile(hosts, []byte("10.0.0.2:1\n"), 0o644)
	j.waitFor(`\+ 10\.0\.0\.2 10\.0\.0\.2:1`, 20*time.Second)
	j.waitFor(`- 10\.0\.0\.1 10\.0\.0\.1`, 20*time.Second)
	syscall.Kill(j.cmd.Process.Pid, syscall.SIGINT)
	if code := j.wait(10 * time.Second); code != 0 {
		t.Fatalf("exit %d after SIGINT", code)
	}
}
