"""What the monitor's widgets say for one relay, drawn without an app (fast, no Pilot)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from cosmictui import cli
from cosmictui.cli.monitor import monitor_targets
from cosmictui.ops.metrics import client as m
from cosmictui.widgets.monitor_facts import RelayFacts
from cosmictui.widgets.monitor_graphs import MARKERS
from cosmictui.widgets.monitor_relays import TABLE_BADGE, RelayTable


def facts_text(w: m.RelayWatch, now: float) -> str:
    f = RelayFacts()
    f._style = lambda style: ""  # type: ignore[method-assign]  # theme colours need a running app
    return f.render_facts(w, 24, True, now).to_text().plain


def row_of(w: m.RelayWatch, compact: bool) -> dict[str, str]:
    t = RelayTable()
    t.compact = compact
    return {k: str(v) for k, v in t._row(w, 0.0).items()}


def test_stale_relay_shows_its_storage_under_storage_not_metrics(tmp_path: Path) -> None:
    w = m.RelayWatch(m.Target(storage=tmp_path))
    w.observe_failure("pid 5 is gone (stale relay-runtime.json)", 10.0, m.RelayState.NOT_RUNNING)
    lines = facts_text(w, 20.0).splitlines()
    assert any(line.startswith("storage") and str(tmp_path) in line for line in lines)
    assert not any(line.startswith("metrics") for line in lines)


def test_metrics_off_relay_reads_running_with_a_note() -> None:
    w = m.RelayWatch(m.Target(storage=Path("/srv/relay")))
    w.observe_failure(m.METRICS_OFF_NOTE, 10.0, m.RelayState.METRICS_OFF)
    text = facts_text(w, 20.0)
    assert "▲ RUNNING" in text and "NOT RUNNING" not in text
    flat = " ".join(text.split())  # the note is wrapped to the pane
    assert "note metrics off — start the relay with --metrics HOST:PORT to see numbers" in flat
    assert TABLE_BADGE[m.RelayState.METRICS_OFF] == "▲ RUNNING"
    assert str(row_of(w, compact=True)["state"]) == "▲ RUNNING"


def test_up_since_is_the_relay_start_time() -> None:
    import time

    w = m.RelayWatch(m.Target(metrics="127.0.0.1:9"))
    started = time.mktime((2027, 1, 15, 5, 0, 0, 0, 0, -1))
    w.observe(m.Scrape(at=1.0, wall=started + 3 * 3600, values={}, stats={"uptime_seconds": 3 * 3600}))
    assert "since 05:00:00" in facts_text(w, started + 3 * 3600)


@pytest.mark.parametrize("compact", [True, False])
def test_relay_column_drops_the_scheme(compact: bool) -> None:
    w = m.RelayWatch(m.Target(metrics="http://127.0.0.1:9"))
    assert row_of(w, compact)["relay"] == "127.0.0.1:9"


def test_the_same_relay_spelled_two_ways_is_watched_once(tmp_path: Path) -> None:
    args = argparse.Namespace(
        storage=[str(tmp_path), str(tmp_path / "." / "")],
        metrics=["127.0.0.1:9", "http://127.0.0.1:9/metrics", "http://127.0.0.1:9/", "127.0.0.1:10"],
    )
    targets = monitor_targets(args, settings=None)
    assert [t.identity for t in targets] == [
        ("storage", str(tmp_path)),
        ("metrics", "http://127.0.0.1:9"),
        ("metrics", "http://127.0.0.1:10"),
    ]


def test_in_and_out_lines_have_distinct_legend_markers() -> None:
    assert MARKERS.get("in", "braille") != MARKERS.get("out", "braille")
    assert len({MARKERS.get(r, "braille") for r in ("in", "out", "relayed")}) == 3


def test_monitor_that_crashes_exits_1_not_0(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from cosmictui.monitor_app import MonitorApp
    from cosmictui.screens.monitor import MonitorScreen

    def broken_draw(self: MonitorScreen, force_plots: bool = True) -> None:
        raise RuntimeError("boom")  # a bug in drawing (a bug in one relay's poll is only that relay's row)

    run = MonitorApp.run
    monkeypatch.setattr(MonitorScreen, "refresh_view", broken_draw)
    monkeypatch.setattr(MonitorApp, "run", lambda self: run(self, headless=True, size=(80, 24)))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert cli.main(["monitor", "--metrics", "127.0.0.1:9"]) == 1


async def test_a_bug_in_one_relays_poll_costs_that_row_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from cosmictui.monitor_app import MonitorApp
    from tests.unit._metrics_server import FakeRelayMetrics

    good = FakeRelayMetrics()
    real_poll = m.RelayWatch.poll

    async def poll(self: m.RelayWatch, timeout: float = 2.0) -> bool:
        if self.target.metrics == "127.0.0.1:9":
            raise RuntimeError("boom")
        return await real_poll(self, timeout)

    monkeypatch.setattr(m.RelayWatch, "poll", poll)
    try:
        app = MonitorApp([m.Target(metrics="127.0.0.1:9"), m.Target(metrics=good.url)], interval=0.25)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = app.screen
            for _ in range(1200):
                if screen.watches[1].state is m.RelayState.UP and screen.watches[0].error:
                    break
                await pilot.pause(0.05)
            assert screen.watches[0].state is m.RelayState.DOWN
            assert screen.watches[0].error == "monitor error: RuntimeError('boom')"
            assert screen.watches[1].state is m.RelayState.UP
            await pilot.press("q")
        assert app.return_code == 0
    finally:
        good.close()


def test_the_path_carrying_the_traffic_is_shown_kernel_and_python_share_or_why_python() -> None:
    def shown(stats: dict[str, object]) -> list[str]:
        w = m.RelayWatch(m.Target(metrics="127.0.0.1:9"))
        w.observe(m.Scrape(at=1.0, wall=1000.0, values={}, stats=stats))
        lines = facts_text(w, 1000.0).splitlines()
        at = next((i for i, line in enumerate(lines) if line.startswith("path")), None)
        if at is None:
            return []
        rows = [lines[at], *(x for x in lines[at + 1 : at + 2] if x.startswith(" "))]  # wrapped: one more row
        return [" ".join(" ".join(rows).split())]

    on = {"kernel": {"enabled": True, "directions": 6}, "traffic": {"relayed_bytes": 1000, "kernel_bytes": 990}}
    assert shown(on) == ["path kernel 99% · Python 1% of relayed bytes · 6 ways now"]
    off = {"kernel": {"enabled": False, "reason": "nftables refused the relay's table: Operation not permitted"}}
    assert shown(off)[0].startswith("path Python (kernel forwarding off: nftables refused")
    # not asked for: Python carries it all, said plainly
    assert shown({"kernel": {"enabled": False, "reason": "not asked (--kernel-forwarding)"}}) == [
        "path Python only (started without --kernel-forwarding)"
    ]
    # a hostile/odd /stats: nothing wrong shown, and no crash
    assert shown({"kernel": {"enabled": True}, "traffic": {"relayed_bytes": "x"}}) == [
        "path kernel forwarding on, nothing relayed yet"
    ]
    assert shown({"kernel": {"enabled": True}, "traffic": {"relayed_bytes": float("nan"), "kernel_bytes": 1}}) == [
        "path kernel forwarding on, nothing relayed yet"
    ]
    assert shown({"kernel": "yes"}) == [] and shown({}) == []


@pytest.mark.parametrize("compact", [True, False])
async def test_the_first_rows_shown_hold_the_relays_values_not_the_column_names(compact: bool) -> None:
    from textual.app import App, ComposeResult

    class Host(App[None]):
        def compose(self) -> ComposeResult:
            yield RelayTable()

    w = m.RelayWatch(m.Target(metrics="127.0.0.1:9"))
    async with Host().run_test() as pilot:
        table = pilot.app.query_one(RelayTable)
        table.show([w], 0.0, compact=compact)
        await pilot.pause()
        assert [str(c) for c in table.get_row_at(0)] == [str(v) for v in table._row(w, 0.0).values()]
