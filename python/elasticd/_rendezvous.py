"""The worker's side of elasticd's rendezvous protocol (docs/protocol.md §2): HMAC-signed HTTP
to the driver. Standard library only; the Go twin is worker/rendezvous/client.go, and the wire types are
Go package protocol's."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import errno
import json
import re
import secrets
import socket
import threading
import time
import urllib.parse
from typing import Any, Optional

PROTOCOL_VERSION = 1  # the driver refuses state reports of another version
_KEY_LABEL = b"elasticd rendezvous v1"
_RETRIES = 3
_RETRY_DELAY = 0.1
_REPLAY_WINDOW = 60.0  # seconds: the driver refuses requests stamped further from its clock
# The driver's 401 for a request stamped before it started (protocol.ReasonSignedBeforeStart).
_SIGNED_BEFORE_START = "signed before this server started"
_POLL_WAIT_MS = 25000
_REQUEST_TIMEOUT = 15.0


def parse_duration(text: str, name: str) -> float:
    """A Go duration as elasticd writes it (`30s`, `1.5s`, `500ms`, `1m0s`, `1h2m3s`) in seconds;
    name is the variable it came from, for the error."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    parts = re.findall(r"([0-9.]+)(ms|us|µs|ns|h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{name} {text!r}: want a duration like 30s")
    return sum(float(n) * units[u] for n, u in parts)


# What a dial answers when the network cannot reach the host: a blackhole, prohibit or
# firewall rule, no route. A refused connection is an answer: the host is there.
_UNREACHABLE_ERRNOS = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN,
                       errno.EINVAL, errno.EACCES, errno.EPERM}


def host_answers(addr: str, timeout: float) -> bool:
    """Whether the host at addr ("host:port") answers a TCP dial within timeout seconds."""
    host, port = addr.rsplit(":", 1)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
        return True
    except (TimeoutError, socket.timeout):
        return False
    except ConnectionRefusedError:
        return True
    except OSError as e:
        return e.errno not in _UNREACHABLE_ERRNOS


def probe_hosts(addrs: dict[int, str], timeout: float) -> list[int]:
    """The ranks, sorted, whose host does not answer a dial of its address: every address at
    once, each for up to timeout seconds."""
    out: list[int] = []
    lock = threading.Lock()

    def one(rank: int, addr: str) -> None:
        if not host_answers(addr, timeout):
            with lock:
                out.append(rank)

    threads = [threading.Thread(target=one, args=(r, a), daemon=True) for r, a in addrs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 1.0)
    return sorted(out)


class ProbeListener:
    """A listening socket on this host that accepts and closes every connection: what peers
    dial to ask whether this host can be reached (probe_hosts)."""

    def __init__(self, host: str) -> None:
        self._sock = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=128)
        self.addr = f"[{host}]:{self._sock.getsockname()[1]}" if ":" in host else f"{host}:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._serve, name="elasticd-probe", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            conn.close()


def sign(secret: bytes, method: str, target: str, body: bytes, now: Optional[float] = None) -> dict[str, str]:
    """The headers that authenticate one request (docs/protocol.md §2.2)."""
    key = hmac.new(secret, _KEY_LABEL, hashlib.sha256).digest()
    ts = str(int(time.time() if now is None else now))
    nonce = secrets.token_hex(16)
    body_hash = hashlib.sha256(body).hexdigest()
    msg = "\n".join(["ELASTICD-HMAC-SHA256", method, target, ts, nonce, body_hash]).encode()
    return {
        "X-Elasticd-Timestamp": ts,
        "X-Elasticd-Nonce": nonce,
        "X-Elasticd-Content-Sha256": body_hash,
        "X-Elasticd-Signature": hmac.new(key, msg, hashlib.sha256).hexdigest(),
    }


class RendezvousError(Exception):
    """An answer other than the one a request expected; status is the HTTP status (0: none)."""

    def __init__(self, method: str, target: str, status: int, message: str) -> None:
        super().__init__(f"{method} {target}: {status} {message}".strip())
        self.status = status


class GenerationGone(RendezvousError):
    """410: the driver has moved past this generation; the worker should reset."""


