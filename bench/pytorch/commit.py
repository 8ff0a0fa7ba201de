#!/usr/bin/env python3
"""What a commit per step costs in elasticd's in-process mode, against a plain DDP step.

Three jobs of 4 workers on this machine, each under `elasticd run`, the same model (an MLP of
1.05 M parameters), batch (32 per rank) and data, interleaved round by round:

  ddp          examples/pytorch/train_ddp.py: torch's DistributedDataParallel, no checkpoint
  hvd-check    examples/pytorch/elastic_hvd.py: hvd.DistributedOptimizer, check_host_updates()
               every step, no commit
  hvd-commit   the same, commit() every step (a copy of model and optimizer state to host
               memory, the sampler's pooling and the host check)

The figure is rank 0's median step interval over steps --warmup .. --warmup+--steps.

    /usr/bin/python3 bench/pytorch/commit.py --rounds 3 --elasticd bin/elasticd
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STEP = re.compile(r"\[0\] step (\d+) t=([\d.]+)")


def step_time(argv: list[str], warmup: int, steps: int) -> float:
    env = dict(os.environ, GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{argv[:6]}... exited {out.returncode}:\n{out.stderr[-3000:]}")
    t = {}
    for m in STEP.finditer(out.stdout + out.stderr):
        t[int(m.group(1))] = float(m.group(2))
    gaps = [t[i] - t[i - 1] for i in range(warmup + 1, warmup + steps + 1) if i in t and i - 1 in t]
    if len(gaps) < steps // 2:
        raise RuntimeError(f"only {len(gaps)} step intervals in the output")
    return statistics.median(gaps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--elasticd", default=os.path.join(ROOT, "bin", "elasticd"))
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    total = args.warmup + args.steps + 5
    run = [args.elasticd, "run", "-np", str(args.np), "--"]
    hvd = [args.python, os.path.join(ROOT, "examples", "pytorch", "elastic_hvd.py"), "--epochs", "1",
           "--samples", str(total * 32 * args.np), "--batch-size", "32"]
    results: dict[str, list[float]] = {"ddp": [], "hvd-check": [], "hvd-commit": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            configs = {
                "ddp": run + [args.python, os.path.join(ROOT, "examples", "pytorch", "train_ddp.py"), "--steps", str(total),
                              "--checkpoint", os.path.join(tmp, f"c{r}.pt"), "--checkpoint-every", "1000000000"],
                "hvd-check": run + hvd + ["--commit-every", "1000000000"],
                "hvd-commit": run + hvd + ["--commit-every", "1"],
            }
            names = list(configs)
            for n in names[r % 3:] + names[:r % 3]:
                results[n].append(step_time(configs[n], args.warmup, args.steps))
                print(f"round {r} {n}: {results[n][-1] * 1000:.2f} ms per step", file=sys.stderr, flush=True)
    med = {n: statistics.median(v) for n, v in results.items()}
    print("| job | step (ms) | / ddp |")
    print("|---|---|---|")
    for n, v in med.items():
        print(f"| {n} | {v * 1000:.2f} | {v / med['ddp']:.3f} |")
    print(f"\ncommit per step: {100 * (med['hvd-commit'] / med['hvd-check'] - 1):+.1f} % against the same step without it; "
          f"medians of {args.rounds} rounds, steps {args.warmup}-{args.warmup + args.steps}, {args.np} workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
