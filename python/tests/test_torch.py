"""elasticd.torch without a driver: Horovod's API in one process and in four (torchrun's
environment, gloo on loopback), the elastic sampler's arithmetic, and TorchState's commits.
Needs torch: run under Debian's /usr/bin/python3 (python3-torch)."""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import unittest
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
sys.path.insert(0, PKG)

try:
    import torch
except ImportError:  # pragma: no cover - said plainly, not skipped silently under CI
    if os.environ.get("CI"):
        raise SystemExit(f"{sys.executable} has no torch: run these tests under Debian's /usr/bin/python3 with python3-torch")
    raise unittest.SkipTest(f"{sys.executable} has no torch: use /usr/bin/python3 with python3-torch")

import torch.distributed as dist  # noqa: E402

import elasticd.torch as hvd  # noqa: E402
from elasticd.torch._runtime import await_members, neighbours  # noqa: E402
from elasticd.torch.elastic import ElasticSampler, TorchState  # noqa: E402

for k in ("ELASTICD_RENDEZVOUS", "RANK", "WORLD_SIZE", "MASTER_ADDR"):
    os.environ.pop(k, None)
hvd.init()  # a group of one


class SingleProcessTest(unittest.TestCase):
    def test_basics(self) -> None:
        self.assertTrue(hvd.is_initialized())
        self.assertEqual((hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()), (0, 1, 0, 1))
        self.assertTrue(hvd.gloo_built())
        self.assertFalse(hvd.mpi_built())

    def test_collectives_of_one(self) -> None:
        t = torch.arange(6, dtype=torch.float32)
        self.assertTrue(torch.equal(hvd.allreduce(t), t))
        self.assertTrue(torch.equal(hvd.allreduce(t, op=hvd.Sum), t))
        self.assertTrue(torch.equal(hvd.allgather(t), t))
        self.assertEqual(hvd.broadcast_object({"a": 1}, 0), {"a": 1})
        self.assertEqual(hvd.join(), 0)
        with self.assertRaisesRegex(NotImplementedError, "Adasum"):
            hvd.allreduce(t, op=hvd.Adasum)

    def test_backend_follows_cuda_and_torch_version(self) -> None:
        from unittest import mock

        from elasticd.torch._runtime import default_backend, scalar_device
        if not torch.cuda.is_available():
            self.assertEqual(default_backend(), "gloo")
        # A GPU host: NCCL for CUDA tensors and gloo for the CPU ones where torch takes both.
        with mock.patch.object(torch.cuda, "is_available", return_value=True):
            for version, want in [("2.11.0+cu130", "cpu:gloo,cuda:nccl"), ("2.0.1", "cpu:gloo,cuda:nccl"), ("1.13.1", "nccl")]:
                with mock.patch.object(torch, "__version__", version):
                    self.assertEqual(default_backend(), want, version)
        self.assertEqual(scalar_device("gloo"), torch.device("cpu"))
        self.assertEqual(scalar_device("cpu:gloo,cuda:nccl"), torch.device("cpu"))

    def test_timeouts_name_a_silent_peer(self) -> None:
        from elasticd.torch._runtime import is_timeout
        # gloo's words for a peer that stopped answering, and for one that is gone (torch 1.13)
        self.assertTrue(is_timeout("[./gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 2000ms for recv operation to complete"))
        self.assertTrue(is_timeout("[./gloo/transport/tcp/unbound_buffer.cc:133] Timed out waiting 2000ms for send operation to complete"))
        self.assertTrue(is_timeout("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 30000 milliseconds"))
        self.assertFalse(is_timeout("[./gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:41234"))
        self.assertFalse(is_timeout(""))

    def test_fp16_compression_round_trip(self) -> None:
        t = torch.tensor([1.5, -2.25, 3.0])
        out = hvd.allreduce(t, compression=hvd.Compression.fp16)
        self.assertEqual(out.dtype, torch.float32)
        self.assertTrue(torch.equal(out, t))

    def test_distributed_optimizer_is_the_users_class(self) -> None:
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        dopt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        self.assertIsInstance(dopt, torch.optim.SGD)
        torch.optim.lr_scheduler.StepLR(dopt, step_size=1)  # schedulers accept it
        before = model.weight.detach().clone()
        model(torch.ones(2, 3)).sum().backward()
        dopt.step()
        self.assertFalse(torch.equal(before, model.weight))
        with self.assertRaisesRegex(ValueError, "at least 1"):
            hvd.DistributedOptimizer(opt, backward_passes_per_step=0)

    def test_torch_state_commit_and_restore(self) -> None:
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sampler = ElasticSampler(list(range(10)), shuffle=False)
        state = TorchState(model, opt, epoch=3, sampler=sampler)
        w = model.weight.detach().clone()
        state.commit()
        with torch.no_grad():
            model.weight.add_(1.0)
        state.epoch = 4
        sampler.record_indices([0, 1])
        state.restore()
        self.assertTrue(torch.equal(model.weight, w))
        self.assertEqual(state.epoch, 3)
        self.assertEqual(sampler.processed_indices, set())
        self.assertIs(state.model, model)


