#!/bin/sh
# Builds the release tarballs of elasticd: one per architecture (ARCHES, default "amd64 arm64"),
# each elasticd-VERSION-linux-ARCH.tar.gz holding the binary (version and commit stamped), the
# Python package (python/), the example price file and the README, plus SHA256SUMS over them.
# The Terraform modules take a tarball's path (elasticd_release_path: they upload it and compute
# its SHA-256), or its URL once published and its line of SHA256SUMS (elasticd_release_url,
# elasticd_release_sha256). Run it as `make release`; OUT (default dist/) is where they go.
#
# The binary is built with cgo, for NVML's GPU health checks in `elasticd agent`: arm64 needs the
# cross compiler (apt-get install gcc-aarch64-linux-gnu) when this machine is not arm64.
set -eu

VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
ARCHES=${ARCHES:-amd64 arm64}
OUT=${OUT:-dist}
GO=${GO:-go}
here=$(uname -m)

mkdir -p "$OUT"
out=$(cd "$OUT" && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

for arch in $ARCHES; do
	case "$arch" in
	amd64) native=x86_64 cross=x86_64-linux-gnu-gcc ;;
	arm64) native=aarch64 cross=aarch64-linux-gnu-gcc ;;
	*)
		echo "release: ARCHES: unknown architecture '$arch' (amd64 or arm64)" >&2
		exit 2
		;;
	esac
	cc=${CC:-cc}
	if [ "$here" != "$native" ]; then
		if ! command -v "$cross" >/dev/null 2>&1; then
			echo "release: building for $arch on $here needs the C cross compiler $cross (NVML is cgo): apt-get install gcc-$(echo "$cross" | sed 's/-gcc$//'), or ARCHES=amd64" >&2
			exit 1
		fi
		cc=$cross
	fi
	name=elasticd-$VERSION-linux-$arch
	dir=$stage/$name
	mkdir -p "$dir"
	echo "release: $name"
	CGO_ENABLED=1 GOOS=linux GOARCH=$arch CC=$cc \
		"$GO" build -trimpath -buildvcs=false \
		-ldflags "-s -w -X main.version=$VERSION -X main.commit=$COMMIT" \
		-o "$dir/elasticd" ./cmd/elasticd
	cp README.md "$dir/"
	cp examples/prices.yaml "$dir/"
	mkdir -p "$dir/python"
	cp -R python/elasticd python/pyproject.toml python/README.md "$dir/python/"
	find "$dir/python" -name __pycache__ -type d -prune -exec rm -rf {} +
	# Reproducible archives: fixed owner, order and times.
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='2000-01-01 00:00Z' \
		-C "$stage" -czf "$out/$name.tar.gz" "$name"
done

(cd "$out" && sha256sum elasticd-"$VERSION"-linux-*.tar.gz >SHA256SUMS)
echo "release: $out/SHA256SUMS"
cat "$out/SHA256SUMS"
