"""A session that survives mistakes: quit asks while a command runs, later ticks are taken back
when the .env changes or apply fails, markup in messages survives, the command log is on disk."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cosmictui.ops import progress as progress_mod
from cosmictui.ops.config import Settings
from cosmictui.screens.confirm import ConfirmScreen
from tests.e2e._wizard_support import (
    KEY,
    make_app,
    make_bin,
    path_with,
    resume_at,
    step,
    wait_status,
    wait_until,
)


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def _apply_setup(tmp_path: Path, task_body: str, **progress: object) -> tuple[Path, Settings]:
    d = tmp_path / "deploy"
    d.mkdir()
    (d / ".env").write_text(f"K8S_COMMON_CONFIG__interconnect__relays='[\"{KEY}\"]'\n")
    bin_dir = make_bin(tmp_path, {"task": task_body})
    resume_at(str(d), "apply", relay_key=KEY, **progress)
    return d, Settings(deployment=str(d), command_env={"PATH": path_with(bin_dir)}, relay_metrics="off")


async def test_quit_while_a_command_runs_asks_first(tmp_path: Path) -> None:
    gate = tmp_path / "go"
    _, settings = _apply_setup(tmp_path, f'echo started\nwhile [ ! -e "{gate}" ]; do sleep 0.05; done\n')
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("r")
        await wait_until(pilot, lambda: step(app, "apply").busy, "apply running")
        await pilot.press("q")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the quit question")
        assert app.screen.commands == ["task apply-wrk-server-k8s-nvidia-common-config"]
        await pilot.press("escape")  # keep running
        await pilot.pause()
        assert app.is_running and step(app, "apply").busy
        await pilot.press("ctrl+q")  # ctrl+q asks too
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the quit question again")
        await pilot.press("escape")
        gate.touch()
        await wait_status(pilot, app, "apply", ("ok",))
        await pilot.press("q")  # nothing runs: quits at once
        await wait_until(pilot, lambda: not app.is_running, "the app to exit")


async def test_failed_apply_takes_back_the_later_ticks(tmp_path: Path) -> None:
    d, settings = _apply_setup(
        tmp_path, 'echo "Error from server (Forbidden): configmaps is forbidden" >&2; exit 201\n'
    )
    p = progress_mod.load_progress(str(d))
    for sid in ("apply", "verify"):
        p.complete(sid)  # as after an earlier, good run
    progress_mod.save_progress(p)
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("r")
        await wait_status(pilot, app, "apply", ("error",))
        await pilot.pause()
        saved = progress_mod.load_progress(str(d))
        assert not saved.is_done("apply") and not saved.is_done("verify") and saved.is_done("env")
        assert "Progress reset" in [n.title for n in app._notifications]


async def test_markup_in_messages_survives_and_the_command_log_is_on_disk(tmp_path: Path) -> None:
    d = tmp_path / "deploy"
    d.mkdir()
    bin_dir = make_bin(tmp_path, {"cosmicac": "echo '<html>[b]502[/b]</html>'\n"})
    resume_at(str(d), "verify", relay_key=KEY, restarted_at=1.0)
    settings = Settings(deployment=str(d), command_env={"PATH": path_with(bin_dir)}, poll_interval=0.1)
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        text = await wait_status(pilot, app, "verify", ("error",))
        assert "set [commands] list in the config" in text  # not eaten as a markup tag
        for _ in range(3):  # the same failing poll again and again
            await pilot.press("r")
            await asyncio.sleep(0.3)
            await wait_status(pilot, app, "verify", ("error",))
        assert "[b]502[/b]" in str(step(app, "verify").query_one("#verify-raw").render())
    log = progress_mod.journal_path(str(d)).read_text()
    assert log.count("$ cosmicac jobs list") == 1 and "same again" in log
    assert "  │ <html>[b]502[/b]</html>" in log and "└ exit 0 (ok)" in log
