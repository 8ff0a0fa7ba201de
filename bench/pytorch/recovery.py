#!/usr/bin/env python3
"""Recovery of one PyTorch job under torchrun and under elasticd, interleaved, medians.

The same script (examples/pytorch/train_ddp.py: DDP over gloo, ~1M parameters) runs with 4
workers on this machine under each system in turn, round after round (the order rotates).
Once training is steady, the harness SIGKILLs rank 1 and measures from its own clock:

  recovery  kill -> the next completed step (rank 0's `step N t=...` line)
  detection kill -> the first relaunched worker process starts (its `start` line, printed
            before `import torch`): the launcher noticing, stopping the group, relaunching
  reinit    the rest: Python and torch loading, init_process_group, DDP, the checkpoint load,
            the first step
  redone    steps thrown away: the old group's last step - the step resumed from (the old
            group's last step is normally the last one before the kill, or one more when a
            step in flight completes after it; `last_step_before_kill` records the former)

elasticd's restart mode is given --blacklist-cooldown-range --cooldown (100ms,10s): the killed
slot is usable again by the relaunch, so the new group has 4 workers as under torchrun (which
relaunches every slot). With 1s,10s the relaunch sometimes comes before the cooldown ends and
the group has 3 (fewer processes on a small machine start faster); each measurement records
the relaunched world (`world`). The in-process system keeps the slot out (10m,20m): its
survivors go on at 3.

Each system is stopped (SIGTERM to its PID, SIGKILL if it lingers) after the measurement. One
JSON line per measurement goes to --out; a Markdown table of medians, with each system's
ratio to torchrun, to stdout.

    /usr/bin/python3 bench/pytorch/recovery.py --rounds 5 --elasticd bin/elasticd
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(ROOT, "examples", "pytorch", "train_ddp.py")

START = re.compile(r"start pid=(\d+) t=([\d.]+)")
ENV = re.compile(r"env: RANK=(\d+) .*? pid=(\d+)|worker pid=(\d+) rank=(\d+) ")  # lazy: lines may have run together
STEP = re.compile(r"step (\d+) t=([\d.]+) world=(\d+)")
RESUMED = re.compile(r"resumed from step (\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """One system running the script; its output is read line by line with arrival times."""

    def __init__(self, argv: list[str]) -> None:
        self.lines: list[tuple[float, str]] = []
        self.cond = threading.Condition()
        # gloo would otherwise use the address the hostname resolves to: stay on loopback.
        env = dict(os.environ, GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True, cwd=ROOT, env=env)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append((time.time(), line.rstrip("\n")))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, pred: Callable[[str], bool], after: int, timeout: float) -> tuple[int, float, str]:
        """The first line from index `after` on that satisfies pred: (index, arrival, text)."""
        deadline = time.time() + timeout
        with self.cond:
            i = after
            while True:
                while i < len(self.lines):
                    at, text = self.lines[i]
                    if pred(text):
                        return i, at, text
                    i += 1
                left = deadline - time.time()
                if left <= 0 or (self.proc.poll() is not None and not self.reader.is_alive()):
                    tail = "\n".join(t for _, t in self.lines[-30:])
                    raise RuntimeError(f"timed out or exited waiting; last output:\n{tail}")
                self.cond.wait(min(left, 0.5))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the job's processes only
                self.proc.wait()
        self.reader.join(timeout=5)


def measure(name: str, argv: list[str], warmup_step: int, timeout: float, log: str = "", inprocess: bool = False) -> dict[str, object]:
    run = Run(argv)
    try:
        i, _, _ = run.wait_for(lambda t: bool(STEP.search(t)) and int(STEP.search(t).group(1)) >= warmup_step, 0, timeout)  # type: ignore[union-attr]
        pids = {}
        for _, text in run.lines[:i]:
            for m in ENV.finditer(text):
                if m.group(1):
                    pids[int(m.group(1))] = int(m.group(2))
                else:
                    pids[int(m.group(4))] = int(m.group(3))
        victim = pids.get(1)
        if victim is None:
            raise RuntimeError(f"{name}: no rank 1 PID in the output")
        # Let the warm spares (elasticd --warm-start) and the system settle, then kill.
        time.sleep(1.0)
        with run.cond:
            cut = len(run.lines)
        old_world = 0
        for _, text in run.lines[:cut]:
            m = STEP.search(text)
            if m:
                old_world = int(m.group(3))
        killed = time.time()
        os.kill(victim, signal.SIGKILL)

        def last_steps(upto: int) -> tuple[int, int]:
            # Rank 0's last step before line `upto` (the old group's last: steps in flight when
            # the kill landed may complete after it), and its last step completed before the
            # kill by the steps' own timestamps.
            old = before = 0
            with run.cond:
                lines = list(run.lines[:upto])
            for _, text in lines:
                m = STEP.search(text)
                if m:
                    old = int(m.group(1))
                    if float(m.group(2)) <= killed:
                        before = int(m.group(1))
            return old, before

        if inprocess:
            # Survivors keep their processes: nothing starts. The recovery ends at the first step
            # of the smaller group (a step in flight at the kill may still complete at the old
            # size); the step it does says how far back the survivors went.
            h, _, stext = run.wait_for(lambda t: bool(STEP.search(t)) and float(STEP.search(t).group(2)) > killed  # type: ignore[union-attr]
                                       and int(STEP.search(t).group(3)) != old_world, cut, timeout)  # type: ignore[union-attr]
            m = STEP.search(stext)
            assert m is not None
            old_step, before = last_steps(h)
            resumed = int(m.group(1)) - 1
            # resumed > old_step: the last step was committed, then its host check failed before
            # rank 0 printed it; it was kept, not redone.
            return {"system": name, "recovery_s": float(m.group(2)) - killed, "detection_s": float("nan"),
                    "reinit_s": float("nan"), "redone_steps": max(0, old_step - resumed), "last_step": old_step,
                    "last_step_before_kill": before, "resumed": resumed, "world": int(m.group(3))}
        j, started, _ = run.wait_for(lambda t: bool(START.search(t)), cut, timeout)
        k, _, rtext = run.wait_for(lambda t: bool(RESUMED.search(t)), j, timeout)
        resumed = int(RESUMED.search(rtext).group(1))  # type: ignore[union-attr]
        _, stepped, stext = run.wait_for(lambda t: bool(STEP.search(t)), k, timeout)
        # The steps' own timestamps, where the step line carries one, are more exact than arrival.
        stepped = float(STEP.search(stext).group(2))  # type: ignore[union-attr]
        world = int(STEP.search(stext).group(3))  # type: ignore[union-attr]  # the relaunched group's size
        old_step, before = last_steps(k)
        started = min(started, float(START.search(run.lines[j][1]).group(2)))  # type: ignore[union-attr]
        return {"system": name, "recovery_s": stepped - killed, "detection_s": started - killed,
                "reinit_s": stepped - started, "redone_steps": old_step - resumed, "last_step": old_step,
                "last_step_before_kill": before, "resumed": resumed, "world": world}
    finally:
        run.stop()
        if log:
            with open(log, "w") as f:
                f.writelines(f"{at:.6f} {text}\n" for at, text in run.lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--elasticd", default=os.path.join(ROOT, "bin", "elasticd"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--checkpoint-every", type=int, default=20)
    ap.add_argument("--step-delay", type=float, default=0.02)
    ap.add_argument("--kill-after", type=int, default=30, help="kill rank 1 once rank 0 has done this many steps")
    ap.add_argument("--systems", default="torchrun,elasticd-restart,elasticd-warm,elasticd-inprocess")
    ap.add_argument("--out", default="bench-pytorch-recovery.jsonl")
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--cooldown", default="100ms,10s",
                    help="restart mode's --blacklist-cooldown-range: 100ms,10s lets the killed slot back for the relaunch "
                         "(world 4, as torchrun relaunches); 10m,20m keeps it out (world 3). The table gives the world.")
    ap.add_argument("--logs", default="", help="write each run's output, with arrival times, to this directory")
    args = ap.parse_args()

    def script(ckpt: str) -> list[str]:
        return [SCRIPT, "--steps", "1000000", "--checkpoint", ckpt, "--checkpoint-every", str(args.checkpoint_every),
                "--step-delay", str(args.step_delay)]

    def torchrun(ckpt: str) -> list[str]:
        return [args.python, os.path.join(HERE, "torchrun.py"), "--nnodes", "1", "--nproc_per_node", str(args.np),
                "--max_restarts", "100", "--monitor_interval", "0.5", "--rdzv_backend", "c10d",
                "--rdzv_endpoint", f"127.0.0.1:{free_port()}", "--rdzv_id", "bench"] + script(ckpt)

    def elasticd(ckpt: str, *extra: str, cooldown: str = "") -> list[str]:
        return [args.elasticd, "run", "-np", str(args.np), "--min-np", "2", "--mode", "restart", "--listen", "127.0.0.1:0",
                "--blacklist-cooldown-range", cooldown or args.cooldown, *extra, "--", args.python] + script(ckpt)

    def inprocess(ckpt: str) -> list[str]:
        # The same model and step in Horovod's elastic API, one commit per step.
        return [args.elasticd, "run", "-np", str(args.np), "--min-np", "2", "--blacklist-cooldown-range", "10m,20m",
                "--comm-timeout", "10s", "--", args.python, os.path.join(ROOT, "examples", "pytorch", "elastic_hvd.py"),
                "--epochs", "1000", "--samples", "100000", "--commit-every", "1", "--step-delay", str(args.step_delay)]

    systems: dict[str, Callable[[str], list[str]]] = {
        "torchrun": torchrun,
        "elasticd-restart": lambda c: elasticd(c),
        "elasticd-warm": lambda c: elasticd(c, "--warm-start"),
        # Not in the default list: restart mode with the killed slot kept out, so the group is
        # relaunched at 3 workers where torchrun relaunches 4 (how much a smaller group helps).
        "elasticd-restart-3": lambda c: elasticd(c, cooldown="10m,20m"),
        "elasticd-inprocess": inprocess,
    }
    names = [s for s in args.systems.split(",") if s]
    for n in names:
        if n not in systems:
            ap.error(f"--systems: unknown system {n!r}; known: {', '.join(systems)}")
    results: dict[str, list[dict[str, object]]] = {n: [] for n in names}
    with open(args.out, "a") as out, tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                ckpt = os.path.join(tmp, f"{n}-{r}.pt")
                log = os.path.join(args.logs, f"{r}-{n}.log") if args.logs else ""
                res = measure(n, systems[n](ckpt), args.kill_after, args.timeout, log, inprocess=n == "elasticd-inprocess")
                res["round"] = r
                res["load1"] = round(os.getloadavg()[0], 2)  # the machine may be shared: how busy it was
                results[n].append(res)
                out.write(json.dumps(res) + "\n")
                out.flush()
                print(f"round {r} {n}: recovery {res['recovery_s']:.2f} s (detection {res['detection_s']:.2f}, reinit {res['reinit_s']:.2f}), {res['redone_steps']} steps redone", file=sys.stderr, flush=True)

    def med(n: str, k: str) -> float:
        vals = [float(x[k]) for x in results[n] if x[k] == x[k]]  # type: ignore[arg-type]  # NaN: not measured
        return statistics.median(vals) if vals else float("nan")

    base = "torchrun" if "torchrun" in results else names[0]
    print(f"| system | recovery (s) | detection (s) | re-initialisation (s) | steps redone | world after | recovery / {base} |")
    print("|---|---|---|---|---|---|---|")
    for n in names:
        worlds = ",".join(str(w) for w in sorted({int(x.get("world", 0)) for x in results[n]}))  # type: ignore[call-overload]
        print(f"| {n} | {med(n, 'recovery_s'):.2f} | {med(n, 'detection_s'):.2f} | {med(n, 'reinit_s'):.2f} | "
              f"{med(n, 'redone_steps'):.0f} | {worlds} | {med(n, 'recovery_s') / med(base, 'recovery_s'):.2f} |")
    print()
    for n in names:
        runs = " ".join(f"{float(x['recovery_s']):.2f}" for x in sorted(results[n], key=lambda x: float(x["recovery_s"])))  # type: ignore[arg-type]
        print(f"{n}: every recovery, sorted (s): {runs}")
    print(f"\nmedians of {args.rounds} rounds, {args.np} workers, one SIGKILLed after step {args.kill_after}; raw lines in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
