"""Recovery loses nothing: the record is saved before any delete, delete & recreate only with a
known create command, a failing create after its delete leaves a banner until dismissed, and the
saved file is enough to recreate the job by hand. Against the scripted `cosmicac` on PATH."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from cosmictui.ops import progress as progress_mod
from cosmictui.ops.config import Settings
from cosmictui.ops.jobs.recover import recovery_dir
from cosmictui.screens.confirm import ConfirmScreen
from cosmictui.screens.edit_command import EditCommandScreen
from cosmictui.widgets.banner import Banner
from tests.e2e._wizard_support import (
    KEY,
    install_cosmicac,
    make_app,
    make_bin,
    path_with,
    resume_at,
    seed_jobs,
    status,
    step,
    wait_status,
    wait_until,
)


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def _deploy(tmp_path: Path, **settings: object) -> tuple[Path, Settings]:
    d = tmp_path / "deploy"
    d.mkdir()
    now = time.time()
    stuck = {"id": "job-001", "name": "llama train", "gpu": "a100", "created": now - 3600, "updated": now - 3600}
    seed_jobs(d, [stuck | {"script": ["Creating"]}], create_script=["Creating", "Running"])
    bin_dir = install_cosmicac(tmp_path)
    resume_at(str(d), "recover", relay_key=KEY, restarted_at=now - 30)
    env = {"PATH": path_with(bin_dir)}
    return d, Settings(deployment=str(d), command_env=env, poll_interval=0.2, relay_metrics="off", **settings)  # type: ignore[arg-type]


def _calls(d: Path) -> list[str]:
    return [c for c in (d / "cosmicac.log").read_text().splitlines() if c != "jobs list"]


def _records(d: Path) -> list[dict[str, object]]:
    folder = recovery_dir(str(d))
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


async def _select_and_confirm(pilot: object, app: object) -> str:
    await wait_status(pilot, app, "recover", ("info",))  # type: ignore[arg-type]
    await pilot.press("space", "d")  # type: ignore[attr-defined]
    await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the confirmation")  # type: ignore[arg-type,attr-defined]
    dialog = app.screen  # type: ignore[attr-defined]
    text = str(dialog.query_one("#confirm-body").render()) + "\n" + "\n".join(dialog.commands)
    await pilot.press("y")  # type: ignore[attr-defined]
    return text


async def test_failing_create_after_delete_leaves_a_banner_and_the_saved_file(tmp_path: Path) -> None:
    d, settings = _deploy(tmp_path, create_command="cosmicac jobs create --name {name} --gpu {gpu}")
    real = tmp_path / "bin" / "cosmicac"
    failing = make_bin(
        tmp_path / "failing",
        {"cosmicac": f'[ "$2" = create ] && {{ echo "error: bad flag" >&2; exit 64; }}\nexec "{real}" "$@"\n'},
    )
    app = make_app(settings.with_overrides(command_env={"PATH": path_with(failing)}))
    async with app.run_test(size=(80, 24)) as pilot:
        await _select_and_confirm(pilot, app)
        text = await wait_status(pilot, app, "recover", ("error",), timeout=30)
        assert "Job job-001 was DELETED and NOT recreated" in text and "exited 64" in text
        banner = app.screen.query_one(Banner)
        # the banner is raised by a message the step posts: a frame after the status, on a busy machine
        await wait_until(pilot, lambda: banner.has_class("-shown"), "the lost-job banner")
        shown = str(banner.render())
        assert banner.has_class("-shown") and "DELETED and NOT recreated" in shown
        assert "cosmicac jobs create --name 'llama train' --gpu a100" in shown
        records = _records(d)
        assert len(records) == 1 and str(recovery_dir(str(d))) in shown
        await pilot.press("r")  # polling and refreshing do not scroll it away
        await wait_status(pilot, app, "recover", ("ok", "info", "error"), timeout=30)
        assert banner.has_class("-shown")
        assert progress_mod.load_progress(str(d)).data["lost_jobs"]  # kept across runs, until dismissed
        await pilot.press("x")
        await pilot.pause()
        assert not banner.has_class("-shown") and "lost_jobs" not in progress_mod.load_progress(str(d)).data
    record = records[0]
    assert record["job"]["id"] == "job-001"  # type: ignore[index]
    assert record["job"]["fields"]["name"] == "llama train" and record["job"]["fields"]["gpu"] == "a100"  # type: ignore[index]
    assert record["recreate_command"] == "cosmicac jobs create --name 'llama train' --gpu a100"
    assert _calls(d) == ["jobs delete job-001"]  # the create was refused (exit 64) by the stand-in
    # The saved file is enough to recreate the job by hand.
    subprocess.run(record["recreate_command"], shell=True, cwd=d, env={"PATH": path_with(real.parent)}, check=True)  # type: ignore[arg-type]
    jobs = json.loads((d / "jobs.json").read_text())["jobs"]
    assert [(j["name"], j["gpu"]) for j in jobs] == [("llama train", "a100")]


async def test_without_a_known_create_command_recover_deletes_only_and_says_so(tmp_path: Path) -> None:
    d, settings = _deploy(tmp_path)  # no [commands] create
    app = make_app(settings)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_status(pilot, app, "recover", ("info",))
        fields = str(step(app, "recover").query_one("#recover-fields").render())
        assert "No known create command" in fields and "d deletes only" in fields
        text = await _select_and_confirm(pilot, app)
        assert "deleted only, and you recreate them" in text and "# job-001: delete only" in text
        text = await wait_status(pilot, app, "recover", ("warn", "ok"), timeout=30)
        assert "Recreate it yourself" in status(app, "recover") or "Recreate it yourself" in text
    assert _calls(d) == ["jobs delete job-001"]  # never a guessed create
    (record,) = _records(d)
    assert record["recreate_command"] is None and "recreate this job yourself" in str(record["note"])
    assert record["job"]["fields"]["name"] == "llama train"  # type: ignore[index]
    assert "{tags}" in str(record["draft_create_command"])  # the draft, for the operator to finish


async def test_a_reviewed_create_command_is_known_once_every_field_is_filled(tmp_path: Path) -> None:
    d, settings = _deploy(tmp_path)
    app = make_app(settings)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_status(pilot, app, "recover", ("info",))
        await pilot.press("e")
        await wait_until(pilot, lambda: isinstance(app.screen, EditCommandScreen), "the editor")
        editor = app.screen
        field = editor.query_one("#edit-command")
        assert "{tags}" in field.value  # type: ignore[attr-defined]
        await pilot.press("enter")  # placeholders left: refused
        assert isinstance(app.screen, EditCommandScreen)
        assert "Fill in" in str(editor.query_one("#edit-problem").render())
        field.value = "cosmicac jobs create --name 'llama train' --gpu a100"  # type: ignore[attr-defined]
        await pilot.press("enter")
        await wait_until(pilot, lambda: not isinstance(app.screen, EditCommandScreen), "the editor closes")
        assert "(your reviewed command)" in str(step(app, "recover").query_one("#recover-fields").render())
        await _select_and_confirm(pilot, app)
        text = await wait_status(pilot, app, "recover", ("ok", "error"), timeout=30)
        assert "left Creating" in text, text
    assert _calls(d) == ["jobs delete job-001", "jobs create --name llama train --gpu a100"]
    (record,) = _records(d)
    assert record["recreate_source"] == "operator"


async def test_a_record_that_cannot_be_saved_deletes_nothing_and_says_how_to_fix_it(tmp_path: Path) -> None:
    """Step 6 runs the same recover loop as `jobs recover`: no record on disk, no delete, and the fix."""
    d, settings = _deploy(tmp_path, create_command="cosmicac jobs create --name {name} --gpu {gpu}")
    blocker = recovery_dir(str(d))
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("")  # where the records go is a file: nothing can be saved there
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await _select_and_confirm(pilot, app)
        text = await wait_status(pilot, app, "recover", ("error",), timeout=30)
        assert "Could not save job job-001's record" in text and "not deleted" in text
        assert "Fix:" in text and "XDG_STATE_HOME" in text
    assert _calls(d) == []  # not one delete ran


@pytest.mark.parametrize("size", [(80, 24), (60, 20)])
async def test_the_create_editor_opens_with_the_cursor_at_the_end_and_nothing_selected(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    """The first key typed adds to the command: it never replaces the whole draft (a `q` then Enter
    saved "q" as the create command)."""
    _d, settings = _deploy(tmp_path)
    app = make_app(settings)
    async with app.run_test(size=size) as pilot:
        await wait_status(pilot, app, "recover", ("info",))
        await pilot.press("e")
        await wait_until(pilot, lambda: isinstance(app.screen, EditCommandScreen), "the editor")
        field = app.screen.query_one("#edit-command")
        draft = field.value  # type: ignore[attr-defined]
        await wait_until(pilot, lambda: app.focused is field, "the field has the focus")
        assert field.selection.is_empty and field.cursor_position == len(draft), field.selection  # type: ignore[attr-defined]
        # the view opens where the cursor is: at the end of a draft wider than the field
        assert field.max_scroll_x > 0  # type: ignore[attr-defined]
        await wait_until(
            pilot,
            lambda: field.scroll_offset.x == field.max_scroll_x,  # type: ignore[attr-defined]
            f"the view at the end (scrolled {field.scroll_offset.x} of {field.max_scroll_x})",  # type: ignore[attr-defined]
            timeout=5,
        )
        await pilot.press("q")
        assert field.value == draft + "q", field.value  # type: ignore[attr-defined]
        await pilot.press("enter")  # placeholders left: refused, and the draft is still there
        assert isinstance(app.screen, EditCommandScreen) and field.value.startswith(draft)  # type: ignore[attr-defined]


@pytest.mark.parametrize("size", [(80, 24), (60, 20)])
async def test_the_verdict_after_recreating_two_jobs_names_each(tmp_path: Path, size: tuple[int, int]) -> None:
    """Both recreated jobs are watched until each left Creating, and the verdict names both (it named
    the first to get there and stopped watching the other)."""
    d, settings = _deploy(tmp_path, create_command="cosmicac jobs create --name {name} --gpu {gpu}")
    now = time.time()
    stuck = {"gpu": "a100", "created": now - 3600, "updated": now - 3600, "script": ["Creating"]}
    seed_jobs(
        d,
        [{"id": "job-001", "name": "llama train"} | stuck, {"id": "job-002", "name": "eval"} | stuck],
        create_script=["Creating", "Running"],
    )
    app = make_app(settings)
    async with app.run_test(size=size) as pilot:
        await wait_status(pilot, app, "recover", ("info",))
        await pilot.press("space", "down", "space", "d")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the delete confirmation")
        await pilot.press("y")
        text = await wait_status(pilot, app, "recover", ("ok", "error"), timeout=30)
        assert "Job job-100 left Creating (Running)" in text and "Job job-101 left Creating (Running)" in text, text


@pytest.mark.parametrize("size", [(80, 24), (60, 20)])
async def test_keys_typed_in_one_burst_select_before_d_reads_the_selection(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    """Space then d arriving together (a fast typist, a paste, tmux send-keys): d asks about every job
    the list shows ticked. Space used to toggle through a message queued behind the d, so d asked
    about the jobs ticked before it, while the list went on to show both ticked."""
    from textual import events

    d, settings = _deploy(tmp_path, create_command="cosmicac jobs create --name {name} --gpu {gpu}")
    now = time.time()
    stuck = {"gpu": "a100", "created": now - 3600, "updated": now - 3600, "script": ["Creating"]}
    seed_jobs(d, [{"id": "job-001", "name": "llama train"} | stuck, {"id": "job-002", "name": "eval"} | stuck])
    app = make_app(settings)
    async with app.run_test(size=size) as pilot:
        await wait_status(pilot, app, "recover", ("info",))
        await pilot.press("space", "down")
        for key, char in (("space", " "), ("d", "d")):  # posted together, as a terminal delivers a burst
            app.post_message(events.Key(key, char))
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the delete confirmation")
        shown = "\n".join(app.screen.commands)
        assert "job-001" in shown and "job-002" in shown, shown
        await pilot.press("escape")
