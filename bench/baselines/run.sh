#!/usr/bin/env bash
# Baseline CPU allreduce measurements to compare elasticd's Go ring allreduce
# against: Gloo (C++, TCP), torch.distributed's gloo backend (TCP), Open MPI
# over TCP and Open MPI over shared memory, all on this machine, loopback only.
#
#   bench/baselines/run.sh                  # NPS="2 4", default SIZES
#   NPS="2" SIZES="4096 1048576" bench/baselines/run.sh
#   HOSTS=2 PER_HOST="1 2" bench/baselines/run.sh   # across simulated hosts
#
# Environment:
#   BUILD_DIR    where binaries go (default /tmp/elasticd-baselines)
#   KEEP_MPI_ENV 1: keep the OMPI_*, OPAL_*, ORTE_*, PMIX_* and PRTE_* variables this
#                script inherits. Default 0: they are removed (and named on stderr), so
#                that Open MPI runs as the flags below say: a machine's image can set
#                them (the GPU machines set OMPI_MCA_plm=isolated, which cannot start
#                the HOSTS mode's daemons, and btl_vader_single_copy_mechanism=none,
#                which slows mpi-shm's large messages)
#   PREBUILT     1: install and build nothing; BUILD_DIR already holds
#                mpi_allreduce (and gloo_allreduce if gloo is in IMPLS), built
#                elsewhere, and mpirun is on PATH (a machine with no package
#                index; bench/baselines/bundle.sh packs them). Default 0
#   NPS          rank counts (default "2 4")
#   SIZES        buffer sizes in bytes, multiples of 4
#                (default "4096 65536 1048576 16777216 67108864 268435456")
#   IMPLS        which to run (default "elasticd elasticd-tcp gloo torch-gloo mpi
#                mpi-shm"); elasticd is ELASTICD_BIN (default bin/elasticd, built by
#                make bench-compare) as it runs by default, elasticd-tcp with
#                --transport tcp, elasticd-rings with --direct-bytes -1 (the
#                shared-memory rings at every size), elasticd-direct with
#                --direct-bytes 1 (reading the peers' buffers above 64 KiB, where
#                2-4 ranks share a host); torch-gloo runs torch_allreduce.py under
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
#   HOSTS        0 (default): every rank on this machine, as above. N >= 2: across
#                N simulated hosts instead of NPS: N network namespaces, each
#                with one veth ("eth0", 10.X.Y.i/24) into a bridge that lives in
#                a further "switch" namespace (10.X.Y.254, where mpirun runs);
#                all created by this script with unique names and deleted on
#                exit, nothing added to this machine's own namespace. Ranks of
#                one namespace may share memory, ranks of different ones talk
#                TCP over the veths. ISOLATE_NET does not apply
#   PER_HOST     ranks per host in HOSTS mode, a list (default "1 2"); the runs
#                have HOSTS*PER_HOST ranks, filled host by host
#   HOSTS_SUBNET the /24 of the veth network, as A.B.C (default: the first of
#                10.251.{0..255} that nothing on this machine uses)
#   LINK_QDISC   a tc root qdisc put on both ends of every host's veth, to model a
#                link: e.g. "tbf rate 10gbit burst 1mb latency 1ms" (10 Gb/s each
#                way), or "netem rate 25gbit delay 25us" (a delay counts once per
#                direction) where the kernel has sch_netem; default empty: the
#                veths run as fast as the CPUs move bytes
#   HOSTS_TCP_CC TCP congestion control for every host namespace
#                (net.ipv4.tcp_congestion_control, set in each namespace, so
#                every implementation gets it), e.g. "reno"; default empty:
#                the namespaces inherit this machine's. On veth, segments of
#                one flow can arrive out of order (sent from two CPUs), and
#                BBR and CUBIC then retransmit many that were not lost
#                (docs/design-notes/allreduce-tuning.md §9.1, §10); Reno did not.
#                elasticd bounds its send buffers on veth under BBR only (§13).
#                A namespace may set only the algorithms the machine allows
#                (net.ipv4.tcp_allowed_congestion_control; root may add one
#                there, e.g. cubic where the machine's default is BBR)
#
# In HOSTS mode: elasticd runs its ranks through `elasticd bench allreduce
# --netns-hosts`; elasticd-tcp adds --transport tcp (TCP inside a host too);
# Gloo and torch-gloo ranks are started in their host's namespace, bound to
# its veth address; mpi is Open MPI with btl tcp,self and mpi-shm with btl
# vader,tcp,self (shared memory inside a host, TCP across), both launched by
# mpirun in the switch namespace through a plm_rsh_agent that runs each host's
# orted with `ip netns exec`. With PER_HOST=1, elasticd-tcp and mpi-shm are
# skipped (nothing to share memory with: they would repeat elasticd and mpi).
# The JSON lines then carry "hosts" and "per_host".
#
# stdout: one JSON object per (impl, ranks, size); everything else -> stderr.
# Exit status is non-zero if installing, building or any run fails.
# Needs root (apt-get, unshare, ip netns).
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
MPI_BASE_FLAGS=(
  --allow-run-as-root --oversubscribe --bind-to none
  --mca pml ob1
  -x GLIBC_TUNABLES
)
# Same host: the isolated launcher starts local ranks only, and needs no ssh or rsh (which
# the rsh launcher looks for even then, and a container may lack).
MPI_FLAGS=("${MPI_BASE_FLAGS[@]}" --mca plm isolated --mca oob_tcp_if_include lo)
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
      # HOSTS mode: rank r runs in host r/XH_PER_HOST's namespace, bound to its veth.
      local -a xh_ns=() xh_addr=()
      read -r -a xh_ns <<<"${XH_NETNS:-}"
      read -r -a xh_addr <<<"${XH_ADDRS:-}"
      local r
      for ((r = 0; r < np; r++)); do
        local -a pre=() bind=()
        if ((${#xh_ns[@]} > 0)); then
          local h=$((r / XH_PER_HOST))
          pre=(ip netns exec "${xh_ns[$h]}")
          if [[ "$impl" == gloo ]]; then bind=(--addr "${xh_addr[$h]}"); else bind=(--ifname eth0); fi
        fi
        if ((r == 0)); then
          "${pre[@]}" timeout -k 10 "$RUN_TIMEOUT" "${rank_cmd[@]}" \
            --rank "$r" --world "$np" --store "$store" "${bind[@]}" "$@" &
        else
          "${pre[@]}" timeout -k 10 "$RUN_TIMEOUT" "${rank_cmd[@]}" \
            --rank "$r" --world "$np" --store "$store" "${bind[@]}" "$@" >&2 &
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
        if [[ -z "${finished:-}" ]]; then
          # bash 5.2's wait -n can return naming no PID (it unsets the variable) when a rank
          # it waits for has already been reaped; wait for the first one left by its PID,
          # whose status bash still holds.
          finished=${running[0]}
          rc=0
          wait "$finished" || rc=$?
        fi
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
    elasticd | elasticd-tcp | elasticd-rings | elasticd-direct)
      # elasticd: as it runs by default, ranks on one host over shared memory; elasticd-tcp:
      # with shared memory off, over loopback TCP like the TCP baselines; elasticd-rings and
      # elasticd-direct: on one host, every size through the shared-memory rings, or every
      # size above recursive doubling's by reading the peers' buffers (--direct-bytes).
      local csv transport=auto direct=0
      csv=$(IFS=,; echo "$*")
      [[ "$impl" == elasticd-tcp ]] && transport=tcp
      [[ "$impl" == elasticd-rings ]] && direct=-1
      [[ "$impl" == elasticd-direct ]] && direct=1
      local -a hosts=()
      [[ -n "${XH_NETNS_HOSTS:-}" ]] && hosts=(--netns-hosts "$XH_NETNS_HOSTS")
      timeout -k 10 "$RUN_TIMEOUT" "$ELASTICD_BIN" bench allreduce --np "$np" --sizes "$csv" \
        --transport "$transport" --direct-bytes "$direct" --json --no-baseline "${hosts[@]}" | sed "s/^{/{\"impl\":\"$impl\",/"
      ;;
    mpi | mpi-shm)
      # mpirun forwards rank 0's stdout to ours and forwards TERM to ranks.
      local -a flags=("${MPI_FLAGS[@]}") launch=() impl_arg=()
      if [[ "$impl" == mpi ]]; then flags+=("${MPI_TCP_FLAGS[@]}"); else flags+=("${MPI_SHM_FLAGS[@]}"); fi
      [[ "$impl" == mpi-shm ]] && impl_arg=(--impl mpi-shm)
      if [[ -n "${XH_SWITCH:-}" ]]; then
        # HOSTS mode: mpirun in the switch namespace starts one orted per host through the
        # agent (ip netns exec); out-of-band and TCP BTL traffic only on the veth subnet.
        flags=("${MPI_BASE_FLAGS[@]}" --mca oob_tcp_if_include "$XH_SUBNET.0/24" --mca plm rsh --mca plm_rsh_agent "$XH_AGENT"
          --mca plm_rsh_no_tree_spawn 1 --host "$XH_MPI_HOSTS"
          --mca btl_tcp_if_include "$XH_SUBNET.0/24" --mca btl_tcp_disable_family 6)
        if [[ "$impl" == mpi ]]; then flags+=(--mca btl tcp,self); else flags+=(--mca btl vader,tcp,self); fi
        launch=(ip netns exec "$XH_SWITCH")
      fi
      exec "${launch[@]}" timeout -k 10 "$RUN_TIMEOUT" mpirun "${flags[@]}" \
        -np "$np" "$BUILD_DIR/mpi_allreduce" "${impl_arg[@]}" "$@"
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
KEEP_MPI_ENV="${KEEP_MPI_ENV:-0}"
[[ "$KEEP_MPI_ENV" == 0 || "$KEEP_MPI_ENV" == 1 ]] || die "KEEP_MPI_ENV must be 0 or 1"
if [[ "$KEEP_MPI_ENV" == 0 ]]; then
  mpi_env=$(compgen -e | grep -E '^(OMPI|OPAL|ORTE|PMIX|PRTE)_' || true)
  if [[ -n "$mpi_env" ]]; then
    log "removing inherited Open MPI settings (KEEP_MPI_ENV=1 keeps them):" $mpi_env
    # shellcheck disable=SC2086 # one name per word
    unset $mpi_env
  fi
fi
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
    elasticd | elasticd-tcp | elasticd-rings | elasticd-direct) [[ -x "$ELASTICD_BIN" ]] || die "$ELASTICD_BIN is not built (make build)" ;;
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

