"""The monitor driven by Pilot and fed by REAL relay processes (`python -m relay`), never stubs.

What an operator sees: the relay's own idle numbers (key, memory against the 200 MB budget, log
tail), a relay that stops answering marked DOWN within two refreshes, the same relay picked up
again when it comes back, several relays in one table, and the keys in the footer working.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import Log, Static

from cosmictui.monitor_app import MonitorApp
from cosmictui.ops.metrics.client import RelayState, Target
from cosmictui.screens.monitor import MonitorScreen
from cosmictui.widgets.monitor_facts import RelayFacts
from cosmictui.widgets.monitor_relays import RelayTable
from tests.e2e._monitor_relay import MonitoredRelay, NodeTestnet, free_port

SAFETY = 60.0


@pytest.fixture(scope="module")
def testnet(node: str) -> Iterator[NodeTestnet]:
    tn = NodeTestnet(node)
    yield tn
    tn.stop()


@pytest.fixture
def relays(tmp_path: Path, testnet: NodeTestnet) -> Iterator[Callable[..., MonitoredRelay]]:
    started: list[MonitoredRelay] = []

    def make(name: str = "store", **kw: Any) -> MonitoredRelay:
        r = MonitoredRelay(tmp_path / name, testnet.bootstrap, **kw)
        started.append(r)
        return r.start()

    yield make
    for r in started:
        r.stop()


async def until(pilot: Pilot[Any], cond: Callable[[], Any], what: str, timeout: float = SAFETY) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout}s for {what}")
        await pilot.pause(0.05)


def facts_text(screen: MonitorScreen) -> str:
    facts = screen.query_one(RelayFacts)
    console = Console(width=facts.size.width or 40, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(facts.content)
    return console.export_text()


def status_text(screen: MonitorScreen) -> str:
    return str(screen.query_one("#status", Static).content)


async def test_monitor_shows_a_real_relays_idle_numbers_at_80x24(relays) -> None:
    relay = relays()
    app = MonitorApp([Target(storage=relay.storage)], interval=0.5)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, MonitorScreen)
        w = screen.watches[0]
        await until(pilot, lambda: w.state is RelayState.UP and w.rates is not None, "two scrapes of the relay")
        text = facts_text(screen)
        assert "▲ UP" in text and "▲ UP" in status_text(screen)
        assert relay.key[:11] in text and relay.key[-10:] in text
        assert w.key == relay.key
        # memory: what /metrics says is the relay's own RSS, shown against the budget
        rss = psutil.Process(relay.proc.pid).memory_info().rss
        assert w.last is not None and w.last.rss_bytes is not None
        assert 0.5 * rss < w.last.rss_bytes < 2 * rss
        assert f"{w.last.rss_bytes / 1e6:.1f} MB of 200 MB" in text
        assert "0 active  0 pending" in text and "0 stream errors" in text
        assert "pid " + str(relay.proc.pid) in text
        # the DHT as the relay itself reports it (it joined the loopback testnet to start at all)
        dht = w.last.stats["dht"]
        assert dht["bootstrapped"] is True and "bootstrapped ✓" in text
        assert ("firewalled ✗" in text) if dht["firewalled"] else ("open ✓" in text)
        if dht["public_host"]:
            assert f"{dht['public_host']}:{dht['public_port']}" in text
        # idle: nothing relayed, and the rates say so
        assert w.rates["relayed_bytes"] == 0.0
        # the log tail is the relay's own log file
        log = screen.query_one("#log", Log)
        await until(pilot, lambda: any(f"Server listening on {relay.key}" in ln for ln in log.lines), "log tail")
        assert str(relay.log) in str(log.border_subtitle)
        # footer bindings are there
        bindings = {b.key for b in screen.BINDINGS if hasattr(b, "key")}
        assert {"plus,equals_sign", "minus,underscore", "p", "r", "t", "l", "q"} <= bindings


async def test_monitor_marks_a_killed_relay_down_within_two_refreshes_and_reattaches(relays) -> None:
    port = free_port()
    relay = relays(metrics=f"127.0.0.1:{port}")
    app = MonitorApp([Target(metrics=relay.metrics_url)], interval=0.5)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        w = screen.watches[0]
        await until(pilot, lambda: w.state is RelayState.UP, "relay up")
        relay.kill(signal.SIGKILL)
        polls_at_kill = screen.polls
        await until(pilot, lambda: "✖ DOWN" in status_text(screen), "relay shown down")
        assert screen.polls - polls_at_kill <= 2
        assert w.state is RelayState.DOWN and "✖ DOWN" in facts_text(screen)
        assert screen.query_one("#status").has_class("-down")
        # the same storage and metrics address come back: reattached, same key, new process
        old_pid = relay.proc.pid
        relay.start()
        await until(pilot, lambda: "▲ UP" in status_text(screen), "relay reattached")
        assert w.last is not None and w.last.stat("pid") == relay.proc.pid != old_pid
        assert w.key == relay.key


async def test_monitor_marks_a_frozen_relay_down_and_picks_it_up_when_it_thaws(relays) -> None:
    relay = relays()
    app = MonitorApp([Target(storage=relay.storage)], interval=0.5)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        w = screen.watches[0]
        await until(pilot, lambda: w.state is RelayState.UP, "relay up")
        os.kill(relay.proc.pid, signal.SIGSTOP)  # alive but not answering: only a timeout can tell
        try:
            polls_at_stop = screen.polls
            await until(pilot, lambda: "✖ DOWN" in status_text(screen), "frozen relay shown down")
            assert screen.polls - polls_at_stop <= 2
            assert w.state is RelayState.DOWN and "timed out after" in (w.error or "")
        finally:
            os.kill(relay.proc.pid, signal.SIGCONT)
        await until(pilot, lambda: w.state is RelayState.UP, "thawed relay back")
        assert w.last is not None and w.last.stat("pid") == relay.proc.pid


async def test_monitor_by_storage_follows_a_restart_on_a_new_metrics_port(relays) -> None:
    relay = relays()
    app = MonitorApp([Target(storage=relay.storage)], interval=0.5)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        w = screen.watches[0]
        await until(pilot, lambda: w.state is RelayState.UP, "relay up")
        first_url = w.url
        relay.kill(signal.SIGTERM)  # clean exit removes the runtime file
        polls_at_stop = screen.polls
        await until(pilot, lambda: "NOT RUNNING" in status_text(screen), "relay shown not running")
        assert screen.polls - polls_at_stop <= 2
        assert w.state is RelayState.NOT_RUNNING
        relay.start()  # metrics on a fresh port 0: found again through the runtime file
        await until(pilot, lambda: w.state is RelayState.UP, "relay back")
        assert w.url == relay.metrics_url != first_url
        assert w.key == relay.key


async def test_monitor_with_several_relays_has_one_row_each_and_a_summary(relays) -> None:
    a, b = relays("a"), relays("b")
    dead = f"127.0.0.1:{free_port()}"
    targets = [Target(metrics=a.metrics_url), Target(storage=b.storage), Target(metrics=dead)]
    app = MonitorApp(targets, interval=0.5)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        table = screen.query_one(RelayTable)
        states = lambda: [w.state for w in screen.watches]  # noqa: E731
        await until(pilot, lambda: states() == [RelayState.UP, RelayState.UP, RelayState.DOWN], "states settle")
        await pilot.pause()
        assert table.display and table.row_count == 3
        rows = [[str(c) for c in table.get_row_at(i)] for i in range(3)]
        assert rows[0][0] == "▲ UP" and rows[1][0] == "▲ UP" and rows[2][0] == "✖ DOWN"
        assert rows[0][2].startswith(a.key[:5]) and rows[1][2].startswith(b.key[:5])
        summary = str(screen.query_one("#summary", Static).content)
        assert summary.startswith("2 of 3 relays up, 1 NOT answering")
        # moving the cursor selects which relay the details show
        table.focus()
        await pilot.press("down")
        await until(pilot, lambda: screen.selected == 1, "second relay selected")
        await until(pilot, lambda: b.key[:11] in facts_text(screen), "details of relay b")


async def test_monitor_keys_interval_pause_theme_log(relays) -> None:
    relay = relays()
    app = MonitorApp([Target(storage=relay.storage)], interval=1.0)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await until(pilot, lambda: screen.polls >= 1, "first poll")
        await pilot.press("minus")
        assert screen.interval == 0.5 and "refresh 0.5s" in status_text(screen)
        await pilot.press("plus")
        await pilot.press("plus")
        assert screen.interval == 2.0
        await pilot.press("minus", "minus", "minus")
        assert screen.interval == 0.25
        await pilot.press("p")
        assert screen.paused and "PAUSED" in status_text(screen)
        frozen = screen.polls
        await asyncio.sleep(0.6)  # > 2 intervals: a paused monitor does not scrape
        assert screen.polls == frozen
        await pilot.press("p")
        await until(pilot, lambda: screen.polls > frozen, "polling resumes")
        dark = app.current_theme.dark
        await pilot.press("t")
        assert app.current_theme.dark is not dark
        log = screen.query_one("#log", Log)
        await pilot.press("l")
        assert not log.display
        await pilot.press("l")
        assert log.display
        await pilot.press("q")
    assert app.return_code == 0


async def test_refresh_slows_when_nothing_changes_and_snaps_back() -> None:
    from cosmictui.screens.monitor import effective_interval

    assert effective_interval(1.0, 0) == 1.0
    assert effective_interval(1.0, 5) == 2.0
    assert effective_interval(1.0, 10) == 4.0
    assert effective_interval(1.0, 100) == 4.0
    assert effective_interval(2.0, 100) == 5.0  # never slower than 5 s when idle
    assert effective_interval(10.0, 100) == 10.0  # but an operator's slow choice stands


async def test_monitor_opened_from_the_wizard_watches_its_relay_and_escape_goes_back(
    relays, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cosmictui.app import WizardApp
    from cosmictui.ops.config import Settings
    from cosmictui.ops.session import WizardContext
    from cosmictui.screens.wizard import WizardScreen

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # the wizard saves progress there
    relay = relays()
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    settings = Settings(
        deployment=str(deploy),
        relay_storage=str(relay.storage),
        relay_host="127.0.0.1",  # the wizard's own checks stay on loopback too
        relay_port=int(relay.runtime["port"]),
    )
    app = WizardApp(WizardContext(settings))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, WizardScreen), "the wizard")
        await pilot.press("m")
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "the monitor")
        screen = app.screen
        w = screen.watches[0]
        await until(pilot, lambda: w.state is RelayState.UP, "the wizard's relay up in the monitor")
        assert w.target.storage == relay.storage and w.key == relay.key
        assert screen.check_action("close", ()) is True  # Back is offered inside the wizard
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, WizardScreen), "back in the wizard")
        # the monitor stopped polling with it: nothing scrapes the relay any more
        polls = screen.polls
        await pilot.pause(1.5)  # longer than its 1 s refresh
        assert screen.polls == polls and not screen.is_attached