def fake_runtime(test: unittest.TestCase, **attrs: Any) -> Any:
    """A Runtime with no driver behind it (a group of one), installed as the process's
    runtime for the test's duration; attrs set its fields."""
    import threading
    from elasticd.torch import _runtime
    rt = _runtime.Runtime.__new__(_runtime.Runtime)
    rt.generation, rt.heard, rt.applied, rt._lock, rt._piggyback = 1, 0, 0, threading.Lock(), None
    rt.ckpt_dir, rt.ckpt_every = "", 10
    for k, v in attrs.items():
        setattr(rt, k, v)
    _runtime._runtime = rt
    test.addCleanup(setattr, _runtime, "_runtime", None)
    return rt


def _runtime_of() -> Any:
    from elasticd.torch import _runtime
    return _runtime._runtime


class PiggybackTest(unittest.TestCase):
    """The host-update versions reduced with the gradients spare check_host_updates() its own
    collective when no rank heard of a change, and only then."""

    def setUp(self) -> None:
        self.rt = fake_runtime(self, generation=3)

    def test_taken_once_and_only_in_its_generation(self) -> None:
        self.rt.piggyback(0)
        self.assertEqual(self.rt.take_piggyback(), 0)
        self.assertIsNone(self.rt.take_piggyback())
        self.rt.piggyback(0)
        self.rt.generation = 4  # a reset came between the step and the check
        self.assertIsNone(self.rt.take_piggyback())

    def test_check_host_updates(self) -> None:
        state = TorchState(torch.nn.Linear(2, 1), epoch=0)
        calls = []
        pending = self.rt.pending_update
        self.rt.pending_update = lambda: calls.append(1) or pending()  # type: ignore[method-assign]
        self.rt.piggyback(0)
        state.check_host_updates()
        self.assertEqual(calls, [], "no rank had heard of a change: no collective")
        state.check_host_updates()
        self.assertEqual(calls, [1], "no sum recorded since: the explicit allreduce")
        self.rt.heard = 5
        self.rt.piggyback(5)
        with self.assertRaises(hvd.HostsUpdatedInterrupt):
            state.check_host_updates()
        self.assertEqual(self.rt.applied, 5)


class OvertakenTest(unittest.TestCase):
    """A generation that failed to form because it was overtaken (a host update its plan does
    not reflect, a newer generation) is no sign of a hung peer; one that was not, may be."""

    class Client:
        def __init__(self, version: int, newer: bool) -> None:
            self.version, self.newer, self.asked = version, newer, []

        def hosts_version(self, after: int, deadline: Any = None) -> Any:
            self.asked.append(("hosts", after, deadline is not None))
            return self.version if self.version > after else None

        def assignment(self, after: int, deadline: Any = None) -> Any:
            self.asked.append(("assignment", after, deadline is not None))
            return {"generation": after + 1} if self.newer else None

    def test_overtaken(self) -> None:
        for version, applied, newer, want in [(420, 419, False, True), (419, 419, False, False), (419, 419, True, True)]:
            client = self.Client(version, newer)
            rt = fake_runtime(self, generation=715, applied=applied, client=client)
            self.assertEqual(rt.overtaken(), want, (version, applied, newer))
            self.assertTrue(all(waits for _, _, waits in client.asked), "asked without a deadline: it would wait")
            self.assertEqual(client.asked[0], ("hosts", applied, True))

    def test_an_error_is_not_overtaken(self) -> None:
        class Down(self.Client):
            def hosts_version(self, after: int, deadline: Any = None) -> Any:
                raise ConnectionError("driver away")
        rt = fake_runtime(self, generation=3, client=Down(0, True))
        self.assertFalse(rt.overtaken())


