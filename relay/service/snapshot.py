"""The relay's one stats snapshot: the `/stats` document, from which `/metrics` is rendered too.

Read from the running `RelayApp` on demand (a scrape, a `/stats` request); nothing here is on
the forwarding path.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import relay
from relay.blindrelay import SHED_CAUSES
from relay.service.limits import (
    LIMIT_ACTIVE_PAIRS,
    LIMIT_MEMORY,
    LIMIT_PENDING_PER_SESSION,
    LIMIT_PENDING_TIMEOUT,
    LIMIT_PENDING_TOTAL,
)

if TYPE_CHECKING:
    from relay.service.app import RelayApp


@dataclass
class Traffic:
    """Socket-level counters summed over the relay's sockets (and the kernel's share) for one snapshot."""

    relayed_bytes: int = 0
    relayed_packets: int = 0
    dropped_packets: int = 0
    received_bytes: int = 0
    sent_bytes: int = 0
    received_packets: int = 0
    sent_packets: int = 0
    kernel_packets: int = 0
    kernel_bytes: int = 0


def handshake_stats(server: Any) -> dict[str, int]:
    """The DHT server's Noise responder: handshakes accepted, refused (our gate or its own
    attempt cap), failed, and attempts it holds now; and its backlog of new handshakes
    waiting for the CPU: queued now, shed because they waited too long (their client had
    given up) or because the backlog was full (from the host served most), and held for
    their address's rate (`waited`: over the burst, answered when its next token came)."""
    out = {
        "accepted": 0, "rejected": 0, "failed": 0, "pending": 0,
        "backlog": 0, "shed_stale": 0, "shed_full": 0, "waited": 0,
    }  # fmt: skip
    backlog = getattr(server, "backlog", None)
    if backlog is not None:
        out["backlog"] = len(backlog)
        for key in ("waited", "shed_stale", "shed_full"):
            out[key] = int(backlog.stats.get(key, 0))
    responder = getattr(server, "responder", None)
    if responder is not None:
        st = getattr(responder, "stats", {})
        out["accepted"] = int(st.get("handshakes", 0))
        out["rejected"] = int(st.get("rejected", 0))
        out["failed"] = int(st.get("failed", 0))
        out["pending"] = len(getattr(responder, "attempts", ()))
    return out


def kernel_stats(app: RelayApp) -> dict[str, Any]:
    """`/stats` `kernel`: whether established pairs are forwarded by nftables, and why not."""
    k = app.socket.kernel if app.socket is not None else None
    if k is not None:
        return k.stats()
    asked = app.config.kernel_forwarding
    return {"enabled": False, "reason": app.kernel_error if asked else "not asked (--kernel-forwarding)"}


def capacity(app: RelayApp) -> dict[str, int]:
    """`/stats` `capacity`: how full the relay is against its caps, and what a full relay
    refused (a session or a pairing, each told to its peer at once; never a live pair shed)."""
    lim = app.config.limits
    b = app.blind.stats
    return {
        "sessions": app.blind.session_count,
        "max_sessions": lim.max_sessions,
        "active_pairs": b.pairings_active,
        "max_active_pairs": lim.max_active_pairs,
        "refused_sessions": b.sessions_refused_full,
        "refused_pairings": b.pairings_refused_full,
    }


def socket_stats(app: RelayApp) -> dict[str, Any]:
    """`/stats` `socket`: the receive buffer the kernel granted and the datagrams it dropped
    there (the buffer was full, e.g. during a stall); the relay never saw those."""
    if app.socket is None:
        return {"receive_buffer_bytes": 0, "kernel_drops": 0}
    return {"receive_buffer_bytes": app.socket.receive_buffer, "kernel_drops": app.socket.kernel_drops() or 0}


