#!/usr/bin/env python3
"""An Elastic Horovod-style script (elasticd.torch, ElasticSampler, DataLoader, record_batch)
that logs what it trains on, so that a test can check that every sample was used exactly once
per epoch across resets. Each process appends to LOG_DIR/<pid>.log, one line at a time:

    start <generation> <step> <rank> <size>        the training function was entered (after sync)
    batch <generation> <step> <epoch> <i,j,...>   this rank is about to train step <step> on these

A batch line is written before the step's gradient allreduce: the step counts exactly when
the next generation that trains starts at or after it (its allreduce then completed, which
needed every rank's contribution). The generation is read from the runtime, which is internal:
this is a test's script, not an example.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import elasticd.torch as hvd
from elasticd.torch import _runtime

p = argparse.ArgumentParser()
p.add_argument("--log-dir", required=True)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--samples", type=int, default=1000)
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--commit-every", type=int, default=3)
p.add_argument("--step-delay", type=float, default=0.05)
args = p.parse_args()

hvd.init()
features = torch.randn(args.samples, 16, generator=torch.Generator().manual_seed(3))
dataset = TensorDataset(torch.arange(args.samples))
model = torch.nn.Linear(16, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters())
log = open(os.path.join(args.log_dir, f"{os.getpid()}.log"), "a", buffering=1)


def generation() -> int:
    rt = _runtime.runtime()
    assert rt is not None, "run me under elasticd run"
    return rt.generation


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> None:
    gen = generation()
    log.write(f"start {gen} {state.step} {hvd.rank()} {hvd.size()}\n")
    for state.epoch in range(state.epoch, args.epochs):
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=state.sampler)
        for batch_idx, (idx,) in enumerate(loader):
            log.write(f"batch {gen} {state.step + 1} {state.epoch} {','.join(str(int(i)) for i in idx)}\n")
            state.optimizer.zero_grad()
            F.mse_loss(state.model(features[idx]).squeeze(1), idx.float() / args.samples).backward()
            state.optimizer.step()
            state.sampler.record_batch(batch_idx, args.batch_size)
            state.step += 1
            time.sleep(args.step_delay)
            if state.step % args.commit_every == 0:
                state.commit()
            else:
                state.check_host_updates()
            if hvd.rank() == 0:
                print(f"step {state.step} t={time.time():.6f} world={hvd.size()} pid={os.getpid()}", flush=True)
        state.sampler.set_epoch(state.epoch + 1)


state = hvd.elastic.TorchState(model, optimizer, epoch=0, step=0, sampler=hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=5))
print(f"worker pid={os.getpid()} rank={hvd.rank()} size={hvd.size()}", flush=True)
train(state)
if hvd.rank() == 0:
    print(f"done step {state.step}", flush=True)
