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
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
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
    t = torch.tensor([rank()], dtype=torch.int64)
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


class _DistributedOptimizerMixin:
    """Mixed into the user's optimizer class: step() first averages the gradients across
    ranks (in buckets of ~25 MB, each one collective)."""

    def _elasticd_setup(self, named_parameters: Any, compression: Any, backward_passes_per_step: int, op: _Op,
                        gradient_predivide_factor: float) -> None:
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step {backward_passes_per_step}: must be at least 1")
        self._elasticd_compression = compression or Compression.none
        self._elasticd_op = _op(op, None)
        self._elasticd_predivide = gradient_predivide_factor
        self._elasticd_passes = backward_passes_per_step
        self._elasticd_synced = False
        if named_parameters is not None:
            named = list(named_parameters)
            names = [n for n, _ in named]
            if len(set(names)) != len(names):
                raise ValueError("named_parameters has duplicate names")
            ours = {id(p) for g in self.param_groups for p in g["params"]}  # type: ignore[attr-defined]
            if any(id(p) not in ours for _, p in named):
                raise ValueError("named_parameters names a parameter the optimizer does not hold")

    def synchronize(self) -> None:
        """Averages the gradients now (step() does it unless skip_synchronize())."""
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]  # type: ignore[attr-defined]
        bucket: list[torch.Tensor] = []
        nbytes = 0
        for grad in grads + [None]:  # type: ignore[list-item]
            if grad is not None and (not bucket or (grad.dtype == bucket[0].dtype and grad.device == bucket[0].device and nbytes < _BUCKET_BYTES)):
                bucket.append(grad)
                nbytes += grad.numel() * grad.element_size()
                continue
            if bucket:
                flat = torch.cat([b.reshape(-1) for b in bucket])
                kw = {"op": self._elasticd_op, "compression": self._elasticd_compression}
                if self._elasticd_predivide != 1.0:
                    kw.update(prescale_factor=1.0 / self._elasticd_predivide, postscale_factor=self._elasticd_predivide)
                allreduce_(flat, **kw)
                off = 0
                for b in bucket:
                    b.copy_(flat[off: off + b.numel()].view_as(b))
                    off += b.numel()
            bucket, nbytes = ([grad], grad.numel() * grad.element_size()) if grad is not None else ([], 0)
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
