#!/usr/bin/env bash
# Packs the Open MPI baseline and iproute2's ip and nstat, with every library they load, into
# one tar.xz for a machine that has no package index (the GPU machines, say), so that
# run.sh can run there with PREBUILT=1:
#
#   bench/baselines/run.sh ...                      # here, once: builds BUILD_DIR
#   bench/baselines/bundle.sh /tmp/baselines.tar.xz
#   # there, as root:
#   tar -x --skip-old-files -C / -f baselines.tar.xz && . /opt/elasticd-baselines/env.sh
#   PREBUILT=1 BUILD_DIR=/opt/elasticd-baselines/bin IMPLS="elasticd mpi mpi-shm" bench/baselines/run.sh
#
# Open MPI's own files (packages openmpi-bin, openmpi-common, libopenmpi3, libpmix2) keep their
# paths, which Open MPI looks in: --skip-old-files never overwrites a file the machine already
# has. The libraries they and ip need beyond glibc go to /opt/elasticd-baselines/lib, read only
# by the wrappers in /opt/elasticd-baselines/bin (mpirun, ip, nstat set LD_LIBRARY_PATH and
# exec the real program), so nothing else on that machine loads them. env.sh appends that bin
# to PATH: a machine's own mpirun or ip comes first.
#
# Environment: BUILD_DIR (default /tmp/elasticd-baselines) must hold mpi_allreduce;
# gloo_allreduce is taken too if it is there. Needs dpkg (Debian or Ubuntu) and xz.
set -euo pipefail

log() { echo "[bundle] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $# == 1 ]] || die "usage: bundle.sh OUT.tar.xz"
out=$1
BUILD_DIR="${BUILD_DIR:-/tmp/elasticd-baselines}"
[[ -x "$BUILD_DIR/mpi_allreduce" ]] || die "$BUILD_DIR/mpi_allreduce is missing: run bench/baselines/run.sh here first (it builds it)"
command -v xz >/dev/null || die "xz is missing (apt-get install xz-utils)"
for pkg in openmpi-bin openmpi-common libopenmpi3 libpmix2 iproute2; do
  dpkg-query -W "$pkg" >/dev/null 2>&1 || die "package $pkg is not installed (run.sh installs Open MPI's; apt-get install iproute2)"
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
dest=opt/elasticd-baselines
mkdir -p "$stage/$dest/bin" "$stage/$dest/lib" "$stage/$dest/real"

# Open MPI's files where Open MPI looks for them (manuals and docs left out).
dpkg -L openmpi-bin openmpi-common libopenmpi3 libpmix2 |
  grep -Ev '^/usr/share/(doc|man|lintian)/' | while read -r f; do
  [[ -f "$f" || -L "$f" ]] || continue
  mkdir -p "$stage$(dirname "$f")"
  cp -a "$f" "$stage$f"
done

cp "$BUILD_DIR/mpi_allreduce" "$stage/$dest/bin/"
[[ -x "$BUILD_DIR/gloo_allreduce" ]] && cp "$BUILD_DIR/gloo_allreduce" "$stage/$dest/bin/"
cp "$(command -v ip)" "$(command -v nstat)" "$stage/$dest/real/"

# Every library any of those ELF files loads, except glibc's own (the machine's is used).
{
  find "$stage" -type f -print0 | xargs -0 file -L | grep -E 'ELF .*(executable|shared object)' | cut -d: -f1
} | while read -r elf; do
  ldd "$elf" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) continue ;;
  esac
  [[ -e "$stage$lib" || -e "$stage$(readlink -f "$lib")" ]] && continue # an Open MPI file
  cp -L "$lib" "$stage/$dest/lib/"
done

wrap() { # wrap NAME REAL: NAME runs REAL with the bundle's libraries
  printf '#!/bin/sh\nLD_LIBRARY_PATH=/%s/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' "$dest" "$2" >"$stage/$dest/bin/$1"
  chmod +x "$stage/$dest/bin/$1"
}
wrap mpirun /usr/bin/orterun
wrap ip "/$dest/real/ip"
wrap nstat "/$dest/real/nstat"
printf 'export PATH="$PATH:/%s/bin"\n' "$dest" >"$stage/$dest/env.sh"

tar -C "$stage" -cJf "$out" .
log "wrote $out ($(du -h "$out" | cut -f1)): Open MPI $(dpkg-query -W -f='${Version}' openmpi-bin)," \
  "$(find "$stage/$dest/lib" -type f | wc -l) libraries, ip and nstat"
