"""Step 5's ✔ is the new job's own connection, and every tick is what is true now: the wizard on the
demo sandbox's real relay, DHT and job peers, at 80×24 and 60×20.

(a) the .env switched to another relay (a second blind-relay on the demo's DHT), then a probe through
    the wizard's relay after the job: no ✔;
(b) an older job re-pairs after a second restart while the new test job goes direct: no ✔;
(c) the good path: ✔, with the job's own pairing (when it opened, bytes) under it;
(d) the .env changed outside the wizard: step 3 unticked, step 4 warns naming both keys;
(e) a restart after the ✔ withdraws it at once.

Each case runs at one of the two sizes and, where its verdict stands, is looked at in the other too
(the terminal resized: the same verdict, its status line whole on screen).

Steps 1-4 are done before the wizard opens (the relay started, its key written, apply and
restart run by the sandbox's own `task`), with the progress an earlier run would have left: the
wizard resumes at step 5.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from textual.pilot import Pilot

from cosmictui.app import WizardApp
from cosmictui.ops import progress as progress_mod
from cosmictui.ops import relayproc
from cosmictui.ops.demo.sandbox import Sandbox, sandbox_state, set_direct_jobs
from cosmictui.ops.session import WizardContext
from cosmictui.ops.setup.envfile import plan_relays
from cosmictui.screens.confirm import ConfirmScreen
from cosmictui.widgets.step_list import StepList
from tests.e2e._wizard_support import ENV_VAR, at_the_other_size, status, status_kind, step, wait_until
from tests.interop._relay_proc import free_udp_port

SIZES = [(80, 24), (60, 20)]


def run(sb: Sandbox, cmd: str) -> str:
    env = dict(os.environ, **sb.settings.command_env)
    p = subprocess.run(cmd, shell=True, cwd=sb.deployment, env=env, capture_output=True, text=True, check=True)
    return p.stdout


def set_env(sb: Sandbox, key: str) -> None:
    sb.env_path.write_text(plan_relays(sb.env_path.read_text(), key, "replace", var=ENV_VAR).new)


def restart(sb: Sandbox) -> float:
    """Apply and restart with the sandbox's own `task`, noted in the progress as the wizard notes its
    own (when, that it finished, which keys the .env gave the worker)."""
    from cosmictui.ops.setup.envfile import read_relays

    keys = list(read_relays(sb.env_path.read_text(), ENV_VAR))
    run(sb, sb.settings.apply_command)
    at = time.time()
    run(sb, sb.settings.restart_command)
    p = progress_mod.load_progress(sb.settings.deployment)
    p.data.setdefault("restarts", []).append({"began_at": at, "ended_at": time.time(), "keys": keys})
    p.restarted_at = at
    progress_mod.save_progress(p)
    return at


async def prepared(sb: Sandbox) -> str:
    """Steps 1-4 done as an earlier run would have: the relay runs, the .env lists it, applied, restarted."""
    s = sb.settings
    rt = await relayproc.start_relay(
        str(sb.relay_storage), s.relay_port, s.relay_host, s.relay_bootstrap, s.relay_metrics
    )
    set_env(sb, rt.key)
    p = progress_mod.WizardProgress(
        deployment=s.deployment,
        current_step="verify",
        completed=["prereqs", "relay", "env", "apply"],
        relay_storage=str(sb.relay_storage),
        relay_key=rt.key,
    )
    progress_mod.save_progress(p)
    restart(sb)
    return rt.key


def wizard(sb: Sandbox) -> WizardApp:
    return WizardApp(WizardContext(sb.settings.with_overrides(poll_interval=0.5), demo=sb))


def ticked(app: WizardApp, index: int) -> bool:
    """The step's tick as the step list shows it (the current step shows as current: its own flag)."""
    screen = app.screen
    if index == screen.index:  # type: ignore[attr-defined]
        return bool(screen.steps[index].done)  # type: ignore[attr-defined]
    return screen.query_one(StepList).state_of(index) == "done"


def evidence(app: WizardApp) -> str:
    return str(step(app, "verify").query_one("#verify-evidence").render())


async def make_test_job(pilot: Pilot[object], app: WizardApp) -> None:
    await wait_until(pilot, lambda: app.screen.index == 4 and step(app, "verify").polls >= 1, "step 5 watching")
    await pilot.press("j")
    await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the test job dialog")
    await pilot.press("y")
    await wait_until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), "the dialog to close")


