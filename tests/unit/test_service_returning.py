"""After a planned restart the hosts that were connected come back all at once: the handshake
gates expect them (as many sessions as each held) instead of throttling them as a flood."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from benchmarks.relay_costs import Relay
from relay.keys import key_pair
from relay.service.app import RETURNING_WINDOW, RelayApp, RelayConfig
from relay.service.limits import LIMIT_HANDSHAKES_BUSY, LIMIT_HANDSHAKES_PER_ADDRESS, HandshakeGate, Limits
from relay.service.runtime import RETURNING_FILE, take_returning, write_returning

TIGHT = Limits(handshakes_per_address=2, handshake_refill_per_second=1.0, busy_address_sessions=1,
               handshake_budget_per_second=1.0, handshake_max_wait=0.0)  # fmt: skip


def test_a_busy_host_is_throttled_without_a_record() -> None:
    gate = HandshakeGate(TIGHT)
    verdicts = [gate.admit("10.0.0.1", held, 100.0) for held in range(4)]
    assert verdicts[:1] == [0.0] and set(verdicts[1:]) <= {LIMIT_HANDSHAKES_BUSY, LIMIT_HANDSHAKES_PER_ADDRESS}


def test_a_returning_host_reconnects_what_it_held_unthrottled_and_only_that() -> None:
    gate = HandshakeGate(TIGHT)
    gate.expect_returning({"10.0.0.1": 5}, 100.0, 60.0)
    assert [gate.admit("10.0.0.1", held, 100.0 + held / 100) for held in range(5)] == [0.0] * 5
    # back to what it held: the usual gates again (it already spent nothing of its bucket)
    assert gate.admit("10.0.0.1", 5, 100.1) == 0.0
    assert gate.admit("10.0.0.1", 6, 100.1) in (LIMIT_HANDSHAKES_BUSY, LIMIT_HANDSHAKES_PER_ADDRESS)
    # a host the last run did not serve gets nothing more than before
    other = [gate.admit("10.0.0.9", held, 100.2) for held in range(3)]
    assert other[0] == 0.0 and set(other[1:]) <= {LIMIT_HANDSHAKES_BUSY, LIMIT_HANDSHAKES_PER_ADDRESS}
    # and the allowance ends with its window
    assert not gate.returning("10.0.0.1", 0, 160.0)


def test_the_record_is_for_one_recent_restart_only(tmp_path: Path) -> None:
    write_returning(tmp_path, {"10.0.0.1": 1200, "10.0.0.2": 3}, 1000.0)
    assert take_returning(tmp_path, 1010.0) == {"10.0.0.1": 1200, "10.0.0.2": 3}
    assert not (tmp_path / RETURNING_FILE).exists() and take_returning(tmp_path, 1010.0) == {}
    write_returning(tmp_path, {"10.0.0.1": 5}, 1000.0)
    assert take_returning(tmp_path, 1000.0 + 3600.0) == {}  # an old stop says nothing about now
    (tmp_path / RETURNING_FILE).write_text("{not json")
    assert take_returning(tmp_path, 1000.0) == {}
    (tmp_path / RETURNING_FILE).write_text(json.dumps({"stopped_at": 1000.0, "hosts": {"h": "x"}}))
    assert take_returning(tmp_path, 1000.0) == {}


def test_a_clean_stop_records_its_hosts_and_the_next_start_expects_them(tmp_path: Path) -> None:
    async def run() -> None:
        relay = Relay(tmp_path)
        await relay.bind()
        for _ in range(3):
            relay.session()
        hosts = {s.conn.client_address[0] for s in relay.app._sessions.values()}
        await relay.app.close()
        assert json.loads((tmp_path / RETURNING_FILE).read_text())["hosts"] == dict.fromkeys(hosts, 1)

        again = RelayApp(RelayConfig(storage=tmp_path, key_pair=key_pair(), host="127.0.0.1", port=0, metrics=None))
        await again.bind()
        try:
            now = again._now()
            assert all(again.handshakes.returning(h, 0, now) for h in hosts)
            assert not again.handshakes.returning("10.200.0.1", 0, now)
            assert not any(again.handshakes.returning(h, 0, now + RETURNING_WINDOW) for h in hosts)
            assert not (tmp_path / RETURNING_FILE).exists()
        finally:
            await again.close()

    asyncio.run(run())
