"""A first-time operator at 80×24 and 60×20: every proof reachable from the keyboard, focus that
cannot be mistaken, no false green in step 5, ticks that follow the evidence on resume and after
a cancelled apply.

The relay's process and network are stood in for where the test is about the screen (its
layout, its keys); the demo's real relay is walked in a real terminal in test_wizard_tty.py.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
from textual.widgets import Input
from textual.widgets._footer import FooterKey

from cosmictui.ops import progress as progress_mod
from cosmictui.ops.config import Settings
from cosmictui.ops.metrics import probe as probe_mod
from cosmictui.ops.metrics.probe import ProbeResult
from cosmictui.ops.relayproc import RelayRuntime
from cosmictui.ops.setup import relayup
from cosmictui.ops.setup.checks import CheckResult
from cosmictui.screens import step_relay
from cosmictui.screens.step import StepStatus
from cosmictui.screens.step_verify import JobsTable
from cosmictui.widgets.check_row import CheckRow
from cosmictui.widgets.command_log import CommandLog
from cosmictui.widgets.step_list import StepList
from tests.e2e._wizard_support import (
    ENV_VAR,
    KEY,
    install_cosmicac,
    make_app,
    make_bin,
    path_with,
    relay_carried,
    resume_at,
    seed_jobs,
    status,
    status_kind,
    step,
    wait_status,
    wait_until,
)

SIZES = [(80, 24), (60, 20)]


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def _stand_in_relay(monkeypatch: pytest.MonkeyPatch, storage: Path) -> RelayRuntime:
    """`s` starts "a relay" that is this test process (a live pid), with a key and a port."""
    rt = RelayRuntime(
        pid=os.getpid(),
        key=KEY,
        host="127.0.0.1",
        port=49737,
        metrics=None,
        started_at=time.time(),
        version="test",
        storage=str(storage),
    )

    async def start_relay(*_a: object, **_k: object) -> RelayRuntime:
        return rt

    async def reach(*_a: object, **_k: object) -> list[CheckResult]:
        return [
            CheckResult("DHT reachable, port open", "ok", "bootstrapped, 5 nodes, firewalled: no"),
            CheckResult("Relay answers from localhost", "ok", "127.0.0.1:49737 answered a PING in 1 ms"),
        ]

    async def probe(key: str, *_a: object, **_k: object) -> ProbeResult:
        return ProbeResult(relay_key=key, ok=True, relayed=True, relay_address="127.0.0.1:49737", rtt_ms=2.0)

    monkeypatch.setattr(step_relay.relayproc, "start_relay", start_relay)
    # other relays on this (shared) machine are not this test's: no key-change warning about them
    monkeypatch.setattr(step_relay.relayproc, "running_relays", lambda: [])
    monkeypatch.setattr(relayup, "relay_reach_checks", reach)
    monkeypatch.setattr(probe_mod, "run_probe", probe)
    return rt


def _relay_setup(tmp_path: Path) -> tuple[Path, Settings]:
    d = tmp_path / "deploy"
    d.mkdir()
    storage = tmp_path / "relay-storage"
    resume_at(str(d), "relay")
    # a free port: another relay on this shared machine may hold the default one (step 2 checks it)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings(deployment=str(d), relay_storage=str(storage), relay_metrics="off", relay_port=port)
    return storage, settings


def _inside(app: object, widget: object) -> bool:
    body = step(app, "relay").body  # type: ignore[arg-type]
    return body.content_region.contains_region(widget.region)  # type: ignore[attr-defined]


@pytest.mark.parametrize("size", SIZES)
async def test_step2_probe_row_is_reachable_after_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    storage, settings = _relay_setup(tmp_path)
    _stand_in_relay(monkeypatch, storage)
    app = make_app(settings)
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: "Press s to start it" in status(app, "relay"), "the relay step")
        await pilot.press("s")
        await wait_status(pilot, app, "relay", ("ok",))
        rows = {r.result.name: r for r in step(app, "relay").query(CheckRow)}
        answers, probe = rows["Relay answers from localhost"], rows["Relay carries a connection (probe)"]
        # End reaches the bottom, Home the top, PgUp/PgDn page: the keyboard alone shows everything.
        await pilot.press("end")
        await wait_until(pilot, lambda: _inside(app, probe), f"probe row {probe.region} in view after End")
        await pilot.press("home")
        await wait_until(pilot, lambda: step(app, "relay").body.scroll_y == 0, "Home back at the top")
        for _ in range(8):
            await pilot.press("pagedown")
        await wait_until(pilot, lambda: _inside(app, answers) or _inside(app, probe), "PgDn reached the rows")
        await pilot.press("end")
        await wait_until(pilot, lambda: _inside(app, answers) and _inside(app, probe), "both rows in view")


def _shown(field: Input) -> str:
    """What the field draws (its own rendering, as the terminal gets it)."""
    return field.render_line(0).text.rstrip()


@pytest.mark.parametrize("size", SIZES)
async def test_a_long_storage_path_keeps_its_last_directory_in_view_and_is_edited_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    d = tmp_path / "deploy"
    d.mkdir()
    resume_at(str(d), "relay")
    storage = str(tmp_path / "srv" / "cosmicac-production-eu-west" / "relay" / "blind-relay-storage")
    app = make_app(Settings(deployment=str(d), relay_storage=storage, relay_metrics="off"))
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: "Press s to start it" in status(app, "relay"), "the relay step")
        field = step(app, "relay").query_one("#relay-storage", Input)
        width = field.scrollable_content_region.width
        assert len(storage) > width  # the point: it does not fit
        # unfocused: its start, … and its last directory, within the field
        await wait_until(pilot, lambda: _shown(field).endswith("/blind-relay-storage"), f"the end: {_shown(field)!r}")
        shown = _shown(field)
        assert shown.startswith(storage[:6]) and "…" in shown and len(shown) <= width, (shown, width)
        assert field.size.height == 1 and _inside(app, field)
        for _ in range(6):
            if field.has_focus:
                break
            await pilot.press("tab")
        assert field.has_focus
        # focused: the full value, opened at its end (the cursor), edited as a whole
        await wait_until(pilot, lambda: _shown(field).endswith("blind-relay-storage"), f"at the end: {_shown(field)!r}")
        assert "…" not in _shown(field)
        await pilot.press("backspace", *"Storage")
        await wait_until(pilot, lambda: field.value == storage[:-1] + "Storage", f"edited: {field.value!r}")
        assert _shown(field).endswith("blind-relay-storagStorage")  # the cursor end is in view
        await pilot.press("escape")
        await wait_until(pilot, lambda: not field.has_focus, "left the field")
        await wait_until(
            pilot, lambda: _shown(field).endswith("…/blind-relay-storagStorage"), f"elided again: {_shown(field)!r}"
        )
        assert field.value == storage[:-1] + "Storage"  # nothing of the value was lost to the display


@pytest.mark.parametrize("size", SIZES)
async def test_c_in_focused_storage_field_leaves_the_running_relay_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    storage, settings = _relay_setup(tmp_path)
    rt = _stand_in_relay(monkeypatch, storage)
    app = make_app(settings)
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: "Press s to start it" in status(app, "relay"), "the relay step")
        await pilot.press("s")
        await wait_status(pilot, app, "relay", ("ok",))
        field = step(app, "relay").query_one("#relay-storage", Input)
        for _ in range(6):
            if field.has_focus:
                break
            await pilot.press("tab")
        assert field.has_focus
        # The focused field says so in the footer: how to leave it.
        await wait_until(
            pilot,
            lambda: any(k.key == "escape" and "field" in k.description for k in app.screen.query(FooterKey)),
            "the footer's way out of the field",
        )
        await pilot.press("c")
        await pilot.pause()
        assert field.value == f"{storage}c"  # typed at the end, the path was not replaced by "c"
        state = str(step(app, "relay").query_one("#relay-state").render())
        assert f"pid {rt.pid}" in state, state  # the relay still runs and is still shown
        assert rt.key in str(step(app, "relay").query_one("#relay-key").render())
        assert "new key" in state.lower() or "new key" in status(app, "relay").lower()
        await pilot.press("escape")  # leaves the field; the step's keys work again
        await pilot.pause()
        assert not field.has_focus
        await pilot.press("c")
        await pilot.pause()
        assert app.clipboard == rt.key and field.value == f"{storage}c"


def _verify_setup(tmp_path: Path, stuck_before: int = 0) -> Settings:
    """A deployment at step 5 with one new job about to leave Creating (after `stuck_before`
    jobs from before the restart, stuck in Creating)."""
    d = tmp_path / "deploy"
    d.mkdir()
    now = time.time()
    (d / ".env").write_text(f"{ENV_VAR}='[\"{KEY}\"]'\n")
    old: list[dict[str, object]] = [
        {"id": f"job-00{i}", "name": "old", "gpu": "small", "created": now - 3600, "updated": now - 3600}
        | {"script": ["Creating"]}
        for i in range(1, stuck_before + 1)
    ]
    seed_jobs(
        d,
        [
            *old,
            {
                "id": "job-100",
                "name": "new",
                "gpu": "small",
                "created": now - 5,
                "updated": now - 5,
                "script": ["Creating", "Running"],
            },
        ],
    )
    bin_dir = install_cosmicac(tmp_path)
    resume_at(str(d), "verify", relay_key=KEY, restarted_at=now - 60)
    return Settings(deployment=str(d), command_env={"PATH": path_with(bin_dir)}, poll_interval=0.1)


def _relay_saw(monkeypatch: pytest.MonkeyPatch, pairings: int, relayed: int) -> None:
    relay_carried(monkeypatch, carried=pairings > 0 and relayed > 0)


@pytest.mark.parametrize("size", SIZES)
async def test_left_creating_while_the_relay_saw_nothing_is_no_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    settings = _verify_setup(tmp_path)
    _relay_saw(monkeypatch, 0, 0)
    app = make_app(settings)
    async with app.run_test(size=size) as pilot:
        await wait_until(
            pilot, lambda: "not through this relay" in status(app, "verify"), "the job left Creating", timeout=30
        )
        verify = step(app, "verify")
        assert not verify.done and status_kind(app, "verify") == "warn"
        assert "the relay works" not in status(app, "verify").lower()
        assert app.screen.query_one(StepList).state_of(4) != "done"
        text = status(app, "verify")
        assert "left Creating" in text and "What to check: below" in text, text
        advice = str(verify.query_one("#verify-evidence").render())
        assert "relays variable" in advice and "step 4" in advice, advice
        assert not progress_mod.load_progress(settings.deployment).is_done("verify")
        await pilot.press("n")
        assert app.screen.index == 4


@pytest.mark.parametrize("size", SIZES)
async def test_not_through_this_relay_leaves_the_new_row_in_view_and_the_advice_below(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    settings = _verify_setup(tmp_path, stuck_before=2)
    _relay_saw(monkeypatch, 0, 0)
    app = make_app(settings)
    async with app.run_test(size=size) as pilot:
        await wait_until(
            pilot, lambda: "not through this relay" in status(app, "verify"), "the job left Creating", timeout=30
        )
        await pilot.pause()
        verify = step(app, "verify")
        body, table = verify.body, verify.query_one(JobsTable)
        line = verify.query_one(StepStatus)
        # the NEW row is on screen as the step opens: no End, no PgDn
        row = next(i for i, v in enumerate(table.views) if v.job.id == "job-100")
        y = table.region.y + table.header_height + row - round(table.scroll_y)
        assert body.content_region.y <= y < min(body.content_region.bottom, line.region.y), (y, body.content_region)
        assert line.region.height <= 3, (line.region, status(app, "verify"))  # the verdict, in short
        # the what-to-check advice is below the jobs, reachable with PgDn
        for _ in range(5):
            await pilot.press("pagedown")
            await pilot.pause()
        evidence = verify.query_one("#verify-evidence")
        assert "relays variable" in str(evidence.render())
        assert body.content_region.contains_region(evidence.region), (evidence.region, body.content_region)


async def test_left_creating_and_the_relay_carried_it_ticks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _verify_setup(tmp_path)
    _relay_saw(monkeypatch, 1, 4096)
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        text = await wait_status(pilot, app, "verify", ("ok",), timeout=30)
        assert "relay carried" in text and "the relay works" in text
        assert step(app, "verify").done


def _full_deploy(tmp_path: Path, task_body: str = "echo ok\n") -> tuple[Path, Settings]:
    d = tmp_path / "deploy"
    d.mkdir()
    (d / ".env").write_text(f"{ENV_VAR}='[\"{KEY}\"]'\n")
    bin_dir = make_bin(tmp_path, {"task": task_body, "cosmicac": "echo 'ID  STATUS'\n"})
    return d, Settings(
        deployment=str(d), command_env={"PATH": path_with(bin_dir)}, relay_metrics="off", poll_interval=0.2
    )


# Saved as if the operator quit at this step after doing the ones before (restart after the .env write).
EXPECTED_TICKS = {
    "prereqs": [],
    "relay": [0],
    "env": [0, 1],
    "apply": [0, 1, 2],
    "verify": [0, 1, 2, 3],
    "recover": [0, 1, 2, 3, 4],
}


@pytest.mark.parametrize("size", SIZES)
async def test_resume_after_quitting_at_every_step_shows_the_right_ticks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    for at, ticks in EXPECTED_TICKS.items():
        root = tmp_path / at
        root.mkdir()
        monkeypatch.setenv("XDG_STATE_HOME", str(root / "state"))
        d, settings = _full_deploy(root)
        resume_at(str(d), at, relay_key=KEY, relay_storage=str(root / "store"), restarted_at=time.time() - 30)
        app = make_app(settings)
        async with app.run_test(size=size) as pilot:
            index = list(EXPECTED_TICKS).index(at)
            await wait_until(pilot, lambda app=app, index=index: app.screen.index == index, f"resumed at {at}")
            steps = app.screen.query_one(StepList)

            def ticked(steps: StepList = steps) -> list[int]:
                return [i for i in range(6) if steps.state_of(i) == "done"]

            await wait_until(pilot, lambda ticks=ticks, ticked=ticked: ticked() == ticks, f"ticks {ticks} at {at}")
            # A ticked step passes Next: never "✔ 4" beside "Both commands must succeed first".
            for i in ticks:
                assert app.screen.steps[i].validate_step() is None, (at, i, app.screen.steps[i].validate_step())


async def test_resume_takes_back_ticks_the_evidence_no_longer_backs(tmp_path: Path) -> None:
    d, settings = _full_deploy(tmp_path)
    # The history says 1-5 were done, but the .env lists another key now: 3, 4 and 5 are not.
    (d / ".env").write_text(f"{ENV_VAR}='[]'\n")
    resume_at(str(d), "recover", relay_key=KEY, relay_storage=str(tmp_path / "store"), restarted_at=time.time() - 30)
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        steps = app.screen.query_one(StepList)
        await wait_until(
            pilot,
            lambda: [i for i in range(6) if steps.state_of(i) == "done"] == [0, 1],
            f"ticks 1 and 2 only: now {[steps.state_of(i) for i in range(6)]}",
        )


@pytest.mark.parametrize("size", SIZES)
async def test_a_cancelled_apply_takes_back_steps_5_and_6(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    gate = tmp_path / "never"
    d, settings = _full_deploy(tmp_path, f'echo started\nwhile [ ! -e "{gate}" ]; do sleep 0.05; done\n')
    resume_at(str(d), "apply", relay_key=KEY, relay_storage=str(tmp_path / "store"), restarted_at=time.time() - 30)
    p = progress_mod.load_progress(str(d))
    for sid in ("apply", "verify", "recover"):
        p.complete(sid)  # as after an earlier, good run
    p.data["verified"] = {"relay_key": KEY, "restart": p.restarted_at}
    progress_mod.save_progress(p)
    app = make_app(settings)
    async with app.run_test(size=size) as pilot:
        steps = app.screen.query_one(StepList)
        await wait_until(pilot, lambda: steps.state_of(4) == "done", "5 ticked from the earlier run")
        await pilot.press("r")
        await wait_until(pilot, lambda: step(app, "apply").busy, "apply running")
        await pilot.press("escape")
        await wait_until(pilot, lambda: not step(app, "apply").busy, "apply cancelled")
        await wait_until(
            pilot,
            lambda: [steps.state_of(i) for i in (4, 5)] == ["pending", "pending"],
            f"5 and 6 taken back: now {[steps.state_of(i) for i in range(6)]}",
        )
        saved = progress_mod.load_progress(str(d))
        assert not saved.is_done("apply") and not saved.is_done("verify") and not saved.is_done("recover")
        await pilot.press("n")
        assert app.screen.index == 3


async def test_an_expected_fallback_is_not_logged_as_failed(tmp_path: Path) -> None:
    """`task --list-all --json` failing (a go-task without --json, like the demo's stand-in) is a
    fallback the check expects: it reads the Taskfile, passes, and the log says so, not FAILED."""
    from tests.e2e.test_wizard_contract import TASKFILE

    d = tmp_path / "deploy"
    d.mkdir()
    (d / "Taskfile.yml").write_text(TASKFILE)
    task = 'if [ "$*" = "--list-all --json" ]; then echo "unknown flag: --json" >&2; exit 201; fi\necho ok\n'
    bin_dir = make_bin(tmp_path, {"task": task, "cosmicac": "echo 'ID  STATUS'\n"})
    settings = Settings(
        deployment=str(d),
        relay_storage=str(tmp_path / "store"),
        command_env={"PATH": path_with(bin_dir)},
        relay_metrics="off",
    )
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_status(pilot, app, "prereqs", ("ok", "warn", "error"), timeout=30)
        rows = {r.result.name: r.result for r in step(app, "prereqs").query(CheckRow)}
        contract = next(r for name, r in rows.items() if "task" in name.lower() or "Taskfile" in r.detail)
        assert contract.status == "ok", contract
        log = app.screen.query_one(CommandLog).transcript()
        assert "$ task --list-all --json" in log and "exit 201 (expected: the Taskfile is read instead)" in log, log
        assert "FAILED" not in log, log


@pytest.mark.parametrize("size", SIZES)
async def test_q_in_the_monitor_opened_from_the_wizard_goes_back_to_the_wizard(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    """Inside the wizard the monitor is one screen of it: q closes it (its footer says `q Back`, whole)
    and the wizard goes on where it was; it never quits the wizard (nor tears a demo down)."""
    from cosmictui.screens.monitor import MonitorScreen
    from cosmictui.screens.wizard import WizardScreen

    d = tmp_path / "deploy"
    d.mkdir()
    resume_at(str(d), "relay")
    app = make_app(Settings(deployment=str(d), relay_storage=str(tmp_path / "store"), relay_metrics="127.0.0.1:9"))
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: app.screen.index == 1, "step 2")
        await pilot.press("m")
        await wait_until(pilot, lambda: isinstance(app.screen, MonitorScreen), "the monitor")
        monitor = app.screen

        def back_shown() -> bool:
            keys = list(app.screen.query(FooterKey))
            q = next((k for k in keys if k.key == "q"), None)
            # whole, inside the screen, and nothing (the palette's entry) drawn over it
            return (
                q is not None
                and q.description == "Back"
                and 0 < q.region.right <= size[0]
                and not any(k is not q and k.region.overlaps(q.region) for k in keys)
            )

        await wait_until(pilot, back_shown, f"q Back whole in the monitor's footer at {size}")
        await pilot.press("q")
        await wait_until(pilot, lambda: isinstance(app.screen, WizardScreen), "back in the wizard")
        assert app.is_running and app.return_code is None and app.screen.index == 1
        assert not monitor.is_attached  # closed, its polling with it
        await pilot.press("m")  # and it opens again
        await wait_until(pilot, lambda: isinstance(app.screen, MonitorScreen), "the monitor again")
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, WizardScreen), "back in the wizard (esc)")
        assert app.is_running


@pytest.mark.parametrize("size", SIZES)
async def test_a_path_typed_with_no_field_focused_goes_into_the_storage_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    from cosmictui.screens.confirm import ConfirmScreen

    storage, settings = _relay_setup(tmp_path)
    _stand_in_relay(monkeypatch, storage)
    app = make_app(settings)
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: "Press s to start it" in status(app, "relay"), "the relay step")
        assert not isinstance(app.focused, Input)
        await pilot.press(*"/srv/relay")  # the s of /srv must not start anything
        await pilot.pause()
        field = step(app, "relay").query_one("#relay-storage", Input)
        assert field.has_focus and field.value == "/srv/relay"
        assert not isinstance(app.screen, ConfirmScreen) and step(app, "relay").runtime is None


async def test_the_quit_question_follows_the_command_it_names(tmp_path: Path) -> None:
    """Asked while apply runs, the question says so once the command has ended, not "still running"."""
    from cosmictui.screens.confirm import ConfirmScreen

    gate = tmp_path / "go"
    d, settings = _full_deploy(tmp_path, f'echo started\nwhile [ ! -e "{gate}" ]; do sleep 0.05; done\n')
    resume_at(str(d), "apply", relay_key=KEY, relay_storage=str(tmp_path / "store"), restarted_at=time.time() - 30)
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("r")
        await wait_until(pilot, lambda: step(app, "apply").busy, "apply running")
        await pilot.press("q")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the quit question")
        question = app.screen
        assert isinstance(question, ConfirmScreen) and "still running" in question.body
        gate.touch()  # both commands end while the question is open
        await wait_until(pilot, lambda: "Nothing runs" in question.body, "the question restated", timeout=30)
        assert "still running" not in str(question.query_one("#confirm-body").render())
        await pilot.press("y")
        await wait_until(pilot, lambda: not app.is_running, "the app to exit")


async def test_next_past_cannot_tell_leaves_step_5_unticked(tmp_path: Path) -> None:
    """The relay's numbers cannot be read (metrics off): Next may go on, but 5 is never ticked."""
    settings = _verify_setup(tmp_path).with_overrides(relay_metrics="off")
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(
            pilot, lambda: "Cannot tell" in status(app, "verify"), "left Creating, relay unknown", timeout=30
        )
        assert status_kind(app, "verify") == "warn"
        assert "the relay works" not in status(app, "verify").lower() and not step(app, "verify").done
        await pilot.press("n")
        await wait_until(pilot, lambda: app.screen.index == 5, "on to step 6")
        assert app.screen.query_one(StepList).state_of(4) != "done"
        assert not progress_mod.load_progress(settings.deployment).is_done("verify")
