"""Pilot tests for step 4 (apply & restart): streamed output, stop at the first failure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from textual.widgets import Button

from cosmictui.ops.config import Settings
from cosmictui.widgets.output_log import OutputLog
from tests.e2e._wizard_support import (
    KEY,
    make_app,
    make_bin,
    path_with,
    resume_at,
    status,
    step,
    wait_status,
    wait_until,
)


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def _setup(tmp_path: Path, task_body: str) -> tuple[Path, Settings]:
    d = tmp_path / "deploy"
    d.mkdir()
    (d / ".env").write_text(f"K8S_COMMON_CONFIG__interconnect__relays='[\"{KEY}\"]'\n")
    bin_dir = make_bin(tmp_path, {"task": task_body})
    resume_at(str(d), "apply", relay_key=KEY)
    return d, Settings(deployment=str(d), command_env={"PATH": path_with(bin_dir)})


TASK_OK = 'echo "task $* in $(pwd)" >> calls.log\necho "ran $1"\n'


async def test_wizard_apply_runs_both_streams_output_and_records_restart(tmp_path: Path) -> None:
    d, settings = _setup(tmp_path, TASK_OK)
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.screen.index == 3
        await pilot.press("n")  # not run yet: refused
        assert app.screen.index == 3 and "press r" in status(app, "apply")
        await pilot.press("r")
        text = await wait_status(pilot, app, "apply", ("ok",))
        assert "Applied and restarted" in text
        out = step(app, "apply").query_one("#apply-output", OutputLog).plain_lines
        assert "ran apply-wrk-server-k8s-nvidia-common-config" in out and "ran restart" in out
        assert app.screen.ctx.restarted_at is not None
        await pilot.press("y")  # the command log, copied for the operator's notes
        commands = [line for line in app.clipboard.splitlines() if line.startswith("$ ")]
        assert commands[0].startswith("$ task apply-wrk-server-k8s-nvidia-common-config")
        assert '$ task restart SERVICES="cosmicac-wrk-server-k8s-nvidia"' in app.clipboard
        await pilot.press("n")
        assert app.screen.index == 4
        restarted_at = app.screen.ctx.restarted_at
    # A rerun resumes where the operator left off, with the restart time it recorded.
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.screen.index == 4 and app.screen.ctx.restarted_at == restarted_at
        assert [n.message for n in app._notifications] == ["Resumed at step 5: Verify"]
        marks = [str(i.render())[0] for i in app.screen.query("StepItem")]
        assert marks == ["✔", "✔", "✔", "✔", "▶", "·"]
    calls = (d / "calls.log").read_text().splitlines()
    assert calls == [
        f"task apply-wrk-server-k8s-nvidia-common-config in {d}",
        f"task restart SERVICES=cosmicac-wrk-server-k8s-nvidia in {d}",
    ]


async def test_wizard_apply_stops_at_first_failure_with_fix(tmp_path: Path) -> None:
    body = 'echo "task $*" >> calls.log\nif [ "$1" = apply-wrk-server-k8s-nvidia-common-config ]; then\n'
    body += '  echo "task: Failed to run task: exit status 2" >&2; exit 201\nfi\n'
    d, settings = _setup(tmp_path, body)
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("r")
        text = await wait_status(pilot, app, "apply", ("error",))
        assert "exited 201; stopped here" in text and "fix the cause" in text
        assert "Read its output (command log: l)" in text  # the wizard names its log key
        rows = [r.render_text() for r in step(app, "apply").query(".command-row")]
        assert rows[0].startswith("✘ FAILED") and "(exit 201)" in rows[0] and rows[1].startswith("– not run")
        assert (
            "task: Failed to run task: exit status 2"
            in step(app, "apply").query_one("#apply-output", OutputLog).plain_lines
        )
        assert app.screen.ctx.restarted_at is None
        await pilot.press("n")
        assert app.screen.index == 3
    assert (d / "calls.log").read_text().splitlines() == ["task apply-wrk-server-k8s-nvidia-common-config"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_wizard_apply_task_missing_says_so(tmp_path: Path) -> None:
    d, settings = _setup(tmp_path, TASK_OK)
    settings = settings.with_overrides(command_env={"PATH": path_with(None)})  # `task` not on PATH
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("r")
        text = await wait_status(pilot, app, "apply", ("error",))
        assert "`task` is not installed or not on PATH" in text
    assert not (d / "calls.log").exists()


async def test_wizard_apply_cancel_stops_the_running_command(tmp_path: Path) -> None:
    body = 'echo "task $*" >> calls.log\necho $$ > task.pid\necho started\nexec sleep 30\n'
    d, settings = _setup(tmp_path, body)
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("r")
        back = app.screen.query_one("#back", Button)
        await wait_until(
            pilot, lambda: "started" in step(app, "apply").query_one("#apply-output", OutputLog).plain_lines, "output"
        )
        assert str(back.label) == "✕ Cancel" and app.screen.query_one("#next", Button).disabled
        await pilot.click("#back")
        text = await wait_status(pilot, app, "apply", ("warn",))
        assert "Cancelled" in text
        assert str(back.label) == "◀ Back"
        assert app.screen.index == 3
        pid = int((d / "task.pid").read_text())
        await wait_until(pilot, lambda: not _alive(pid), "the cancelled command to be killed")
    assert (d / "calls.log").read_text().splitlines() == ["task apply-wrk-server-k8s-nvidia-common-config"]
