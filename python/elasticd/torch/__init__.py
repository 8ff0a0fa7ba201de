"""Horovod's PyTorch API on torch.distributed: `import elasticd.torch as hvd`.

Under `elasticd run` the process group comes from the driver's rendezvous and is rebuilt at
every reset (elastic.run); elsewhere `init()` reads torchrun's environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) or, with none, makes a group of one. A collective that fails
because a peer is lost or silent raises HorovodInternalError. docs/pytorch.md ("From
Horovod") lists what is supported.
"""

from __future__ import annotations

import datetime
import os
import tempfile
import weakref
from typing import Any, Iterable, Optional, Union

import torch
import torch.distributed as dist

from elasticd.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from elasticd.torch import _runtime

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
    "nccl_built", "gloo_built", "mpi_built", "mpi_enabled", "gloo_enabled",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "synchronize", "poll",
    "allgather", "allgather_object", "broadcast", "broadcast_", "broadcast_object",
    "broadcast_parameters", "broadcast_optimizer_state", "join", "barrier",
    "Average", "Sum", "Min", "Max", "Adasum", "Compression", "DistributedOptimizer",
    "HorovodInternalError", "HostsUpdatedInterrupt", "elastic",
]


class _Op:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"hvd.{self.name}"


Average, Sum, Min, Max, Adasum = _Op("Average"), _Op("Sum"), _Op("Min"), _Op("Max"), _Op("Adasum")
_REDUCE = {"Sum": dist.ReduceOp.SUM, "Average": dist.ReduceOp.SUM, "Min": dist.ReduceOp.MIN, "Max": dist.ReduceOp.MAX}

_local: dict[str, int] = {}  # outside elasticd: local/cross ranks from the environment


