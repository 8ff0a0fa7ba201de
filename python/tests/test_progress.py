"""elasticd.progress against a local HTTP server that checks every request the way the
driver does (docs/protocol.md §2.2): standard library only, loopback only."""

from __future__ import annotations

import hashlib
import hmac
import http.server
import importlib
import json
import os
import subprocess
import sys
import threading
import time
import unittest
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import elasticd  # noqa: E402

SECRET = bytes(range(32))


def check(secret: bytes, method: str, target: str, headers: Any, body: bytes) -> str:
    """The server's check, written from the protocol document: '' when the request is good."""
    key = hmac.new(secret, b"elasticd rendezvous v1", hashlib.sha256).digest()
    for h in ("X-Elasticd-Timestamp", "X-Elasticd-Nonce", "X-Elasticd-Content-Sha256", "X-Elasticd-Signature"):
        if not headers.get(h):
            return "missing " + h
    if abs(int(headers["X-Elasticd-Timestamp"]) - time.time()) > 60:
        return "timestamp outside the replay window"
    if len(headers["X-Elasticd-Nonce"]) != 32:
        return "bad nonce"
    if hashlib.sha256(body).hexdigest() != headers["X-Elasticd-Content-Sha256"]:
        return "body does not match"
    canon = "ELASTICD-HMAC-SHA256\n%s\n%s\n%s\n%s\n%s" % (method, target, headers["X-Elasticd-Timestamp"], headers["X-Elasticd-Nonce"], headers["X-Elasticd-Content-Sha256"])
    want = hmac.new(key, canon.encode(), hashlib.sha256).hexdigest()
    return "" if hmac.compare_digest(want, headers["X-Elasticd-Signature"]) else "bad signature"


class Server:
    def __init__(self) -> None:
        self.reports: list[tuple[str, dict[str, Any]]] = []
        self.errors: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                why = check(SECRET, "POST", self.path, self.headers, body)
                if why:
                    outer.errors.append(why)
                    self.send_response(401)
                else:
                    outer.reports.append((self.path, json.loads(body)))
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/rdzv" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class ProgressTest(unittest.TestCase):
    def setUp(self) -> None:
        self.server = Server()
        self.addCleanup(self.server.close)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"ELASTICD_RENDEZVOUS": self.server.url, "ELASTICD_SECRET": SECRET.hex(),
                    "ELASTICD_WORKER_ID": "[fe80::1]/3", "ELASTICD_GENERATION": "4",
                    "PYTHONPATH": os.path.dirname(HERE)})
        return env

    def test_reports_are_signed_and_the_newest_arrives_at_exit(self) -> None:
        # A separate interpreter, as a worker is: many quick calls, then exit; the last value
        # must arrive (the exit flush), every request must pass the driver's check.
        code = "import elasticd\nfor s in range(1, 51): elasticd.progress(s, s - s % 10)\n"
        subprocess.run([sys.executable, "-c", code], env=self.env(), check=True, timeout=30)
        self.assertEqual(self.server.errors, [])
        self.assertTrue(self.server.reports, "no report reached the server")
        path, last = self.server.reports[-1]
        self.assertEqual(path, "/rdzv/v1/workers/%5Bfe80%3A%3A1%5D%2F3/progress")
        self.assertEqual(last, {"generation": 4, "step": 50, "committed_step": 50})
        self.assertLessEqual(len(self.server.reports), 5, "reports should be paced, not one per call")

    def test_loss_and_total_steps(self) -> None:
        # Keyword-only and optional: given, they travel with the report (the total, once given,
        # with every later one); a NaN loss is left out, not sent as invalid JSON.
        code = ("import elasticd\n"
                "for s in range(1, 31): elasticd.progress(s, s, loss=1.0 / s, total_steps=100 if s == 1 else None)\n"
                "elasticd._reporter.flush()\n"
                "elasticd.progress(31, 30, loss=float('nan'))\n"
                "try:\n    elasticd.progress(32, 30, 0.5)\nexcept TypeError:\n    print('keyword-only')\n")
        out = subprocess.run([sys.executable, "-c", code], env=self.env(), check=True, timeout=30, capture_output=True, text=True)
        self.assertEqual(out.stdout.strip(), "keyword-only")
        self.assertEqual(self.server.errors, [])
        bodies = [r for _, r in self.server.reports]
        self.assertIn({"generation": 4, "step": 30, "committed_step": 30, "loss": 1.0 / 30, "total_steps": 100}, bodies)
        self.assertEqual(bodies[-1], {"generation": 4, "step": 31, "committed_step": 30, "total_steps": 100})

    def test_a_wrong_secret_is_refused(self) -> None:
        env = self.env()
        env["ELASTICD_SECRET"] = bytes(32).hex()
        subprocess.run([sys.executable, "-c", "import elasticd; elasticd.progress(3, 0)"], env=env, check=True, timeout=30)
        self.assertEqual(self.server.reports, [])
        self.assertTrue(self.server.errors and set(self.server.errors) == {"bad signature"}, self.server.errors)

    def test_outside_elasticd_it_is_a_no_op(self) -> None:
        for k in ("ELASTICD_RENDEZVOUS", "ELASTICD_SECRET", "ELASTICD_WORKER_ID"):
            os.environ.pop(k, None)
        mod = importlib.reload(elasticd)
        mod.progress(1, 0)
        self.assertIsNone(mod._reporter)

    def test_import_does_not_load_torch(self) -> None:
        out = subprocess.run([sys.executable, "-c", "import sys, elasticd; print('torch' in sys.modules)"],
                             env=self.env(), check=True, timeout=30, capture_output=True, text=True)
        self.assertEqual(out.stdout.strip(), "False")


if __name__ == "__main__":
    unittest.main()
