"""Step 1 says what is true now: back in it after the relay started, its checks see the relay."""

from __future__ import annotations

import asyncio

import pytest

from cosmictui.app import WizardApp
from cosmictui.ops import relayproc
from cosmictui.ops.demo.sandbox import Sandbox
from cosmictui.ops.session import WizardContext
from cosmictui.screens.step_prereqs import PrereqsStep
from cosmictui.widgets.check_row import CheckRow
from tests.e2e._wizard_support import at_the_other_size, step, wait_status, wait_until


def _rows(app: WizardApp) -> dict[str, str]:
    return {r.result.name: f"{r.result.status}: {r.result.detail}" for r in step(app, "prereqs").query(CheckRow)}


@pytest.mark.parametrize("size", [(60, 20)])
async def test_back_in_step_1_the_checks_see_the_relay_that_now_runs(sandbox: Sandbox, size: tuple[int, int]) -> None:
    """The checks ran before the relay did ("the relay is not running"); once it runs (started by
    step 2, or by hand), going back to step 1 checks again instead of showing that stale word."""
    s = sandbox.settings
    app = WizardApp(WizardContext(s, demo=sandbox))
    async with app.run_test(size=size) as pilot:
        await wait_status(pilot, app, "prereqs", ("ok", "warn"), timeout=30)
        before = _rows(app)
        assert any("not running" in r for r in before.values()), before
        await pilot.press("n")
        await wait_until(pilot, lambda: app.screen.index == 1, "step 2")
        # the relay starts (here as an operator would by hand: the same storage, port and DHT)
        metrics = s.relay_metrics.removeprefix("http://") if s.relay_metrics else None
        rt = await asyncio.wait_for(
            relayproc.start_relay(s.relay_storage, s.relay_port, s.relay_host, s.relay_bootstrap, metrics), 60
        )
        await pilot.press("b")
        await wait_until(pilot, lambda: app.screen.index == 0, "step 1 again")
        prereqs = step(app, "prereqs")
        assert isinstance(prereqs, PrereqsStep)
        first = prereqs.results
        await wait_until(
            pilot,
            lambda: prereqs.results is not first and [r.result for r in prereqs.query(CheckRow)] == prereqs.results,
            "the checks to run again, their rows drawn",
            timeout=30,
        )
        after = _rows(app)
        assert not any("not running" in r for r in after.values()), after
        assert f"pid {rt.pid}" in after[f"UDP port {rt.port}"], after  # held by the relay, named
        assert after["DHT reachable, port open"].startswith("ok: bootstrapped"), after
        await at_the_other_size(pilot, app, size, "prereqs")
