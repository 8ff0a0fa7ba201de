#!/usr/bin/env python3
"""The PyTorch program of `elasticd bench soak --program torch`: an Elastic Horovod style
script on elasticd.torch in-process (TorchState, ElasticSampler, DistributedOptimizer, gloo),
which logs the same history as the demo trainer's --history, for the soak's checker.

Every rank appends to DIR/pid-PID.log, one os.write per line (a SIGKILL leaves whole lines):

    start gen=G rank=R size=S step=N pid=P t=NS      a generation begins at step N (its sync's commit)
    step gen=G rank=R size=S step=N epoch=E t=NS samples=I,J,...   this rank trains step N on I, J, ...
    commit gen=G rank=R step=N t=NS                  the state after step N is committed

The sampler pads an epoch's last batch so that every rank takes as many samples (as torch's
DistributedSampler): the padding repeats at most size - 1 samples of that epoch. Training ends,
exit 0, at the first commit at which any rank sees --stop-file exist.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import elasticd.torch as hvd
from elasticd.torch import _runtime

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--history", required=True, help="directory of the per-process history files")
p.add_argument("--stop-file", default="", help="training ends at the first commit after this file appears")
p.add_argument("--steps", type=int, default=1_000_000_000)
p.add_argument("--commit-every", type=int, default=5)
p.add_argument("--dataset-size", type=int, default=4096)
p.add_argument("--batch", type=int, default=64, help="global batch, split over the ranks")
p.add_argument("--step-delay", type=float, default=0.02, help="seconds of sleep per step")
p.add_argument("--events", action="store_true", help="rank 0 prints `event step=N world=S gen=G t=NS` per step")
args = p.parse_args()

hvd.init()
torch.manual_seed(1)
g = torch.Generator().manual_seed(7)
features, classes = 16, 4
dataset = TensorDataset(torch.randn(args.dataset_size, features, generator=g),
                        torch.randint(0, classes, (args.dataset_size,), generator=g))
model = nn.Linear(features, classes)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
history = os.open(os.path.join(args.history, f"pid-{os.getpid()}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def log(line: str) -> None:
    os.write(history, (line + "\n").encode())


def generation() -> int:
    rt = _runtime.runtime()
    return rt.generation if rt is not None else 0


def stop_agreed() -> bool:
    """Whether any rank sees the stop file: an allreduce(max), so all stop at the same commit."""
    flag = torch.tensor([1 if os.path.exists(args.stop_file) else 0], dtype=torch.int64)
    return int(hvd.allreduce(flag, op=hvd.Max).item()) > 0


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> None:
    gen, rank, size = generation(), hvd.rank(), hvd.size()
    log(f"start gen={gen} rank={rank} size={size} step={state.step} pid={os.getpid()} t={time.time_ns()}")
    bs = max(1, args.batch // size)  # this rank's share of the global batch
    while state.step < args.steps:
        sampler = state.sampler
        batches = (len(sampler) + bs - 1) // bs
        for batch_idx in range(batches):
            idx = sampler.get_indices(batch_idx, bs)
            log(f"step gen={gen} rank={rank} size={size} step={state.step + 1} epoch={sampler.epoch} t={time.time_ns()} "
                f"samples={','.join(str(i) for i in idx)}")
            x, y = dataset.tensors[0][idx], dataset.tensors[1][idx]
            state.optimizer.zero_grad()
            loss = F.cross_entropy(state.model(x), y)
            loss.backward()
            state.optimizer.step()
            sampler.record_batch(batch_idx, bs)
            state.step += 1
            state.set_loss(loss.item())
            if args.events and rank == 0:
                print(f"event step={state.step} world={size} gen={gen} t={time.time_ns()}", flush=True)
            if args.step_delay:
                time.sleep(args.step_delay)
            if state.step % args.commit_every == 0:
                try:
                    state.commit()
                finally:  # saved before it checks the hosts: the commit stands even when that fails
                    log(f"commit gen={gen} rank={rank} step={state.step} t={time.time_ns()}")
                if args.stop_file and stop_agreed():
                    return
            else:
                state.check_host_updates()
            if state.step >= args.steps:
                return
        state.epoch += 1
        sampler.set_epoch(state.epoch)


state = hvd.elastic.TorchState(model, optimizer, epoch=0, step=0, sampler=hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=1))
train(state)
if hvd.rank() == 0:
    print(f"done: {state.step} steps", flush=True)
