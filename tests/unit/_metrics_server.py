"""A stand-in relay metrics endpoint speaking the exact `/metrics` + `/stats` contract.

Used where a real relay process is not the point (parsing, rates, down detection, CLI output);
the monitor's Pilot tests use a real relay instead. The text is made by prometheus_client itself.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from cosmictui.ops.metrics.client import GAUGES

COUNTERS = (
    "blind_relay_relayed_bytes",
    "blind_relay_relayed_packets",
    "blind_relay_dropped_packets",
    "blind_relay_udp_received_bytes",
    "blind_relay_udp_sent_bytes",
    "blind_relay_udp_received_packets",
    "blind_relay_udp_sent_packets",
)


class FakeRelayMetrics:
    """Serve a relay's numbers; tests move them and watch what the client makes of them."""

    def __init__(self, key: str = "yry" * 17 + "o", pid: int = 4242, port: int = 0) -> None:
        self.registry = CollectorRegistry()
        self.gauges = {n: Gauge(n, n, registry=self.registry) for n in GAUGES}
        self.counters = {n: Counter(n, n, registry=self.registry) for n in COUNTERS}
        self.rss = Gauge("process_resident_memory_bytes", "rss", registry=self.registry)
        self.cpu = Counter("process_cpu_seconds", "cpu", registry=self.registry)
        self.start = Gauge("process_start_time_seconds", "start", registry=self.registry)
        self.rss.set(42_000_000)
        self.start.set(time.time() - 100)
        self.key, self.pid = key, pid
        self.dht: dict[str, Any] = {
            "bootstrapped": True,
            "firewalled": False,
            "public_host": "203.0.113.7",
            "public_port": 49737,
            "last_announce": time.time() - 30,
            "nodes": 20,
        }
        self.hang = threading.Event()
        self.release = threading.Event()
        self.stats_status = 200
        self.metrics_body: bytes | None = None  # override with garbage
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                owner.requests += 1
                if owner.hang.is_set():
                    owner.release.wait(10)
                    return
                if self.path == "/metrics":
                    body = owner.metrics_body if owner.metrics_body is not None else generate_latest(owner.registry)
                    self._send(200, body, "text/plain; version=0.0.4")
                elif self.path == "/stats" and owner.stats_status == 200:
                    self._send(200, json.dumps(owner.stats()).encode(), "application/json")
                else:
                    self._send(404, b"not found", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def value(self, name: str) -> float:
        for fam in self.registry.collect():
            for s in fam.samples:
                if s.name in (name, name + "_total"):
                    return s.value
        raise KeyError(name)

    def stats(self) -> dict[str, Any]:
        g = {n.removeprefix("blind_relay_"): int(self.value(n)) for n in GAUGES}
        c = {n.removeprefix("blind_relay_"): int(self.value(n)) for n in COUNTERS}
        return {
            "key": self.key,
            "version": "0.1.0",
            "pid": self.pid,
            "uptime_seconds": 100.0,
            "storage": "/nonexistent/storage",
            "host": "0.0.0.0",
            "port": 49737,
            "dht": self.dht,
            "sessions": {k: g["sessions_" + k] for k in ("accepted", "opened", "closed")},
            "pairings": {k: g["pairings_" + k] for k in ("requested", "matched", "cancelled", "pending", "active")},
            "streams": {k: g["streams_" + k] for k in ("opened", "closed", "errors")},
            "traffic": {
                "relayed_bytes": c["relayed_bytes"],
                "relayed_packets": c["relayed_packets"],
                "dropped_packets": c["dropped_packets"],
                "received_bytes": c["udp_received_bytes"],
                "sent_bytes": c["udp_sent_bytes"],
                "received_packets": c["udp_received_packets"],
                "sent_packets": c["udp_sent_packets"],
            },
            "memory": {"rss_bytes": int(self.value("process_resident_memory_bytes"))},
            "cpu_seconds": self.value("process_cpu_seconds"),
        }

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