def init(*args: Any, **kwargs: Any) -> None:
    """Joins the job: under elasticd, through its rendezvous; else from torchrun's environment,
    or as a group of one."""
    if dist.is_initialized():
        return
    if os.environ.get("ELASTICD_RENDEZVOUS"):
        _runtime.start()
        return
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" in env:
        dist.init_process_group(_runtime.default_backend())
    else:
        store = dist.FileStore(tempfile.mktemp(prefix="elasticd-single-"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    _local.update(local_rank=int(env.get("LOCAL_RANK", 0)), local_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
                  cross_rank=int(env.get("GROUP_RANK", 0)), cross_size=int(env.get("GROUP_WORLD_SIZE", 1)))


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def is_initialized() -> bool:
    return dist.is_initialized()


def _check() -> None:
    if not dist.is_initialized():
        raise ValueError("elasticd.torch has not been initialized: call hvd.init() first")


def _scalar_device() -> torch.device:
    return _runtime.scalar_device(dist.get_backend())


def _placed(key: str) -> int:
    _check()
    rt = _runtime.runtime()
    if rt is not None:
        return int(rt.assignment[key])
    return _local[key]


def rank() -> int:
    _check()
    return dist.get_rank()


def size() -> int:
    _check()
    return dist.get_world_size()


def local_rank() -> int:
    return _placed("local_rank")


def local_size() -> int:
    return _placed("local_size")


def cross_rank() -> int:
    return _placed("cross_rank")


def cross_size() -> int:
    return _placed("cross_size")


def nccl_built() -> bool:
    return dist.is_nccl_available()


def gloo_built() -> bool:
    return dist.is_gloo_available()


def mpi_built() -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def gloo_enabled() -> bool:
    return dist.is_gloo_available()


# -- collectives --

def _guard(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Runs a collective; a failure of the group (lost peer, timeout) is HorovodInternalError."""
    _check()
    try:
        return fn(*args, **kwargs)
    except RuntimeError as e:
        raise HorovodInternalError(str(e)) from e


def _op(op: Optional[_Op], average: Optional[bool]) -> _Op:
    if op is None:
        op = Average if average is None or average else Sum
    if op is Adasum:
        raise NotImplementedError("hvd.Adasum is not supported by elasticd.torch: use hvd.Average or hvd.Sum")
    if not isinstance(op, _Op):
        raise ValueError(f"op {op!r}: use hvd.Average, hvd.Sum, hvd.Min or hvd.Max")
    return op


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None, op: Optional[_Op] = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None,
               compression: Any = None) -> torch.Tensor:
    """Reduces tensor in place across ranks (Average by default) and returns it."""
    o = _op(op, average)
    comp = compression or Compression.none
    if prescale_factor != 1.0:
        tensor.mul_(prescale_factor)
    wire, ctx = comp.compress(tensor)
    _guard(dist.all_reduce, wire, op=_REDUCE[o.name])
    out = comp.decompress(wire, ctx)
    if out is not tensor:
        tensor.copy_(out)
    if o is Average:
        tensor.div_(size())
    if postscale_factor != 1.0:
        tensor.mul_(postscale_factor)
    return tensor


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None, compression: Any = None,
              op: Optional[_Op] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None) -> torch.Tensor:
    """A new tensor: tensor reduced across ranks (Average by default)."""
    return allreduce_(tensor.detach().clone(), average, name, op, prescale_factor, postscale_factor, process_set, compression)


class _Handle:
    def __init__(self, result: Any) -> None:
        self.result = result


def allreduce_async(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> _Handle:
    """Horovod's asynchronous form; here the reduction is done when it returns."""
    return _Handle(allreduce(tensor, *args, **kwargs))


def allreduce_async_(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> _Handle:
    return _Handle(allreduce_(tensor, *args, **kwargs))


def poll(handle: _Handle) -> bool:
    return True


def synchronize(handle: _Handle) -> Any:
    return handle.result


def allgather(tensor: torch.Tensor, name: Optional[str] = None, process_set: Any = None) -> torch.Tensor:
    """Every rank's tensor, concatenated along the first dimension (whose sizes may differ)."""
    t = tensor if tensor.dim() > 0 else tensor.reshape(1)
    n = size()
    sizes = [torch.zeros(1, dtype=torch.int64, device=t.device) for _ in range(n)]
    _guard(dist.all_gather, sizes, torch.tensor([t.shape[0]], dtype=torch.int64, device=t.device))
    longest = int(max(int(s.item()) for s in sizes))
    if longest == 0:
        return t[:0].clone()
    padded = t
    if t.shape[0] < longest:
        padded = torch.cat([t, t.new_zeros((longest - t.shape[0],) + tuple(t.shape[1:]))])
    parts = [torch.empty_like(padded) for _ in range(n)]
    _guard(dist.all_gather, parts, padded.contiguous())
    return torch.cat([p[: int(s.item())] for p, s in zip(parts, sizes)])


def allgather_object(obj: Any, name: Optional[str] = None) -> list[Any]:
    out: list[Any] = [None] * size()
    _guard(dist.all_gather_object, out, obj)
    return out


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set: Any = None) -> torch.Tensor:
    _guard(dist.broadcast, tensor, src=root_rank)
    return tensor


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set: Any = None) -> torch.Tensor:
    return broadcast_(tensor.detach().clone(), root_rank)


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None, process_set: Any = None) -> Any:
    box = [obj]
    _guard(dist.broadcast_object_list, box, src=root_rank)
    return box[0]


def broadcast_parameters(params: Union[dict[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]], root_rank: int) -> None:
    """Makes every rank's parameters (a state_dict, or named_parameters()) equal to root_rank's."""
    items = params.items() if isinstance(params, dict) else params
    for _, p in sorted(items, key=lambda kv: kv[0]):
        if isinstance(p, torch.Tensor):
            with torch.no_grad():
                broadcast_(p.data if p.requires_grad else p, root_rank)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Makes every rank's optimizer state (moments, step counts, learning rates) root_rank's."""
    state = broadcast_object(optimizer.state_dict() if rank() == root_rank else None, root_rank)
    if rank() != root_rank:
        optimizer.load_state_dict(state)


def barrier(process_set: Any = None) -> None:
    _guard(dist.barrier)


def join(device: int = -1) -> int:
    """Waits for every rank; returns the highest rank (Horovod: the last to join)."""
    t = torch.tensor([rank()], dtype=torch.int64, device=_scalar_device())
    _guard(dist.all_reduce, t, op=dist.ReduceOp.MAX)
    return int(t.item())


# -- gradients --

class _NoCompression:
    @staticmethod
    def compress(t: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return t, None

    @staticmethod
    def decompress(t: torch.Tensor, ctx: Any) -> torch.Tensor:
        return t


class _FP16Compression:
    """Sends floating-point tensors as float16, halving the bytes on the wire."""

    @staticmethod
    def compress(t: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if t.dtype.is_floating_point and t.dtype != torch.float16:
            return t.to(torch.float16), t.dtype
        return t, None

    @staticmethod
    def decompress(t: torch.Tensor, ctx: Any) -> torch.Tensor:
        return t.to(ctx) if ctx is not None else t


class Compression:
    none = _NoCompression
    fp16 = _FP16Compression


_BUCKET_BYTES = 25 << 20  # as DDP: fewer, larger messages

_optimizers: "weakref.WeakSet[_DistributedOptimizerMixin]" = weakref.WeakSet()


def _forget_inflight() -> None:
    """Drops the reductions in flight in the group being left (a reset): they hold it open."""
    for opt in list(_optimizers):
        opt._elasticd_clear()


class _DistributedOptimizerMixin:
    """Mixed into the user's optimizer class: gradients are averaged across ranks in buckets
    of ~25 MB, each one asynchronous collective started from a gradient hook as soon as the
    last gradient of its bucket is computed, so communication overlaps the rest of backward;
    step() waits for them. Buckets are fixed at wrapping (parameters in reverse, the order
    backward produces them) and started in that order on every rank, whatever order the
    hooks fire in; a parameter with no gradient at step() is reduced as zeros, so that every
    rank reduces the same buckets."""

    def _elasticd_setup(self, named_parameters: Any, compression: Any, backward_passes_per_step: int, op: _Op,
                        gradient_predivide_factor: float) -> None:
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step {backward_passes_per_step}: must be at least 1")
        self._elasticd_compression = compression or Compression.none
        self._elasticd_op = _op(op, None)
        self._elasticd_predivide = gradient_predivide_factor
        self._elasticd_passes = backward_passes_per_step
        self._elasticd_synced = False
        params = [p for g in self.param_groups for p in g["params"]]  # type: ignore[attr-defined]
        if named_parameters is not None:
            named = list(named_parameters)
            names = [n for n, _ in named]
            if len(set(names)) != len(names):
                raise ValueError("named_parameters has duplicate names")
            ours = {id(p) for p in params}
            if any(id(p) not in ours for _, p in named):
                raise ValueError("named_parameters names a parameter the optimizer does not hold")
        buckets: list[list[torch.Tensor]] = []
        nbytes = 0
        for p in reversed([p for p in params if p.requires_grad]):
            if buckets and p.dtype == buckets[-1][0].dtype and p.device == buckets[-1][0].device and nbytes < _BUCKET_BYTES:
                buckets[-1].append(p)
                nbytes += p.numel() * p.element_size()
            else:
                buckets.append([p])
                nbytes = p.numel() * p.element_size()
        self._elasticd_buckets = buckets
        self._elasticd_bucket_of = {id(p): k for k, b in enumerate(buckets) for p in b}
        self._elasticd_hooks: list[Any] = []
        for b in buckets:
            for p in b:
                if p.is_leaf:
                    acc = p.expand_as(p).grad_fn.next_functions[0][0]  # the gradient accumulator
                    acc.register_hook(self._elasticd_hook(p))
                    self._elasticd_hooks.append(acc)  # keeps it, and so its hook, alive
        self._elasticd_clear()
        _optimizers.add(self)

    def _elasticd_clear(self) -> None:
        self._elasticd_counts: dict[int, int] = {}
        self._elasticd_left = [len(b) for b in self._elasticd_buckets]
        self._elasticd_next = 0     # the next bucket to start: they start in order
        self._elasticd_inflight: list[Any] = []
        self._elasticd_error: Optional[BaseException] = None
        self._elasticd_early = 0    # buckets started from hooks, during backward

    def _elasticd_hook(self, p: torch.Tensor) -> Any:
        def hook(*_: Any) -> None:
            if not dist.is_initialized() or dist.get_world_size() == 1:
                return
            n = self._elasticd_counts.get(id(p), 0) + 1
            self._elasticd_counts[id(p)] = n
            if n > self._elasticd_passes:
                raise AssertionError(f"gradients were computed {n} times before step(), more than "
                                     f"backward_passes_per_step={self._elasticd_passes}: call step() after each "
                                     "group of backward passes, or raise backward_passes_per_step")
            if n == self._elasticd_passes:
                k = self._elasticd_bucket_of[id(p)]
                self._elasticd_left[k] -= 1
                while self._elasticd_next < len(self._elasticd_buckets) and self._elasticd_left[self._elasticd_next] == 0:
                    self._elasticd_start(self._elasticd_next)
                    self._elasticd_early += 1
        return hook

    def _elasticd_start(self, k: int) -> None:
        """Starts bucket k's reduction (async); an error is kept for synchronize() to raise.
        The last bucket also carries this rank's pending host-update version (see
        _runtime.Runtime.piggyback): its sum tells every rank at once whether any heard one."""
        self._elasticd_next = k + 1
        bucket = self._elasticd_buckets[k]
        for p in bucket:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        parts = [p.grad.reshape(-1) for p in bucket]
        rt = _runtime.runtime()
        extra = (rt is not None and k == len(self._elasticd_buckets) - 1 and self._elasticd_op.name in ("Sum", "Average")
                 and self._elasticd_compression is Compression.none and parts[0].dtype in (torch.float32, torch.float64))
        if extra:
            parts.append(torch.tensor([float(rt.pending_update())], dtype=parts[0].dtype, device=parts[0].device))
        flat = torch.cat(parts)
        if self._elasticd_predivide != 1.0:
            flat.mul_(1.0 / self._elasticd_predivide)
        wire, ctx = self._elasticd_compression.compress(flat)
        work = None
        if self._elasticd_error is None:
            try:
                work = dist.all_reduce(wire, op=_REDUCE[self._elasticd_op.name], async_op=True)
            except RuntimeError as e:
                self._elasticd_error = e
        self._elasticd_inflight.append((work, wire, ctx, bucket, extra))

    def synchronize(self) -> None:
        """Averages the gradients now: starts the buckets the hooks did not and waits for all
        (step() does it unless skip_synchronize())."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            self._elasticd_synced = True
            return
        try:
            for k in range(self._elasticd_next, len(self._elasticd_buckets)):
                self._elasticd_start(k)
            n = dist.get_world_size()
            for work, wire, ctx, bucket, extra in self._elasticd_inflight:
                if self._elasticd_error is not None:
                    raise HorovodInternalError(str(self._elasticd_error)) from self._elasticd_error
                _guard(work.wait)
                out = self._elasticd_compression.decompress(wire, ctx)
                if self._elasticd_predivide != 1.0:
                    out.mul_(self._elasticd_predivide)
                if extra:
                    rt = _runtime.runtime()
                    if rt is not None:
                        rt.piggyback(round(float(out[-1])))
                    out = out[:-1]
                if self._elasticd_op is Average:
                    out.div_(n)
                off = 0
                for p in bucket:
                    p.grad.copy_(out[off: off + p.numel()].view_as(p.grad))
                    off += p.numel()
            if self._elasticd_error is not None:
                raise HorovodInternalError(str(self._elasticd_error)) from self._elasticd_error
        finally:
            self._elasticd_clear()
        self._elasticd_synced = True

    class _Skip:
        def __init__(self, opt: "_DistributedOptimizerMixin") -> None:
            self.opt = opt

        def __enter__(self) -> None:
            self.opt._elasticd_synced = True

        def __exit__(self, *exc: Any) -> None:
            self.opt._elasticd_synced = False

    def skip_synchronize(self) -> "_DistributedOptimizerMixin._Skip":
        """`with optimizer.skip_synchronize(): optimizer.step()` after an explicit synchronize()."""
        return _DistributedOptimizerMixin._Skip(self)

    def step(self, closure: Any = None) -> Any:
        if not self._elasticd_synced:
            self.synchronize()
        self._elasticd_synced = False
        return super(self.__class__, self).step(closure)  # type: ignore[misc]


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Any = None, compression: Any = None,
                         backward_passes_per_step: int = 1, op: Optional[_Op] = None,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups: Any = None,
                         sparse_as_dense: bool = False, process_set: Any = None) -> torch.optim.Optimizer:
    """Wraps an optimizer so that step() averages the gradients across ranks first. The result
    is still an instance of the optimizer's class (LR schedulers accept it); with
    backward_passes_per_step=N, call step() after N backward passes, as with Horovod."""
    methods = {k: v for k, v in _DistributedOptimizerMixin.__dict__.items() if k not in ("__dict__", "__weakref__")}
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), methods)
    obj = cls.__new__(cls)
    obj.__dict__.update(optimizer.__dict__)
    obj._elasticd_setup(named_parameters, compression, backward_passes_per_step, op or Average, gradient_predivide_factor)
    return obj


from elasticd.torch import elastic  # noqa: E402  (it uses the functions above)