PREBUILT="${PREBUILT:-0}"
[[ "$PREBUILT" == 0 || "$PREBUILT" == 1 ]] || die "PREBUILT must be 0 or 1"
if [[ "$PREBUILT" == 1 ]]; then
  for impl in "${impl_list[@]}"; do
    case "$impl" in
      gloo) [[ -x "$BUILD_DIR/gloo_allreduce" ]] || die "PREBUILT=1: $BUILD_DIR/gloo_allreduce is missing (build it elsewhere, or leave gloo out of IMPLS)" ;;
      mpi | mpi-shm)
        [[ -x "$BUILD_DIR/mpi_allreduce" ]] || die "PREBUILT=1: $BUILD_DIR/mpi_allreduce is missing (build it elsewhere, or leave $impl out of IMPLS)"
        command -v mpirun >/dev/null || die "PREBUILT=1: mpirun is not on PATH (leave $impl out of IMPLS)"
        ;;
    esac
  done
  log "PREBUILT=1: using $BUILD_DIR as it is; mpirun: $(command -v mpirun || echo none)"
fi

# --- install what is missing ------------------------------------------------
pkg_installed() {
  [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}
if [[ "$PREBUILT" == 0 ]]; then
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
fi

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

# --- simulated hosts --------------------------------------------------------
HOSTS="${HOSTS:-0}"
[[ "$HOSTS" =~ ^[0-9]+$ ]] && ((HOSTS == 0 || (HOSTS >= 2 && HOSTS <= 64))) ||
  die "HOSTS must be 0 (one machine) or 2 to 64"
read -r -a per_host_list <<<"${PER_HOST:-1 2}"
LINK_QDISC="${LINK_QDISC:-}"
HOSTS_TCP_CC="${HOSTS_TCP_CC:-}"
[[ -z "$HOSTS_TCP_CC" || "$HOSTS_TCP_CC" =~ ^[a-z0-9_]+$ ]] ||
  die "HOSTS_TCP_CC must name a congestion control, e.g. reno (see /proc/sys/net/ipv4/tcp_available_congestion_control)"
if ((HOSTS > 0)); then
  ((${#per_host_list[@]} > 0)) || die "PER_HOST is empty"
  for p in "${per_host_list[@]}"; do
    [[ "$p" =~ ^[0-9]+$ ]] && ((p >= 1 && HOSTS * p <= 64)) || die "bad PER_HOST '$p' (1 or more, HOSTS*PER_HOST <= 64)"
  done
  [[ -z "${HOSTS_SUBNET:-}" || "$HOSTS_SUBNET" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] ||
    die "HOSTS_SUBNET must be A.B.C (a /24), e.g. 10.251.7"
  command -v ip >/dev/null || die "HOSTS needs ip (apt-get install iproute2)"
  [[ -z "$LINK_QDISC" ]] || command -v tc >/dev/null || die "LINK_QDISC needs tc (apt-get install iproute2)"
  netns=0 # the hosts' namespaces isolate the runs; ranks must reach each other's
  cc="$HOSTS_TCP_CC"
  [[ -n "$cc" ]] || cc="$(cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null), as on this machine"
  log "across $HOSTS simulated hosts (network namespaces), PER_HOST ${per_host_list[*]}, link qdisc: ${LINK_QDISC:-none}, TCP congestion control: $cc"
else
  log "network namespace isolation: $([[ $netns == 1 ]] && echo on || echo off)"
fi

# The first 10.251.C/24 that no address or route of this machine's namespace mentions. The
# network only exists inside this script's namespaces, so even a clash could not leak; the
# check keeps the addresses in logs unambiguous.
pick_subnet() {
  local c used
  used="$(ip -4 addr show; ip -4 route show table all)"
  for ((c = 0; c < 256; c++)); do
    grep -q "10\.251\.$c\." <<<"$used" || { echo "10.251.$c"; return 0; }
  done
  return 1
}

# Namespaces this run created, deleted on exit with whatever still runs in them (by PID).
xh_created=()
xh_down() {
  local ns pid h
  if [[ -n "$LINK_QDISC" && ${#xh_created[@]} -gt 0 ]]; then
    # What the modelled link did over the whole run: drops decide how TCP copes with it.
    local stats='s/.*Sent \([0-9]*\) bytes \([0-9]*\) pkt (dropped \([0-9]*\), overlimits \([0-9]*\).*/\1 bytes, \2 packets, \3 dropped, \4 overlimits/p'
    for ((h = 1; h <= HOSTS; h++)); do
      log "link of host $h, sent by the host: $(tc -n "$XH_PREFIX-h$h" -s qdisc show dev eth0 2>/dev/null |
        sed -n "$stats" | head -n 1); by the switch: $(tc -n "$XH_SWITCH" -s qdisc show dev "h$h" 2>/dev/null |
        sed -n "$stats" | head -n 1)"
    done
  fi
  for ns in "${xh_created[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      log "killing leftover process $pid in $ns"
      kill -KILL "$pid" 2>/dev/null || true
    done
    ip netns delete "$ns" 2>/dev/null || log "warning: could not delete network namespace $ns"
  done
  xh_created=()
}

# xh_up: the switch namespace with bridge br0 ($XH_SUBNET.254), and HOSTS host namespaces,
# each with a veth eth0 ($XH_SUBNET.i) whose other end (hi) is a port of br0.
xh_up() {
  local h ns
  ip netns add "$XH_SWITCH"
  xh_created+=("$XH_SWITCH")
  ip -n "$XH_SWITCH" link set lo up
  ip -n "$XH_SWITCH" link add br0 type bridge
  ip -n "$XH_SWITCH" addr add "$XH_SUBNET.254/24" dev br0
  ip -n "$XH_SWITCH" link set br0 up
  XH_NETNS="" XH_ADDRS="" XH_NETNS_HOSTS=""
  for ((h = 1; h <= HOSTS; h++)); do
    ns="$XH_PREFIX-h$h"
    ip netns add "$ns"
    xh_created+=("$ns")
    ip -n "$ns" link set lo up
    ip -n "$XH_SWITCH" link add "h$h" type veth peer name eth0 netns "$ns"
    ip -n "$XH_SWITCH" link set "h$h" master br0 up
    ip -n "$ns" addr add "$XH_SUBNET.$h/24" dev eth0
    ip -n "$ns" link set eth0 up
    if [[ -n "$HOSTS_TCP_CC" ]]; then
      ip netns exec "$ns" sysctl -qw "net.ipv4.tcp_congestion_control=$HOSTS_TCP_CC" ||
        die "HOSTS_TCP_CC: cannot set $HOSTS_TCP_CC in $ns (available: $(cat /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null); allowed in namespaces: $(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control 2>/dev/null), which net.ipv4.tcp_allowed_congestion_control sets)"
    fi
    if [[ -n "$LINK_QDISC" ]]; then
      # shellcheck disable=SC2086 # LINK_QDISC is a list of tc arguments
      tc -n "$ns" qdisc add dev eth0 root $LINK_QDISC ||
        die "LINK_QDISC: tc qdisc add dev eth0 root $LINK_QDISC failed (does the kernel have that qdisc?)"
      # shellcheck disable=SC2086
      tc -n "$XH_SWITCH" qdisc add dev "h$h" root $LINK_QDISC ||
        die "LINK_QDISC: tc qdisc add dev h$h root $LINK_QDISC failed"
    fi
    XH_NETNS+="$ns " XH_ADDRS+="$XH_SUBNET.$h "
    XH_NETNS_HOSTS+="${XH_NETNS_HOSTS:+,}$ns=$XH_SUBNET.$h"
  done
  # mpirun's remote shell: "AGENT HOST COMMAND..." runs COMMAND (an orted) in HOST's network
  # namespace, and in a UTS namespace named after it: Open MPI names its shared-memory
  # segments in /dev/shm (which the hosts share) after the hostname, and two "hosts" both
  # called by this machine's name overwrite each other's segments (a segfault in vader).
  {
    echo '#!/bin/sh'
    echo 'case "$1" in'
    for ((h = 1; h <= HOSTS; h++)); do echo "  $XH_SUBNET.$h) ns=$XH_PREFIX-h$h ;;"; done
    echo '  *) echo "rsh-agent: unknown host $1" >&2; exit 1 ;;'
    echo 'esac'
    echo 'shift'
    echo 'exec ip netns exec "$ns" unshare --uts /bin/sh -c '"'"'hostname "$0" && exec /bin/sh -c "$1"'"'"' "$ns" "$*"'
  } >"$XH_AGENT"
  chmod +x "$XH_AGENT"
  log "hosts: $XH_NETNS_HOSTS; switch $XH_SWITCH (bridge br0, $XH_SUBNET.254)"
}

# --- run ----------------------------------------------------------------------
work="$(mktemp -d "${TMPDIR:-/tmp}/elasticd-baselines-run.XXXXXX")"
# The benchmark in progress runs in the background (RUN_PID) so that a signal is handled at
# once: it is stopped by PID (TERM, which every inner runner passes on to its ranks; KILL 15 s
# later), then the EXIT trap deletes the namespaces and whatever is left in them.
RUN_PID=
stop_run() {
  [[ -n "$RUN_PID" ]] || return 0
  kill -TERM "$RUN_PID" 2>/dev/null || true
  local i
  for ((i = 0; i < 30; i++)); do
    kill -0 "$RUN_PID" 2>/dev/null || break
    sleep 0.5
  done
  kill -KILL "$RUN_PID" 2>/dev/null || true
  wait "$RUN_PID" 2>/dev/null || true
  RUN_PID=
}
trap 'xh_down; rm -rf "$work"' EXIT
trap 'log "interrupted: stopping the run"; stop_run; exit 130' INT
trap 'log "terminated: stopping the run"; stop_run; exit 143' TERM HUP

if ((HOSTS > 0)); then
  if [[ -n "${HOSTS_SUBNET:-}" ]]; then
    XH_SUBNET=$HOSTS_SUBNET
  else
    XH_SUBNET="$(pick_subnet)" || die "no free 10.251.C/24 for the veth network: set HOSTS_SUBNET"
  fi
  # Unique per run (PID and a random suffix), so that parallel runs never share a name.
  XH_PREFIX="elasticd-xh-$$-$RANDOM"
  XH_SWITCH="$XH_PREFIX-sw"
  XH_AGENT="$work/rsh-agent"
  xh_up
  export XH_SUBNET XH_SWITCH XH_AGENT XH_NETNS XH_ADDRS XH_NETNS_HOSTS
fi

# run_one IMPL NP [PER_HOST]: with PER_HOST, across HOSTS simulated hosts.
run_one() {
  local impl=$1 np=$2 per_host=${3:-0}
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
  local where="" tag=""
  if ((per_host > 0)); then
    local h mpi_hosts=""
    for ((h = 1; h <= HOSTS; h++)); do mpi_hosts+="${mpi_hosts:+,}$XH_SUBNET.$h:$per_host"; done
    cmd=(env XH_PER_HOST="$per_host" XH_MPI_HOSTS="$mpi_hosts" "${cmd[@]}")
    where=" ($HOSTS hosts x $per_host)"
    tag="\"hosts\":$HOSTS,\"per_host\":$per_host,"
  fi
  log "running $impl with $np ranks$where: sizes ${size_list[*]}"
  local rc=0 start=$SECONDS
  # Backstop: the inner runner bounds each rank with RUN_TIMEOUT itself.
  timeout -k 10 "$((RUN_TIMEOUT + 30))" "${cmd[@]}" >"$out" &
  RUN_PID=$!
  wait "$RUN_PID" || rc=$?
  RUN_PID=
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
  # The baselines' lines get the hosts fields elasticd's already have.
  grep '^{"impl":' "$out" | sed "/\"hosts\":/!s/^\({\"impl\":\"[^\"]*\",\)/\1$tag/"
  log "$impl np=$np$where done in $((SECONDS - start))s"
}

for ((round = 1; round <= ROUNDS; round++)); do
  if ((HOSTS > 0)); then
    for per_host in "${per_host_list[@]}"; do
      for impl in "${impl_list[@]}"; do
        # One rank per host: nothing to share memory with, so these would repeat elasticd and mpi.
        if ((per_host == 1)) && [[ "$impl" == elasticd-tcp || "$impl" == mpi-shm ]]; then continue; fi
        run_one "$impl" "$((HOSTS * per_host))" "$per_host"
      done
    done
    continue
  fi
  for np in "${np_list[@]}"; do
    for impl in "${impl_list[@]}"; do
      run_one "$impl" "$np"
    done
  done
done
