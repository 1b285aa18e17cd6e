"""Step 2's tick needs the proof: a relay that runs but did not carry the probe is "!", not ✔.

The relay is the demo sandbox's real one (started by the wizard); only the probe's outcome is
stood in for on its first run (as when no DHT bootstrap node answers); the second run is the real
probe through that relay.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cosmictui.app import WizardApp
from cosmictui.ops.demo.sandbox import Sandbox, create_sandbox
from cosmictui.ops.metrics.probe import NO_BOOTSTRAP, STAGES, ProbeResult, ProbeStage
from cosmictui.ops.session import WizardContext
from cosmictui.screens import step_relay
from cosmictui.widgets.step_list import StepItem, StepList
from tests.e2e._wizard_support import status, step, wait_status, wait_until


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    sb = create_sandbox(tmp_path / "demo")
    try:
        yield sb
    finally:
        sb.close()  # the relay the wizard started (detached) and the sandbox's private DHT


def _mark(app: WizardApp, index: int) -> str:
    return str(app.screen.query_one(f"#step-item-{index}", StepItem).render()).split(" ", 1)[0]


async def test_a_failed_probe_leaves_step_2_unproven_until_a_probe_passes(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_probe = step_relay.run_probe
    runs: list[str] = []

    async def probe(key: str, *a: object, **k: object) -> ProbeResult:
        runs.append(key)
        if len(runs) == 1:  # the first probe cannot reach the DHT
            return ProbeResult(relay_key=key, stages=[ProbeStage(STAGES[0], False, 10.0, NO_BOOTSTRAP)])
        return await real_probe(key, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(step_relay, "run_probe", probe)
    app = WizardApp(WizardContext(sandbox.settings, demo=sandbox))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_status(pilot, app, "prereqs", ("ok", "warn"), timeout=30)
        await pilot.press("n")
        await pilot.press("s")
        text = await wait_status(pilot, app, "relay", ("ok", "warn", "error"), timeout=60)
        assert "the probe failed at key found on the DHT" in text and "press a to probe again" in text.lower(), text
        # Next is still allowed: the relay runs, only the proof is missing
        await pilot.press("n")
        await wait_until(pilot, lambda: app.screen.index == 2, "Next past step 2 after a failed probe")
        steps = app.screen.query_one(StepList)
        await wait_until(pilot, lambda: steps.state_of(1) == "warn", f"step 2 unproven: {steps.state_of(1)}")
        assert _mark(app, 1) == "!" and steps.state_of(0) == "done"
        # a probe that passes through the same relay turns it into ✔
        await pilot.press("b")
        await wait_until(pilot, lambda: app.screen.index == 1, "back at step 2")
        await pilot.press("a")
        text = await wait_status(pilot, app, "relay", ("ok", "warn", "error"), timeout=60)
        assert status(app, "relay") and len(runs) == 2 and "the probe" not in text, text
        await pilot.press("n")
        await wait_until(pilot, lambda: app.screen.index == 2, "Next past step 2 after the probe passed")
        await wait_until(pilot, lambda: steps.state_of(1) == "done", f"step 2 ticked: {steps.state_of(1)}")
        assert _mark(app, 1) == "✔"
        assert step(app, "relay").done
