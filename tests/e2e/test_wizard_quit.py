"""Quitting a real deployment's wizard while its relay runs: the operator is told what stays running.

The relay is real (the demo sandbox's relay and private DHT), but the wizard runs it as a real
deployment: nothing is torn down on quit, so the relay outlives the wizard, and the question says so.
"""

from __future__ import annotations

import asyncio

import pytest

from cosmictui.app import WizardApp
from cosmictui.ops import progress as progress_mod
from cosmictui.ops import relayproc
from cosmictui.ops.demo.sandbox import Sandbox
from cosmictui.ops.session import WizardContext
from cosmictui.screens.confirm import ConfirmScreen
from cosmictui.screens.monitor import MonitorScreen
from cosmictui.screens.wizard import WizardScreen
from tests.e2e._wizard_support import resume_at, wait_status, wait_until


def _said(dialog: ConfirmScreen) -> str:
    return " ".join(str(dialog.query_one("#confirm-body").render()).split())


@pytest.mark.parametrize("size", [(80, 24), (60, 20)])
async def test_q_on_a_real_deployment_says_what_keeps_running_and_asks(sandbox: Sandbox, size: tuple[int, int]) -> None:
    s = sandbox.settings
    metrics = s.relay_metrics.removeprefix("http://") if s.relay_metrics else None
    rt = await asyncio.wait_for(
        relayproc.start_relay(s.relay_storage, s.relay_port, s.relay_host, s.relay_bootstrap, metrics), 60
    )
    resume_at(s.deployment, "env", relay_key=rt.key, relay_storage=s.relay_storage)
    app = WizardApp(WizardContext(s))  # no demo: a real deployment, whose relay outlives the wizard
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, WizardScreen) and app.screen.index == 2, "step 3")
        await pilot.press("q")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        dialog = app.screen
        assert isinstance(dialog, ConfirmScreen)
        said = _said(dialog)
        for fact in (f"pid {rt.pid}", f"UDP port {rt.port}", rt.key, "keeps running", "Finish", "resumes at step 3"):
            assert fact in said, (fact, said)
        assert dialog.shown_commands() == [f"kill {rt.pid}"]  # how to stop it, shown, never run
        assert not dialog.has_class("-danger") and app.focused is dialog.query_one("#confirm-no")
        # both answers in view above the dialog's footer, however long the question
        footer_top = dialog.query_one("Footer").region.y
        box = dialog.query_one("#confirm-box").content_region
        for button in ("#confirm-yes", "#confirm-no"):
            region = dialog.query_one(button).region
            assert box.contains_region(region) and region.bottom <= footer_top, (button, region, box, footer_top)
        await pilot.press("escape")  # stay
        await wait_until(pilot, lambda: isinstance(app.screen, WizardScreen), "back in the wizard")
        assert app.is_running
        # ctrl+q asks the same, also from the monitor the wizard opened
        await pilot.press("m")
        await wait_until(pilot, lambda: isinstance(app.screen, MonitorScreen), "the monitor")
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question from the monitor")
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, MonitorScreen), "the monitor again")
        await pilot.press("q")
        await wait_until(pilot, lambda: isinstance(app.screen, WizardScreen), "the wizard")
        await pilot.press("q")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question again")
        await pilot.press("y")
        await wait_until(pilot, lambda: not app.is_running, "the wizard to quit")
    assert relayproc.attach(s.relay_storage) == rt  # still running, as the question said
    assert progress_mod.load_progress(s.deployment).relay_key == rt.key  # progress kept for a rerun


async def test_q_with_no_relay_running_and_nothing_in_flight_quits_at_once(sandbox: Sandbox) -> None:
    """Nothing keeps running, nothing is lost (progress is saved): no question to answer."""
    app = WizardApp(WizardContext(sandbox.settings))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_status(pilot, app, "prereqs", ("ok", "warn", "error"), timeout=30)  # its commands ended
        await pilot.press("q")
        await wait_until(pilot, lambda: not app.is_running, "the wizard to quit")
