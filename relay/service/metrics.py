"""`GET /metrics` (Prometheus text), `GET /stats` and `GET /pairings` (JSON) from one small
asyncio HTTP server.

Both views come from one snapshot function, so Prometheus and the TUI never disagree. The
gauge names are blind-relay-service's (`blind_relay_sessions_*`, `..._pairings_*`,
`..._streams_*`); traffic and limit counters are ours. prometheus_client does the exposition
format and the standard `process_*` metrics; we only serve the bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("relay.metrics")

Snapshot = Mapping[str, Any]
SnapshotFn = Callable[[], Snapshot]

SESSION_GAUGES = ("accepted", "opened", "closed")
PAIRING_GAUGES = ("requested", "matched", "cancelled", "pending", "active")
STREAM_GAUGES = ("opened", "closed", "errors")
# (metric name, key in snapshot["traffic"], help)
TRAFFIC_COUNTERS = (
    ("blind_relay_relayed_bytes", "relayed_bytes", "UDX bytes forwarded between paired peers"),
    ("blind_relay_relayed_packets", "relayed_packets", "UDX packets forwarded between paired peers"),
    (
        "blind_relay_dropped_packets",
        "dropped_packets",
        "Datagrams dropped unread, every cause (by cause: blind_relay_dropped_total)",
    ),
    ("blind_relay_udp_received_bytes", "received_bytes", "Bytes received on the relay's UDP socket"),
    ("blind_relay_udp_sent_bytes", "sent_bytes", "Bytes sent from the relay's UDP socket"),
    ("blind_relay_udp_received_packets", "received_packets", "Datagrams received on the relay's UDP socket"),
    ("blind_relay_udp_sent_packets", "sent_packets", "Datagrams sent from the relay's UDP socket"),
    (
        "blind_relay_kernel_forwarded_packets",
        "kernel_packets",
        "UDX packets the kernel forwarded for established pairs (--kernel-forwarding; in relayed_packets too)",
    ),
    (
        "blind_relay_kernel_forwarded_bytes",
        "kernel_bytes",
        "UDX bytes the kernel forwarded for established pairs (in relayed_bytes too)",
    ),
)

DEFAULT_METRICS_HOST = "127.0.0.1"
DEFAULT_METRICS_PORT = 49738
MAX_REQUEST_HEAD = 8192
REQUEST_TIMEOUT = 10.0


class MetricsError(Exception):
    """The metrics endpoint could not start (address in use, bad address); `errno` says why."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class RelayCollector(Collector):
    """Turns one stats snapshot into Prometheus metric families at scrape time."""

    def __init__(self, snapshot: SnapshotFn) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        for group, names in (("sessions", SESSION_GAUGES), ("pairings", PAIRING_GAUGES), ("streams", STREAM_GAUGES)):
            values = s.get(group, {})
            for name in names:
                yield GaugeMetricFamily(
                    f"blind_relay_{group}_{name}", f"blind-relay {group} {name}", value=values.get(name, 0)
                )
        traffic = s.get("traffic", {})
        for metric, key, doc in TRAFFIC_COUNTERS:
            yield CounterMetricFamily(metric, doc, value=traffic.get(key, 0))
        for family, key, doc in (
            ("blind_relay_dropped", "dropped", "Datagrams dropped unread, by cause"),
            ("blind_relay_shed", "shed", "Sessions, pairings and pairs shed at a fair-share cap or reaped, by cause"),
        ):
            by_cause = CounterMetricFamily(family, doc, labels=["cause"])
            values = s.get(key)
            if isinstance(values, Mapping):
                for cause, value in sorted(values.items()):
                    by_cause.add_metric([str(cause)], value)
            yield by_cause
        hs = s.get("handshakes")
        if isinstance(hs, Mapping):
            results = CounterMetricFamily(
                "blind_relay_handshakes", "DHT handshakes to the relay key, by result", labels=["result"]
            )
            for result in ("accepted", "rejected", "failed", "shed_stale", "shed_full"):
                results.add_metric([result], hs.get(result, 0))
            yield results
            yield CounterMetricFamily(
                "blind_relay_handshakes_waited",
                "Handshakes over their address's burst held for its next token instead of refused",
                value=hs.get("waited", 0),
            )
            yield GaugeMetricFamily(
                "blind_relay_handshakes_pending", "Handshake attempts held now", value=hs.get("pending", 0)
            )
            yield GaugeMetricFamily(
                "blind_relay_handshakes_backlog",
                "New handshakes waiting for the CPU now (answered new addresses first)",
                value=hs.get("backlog", 0),
            )
        udx = s.get("udx")
        if isinstance(udx, Mapping):
            yield GaugeMetricFamily(
                "blind_relay_udx_gso", "1 while forwarded runs use UDP GSO", value=1 if udx.get("gso") else 0
            )
            yield GaugeMetricFamily(
                "blind_relay_udx_gro", "1 while the socket takes GRO-coalesced runs", value=1 if udx.get("gro") else 0
            )
            yield CounterMetricFamily(
                "blind_relay_udx_gso_fallbacks",
                "Times the kernel refused GSO and it was switched off",
                value=udx.get("gso_fallbacks", 0),
            )
        cap = s.get("capacity")
        if isinstance(cap, Mapping):
            for metric, key, doc in (
                ("blind_relay_capacity_sessions", "sessions", "Sessions open now (each relayed connection holds two)"),
                ("blind_relay_capacity_sessions_limit", "max_sessions", "The session cap (--max-sessions)"),
                ("blind_relay_capacity_pairs", "active_pairs", "Relayed pairs active now"),
                ("blind_relay_capacity_pairs_limit", "max_active_pairs", "The active pairs cap (--max-active-pairs)"),
            ):
                yield GaugeMetricFamily(metric, doc, value=cap.get(key, 0))
            refused = CounterMetricFamily(
                "blind_relay_refused",
                "New sessions or pairings refused because every slot relays traffic (the peer is told at once)",
                labels=["what"],
            )
            refused.add_metric(["session"], cap.get("refused_sessions", 0))
            refused.add_metric(["pairing"], cap.get("refused_pairings", 0))
            yield refused
        mem = s.get("memory")
        if isinstance(mem, Mapping) and "budget_bytes" in mem:
            for metric, key, doc in (
                ("blind_relay_memory_budget_bytes", "budget_bytes", "The memory budget (--memory-budget)"),
                (
                    "blind_relay_memory_admission_limit_bytes",
                    "admission_limit_bytes",
                    "RSS above which newcomers are refused unless something idle makes room "
                    "(the budget less what held sessions may still grow by)",
                ),
                ("blind_relay_memory_full", "full", "1 while the memory budget is reached"),
            ):
                yield GaugeMetricFamily(metric, doc, value=float(mem.get(key) or 0))
            refused = CounterMetricFamily(
                "blind_relay_memory_refused",
                "Newcomers refused because the memory budget was reached and nothing idle could go",
                labels=["what"],
            )
            refused.add_metric(["session"], mem.get("refused_sessions", 0))
            refused.add_metric(["pairing"], s.get("refusals", {}).get("memory_pairs", 0))
            yield refused
            yield CounterMetricFamily(
                "blind_relay_memory_trims", "Times memory was handed back after a burst", value=mem.get("trims", 0)
            )
            yield CounterMetricFamily(
                "blind_relay_memory_trimmed_bytes",
                "RSS handed back after bursts",
                value=mem.get("trimmed_bytes", 0),
            )
        limits = s.get("limits", {}).get("rejected", {})
        rejected = CounterMetricFamily(
            "blind_relay_limit_rejections", "Requests refused because a resource cap was reached", labels=["limit"]
        )
        for name, value in sorted(limits.items()):
            rejected.add_metric([name], value)
        yield rejected
        dht = s.get("dht", {})
        yield GaugeMetricFamily(
            "blind_relay_dht_bootstrapped",
            "1 once the DHT node has bootstrapped",
            value=1 if dht.get("bootstrapped") else 0,
        )
        yield GaugeMetricFamily("blind_relay_dht_nodes", "Nodes in the DHT routing table", value=dht.get("nodes", 0))
        info = GaugeMetricFamily("blind_relay_info", "The relay's key and version", labels=["key", "version"])
        info.add_metric([str(s.get("key", "")), str(s.get("version", ""))], 1)
        yield info
        yield GaugeMetricFamily("blind_relay_uptime_seconds", "Seconds since start", value=s.get("uptime_seconds", 0))
        scraper = s.get("scraper")
        if isinstance(scraper, Mapping):
            yield GaugeMetricFamily(
                "blind_relay_scraper_registered",
                "1 while the alias is registered with the DHT scraper (--scraper-public-key)",
                value=1 if scraper.get("registered") else 0,
            )
            for name, key, doc in (
                ("blind_relay_scraper_registrations", "registrations", "Alias registrations the scraper accepted"),
                (
                    "blind_relay_scraper_registration_failures",
                    "registration_failures",
                    "Registration attempts that failed",
                ),
                ("blind_relay_scraper_metrics_served", "metrics_served", "Metrics requests answered over the DHT"),
                (
                    "blind_relay_scraper_metrics_refused",
                    "metrics_refused",
                    "Metrics requests refused (over budget, bad)",
                ),
                (
                    "blind_relay_scraper_connections_refused",
                    "connections_refused",
                    "Metrics connections refused (not the scraper's key, or too many)",
                ),
            ):
                yield CounterMetricFamily(name, doc, value=scraper.get(key, 0))


