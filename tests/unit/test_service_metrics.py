"""`/metrics` and `/stats` of a real RelayApp: names per docs/relay.md (Metrics), values that move with real traffic."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from relay.blindrelay import SHED_CAUSES
from relay.keys import encode_id, key_pair
from relay.service.app import RelayApp, RelayConfig, RelayStartError
from relay.service.metrics import MetricsError, MetricsServer, parse_address

GAUGES = [
    f"blind_relay_{g}_{n}"
    for g, names in (
        ("sessions", ("accepted", "opened", "closed")),
        ("pairings", ("requested", "matched", "cancelled", "pending", "active")),
        ("streams", ("opened", "closed", "errors")),
    )
    for n in names
]
COUNTERS = [
    "blind_relay_relayed_bytes_total",
    "blind_relay_relayed_packets_total",
    "blind_relay_dropped_packets_total",
    "blind_relay_udp_received_bytes_total",
    "blind_relay_udp_sent_bytes_total",
    "blind_relay_udp_received_packets_total",
    "blind_relay_udp_sent_packets_total",
]


async def _get(url_host: str, port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection(url_host, port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.labels:
                out[s.name] = s.value
    return out


@pytest.fixture
async def app(tmp_path: Path):
    kp = key_pair(b"\x07" * 32)
    cfg = RelayConfig(storage=tmp_path, key_pair=kp, host="127.0.0.1", port=0, metrics=("127.0.0.1", 0))
    a = RelayApp(cfg)
    await a.bind()  # socket + metrics only: no DHT in unit tests
    yield a
    await a.close()


async def test_metrics_has_every_contract_name(app: RelayApp) -> None:
    assert app.metrics is not None
    status, headers, body = await _get("127.0.0.1", app.metrics.port, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = _samples(body.decode())
    for name in [*GAUGES, *COUNTERS, "process_resident_memory_bytes", "process_cpu_seconds_total"]:
        assert name in samples, name
    assert samples["process_resident_memory_bytes"] > 1_000_000


async def test_stats_has_the_contract_shape(app: RelayApp) -> None:
    assert app.metrics is not None
    status, headers, body = await _get("127.0.0.1", app.metrics.port, "/stats")
    assert status == 200 and headers["Content-Type"] == "application/json"
    s = json.loads(body)
    assert s["key"] == encode_id(key_pair(b"\x07" * 32).public_key)
    assert s["port"] == app.port and s["host"] == "127.0.0.1"
    for k in ("version", "pid", "uptime_seconds", "storage", "cpu_seconds"):
        assert k in s
    assert set(s["dht"]) >= {"bootstrapped", "firewalled", "public_host", "public_port", "last_announce", "nodes"}
    assert set(s["sessions"]) == {"accepted", "opened", "closed"}
    assert set(s["pairings"]) == {"requested", "matched", "cancelled", "pending", "active"}
    assert set(s["streams"]) == {"opened", "closed", "errors"}
    assert set(s["traffic"]) == {
        "relayed_bytes",
        "relayed_packets",
        "dropped_packets",
        "received_bytes",
        "sent_bytes",
        "received_packets",
        "sent_packets",
        "kernel_packets",
        "kernel_bytes",
    }
    assert s["kernel"] == {"enabled": False, "reason": "not asked (--kernel-forwarding)"}
    assert s["memory"]["rss_bytes"] > 1_000_000


async def test_counters_move_with_datagrams_at_the_relay_port(app: RelayApp) -> None:
    assert app.metrics is not None
    before = _samples((await _get("127.0.0.1", app.metrics.port, "/metrics"))[2].decode())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(25):
            s.sendto(b"\xff" * 40, ("127.0.0.1", app.port))
    for _ in range(500):  # wait on the counter, not on time
        if app.snapshot()["traffic"]["received_packets"] >= 25:
            break
        await asyncio.sleep(0.01)
    after = _samples((await _get("127.0.0.1", app.metrics.port, "/metrics"))[2].decode())
    assert after["blind_relay_udp_received_packets_total"] - before["blind_relay_udp_received_packets_total"] == 25
    assert after["blind_relay_udp_received_bytes_total"] - before["blind_relay_udp_received_bytes_total"] == 1000
    assert after["blind_relay_dropped_packets_total"] - before["blind_relay_dropped_packets_total"] == 25


async def test_unknown_paths_and_methods(app: RelayApp) -> None:
    assert app.metrics is not None
    assert (await _get("127.0.0.1", app.metrics.port, "/nope"))[0] == 404
    assert (await _get("127.0.0.1", app.metrics.port, "/metrics", "POST"))[0] == 405
    status, headers, body = await _get("127.0.0.1", app.metrics.port, "/stats", "HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0
    reader, writer = await asyncio.open_connection("127.0.0.1", app.metrics.port)
    writer.write(b"\x00garbage\r\n\r\n")
    await writer.drain()
    assert (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.1 400")
    writer.close()


async def test_busy_udp_port_is_a_start_error(app: RelayApp, tmp_path: Path) -> None:
    cfg = RelayConfig(storage=tmp_path, key_pair=key_pair(), host="127.0.0.1", port=app.port, metrics=None)
    with pytest.raises(RelayStartError, match="already in use"):
        await RelayApp(cfg).bind()


def test_parse_address() -> None:
    assert parse_address("off") is None
    assert parse_address("127.0.0.1:49738") == ("127.0.0.1", 49738)
    assert parse_address("[::1]:9") == ("::1", 9)
    for bad in ("nohost", ":80", "h:x", "h:70000"):
        with pytest.raises(ValueError):
            parse_address(bad)


async def test_metrics_server_alone_renders_limit_counters() -> None:
    snap = {"limits": {"rejected": {"pending_total": 3}}, "sessions": {"accepted": 2}}
    m = MetricsServer(lambda: snap, "127.0.0.1", 0)
    await m.start()
    try:
        _, _, body = await _get("127.0.0.1", m.port, "/metrics")
    finally:
        await m.close()
    text = body.decode()
    assert 'blind_relay_limit_rejections_total{limit="pending_total"} 3.0' in text
    assert "blind_relay_sessions_accepted 2.0" in text


async def test_stats_and_metrics_count_sheds_and_drops_by_cause(app: RelayApp, monkeypatch: pytest.MonkeyPatch) -> None:
    assert app.metrics is not None
    s = app.snapshot()
    assert set(s["shed"]) == set(SHED_CAUSES) and all(v == 0 for v in s["shed"].values())
    assert isinstance(s["dropped"], dict)
    assert s["handshakes"] == {  # no DHT server yet
        "accepted": 0,
        "rejected": 0,
        "failed": 0,
        "pending": 0,
        "backlog": 0,
        "shed_stale": 0,
        "shed_full": 0,
        "waited": 0,
    }
    app.blind.shed["silent_pair"] += 3
    # the UDX sockets' per-cause counters (helper fastpath's `SocketStats.dropped_by_cause`), summed
    # over sockets; stand-in sockets give known counts
    real = app.udx.sockets[0].stats
    fields = {k: v for k, v in real.as_dict().items() if k != "dropped_by_cause"}
    fake = [
        SimpleNamespace(
            stats=SimpleNamespace(**fields, dropped_by_cause={"garbage": 5, "unknown_stream": 2}),
            offload=lambda: {"gso": True, "gro": False, "gso_fallbacks": 1},
        ),
        SimpleNamespace(
            stats=SimpleNamespace(**fields, dropped_by_cause={"garbage": 1}),
            offload=lambda: {"gso": False, "gro": True, "gso_fallbacks": 2},
        ),
    ]
    with monkeypatch.context() as m:  # the stand-ins go before the app fixture closes the real sockets
        m.setattr(app.udx, "sockets", fake)
        s = app.snapshot()
        assert s["shed"]["silent_pair"] == 3 and s["dropped"] == {"garbage": 6, "unknown_stream": 2}
        assert s["udx"] == {"gso": True, "gro": True, "gso_fallbacks": 3}
        text = (await _get("127.0.0.1", app.metrics.port, "/metrics"))[2].decode()
        assert 'blind_relay_shed_total{cause="silent_pair"} 3.0' in text
        assert 'blind_relay_shed_total{cause="idle_session"} 0.0' in text
        assert 'blind_relay_dropped_total{cause="garbage"} 6.0' in text
        assert 'blind_relay_handshakes_total{result="rejected"} 0.0' in text
        assert 'blind_relay_handshakes_total{result="shed_stale"} 0.0' in text
        assert "blind_relay_handshakes_backlog 0.0" in text
        assert "blind_relay_udx_gso 1.0" in text and "blind_relay_udx_gso_fallbacks_total 3.0" in text


async def test_metrics_tolerate_a_snapshot_without_the_new_groups() -> None:
    m = MetricsServer(lambda: {"shed": "nonsense"}, "127.0.0.1", 0)
    await m.start()
    try:
        status, _, body = await _get("127.0.0.1", m.port, "/metrics")
    finally:
        await m.close()
    assert status == 200 and b"# TYPE blind_relay_shed_total counter" in body


async def test_default_metrics_address_taken_falls_back_to_a_free_port(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        kp = key_pair(b"\x07" * 32)
        explicit = RelayApp(
            RelayConfig(storage=tmp_path, key_pair=kp, host="127.0.0.1", port=0, metrics=("127.0.0.1", port))
        )
        with pytest.raises(MetricsError, match="address already in use"):
            await explicit.bind()
        await explicit.close()
        cfg = RelayConfig(
            storage=tmp_path, key_pair=kp, host="127.0.0.1", port=0, metrics=("127.0.0.1", port), metrics_fallback=True
        )
        a = RelayApp(cfg)
        with caplog.at_level("WARNING", logger="relay"):
            await a.bind()
        try:
            assert a.metrics is not None and a.metrics.port not in (0, port)
            assert a.runtime_info()["metrics"] == f"http://127.0.0.1:{a.metrics.port}"
            notes = [r.getMessage() for r in caplog.records if "is in use" in r.getMessage()]
            assert notes == [
                f"metrics address 127.0.0.1:{port} is in use (another relay?); serving metrics on "
                f"http://127.0.0.1:{a.metrics.port} instead"
            ]
            assert (await _get("127.0.0.1", a.metrics.port, "/stats"))[0] == 200
        finally:
            await a.close()
