"""The process group of each generation, built from the driver's rendezvous.

A worker launched by `elasticd run` for generation G registers (READY for G-1), waits for its
assignment, and builds a torch.distributed process group for it: rank 0 opens a TCPStore on a
free port of its host and publishes `host:port` in the driver's key-value store under the
generation, the others read it (long-poll) and connect; each generation gets a fresh store and
group, so a reset never meets an old world. Collectives time out after ELASTICD_COMM_TIMEOUT.
At a reset the group is destroyed, the worker reports READY for its generation (with what it
rolled back) and waits for the next assignment; a worker given no place exits 0.
"""

from __future__ import annotations

import datetime
import gc
import os
import re
import sys
import threading
import time
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from elasticd import _rendezvous
from elasticd.common.exceptions import HorovodInternalError

_STORE_KEY = "torch/store"
# How long a generation's members wait for each other to form it (see Runtime._build), unless
# ELASTICD_FORMATION_TIMEOUT says otherwise.
FORMATION_TIMEOUT = datetime.timedelta(seconds=60)


def await_members(store: Any, key: str, size: int, deadline: float, superseded: Callable[[], bool],
                  poll: float = 0.05) -> None:
    """Counts this member in at `key` on the generation's store and returns once all `size`
    members have; raises RuntimeError at `deadline` (seconds since the epoch), or as soon as
    `superseded()` (asked about once a second) says the driver has given the generation up,
    so that a member never waits for a group that will not form."""
    store.add(key, 1)
    next_check = 0.0
    while True:
        arrived = int(store.add(key, 0))
        if arrived >= size:
            return
        now = time.time()
        if now >= deadline:
            raise RuntimeError(f"{arrived} of {size} members reached the group before its formation timeout")
        if now >= next_check:
            if superseded():
                raise RuntimeError("the driver gave this generation up while it formed (a member failed, or a later one was published)")
            next_check = now + 1.0
        time.sleep(poll)


def neighbours(rank: int, size: int) -> list[int]:
    """The ranks a member probes after a failure: its ring neighbours and its recursive-
    doubling partners (rank XOR 1, 2, 4, ...), sorted, without itself."""
    out = {(rank - 1) % size, (rank + 1) % size}
    k = 1
    while k < size:
        if rank ^ k < size:
            out.add(rank ^ k)
        k <<= 1
    out.discard(rank)
    return sorted(out)


def parse_duration(text: str) -> float:
    """ELASTICD_COMM_TIMEOUT, a Go duration, in seconds."""
    return _rendezvous.parse_duration(text, "ELASTICD_COMM_TIMEOUT")


def default_backend() -> str:
    """The process group's backend: gloo without CUDA. With CUDA, NCCL for CUDA tensors and gloo
    for CPU ones where torch takes both at once (2.0 and later): a Horovod script may keep its
    model on the CPU of a GPU host, and elasticd's own small collectives use CPU tensors.
    Older torch gets NCCL alone (see scalar_device)."""
    if not torch.cuda.is_available():
        return "gloo"
    major = int(re.match(r"\d+", torch.__version__).group())  # "2.11.0+cu130"
    return "cpu:gloo,cuda:nccl" if major >= 2 else "nccl"


def scalar_device(backend: str) -> torch.device:
    """Where elasticd puts the tensors of its own collectives: the current GPU under NCCL alone,
    which takes no CPU tensors, else the CPU."""
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# gloo: "Timed out waiting 30000ms for recv operation to complete"; NCCL's watchdog and
# blocking wait: "... collective operation timeout ..." / "... timed out ...".
_TIMEOUT = re.compile(r"timed out|timeout", re.IGNORECASE)


def is_timeout(failure: str) -> bool:
    """Whether a collective's error says it waited out the communication timeout: a peer that
    stopped answering, rather than one whose connection broke."""
    return bool(_TIMEOUT.search(failure))


