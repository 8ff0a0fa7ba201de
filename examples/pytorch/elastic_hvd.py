#!/usr/bin/env python3
"""An Elastic Horovod PyTorch script, run by elasticd in-process: the only change from
Horovod is the import line (`import horovod.torch as hvd` -> `import elasticd.torch as hvd`).

    elasticd run -np 4 --min-np 2 -- /usr/bin/python3 examples/pytorch/elastic_hvd.py

When a worker dies, the survivors keep their processes: they restore the last commit (at most
--commit-every steps back), form a new group without it, and go on. Rank 0 prints
`step N t=<unix time> world=W pid=P` after every step, and `done step N` at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import elasticd.torch as hvd

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--samples", type=int, default=1024, help="samples in the synthetic data set")
p.add_argument("--batch-size", type=int, default=32)
p.add_argument("--hidden", type=int, default=900, help="hidden width of the MLP (900 gives about 1M parameters, as examples/pytorch/train_ddp.py)")
p.add_argument("--commit-every", type=int, default=1, help="commit every this many batches; check host updates on the others")
p.add_argument("--lr", type=float, default=0.01)
p.add_argument("--step-delay", type=float, default=0.0, help="seconds of sleep per batch, to watch or interrupt")
p.add_argument("--fp16-allreduce", action="store_true")
p.add_argument("--no-cuda", action="store_true", help="train on the CPU even where CUDA is available")
args = p.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

hvd.init()
if args.cuda:  # as Horovod's examples: one GPU per local rank
    torch.cuda.set_device(hvd.local_rank())
torch.manual_seed(42)
g = torch.Generator().manual_seed(7)
dataset = TensorDataset(torch.randn(args.samples, 256, generator=g), torch.randint(0, 10, (args.samples,), generator=g))

model = nn.Sequential(nn.Linear(256, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
if args.cuda:
    model.cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none)
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=1)


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> None:
    for state.epoch in range(state.epoch, args.epochs):
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=state.sampler)
        for batch_idx, (data, target) in enumerate(loader):
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            state.optimizer.zero_grad()
            loss = F.cross_entropy(state.model(data), target)
            loss.backward()
            state.optimizer.step()
            state.sampler.record_batch(batch_idx, args.batch_size)
            state.step += 1
            if args.step_delay:
                time.sleep(args.step_delay)
            state.set_loss(loss.item())  # rank 0's is sent with the commit: the live page's loss curve
            if state.step % args.commit_every == 0:
                state.commit()
            else:
                state.check_host_updates()
            if hvd.rank() == 0:
                print(f"step {state.step} t={time.time():.6f} world={hvd.size()} pid={os.getpid()} epoch={state.epoch} loss={loss.item():.4f}", flush=True)
        state.sampler.set_epoch(state.epoch + 1)


def on_state_reset() -> None:
    for group in optimizer.param_groups:
        group["lr"] = args.lr * hvd.size()  # Horovod's usual rescaling to the new world


state = hvd.elastic.TorchState(model, optimizer, epoch=0, step=0, sampler=sampler)
state.register_reset_callbacks([on_state_reset])
print(f"worker pid={os.getpid()} rank={hvd.rank()} size={hvd.size()}", flush=True)
train(state)
if hvd.rank() == 0:
    print(f"done step {state.step}", flush=True)
