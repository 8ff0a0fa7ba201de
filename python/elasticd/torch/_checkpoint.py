"""TorchState's commits on disk (`elasticd run --checkpoint-dir`), so that a job that lost
every worker at once resumes from the newest one instead of from the start.

A file is MAGIC | commits u64 | steps u64 | length u64 | sha256(payload) | payload, the
payload being torch.save of the committed state; it is written to a temporary name, synced
and renamed, so that a reader sees all of it or nothing. A torn or corrupt file fails its
length or digest and is skipped with the reason, never loaded. The newest two are kept.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import sys
import tempfile
from typing import Any, NamedTuple, Optional

import torch

MAGIC = b"ELASTICD-TORCH-CKPT\x01"
_HEAD = struct.Struct("<QQQ")
_PREFIX, _SUFFIX, _KEEP = "torch-", ".ckpt", 2


class Checkpoint(NamedTuple):
    path: str
    commits: int
    steps: int
    state: Any


def _files(directory: str) -> list[str]:
    try:
        names = [n for n in os.listdir(directory) if n.startswith(_PREFIX) and n.endswith(_SUFFIX)]
    except FileNotFoundError:
        return []
    return sorted(names, reverse=True)  # zero-padded steps, then commits: newest first


def write(directory: str, commits: int, steps: int, state: Any) -> str:
    """Writes state as the checkpoint of commit `commits` at step `steps`; returns its path."""
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, f"{_PREFIX}{steps:020d}-{commits:020d}{_SUFFIX}")
    fd, tmp = tempfile.mkstemp(prefix=".tmp-" + _PREFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + _HEAD.pack(commits, steps, len(data)) + hashlib.sha256(data).digest())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)  # the rename itself must survive a crash
    finally:
        os.close(dfd)
    for old in _files(directory)[_KEEP:]:
        try:
            os.unlink(os.path.join(directory, old))
        except OSError:
            pass
    return final


def read(path: str) -> Checkpoint:
    """Reads and verifies one file; ValueError says what is wrong with it."""
    with open(path, "rb") as f:
        b = f.read()
    head = len(MAGIC) + _HEAD.size + 32
    if len(b) < head or not b.startswith(MAGIC):
        raise ValueError("not an elasticd.torch checkpoint, or cut short")
    commits, steps, n = _HEAD.unpack_from(b, len(MAGIC))
    digest, data = b[len(MAGIC) + _HEAD.size: head], b[head:]
    if len(data) != n:
        raise ValueError(f"torn: {len(data)} bytes of state where the header says {n}")
    if hashlib.sha256(data).digest() != digest:
        raise ValueError("corrupt: the state does not match its digest")
    return Checkpoint(path, commits, steps, torch.load(io.BytesIO(data), map_location="cpu"))


def newest(directory: str) -> Optional[Checkpoint]:
    """The newest valid checkpoint in directory, or None; invalid ones are reported and skipped."""
    for name in _files(directory):
        path = os.path.join(directory, name)
        try:
            return read(path)
        except (OSError, ValueError, RuntimeError) as e:
            print(f"elasticd: checkpoint {path} skipped: {e}", file=sys.stderr, flush=True)
    return None
