#!/usr/bin/env python3
"""An ordinary torchrun-style DDP training script, as users write them.

It knows nothing of elasticd: it reads its place from the environment torchrun (or elasticd's
restart mode) gives, trains an MLP on synthetic data with DistributedDataParallel, saves a
checkpoint from rank 0 every --checkpoint-every steps (atomically), resumes from it when it
starts, and on SIGTERM saves the last completed step before it exits, so that a spot notice
costs no step. If elasticd's Python package is importable it also reports its progress,
which lets the driver say how many steps each restart threw away.

    elasticd run -np 4 --min-np 2 -- /usr/bin/python3 examples/pytorch/train_ddp.py --checkpoint /tmp/ckpt.pt
    torchrun --nproc_per_node 4 --max_restarts 3 examples/pytorch/train_ddp.py --checkpoint /tmp/ckpt.pt

Lines it prints (rank 0 unless said): `start ...` and `env: ...` (every rank, at start),
`resumed from step S`,
`step N t=<unix time> world=<size>` after each step, `checkpoint S`, `done step N`.

Exit status: 0 when --steps are done; 143 (128 + SIGTERM) when stopped by SIGTERM, after rank 0
has saved the last completed step; 1 on an error, such as a peer lost in a collective (the
launcher then restarts the whole group). For tests: --die-at-step N --die-rank R (that rank
SIGKILLs itself before step N, on the first start only), --fail-always (every rank raises at
start, every time).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any


def say(line: str) -> None:
    """Prints one line in one write: torchrun's workers share one stdout pipe, and print() with
    PYTHONUNBUFFERED=1 writes the text and its newline separately, so lines of different ranks
    could interleave mid-line."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# When the process started, before torch loads: the recovery benchmark splits a restart into
# the launcher noticing and relaunching, and the new processes getting ready.
say(f"start pid={os.getpid()} t={time.time():.6f}")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

try:  # optional: progress reports to the elasticd driver (a no-op elsewhere)
    import elasticd  # type: ignore
except Exception:  # not installed, or broken: train without it
    elasticd = None

EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a worker SIGTERM ended

# The torchrun contract, printed on one `env:` line per rank at start (RANK first, pid last:
# tests and bench/pytorch/recovery.py parse `env: RANK=<r> ... pid=<p>`).
ENV_SHOWN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
             "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
             "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=500, help="train this many steps in all")
    p.add_argument("--checkpoint", required=True, help="checkpoint file, written by rank 0 and read by every rank at start")
    p.add_argument("--checkpoint-every", type=int, default=10, help="save a checkpoint every this many steps")
    p.add_argument("--hidden", type=int, default=900, help="hidden width of the MLP (900 gives about 1M parameters)")
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep this long per step (seconds), to watch or interrupt")
    p.add_argument("--die-at-step", type=int, default=0, help="with --die-rank: that rank SIGKILLs itself at this step, on the first start only")
    p.add_argument("--die-rank", type=int, default=1)
    p.add_argument("--fail-always", action="store_true", help="raise at start on every rank, every time (to test reset limits and failing jobs)")
    return p.parse_args()


class Model(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def batch(step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * 1000 + rank)
    return torch.randn(size, 256, generator=g), torch.randint(0, 10, (size,), generator=g)


def save(path: str, model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    """Write the checkpoint atomically: a reader sees the old one or the new one, never half."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    say(f"checkpoint {step}")


def report(step: int, checkpoint_step: int, loss: float | None = None, total: int | None = None) -> None:
    """Tells elasticd's driver how far training has got, of how many steps, and the loss (for
    the live page's curve); never lets a report stop training."""
    global elasticd
    progress = getattr(elasticd, "progress", None)
    if progress is None:
        return
    try:
        try:
            progress(step, checkpoint_step, loss=loss, total_steps=total)
        except TypeError:  # a package from before loss and total_steps
            progress(step, checkpoint_step)
    except Exception as e:  # an older or broken package: say so once, then train on
        print(f"elasticd.progress: {e!r}; no more progress reports", file=sys.stderr, flush=True)
        elasticd = None


def main() -> int:
    args = parse_args()
    env = {k: os.environ.get(k, "") for k in ENV_SHOWN}
    say("env: " + " ".join(f"{k}={v}" for k, v in env.items()) + f" pid={os.getpid()}")
    if args.fail_always:
        raise RuntimeError("--fail-always: failing at start, as asked")

    terminated = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal terminated
        terminated = True  # acted on between steps: parameters change only in optimizer.step()

    def stopping() -> bool:
        # A SIGTERM that came while a collective blocked in C++ is handled only when Python
        # next checks for signals, which entering a function does; reading the flag inline
        # right after the collective raised could still see False.
        return terminated

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda") if backend == "nccl" else torch.device("cpu")

    torch.manual_seed(0)
    model = Model(args.hidden).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = 0
    if os.path.exists(args.checkpoint):
        ck = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        step = ck["step"]
        if rank == 0:
            say(f"resumed from step {step}")
    saved = step
    ddp = DDP(model)
    loss_fn = nn.CrossEntropyLoss()
    first_start = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") in ("", "0")
    # Only now: until training starts there is nothing to save, and a Python handler cannot run
    # while init_process_group or DDP's first broadcast waits in C++ for a peer that never
    # comes, so a SIGTERM there would be ignored until the launcher's SIGKILL.
    signal.signal(signal.SIGTERM, on_term)

    while step < args.steps:
        if stopping():
            break
        if first_start and args.die_at_step and step + 1 == args.die_at_step and rank == args.die_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch(step + 1, rank, args.batch)
        try:
            opt.zero_grad()
            loss = loss_fn(ddp(x.to(device)), y.to(device))
            loss.backward()  # gradients are averaged here
        except RuntimeError:
            if stopping():  # a peer stopped first: this step did not happen
                break
            raise  # a lost peer: exit non-zero, and the whole group restarts
        opt.step()
        step += 1
        if rank == 0:
            say(f"step {step} t={time.time():.6f} world={world}")
            if step % args.checkpoint_every == 0 or step == args.steps:
                save(args.checkpoint, model, opt, step)
                saved = step
            report(step, saved, loss.item(), args.steps)  # rank 0's own batch loss
        if args.step_delay:
            time.sleep(args.step_delay)

    if terminated:
        if rank == 0 and saved != step:
            save(args.checkpoint, model, opt, step)  # the last completed step: nothing is lost
            report(step, step)
        return EXIT_TERMINATED
    if rank == 0:
        say(f"done step {step}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
