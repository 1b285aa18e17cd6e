"""The relay process: one UDP socket, the DHT server on the storage key, blind-relay sessions, metrics.

`RelayApp` owns the asyncio side of everything: it binds the port, starts the metrics endpoint,
and (once the protocol layers are wired) runs the DHT node and a blind-relay session per
accepted connection. It produces the single stats snapshot behind `/metrics` and `/stats`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

import relay
from relay.keys import KeyPair, encode_id
from relay.service.limits import LimitCounters, Limits
from relay.service.metrics import MetricsServer
from relay.service.runtime import remove_runtime, write_runtime

log = logging.getLogger("relay")

PUBLIC_BOOTSTRAP = (
    "88.99.3.86@node1.hyperdht.org:49737",
    "142.93.90.113@node2.hyperdht.org:49737",
    "138.68.147.8@node3.hyperdht.org:49737",
)


class RelayStartError(Exception):
    """The relay cannot start; the message is the one line the operator sees."""


@dataclass
class RelayConfig:
    storage: Path
    key_pair: KeyPair
    host: str = "0.0.0.0"
    port: int = 49737
    bootstrap: list[str] = field(default_factory=lambda: list(PUBLIC_BOOTSTRAP))
    metrics: tuple[str, int] | None = ("127.0.0.1", 49738)
    allow: frozenset[bytes] | None = None
    limits: Limits = field(default_factory=Limits)


@dataclass
class Traffic:
    """Socket-level counters, bumped on the hot path (plain ints, no locks: one event loop)."""

    relayed_bytes: int = 0
    relayed_packets: int = 0
    dropped_packets: int = 0
    received_bytes: int = 0
    sent_bytes: int = 0
    received_packets: int = 0
    sent_packets: int = 0


class _PlainUDP(asyncio.DatagramProtocol):
    """Holds the port and counts datagrams until the UDX runtime owns the socket."""

    def __init__(self, traffic: Traffic) -> None:
        self.traffic = traffic

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.traffic.received_packets += 1
        self.traffic.received_bytes += len(data)
        self.traffic.dropped_packets += 1


class RelayApp:
    """Start, run and stop one relay; `snapshot()` is the truth behind the metrics."""

    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self.key = encode_id(config.key_pair.public_key)
        self.traffic = Traffic()
        self.limit_counters = LimitCounters()
        self.started_at = time.time()
        self._started_mono = time.monotonic()
        self._proc = psutil.Process()
        self._transport: asyncio.DatagramTransport | None = None
        self.metrics: MetricsServer | None = None
        self.port = config.port
        self.dht_view: dict[str, Any] = {
            "bootstrapped": False,
            "firewalled": True,
            "public_host": None,
            "public_port": None,
            "last_announce": None,
            "nodes": 0,
            "note": "DHT node not wired in yet (phase 1): the port is held, nothing is announced",
        }
        self._closed = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        sock = bind_udp(cfg.host, cfg.port)
        self._transport, _ = await loop.create_datagram_endpoint(lambda: _PlainUDP(self.traffic), sock=sock)
        self.port = self._transport.get_extra_info("sockname")[1]
        if cfg.metrics is not None:
            self.metrics = MetricsServer(self.snapshot, *cfg.metrics)
            try:
                await self.metrics.start()
            except Exception:
                self._transport.close()
                raise

    async def close(self) -> None:
        """Unannounce, close sessions and sockets; safe to call twice."""
        if self.metrics is not None:
            await self.metrics.close()
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        self._closed.set()

    def runtime_info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "key": self.key,
            "host": self.config.host,
            "port": self.port,
            "metrics": self.metrics.url if self.metrics is not None else None,
            "started_at": int(self.started_at),
            "version": relay.__version__,
        }

    def write_runtime(self) -> Path:
        return write_runtime(self.config.storage, self.runtime_info())

    def remove_runtime(self) -> None:
        remove_runtime(self.config.storage, os.getpid())

    # -- stats -----------------------------------------------------------------------------

    def relay_stats(self) -> dict[str, dict[str, int]]:
        zero = {
            "sessions": {"accepted": 0, "opened": 0, "closed": 0},
            "pairings": {"requested": 0, "matched": 0, "cancelled": 0, "pending": 0, "active": 0},
            "streams": {"opened": 0, "closed": 0, "errors": 0},
        }
        return zero

    def snapshot(self) -> dict[str, Any]:
        """The `/stats` document (interfaces.md); `/metrics` is rendered from the same dict."""
        t = self.traffic
        with self._proc.oneshot():
            mem = self._proc.memory_info().rss
            cpu = self._proc.cpu_times()
        stats = self.relay_stats()
        return {
            "key": self.key,
            "version": relay.__version__,
            "pid": os.getpid(),
            "uptime_seconds": round(time.monotonic() - self._started_mono, 3),
            "storage": str(self.config.storage),
            "host": self.config.host,
            "port": self.port,
            "dht": dict(self.dht_view),
            **stats,
            "traffic": {
                "relayed_bytes": t.relayed_bytes,
                "relayed_packets": t.relayed_packets,
                "dropped_packets": t.dropped_packets,
                "received_bytes": t.received_bytes,
                "sent_bytes": t.sent_bytes,
                "received_packets": t.received_packets,
                "sent_packets": t.sent_packets,
            },
            "memory": {"rss_bytes": mem},
            "cpu_seconds": round(cpu.user + cpu.system, 3),
            "limits": {"config": self.config.limits.as_dict(), "rejected": self.limit_counters.snapshot()},
            "allow_list": None if self.config.allow is None else len(self.config.allow),
        }


def bind_udp(host: str, port: int) -> socket.socket:
    """Bind the relay's UDP socket ourselves, so a busy port gives a real errno and a clear line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise RelayStartError(_bind_error(host, port, e)) from e
    sock.setblocking(False)
    return sock


def _bind_error(host: str, port: int, e: OSError) -> str:
    if e.errno == errno.EADDRINUSE:
        return f"UDP port {port} on {host} is already in use (is another relay running? pick one with --port)"
    if e.errno == errno.EACCES:
        return f"not allowed to bind UDP port {port} on {host} (ports below 1024 need privileges)"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"cannot bind {host}:{port}: {host} is not an address of this machine (check --host)"
    return f"cannot bind UDP {host}:{port}: {e.strerror or e}"


async def run_until_signalled(app: RelayApp, stop: asyncio.Event) -> None:
    """Wait for SIGINT/SIGTERM (set by the CLI on `stop`), then close cleanly."""
    try:
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await app.close()