class InstrumentCollector(Collector):
    """The process and DHT gauges hyper-instrument 3.2.1 adds beside blind-relay-service's, where
    we have the same quantity: `process_pid`, `package_version`, hyperdht-stats' `dht_nr_nodes`,
    `dht_is_firewalled` and its `udx_total_*` socket totals (ours count the relay's one socket)."""

    def __init__(self, snapshot: SnapshotFn) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        yield GaugeMetricFamily("process_pid", "Process id on the operating system", value=s.get("pid", os.getpid()))
        version = GaugeMetricFamily("package_version", "Package version", labels=["version"])
        version.add_metric([str(s.get("version", ""))], 1)
        yield version
        dht = s.get("dht", {})
        yield GaugeMetricFamily("dht_nr_nodes", "Nodes in the DHT routing table", value=dht.get("nodes", 0))
        yield GaugeMetricFamily(
            "dht_is_firewalled", "1 while the DHT sees this node as firewalled", value=1 if dht.get("firewalled") else 0
        )
        traffic = s.get("traffic", {})
        for name, key, doc in (
            ("udx_total_bytes_transmitted", "sent_bytes", "Bytes sent on the UDX socket"),
            ("udx_total_packets_transmitted", "sent_packets", "Datagrams sent on the UDX socket"),
            ("udx_total_bytes_received", "received_bytes", "Bytes received on the UDX socket"),
            ("udx_total_packets_received", "received_packets", "Datagrams received on the UDX socket"),
            ("udx_packets_dropped_total", "dropped_packets", "Datagrams dropped unread"),
        ):
            yield GaugeMetricFamily(name, doc, value=traffic.get(key, 0))


