"""Layout snapshots of the monitor at 80×24 (tmux's default pane) in dark and light themes,
with a relay down, and with several relays. Data is a fixed story (`_monitor_data`), so the
SVGs only change when the layout does. Update with `pytest --snapshot-update`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.app import App

from cosmictui.ops.metrics.client import LogTail, RelayWatch
from cosmictui.screens.monitor import MonitorScreen
from tests.e2e._monitor_data import (
    END,
    NEW_STATS,
    bad_data_watch,
    busy_watch,
    down_watch,
    timed_out_watch,
    write_log,
)


@pytest.fixture(autouse=True)
def fixed_place_and_zone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    write_log(Path("relay-a"))
    write_log(Path("relay-b"))
    yield
    monkeypatch.undo()
    time.tzset()


class SnapshotApp(App[None]):
    ENABLE_COMMAND_PALETTE = False

    def __init__(self, watches: list[RelayWatch], theme: str = "textual-dark") -> None:
        super().__init__()
        self.watches = watches
        self.theme = theme

    def on_mount(self) -> None:
        screen = MonitorScreen([w.target for w in self.watches], standalone=True, autopoll=False, clock=lambda: END)
        screen.watches = self.watches
        screen.tails = [LogTail(w.target.log_path()) for w in self.watches]
        screen.polls, screen.last_poll = 121, END
        self.push_screen(screen)


async def _draw(pilot) -> None:
    pilot.app.screen.refresh_view()
    await pilot.pause()


def test_monitor_snapshot_80x24_dark(snap_compare) -> None:
    app = SnapshotApp([busy_watch(Path("relay-a"))])
    assert snap_compare(app, terminal_size=(80, 24), run_before=_draw)


def test_monitor_snapshot_80x24_light(snap_compare) -> None:
    app = SnapshotApp([busy_watch(Path("relay-a"))], theme="textual-light")
    assert snap_compare(app, terminal_size=(80, 24), run_before=_draw)


def test_monitor_snapshot_80x24_relay_down(snap_compare) -> None:
    app = SnapshotApp([down_watch(Path("relay-a"))])
    assert snap_compare(app, terminal_size=(80, 24), run_before=_draw)


def test_monitor_snapshot_80x24_three_relays(snap_compare) -> None:
    b = busy_watch(Path("relay-b"), pid=5120, key="x" * 52, rss=61e6, load=0.4)
    app = SnapshotApp([busy_watch(Path("relay-a")), b, timed_out_watch("10.0.0.9:49738")])
    assert snap_compare(app, terminal_size=(80, 24), run_before=_draw)


def test_monitor_snapshot_80x24_dropped_shed_and_a_relay_with_bad_data(snap_compare) -> None:
    app = SnapshotApp([busy_watch(Path("relay-a"), extra=NEW_STATS), bad_data_watch("10.0.0.9:49738")])
    assert snap_compare(app, terminal_size=(80, 24), run_before=_draw)


def test_monitor_snapshot_80x24_bad_data_selected(snap_compare) -> None:
    app = SnapshotApp([bad_data_watch("10.0.0.9:49738"), busy_watch(Path("relay-a"), extra=NEW_STATS)])
    assert snap_compare(app, terminal_size=(80, 24), run_before=_draw)


def test_monitor_snapshot_120x40_not_joined_to_the_dht(snap_compare) -> None:
    extra = NEW_STATS | {"dht": {"bootstrapped": False, "public_host": None, "public_port": None, "nodes": 0}}
    app = SnapshotApp([busy_watch(Path("relay-a"), extra=extra)])
    assert snap_compare(app, terminal_size=(120, 40), run_before=_draw)


def test_monitor_snapshot_200x50_uses_the_space(snap_compare) -> None:
    app = SnapshotApp([busy_watch(Path("relay-a"))])
    assert snap_compare(app, terminal_size=(200, 50), run_before=_draw)


def _probed_watch() -> RelayWatch:
    """Two minutes of probe samples every 5 s (a little jitter), one lost echo a minute ago."""
    from cosmictui.ops.metrics.client import Target
    from cosmictui.ops.metrics.probe import ProbeSample
    from cosmictui.ops.metrics.probewatch import ProbeWatch
    from tests.e2e._monitor_data import KEY

    w = RelayWatch(Target(relay_key=KEY))
    p = w.probe = ProbeWatch(KEY, interval=5.0)
    for i, t in enumerate(range(int(END) - 115, int(END) + 1, 5)):
        if i == 12:
            p.observe(ProbeSample(float(t), False, None, "203.0.113.7:49737", "echo lost: TimeoutError"))
        else:
            p.observe(ProbeSample(float(t), True, 38.0 + 6 * ((i * 7) % 5), "203.0.113.7:49737", "echo"))
    w.observe_probe(END - 115)
    return w


async def _draw_settled(pilot) -> None:
    """Draw, let the layout switch to the probe graph, draw again at its final size."""
    await _draw(pilot)
    await _draw(pilot)


def test_monitor_snapshot_80x24_probed_relay_known_by_key(snap_compare) -> None:
    app = SnapshotApp([_probed_watch()])
    assert snap_compare(app, terminal_size=(80, 24), run_before=_draw_settled)
