#!/usr/bin/env bash
# Installs what `go test ./...` needs beyond Go on a fresh Debian machine, and nothing when it is
# all there already (safe to run before every test run):
#   - openssh-server (/usr/sbin/sshd) and openssh-client (ssh, ssh-keygen): driver/launch tests
#     start a real sshd on loopback and launch workers through it;
#   - util-linux (setsid): the remote launch wrapper runs each worker in its own session;
#   - iproute2 (ip): bench's cross-host test joins two network namespaces with a veth (it skips
#     without the permission); bench/baselines/run.sh's HOSTS mode uses ip and tc too;
#   - gcc and libc6-dev: the race detector (go test -race) and go-nvml's bindings need cgo;
#   - curl: the Terraform modules' install script is run with sh and curl against fakes of each
#     cloud's metadata service and object store (terraform/install_test.go);
#   - chromium and a font: the live page's tests load it in headless Chromium
#     (internal/browsertest; with CI set they fail rather than skip when it is missing);
#   - python3-torch and python3-pytest: the PyTorch modes' tests run real torch (gloo on
#     loopback) under Debian's interpreter, /usr/bin/python3 (a python3 earlier on PATH may
#     lack torch; no Python package index is used).
# Also creates /run/sshd, which sshd needs for privilege separation. Run as root (CI does) or
# with sudo available.
set -euo pipefail

sudo=()
if [ "$(id -u)" -ne 0 ]; then
	command -v sudo >/dev/null || { echo "install-test-deps: run as root or install sudo" >&2; exit 1; }
	sudo=(sudo)
fi

missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
{ command -v ssh && command -v ssh-keygen; } >/dev/null || missing+=(openssh-client)
command -v setsid >/dev/null || missing+=(util-linux)
command -v ip >/dev/null || missing+=(iproute2)
# go test -race needs cgo, so a C compiler and libc headers (also for go-nvml's cgo bindings).
command -v gcc >/dev/null || missing+=(gcc libc6-dev)
command -v curl >/dev/null || missing+=(curl)
[ -x /usr/bin/chromium ] || missing+=(chromium fonts-dejavu-core)
/usr/bin/python3 -c 'import torch' 2>/dev/null || missing+=(python3-torch)
/usr/bin/python3 -c 'import pytest' 2>/dev/null || missing+=(python3-pytest)

if [ ${#missing[@]} -gt 0 ]; then
	echo "install-test-deps: installing ${missing[*]}"
	"${sudo[@]}" apt-get update -q
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

"${sudo[@]}" mkdir -p /run/sshd
"${sudo[@]}" chmod 0755 /run/sshd
