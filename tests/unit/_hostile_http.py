"""A loopback HTTP endpoint that misbehaves on purpose, for the monitor and `relay status`.

Each path gets a behaviour: a normal answer, a drip (headers, then one byte now and then,
forever), a 50 MB body, or no answer at all. Raw sockets, not http.server, so a drip really is
one byte at a time, and so the server notices when the client gives up (`gone`): that is how
the tests see a scrape cancelled, without timing anything.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

Behaviour = Callable[[socket.socket, "HostileHTTP"], None]

THREAD_PREFIX = "hostile-http"


def answer(body: bytes | str, ctype: str = "text/plain; version=0.0.4", status: str = "200 OK") -> Behaviour:
    data = body.encode() if isinstance(body, str) else body

    def send(conn: socket.socket, server: HostileHTTP) -> None:
        head = f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
        conn.sendall(head.encode() + data)

    return send


def json_answer(doc: Any) -> Behaviour:
    return answer(json.dumps(doc, allow_nan=True), "application/json")


def drip(every: float = 0.2) -> Behaviour:
    """Claims a 1 MB body, then sends one byte per `every` seconds until the client leaves."""

    def send(conn: socket.socket, server: HostileHTTP) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000000\r\n\r\n")
        while not server.stop.wait(every):
            conn.sendall(b"#")

    return send


def big(size: int = 50 * 1024 * 1024) -> Behaviour:
    """A `size`-byte body (valid Prometheus comments), sent as fast as the client reads."""

    def send(conn: socket.socket, server: HostileHTTP) -> None:
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {size}\r\n\r\n".encode())
        chunk = (b"# padding padding padding padding padding padding padding padding padding\n" * 900)[:65536]
        left = size
        while left > 0 and not server.stop.is_set():
            n = min(left, len(chunk))
            conn.sendall(chunk[:n])
            left -= n
            server.sent_body += n

    return send


def silent() -> Behaviour:
    """Accepts, reads the request, never says a word."""

    def send(conn: socket.socket, server: HostileHTTP) -> None:
        while not server.stop.is_set():
            conn.settimeout(0.2)
            try:
                if conn.recv(1) == b"":
                    raise ConnectionResetError("client closed")
            except TimeoutError:
                continue

    return send


def metrics_text(**values: float | str) -> str:
    """Prometheus text for a few samples; values may be 'NaN', '+Inf', '1e300'."""
    lines = []
    for name, v in values.items():
        family = name.removesuffix("_total")
        kind = "counter" if name.endswith("_total") else "gauge"
        lines += [f"# HELP {family} {family}", f"# TYPE {family} {kind}", f"{name} {v}"]
    return "\n".join(lines) + "\n"


GOOD_METRICS = metrics_text(
    blind_relay_sessions_opened=3,
    blind_relay_sessions_closed=1,
    blind_relay_pairings_active=1,
    blind_relay_pairings_pending=0,
    process_resident_memory_bytes=40_000_000,
    process_start_time_seconds=time.time() - 100,
)


def good_stats(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "key": "yry" * 17 + "o",
        "version": "0.1.0",
        "pid": 4242,
        "uptime_seconds": 100.0,
        "storage": "/nonexistent/storage",
        "host": "0.0.0.0",
        "port": 49737,
        "dht": {
            "bootstrapped": True,
            "firewalled": False,
            "public_host": "203.0.113.7",
            "public_port": 49737,
            "last_announce": time.time() - 30,
            "nodes": 20,
        },
        "sessions": {"accepted": 3, "opened": 3, "closed": 1},
        "pairings": {"requested": 1, "matched": 1, "cancelled": 0, "pending": 0, "active": 1},
        "streams": {"opened": 2, "closed": 0, "errors": 0},
        "traffic": {"relayed_bytes": 0, "dropped_packets": 0},
        "memory": {"rss_bytes": 40_000_000},
        "cpu_seconds": 1.5,
    }
    for path, value in overrides.items():
        node = doc
        *parents, leaf = path.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return doc


class HostileHTTP:
    """`routes` maps a path to a behaviour; the defaults answer like a healthy relay."""

    def __init__(self, **routes: Behaviour) -> None:
        self.routes: dict[str, Behaviour] = {
            "/metrics": answer(GOOD_METRICS),
            "/stats": json_answer(good_stats()),
        }
        for name, behaviour in routes.items():
            self.routes["/" + name] = behaviour
        self.requests: Counter[str] = Counter()
        self.asked = threading.Event()
        """set on the first request"""
        self.gone = threading.Event()
        """set when a client hung up on us mid-answer (the scrape was abandoned)"""
        self.stop = threading.Event()
        self.sent_body = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept, name=f"{THREAD_PREFIX}-accept", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name=f"{THREAD_PREFIX}-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            head = b""
            try:
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    data = conn.recv(4096)
                    if not data:
                        return
                    head += data
            except OSError:
                return
            parts = head.split(b" ", 2)
            path = parts[1].decode("latin-1") if len(parts) > 1 else "/"
            self.requests[path] += 1
            self.asked.set()
            behaviour = self.routes.get(path, answer("not found", status="404 Not Found"))
            try:
                behaviour(conn, self)
            except OSError:  # BrokenPipe / ConnectionReset: the client gave up on us
                self.gone.set()

    def close(self) -> None:
        self.stop.set()
        self._sock.close()
        self._thread.join(10)
