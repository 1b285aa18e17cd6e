"""What a first-time operator still tripped on, walking the wizard at 80x24 and 60x20 with the
keyboard alone: each test fails on the wizard before its fix."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from cosmictui.ops import relayproc
from cosmictui.ops.config import Settings
from tests.e2e._wizard_support import make_app, make_bin, path_with, still, wait_until

SIZES = [(80, 24), (60, 20)]


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def _local(tmp_path: Path, **kw: object) -> Settings:
    d = tmp_path / "deploy"
    d.mkdir(exist_ok=True)
    (d / ".env").write_text("A=1\n")
    bin_dir = make_bin(tmp_path, {"task": "echo ok\n", "cosmicac": "echo 'ID  STATUS'\n"})
    return Settings(
        deployment=str(d),
        relay_storage=str(tmp_path / "store"),
        command_env={"PATH": path_with(bin_dir)},
        relay_metrics="off",
        **kw,  # type: ignore[arg-type]
    )


async def test_the_kernel_forwarding_check_is_warmed_off_the_ui_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first `relay_command(None)` ran the ~0.2 s child-process check on the UI thread; the
    wizard now asks it in a worker thread as it starts, so composing a command finds it cached."""
    monkeypatch.setattr(relayproc, "_kernel_support", None)
    asked_on: list[threading.Thread] = []
    real = relayproc._ask_kernel_support

    def ask() -> tuple[bool, bool, str]:
        asked_on.append(threading.current_thread())
        return real()

    monkeypatch.setattr(relayproc, "_ask_kernel_support", ask)
    app = make_app(_local(tmp_path))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: relayproc._kernel_support is not None, "the check warmed", timeout=60)
        assert asked_on and all(t is not threading.main_thread() for t in asked_on), asked_on
        relayproc.relay_command(str(tmp_path / "store"), 49737, kernel_forwarding=None)
        assert len(asked_on) == 1  # cached: the UI thread never runs the child process


@pytest.mark.parametrize("size", SIZES)
async def test_the_first_tab_lands_on_a_field_and_a_focused_body_shows_it(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    """The first Tab gave the focus to the step's scrolling body, which looks the same focused or
    not, so the operator saw nothing happen; a second Tab reached the storage field."""
    from textual.widgets import Input

    from cosmictui.screens.step import StepBody
    from tests.e2e._wizard_support import resume_at

    settings = _local(tmp_path)
    resume_at(settings.deployment, "relay")
    app = make_app(settings)
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: app.screen.step.STEP_ID == "relay", "step 2 shown")  # type: ignore[attr-defined]
        await pilot.pause()
        await pilot.press("tab")
        await pilot.pause()
        assert isinstance(app.focused, Input) and app.focused.id == "relay-storage", app.focused
        # … and its label lights up (it stayed grey: `:focus-within` did not restyle the label)
        label = app.focused.parent.query_one(".field-label")  # type: ignore[union-attr]
        await wait_until(pilot, lambda: label.styles.background.a > 0, "the storage label lit")
        await pilot.press("escape")
        await wait_until(pilot, lambda: label.styles.background.a == 0, "the label unlit after esc")
        await pilot.press("b")  # step 1 has no field: its body takes the focus, visibly
        await wait_until(pilot, lambda: app.screen.step.STEP_ID == "prereqs", "step 1 shown")  # type: ignore[attr-defined]
        body = app.screen.step.body  # type: ignore[attr-defined]
        for _ in range(4):
            if app.focused is body:
                break
            await pilot.press("tab")
            await pilot.pause()
        assert isinstance(app.focused, StepBody), app.focused
        assert app.focused.styles.outline_left[0] != "", "a focused body looks focused"


