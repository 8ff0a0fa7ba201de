package main_test

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/elasticd/elasticd/driver/launch/sshdtest"
)

type checkLine struct {
	Name, Status, Detail, Fix string
}

// checkJSON runs `elasticd check --json ARGS` and returns its lines by name and the exit code.
func checkJSON(t *testing.T, args ...string) (map[string]checkLine, int) {
	t.Helper()
	stdout, stderr, code := elasticd(t, nil, append([]string{"check", "--json"}, args...)...)
	var out struct {
		OK     bool
		Checks []checkLine
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("check --json %v: not one JSON object: %v\nstdout: %s\nstderr: %s", args, err, stdout, stderr)
	}
	if out.OK != (code == 0) {
		t.Errorf("check --json %v: ok %v with exit %d", args, out.OK, code)
	}
	byName := map[string]checkLine{}
	for _, c := range out.Checks {
		byName[c.Name] = c
	}
	return byName, code
}

// wantCheck fails unless the check name has status and its detail (or fix) contains each of
// the words.
func wantCheck(t *testing.T, cs map[string]checkLine, name, status string, words ...string) {
	t.Helper()
	c, ok := cs[name]
	if !ok {
		t.Fatalf("no check %q in %v", name, cs)
	}
	if c.Status != status {
		t.Errorf("check %q: status %s (%s; fix %s), want %s", name, c.Status, c.Detail, c.Fix, status)
	}
	for _, w := range words {
		if !strings.Contains(c.Detail+" "+c.Fix, w) {
			t.Errorf("check %q: %q (fix %q) does not say %q", name, c.Detail, c.Fix, w)
		}
	}
}

// TestCheckLocalJob: the default job on this machine checks clean, and the human form says
// so line by line.
func TestCheckLocalJob(t *testing.T) {
	cs, code := checkJSON(t, "-np", "2", "--max-np", "3", "--", trainer)
	if code != 0 {
		t.Fatalf("exit %d: %v", code, cs)
	}
	wantCheck(t, cs, "flags", "ok", "-np 2 (min 2, max 3)", "--provider local")
	wantCheck(t, cs, "hosts", "ok", "3 hosts", "3 slots for -np 2")
	wantCheck(t, cs, "command", "ok", trainer)
	wantCheck(t, cs, "listen", "ok", "127.0.0.1:0")

	stdout, _, code := elasticd(t, nil, "check", "-np", "2", "--", trainer)
	if code != 0 || !strings.Contains(stdout, "✔ flags: ") || !strings.Contains(stdout, "✔ hosts: ") {
		t.Fatalf("exit %d, output:\n%s", code, stdout)
	}
}