class CheckpointTest(unittest.TestCase):
    """--checkpoint-dir: rank 0's commits on disk, whole or not at all; a rank 0 without a
    commit resumes from the newest valid one; torn and corrupt files are skipped."""

    def setUp(self) -> None:
        import shutil
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="elasticd-ckpt-test-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        fake_runtime(self, ckpt_dir=self.dir, ckpt_every=2)

    def test_files(self) -> None:
        from elasticd.torch import _checkpoint
        for steps in (10, 20, 30):
            _checkpoint.write(self.dir, steps // 10, steps, {"w": torch.full((3,), float(steps))})
        self.assertEqual(len(os.listdir(self.dir)), 2, "the newest two are kept")
        c = _checkpoint.newest(self.dir)
        assert c is not None
        self.assertEqual((c.steps, c.commits, c.state["w"].tolist()), (30, 3, [30.0] * 3))
        with open(c.path, "r+b") as f:  # a flipped bit in the state
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([last[0] ^ 0xFF]))
        older = _checkpoint.newest(self.dir)
        assert older is not None
        self.assertEqual(older.steps, 20, "a corrupt newest file is skipped")
        with self.assertRaisesRegex(ValueError, "corrupt"):
            _checkpoint.read(c.path)
        with open(c.path, "r+b") as f:  # torn, as by a crash in the middle of a copy
            f.truncate(os.path.getsize(c.path) // 2)
        with self.assertRaisesRegex(ValueError, "torn"):
            _checkpoint.read(c.path)

    def test_planned_change_writes_its_commit(self) -> None:
        """A commit at which the ranks agree on a host change is written whatever
        --checkpoint-every (2 here): a job that ends there resumes from it."""
        from elasticd.torch import _checkpoint
        rt = _runtime_of()
        state = TorchState(torch.nn.Linear(2, 1), epoch=0, step=0)
        state.step = 1
        state.commit()  # commit 1: not the count's turn, no change
        self.assertEqual(os.listdir(self.dir), [])
        rt.heard = 7
        state.step = 2
        with self.assertRaises(hvd.HostsUpdatedInterrupt):
            state.commit()  # commit 2, the count's turn, at a change: written once
        self.assertEqual(len(os.listdir(self.dir)), 1)
        rt.heard = 9
        state.step = 3
        with self.assertRaises(hvd.HostsUpdatedInterrupt):
            state.commit()  # commit 3 at a host change: written, though not the count's turn
        c = _checkpoint.newest(self.dir)
        assert c is not None
        self.assertEqual(c.commits, 3)

    def test_state_writes_and_resumes(self) -> None:
        model = torch.nn.Linear(2, 1)
        state = TorchState(model, epoch=0, step=0)
        for i in range(4):
            with torch.no_grad():
                model.weight.add_(1.0)
            state.step = i + 1
            state.commit()  # commits 2 and 4 write (every 2)
        want = model.weight.detach().clone()
        # A new process (no commit of its own) at rank 0: it resumes from commit 4.
        fresh = torch.nn.Linear(2, 1)
        other = TorchState(fresh, epoch=0, step=0)
        other.sync()
        self.assertTrue(torch.equal(fresh.weight, want))
        self.assertEqual((other.step, other._commits), (4, 4))
        # One with commits of its own does not.
        third = torch.nn.Linear(2, 1)
        kept = third.weight.detach().clone()
        st = TorchState(third, epoch=0, step=0)
        st._commits = 1
        st.sync()
        self.assertTrue(torch.equal(third.weight, kept))


class SamplerTest(unittest.TestCase):
    def test_every_sample_once_across_world_changes(self) -> None:
        """Ranks record what they process; at each commit what every rank processed is pooled
        (as TorchState does with an allgather); the world then changes and the rest of the
        epoch is split over it. Every index is processed exactly once, padding aside."""
        n, batch = 103, 4
        seen: list[int] = []
        processed: set[int] = set()
        for world, batches in ((4, 3), (3, 2), (5, None)):
            samplers = []
            for r in range(world):
                s = ElasticSampler(list(range(n)), shuffle=True, seed=5)
                s.processed_indices = set(processed)
                s._partition(world, r)
                samplers.append(s)
            self.assertEqual(len({len(s) for s in samplers}), 1, "ranks must get as many samples")
            nb = (len(samplers[0]) + batch - 1) // batch if batches is None else batches
            for b in range(nb):
                for s in samplers:
                    idx = s.get_indices(b, batch)
                    seen.extend(i for i in idx if i not in s.processed_indices)
                    s.record_batch(b, batch)
            union = set().union(*(s.processed_indices for s in samplers))
            # What a commit pools: rank 0 alone derives every rank's batches (ranks go in step).
            samplers[0]._pool_processed()
            self.assertEqual(samplers[0].processed_indices, union)
            processed = union
        self.assertEqual(processed, set(range(n)))
        dup = len(seen) - len(set(seen))
        self.assertLess(dup, 5, f"{dup} samples processed twice: only the last world's padding may repeat")

    def test_set_epoch_starts_over_and_state_round_trips(self) -> None:
        s = ElasticSampler(list(range(20)), shuffle=True, seed=0)
        s.record_indices([1, 2, 3])
        t = ElasticSampler(list(range(20)), shuffle=True, seed=0)
        t.load_state_dict(s.state_dict())
        self.assertEqual(t.processed_indices, {1, 2, 3})
        self.assertEqual(len(t), 17)
        s.set_epoch(1)
        self.assertEqual(len(s), 20)
        self.assertNotEqual(list(s), list(range(20)))


CHILD = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, sys.argv[1])
    import elasticd.torch as hvd
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out = {}
    out["sum"] = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum).item()
    out["avg"] = hvd.allreduce(torch.tensor([float(r)])).item()
    out["max"] = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Max).item()
    out["gather"] = hvd.allgather(torch.full((r + 1,), float(r))).tolist()
    out["bcast"] = hvd.broadcast(torch.tensor([float(r)]), 2).item()
    out["obj"] = hvd.broadcast_object({"from": r}, 1)
    model = torch.nn.Linear(2, 1, bias=False)
    hvd.broadcast_parameters(model.state_dict(), 0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), named_parameters=model.named_parameters())
    w0 = model.weight.detach().clone()
    (model(torch.full((1, 2), float(r + 1))).sum()).backward()
    opt.step()
    out["step"] = (w0 - model.weight.detach()).tolist()  # lr 1: the averaged gradient
    out["w0"] = w0.tolist()

    # Several buckets (tiny ones here), started from gradient hooks during backward; a branch
    # that only rank 0 uses (the others reduce zeros for it); two backward passes per step.
    import elasticd.torch as mod
    mod._BUCKET_BYTES = 64
    torch.manual_seed(0)
    net = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 8), "b": torch.nn.Linear(8, 8), "c": torch.nn.Linear(8, 1), "only0": torch.nn.Linear(4, 1)})
    params = list(net.parameters())
    before = [p.detach().clone() for p in params]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=1.0), named_parameters=net.named_parameters(), backward_passes_per_step=2)
    out["buckets"] = len(opt._elasticd_buckets)
    grads = [torch.zeros_like(p) for p in params]
    for k in range(2):
        x = torch.full((3, 4), float(r + k + 1))
        loss = net["c"](torch.relu(net["b"](torch.relu(net["a"](x))))).sum()
        if r == 0:
            loss = loss + net["only0"](x).sum()
        local = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)  # the expected, kept aside
        grads = [g + (l if l is not None else 0) for g, l in zip(grads, local)]
        loss.backward()
    out["early"] = opt._elasticd_early
    opt.step()
    want = [hvd.allreduce(g) for g in grads]  # the average of each rank's accumulated gradients
    out["err"] = max(float((b - p.detach() - w).abs().max()) for b, p, w in zip(before, params, want))
    print("RESULT " + json.dumps(out), flush=True)
    hvd.shutdown()
