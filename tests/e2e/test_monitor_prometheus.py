"""The monitor pointed at a Prometheus server (`cosmictui monitor --prometheus URL`), via Pilot.

A real Prometheus (Debian's `prometheus`, installed by .ci/run) on a loopback port scrapes two
real relays (`python -m relay` on the npm testnet) every second: the monitor's table shows both,
with their memory and traffic as Prometheus has them, and a relay that dies is DOWN once
Prometheus says so. A hostile "Prometheus" (HTML, a drip, 50 MB, silence) is one error line
naming the fix, never a hang or a crash: keys keep working and `q` quits at once.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from cosmictui.monitor_app import MonitorApp
from cosmictui.ops.metrics.client import RelayState, Target
from cosmictui.screens.monitor import MonitorScreen
from cosmictui.widgets.monitor_relays import RelayTable
from tests.e2e._monitor_relay import MonitoredRelay, NodeTestnet
from tests.interop.test_interop_prometheus import Prometheus
from tests.unit._hostile_http import HostileHTTP, answer, big, drip, silent
from tests.unit._metrics_server import FakeRelayMetrics

SAFETY = 60.0


async def until(pilot: Pilot[Any], cond: Callable[[], Any], what: str, timeout: float = SAFETY) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout}s for {what}")
        await pilot.pause(0.05)


def rows(screen: MonitorScreen) -> list[dict[str, str]]:
    table = screen.query_one(RelayTable)
    keys = [str(c.key.value) for c in table.ordered_columns]
    return [dict(zip(keys, map(str, table.get_row_at(i)), strict=True)) for i in range(table.row_count)]


def prom_line(screen: MonitorScreen) -> str:
    return str(screen.query_one("#prometheus", Static).content)


@pytest.fixture(scope="module")
def testnet(node: str) -> Iterator[NodeTestnet]:
    tn = NodeTestnet(node)
    yield tn
    tn.stop()


@pytest.fixture
def prometheus_exe() -> str:
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.fail("prometheus is not installed: `apt-get install prometheus` (.ci/run installs it)")
    return exe


async def test_monitor_shows_every_relay_a_real_prometheus_scrapes(
    testnet: NodeTestnet, prometheus_exe: str, tmp_path: Path
) -> None:
    relays = [MonitoredRelay(tmp_path / f"relay{i}", testnet.bootstrap) for i in (1, 2)]
    prom: Prometheus | None = None
    try:
        for r in relays:
            r.start()
        instances = [r.metrics_url.removeprefix("http://") for r in relays]
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: blind-relay\n    static_configs: [{{targets: [{', '.join(instances)}]}}]\n"
        )
        prom = Prometheus(prometheus_exe, config, tmp_path / "tsdb")
        app = MonitorApp([], interval=0.25, prometheus=f"127.0.0.1:{prom.port}", scrape_timeout=5.0)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = app.screen
            assert isinstance(screen, MonitorScreen)
            # every relay the server scrapes, each with its memory and its traffic from rate()
            await until(
                pilot,
                lambda: (
                    sorted((r["relay"], r["state"]) for r in rows(screen)) == [(i, "▲ UP") for i in sorted(instances)]
                    and all(r["memory"].endswith(" MB") and r["in"].endswith("/s") for r in rows(screen))
                ),
                "both relays UP with memory and traffic",
            )
            assert "2 relay targets, 0 not up" in prom_line(screen)
            by_instance = {w.target.instance: w for w in screen.watches}
            for r in relays:
                w = by_instance[r.metrics_url.removeprefix("http://")]
                assert w.key == r.key  # the relay's own key, from blind_relay_info as Prometheus holds it
                rss = prom.query(f'process_resident_memory_bytes{{instance="{w.target.instance}"}}')
                assert w.last is not None and w.last.rss_bytes is not None
                assert abs(w.last.rss_bytes - float(rss[0]["value"][1])) < float(rss[0]["value"][1]) / 2
                assert w.rates is not None and "received_bytes" in w.rates.per_second  # rate() of the UDP bytes
            # the selected relay's panel and graphs are fed the same way
            assert screen.watches[screen.selected].history["rss_mb"]
            await pilot.press("down")
            await until(pilot, lambda: screen.selected == 1, "the second row selected")
            # a relay that dies: DOWN once Prometheus's scrape of it fails, the other stays UP
            dead = relays[0].metrics_url.removeprefix("http://")
            relays[0].kill()
            await until(
                pilot,
                lambda: {r["relay"]: r["state"] for r in rows(screen)}.get(dead) == "✖ DOWN",
                "the killed relay DOWN",
            )
            assert by_instance[dead].error is not None and "up == 0" in by_instance[dead].error
            assert {r["relay"]: r["state"] for r in rows(screen)}[instances[1]] == "▲ UP"
            assert "2 relay targets, 1 not up" in prom_line(screen)
            # 60x20: the Prometheus line and both rows still in view
            await pilot.resize_terminal(60, 20)
            await pilot.pause(0.2)
            assert screen.query_one("#prometheus").region.height >= 1
            assert screen.query_one(RelayTable).region.height >= 3
            await pilot.press("q")
        assert app.return_code == 0
    finally:
        if prom is not None:
            prom.stop()
        for r in relays:
            r.stop()


class _AnyQuery(dict[str, Any]):
    """Routes every /api/v1/query?… to one behaviour (HostileHTTP routes by exact path)."""

    def __init__(self, behaviour: Any) -> None:
        super().__init__()
        self.behaviour = behaviour

    def get(self, path: str, default: Any = None) -> Any:
        return self.behaviour if path.startswith("/api/v1/query?") else default


@pytest.fixture
def hostile_prometheus() -> Iterator[Callable[[Any], HostileHTTP]]:
    servers: list[HostileHTTP] = []

    def make(behaviour: Any) -> HostileHTTP:
        s = HostileHTTP()
        s.routes = _AnyQuery(behaviour)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


@pytest.mark.parametrize(
    ("behaviour", "words"),
    [
        (answer("<html>please log in</html>", "text/html"), "did not answer with the Prometheus API's JSON"),
        (big(), "answered more than 8 MiB"),
        (drip(), "no answer within 1 s"),
        (silent(), "no answer within 1 s"),
    ],
    ids=["html", "50MB", "drip", "silent"],
)
async def test_a_hostile_prometheus_is_one_error_line_with_its_fix(
    hostile_prometheus: Callable[[Any], HostileHTTP], behaviour: Any, words: str
) -> None:
    server = hostile_prometheus(behaviour)
    app = MonitorApp([], interval=0.25, prometheus=server.url, scrape_timeout=1.0)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, MonitorScreen)
        await until(pilot, lambda: words in prom_line(screen), f"the error line saying {words!r}")
        line = prom_line(screen)
        assert (
            line.startswith("✖ Prometheus")
            and f"— next: check that Prometheus answers: curl {server.url}/-/ready" in line
        )
        assert ("--timeout S" if "no answer" in words else "--prometheus URL") in line and "\n" not in line
        assert screen.query_one("#prometheus").has_class("-error") and screen.watches == []
        polls = screen.prometheus.polls if screen.prometheus else 0
        await until(pilot, lambda: screen.prometheus is not None and screen.prometheus.polls > polls, "another read")
        await pilot.press("q")
    assert app.return_code == 0


async def test_a_prometheus_that_drips_holds_up_nothing_and_q_quits_at_once(
    hostile_prometheus: Callable[[Any], HostileHTTP],
) -> None:
    server = hostile_prometheus(drip())
    good = FakeRelayMetrics()
    try:
        # a deadline far longer than the test: the read stays open until something cancels it
        app = MonitorApp([Target(metrics=good.url)], interval=0.25, prometheus=server.url, scrape_timeout=600)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = app.screen
            assert isinstance(screen, MonitorScreen)
            await until(pilot, lambda: server.asked.is_set(), "Prometheus being asked")
            for pairs in (1, 2, 3):
                good.gauges["blind_relay_pairings_active"].set(pairs)
                await until(pilot, lambda p=pairs: rows(screen)[0]["pairs"] == str(p), f"{pairs} pairs")
                assert prom_line(screen).startswith("… Prometheus")  # ... while its read is in flight
            await pilot.press("p")  # keys still work
            await until(pilot, lambda: screen.paused, "paused")
            assert screen.watches[0].state is RelayState.UP
            await pilot.press("q")
        assert app.return_code == 0
        assert server.gone.wait(SAFETY), "quitting left the Prometheus read's connection open"
    finally:
        good.close()
