package main_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/elasticd/elasticd/driver/launch/sshdtest"
)

// The whole job through a real OpenSSH sshd: workers on two "hosts" (127.0.0.2 and
// 127.0.0.3), one of them killed mid-training; the job continues on the rest and succeeds.
func TestRunOverSSH(t *testing.T) {
	sshd := sshdtest.Start(t)
	hosts := sshdtest.Hosts[0] + ":2," + sshdtest.Hosts[1] + ":1"
	args := append([]string{"run", "-np", "3", "--min-np", "2", "-H", hosts, "--launcher", "ssh",
		"--ssh-port", strconv.Itoa(sshd.Port), "--ssh-identity-file", sshd.Key, "--driver-addr", "127.0.0.1"},
		trainArgs("--steps", "300", "--step-delay", "5ms", "--die-at-step", "50", "--die-rank", "2")...)
	j := startJob(t, args...)
	if code := j.wait(2 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out := j.output()
	gens := generations(out)
	if len(gens) != 2 || gens[0] != [2]int{3, 0} || gens[1] != [2]int{2, 50} {
		t.Fatalf("generations (size, resumed at) %v, want (3,0) (2,50)", gens)
	}
	for _, w := range []string{"127.0.0.2/0", "127.0.0.2/1", "127.0.0.3/0"} {
		if !strings.Contains(out, "worker="+w) {
			t.Errorf("no worker %s launched", w)
		}
	}
	if !strings.Contains(out, "test accuracy") {
		t.Error("no final accuracy")
	}
}

// An Elastic Horovod script over ssh, on hosts where nothing of elasticd was installed: the
// launcher carries the Python package through the session (python.RemoteInstall) and puts it
// on the worker's PYTHONPATH, and the job trains in-process on two "hosts".
func TestRunPyTorchOverSSHWithoutInstalling(t *testing.T) {
	py := torchPython(t)
	sshd := sshdtest.Start(t)
	hosts := sshdtest.Hosts[0] + ":1," + sshdtest.Hosts[1] + ":1"
	// The ssh launcher sends the job's environment only: gloo's interface comes with the command.
	script := "export GLOO_SOCKET_IFNAME=lo; exec " + py + " " + repoPath(t, "examples/pytorch/elastic_hvd.py") +
		" --epochs 1 --samples 256 --batch-size 16 --hidden 32"
	j := startJob(t, "run", "-np", "2", "-H", hosts, "--launcher", "ssh", "--ssh-port", strconv.Itoa(sshd.Port),
		"--ssh-identity-file", sshd.Key, "--driver-addr", "127.0.0.1", "--", "/bin/sh", "-c", script)
	if code := j.wait(2 * time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out := j.output()
	if !strings.Contains(out, "[0] done step 8") || !strings.Contains(out, "world=2") {
		t.Fatal("the job did not train to its last step on both hosts")
	}
}