""")


class AwaitMembersTest(unittest.TestCase):
    """Before torch 2.3 a group forms under the collectives' timeout, so the runtime first
    waits, under the formation timeout, until every member has reached the generation's store."""

    def setUp(self) -> None:
        timeout = datetime.timedelta(seconds=10)
        self.master = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timeout, wait_for_workers=False)
        self.client = dist.TCPStore("127.0.0.1", self.master.port, 2, False, timeout=timeout)

    def test_waits_for_a_late_member(self) -> None:
        late = threading.Thread(target=lambda: (time.sleep(1.5), await_members(self.client, "k", 2, time.time() + 30, lambda: False)))
        start = time.time()
        late.start()
        await_members(self.master, "k", 2, time.time() + 30, lambda: False)
        waited = time.time() - start
        late.join(10)
        self.assertFalse(late.is_alive())
        self.assertGreaterEqual(waited, 1.4, "returned before the late member arrived")

    def test_gives_up_when_superseded_or_at_the_deadline(self) -> None:
        asked: list[float] = []

        def superseded() -> bool:
            asked.append(time.time())
            return len(asked) >= 2  # the driver moves on while this member waits

        with self.assertRaisesRegex(RuntimeError, "gave this generation up"):
            await_members(self.master, "s", 2, time.time() + 30, superseded)
        self.assertEqual(len(asked), 2)
        start = time.time()
        with self.assertRaisesRegex(RuntimeError, "1 of 2 members"):
            await_members(self.master, "d", 2, time.time() + 0.5, lambda: False)
        self.assertLess(time.time() - start, 5)


