"""Step 5's verdict against `cosmicac` stand-ins printing real-world table shapes (footers, totals,
paging hints, box-drawn, unknown statuses): no phantom job, no green from an unknown status, and
the verdict withdrawn when the job goes back. The stand-in is a real script on PATH that prints
the next snapshot on every `jobs list` (the last one again once they run out)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cosmictui.ops import progress as progress_mod
from cosmictui.ops.config import Settings
from tests.e2e._wizard_support import (
    KEY,
    make_app,
    make_bin,
    path_with,
    relay_carried,
    resume_at,
    status,
    step,
    wait_until,
)

# Snapshot N, then N+1 on the next call; past the last one it prints the last again without moving
# on, so a snapshot the test adds later is the next one printed (no race with the polling).
STANDIN = """\
n=$(cat "$SNAPS/next" 2>/dev/null || echo 1)
if [ -f "$SNAPS/$n.txt" ]; then cat "$SNAPS/$n.txt"; echo $((n+1)) > "$SNAPS/next"
else cat "$SNAPS/$((n-1)).txt"; fi
"""


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _deploy(tmp_path: Path, snapshots: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Settings]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    d = tmp_path / "deploy"
    snaps = tmp_path / "snaps"
    for p in (d, snaps):
        p.mkdir()
    for i, text in enumerate(snapshots, 1):
        (snaps / f"{i}.txt").write_text(text)
    bin_dir = make_bin(tmp_path, {"cosmicac": STANDIN})
    resume_at(str(d), "verify", relay_key=KEY, restarted_at=time.time() - 60)
    env = {"PATH": path_with(bin_dir), "SNAPS": str(snaps)}
    return d, Settings(deployment=str(d), command_env=env, poll_interval=0.1, relay_metrics="off")


def _polled(app: object, n: int) -> bool:
    return step(app, "verify").polls >= n  # type: ignore[arg-type]


async def test_totals_and_paging_lines_are_no_jobs_and_never_confirm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = time.time() - 7200
    rows = "".join(f"│ job-00{i}  │ Running  │ {_iso(old)} │\n" for i in range(1, 5))
    head = "┌──────────┬──────────┬──────────────────────┐\n│ ID       │ Status   │ Created              │\n"
    rule = "├──────────┼──────────┼──────────────────────┤\n"
    end = "└──────────┴──────────┴──────────────────────┘\n"
    before = head + rule + rows + end + "4 jobs\nShowing 4 of 4 jobs\n"
    new = f"│ job-100  │ Creating │ {_iso(time.time())} │\n"
    after = head + rule + rows + new + end + "5 jobs\nShowing 5 of 5 jobs\n"
    _, settings = _deploy(tmp_path, [before, after], monkeypatch)
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: _polled(app, 6), "six lists", timeout=60)
        table = step(app, "verify").query_one("#verify-jobs")
        ids = [table.get_row_at(i)[0] for i in range(table.row_count)]
        assert ids == ["job-001", "job-002", "job-003", "job-004", "job-100"]
        assert "job-100 is Creating" in status(app, "verify")
        assert not step(app, "verify").done and "the relay works" not in status(app, "verify").lower()


async def test_unknown_status_is_shown_as_such_and_never_green(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = "ID        STATUS         UPDATED\n"
    snaps = [base, *(base + f"job-100   Provisioning   {_iso(time.time() + i)}\n" for i in range(1, 5))]
    _, settings = _deploy(tmp_path, snaps, monkeypatch)
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: _polled(app, 6), "the Provisioning lists", timeout=60)
        text = status(app, "verify")
        assert "status 'Provisioning', which is not a known status" in text and "[jobs] done_statuses" in text
        (tmp_path / "snaps" / "6.txt").write_text(base + "job-100                  " + _iso(time.time() + 9) + "\n")
        await wait_until(pilot, lambda: "has no status" in status(app, "verify"), "the empty status", timeout=60)
        table = step(app, "verify").query_one("#verify-jobs")
        assert table.get_row_at(0)[1] == "unknown"
        assert not step(app, "verify").done


async def test_verdict_is_withdrawn_when_the_job_goes_back_to_creating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = "ID        STATUS     UPDATED\n"
    t = time.time()
    relay_carried(monkeypatch)
    seq = [("Creating", 1), ("Running", 2), ("Running", 3), ("Creating", 4)]
    snaps = [base, *(base + f"job-100   {st:<9}  {_iso(t + u)}\n" for st, u in seq)]
    d, settings = _deploy(tmp_path, snaps, monkeypatch)
    from cosmictui.ops.session import WizardContext

    ticked: list[bool] = []  # step 5's tick after each verdict (no toast says "the relay works": it hid the status)
    real_note = WizardContext.note_verdict

    def note_verdict(self: WizardContext, verdict: object, state: object = None) -> None:
        real_note(self, verdict, state)
        ticked.append("verify" in self.ticks())

    monkeypatch.setattr(WizardContext, "note_verdict", note_verdict)
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: _polled(app, 7), "the whole sequence", timeout=60)
        titles = [n.title for n in app._notifications]
        assert True in ticked and "Verdict withdrawn" in titles  # green, then taken back
        assert "went back to Creating" in status(app, "verify") and not step(app, "verify").done
        assert not progress_mod.load_progress(str(d)).is_done("verify")
        await pilot.press("n")
        assert app.screen.index == 4  # Next is refused again
