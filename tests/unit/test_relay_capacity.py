"""A full relay refuses, counted: the real `RelayApp` taking real secret-stream connections
(`benchmarks/relay_costs.Relay`: no DHT, the peer side driven in-process), with small caps."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.relay_costs import Client, Relay
from relay.service.limits import Limits
from relay.service.metrics import build_registry


def _labelled(text: str) -> dict[str, float]:
    return {
        s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _connect(relay: Relay) -> tuple[Client, Any]:
    """A new session and the relay's secret stream for it (None if the relay refused it)."""
    before = set(relay.app._sessions)
    client = relay.session()
    new = [s for s in relay.app._sessions if s not in before]
    return client, relay.app._sessions[new[0]].conn.secret_stream if new else None


def test_a_full_relay_refuses_a_new_session_counts_it_and_keeps_its_live_pair(tmp_path: Path) -> None:
    async def run() -> None:
        relay = Relay(tmp_path)
        app = relay.app
        app.config = dataclasses.replace(app.config, limits=Limits(max_sessions=2))
        app.blind.max_sessions = 2
        await relay.bind()
        try:
            (a, pa), (b, pb) = _connect(relay), _connect(relay)
            token = b"\x01" * 32
            a.pair(True, token, 1)
            pa.data_received(a.flush())
            b.pair(False, token, 2)
            pb.data_received(b.flush())
            assert app.blind.stats.pairings_active == 1 and len(app._streams) == 2
            for sid in app._streams:  # a packet on each relay stream: the pair carries traffic
                app.blind.stream_carried(sid)
            live = set(app._sessions)
            _, refused = _connect(relay)
            assert refused is None and set(app._sessions) == live
            assert not any(s.closed for s in live) and app.blind.stats.pairings_active == 1
            snap = app.snapshot()
            assert snap["capacity"]["refused_sessions"] == 1 and snap["capacity"]["sessions"] == 2
            assert snap["limits"]["rejected"]["sessions"] == 1 and snap["shed"]["sessions"] == 0
            m = _labelled(generate_latest(build_registry(app.snapshot)).decode())
            assert m["blind_relay_refused_total{what=session}"] == 1
            assert m["blind_relay_refused_total{what=pairing}"] == 0
            assert m["blind_relay_capacity_sessions"] == 2 and m["blind_relay_capacity_sessions_limit"] == 2
            assert m["blind_relay_capacity_pairs"] == 1
            assert m["blind_relay_limit_rejections_total{limit=sessions}"] == 1
        finally:
            app.udx.close()

    asyncio.run(run())


def test_a_full_relay_sheds_an_idle_session_for_a_newcomer(tmp_path: Path) -> None:
    async def run() -> None:
        relay = Relay(tmp_path)
        app = relay.app
        app.config = dataclasses.replace(app.config, limits=Limits(max_sessions=2))
        app.blind.max_sessions = 2
        await relay.bind()
        try:
            _connect(relay)
            _connect(relay)
            _, newcomer = _connect(relay)
            assert newcomer is not None and len(app._sessions) == 2
            assert app.snapshot()["shed"]["sessions"] == 1 and app.snapshot()["capacity"]["refused_sessions"] == 0
        finally:
            app.udx.close()

    asyncio.run(run())
