"""Pilot tests for steps 5 (verify) and 6 (recover) against a scripted `cosmicac` on PATH."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from cosmictui.ops.config import Settings
from cosmictui.ops.session import relay_problem
from cosmictui.screens.confirm import ConfirmScreen
from cosmictui.widgets.step_list import StepList
from tests.e2e._wizard_support import (
    KEY,
    install_cosmicac,
    make_app,
    make_bin,
    path_with,
    relay_carried,
    resume_at,
    seed_jobs,
    snapshot_tree,
    status,
    step,
    wait_status,
    wait_until,
)


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def _deploy(tmp_path: Path, step_id: str, restarted_ago: float = 30.0) -> tuple[Path, Settings]:
    d = tmp_path / "deploy"
    d.mkdir()
    now = time.time()
    seed_jobs(
        d,
        [
            {
                "id": "job-001",
                "name": "llama train",
                "gpu": "a100",
                "created": now - 3600,
                "updated": now - 3600,
                "script": ["Creating"],
            },
            {
                "id": "job-002",
                "name": "notebook",
                "gpu": "h100",
                "created": now - 7200,
                "updated": now - 5,
                "script": ["Running"],
            },
        ],
        create_script=["Creating", "Creating", "Running"],
    )
    bin_dir = install_cosmicac(tmp_path)
    resume_at(str(d), step_id, relay_key=KEY, restarted_at=now - restarted_ago)
    return d, Settings(
        deployment=str(d),
        command_env={"PATH": path_with(bin_dir)},
        poll_interval=0.2,
        create_command="cosmicac jobs create --name {name} --gpu {gpu}",
        test_job_command="cosmicac jobs create --name relay-check --gpu small",
    )


def _cosmicac_calls(d: Path) -> list[str]:
    return [c for c in (d / "cosmicac.log").read_text().splitlines() if c != "jobs list"]


async def test_wizard_verify_marks_old_jobs_and_confirms_a_new_job_left_creating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    relay_carried(monkeypatch)
    d, settings = _deploy(tmp_path, "verify")
    app = make_app(settings)
    async with app.run_test(size=(100, 30)) as pilot:
        text = await wait_status(pilot, app, "verify", ("info",))
        assert "create one now" in text
        table = step(app, "verify").query_one("#verify-jobs")
        notes = [table.get_row_at(i)[3] for i in range(table.row_count)]
        assert all("no key" in n for n in notes)
        assert notes[0].endswith("stuck") and "stuck" not in notes[1]
        await pilot.press("n")  # nothing confirmed yet
        assert app.screen.index == 4
        await pilot.press("j")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the create confirmation")
        # The test job is the configured small one, never a copy of a stuck production job.
        assert app.screen.commands == ["cosmicac jobs create --name relay-check --gpu small"]
        assert "[commands] test_job" in str(app.screen.query_one("#confirm-body").render())
        await pilot.press("y")
        text = await wait_status(pilot, app, "verify", ("ok",), timeout=30)
        assert "job-100 left Creating (Running) and keeps updating" in text
        notes = {table.get_row_at(i)[0]: table.get_row_at(i)[3] for i in range(table.row_count)}
        assert notes["job-100"].startswith("NEW") and "no key" in notes["job-001"]
        await pilot.press("n")
        assert app.screen.index == 5
    assert _cosmicac_calls(d) == ["jobs create --name relay-check --gpu small"]


async def test_wizard_verify_cosmicac_missing_is_explained(tmp_path: Path) -> None:
    d, settings = _deploy(tmp_path, "verify")
    settings = settings.with_overrides(command_env={"PATH": path_with(None)})
    before = snapshot_tree(d)
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        text = await wait_status(pilot, app, "verify", ("error",))
        assert "`cosmicac` is not installed or not on PATH" in text and "Press r to retry" in text
        await pilot.press("n")
        assert app.screen.index == 4
    assert snapshot_tree(d) == before


async def test_wizard_verify_unreadable_jobs_output_shows_raw_text(tmp_path: Path) -> None:
    _, settings = _deploy(tmp_path, "verify")
    bin_dir = make_bin(tmp_path / "odd", {"cosmicac": "echo '<html>502 Bad Gateway</html>'\n"})
    app = make_app(settings.with_overrides(command_env={"PATH": path_with(bin_dir)}))
    async with app.run_test(size=(80, 24)) as pilot:
        text = await wait_status(pilot, app, "verify", ("error",))
        assert "Cannot read the jobs list" in text
        raw = step(app, "verify").query_one("#verify-raw")
        assert raw.has_class("-shown") and "502 Bad Gateway" in str(raw.render())


async def test_wizard_recover_deletes_and_recreates_selected_job_and_watches_it(tmp_path: Path) -> None:
    d, settings = _deploy(tmp_path, "recover")
    app = make_app(settings)
    async with app.run_test(size=(100, 30)) as pilot:
        text = await wait_status(pilot, app, "recover", ("info",))
        assert "1 stuck job(s)" in text
        fields = str(step(app, "recover").query_one("#recover-fields").render())
        command = str(step(app, "recover").query_one("#recover-command-text").render())
        assert "name: llama train" in fields and command == "cosmicac jobs create --name 'llama train' --gpu a100"
        await pilot.press("d")  # nothing selected: refused
        assert "Select at least one job" in status(app, "recover")
        picker = step(app, "recover").query_one("#recover-jobs")
        assert app.focused is picker
        # Selected or not is said by a glyph, not by colour alone.
        assert picker.render_line(0).text.startswith("[ ] job-001")
        await pilot.press("space")
        await pilot.pause()
        assert picker.render_line(0).text.startswith("[x] job-001")
        await pilot.press("d")
        await wait_until(
            pilot,
            lambda: isinstance(app.screen, ConfirmScreen) and app.screen.shown_commands(),
            "the delete confirmation",
        )
        shown = app.screen.shown_commands()
        assert shown[0] == "cosmicac jobs delete job-001" and app.screen.has_class("-danger")
        await pilot.press("escape")  # first: say no — nothing runs
        await pilot.pause()
        assert _cosmicac_calls(d) == [] and "Nothing deleted" in status(app, "recover")
        await pilot.press("d")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the delete confirmation")
        await pilot.press("y")
        text = await wait_status(pilot, app, "recover", ("ok",), timeout=30)
        assert "job-100 left Creating (Running)" in text
        # The list is reloaded afterwards; the verdict stays in the status line.
        recover = step(app, "recover")
        await wait_until(
            pilot, lambda: not [w for w in app.workers if w.node is recover and w.is_running], "the reload"
        )
        assert "job-100 left Creating (Running)" in status(app, "recover")
    assert _cosmicac_calls(d) == ["jobs delete job-001", "jobs create --name llama train --gpu a100"]
    ids = [j["id"] for j in json.loads((d / "jobs.json").read_text())["jobs"]]
    assert ids == ["job-002", "job-100"]


@pytest.mark.parametrize("size", [(80, 24), (60, 20)])
async def test_wizard_recover_says_which_new_job_replaces_each_stuck_one(tmp_path: Path, size: tuple[int, int]) -> None:
    d, settings = _deploy(tmp_path, "recover")
    now = time.time()
    stuck = {"gpu": "a100", "created": now - 3600, "updated": now - 3600, "script": ["Creating"]}
    seed_jobs(
        d,
        [{"id": "job-001", "name": "llama train"} | stuck, {"id": "job-002", "name": "eval"} | stuck],
        create_script=["Creating", "Running"],
    )
    app = make_app(settings)
    async with app.run_test(size=size) as pilot:
        text = await wait_status(pilot, app, "recover", ("info",))
        assert "2 stuck job(s)" in text, text
        await pilot.press("space", "down", "space", "d")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the delete confirmation")
        await pilot.press("y")
        await wait_status(pilot, app, "recover", ("ok", "error"), timeout=30)
        recover = step(app, "recover")
        await wait_until(
            pilot, lambda: not [w for w in app.workers if w.node is recover and w.is_running], "the reload"
        )
        box = recover.query_one("#recover-replaced")
        shown = str(box.render())
        assert "job-100 replaces job-001" in shown and "job-101 replaces job-002" in shown, shown
        # on screen without scrolling, above the list of stuck jobs (now empty)
        assert recover.body.content_region.contains_region(box.region), (box.region, recover.body.content_region)
    assert [j["id"] for j in json.loads((d / "jobs.json").read_text())["jobs"]] == ["job-100", "job-101"]


async def test_wizard_verify_slow_cli_is_not_cancelled_by_the_next_tick(tmp_path: Path) -> None:
    _, settings = _deploy(tmp_path, "verify")
    real = install_cosmicac(tmp_path) / "cosmicac"
    slow = make_bin(tmp_path / "slow", {"cosmicac": f'sleep 0.6\nexec "{real}" "$@"\n'})
    app = make_app(settings.with_overrides(command_env={"PATH": path_with(slow)}, poll_interval=0.1))
    async with app.run_test(size=(80, 24)) as pilot:
        text = await wait_status(pilot, app, "verify", ("info",))
        assert "create one now" in text and step(app, "verify").query_one("#verify-jobs").row_count == 2


async def test_wizard_resume_with_dead_relay_marks_step_2_and_refuses_recover(tmp_path: Path) -> None:
    """kill -9 on the relay leaves its runtime file; a resumed wizard must not trust step 2's ✔."""
    d, settings = _deploy(tmp_path, "recover")
    storage = tmp_path / "relay"
    storage.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs, as after kill -9
    runtime = {"pid": gone.pid, "key": KEY, "host": "127.0.0.1", "port": 49737, "metrics": None, "started_at": 1.0}
    (storage / "relay-runtime.json").write_text(json.dumps(runtime))
    app = make_app(settings.with_overrides(relay_storage=str(storage)), relay_check=relay_problem)
    async with app.run_test(size=(100, 30)) as pilot:
        text = await wait_status(pilot, app, "recover", ("error",))
        assert "is not running" in text and f"pid {gone.pid} is gone" in text and "step 2" in text
        assert app.screen.query_one(StepList).state_of(1) == "failed"
        assert "Step 2 needs attention" in [n.title for n in app._notifications]
        await pilot.press("space", "d")  # a recreated job would wait forever: refused
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        assert "Nothing deleted" in status(app, "recover")
        await pilot.press("n")
        assert "Finished" not in [n.title for n in app._notifications]
        await pilot.press("b")  # verify does not start watching either
        text = await wait_status(pilot, app, "verify", ("error",))
        assert "is not running" in text
    assert _cosmicac_calls(d) == []