def stats_document(app: RelayApp) -> dict[str, Any]:
    """The `/stats` document (docs/relay.md); `/metrics` is rendered from the same dict."""
    traffic = Traffic()
    for sock in app.udx.sockets:
        kernel = getattr(sock, "kernel", None)
        if kernel is not None:
            kernel.refresh()
        st = sock.stats
        traffic.relayed_bytes += st.relayed_bytes
        traffic.relayed_packets += st.relayed_packets
        traffic.dropped_packets += st.dropped_packets
        traffic.received_bytes += st.received_bytes
        traffic.sent_bytes += st.sent_bytes
        traffic.received_packets += st.received_packets
        traffic.sent_packets += st.sent_packets
        traffic.kernel_packets += getattr(st, "kernel_packets", 0)
        traffic.kernel_bytes += getattr(st, "kernel_bytes", 0)
    dropped: dict[str, int] = {}
    offload: dict[str, Any] | None = None
    for sock in app.udx.sockets:
        for cause, n in (getattr(sock.stats, "dropped_by_cause", None) or {}).items():
            dropped[str(cause)] = dropped.get(str(cause), 0) + int(n)
        report = getattr(sock, "offload", None)  # the UDX layer's {gso, gro, gso_fallbacks}, when it has one
        if callable(report):
            o = report()
            if offload is None:
                offload = {"gso": False, "gro": False, "gso_fallbacks": 0}
            offload["gso"] = offload["gso"] or bool(o.get("gso"))
            offload["gro"] = offload["gro"] or bool(o.get("gro"))
            offload["gso_fallbacks"] += int(o.get("gso_fallbacks", 0))
    if app.node is not None and app.node.rpc_dropped:  # the RPC layer's own count, not per socket
        dropped["dht_rpc"] = app.node.rpc_dropped
        traffic.dropped_packets += app.node.rpc_dropped
    with app.process.oneshot():
        mem = app.process.memory_info().rss
        cpu = app.process.cpu_times()
    b = app.blind.stats
    rejected = app.limit_counters.snapshot()
    rejected[LIMIT_PENDING_PER_SESSION] += b.pairings_refused_session_limit
    rejected[LIMIT_PENDING_TOTAL] += b.pairings_refused_total_limit
    rejected[LIMIT_PENDING_TIMEOUT] += b.pairings_timed_out
    rejected[LIMIT_ACTIVE_PAIRS] += b.pairings_refused_full - b.pairings_refused_memory
    rejected[LIMIT_MEMORY] += b.pairings_refused_memory
    if app.node is not None:
        dht = app.node.stats()
    else:
        dht = {
            "bootstrapped": False,
            "firewalled": True,
            "public_host": None,
            "public_port": None,
            "last_announce": None,
            "nodes": 0,
        }
    return {
        "key": app.key,
        "version": relay.__version__,
        "pid": os.getpid(),
        "uptime_seconds": round(time.time() - app.started_at, 3),  # wall time: a metric
        "storage": str(app.config.storage),
        "host": app.config.host,
        "port": app.port,
        "dht": dht,
        **b.as_dict(),
        "traffic": {
            "relayed_bytes": traffic.relayed_bytes,
            "relayed_packets": traffic.relayed_packets,
            "dropped_packets": traffic.dropped_packets,
            "received_bytes": traffic.received_bytes,
            "sent_bytes": traffic.sent_bytes,
            "received_packets": traffic.received_packets,
            "sent_packets": traffic.sent_packets,
            "kernel_packets": traffic.kernel_packets,
            "kernel_bytes": traffic.kernel_bytes,
        },
        "memory": app.memory_snapshot(mem),
        "cpu_seconds": round(cpu.user + cpu.system, 3),
        "dropped": dropped,
        "handshakes": handshake_stats(app.server),
        **({"udx": offload} if offload is not None else {}),
        "kernel": kernel_stats(app),
        "shed": {cause: app.blind.shed.get(cause, 0) for cause in SHED_CAUSES},
        "capacity": capacity(app),
        "pauses": app.pauses.snapshot(),
        "socket": socket_stats(app),
        "limits": {"config": app.config.limits.as_dict(), "rejected": rejected},
        "allow_list": None if app.config.allow is None else len(app.config.allow),
        **({"scraper": app.scraper.snapshot()} if app.scraper is not None else {}),
    }
