"""elasticd's Python package: the worker side of `elasticd run` for PyTorch scripts.

`progress(step, checkpoint_step, loss=..., total_steps=...)` lets a torchrun-style script in
restart mode tell the driver how far it has got, so that the job's summary, `/v1/status` and the
live page say how many steps each restart threw away, and, when it gives them, plot its loss and
say how long the job has to go. Importing this module is cheap (no torch); outside a job
launched by elasticd every call is a no-op.
"""

from __future__ import annotations

import atexit
import http.client
import json
import math
import os
import sys
import threading
import time
import urllib.parse
from typing import Any, Optional

__all__ = ["progress"]

from ._rendezvous import PROTOCOL_VERSION, sign  # noqa: E402  (standard library only)


class _Reporter:
    """Sends the newest progress about once a second from a daemon thread: the caller never
    waits for the network, and a driver that does not answer costs nothing but the report."""

    interval = 1.0

    def __init__(self, base: str, secret: bytes, worker: str, generation: int) -> None:
        u = urllib.parse.urlsplit(base)
        self._https = u.scheme == "https"
        self._host = u.netloc
        self._target = u.path.rstrip("/") + "/v1/workers/" + urllib.parse.quote(worker, safe="") + "/progress"
        self._secret, self._generation = secret, generation
        self._cond = threading.Condition()
        # (step, checkpoint_step, loss or None, total_steps or 0)
        self._latest: tuple[int, int, float | None, int] | None = None
        self._sent: tuple[int, int, float | None, int] | None = None
        self._total = 0  # declared once, sent with every report after
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="elasticd-progress", daemon=True)
        self._thread.start()
        atexit.register(self.flush)

    def put(self, step: int, checkpoint_step: int, generation: Optional[int] = None,
            loss: Optional[float] = None, total_steps: Optional[int] = None) -> None:
        with self._cond:
            if generation is not None:
                self._generation = generation  # in-process workers move to newer generations
            if total_steps:
                self._total = total_steps
            self._latest = (step, checkpoint_step, loss, self._total)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._latest == self._sent:
                    self._cond.wait()
                latest = self._latest
            self._send(latest)
            time.sleep(self.interval)

    def flush(self) -> None:
        """Sends the newest report if it was not sent: at exit, bounded to about a second."""
        with self._cond:
            latest = self._latest
        if latest is not None and latest != self._sent:
            self._send(latest, timeout=1.0)

    def _send(self, report: tuple[int, int, float | None, int] | None, timeout: float = 5.0) -> None:
        if report is None:
            return
        step, ckpt, loss, total = report
        msg: dict[str, Any] = {"generation": self._generation, "step": step, "committed_step": min(ckpt, step)}
        if loss is not None:  # omitted, not null: the driver then keeps the last one it had
            msg["loss"] = loss
        if total:
            msg["total_steps"] = total
        body = json.dumps(msg, allow_nan=False).encode()
        headers = sign(self._secret, "POST", self._target, body)
        headers["Content-Type"] = "application/json"
        conn_type = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        try:
            conn = conn_type(self._host, timeout=timeout)
            try:
                conn.request("POST", self._target, body=body, headers=headers)
                resp = conn.getresponse()
                msg = resp.read(512).decode(errors="replace").strip()
                if resp.status >= 400 and not self._warned:
                    self._warned = True
                    print(f"elasticd.progress: the driver refused the report: {resp.status} {msg}", file=sys.stderr, flush=True)
            finally:
                conn.close()
            self._sent = report
        except OSError:
            pass  # the next report will try again


_reporter: _Reporter | None = None
_lock = threading.Lock()


def _reporter_from_env() -> Optional[_Reporter]:
    global _reporter
    if _reporter is None:
        with _lock:
            if _reporter is None:
                base = os.environ.get("ELASTICD_RENDEZVOUS", "")
                worker = os.environ.get("ELASTICD_WORKER_ID", "")
                try:
                    secret = bytes.fromhex(os.environ.get("ELASTICD_SECRET", ""))
                    generation = int(os.environ.get("ELASTICD_GENERATION", "0"))
                except ValueError:
                    return None
                if not base or not worker or not secret:
                    return None  # not launched by elasticd
                _reporter = _Reporter(base, secret, worker, generation)
    return _reporter


def _finite(loss: Any) -> Optional[float]:
    """The loss as a float, or None when there is none or it is not finite (NaN, inf): JSON
    cannot carry those, and a diverged step should not take the other figures with it."""
    if loss is None:
        return None
    v = float(loss)  # a Python number, or a one-element tensor
    return v if math.isfinite(v) else None


def _total(total_steps: Optional[int]) -> int:
    if total_steps is None:
        return 0
    n = int(total_steps)
    if n < 0:
        raise ValueError(f"total_steps {total_steps!r}: want the number of steps in all, or None")
    return n


def _report(generation: int, step: int, checkpoint_step: int, *,
            loss: Optional[float] = None, total_steps: Optional[int] = None) -> None:
    """progress() for in-process workers, which move from generation to generation."""
    r = _reporter_from_env()
    if r is not None:
        r.put(int(step), int(checkpoint_step), generation, _finite(loss), _total(total_steps))


def progress(step: int, checkpoint_step: int, *,
             loss: Optional[float] = None, total_steps: Optional[int] = None) -> None:
    """Tells the driver that training has completed `step` steps, and that the newest
    checkpoint holds `checkpoint_step` of them. Call it from rank 0 after each step (it returns
    at once); after a checkpoint written on SIGTERM, call it with both equal.

    `loss`, when given, is the step's training loss (a number, e.g. `loss.item()`): the live
    page plots it. A NaN or infinite loss is left out of the report. `total_steps`, when given
    (once is enough), is how many steps the job trains in all: the page then shows "step X of
    N" and the time to go. Both are optional; without them the driver shows neither."""
    r = _reporter_from_env()
    if r is not None:
        r.put(int(step), int(checkpoint_step), loss=_finite(loss), total_steps=_total(total_steps))
