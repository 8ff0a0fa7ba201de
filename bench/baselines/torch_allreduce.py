#!/usr/bin/python3
"""torch_allreduce: baseline float32 SUM allreduce through torch.distributed's gloo backend.

The same measurement as gloo_allreduce.cc, through what a PyTorch user calls: Debian's
python3-torch (1.13, built with gloo), one process per rank on this machine, meant to be
started by run.sh as

    /usr/bin/python3 torch_allreduce.py --rank R --world N --store DIR SIZE_BYTES...

Rendezvous goes through a torch FileStore (a file in DIR, an empty directory shared by the
ranks and fresh per run); gloo's TCP device is bound to the loopback interface
(GLOO_SOCKET_IFNAME=lo), so nothing listens on or connects to another address; --ifname names
another (run.sh's cross-host mode: the veth of the rank's network namespace). Every wait is
bounded: the store and every collective time out after --timeout seconds.

Per size: allocate, warm up (5 iterations, 2 from 16 MiB), then repeat { refill the buffer
with ((i*7 + rank*13) % 64) * 0.5 (untimed), barrier, time one in-place dist.all_reduce(SUM),
MAX-reduce {that time, wall time since the timed phase began} across ranks (untimed) } for at
least 5 iterations and until 2 s of wall time (at most 2000). Rank 0 prints one JSON line with
the median of the per-iteration maxima, and the percentiles to stderr. The result of the last
timed iteration is checked element by element on every rank.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

IMPL = "torch-gloo"
TARGET_SECONDS = 2.0
MIN_ITERS = 5
MAX_ITERS = 2000
PERIOD = 64  # the fill pattern repeats every 64 elements


def die(msg: str) -> None:
    print(f"torch_allreduce: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


try:
    import torch
    import torch.distributed as dist
except ImportError as e:
    die(f"{sys.executable} cannot import torch ({e}); run it with Debian's /usr/bin/python3 "
        "and python3-torch (apt-get install python3-torch), or leave torch-gloo out of IMPLS")


def pattern(rank: int) -> torch.Tensor:
    """One period of the fill: small multiples of 0.5, so the sum over ranks is exact in float32."""
    i = torch.arange(PERIOD, dtype=torch.int64)
    return ((i * 7 + rank * 13) % PERIOD).to(torch.float32) * 0.5


def fill(buf: torch.Tensor, period: torch.Tensor) -> None:
    """Writes the periodic pattern into buf in place, without a second buffer of its size."""
    n = buf.numel()
    full = n - n % PERIOD
    if full:
        buf[:full].view(-1, PERIOD).copy_(period.expand(full // PERIOD, PERIOD))
    if n > full:
        buf[full:].copy_(period[: n - full])


def verify(buf: torch.Tensor, world: int, rank: int, size: int) -> None:
    want = torch.empty_like(buf)
    fill(want, sum(pattern(r) for r in range(world)))
    bad = torch.nonzero(buf != want)
    if bad.numel():
        i = int(bad[0, 0])
        die(f"rank {rank}: wrong result for size {size} at element {i}: "
            f"got {float(buf[i]):.9g} want {float(want[i]):.9g}")


def median(v: list[float]) -> float:
    s = sorted(v)
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


def bench_size(size: int, rank: int, world: int) -> None:
    if size <= 0 or size % 4:
        die(f"size must be a positive multiple of 4 bytes: {size}")
    buf = torch.empty(size // 4, dtype=torch.float32)  # torch's CPU allocator aligns to 64 bytes
    period = pattern(rank)

    for _ in range(2 if size >= 16 << 20 else 5):  # warmup, untimed
        fill(buf, period)
        dist.barrier()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)

    # stat = {this iteration's time, wall time since the timed phase began}, MAX-reduced so
    # that every rank takes the same stop decision.
    times: list[float] = []
    stat = torch.zeros(2, dtype=torch.float64)
    phase_start = time.perf_counter()
    while True:
        fill(buf, period)  # untimed: every iteration reduces the same input
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        t1 = time.perf_counter()
        stat[0] = t1 - t0
        stat[1] = t1 - phase_start
        dist.all_reduce(stat, op=dist.ReduceOp.MAX)
        times.append(float(stat[0]))
        if len(times) >= MAX_ITERS or (len(times) >= MIN_ITERS and float(stat[1]) >= TARGET_SECONDS):
            break
    verify(buf, world, rank, size)  # the result of the last timed iteration

    if rank == 0:
        s = sorted(times)
        iters = len(s)

        def pct(q: float) -> float:
            return s[int(q * (iters - 1) + 0.5)]

        print(f"[{IMPL}] ranks={world} size={size} iters={iters} min={s[0]:.3g}s p10={pct(0.1):.3g}s "
              f"p50={pct(0.5):.3g}s p90={pct(0.9):.3g}s max={s[-1]:.3g}s", file=sys.stderr, flush=True)
        med = median(times)
        algbw = size / med / 1e9
        busbw = algbw * 2 * (world - 1) / world
        # The field order and number formats of gloo_allreduce.cc and mpi_allreduce.c.
        print(f'{{"impl":{json.dumps(IMPL)},"size_bytes":{size},"ranks":{world},"iters":{iters},'
              f'"median_s":{med:.9g},"algbw_gbps":{algbw:.6g},"busbw_gbps":{busbw:.6g}}}', flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--store", required=True, help="an empty directory shared by the ranks, fresh per run")
    ap.add_argument("--timeout", type=float, default=120, help="seconds any rendezvous or collective may wait")
    ap.add_argument("--ifname", default="lo",
                    help="the interface whose address gloo binds to (run.sh's cross-host mode: the veth)")
    ap.add_argument("sizes", type=int, nargs="+", metavar="SIZE_BYTES")
    args = ap.parse_args()
    if not 0 <= args.rank < args.world:
        die(f"bad rank {args.rank} for world {args.world}")
    if not (dist.is_available() and dist.is_gloo_available()):
        die(f"the torch of {sys.executable} has no torch.distributed with gloo; use Debian's "
            "/usr/bin/python3 with python3-torch, or leave torch-gloo out of IMPLS")

    # torchrun's default with several processes per host; it also keeps OpenMP worker threads
    # (which spin after a parallel region) from taking the CPUs gloo's threads need.
    torch.set_num_threads(1)
    # gloo binds its TCP device to this interface's address: loopback only by default.
    os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    timeout = datetime.timedelta(seconds=args.timeout)
    store = dist.FileStore(os.path.join(args.store, "torch-store"), args.world)
    store.set_timeout(timeout)
    # torch reports gloo and store failures, timeouts included, as RuntimeError.
    try:
        dist.init_process_group("gloo", store=store, rank=args.rank, world_size=args.world, timeout=timeout)
    except RuntimeError as e:
        die(f"rank {args.rank}: rendezvous of {args.world} ranks in {args.store} (timeout {args.timeout:g}s): {e}")
    for size in args.sizes:
        try:
            bench_size(size, args.rank, args.world)
        except RuntimeError as e:
            die(f"rank {args.rank}: size {size} (collective timeout {args.timeout:g}s): {e}")
    try:
        dist.barrier()
        dist.destroy_process_group()
    except RuntimeError as e:
        die(f"rank {args.rank}: final barrier: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