class Runtime:
    """The elastic state of this process: its client, its current generation and group."""

    def __init__(self) -> None:
        env = os.environ
        self.worker = env["ELASTICD_WORKER_ID"]
        wait = env.get("ELASTICD_DRIVER_WAIT", "")
        self.client = _rendezvous.Client(env["ELASTICD_RENDEZVOUS"], bytes.fromhex(env["ELASTICD_SECRET"]), self.worker,
                                         driver_wait=_rendezvous.parse_duration(wait, "ELASTICD_DRIVER_WAIT") if wait else 0.0)
        self.launched = int(env.get("ELASTICD_GENERATION", "1"))
        self.host_addr = env.get("ELASTICD_HOST_ADDR", "127.0.0.1")
        self.timeout = parse_duration(env.get("ELASTICD_COMM_TIMEOUT", "30s"))
        # How long the members of a generation wait for each other (a new worker importing
        # torch and building its model): a member hung or stopped meanwhile costs that long.
        form = env.get("ELASTICD_FORMATION_TIMEOUT", "")
        self.formation = max(self.timeout, _rendezvous.parse_duration(form, "ELASTICD_FORMATION_TIMEOUT") if form
                             else FORMATION_TIMEOUT.total_seconds())
        # --checkpoint-dir and --checkpoint-every: TorchState writes rank 0's commit there,
        # and a rank 0 without a commit (the job lost every worker) resumes from it.
        self.ckpt_dir = env.get("ELASTICD_CHECKPOINT_DIR", "")
        self.ckpt_every = max(1, int(env.get("ELASTICD_CHECKPOINT_EVERY", "10") or "10"))
        self.backend = default_backend()
        if "nccl" in self.backend:
            # A collective with a lost peer must raise in the caller after the timeout (and
            # leave the process alive to reset), not hang or kill the process.
            env.setdefault("NCCL_BLOCKING_WAIT", "1")
            env.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
        self.generation = 0
        self.assignment: dict[str, Any] = {}
        self._store: Optional[dist.TCPStore] = None
        self._lower_timeout: Optional[Callable[[], None]] = None
        # Host updates: the newest version heard (a background long-poll) and the newest one
        # the current plan already reflects.
        self.heard = 0
        self.applied = 0
        self._lock = threading.Lock()
        self._piggyback: Optional[tuple[int, int]] = None  # (generation, sum of pending versions)
        self._watcher = threading.Thread(target=self._watch_hosts, name="elasticd-hosts", daemon=True)
        self._probe: Optional[_rendezvous.ProbeListener] = None  # peers dial it to ask whether this host is reachable

    # -- membership --

    def start(self) -> None:
        """Registers and builds the first group."""
        self.client.report(self.launched - 1, "READY")
        self.join(self.launched - 1)
        self._watcher.start()

    def join(self, after: int) -> None:
        """Waits for a place in a generation after `after` and builds its group; a worker the
        driver has no place for exits 0 (its host left, or the job is over)."""
        while True:
            a = self.client.assignment(after)
            assert a is not None
            if a.get("removed"):
                print(f"elasticd: {self.worker} has no place in generation {a['generation']}: exiting", file=sys.stderr, flush=True)
                sys.exit(0)
            self.assignment, self.generation = a, int(a["generation"])
            with self._lock:
                self.applied = max(self.applied, int(a.get("hosts_version", 0)))
            try:
                self._build()
                return
            except (_rendezvous.GenerationGone, RuntimeError) as e:
                # The generation was abandoned while it formed, or a member did not come in
                # time: ask for the next one, naming the neighbours whose hosts do not answer
                # (a network cut, for the driver). A member that never came is hung or stopped
                # (or still starting, past the formation timeout): the report says a peer went
                # silent, so that the driver fails it at once rather than at --barrier-timeout.
                # Unless the generation was overtaken as it formed: its members then left it to
                # reset (a host update, a newer generation), and a timeout on them found no hung
                # peer. Said silent, it would have the driver fail whichever member was slowest
                # to leave, often one still starting: under a soak's churn, a worker failed each
                # round, its slot's return a host update, and no round training.
                print(f"elasticd: generation {self.generation} did not form ({e}); waiting for the next", file=sys.stderr, flush=True)
                self._teardown()
                unreachable, reached = self.probe_neighbours()
                silent = is_timeout(str(e)) and not self.overtaken()
                self.client.report(self.generation, "READY", message=f"generation did not form: {e}",
                                   silent_peer=silent, unreachable_ranks=unreachable, reached_ranks=reached)
                after = self.generation

    def overtaken(self) -> bool:
        """Whether the current generation has been overtaken: a host update its plan does not
        reflect, or a newer generation. Asks the driver (the agent's relay answers both at
        once), without waiting; an error counts as not overtaken."""
        now = time.time()
        try:
            with self._lock:
                applied = self.applied
            if self.client.hosts_version(applied, deadline=now) is not None:
                return True
            return self.client.assignment(self.generation, deadline=now) is not None
        except Exception:
            return False

    def _build(self) -> None:
        a, gen = self.assignment, self.generation
        rank, size = int(a["rank"]), int(a["size"])
        timeout = datetime.timedelta(seconds=self.timeout)
        # Forming a group waits for its slowest member: a new process still importing torch
        # and building its model, or a survivor still leaving the last generation. With the
        # collectives' timeout (a few seconds, to find a hung peer fast) members that arrive a
        # little apart time out in turn, each starting another generation that the others then
        # reach late: a livelock, seen with torch 2.11. Where torch can lower a group's timeout,
        # the group forms under a longer one, and takes the collectives' timeout once every
        # member has reached the state sync of elastic.run (formed()).
        # Older torch (before 2.3) cannot lower a group's timeout: there the group forms under
        # the collectives' timeout, and forming takes moments once every member has reached
        # the generation's store. Seen livelocking with torch 1.13 under load without it.
        # So first every member waits, under the formation timeout, until all have reached
        # the store (await_members), asking the driver once a second whether the generation
        # was abandoned: a member that died before it arrived (a worker killed as it started)
        # would otherwise hold the others in init_process_group for the whole formation
        # timeout, past the driver's reset barrier, which then fails them all.
        set_pg_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
        form = timeout if set_pg_timeout is None else datetime.timedelta(seconds=self.formation)
        if rank == 0:
            store = dist.TCPStore(self.host_addr, 0, size, True, timeout=form, wait_for_workers=False)
            self.client.kv_put(gen, _STORE_KEY, f"{self.host_addr}:{store.port}".encode())
        else:
            addr = self.client.kv_get(gen, _STORE_KEY, deadline=time.time() + self.formation)
            if addr is None:
                raise RuntimeError("rank 0 did not publish its store before the formation timeout")
            host, port = addr.decode().rsplit(":", 1)
            store = dist.TCPStore(host.strip("[]"), int(port), size, False, timeout=form)
        self._store = store
        if size > 1:
            if self._probe is None:
                try:
                    self._probe = _rendezvous.ProbeListener(self.host_addr)
                except OSError as e:
                    print(f"elasticd: cannot listen for peers' probes on {self.host_addr}: {e}", file=sys.stderr, flush=True)
            if self._probe is not None:
                self.client.kv_put(gen, f"elasticd/probe/{rank}", self._probe.addr.encode())
            await_members(store, f"elasticd/g{gen}/arrived", size,
                          time.time() + self.formation,
                          lambda: self._abandoned(gen))
        dist.init_process_group(self.backend, store=dist.PrefixStore(f"elasticd/g{gen}", store), rank=rank, world_size=size, timeout=form)
        self._lower_timeout = None
        if form != timeout:
            assert set_pg_timeout is not None

            def lower() -> None:
                set_pg_timeout(timeout)
                store.set_timeout(timeout)
            self._lower_timeout = lower

    def _abandoned(self, gen: int) -> bool:
        """Whether the driver has given up generation `gen` while it formed: it published a
        later one, or began a reset (a member failed), which it marks in the generation's
        store as it does for Go workers (allreduce.Abandon)."""
        if self.client.assignment(gen, deadline=time.time()) is not None:
            return True
        return self.client.kv_get(gen, f"allreduce/g{gen}/abandoned", deadline=time.time()) is not None

    def probe_neighbours(self) -> tuple[list[int], list[int]]:
        """The neighbours of this generation whose hosts do not answer a probe, and those whose
        hosts do, at the addresses published at its formation; a quarter of the collectives'
        timeout each, 0.2 s to 1 s. The neighbours are the ring's (rank ± 1) and the
        recursive-doubling partners (rank XOR 2^k), as Go workers probe: log2(size) + 2 hosts,
        enough for the driver, which joins the members that reach each other, to find which
        side of a cut each member is on."""
        size, rank, gen = int(self.assignment.get("size", 0)), int(self.assignment.get("rank", 0)), self.generation
        if size < 2:
            return [], []
        addrs: dict[int, str] = {}
        for r in neighbours(rank, size):
            try:
                v = self.client.kv_get(gen, f"elasticd/probe/{r}", deadline=time.time())
            except _rendezvous.RendezvousError:
                continue
            if v is not None:
                addrs[r] = v.decode()
        ranks = _rendezvous.probe_hosts(addrs, min(max(self.timeout / 4, 0.2), 1.0))
        if ranks:
            print(f"elasticd: generation {gen}: the hosts of ranks {ranks} do not answer: a network cut?", file=sys.stderr, flush=True)
        return ranks, sorted(r for r in addrs if r not in ranks)

    def arrive(self, what: str) -> None:
        """Waits, at the generation's store, until every member has reached `what` (the state
        sync of elastic.run), under the formation timeout, leaving as soon as the driver gives
        the generation up. The first collective of a generation then finds every member at
        it: a survivor reaches it straight from the reset, a new worker only after building
        its model, seconds later under load, and under the collectives' timeout (torch
        before 2.3 cannot form a group under a longer one) the survivors would time out in
        turn, generation after generation. Raises HorovodInternalError, so that elastic.run
        resets."""
        size, gen, store = int(self.assignment.get("size", 0)), self.generation, self._store
        if size < 2 or store is None:
            return
        try:
            await_members(store, f"elasticd/g{gen}/{what}", size,
                          time.time() + self.formation,
                          lambda: self._abandoned(gen), poll=0.02)
        except (RuntimeError, _rendezvous.RendezvousError) as e:
            raise HorovodInternalError(f"generation {gen}: {e}") from e

    def formed(self) -> None:
        """Every member of the generation reached its first collective together: from now on
        a silent peer is found after the collectives' timeout, not the formation's."""
        lower, self._lower_timeout = self._lower_timeout, None
        if lower is not None and dist.is_initialized():
            lower()

    def _teardown(self) -> None:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        self._store = None
        gc.collect()  # the group's last references may sit in cycles: close its sockets now

    def reset(self, rolled_back_steps: int = 0, rolled_back_seconds: float = 0.0, failure: str = "") -> None:
        """Leaves the current generation and joins the next. A failure that is a collective's
        timeout tells the driver a peer went silent (hung or stopped), so that it is failed at
        once instead of holding everyone at the barrier."""
        silent = is_timeout(failure)
        unreachable, reached = self.probe_neighbours() if silent else ([], [])
        self._teardown()
        self.client.report(self.generation, "READY", message=failure, rolled_back_steps=rolled_back_steps,
                           rolled_back_seconds=rolled_back_seconds, silent_peer=silent, unreachable_ranks=unreachable,
                           reached_ranks=reached)
        self.join(self.generation)

    # -- host updates --

    def _watch_hosts(self) -> None:
        while True:
            try:
                v = self.client.hosts_version(self.heard)
            except Exception:
                time.sleep(1.0)
                continue
            if v is not None:
                with self._lock:
                    self.heard = max(self.heard, v)

    def piggyback(self, total: int) -> None:
        """Records the sum over the ranks of pending_update(), as reduced with the gradients:
        the next check_host_updates() of this generation needs no collective of its own when
        it is 0. Every rank records the same sum at the same step, so they all decide alike."""
        self._piggyback = (self.generation, total)

    def take_piggyback(self) -> Optional[int]:
        """The sum recorded in this generation since the last call, or None."""
        got, self._piggyback = self._piggyback, None
        if got is None or got[0] != self.generation:
            return None
        return got[1]

    def pending_update(self) -> int:
        """The newest host-update version heard that the current plan does not reflect, or 0."""
        with self._lock:
            return self.heard if self.heard > self.applied else 0

    def applied_update(self, version: int) -> None:
        with self._lock:
            self.applied = max(self.applied, version)


_runtime: Optional[Runtime] = None


def runtime() -> Optional[Runtime]:
    return _runtime


def start() -> Runtime:
    global _runtime
    if _runtime is None:
        _runtime = Runtime()
        _runtime.start()
    return _runtime