class Client:
    """One worker's client. Methods block; long-polls ask again after each 204 until answered
    or `deadline` (seconds since the epoch) passes."""

    def __init__(self, base: str, secret: bytes, worker: str, driver_wait: float = 0.0) -> None:
        """driver_wait: seconds a request that meets connection errors or 5xx answers is
        retried, backing off to 2 s apart (ELASTICD_DRIVER_WAIT, set by an agent, which keeps
        its workers that long while the driver restarts); 0: a few quick retries."""
        u = urllib.parse.urlsplit(base)
        if u.scheme not in ("http", "https") or not u.netloc:
            raise ValueError(f"rendezvous URL {base!r}: want http://host:port")
        self._https = u.scheme == "https"
        self._host = u.netloc
        self._prefix = u.path.rstrip("/")
        self._secret = secret
        self.worker = worker
        self._wid = urllib.parse.quote(worker, safe="")
        self._driver_wait = driver_wait

    def _do(self, method: str, path: str, body: bytes = b"", wait: float = 0.0, ctype: str = "application/json") -> tuple[int, bytes]:
        target = self._prefix + path
        last: Exception | None = None
        first_failure = 0.0
        early = 0.0  # the first answer that the request was signed before the driver started
        delay = _RETRY_DELAY
        attempt = 0
        while True:
            if last is not None:
                if not first_failure:
                    first_failure = time.monotonic()
                if self._driver_wait > 0:
                    if time.monotonic() - first_failure >= self._driver_wait:
                        raise RendezvousError(method, target, 0, f"gave up after {attempt} attempts over {self._driver_wait}s (the driver's wait): {last}")
                elif attempt > _RETRIES:
                    raise RendezvousError(method, target, 0, f"gave up after {attempt} attempts, {_RETRY_DELAY}s apart: {last}")
                time.sleep(delay)
                if self._driver_wait > 0:
                    delay = min(2 * delay, 2.0)
            attempt += 1
            headers = sign(self._secret, method, target, body)
            if body:
                headers["Content-Type"] = ctype
            conn_type = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = conn_type(self._host, timeout=_REQUEST_TIMEOUT + wait)
            try:
                conn.request(method, target, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except OSError as e:
                last = e
                continue
            finally:
                conn.close()
            if resp.status >= 500:
                last = RendezvousError(method, target, resp.status, data[:1024].decode(errors="replace").strip())
                continue
            if resp.status == 401 and _SIGNED_BEFORE_START in data.decode(errors="replace"):
                # A driver that has just started, and this host's clock behind its own: sign
                # again, a second later, until the clocks' gap has passed.
                if not early:
                    early = time.monotonic()
                if time.monotonic() - early < _REPLAY_WINDOW:
                    time.sleep(1.0)
                    continue
            if resp.status >= 400:
                cls = GenerationGone if resp.status == 410 else RendezvousError
                raise cls(method, target, resp.status, data[:1024].decode(errors="replace").strip())
            return resp.status, data

    def report(self, generation: int, state: str, message: str = "", rolled_back_steps: int = 0, rolled_back_seconds: float = 0.0,
               silent_peer: bool = False, unreachable_ranks: Optional[list[int]] = None,
               reached_ranks: Optional[list[int]] = None) -> None:
        """READY, SUCCESS or FAILURE for a generation; the report ID makes retries harmless.
        silent_peer (with READY): a collective timed out on a peer that stopped answering,
        which the driver then fails at once rather than after --barrier-timeout.
        unreachable_ranks and reached_ranks (with READY): ranks of that generation whose hosts
        did not answer a probe, and those that did, which the driver weighs to find the hosts
        a network cut sets apart."""
        body: dict[str, Any] = {"protocol": PROTOCOL_VERSION, "generation": generation, "state": state,
                                "report_id": secrets.token_hex(8)}
        if message:
            body["message"] = message.encode()[:4096].decode(errors="ignore")
        if rolled_back_steps or rolled_back_seconds:
            body["rolled_back_steps"] = int(rolled_back_steps)
            body["rolled_back_seconds"] = max(0.0, float(rolled_back_seconds))
        if silent_peer:
            body["silent_peer"] = True
        if unreachable_ranks:
            body["unreachable_ranks"] = sorted(set(int(r) for r in unreachable_ranks))[:1024]
        if reached_ranks:
            body["reached_ranks"] = sorted(set(int(r) for r in reached_ranks))[:1024]
        self._do("POST", f"/v1/workers/{self._wid}/state", json.dumps(body).encode())

    def _poll(self, path: str, deadline: Optional[float]) -> Optional[bytes]:
        while True:
            wait = _POLL_WAIT_MS / 1000
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.time()))
            sep = "&" if "?" in path else "?"
            status, data = self._do("GET", f"{path}{sep}wait_ms={int(wait * 1000)}", wait=wait)
            if status == 200:
                return data
            if deadline is not None and time.time() >= deadline:
                return None

    def assignment(self, after: int, deadline: Optional[float] = None) -> Optional[dict[str, Any]]:
        """The worker's place in the first generation after `after` (None past the deadline)."""
        data = self._poll(f"/v1/workers/{self._wid}/assignment?after={after}", deadline)
        return None if data is None else json.loads(data)

    def hosts_version(self, after: int, deadline: Optional[float] = None) -> Optional[int]:
        """The host-update version once it is past `after` (None past the deadline)."""
        data = self._poll(f"/v1/hosts/version?after={after}", deadline)
        return None if data is None else int(json.loads(data)["version"])

    def kv_put(self, generation: int, key: str, value: bytes) -> None:
        self._do("PUT", f"/v1/kv/{generation}/{urllib.parse.quote(key, safe='')}", value, ctype="application/octet-stream")

    def kv_get(self, generation: int, key: str, deadline: Optional[float] = None) -> Optional[bytes]:
        """The value once set (long-poll); GenerationGone when the generation is over."""
        return self._poll(f"/v1/kv/{generation}/{urllib.parse.quote(key, safe='')}", deadline)

    def progress(self, generation: int, step: int, committed_step: int, timeout: float = 5.0) -> None:
        body = json.dumps({"generation": generation, "step": step, "committed_step": min(committed_step, step)}).encode()
        self._do("POST", f"/v1/workers/{self._wid}/progress", body)
