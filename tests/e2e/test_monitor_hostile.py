"""The monitor (Textual Pilot, and once as a real process on a pty) against hostile endpoints.

It stays alive, a hung relay never holds up another relay's row, numbers no relay has are
"bad data: <field>", and `q` ends it while a scrape is still in flight. No assertion depends on
speed: a row "keeps updating" means it shows values the test sets one after another while the
other relay's scrape is still open, and "exits promptly" means the process exits at all within
a generous bound although its scrape would otherwise be held for ten minutes.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import pty
import random
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from rich.console import Console
from textual.app import App
from textual.pilot import Pilot

from cosmictui.monitor_app import MonitorApp
from cosmictui.ops.metrics.client import METRICS_RANGES, STATS_SCHEMA, BadData, RelayState, Scrape, Target, check_scrape
from cosmictui.screens.monitor import MonitorScreen
from cosmictui.widgets.monitor_facts import RelayFacts
from cosmictui.widgets.monitor_relays import RelayTable
from tests.unit._hostile_http import (
    GOOD_METRICS,
    THREAD_PREFIX,
    answer,
    big,
    drip,
    good_stats,
    json_answer,
    metrics_text,
)
from tests.unit._metrics_server import FakeRelayMetrics

SAFETY = 60.0


@pytest.fixture
def good() -> Iterator[FakeRelayMetrics]:
    f = FakeRelayMetrics()
    yield f
    f.close()


async def until(pilot: Pilot[Any], cond: Callable[[], Any], what: str, timeout: float = SAFETY) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout}s for {what}")
        await pilot.pause(0.05)


def facts_text(screen: MonitorScreen) -> str:
    facts = screen.query_one(RelayFacts)
    console = Console(width=facts.size.width or 40, record=True, color_system=None, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(facts.content)
    return console.export_text()


def row(screen: MonitorScreen, i: int) -> dict[str, str]:
    table = screen.query_one(RelayTable)
    return {str(c.key.value): str(v) for c, v in zip(table.ordered_columns, table.get_row_at(i), strict=True)}


def app_threads(before: set[threading.Thread]) -> list[str]:
    """Threads alive now that were not before and are not the test servers' own."""
    return [
        t.name
        for t in threading.enumerate()
        if t not in before and not t.name.startswith(THREAD_PREFIX) and "process_request_thread" not in t.name
    ]


async def test_a_hung_relay_never_holds_up_the_other_row_and_q_cancels_its_scrape(hostile, good) -> None:
    stuck = hostile(metrics=drip())
    before = set(threading.enumerate())
    # a deadline far longer than the test: the drip's scrape stays open until something cancels it
    app = MonitorApp([Target(metrics=stuck.url), Target(metrics=good.url)], interval=0.25, scrape_timeout=600)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, MonitorScreen)
        await until(pilot, lambda: stuck.asked.is_set(), "the stuck relay being asked")
        for pairs in (1, 2, 3):
            good.gauges["blind_relay_pairings_active"].set(pairs)
            await until(pilot, lambda p=pairs: row(screen, 1)["pairs"] == str(p), f"good row showing {pairs} pairs")
            # ... while the stuck relay's first scrape is still in flight
            assert screen.watches[0].state is RelayState.CONNECTING and screen.relay_polls[0] == 0
        assert row(screen, 1)["state"] == "▲ UP" and screen.relay_polls[1] >= 3
        await pilot.press("q")
    assert app.return_code == 0
    assert stuck.gone.wait(SAFETY), "quitting left the stuck scrape's connection open"
    assert app_threads(before) == []  # no worker thread was left (or waited on) for a scrape


async def test_absurd_numbers_are_bad_data_for_that_relay_only(hostile, good) -> None:
    bad = hostile(stats=json_answer(good_stats(uptime_seconds=1e300)))
    app = MonitorApp([Target(metrics=bad.url), Target(metrics=good.url)], interval=0.25)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, MonitorScreen)
        await until(pilot, lambda: screen.watches[0].state is RelayState.BAD_DATA, "bad data")
        await until(pilot, lambda: row(screen, 0)["state"] == "✖ BAD", "bad row")
        text = " ".join(facts_text(screen).split())
        assert "✖ BAD DATA" in text and "bad data: uptime_seconds (1e+300 is out of range)" in text
        assert "next" in text
        for pairs in (4, 5):
            good.gauges["blind_relay_pairings_active"].set(pairs)
            await until(pilot, lambda p=pairs: row(screen, 1)["pairs"] == str(p), f"good row showing {pairs} pairs")
        # the bad relay recovers: its numbers are shown again
        bad.routes["/stats"] = json_answer(good_stats())
        await until(pilot, lambda: screen.watches[0].state is RelayState.UP, "bad relay fixed")
        await until(pilot, lambda: row(screen, 0)["state"] == "▲ UP", "row up again")
        await pilot.press("q")
    assert app.return_code == 0


HOSTILE = {
    "drip": ({"metrics": drip()}, RelayState.DOWN, "timed out after 1 s waiting for {addr}/metrics"),
    "50MB": ({"metrics": big()}, RelayState.DOWN, "answered more than 4.2 MB"),
    "not-prometheus": ({"metrics": answer("this { is not prometheus")}, RelayState.DOWN, "not Prometheus text"),
    "NaN": ({"stats": json_answer(good_stats(uptime_seconds=math.nan))}, RelayState.BAD_DATA, "bad data: uptime"),
    "-1e300": (
        {"metrics": answer(GOOD_METRICS + metrics_text(process_resident_memory_bytes="-1e300"))},
        RelayState.BAD_DATA,
        "bad data: process_resident_memory_bytes",
    ),
    "wrong-types": ({"stats": json_answer(good_stats(dht=[1]))}, RelayState.BAD_DATA, "bad data: dht ("),
}


