#!/usr/bin/env bash
# Runs a command with the Open MPI of a bundle (bundle.sh) in place of the machine's own, in
# a private mount namespace: the command sees the same Open MPI as the machine the bundle came
# from, and nothing on the machine changes beyond empty files and folders made as mount points
# where it had none. For a machine that has an Open MPI of its own
# that misbehaves here (the GPU machines' 4.1.6 refused run.sh's HOSTS mode: "All nodes which
# are allocated for this job are already filled"). Needs root and unshare.
#
#   bench/baselines/with-bundle.sh baselines.tar.xz COMMAND [ARG...]
#
# The bundle is unpacked into a temporary folder; Open MPI's folders (its libraries and
# components, PMIx's, its help texts and settings) are mounted over the machine's, each of
# its other files over the file that the machine's path of the same name leads to (created
# empty where missing), then COMMAND runs with the bundle's bin (mpirun, ip, nstat wrappers) first on PATH.
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: with-bundle.sh BUNDLE.tar.xz COMMAND [ARG...]" >&2; exit 2; }
bundle=$(readlink -f "$1")
shift
[[ -r "$bundle" ]] || { echo "with-bundle.sh: cannot read $bundle" >&2; exit 1; }
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
tar -C "$root" -xf "$bundle"
# shellcheck disable=SC2016 # expanded by the inner shell
unshare -m --propagation private -- bash -euo pipefail -c '
root=$1
shift
for d in usr/lib/x86_64-linux-gnu/openmpi usr/lib/x86_64-linux-gnu/pmix2 usr/share/openmpi etc/openmpi; do
  [[ -d "$root/$d" ]] || continue
  mkdir -p "/$d"
  mount --bind "$root/$d" "/$d"
done
(cd "$root" && find usr etc -type f -o -type l) | while read -r f; do
  case "$f" in
    usr/lib/x86_64-linux-gnu/openmpi/* | usr/lib/x86_64-linux-gnu/pmix2/* | usr/share/openmpi/* | etc/openmpi/*) continue ;;
  esac
  src=$(readlink -f "$root/$f")
  [[ -f "$src" ]] || continue
  # The machine'"'"'s file of that path, through its links: a link of the machine'"'"'s can point
  # into a folder mounted above (to a version of a library the bundle does not have).
  dst=$(readlink -m "/$f")
  if [[ ! -e "$dst" ]]; then
    mkdir -p "$(dirname "$dst")"
    : >"$dst"
  fi
  mount --bind "$src" "$dst"
done
mkdir -p /opt/elasticd-baselines
mount --bind "$root/opt/elasticd-baselines" /opt/elasticd-baselines
export PATH="/opt/elasticd-baselines/bin:$PATH"
exec "$@"
' with-bundle "$root" "$@"