def left_creating(app: WizardApp) -> bool:
    text = status(app, "verify")
    return "left Creating" in text and status_kind(app, "verify") in ("ok", "warn")


@pytest.fixture
async def other_relay(sandbox: Sandbox, tmp_path: Path) -> AsyncIterator[str]:
    """A second blind-relay on the demo's DHT: what the .env is switched to."""
    storage = tmp_path / "other-relay"
    s = sandbox.settings
    rt = await relayproc.start_relay(str(storage), free_udp_port(), "127.0.0.1", s.relay_bootstrap)
    try:
        yield rt.key
    finally:
        await relayproc.stop_relay(str(storage))


@pytest.mark.parametrize("size", [SIZES[0]])
async def test_c_the_good_path_shows_the_jobs_own_pairing(sandbox: Sandbox, size: tuple[int, int]) -> None:
    await prepared(sandbox)
    app = wizard(sandbox)
    async with app.run_test(size=size) as pilot:
        await make_test_job(pilot, app)
        await wait_until(pilot, lambda: status_kind(app, "verify") == "ok", "the ✔", timeout=60)
        assert "the relay works" in status(app, "verify")
        shown = evidence(app)
        assert "Pairing #" in shown and "opened" in shown and "relayed" in shown, shown
        assert "session(s) opened" not in shown  # the job's pairing, not the relay's totals
        await at_the_other_size(pilot, app, size, "verify")
        await wait_until(pilot, lambda: ticked(app, 4), "step 5 ticked")


@pytest.mark.parametrize("size", [SIZES[1]])
async def test_a_env_switched_to_another_relay_then_a_probe_is_no_tick(
    sandbox: Sandbox, other_relay: str, size: tuple[int, int]
) -> None:
    key = await prepared(sandbox)
    set_env(sandbox, other_relay)  # the .env now lists the other relay; applied and restarted
    restart(sandbox)
    app = wizard(sandbox)
    async with app.run_test(size=size) as pilot:
        await make_test_job(pilot, app)
        await wait_until(pilot, lambda: left_creating(app), "the job left Creating", timeout=60)
        assert "not through this relay" in status(app, "verify")
        # a probe through the wizard's relay, after the job: its pairing is the probe's, not the job's
        probe = subprocess.run(
            [sys.executable, "-m", "cosmictui", "--config", str(sandbox.config_path), "relay", "probe", key],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert probe.returncode == 0, probe.stdout + probe.stderr
        polls = step(app, "verify").polls
        await wait_until(pilot, lambda: step(app, "verify").polls >= polls + 3, "lists after the probe", timeout=60)
        text = status(app, "verify")
        assert status_kind(app, "verify") != "ok" and "the relay works" not in text, text
        assert "not through this relay" in text, text
        assert "the wizard's probe" in evidence(app), evidence(app)
        assert not ticked(app, 4) and not ticked(app, 2)  # and step 3: the .env does not list the relay
        await at_the_other_size(pilot, app, size, "verify")


@pytest.mark.parametrize("size", [SIZES[0]])
async def test_b_an_older_job_re_pairing_while_the_new_job_goes_direct_is_no_tick(
    sandbox: Sandbox, size: tuple[int, int]
) -> None:
    await prepared(sandbox)
    older = run(sandbox, sandbox.settings.test_job_command).split()[2]  # a job made after the first restart

    def older_running() -> bool:
        return next(j for j in sandbox_state(sandbox)["jobs"] if j["id"] == older)["status"] == "Running"

    deadline = time.monotonic() + 60
    while not older_running():
        assert time.monotonic() < deadline, "the older job never left Creating"
        time.sleep(0.2)
    set_direct_jobs(sandbox, True)  # the next job's network does not block it
    restart(sandbox)  # a second restart: the older job re-pairs through the relay
    app = wizard(sandbox)
    async with app.run_test(size=size) as pilot:
        await make_test_job(pilot, app)
        await wait_until(pilot, lambda: left_creating(app), "the new job left Creating", timeout=60)
        polls = step(app, "verify").polls
        await wait_until(pilot, lambda: step(app, "verify").polls >= polls + 3, "a few more lists", timeout=60)
        text = status(app, "verify")
        assert status_kind(app, "verify") != "ok" and "the relay works" not in text, text
        assert "not through this relay" in text, text
        assert not ticked(app, 4)
        table = step(app, "verify").query_one("#verify-jobs")
        notes = {table.get_row_at(i)[0]: table.get_row_at(i)[3] for i in range(table.row_count)}
        assert "no key" not in notes[older], notes  # made after a restart that applied the key
        await at_the_other_size(pilot, app, size, "verify")


@pytest.mark.parametrize("size", [SIZES[1]])
async def test_d_env_changed_outside_the_wizard_unticks_3_and_step_4_names_both_keys(
    sandbox: Sandbox, size: tuple[int, int]
) -> None:
    key = await prepared(sandbox)
    app = wizard(sandbox)
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: app.screen.index == 4 and ticked(app, 2), "step 3 ticked at first")
        other = "yry" * 17 + "o"
        set_env(sandbox, other)  # someone edits the .env on the deployment host
        await pilot.press("b")
        await wait_until(pilot, lambda: app.screen.index == 3, "back at step 4")
        await wait_until(pilot, lambda: not ticked(app, 2), "step 3 unticked", timeout=30)
        await wait_until(pilot, lambda: status_kind(app, "apply") == "warn", "step 4's warning", timeout=30)
        text = status(app, "apply")  # short at 60 columns: each key by its start (the question has them whole)
        assert other[:12] in text and key[:12] in text, text
        await at_the_other_size(pilot, app, size, "apply")
        await pilot.press("r")  # applying now asks first, with both keys
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        body = app.screen.body  # type: ignore[attr-defined]
        assert other in body and key in body
        await pilot.press("n")


