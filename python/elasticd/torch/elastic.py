"""Horovod's elastic API for PyTorch: `hvd.elastic.run`, `hvd.elastic.TorchState`,
`hvd.elastic.ElasticSampler`, on elasticd's rendezvous.

A failed collective (HorovodInternalError) restores the last commit and resets; a change of
hosts, agreed by every rank at the same commit with one allreduce(max) of the host-update
version each has heard (not a broadcast from rank 0: Horovod #3494), resets with no rollback.
A reset destroys the process group, reports READY to the driver with the work rolled back,
waits for the next generation, builds its group, runs the reset callbacks, and syncs the state
from the most advanced rank (most often rank 0, the oldest survivor: see ObjectState.sync).
"""

from __future__ import annotations

import copy
import functools
import math
import random
import sys
import time
from typing import Any, Callable, Iterator, Optional

import torch

import elasticd
from elasticd.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from elasticd.torch import _checkpoint, _runtime

__all__ = ["run", "TorchState", "ObjectState", "ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt"]


def _hvd() -> Any:
    import elasticd.torch as hvd  # the package imports this module: resolve late

    return hvd


def _cpu_copy(obj: Any) -> Any:
    """A deep copy with every tensor cloned to host memory (a commit survives the device)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (set, frozenset)):
        return set(obj)  # of indices: immutable elements, copied at C speed
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu_copy(v) for v in obj)
    return copy.deepcopy(obj)


def _copy_into(old: Any, new: Any) -> Any:
    """_cpu_copy(new), reusing old's tensors where shapes and types match: a commit per step
    then copies into memory it already has instead of faulting in megabytes of new pages."""
    if isinstance(new, torch.Tensor):
        if isinstance(old, torch.Tensor) and old.shape == new.shape and old.dtype == new.dtype and old.device.type == "cpu":
            return old.copy_(new.detach())
        return _cpu_copy(new)
    if isinstance(new, dict):
        prev = old if isinstance(old, dict) else {}
        return {k: _copy_into(prev.get(k), v) for k, v in new.items()}
    if isinstance(new, (list, tuple)) and isinstance(old, (list, tuple)) and len(old) == len(new):
        return type(new)(_copy_into(o, v) for o, v in zip(old, new))
    return _cpu_copy(new)


class ObjectState:
    """State of plain attributes (kwargs): saved by commit(), restored after a failure,
    made the most advanced rank's by sync()."""

    def __init__(self, **kwargs: Any) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self._known = list(kwargs)
        for k, v in kwargs.items():
            setattr(self, k, v)
        self._commits = 0
        self._steps = 0            # check_host_updates() and commit() calls: the job's steps
        self._steps_at_commit = 0
        self._commit_time = time.time()
        self._saved: dict[str, Any] = {}
        self._loss: Optional[float] = None       # set_loss(): reported, not part of the state
        self._total_steps: Optional[int] = None  # set_total_steps()
        self.save()

    def set_loss(self, loss: Any) -> None:
        """Records the training loss of the latest step (a number, e.g. `loss.item()`): rank 0
        sends the latest with its progress at each commit, and the live page plots it. It is
        not part of the state (not committed, restored or synced); a NaN or infinite loss is
        not sent."""
        self._loss = None if loss is None else float(loss)

    def set_total_steps(self, total_steps: Optional[int]) -> None:
        """Declares how many steps (commit() and check_host_updates() calls) the job makes in
        all, so that the live page shows "step X of N" and the time to go; None: unknown."""
        self._total_steps = None if total_steps is None else int(total_steps)

    # Horovod's names
    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for cb in self._reset_callbacks:
            cb()

    def _values(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._known}

    def save(self) -> None:
        """A copy in host memory of everything restore() brings back."""
        now = {k: v.state_dict() if hasattr(v, "state_dict") and hasattr(v, "load_state_dict") else v
               for k, v in self._values().items()}
        self._saved = _copy_into(self._saved, now)
        self._steps_at_commit = self._steps
        self._commit_time = time.time()

    def restore(self) -> None:
        for k, v in copy.deepcopy(self._saved).items():
            cur = getattr(self, k)
            if hasattr(cur, "load_state_dict") and hasattr(cur, "state_dict"):
                cur.load_state_dict(v)
            else:
                setattr(self, k, v)
        self._steps = self._steps_at_commit

    def commit(self) -> None:
        """save() and check_host_updates(): call it every few batches. A commit at which the
        ranks agree on a host change is where a planned change takes the job (a notice, a
        scale-in, the job stopping for its --max-cost): rank 0 writes it to --checkpoint-dir
        then too, whatever --checkpoint-every, so that a job ended there resumes from it."""
        self._before_save()
        self.save()
        self._commits += 1
        self._report()
        self._checkpoint()
        try:
            self.check_host_updates()
        except HostsUpdatedInterrupt:
            self._checkpoint(planned=True)
            raise

    def _checkpoint(self, planned: bool = False) -> None:
        """Rank 0 writes its commit to --checkpoint-dir every --checkpoint-every commits, and at
        a planned change (once: not again when the count wrote it already); a failed write is
        reported, not fatal (the in-memory commit stands)."""
        rt = _runtime.runtime()
        if rt is None or not rt.ckpt_dir or _hvd().rank() != 0:
            return
        due = self._commits % rt.ckpt_every == 0
        if due == planned:  # not its turn; or a planned change whose commit the count wrote already
            return
        try:
            _checkpoint.write(rt.ckpt_dir, self._commits, self._steps_at_commit,
                              {"values": self._saved, "commits": self._commits, "steps": self._steps_at_commit})
        except Exception as e:  # a full disk, or a kwarg torch.save cannot pickle: not a reason to stop training
            print(f"elasticd: could not write a checkpoint to {rt.ckpt_dir}: {e!r}; training goes on from the in-memory commit",
                  file=sys.stderr, flush=True)

    def _resume(self) -> None:
        """Rank 0 with no commit of its own: every worker is new (the job lost them all), so
        start from the newest valid checkpoint, if there is one."""
        rt = _runtime.runtime()
        if rt is None or not rt.ckpt_dir or self._commits != 0 or _hvd().rank() != 0:
            return
        c = _checkpoint.newest(rt.ckpt_dir)
        if c is None:
            return
        self._load_full_state(c.state)
        self.save()
        print(f"elasticd: resumed from checkpoint {c.path} (step {c.steps}): the job had lost every worker", file=sys.stderr, flush=True)

    def _before_save(self) -> None:
        """Elastic samplers pool what every rank processed, so that a commit holds it all."""
        for v in self._values().values():
            if isinstance(v, ElasticSampler):
                v._pool_processed()

    def check_host_updates(self) -> None:
        """Raises HostsUpdatedInterrupt on every rank at once when the hosts changed."""
        self._steps += 1
        rt = _runtime.runtime()
        if rt is None:
            return
        # DistributedOptimizer reduced every rank's pending version with the gradients: when
        # none had heard of a change, no rank needs another collective to agree on that.
        if rt.take_piggyback() == 0:
            return
        mine = torch.tensor([rt.pending_update()], dtype=torch.int64, device=_hvd()._scalar_device())
        _hvd()._guard(torch.distributed.all_reduce, mine, op=torch.distributed.ReduceOp.MAX)
        agreed = int(mine.item())
        if agreed > 0:
            rt.applied_update(agreed)
            raise HostsUpdatedInterrupt(skip_sync=False)

    def _report(self) -> None:
        rt = _runtime.runtime()
        if rt is not None and _hvd().rank() == 0:
            elasticd._report(rt.generation, self._steps, self._steps_at_commit,
                             loss=self._loss, total_steps=self._total_steps)

    def rolled_back(self) -> tuple[int, float]:
        return max(0, self._steps - self._steps_at_commit), max(0.0, time.time() - self._commit_time)

    def _state_for_sync(self) -> dict[str, Any]:
        return {k: v.state_dict() if hasattr(v, "state_dict") and hasattr(v, "load_state_dict") else v
                for k, v in self._values().items()}

    def sync(self) -> None:
        """Makes every rank's state that of the most advanced rank: the one with the most
        steps (then commits; then the lowest rank, rank 0 being the oldest survivor). A
        collective that completed on some ranks and failed on others leaves those it failed
        at their commit and those it completed a commit or a step ahead: their state is whole
        (their collectives completed), and taking rank 0's instead would train committed
        steps again. Survivors that all hold the same state and a joiner-free world move
        nothing but one small allgather."""
        hvd = _hvd()
        self._resume()
        if hvd.size() == 1:
            return
        rt = _runtime.runtime()
        if rt is not None:
            rt.arrive("sync")
        # Whether a sampler's indices recorded one by one are allgathered must be the same on
        # every rank: a joiner's fresh sampler has recorded none yet, while the survivors' may
        # have. So the ranks agree on it here, in the allgather they make anyway.
        samplers = [v for v in self._values().values() if isinstance(v, ElasticSampler)]
        counts = hvd.allgather_object((self._commits, self._steps, [sp._raw for sp in samplers]))
        if rt is not None:
            rt.formed()  # every member got here: collectives now take --comm-timeout
        for i, sp in enumerate(samplers):
            sp._raw = any(c[2][i] for c in counts)
            sp._pool_processed()
        counts = [c[:2] for c in counts]
        if all(c == counts[0] for c in counts):
            self._after_sync()
            return
        src = max(range(len(counts)), key=lambda r: (counts[r][1], counts[r][0], -r))
        payload = hvd.broadcast_object(self._full_state() if hvd.rank() == src else None, src)
        if hvd.rank() != src:
            self._load_full_state(payload)
        self._after_sync()

    def _full_state(self) -> dict[str, Any]:
        return {"values": _cpu_copy(self._state_for_sync()), "commits": self._commits, "steps": self._steps}

    def _load_full_state(self, payload: dict[str, Any]) -> None:
        for k, v in payload["values"].items():
            cur = getattr(self, k)
            if hasattr(cur, "load_state_dict") and hasattr(cur, "state_dict"):
                cur.load_state_dict(v)
            else:
                setattr(self, k, v)
        self._commits, self._steps = payload["commits"], payload["steps"]

    def _after_sync(self) -> None:
        for v in self._values().values():
            if isinstance(v, ElasticSampler):
                v.reset()
        self.save()