@pytest.mark.parametrize("case", list(HOSTILE))
async def test_the_monitor_stays_alive_against_each_hostile_endpoint(hostile, case: str) -> None:
    routes, state, words = HOSTILE[case]
    srv = hostile(**routes)
    app = MonitorApp([Target(metrics=srv.url)], interval=0.5, scrape_timeout=1.0)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, MonitorScreen)
        await until(pilot, lambda: screen.watches[0].state is state, str(state))
        expected = "".join(words.format(addr=f"127.0.0.1:{srv.port}").split())
        # compared without spaces: a long field name is wrapped across lines in a narrow pane
        await until(pilot, lambda: expected in "".join(facts_text(screen).split()), expected)
        polls = screen.polls
        await until(pilot, lambda: screen.polls >= polls + 2, "two more polls")  # still polling, still alive
        await pilot.press("q")
    assert app.return_code == 0


async def test_the_monitor_shows_dropped_shed_and_not_joined(hostile) -> None:
    stats = good_stats(
        dropped={"garbage": 12, "unknown_stream": 3, "firewalled": 0},
        shed={"idle_session": 2, "heaviest_address": 7},
        dht__bootstrapped=False,
    )
    srv = hostile(stats=json_answer(stats))
    app = MonitorApp([Target(metrics=srv.url)], interval=0.5)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, MonitorScreen)
        await until(pilot, lambda: screen.watches[0].state is RelayState.UP, "up")
        await until(pilot, lambda: "dropped" in facts_text(screen), "dropped row")
        text = facts_text(screen)
        assert "garbage 12, unknown_stream 3" in text
        assert "heaviest_address 7, idle_session 2" in text
        assert "not joined to the DHT yet" in text and "retrying" in text
        await pilot.press("q")
    assert app.return_code == 0


def test_q_ends_the_real_process_while_a_scrape_is_held_open(hostile) -> None:
    """`cosmictui monitor` on a pty, its only relay dripping with a 600 s deadline: `q` must
    end the process although the scrape is in flight (it used to wait for the scrape thread)."""
    stuck = hostile(metrics=drip())
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = os.environ | {"TERM": "xterm-256color", "COLUMNS": "80", "LINES": "24"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cosmictui", "monitor", "--metrics", stuck.url, "--timeout", "600"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    screen = bytearray()

    def drain() -> None:  # a full pty would block the app's writes
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            screen.extend(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        assert stuck.asked.wait(SAFETY * 2), "the monitor never scraped"
        deadline = time.monotonic() + SAFETY
        while proc.poll() is None and time.monotonic() < deadline:
            os.write(master, b"q")  # again now and then, in case the first came before raw mode
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
        assert proc.returncode == 0, f"still running or failed: {proc.returncode}; screen: {bytes(screen[-400:])!r}"
        assert stuck.requests["/metrics"] >= 1 and stuck.gone.wait(SAFETY)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        os.close(master)
        reader.join(10)


class _StillApp(App[None]):
    """The monitor screen without polling, fed scrapes by the test."""

    def __init__(self, targets: list[Target]) -> None:
        super().__init__()
        self.targets = targets

    def on_mount(self) -> None:
        self.push_screen(MonitorScreen(self.targets, autopoll=False))


EDGES: list[Any] = [0, 1, 0.5, 65535, 2**31, 1e10, 1e11, 1e18, 10**18, -1, 1e300, math.nan, "x", "", None, True, False]
COUNT_EDGES: list[Any] = [0, 1, 0.5, 10**18, 1e18, 123456789]


def _valid_pick(rng: random.Random, path: str) -> tuple[bool, Any]:
    """A random value the check accepts for `path` (edges first), or (False, None)."""
    check = STATS_SCHEMA[path]
    counts = {
        rng.choice(["garbage", "opened", "closed", "active", "x" * 60]): rng.choice(COUNT_EDGES) for _ in range(3)
    }
    for v in rng.sample([*EDGES, counts, {}], k=len(EDGES) + 2):
        if check(v) is None:
            return True, v
    return False, None


def _random_scrape(rng: random.Random, at: float) -> Scrape:
    values = {}
    for name, (lo, hi) in METRICS_RANGES.items():
        values[name] = rng.choice([lo, hi, (lo + hi) / 2, min(hi, 1e10), min(hi, 3.5)])
    stats: dict[str, Any] = {}
    for path in STATS_SCHEMA:
        if rng.random() < 0.15:
            continue  # absent: the monitor must cope with a field it does not get
        *parents, leaf = path.split(".")
        node = stats
        for p in parents:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        ok, v = _valid_pick(rng, path)
        if ok and not (isinstance(node.get(leaf), dict) and not isinstance(v, dict)):
            node[leaf] = v
    return Scrape(at=at, wall=time.time(), values=values, stats=stats)


async def test_every_scrape_that_passes_the_check_draws_without_raising() -> None:
    """The check is the monitor's only guard: whatever it lets through (edge values of every
    field, many combinations) must format, add up and plot."""
    rng = random.Random(14)
    app = _StillApp([Target(metrics="127.0.0.1:9"), Target(metrics="127.0.0.1:10")])
    drawn = 0
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, MonitorScreen)
        for case in range(120):
            first, second = _random_scrape(rng, case * 10.0), _random_scrape(rng, case * 10.0 + 1)
            try:
                check_scrape(first.values, first.stats)
                check_scrape(second.values, second.stats)
            except BadData:
                continue
            for w in screen.watches:
                w.observe(first)
                w.observe(second)
            screen.refresh_view()
            drawn += 1
            if drawn % 20 == 0:
                await pilot.pause()
        await pilot.pause()
    assert drawn >= 100, f"only {drawn} random scrapes passed the check: the test would prove little"