@pytest.mark.parametrize("size", SIZES)
async def test_step5_says_its_verdict_once_uncovered_with_every_note_in_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    """Step 5 said "the relay works" in its status, again in the evidence box and a third time in a
    toast drawn over the status for seconds; at 60 columns the Note column ("old: no relay key ·
    stuck", "NEW (after restart)") was cut and scrolled only with the table focused."""
    import time

    from textual.widgets import Static
    from textual.widgets._toast import Toast

    from cosmictui.screens.confirm import ConfirmScreen
    from tests.e2e._wizard_support import relay_carried, seed_jobs, status, step, wait_status
    from tests.e2e.test_wizard_jobs import _deploy

    relay_carried(monkeypatch)
    d, settings = _deploy(tmp_path, "verify")
    now = time.time()  # the demo's shapes: ten-character ids, "Completed", a stuck old job
    seed_jobs(
        d,
        [
            {
                "id": f"job-7f3a2{i}",
                "name": "llama",
                "gpu": "a100",
                "created": now - 3600 * (i + 1),
                "updated": now - 3600,
                "script": [status],
            }
            for i, status in enumerate(["Creating", "Starting", "Completed"])
        ],
        create_script=["Creating", "Creating", "Running"],
    )
    app = make_app(settings)
    async with app.run_test(size=size) as pilot:
        await wait_status(pilot, app, "verify", ("info",))
        await pilot.press("j")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the create confirmation")
        await pilot.press("y")
        text = await wait_status(pilot, app, "verify", ("ok",), timeout=30)
        await pilot.pause()
        await pilot.pause(1)  # and still so after a few more lists
        evidence = str(step(app, "verify").query_one("#verify-evidence", Static).render())
        said = f"{text} {evidence}"
        assert said.count("the relay works") == 1 and "the relay works" in status(app, "verify"), said
        assert not app.screen.query(Toast), "a toast covers the status line"
        table = step(app, "verify").query_one("#verify-jobs")
        notes = [str(table.get_row_at(i)[3]) for i in range(table.row_count)]
        assert any(n.startswith("NEW") for n in notes) and any("stuck" in n for n in notes), notes
        assert table.max_scroll_x == 0, f"the table is cut at {size}: {table.virtual_size.width} > {table.size.width}"


@pytest.mark.parametrize("size", SIZES)
async def test_every_tab_stop_on_step6_shows_its_focus(tmp_path: Path, size: tuple[int, int]) -> None:
    """Tab on step 6 stopped on the box around "Recreate with" (the command wraps, so it never
    scrolls): nothing on screen changed, and the next key seemed lost. Each Tab stop now looks
    different focused (the screen is compared with nothing focused)."""
    import time

    from tests.e2e._wizard_support import KEY, install_cosmicac, resume_at, seed_jobs, status

    d = tmp_path / "deploy"
    d.mkdir()
    (d / ".env").write_text("A=1\n")
    now = time.time()
    seed_jobs(
        d,
        [
            {
                "id": "job-001",
                "name": "llama",
                "gpu": "a100",
                "created": now - 3600,
                "updated": now - 3600,
                "script": ["Creating"],
            }
        ],
    )
    bin_dir = install_cosmicac(tmp_path)
    resume_at(str(d), "recover", relay_key=KEY, restarted_at=now - 30)
    settings = Settings(
        deployment=str(d),
        command_env={"PATH": path_with(bin_dir)},
        relay_metrics="off",
        poll_interval=3600,
        create_command="cosmicac jobs create --name {name} --gpu {gpu}",
    )
    app = make_app(settings)
    async with app.run_test(size=size, notifications=False) as pilot:
        await wait_until(pilot, lambda: "stuck job" in status(app, "recover"), "step 6 listed the stuck job")
        await pilot.pause()

        async def shot() -> str:
            return await still(pilot)

        app.set_focus(None)
        unfocused = await shot()
        assert await shot() == unfocused  # the screen is still: a difference below is the focus
        stops = [w for w in app.screen.focus_chain if w.id not in ("back", "next")]
        assert "recover-command" not in [w.id for w in stops]
        for w in stops:
            w.focus()
            assert await shot() != unfocused, f"{type(w).__name__}#{w.id} has the focus and shows no sign of it"
            app.set_focus(None)


@pytest.mark.parametrize("size", SIZES)
async def test_a_dialog_shows_its_own_keys_and_a_cancel_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    """Behind the test-job dialog the wizard's footer still read "n Next … j Test job", where n
    answers No; Enter (on the focused Cancel) then closed it and step 5 said nothing at all."""
    import dataclasses

    from textual.widgets import Footer

    from cosmictui.screens.confirm import ConfirmScreen
    from tests.e2e._wizard_support import relay_carried, status, wait_status
    from tests.e2e.test_wizard_jobs import _deploy

    relay_carried(monkeypatch)
    _, settings = _deploy(tmp_path, "verify")
    # one list on entering the step, none after: the next list's verdict would replace the status
    app = make_app(dataclasses.replace(settings, poll_interval=3600))
    async with app.run_test(size=size) as pilot:
        await wait_status(pilot, app, "verify", ("info",))
        await pilot.press("j")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the create confirmation")
        await pilot.pause()
        footer = app.screen.query_one(Footer)  # the dialog's own, drawn over the wizard's
        assert footer.region.y == size[1] - 1 and footer.region.width == size[0]
        keys = {b.key: b.description for _, b, enabled, _ in app.screen.active_bindings.values() if enabled}
        assert keys.get("y") == "Create" and keys.get("escape") == "Cancel" and "j" not in keys, keys
        await pilot.press("enter")  # the focused button is Cancel
        await wait_until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), "the dialog closed")
        await wait_until(pilot, lambda: "No test job created" in status(app, "verify"), "the cancel said")