class NeighboursTest(unittest.TestCase):
    """After a failure a member probes its ring neighbours and recursive-doubling partners, so
    that every member's side of a cut is known to the driver from a few dials each."""

    def test_ring_and_partners(self) -> None:
        self.assertEqual(neighbours(0, 1), [])
        self.assertEqual(neighbours(0, 2), [1])
        self.assertEqual(neighbours(0, 8), [1, 2, 4, 7])
        self.assertEqual(neighbours(5, 8), [1, 4, 6, 7])
        self.assertEqual(neighbours(5, 6), [0, 1, 4])   # 5 XOR 2 = 7 is past the world
        self.assertEqual(neighbours(2, 3), [0, 1])
        for size in range(2, 40):
            for rank in range(size):
                got = neighbours(rank, size)
                self.assertNotIn(rank, got)
                self.assertTrue(all(0 <= r < size for r in got))
                self.assertLessEqual(len(got), size.bit_length() + 2)
            # the probes join the members: from rank 0, every member is reached through them
            seen, todo = {0}, [0]
            while todo:
                for r in neighbours(todo.pop(), size):
                    if r not in seen:
                        seen.add(r)
                        todo.append(r)
            self.assertEqual(len(seen), size)


# Two survivors that recorded indices one by one (record_indices) and two ranks that have just
# joined and recorded none sync, then commit after each has recorded one more: every rank must
# take part in the same collectives, and end with every rank's indices.
CHILD_SAMPLER = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, sys.argv[1])
    import elasticd.torch as hvd
    from elasticd.torch.elastic import ElasticSampler, TorchState
    hvd.init()
    r = hvd.rank()
    s = ElasticSampler(list(range(40)), shuffle=False)
    state = TorchState(model=torch.nn.Linear(2, 1), sampler=s)
    if r < 2:
        s.record_indices([10 * r + 1, 10 * r + 2])
    state.sync()
    after_sync = sorted(s.processed_indices)
    s.record_indices([10 * r + 3])
    state.commit()
    print("RESULT " + json.dumps({"sync": after_sync, "commit": sorted(s.processed_indices)}), flush=True)
    hvd.shutdown()
