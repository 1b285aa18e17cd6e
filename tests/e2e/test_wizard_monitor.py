"""The monitor as one of the wizard's screens: what it advises is what the wizard offers."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosmictui.ops.config import Settings
from cosmictui.ops.metrics.client import RelayState
from cosmictui.screens.monitor import MonitorScreen
from cosmictui.widgets.monitor_facts import RelayFacts
from tests.e2e._wizard_support import make_app, resume_at, wait_until

SIZES = [(80, 24), (60, 20)]


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


@pytest.mark.parametrize("size", SIZES)
async def test_the_monitor_opened_before_the_relay_starts_points_at_step_2s_s(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    """Before `s` the wizard's relay is not running: the monitor says how the wizard starts it (step
    2's s), not a `blind-relay` command that would start a relay the wizard does not know of."""
    d = tmp_path / "deploy"
    d.mkdir()
    resume_at(str(d), "relay")
    app = make_app(Settings(deployment=str(d), relay_storage=str(tmp_path / "store"), relay_metrics="127.0.0.1:9"))
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: app.screen.index == 1, "step 2")
        await pilot.press("m")
        await wait_until(pilot, lambda: isinstance(app.screen, MonitorScreen), "the monitor")
        w = app.screen.watches[0]
        await wait_until(pilot, lambda: w.state is RelayState.NOT_RUNNING, "the relay not running")
        assert w.fix is not None and "blind-relay" not in w.fix and "s in step 2" in w.fix, w.fix
        facts = app.screen.query_one(RelayFacts)
        await wait_until(pilot, lambda: "s in step 2" in " ".join(str(facts.render()).split()), "the advice drawn")
        assert "blind-relay --storage" not in str(facts.render())