@pytest.mark.parametrize("size", [SIZES[0]])
async def test_e_a_restart_after_the_tick_withdraws_it_at_once(sandbox: Sandbox, size: tuple[int, int]) -> None:
    await prepared(sandbox)
    app = wizard(sandbox)
    async with app.run_test(size=size) as pilot:
        await make_test_job(pilot, app)
        await wait_until(pilot, lambda: ticked(app, 4), "step 5 ticked", timeout=60)
        await pilot.press("b")
        await wait_until(pilot, lambda: app.screen.index == 3, "at step 4")
        await pilot.press("r")
        await wait_until(pilot, lambda: step(app, "apply").busy, "the restart running", timeout=30)
        await wait_until(pilot, lambda: not ticked(app, 4), "step 5's tick withdrawn", timeout=30)
        await wait_until(pilot, lambda: status_kind(app, "apply") == "ok", "applied again", timeout=60)
        await wait_until(pilot, lambda: "apply" in app.screen.ctx.ticks(), "step 4 ticked again")  # type: ignore[attr-defined]
        for _ in range(3):  # the step list is drawn again from the ticks (Changed): let it settle
            await pilot.pause()
        assert not ticked(app, 4) and "verify" not in app.screen.ctx.ticks()  # type: ignore[attr-defined]
        await at_the_other_size(pilot, app, size, "apply")


@pytest.mark.parametrize("size", [SIZES[1]])
async def test_a_resume_after_the_env_changed_shows_what_next_accepts(sandbox: Sandbox, size: tuple[int, int]) -> None:
    """It opened on '✔ … the relay works', then n said step 5 was not done: now both say the same."""
    await prepared(sandbox)
    app = wizard(sandbox)
    async with app.run_test(size=size) as pilot:
        await make_test_job(pilot, app)
        await wait_until(pilot, lambda: ticked(app, 4), "step 5 ticked", timeout=60)
    set_env(sandbox, "yry" * 17 + "o")  # changed while the wizard was closed
    app = wizard(sandbox)
    async with app.run_test(size=size) as pilot:
        await wait_until(
            pilot, lambda: app.screen.index == 4 and step(app, "verify").polls >= 3, "resumed, two verdicts"
        )
        assert status_kind(app, "verify") != "ok" and "the relay works" not in status(app, "verify")
        assert not ticked(app, 4) and not ticked(app, 2)
        await at_the_other_size(pilot, app, size, "verify")
        await pilot.press("n")
        assert app.screen.index == 4  # and Next says so too
