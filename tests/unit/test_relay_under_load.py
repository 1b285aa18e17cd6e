"""Two failures the relay met under load, each reproduced here (both fail on the glue before the
core driver): thousands of silent pairs expiring in one tick, and a release timer due in under a
millisecond under uvloop."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from benchmarks.relay_costs import Relay
from relay.keys import key_pair
from relay.service.app import RelayApp, RelayConfig
from relay.service.limits import Limits
from relay.service.memory import EmbeddedResidentSet
from tests.unit.test_service_clock import VirtualClock

PAIRS = 2000


def test_thousands_of_silent_pairs_expiring_in_one_tick_close_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every pair's two relay streams close in the tick that reaps them: each close reports back
    to the blind-relay core while the driver is still draining its events (the old glue
    recursed, one stack level per queued destroy, into RecursionError)."""
    clock = VirtualClock(1000.0)
    limits = Limits(max_active_pairs=2 * PAIRS, silent_pair_timeout=20.0, session_idle_timeout=60.0)

    async def run() -> None:
        relay = Relay(tmp_path)
        relay.app = RelayApp(
            RelayConfig(storage=tmp_path, key_pair=key_pair(), metrics=None, limits=limits), rss=EmbeddedResidentSet()
        )
        relay.app.loop = clock  # type: ignore[assignment]
        await relay.bind()
        app = relay.app
        try:
            a, b = relay.session(), relay.session()
            pa, pb = (s.conn.secret_stream for s in app._sessions.values())
            for i in range(PAIRS):
                token = i.to_bytes(4, "little") * 8
                a.pair(True, token, 1 + i)
                pa.data_received(a.flush())
                b.pair(False, token, 1 + i)
                pb.data_received(b.flush())
            assert app.blind.stats.pairings_active == PAIRS and len(app._streams) == 2 * PAIRS
            with caplog.at_level(logging.ERROR):
                clock.advance(1021.0)  # every pair silent for 20 s: all reaped in one tick
            assert app.blind.shed["silent_pair"] == PAIRS
            assert app._streams == {} and app.blind.stats.pairings_active == 0
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[-2000:]
            assert app.udx.sockets[0].stats.callback_errors == 0
        finally:
            app.udx.close()

    asyncio.run(run())


def test_a_handshake_released_in_under_a_millisecond_under_uvloop_needs_no_timer_handle_method() -> None:
    """uvloop's `call_at` hands back a plain Handle (no `when()`) for a time under ~1 ms away.
    A held handshake due that soon, then one due later, must both be answered (the old glue
    asked the first timer's handle for `when()` and dropped the second handshake)."""
    import os
    from types import SimpleNamespace

    import uvloop

    from relay.dht import DHTNode, HyperDHTServer
    from relay.udx import UDX

    async def run() -> None:
        udx = UDX()
        node = DHTNode(udx=udx, bootstrap=[], host="127.0.0.1")
        await node.bind()
        waits = iter([0.0002, 0.3])
        server = HyperDHTServer(node, key_pair(), lambda conn: None, announce=False, admit=lambda addr: next(waits))
        await server.listen()
        answered: list[bytes] = []
        server._handshake = lambda q: answered.append(q.copies[0][1].noise)  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        try:
            for i in range(2):
                hs = SimpleNamespace(noise=os.urandom(32), peer_address=(f"10.0.0.{i + 1}", 4000))
                inc = SimpleNamespace(peer=SimpleNamespace(address=(f"10.0.0.{i + 1}", 4000)))
                server.on_peer_handshake(inc, hs)  # type: ignore[arg-type]
            deadline = loop.time() + 10
            while len(answered) < 2 and loop.time() < deadline:
                await asyncio.sleep(0.01)
            assert len(answered) == 2 and node.internal_errors == 0
        finally:
            await server.close()
            await node.close()
            udx.close()

    uvloop.run(run())
