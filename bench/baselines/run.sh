#!/usr/bin/env bash
# Baseline CPU allreduce measurements to compare elasticd's Go ring allreduce
# against: Gloo (C++, TCP), torch.distributed's gloo backend (TCP), Open MPI
# over TCP and Open MPI over shared memory, all on this machine, loopback only.
#
#   bench/baselines/run.sh                  # NPS="2 4", default SIZES
#   NPS="2" SIZES="4096 1048576" bench/baselines/run.sh
#
# Environment:
#   BUILD_DIR    where binaries go (default /tmp/elasticd-baselines)
#   NPS          rank counts (default "2 4")
#   SIZES        buffer sizes in bytes, multiples of 4
#                (default "4096 65536 1048576 16777216 67108864 268435456")
#   IMPLS        which to run (default "elasticd gloo torch-gloo mpi mpi-shm");
#                elasticd is ELASTICD_BIN (default bin/elasticd, built by make
#                bench-compare); torch-gloo runs torch_allreduce.py under
#                TORCH_PYTHON (default /usr/bin/python3, Debian's, with
#                python3-torch); mpi is Open MPI over TCP, mpi-shm over shared
#                memory (the vader BTL)
#   ROUNDS       how many times to run every (impl, NP), interleaved, so that
#                medians over rounds compare side by side (default 1)
#   RUN_TIMEOUT  seconds allowed per (impl, NP) run (default 300)
#   ISOLATE_NET  auto|1|0: run each benchmark inside a fresh network namespace
#                that only has loopback (unshare --net), so nothing can bind or
#                connect to a non-loopback address. auto = if unshare works.
#   GLIBC_TUNABLES  given to every implementation (Open MPI's ranks through
#                mpirun -x); default: glibc keeps freed buffers of up to 256 MiB
#                instead of unmapping them, so that a library that allocates a
#                temporary buffer per call (Open MPI does above 32 MiB) is not
#                measured page-faulting it in every time; GLIBC_TUNABLES= (empty)
#                measures the libraries as glibc's defaults leave them
#
# stdout: one JSON object per (impl, ranks, size); everything else -> stderr.
# Exit status is non-zero if installing, building or any run fails.
set -euo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
HERE="$(dirname "$SELF")"