class TorchState(ObjectState):
    """Model and optimizer state dicts plus any attributes (epoch, batch, a sampler), committed
    in host memory, restored after a failure, synced from the most advanced rank after every
    reset."""

    def __init__(self, model: Optional[torch.nn.Module] = None, optimizer: Optional[torch.optim.Optimizer] = None, **kwargs: Any) -> None:
        self.model, self.optimizer = model, optimizer
        extra = {}
        if model is not None:
            extra["model"] = model
        if optimizer is not None:
            extra["optimizer"] = optimizer
        super().__init__(**extra, **kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("model", "optimizer") and hasattr(self, "_known") and value is not None and name not in self._known:
            self._known.append(name)
        super().__setattr__(name, value)


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorates the training function: it is run again after each reset, from the last commit
    after a failure, from where it was after a change of hosts."""

    @functools.wraps(func)
    def wrapper(state: ObjectState, *args: Any, **kwargs: Any) -> Any:
        hvd = _hvd()
        if not hvd.is_initialized():
            hvd.init()
        skip_sync = False
        while True:
            rt = _runtime.runtime()
            failure, updated = "", False
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError as e:
                if rt is None:
                    raise
                failure = str(e) or type(e).__name__
            except HostsUpdatedInterrupt as e:
                if rt is None:
                    raise
                updated, skip_sync = True, e.skip_sync
            # Reset outside the except blocks: the exception's traceback holds the frames of
            # the failed collective, and with them the old process group, whose sockets must
            # close now, so that peers still blocked in it fail at once instead of waiting
            # for the communication timeout.
            hvd._forget_inflight()
            if failure:
                steps, secs = state.rolled_back()
                print(f"elasticd: generation {rt.generation}: {failure}; restoring the last commit ({steps} steps back)", flush=True)
                state.restore()
                skip_sync = False
                rt.reset(steps, secs, failure)
            elif updated:
                rt.reset()
            state.on_reset()

    return wrapper


class ElasticSampler(torch.utils.data.Sampler):
    """Shards a data set over the ranks so that, across resets and changes of world size,
    every sample is processed exactly once per epoch: what has been processed (record_batch /
    record_indices) is pooled from every rank at each commit and travels in the state, and the
    rest of the epoch is split over the current world."""

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self._fresh: list[int] = []  # recorded by record_indices since the last pooling
        self._raw = False            # record_indices was used: pooling needs an allgather
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.processed_indices = set()
        self._fresh = []
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        self.processed_indices.update(self.get_indices(batch_idx, batch_size))
        self._upto = max(self._upto, min((batch_idx + 1) * batch_size, len(self.indices)))

    def record_indices(self, indices: Any) -> None:
        """Marks indices as processed on this rank. Once any rank has used it, every commit
        allgathers the indices recorded since the last one: call it on every rank alike (each
        batch, as Horovod's examples do); the ranks agree again at every sync, so ranks that
        have just joined take part."""
        new = [int(i) for i in indices]
        self.processed_indices.update(new)
        self._fresh.extend(new)
        self._raw = True

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        start = batch_idx * batch_size
        return self.indices[start: min(start + batch_size, len(self.indices))]

    def _pool_processed(self) -> None:
        """Adds what every rank has processed. Batches need no message: every rank knows every
        partition, and ranks record batches in step, so the first `_upto` indices of each
        partition are done. Indices recorded one by one (record_indices) are allgathered."""
        # Partition r's i-th index is padded[r + i * num_replicas]: add only what is new since
        # the last pooling, so a commit per step costs a batch's worth, not the epoch's.
        n = self.num_replicas
        self.processed_indices.update(self._padded[self._pooled * n: self._upto * n])
        self._pooled = max(self._pooled, self._upto)
        hvd = _hvd()
        if self._raw and hvd.is_initialized() and hvd.size() > 1:
            got = hvd.allgather(torch.tensor(self._fresh, dtype=torch.int64, device=hvd._scalar_device())).cpu()
            self.processed_indices.update(got.tolist())
        self._fresh = []

    def reset(self) -> None:
        """Splits what is left of the epoch over the current world."""
        hvd = _hvd()
        self._partition(hvd.size() if hvd.is_initialized() else 1, hvd.rank() if hvd.is_initialized() else 0)

    def _partition(self, num_replicas: int, rank: int) -> None:
        self.num_replicas, self.rank = num_replicas, rank
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        remaining = [i for i in order if i not in self.processed_indices]
        self.num_samples = int(math.ceil(len(remaining) / self.num_replicas)) if remaining else 0
        total = self.num_samples * self.num_replicas
        # Pad so that every rank gets as many batches (collectives stay in step); the padding
        # repeats remaining samples, at most num_replicas - 1 of them, once per epoch tail.
        padded = remaining + remaining[: total - len(remaining)]
        self.indices = padded[self.rank: total: self.num_replicas]
        self._padded, self._upto, self._pooled = padded, 0, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.processed_indices = set(state["processed_indices"])
        self._fresh = []
        self.reset()

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
