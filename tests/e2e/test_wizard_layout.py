"""Layout rules no snapshot can state: everything a step shows can be scrolled into view.

Step 1 at 80×24 has more checks than fit; the status line under the body must never cover
the last ones (it once did: the status was docked inside the scrolling area).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from textual.containers import ScrollableContainer
from textual.widgets._footer import FooterKey

from cosmictui.ops.config import Settings
from cosmictui.ops.setup.checks import CheckResult
from cosmictui.screens.step import StepStatus
from cosmictui.widgets.check_row import CheckRow
from tests.e2e._wizard_support import make_app, step, wait_status, wait_until

CHECKS = [
    CheckResult("Relay runs here", "ok", "Python relay 0.1.0; Ed25519 + Noise XX self-test passed"),
    CheckResult("UDP port 49737", "fail", "held by pid 4242 (node)", "stop it, or choose another port"),
    CheckResult("Free memory", "ok", "3120 MB available (the relay needs up to 200 MB)"),
    CheckResult("Storage directory", "warn", "./corestore is relative", "use /var/lib/blind-relay"),
    CheckResult("DHT reachable, port open", "warn", "not known until the relay runs", "start the relay"),
    CheckResult("Deployment host reachable", "ok", "localhost: /srv/cosmicac"),
    CheckResult("Relay answers from localhost", "warn", "not yet: the relay is not running", ""),
]


async def test_wizard_layout_last_check_scrolls_into_view_above_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    async def fixed(*_a: object, **_k: object) -> list[CheckResult]:
        return CHECKS

    monkeypatch.setattr("cosmictui.screens.step_prereqs.gather_checks", fixed)
    (tmp_path / "deploy").mkdir()
    app = make_app(Settings(deployment=str(tmp_path / "deploy"), relay_storage=str(tmp_path / "relay")), save=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_status(pilot, app, "prereqs", ("error",))
        prereqs = step(app, "prereqs")
        scroller = next(iter(prereqs.query(".step-body")), prereqs)
        assert isinstance(scroller, ScrollableContainer)
        status = prereqs.query_one(StepStatus)
        # The scrolling area (and so its scrollbar) ends where the status line begins.
        assert not scroller.region.overlaps(status.region), (scroller.region, status.region)
        assert scroller.max_scroll_y > 0  # more checks than fit: the point of the test
        # PgDn reaches the end from the keyboard, wherever the focus is.
        for _ in range(10):
            await pilot.press("pagedown")
            await pilot.pause()
        await wait_until(pilot, lambda: scroller.scroll_y == scroller.max_scroll_y, "PgDn reached the end")
        last = list(prereqs.query(CheckRow))[-1]
        assert last.result.name == "Relay answers from localhost"
        assert scroller.content_region.contains_region(last.region), (last.region, scroller.content_region)
        assert last.region.bottom <= status.region.y


@pytest.mark.parametrize("size", [(80, 24), (60, 20)])
async def test_wizard_layout_footer_keeps_quit_monitor_and_step_keys_at_80_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    async def fixed(*_a: object, **_k: object) -> list[CheckResult]:
        return CHECKS[:1]

    monkeypatch.setattr("cosmictui.screens.step_prereqs.gather_checks", fixed)
    (tmp_path / "deploy").mkdir()
    settings = Settings(
        deployment=str(tmp_path / "deploy"), relay_storage=str(tmp_path / "relay"), command_env={"PATH": "/nonexistent"}
    )
    app = make_app(settings, save=False)
    async with app.run_test(size=size) as pilot:
        screen = app.screen
        for index, s in enumerate(screen.steps):
            await screen._show(index)
            await wait_until(pilot, lambda s=s: not s.busy, f"step {index + 1} idle")
            width = size[0]
            wanted = {"q": "Quit", "m": "Monitor", "n": "Next", "l": "Log"} | {
                b.key: b.description for b in s.STEP_BINDINGS if b.show and s.has_action(b.action[6:-2])
            }

            def missing(wanted: dict[str, str] = wanted, width: int = width) -> dict[str, str]:
                keys = screen.query(FooterKey)
                shown = {k.key: k.description for k in keys if k.region.right <= width and k.region.width}
                return {k: v for k, v in wanted.items() if shown.get(k) != v}

            # The footer recomposes after the step's bindings change: wait for it (one pause is not
            # enough on a loaded machine), then state what is still missing.
            with contextlib.suppress(AssertionError):
                await wait_until(pilot, lambda: not missing(), "footer settled", timeout=10)
            gone = missing()
            assert not gone, f"step {index + 1} ({s.TITLE}): not in the footer at {width} columns: {gone}"
        last = screen.index
        await pilot.press("b")  # shown in the footer or only on the nav bar's button: b goes back
        await wait_until(pilot, lambda: screen.index == last - 1, "b went back")


async def test_wizard_layout_failed_check_below_the_fold_is_scrolled_into_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    late_failure = [
        *CHECKS[:1],
        *CHECKS[2:],
        CheckResult("Relay answers from 10.0.0.7", "fail", "no reply", "open UDP"),
    ]

    async def fixed(*_a: object, **_k: object) -> list[CheckResult]:
        return late_failure

    monkeypatch.setattr("cosmictui.screens.step_prereqs.gather_checks", fixed)
    (tmp_path / "deploy").mkdir()
    app = make_app(Settings(deployment=str(tmp_path / "deploy"), relay_storage=str(tmp_path / "relay")), save=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_status(pilot, app, "prereqs", ("error",))
        await pilot.pause()
        prereqs = step(app, "prereqs")
        failed = next(r for r in prereqs.query(CheckRow) if r.result.status == "fail")
        assert prereqs.body.max_scroll_y > 0  # it starts below the fold
        # The scroll lands after a layout refresh: wait on it (a loaded machine needs more than one pause).
        await wait_until(
            pilot,
            lambda: prereqs.body.content_region.contains_region(failed.region),
            f"failed check {failed.region} inside {prereqs.body.content_region}",
        )
