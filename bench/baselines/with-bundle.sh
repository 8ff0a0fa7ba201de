#!/usr/bin/env bash
# Runs a command with the Open MPI of a bundle (bundle.sh) in place of the machine's own, in
# a private mount namespace: the command sees the same Open MPI as the machine the bundle came
# from, and nothing on the machine changes: the empty files and folders made as mount points
# where it had none are removed when the command ends. For a machine that has an Open MPI of its own
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
# Mount points the inner shell makes where the machine had nothing, one path a line: removed
# once the command has ended (files left empty, then folders left empty, deepest first).
made=$(mktemp)
unmake() {
  local p
  while read -r p; do
    if [[ -f "$p" && ! -s "$p" ]]; then rm -f -- "$p"; fi
  done <"$made"
  while read -r p; do
    if [[ -d "$p" ]]; then rmdir -- "$p" 2>/dev/null || true; fi
  done < <(awk '{ print length($0) "\t" $0 }' "$made" | sort -rn | cut -f2-)
  rm -f -- "$made"
  rm -rf -- "$root"
}
trap unmake EXIT
tar -C "$root" -xf "$bundle"
# shellcheck disable=SC2016 # expanded by the inner shell
unshare -m --propagation private -- bash -euo pipefail -c '
root=$1 made=$2
shift 2
# mkdirs makes a folder and its missing parents, and notes every one it made.
mkdirs() {
  local d=$1
  while [[ ! -e "$d" ]]; do
    echo "$d" >>"$made"
    d=$(dirname "$d")
  done
  mkdir -p "$1"
}
for d in usr/lib/x86_64-linux-gnu/openmpi usr/lib/x86_64-linux-gnu/pmix2 usr/share/openmpi etc/openmpi; do
  [[ -d "$root/$d" ]] || continue
  mkdirs "/$d"
  mount --bind "$root/$d" "/$d"
done
(cd "$root" && for top in usr etc; do if [[ -d "$top" ]]; then find "$top" -type f -o -type l; fi; done) | while read -r f; do
  case "$f" in
    usr/lib/x86_64-linux-gnu/openmpi/* | usr/lib/x86_64-linux-gnu/pmix2/* | usr/share/openmpi/* | etc/openmpi/*) continue ;;
  esac
  src=$(readlink -f "$root/$f")
  [[ -f "$src" ]] || continue
  # The machine'"'"'s file of that path, through its links: a link of the machine'"'"'s can point
  # into a folder mounted above (to a version of a library the bundle does not have).
  dst=$(readlink -m "/$f")
  if [[ ! -e "$dst" ]]; then
    mkdirs "$(dirname "$dst")"
    echo "$dst" >>"$made"
    : >"$dst"
  fi
  mount --bind "$src" "$dst"
done
mkdirs /opt/elasticd-baselines
mount --bind "$root/opt/elasticd-baselines" /opt/elasticd-baselines
export PATH="/opt/elasticd-baselines/bin:$PATH"
exec "$@"
' with-bundle "$root" "$made" "$@"