// TestCheckFailures: each thing a check finds wrong is one ✘ line with its fix, and exit 1
// (2 for flags that do not parse).
func TestCheckFailures(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("tiny\n"), 0o600)
	open := filepath.Join(dir, "open")
	os.WriteFile(open, []byte(strings.Repeat("s", 32)), 0o644)
	prices := filepath.Join(dir, "prices.yaml")
	os.WriteFile(prices, []byte("currency: USD\ntypes:\n  g5.xlarge: {on_demand: 1.0, spot: 0.4}\n"), 0o600)
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	t.Run("Flags", func(t *testing.T) {
		cs, code := checkJSON(t, "-np", "2", "--mode", "sometimes", "--", trainer)
		if code != 2 {
			t.Fatalf("exit %d, want 2", code)
		}
		wantCheck(t, cs, "flags", "fail", "sometimes", "--mode")
	})
	t.Run("Command", func(t *testing.T) {
		cs, code := checkJSON(t, "-np", "2", "--", filepath.Join(dir, "no-such-trainer"))
		if code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		wantCheck(t, cs, "command", "fail", "no-such-trainer")
	})
	t.Run("HostsNotThisMachine", func(t *testing.T) {
		// 192.0.2.0/24 is TEST-NET-1: never this machine, and nothing is sent to it.
		cs, code := checkJSON(t, "-np", "2", "-H", "192.0.2.10:2", "--launcher", "local", "--", trainer)
		if code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		wantCheck(t, cs, "launcher", "fail", "192.0.2.10", "--launcher agent")
	})
	t.Run("TooFewSlots", func(t *testing.T) {
		cs, code := checkJSON(t, "-np", "4", "--min-np", "3", "-H", "127.0.0.1:2", "--", trainer)
		if code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		wantCheck(t, cs, "hosts", "fail", "2 slots", "--min-np 3")
	})
	t.Run("ListenInUse", func(t *testing.T) {
		cs, code := checkJSON(t, "-np", "2", "--listen", busy.Addr().String(), "--", trainer)
		if code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		wantCheck(t, cs, "listen", "fail", "address already in use", "--listen")
	})
	t.Run("ShortSecret", func(t *testing.T) {
		// run's own reading refuses a short secret: that is the flags' failure.
		cs, code := checkJSON(t, "-np", "2", "--admin-secret-file", short, "--", trainer)
		if code != 2 {
			t.Fatalf("exit %d, want 2", code)
		}
		wantCheck(t, cs, "flags", "fail", "at least 16")
	})
	t.Run("SecretReadableByOthers", func(t *testing.T) {
		cs, code := checkJSON(t, "-np", "2", "--admin-secret-file", open, "--", trainer)
		if code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		wantCheck(t, cs, "admin-secret", "fail", "other users", "chmod 600 "+open)
	})
	t.Run("MaxCostWithoutAPrice", func(t *testing.T) {
		cs, code := checkJSON(t, "-np", "2", "--local-spot", "--prices", prices, "--max-cost", "10", "--", trainer)
		if code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		wantCheck(t, cs, "prices", "fail", "no price for local", "--max-cost", "--prices")
	})
	t.Run("OutputDirUnwritable", func(t *testing.T) {
		cs, code := checkJSON(t, "-np", "2", "--output-dir", filepath.Join(file, "out"), "--", trainer)
		if code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		wantCheck(t, cs, "output-dir", "fail", "cannot be written")
	})
	t.Run("DiscoveryScriptFails", func(t *testing.T) {
		script := filepath.Join(dir, "hosts.sh")
		os.WriteFile(script, []byte("#!/bin/sh\necho 'no hosts for you' >&2\nexit 3\n"), 0o755)
		cs, code := checkJSON(t, "-np", "2", "--host-discovery-script", script, "--", trainer)
		if code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		wantCheck(t, cs, "hosts", "fail", "no hosts for you")
	})
}

// TestCheckOverSSH starts a command on each host through a real sshd, as the job's workers
// would start; a host whose sshd is not there fails its own line.
func TestCheckOverSSH(t *testing.T) {
	sshd := sshdtest.Start(t)
	base := []string{"-np", "2", "--launcher", "ssh", "--ssh-port", strconv.Itoa(sshd.Port), "--ssh-identity-file", sshd.Key, "--driver-addr", "127.0.0.1"}
	cs, code := checkJSON(t, append(base, "-H", sshdtest.Hosts[0]+":1,"+sshdtest.Hosts[1]+":1", "--", "python3", "train.py")...)
	if code != 0 {
		t.Fatalf("exit %d: %v", code, cs)
	}
	wantCheck(t, cs, "ssh", "ok", "2 of 2 hosts")

	// 127.0.0.9 is loopback: nothing listens there on sshd's port.
	cs, code = checkJSON(t, append(base, "-H", sshdtest.Hosts[0]+":1,127.0.0.9:1", "--", "python3", "train.py")...)
	if code != 1 {
		t.Fatalf("exit %d, want 1: %v", code, cs)
	}
	wantCheck(t, cs, "ssh", "ok", "1 of 2 hosts")
	wantCheck(t, cs, "ssh 127.0.0.9", "fail", "--ssh-identity-file")
}