""")

# A collective that completed on some ranks and failed on others leaves them at different
# commits: here rank 2 committed twice, rank 0 once, ranks 1 and 3 never (joiners). Every rank
# must end with rank 2's state, not rank 0's: taking rank 0's would train a committed step again.
CHILD_SYNC = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, sys.argv[1])
    import elasticd.torch as hvd
    from elasticd.torch.elastic import TorchState
    hvd.init()
    r = hvd.rank()
    torch.manual_seed(r)
    model = torch.nn.Linear(2, 1)
    state = TorchState(model=model, step=0)
    for _ in range({0: 1, 2: 2}.get(r, 0)):
        state.step += 1
        state.commit()
    weights = {r: model.weight.detach().tolist()}
    state.sync()
    print("RESULT " + json.dumps({"step": state.step, "weight": model.weight.detach().tolist(), "mine": weights}), flush=True)
    hvd.shutdown()
""")


def run_four(test: unittest.TestCase, child: str, timeout: float) -> list[Any]:
    """Runs child in four processes with torchrun's environment (gloo on loopback) and returns
    what each printed after "RESULT "; a process still running at timeout is killed by PID."""
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    procs = []
    for r in range(4):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="4", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="4",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", child, PKG], env=env, stdout=subprocess.PIPE, text=True))
        test.addCleanup(lambda p=procs[-1]: (p.kill(), p.wait()) if p.poll() is None else None)
    results = []
    deadline = time.time() + timeout
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            test.fail(f"a rank (pid {p.pid}) was still running after {timeout:.0f}s: the ranks did not run the same collectives")
        test.assertEqual(p.returncode, 0, out)
        results.append(json.loads(next(l for l in out.splitlines() if l.startswith("RESULT "))[7:]))
    return results


class FourProcessesTest(unittest.TestCase):
    def test_sampler_pools_indices_on_every_rank_after_joiners(self) -> None:
        for res in run_four(self, CHILD_SAMPLER, 60):
            self.assertEqual(res["sync"], [1, 2, 11, 12])
            self.assertEqual(res["commit"], [1, 2, 3, 11, 12, 13, 23, 33])

    def test_sync_takes_the_most_advanced_rank(self) -> None:
        results = run_four(self, CHILD_SYNC, 60)
        rank2 = results[2]["mine"]["2"]
        self.assertNotEqual(results[0]["mine"]["0"], rank2, "the ranks must start apart for the test to mean anything")
        for r, res in enumerate(results):
            self.assertEqual(res["step"], 2, f"rank {r} did not take the step count of rank 2, the most advanced")
            self.assertEqual(res["weight"], rank2, f"rank {r} did not take rank 2's weights")

    def test_collectives_and_gradient_averaging(self) -> None:
        results = run_four(self, CHILD, 120)
        for res in results:
            self.assertEqual((res["sum"], res["avg"], res["max"], res["bcast"]), (6.0, 1.5, 3.0, 2.0))
            self.assertEqual(res["gather"], [0.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0])
            self.assertEqual(res["obj"], {"from": 1})
            self.assertEqual(res["w0"], results[0]["w0"], "broadcast_parameters: every rank starts from rank 0's weights")
            # d/dw sum(w·x) = x = (r+1, r+1); averaged over r = 0..3: 2.5 each.
            self.assertEqual(res["step"], [[2.5, 2.5]])
            # DistributedOptimizer with overlap: the update is the average of what every rank
            # accumulated over its two passes.
            self.assertLess(res["err"], 1e-5)
            self.assertGreaterEqual(res["buckets"], 3)
        # On rank 0 every bucket's gradients were in by the end of the second backward: all
        # started from hooks, before step(). The other ranks never compute the first bucket's
        # "only0" gradients, and buckets start in order, so theirs all start in step().
        self.assertEqual(results[0]["early"], results[0]["buckets"])
        self.assertEqual([res["early"] for res in results[1:]], [0, 0, 0])


if __name__ == "__main__":
    unittest.main()
