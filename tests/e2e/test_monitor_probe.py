"""The monitor probing relays that have no metrics: round trips over time, failures with their
stage, and `q` while a probe is in flight.

Our real relay (`python -m relay --metrics off`) on the loopback npm hyperdht testnet, watched
twice: by its storage (the runtime file gives the key, the monitor probes it by itself) and by
`--relay-key` alone, as an npm blind-relay-service would be. Waits are on conditions, with
generous safety bounds; nothing asserts a speed.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cosmictui.monitor_app import MonitorApp
from cosmictui.ops.metrics.client import RelayState, Target
from cosmictui.ops.metrics.probe import STAGES
from cosmictui.widgets.monitor_graphs import TimePlot
from cosmictui.widgets.monitor_relays import RelayTable
from tests.e2e._monitor_relay import MonitoredRelay, NodeTestnet
from tests.e2e.test_monitor_live import facts_text, until

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def testnet(node: str) -> Iterator[NodeTestnet]:
    tn = NodeTestnet(node, 4)
    try:
        yield tn
    finally:
        tn.stop()


async def test_monitor_probes_a_relay_without_metrics_and_shows_it_dying(testnet: NodeTestnet, tmp_path: Path) -> None:
    relay = MonitoredRelay(tmp_path / "store", testnet.bootstrap, metrics="off").start()
    try:
        targets = [Target(storage=relay.storage), Target(relay_key=relay.key)]
        app = MonitorApp(targets, interval=0.5, bootstrap=testnet.bootstrap.split(","), probe_interval=0.3)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = app.screen
            local, by_key = screen.watches

            def probed(n: int) -> bool:
                return all(w.probe is not None and w.probe.ok_count >= n for w in (local, by_key))

            # round trips arrive over time for both rows, each from its own task
            await until(pilot, lambda: probed(3), "three relayed round trips per row")
            assert local.state is RelayState.METRICS_OFF  # the process is alive, metrics off
            assert by_key.state is RelayState.RELAYING  # known only by key: the probe says so
            assert by_key.key == relay.key and local.key == relay.key
            port = int(relay.runtime["port"])
            for w in (local, by_key):
                assert w.probe is not None
                assert w.probe.relay_address == f"127.0.0.1:{port}"  # the echo went through OUR relay
                assert all(0 < rtt < 60_000 for _, rtt in w.probe.rtt)
            polls = list(screen.relay_polls)
            await until(pilot, lambda: all(b > a for a, b in zip(polls, screen.relay_polls, strict=True)), "polls")

            screen.refresh_view()
            text = facts_text(screen)
            assert "ms round trip" in text and f"127.0.0.1:{port}" in text, text
            plot = screen.query_one("#plot-probe", TimePlot)
            assert plot.display and screen.has_class("-probe-only")
            assert not screen.query_one("#plot-memory", TimePlot).display
            assert len(plot.series[0].points) >= 3
            table = screen.query_one(RelayTable)
            assert str(table.get_cell("1", "state")) == "▲ RELAYS"
            assert str(table.get_cell("1", "in")).endswith(" ms")

            relay.kill()  # SIGKILL: no goodbye to any peer
            # the kept connection's echo is lost, then re-probes fail at a named stage
            await until(
                pilot,
                lambda: all(w.probe is not None and w.probe.last_failure is not None for w in (local, by_key)),
                "both rows see the failure",
                timeout=90,
            )
            await until(pilot, lambda: local.state is RelayState.NOT_RUNNING, "pid gone")
            await until(pilot, lambda: by_key.state is RelayState.DOWN, "key-only row DOWN")
            assert by_key.error is not None and by_key.error.startswith("probe failed at ")
            assert by_key.probe is not None and by_key.probe.last_failure is not None
            assert by_key.probe.last_failure.stage in (*STAGES, "echo")
            screen.refresh_view()
            assert "✖ FAILED" in facts_text(screen) or "probe failed at" in facts_text(screen)
            assert str(table.get_cell("1", "state")) == "✖ DOWN"
            # the rows stay alive: polling and probing go on after the failure
            failed = by_key.probe.failed_count
            polls = list(screen.relay_polls)
            await until(pilot, lambda: all(b > a for a, b in zip(polls, screen.relay_polls, strict=True)), "polls")
            assert screen.workers and all(not w.is_finished for w in screen.workers)
            assert by_key.probe.failed_count >= failed
    finally:
        relay.stop()


async def test_monitor_quits_promptly_while_a_probe_hangs(tmp_path: Path) -> None:
    """The only bootstrap node is a socket that never answers: the probe is stuck in its first
    stage (its own timeout is 30 s); `q` must not wait for it."""
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    try:
        boot = [f"127.0.0.1:{silent.getsockname()[1]}"]
        app = MonitorApp([Target(relay_key="b" * 52)], interval=0.5, bootstrap=boot)
        async with app.run_test(size=(80, 24)) as pilot:
            w = app.screen.watches[0]
            await until(pilot, lambda: w.probe is not None and w.probe.started is not None, "probe started")
            assert w.probe is not None
            await until(pilot, lambda: silent.recv(2048, socket.MSG_DONTWAIT) if _ready(silent) else False, "dht ping")
            assert w.probe.last is None  # mid-flight: nothing came back yet
            assert w.state is RelayState.CONNECTING
            t = time.monotonic()
            await pilot.press("q")
        quit_seconds = time.monotonic() - t
        assert app.return_code in (0, None)
        assert quit_seconds < 20, quit_seconds  # generous; the probe alone would hold it 30 s
    finally:
        silent.close()


def _ready(sock: socket.socket) -> bool:
    import select

    return bool(select.select([sock], [], [], 0)[0])
