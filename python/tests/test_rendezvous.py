"""The rendezvous client's wait for a driver that restarts (ELASTICD_DRIVER_WAIT): standard
library only, a real HTTP server on loopback that comes up late."""

from __future__ import annotations

import http.server
import os
import socket
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from elasticd import _rendezvous  # noqa: E402


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DriverWaitTest(unittest.TestCase):
    def test_waits_for_a_driver_that_comes_back(self) -> None:
        port = _free_port()  # nothing listens: the driver is down
        servers: list[http.server.ThreadingHTTPServer] = []

        def come_back() -> None:
            time.sleep(1.5)  # past the quick retries a client without a wait makes
            srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Handler)
            servers.append(srv)
            srv.serve_forever()

        threading.Thread(target=come_back, daemon=True).start()
        c = _rendezvous.Client(f"http://127.0.0.1:{port}", b"k" * 32, "h/0", driver_wait=30.0)
        start = time.monotonic()
        try:
            c.report(1, "READY")
        finally:
            for s in servers:
                s.shutdown()
        self.assertGreaterEqual(time.monotonic() - start, 1.4)

    def test_gives_up_after_the_wait(self) -> None:
        c = _rendezvous.Client(f"http://127.0.0.1:{_free_port()}", b"k" * 32, "h/0", driver_wait=0.7)
        start = time.monotonic()
        with self.assertRaisesRegex(_rendezvous.RendezvousError, "the driver's wait"):
            c.report(1, "READY")
        self.assertGreaterEqual(time.monotonic() - start, 0.7)

    def test_without_a_wait_a_few_quick_retries(self) -> None:
        c = _rendezvous.Client(f"http://127.0.0.1:{_free_port()}", b"k" * 32, "h/0")
        start = time.monotonic()
        with self.assertRaisesRegex(_rendezvous.RendezvousError, "gave up after 4 attempts"):
            c.report(1, "READY")
        self.assertLess(time.monotonic() - start, 5)

    def test_durations(self) -> None:
        self.assertEqual(_rendezvous.parse_duration("2m0s", "X"), 120.0)
        self.assertEqual(_rendezvous.parse_duration("1.5s", "X"), 1.5)
        with self.assertRaisesRegex(ValueError, "ELASTICD_DRIVER_WAIT '2 min'"):
            _rendezvous.parse_duration("2 min", "ELASTICD_DRIVER_WAIT")


class SignedBeforeStartTest(unittest.TestCase):
    """A driver that has just started refuses requests stamped before its start (a replay, or
    this host's clock behind its own): the client signs again a second later."""

    def test_signs_again(self) -> None:
        refusals = [2]

        class Handler(_Handler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if refusals[0] > 0:
                    refusals[0] -= 1
                    body = b"signed before this server started (a replay, or this host's clock is behind the server's)\n"
                    self.send_response(401)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(204)
                self.end_headers()

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            c = _rendezvous.Client(f"http://127.0.0.1:{srv.server_address[1]}", b"k" * 32, "h/0")
            start = time.monotonic()
            c.report(1, "READY")
            self.assertGreaterEqual(time.monotonic() - start, 1.9)
            self.assertEqual(refusals[0], 0)
        finally:
            srv.shutdown()


class ProbeTest(unittest.TestCase):
    """A host answers a probe when something listens (the probe listener), and also when
    nothing does any more (it refuses): only silence, or "no route", is a cut."""

    def test_listener_and_refusal_answer(self) -> None:
        listener = _rendezvous.ProbeListener("127.0.0.1")
        for _ in range(20):  # the listener accepts and closes each: none stays queued
            self.assertTrue(_rendezvous.host_answers(listener.addr, 1.0))
        closed = f"127.0.0.1:{_free_port()}"
        self.assertEqual(_rendezvous.probe_hosts({0: listener.addr, 1: closed}, 1.0), [])


if __name__ == "__main__":
    unittest.main()