def build_registry(snapshot: SnapshotFn) -> CollectorRegistry:
    """A private registry: our collectors plus prometheus_client's process metrics (RSS, CPU)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RelayCollector(snapshot))
    registry.register(InstrumentCollector(snapshot))
    ProcessCollector(registry=registry)
    return registry


def render_metrics(registry: CollectorRegistry) -> str:
    """The Prometheus text of `registry` (what `GET /metrics` serves and the DHT scraper gets)."""
    return generate_latest(registry).decode()


def parse_address(text: str) -> tuple[str, int] | None:
    """`HOST:PORT` (IPv6 as `[::1]:PORT`) or `off`; raises ValueError with what is wrong."""
    if text.strip().lower() == "off":
        return None
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT or off, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"port {port_text!r} in {text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} in {text!r} is out of range")
    return host, port


def bind_metrics_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host:port` for `MetricsServer(sock=...)`: bound before the relay
    touches its storage, so an address that cannot work stops it with nothing created. OSError
    as `bind` raises it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class MetricsServer:
    """Serves `/metrics`, `/stats` and, given `pairings`, `/pairings` (the relay's bounded record
    of its pairings, `relay.service.pairings`); one short HTTP/1.1 exchange per connection."""

    def __init__(
        self,
        snapshot: SnapshotFn,
        host: str = DEFAULT_METRICS_HOST,
        port: int = DEFAULT_METRICS_PORT,
        *,
        pairings: SnapshotFn | None = None,
        sock: socket.socket | None = None,
    ):
        self._snapshot = snapshot
        self._pairings = pairings
        self._sock = sock
        self.registry = build_registry(snapshot)
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        try:
            if self._sock is not None:  # bound already (`bind_metrics_socket`)
                self._server = await asyncio.start_server(self._handle, sock=self._sock)
            else:
                self._server = await asyncio.start_server(self._handle, self.host, self.port, reuse_address=True)
        except OSError as e:
            reason = "address already in use" if e.errno == 98 else (e.strerror or str(e))
            raise MetricsError(
                f"cannot serve metrics on {self.host}:{self.port}: {reason} (use --metrics HOST:PORT or off)", e.errno
            ) from e
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    def render(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for a GET of `path`."""
        route = path.split("?", 1)[0]
        if route == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", generate_latest(self.registry)
        if route == "/stats":
            return 200, "application/json", json.dumps(self._snapshot(), sort_keys=True).encode() + b"\n"
        if route == "/pairings" and self._pairings is not None:
            return 200, "application/json", json.dumps(self._pairings()).encode() + b"\n"
        if route == "/":
            what = "/stats or /pairings (JSON)" if self._pairings is not None else "/stats (JSON)"
            return 200, "text/plain; charset=utf-8", f"blind-relay: GET /metrics (Prometheus) or {what}\n".encode()
        return 404, "text/plain; charset=utf-8", b"not found\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            method = parts[0] if parts else ""
            if len(parts) != 3 or not parts[2].startswith("HTTP/"):
                status, ctype, body = 400, "text/plain", b"bad request\n"
            elif method not in ("GET", "HEAD"):
                status, ctype, body = 405, "text/plain", b"only GET\n"
            else:
                status, ctype, body = self.render(parts[1])
            reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + (b"" if method == "HEAD" else body)
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        except Exception:  # a scrape must never take the relay down
            log.warning("metrics request failed", exc_info=True)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
