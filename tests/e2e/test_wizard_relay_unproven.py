"""Step 2's tick needs the proof: a relay that runs but did not carry the probe is "!", not ✔.

The relay is the demo sandbox's real one (started by the wizard); only the probe's outcome is
stood in for on its first run (as when no DHT bootstrap node answers); the second run is the real
probe through that relay.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from textual.pilot import Pilot

from cosmictui.app import WizardApp
from cosmictui.ops.config import Settings
from cosmictui.ops.demo.sandbox import Sandbox
from cosmictui.ops.metrics import probe as probe_mod
from cosmictui.ops.metrics.probe import NO_BOOTSTRAP, STAGES, ProbeResult, ProbeStage
from cosmictui.ops.runner import LocalRunner, Runner
from cosmictui.ops.session import WizardContext
from cosmictui.widgets.step_list import StepItem, StepList
from tests.e2e._wizard_support import OTHER_SIZE, status, status_kind, step, still, wait_status, wait_until


def _mark(app: WizardApp, index: int) -> str:
    return str(app.screen.query_one(f"#step-item-{index}", StepItem).render()).split(" ", 1)[0]


async def test_a_failed_probe_leaves_step_2_unproven_until_a_probe_passes(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_probe = probe_mod.run_probe
    runs: list[str] = []

    async def probe(key: str, *a: object, **k: object) -> ProbeResult:
        runs.append(key)
        if len(runs) == 1:  # the first probe cannot reach the DHT
            return ProbeResult(relay_key=key, stages=[ProbeStage(STAGES[0], False, 10.0, NO_BOOTSTRAP)])
        return await real_probe(key, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(probe_mod, "run_probe", probe)
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


class _HostRunner(LocalRunner):
    """The deployment seen as a remote host ("jobs-host"), so step 2 also probes from there.

    Its `cosmictui` is a stand-in that prints what `cosmictui relay probe KEY --json` prints
    there; the wizard parses it as it parses the real one.
    """

    host = "jobs-host"

    def __init__(self, root: str, env: dict[str, str]) -> None:
        super().__init__(root, env=env)
        self.label = "jobs-host"


def _host_probe_prints(tmp: Path, ok: bool) -> Path:
    """A bin directory whose `cosmictui` prints a probe result that passed (or failed)."""
    result = (
        {"ok": True, "relay_address": "10.0.0.7:49737", "rtt_ms": 3.1, "error": None}
        if ok
        else {"ok": False, "relay_address": None, "rtt_ms": None, "error": "holepunch through the relay: timed out"}
    )
    bin_dir = tmp / "host-bin"
    bin_dir.mkdir()
    script = bin_dir / "cosmictui"
    script.write_text(f"#!/bin/sh\necho '{json.dumps(result)}'\n")
    script.chmod(0o755)
    return bin_dir


def _probe_stand_in(monkeypatch: pytest.MonkeyPatch, ok: bool) -> None:
    """This machine's probe through the relay passes (or fails as when no bootstrap node answers)."""

    async def probe(key: str, *a: object, **k: object) -> ProbeResult:
        if ok:
            return ProbeResult(relay_key=key, ok=True, relay_address="127.0.0.1:49737", rtt_ms=1.0, seconds=0.5)
        return ProbeResult(relay_key=key, stages=[ProbeStage(STAGES[0], False, 10.0, NO_BOOTSTRAP)])

    monkeypatch.setattr(probe_mod, "run_probe", probe)


def _host_context(sandbox: Sandbox, bin_dir: Path) -> WizardContext:
    settings = sandbox.settings.with_overrides(relay_address="127.0.0.1")
    path = f"{bin_dir}{os.pathsep}{settings.command_env['PATH']}"

    async def open_host(s: Settings) -> Runner:
        return _HostRunner(s.deployment, {**s.command_env, "PATH": path})

    return WizardContext(settings, demo=sandbox, open_runner=open_host)


async def _start_relay_and_go_on(pilot: Pilot[object], app: WizardApp) -> str:
    await wait_status(pilot, app, "prereqs", ("ok", "warn", "error"), timeout=30)
    await pilot.press("n")
    await wait_until(pilot, lambda: app.screen.index == 1, "at step 2")
    await pilot.press("s")
    text = await wait_status(pilot, app, "relay", ("ok", "warn", "error"), timeout=60)
    await pilot.press("n")
    await wait_until(pilot, lambda: app.screen.index == 2, f"Next past step 2 ({text})")
    return text


@pytest.mark.parametrize("size", [(80, 24)])
async def test_a_probe_that_passes_from_the_deployment_host_proves_step_2(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    _probe_stand_in(monkeypatch, ok=False)  # this machine reaches no bootstrap node ...
    app = WizardApp(_host_context(sandbox, _host_probe_prints(tmp_path, ok=True)))  # ... the jobs' host does
    async with app.run_test(size=size) as pilot:
        text = await _start_relay_and_go_on(pilot, app)
        assert "the probe" not in text and status_kind(app, "relay") == "ok", text
        steps = app.screen.query_one(StepList)
        await wait_until(pilot, lambda: steps.state_of(1) == "done", f"step 2 ticked: {steps.state_of(1)}")
        assert _mark(app, 1) == "✔"
        await pilot.resize_terminal(*OTHER_SIZE[size])  # the step list drawn short or whole: the same mark
        await still(pilot)
        assert _mark(app, 1) == "✔"


@pytest.mark.parametrize("size", [(60, 20)])
async def test_a_probe_that_fails_from_the_deployment_host_keeps_step_2_unproven_after_a_rerun(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    _probe_stand_in(monkeypatch, ok=True)  # this machine's probe passes, the one where the jobs run fails
    bin_dir = _host_probe_prints(tmp_path, ok=False)
    app = WizardApp(_host_context(sandbox, bin_dir))
    async with app.run_test(size=size) as pilot:
        text = await _start_relay_and_go_on(pilot, app)
        assert "the probe from jobs-host failed at holepunch through the relay" in text, text
        assert status_kind(app, "relay") == "warn", text
        steps = app.screen.query_one(StepList)
        await wait_until(pilot, lambda: steps.state_of(1) == "warn", f"step 2 unproven: {steps.state_of(1)}")
        assert _mark(app, 1) == "!"
    # a rerun of the wizard for the same deployment (its relay still runs): the same "!", not ✔
    again = WizardApp(_host_context(sandbox, bin_dir))
    async with again.run_test(size=size) as pilot:
        steps = again.screen.query_one(StepList)
        await wait_until(pilot, lambda: again.screen.index == 2, "resumed at step 3")
        await wait_until(pilot, lambda: steps.state_of(1) != "pending", "step 2's mark")
        assert steps.state_of(1) == "warn" and _mark(again, 1) == "!", steps.state_of(1)
        await pilot.resize_terminal(*OTHER_SIZE[size])
        await still(pilot)
        assert _mark(again, 1) == "!"
        await pilot.resize_terminal(*size)
        await pilot.press("b")
        await wait_until(pilot, lambda: again.screen.index == 1, "back at step 2")
        text = await wait_status(pilot, again, "relay", ("ok", "warn", "error"), timeout=30)
        assert "its last probe from jobs-host failed" in text and status_kind(again, "relay") == "warn", text