log() { echo "[baselines] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Open MPI flags: ob1 PML (never UCX or the cm/ofi/psm MTLs, which would pick
# their own transports), the runtime's out-of-band channel restricted to
# loopback, and no binding, so MPI ranks are scheduled like the gloo (and Go)
# processes. Then the BTLs:
#   mpi:     only tcp and self (so vader/sm is never loaded), TCP restricted to
#            loopback IPv4;
#   mpi-shm: only vader (shared memory; Open MPI 4.1's name for the sm BTL,
#            single copies through CMA) and self.
MPI_FLAGS=(
  --allow-run-as-root --oversubscribe --bind-to none
  --mca pml ob1
  --mca oob_tcp_if_include lo
  -x GLIBC_TUNABLES
)
MPI_TCP_FLAGS=(
  --mca btl tcp,self
  --mca btl_tcp_if_include lo
  --mca btl_tcp_disable_family 6
)
MPI_SHM_FLAGS=(
  --mca btl vader,self
)

# Seconds a torch-gloo rank waits in its rendezvous or in one collective before
# failing (gloo_allreduce.cc sets the same on its gloo context).
TORCH_TIMEOUT=120

# ---------------------------------------------------------------------------
# Inner mode: runs one (impl, NP) benchmark, possibly inside the namespace.
#   run.sh --inner gloo|torch-gloo NP STORE_DIR SIZE...
#   run.sh --inner elasticd|mpi|mpi-shm NP SIZE...
# ---------------------------------------------------------------------------
inner() {
  local impl=$1 np=$2
  shift 2
  : "${BUILD_DIR:?}" "${RUN_TIMEOUT:?}"
  if [[ "${ELASTICD_NETNS:-0}" == 1 ]]; then
    ip link set lo up
  fi
  case "$impl" in
    gloo | torch-gloo)
      # One process per rank, started and (on failure) stopped by PID.
      local store=$1
      shift
      local -a rank_cmd=("$BUILD_DIR/gloo_allreduce")
      if [[ "$impl" == torch-gloo ]]; then
        rank_cmd=("${TORCH_PYTHON:?}" "$HERE/torch_allreduce.py" --timeout "$TORCH_TIMEOUT")
      fi
      local -a pids=()
      local p
      kill_ranks() {
        for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
      }
      trap 'kill_ranks; exit 143' TERM INT HUP
      local r
      for ((r = 0; r < np; r++)); do
        if ((r == 0)); then
          timeout -k 10 "$RUN_TIMEOUT" "${rank_cmd[@]}" \
            --rank "$r" --world "$np" --store "$store" "$@" &
        else
          timeout -k 10 "$RUN_TIMEOUT" "${rank_cmd[@]}" \
            --rank "$r" --world "$np" --store "$store" "$@" >&2 &
        fi
        pids+=("$!")
      done
      # Reap ranks as they finish; on the first failure stop the others.
      local left=$np finished rc
      local -a running=("${pids[@]}")
      while ((left > 0)); do
        rc=0
        finished=
        wait -n -p finished "${running[@]}" || rc=$?
        [[ -n "$finished" ]] || { log "wait -n returned no pid"; kill_ranks; return 1; }
        left=$((left - 1))
        local -a still=()
        for p in "${running[@]}"; do [[ "$p" == "$finished" ]] || still+=("$p"); done
        running=("${still[@]}")
        if ((rc != 0)); then
          log "$impl rank process $finished failed (exit $rc); stopping the others"
          kill_ranks
          wait || true
          return 1
        fi
      done
      trap - TERM INT HUP
      ;;
    elasticd | elasticd-tcp)
      # elasticd: as it runs by default, ranks on one host over shared memory; elasticd-tcp:
      # with shared memory off, over loopback TCP like the TCP baselines.
      local csv transport=auto
      csv=$(IFS=,; echo "$*")
      [[ "$impl" == elasticd-tcp ]] && transport=tcp
      timeout -k 10 "$RUN_TIMEOUT" "$ELASTICD_BIN" bench allreduce --np "$np" --sizes "$csv" \
        --transport "$transport" --json --no-baseline | sed "s/^{/{\"impl\":\"$impl\",/"
      ;;
    mpi)
      # mpirun forwards rank 0's stdout to ours and forwards TERM to ranks.
      exec timeout -k 10 "$RUN_TIMEOUT" mpirun "${MPI_FLAGS[@]}" "${MPI_TCP_FLAGS[@]}" \
        -np "$np" "$BUILD_DIR/mpi_allreduce" "$@"
      ;;
    mpi-shm)
      exec timeout -k 10 "$RUN_TIMEOUT" mpirun "${MPI_FLAGS[@]}" "${MPI_SHM_FLAGS[@]}" \
        -np "$np" "$BUILD_DIR/mpi_allreduce" --impl mpi-shm "$@"
      ;;
    *) die "unknown impl $impl" ;;
  esac
}

if [[ "${1:-}" == "--inner" ]]; then
  shift
  inner "$@"
  exit $?
fi

# ---------------------------------------------------------------------------
# Main mode.
# ---------------------------------------------------------------------------
export BUILD_DIR="${BUILD_DIR:-/tmp/elasticd-baselines}"
export RUN_TIMEOUT="${RUN_TIMEOUT:-300}"
export GLIBC_TUNABLES="${GLIBC_TUNABLES-glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824}"
log "GLIBC_TUNABLES=${GLIBC_TUNABLES:-(empty: the glibc defaults)}"
NPS="${NPS:-2 4}"
SIZES="${SIZES:-4096 65536 1048576 16777216 67108864 268435456}"
IMPLS="${IMPLS:-elasticd elasticd-tcp gloo torch-gloo mpi mpi-shm}"
export TORCH_PYTHON="${TORCH_PYTHON:-/usr/bin/python3}"
ROUNDS="${ROUNDS:-1}"
export ELASTICD_BIN="${ELASTICD_BIN:-$HERE/../../bin/elasticd}"
ISOLATE_NET="${ISOLATE_NET:-auto}"
read -r -a np_list <<<"$NPS"
read -r -a size_list <<<"$SIZES"
read -r -a impl_list <<<"$IMPLS"
((${#np_list[@]} > 0)) || die "NPS is empty"
((${#size_list[@]} > 0)) || die "SIZES is empty"
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer"
for s in "${size_list[@]}"; do
  [[ "$s" =~ ^[0-9]+$ ]] && ((s > 0 && s % 4 == 0)) || die "bad size '$s' (positive multiple of 4)"
done
for n in "${np_list[@]}"; do
  [[ "$n" =~ ^[0-9]+$ ]] && ((n >= 2)) || die "bad rank count '$n' (>= 2)"
done
for impl in "${impl_list[@]}"; do
  case "$impl" in
    gloo | mpi | mpi-shm) ;;
    elasticd | elasticd-tcp) [[ -x "$ELASTICD_BIN" ]] || die "$ELASTICD_BIN is not built (make build)" ;;
    torch-gloo)
      # Not installed here: python3-torch is large, and another interpreter may be meant.
      torch_err=$("$TORCH_PYTHON" -c 'import torch, torch.distributed as d
assert d.is_available() and d.is_gloo_available(), "torch.distributed without gloo"
print(torch.__version__)' 2>&1) ||
        die "torch-gloo needs torch with torch.distributed and gloo, and TORCH_PYTHON=$TORCH_PYTHON" \
          "does not have it ($(tail -n 1 <<<"$torch_err")). Install Debian's python3-torch" \
          "(apt-get install python3-torch) for /usr/bin/python3, set TORCH_PYTHON to an" \
          "interpreter that imports torch, or leave torch-gloo out of IMPLS"
      log "torch-gloo: $TORCH_PYTHON, torch $torch_err"
      ;;
    *) die "unknown impl '$impl' in IMPLS" ;;
  esac
done

# --- install what is missing ------------------------------------------------
pkg_installed() {
  [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}
missing=()
for pkg in libgloo-dev openmpi-bin libopenmpi-dev; do
  pkg_installed "$pkg" || missing+=("$pkg")
done
command -v g++ >/dev/null || missing+=(g++)
command -v timeout >/dev/null || missing+=(coreutils)
if ((${#missing[@]} > 0)); then
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update >&2
  apt-get install -y --no-install-recommends "${missing[@]}" >&2
fi
log "libgloo-dev $(dpkg-query -W -f='${Version}' libgloo-dev)," \
  "libopenmpi-dev $(dpkg-query -W -f='${Version}' libopenmpi-dev)," \
  "openmpi-bin $(dpkg-query -W -f='${Version}' openmpi-bin)"

# --- build ------------------------------------------------------------------
mkdir -p "$BUILD_DIR"
log "building into $BUILD_DIR"
g++ -O2 -std=c++17 -Wall -Wextra -o "$BUILD_DIR/gloo_allreduce" \
  "$HERE/gloo_allreduce.cc" -lgloo -pthread >&2
mpicc -O2 -std=c11 -Wall -Wextra -o "$BUILD_DIR/mpi_allreduce" \
  "$HERE/mpi_allreduce.c" >&2

# --- network isolation ------------------------------------------------------
netns=0
case "$ISOLATE_NET" in
  0) ;;
  1 | auto)
    if command -v unshare >/dev/null && command -v ip >/dev/null &&
      unshare --net -- ip link set lo up 2>/dev/null; then
      netns=1
    elif [[ "$ISOLATE_NET" == 1 ]]; then
      die "ISOLATE_NET=1 but 'unshare --net' does not work here"
    else
      log "note: unshare --net unavailable; relying on loopback-only flags"
    fi
    ;;
  *) die "ISOLATE_NET must be auto, 1 or 0" ;;
esac
log "network namespace isolation: $([[ $netns == 1 ]] && echo on || echo off)"

# --- run ----------------------------------------------------------------------
work="$(mktemp -d "${TMPDIR:-/tmp}/elasticd-baselines-run.XXXXXX")"
trap 'rm -rf "$work"' EXIT

run_one() {
  local impl=$1 np=$2
  local out="$work/$impl-$np.out"
  local -a cmd=(bash "$SELF" --inner "$impl" "$np")
  if [[ "$impl" == gloo || "$impl" == torch-gloo ]]; then
    local store="$work/store-$np"
    rm -rf "$store"
    mkdir -p "$store"
    cmd+=("$store")
  fi
  cmd+=("${size_list[@]}")
  if ((netns)); then
    cmd=(unshare --net -- env ELASTICD_NETNS=1 "${cmd[@]}")
  fi
  log "running $impl with $np ranks: sizes ${size_list[*]}"
  local rc=0 start=$SECONDS
  # Backstop: the inner runner bounds each rank with RUN_TIMEOUT itself.
  timeout -k 10 "$((RUN_TIMEOUT + 30))" "${cmd[@]}" >"$out" || rc=$?
  local lines
  lines=$(grep -c '^{"impl":' "$out" || true)
  if ((rc != 0)); then
    cat "$out" >&2
    die "$impl np=$np failed (exit $rc; 124/137 = timed out after ${RUN_TIMEOUT}s)"
  fi
  if ((lines != ${#size_list[@]})); then
    cat "$out" >&2
    die "$impl np=$np printed $lines result lines, expected ${#size_list[@]}"
  fi
  grep -v '^{"impl":' "$out" >&2 || true
  grep '^{"impl":' "$out"
  log "$impl np=$np done in $((SECONDS - start))s"
}

for ((round = 1; round <= ROUNDS; round++)); do
  for np in "${np_list[@]}"; do
    for impl in "${impl_list[@]}"; do
      run_one "$impl" "$np"
    done
  done
done
