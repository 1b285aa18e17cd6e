"""Pilot tests for step 3 (.env): merge/replace with diff and backup, and every way it must refuse."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from textual.geometry import Region

from cosmictui.ops.config import Settings
from tests.e2e._wizard_support import (
    ENV_VAR,
    KEY,
    OTHER_KEY,
    make_app,
    resume_at,
    snapshot_tree,
    status,
    step,
    wait_status,
    wait_until,
)


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def _deploy(tmp_path: Path, env: bytes | None) -> Path:
    d = tmp_path / "deploy"
    d.mkdir()
    if env is not None:
        (d / ".env").write_bytes(env)
    return d


async def _open_env_step(tmp_path: Path, env: bytes | None):  # type: ignore[no-untyped-def]
    d = _deploy(tmp_path, env)
    resume_at(str(d), "env", relay_key=KEY, relay_storage=str(tmp_path / "relay"))
    return d, make_app(Settings(deployment=str(d)))


async def test_wizard_env_merge_shows_diff_writes_backup_and_keeps_other_bytes(tmp_path: Path) -> None:
    original = (
        b"# CosmicAC\r\nexport A='x y'\r\n"
        + f"{ENV_VAR}='[\"{OTHER_KEY}\"]'\r\n".encode()
        + b"Z=1"  # no final newline: must survive
    )
    d, app = await _open_env_step(tmp_path, original)
    async with app.run_test(size=(80, 24)) as pilot:
        text = await wait_status(pilot, app, "env", ("info",))
        assert "press w" in text
        diff = str(step(app, "env").query_one("#env-diff").render())
        assert f"-{ENV_VAR}='[\"{OTHER_KEY}\"]'" in diff
        assert f'+{ENV_VAR}=\'["{OTHER_KEY}", "{KEY}"]\'' in diff or f'"{OTHER_KEY}","{KEY}"' in diff
        # Next is refused before writing, and the file is untouched.
        await pilot.press("n")
        assert app.screen.index == 2
        assert (d / ".env").read_bytes() == original
        await pilot.press("w")
        text = await wait_status(pilot, app, "env", ("ok",))
        assert "Wrote the .env" in text
        new = (d / ".env").read_bytes()
        assert new.startswith(b"# CosmicAC\r\nexport A='x y'\r\n") and new.endswith(b"\r\nZ=1")
        assert KEY.encode() in new and OTHER_KEY.encode() in new
        backups = [p for p in d.iterdir() if p.name.startswith(".env.bak-")]
        assert len(backups) == 1 and backups[0].read_bytes() == original
        summary = str(step(app, "env").query_one("#env-summary").render())
        assert f"Backup: {backups[0].name} (same directory)" in summary  # the full path is in the log
        assert any(str(backups[0]) in line for line in app.screen.query_one("#command-log-text").plain_lines)
        await pilot.press("n")
        assert app.screen.index == 3


async def test_wizard_env_replace_mode_drops_other_relays(tmp_path: Path) -> None:
    original = f"{ENV_VAR}='[\"{OTHER_KEY}\"]'\n".encode()
    d, app = await _open_env_step(tmp_path, original)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_status(pilot, app, "env", ("info",))
        await pilot.press("t")
        await wait_status(pilot, app, "env", ("info",))
        assert "(replace)" in status(app, "env")
        await pilot.press("w")
        await wait_status(pilot, app, "env", ("ok",))
    assert (d / ".env").read_bytes() == f"{ENV_VAR}='[\"{KEY}\"]'\n".encode()


@pytest.mark.parametrize(
    ("env", "expect"),
    [
        (None, ".env does not exist"),
        (b"A=1\nthis is not an assignment\n", "line 2: not a KEY=VALUE line"),
        (f"A=1\n{ENV_VAR}='[\"{OTHER_KEY}\",'\n".encode(), "is not valid JSON"),
    ],
    ids=["missing-env", "malformed-line", "invalid-json"],
)
async def test_wizard_env_errors_are_clear_and_change_nothing(tmp_path: Path, env: bytes | None, expect: str) -> None:
    d, app = await _open_env_step(tmp_path, env)
    before = snapshot_tree(d)
    async with app.run_test(size=(80, 24)) as pilot:
        text = await wait_status(pilot, app, "env", ("error",))
        assert expect in text
        assert "Nothing was changed" in text or "Fix:" in text
        await pilot.press("w")  # nothing to write: refused
        assert "Nothing to write" in status(app, "env")
        await pilot.press("n")  # validation refuses
        assert app.screen.index == 2
    assert snapshot_tree(d) == before


async def test_wizard_env_changed_after_diff_is_not_overwritten(tmp_path: Path) -> None:
    d, app = await _open_env_step(tmp_path, b"A=1\n")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_status(pilot, app, "env", ("info",))
        (d / ".env").write_bytes(b"A=1\nB=edited-meanwhile\n")  # someone else edits the file
        await pilot.press("w")
        await wait_until(
            pilot, lambda: "B=edited-meanwhile" in str(step(app, "env").query_one("#env-diff").render()), "the new diff"
        )
        assert (d / ".env").read_bytes() == b"A=1\nB=edited-meanwhile\n"
        assert not [p for p in d.iterdir() if p.name.startswith(".env.bak-")]
        await pilot.press("w")
        await wait_status(pilot, app, "env", ("ok",))
    assert (d / ".env").read_bytes().startswith(b"A=1\nB=edited-meanwhile\n") and KEY.encode() in (
        d / ".env"
    ).read_bytes()


@pytest.mark.parametrize("size", [(80, 24), (60, 20)])
async def test_wizard_env_diff_says_before_and_written_once_written(tmp_path: Path, size: tuple[int, int]) -> None:
    original = f"# CosmicAC\n{ENV_VAR}='[\"{OTHER_KEY}\"]'\n".encode()
    d, app = await _open_env_step(tmp_path, original)
    async with app.run_test(size=size) as pilot:
        await wait_status(pilot, app, "env", ("info",))
        diff = step(app, "env").query_one("#env-diff")
        before = str(diff.render())
        assert "--- .env (now)" in before and "+++ .env (new)" in before, before  # not written yet
        await pilot.press("w")
        await wait_status(pilot, app, "env", ("ok",))
        after = str(diff.render())
        # what is true now: the file was written; the same change, said so
        assert "--- .env (before)" in after and "+++ .env (written)" in after, after
        assert "(now)" not in after and "(new)" not in after, after
        assert f"-{ENV_VAR}='[\"{OTHER_KEY}\"]'" in after and KEY in after
        assert KEY.encode() in (d / ".env").read_bytes()
        # re-reading shows the file as it is now: nothing left to write
        await pilot.press("e")
        text = await wait_status(pilot, app, "env", ("ok",))
        assert "already has this relay key" in text, text


@pytest.mark.parametrize("size", [(60, 20), (80, 24)])
async def test_wizard_env_diff_title_names_the_file_at_any_width(tmp_path: Path, size: tuple[int, int]) -> None:
    # a deployment path shaped like the demo's (/tmp/cosmictui-demo-XXXXXXXX/deployment/.env)
    root = Path(tempfile.mkdtemp(prefix="cosmictui-demo-", dir="/tmp"))
    try:
        d = root / "deployment"
        d.mkdir()
        (d / ".env").write_text(f"# CosmicAC\n{ENV_VAR}='[\"{OTHER_KEY}\"]'\n")
        env = str(d / ".env")
        resume_at(str(d), "env", relay_key=KEY, relay_storage=str(tmp_path / "relay"))
        app = make_app(Settings(deployment=str(d)))
        async with app.run_test(size=size) as pilot:
            await wait_status(pilot, app, "env", ("info",))
            diff = step(app, "env").query_one("#env-diff")
            width = diff.outer_size.width

            def top() -> str:
                return diff.render_lines(Region(0, 0, width, 1))[0].text

            # what the operator sees: ╭─ TITLE ─...╮
            await wait_until(pilot, lambda: top().startswith("╭─ /tmp/cosmictui-demo-"), "the title drawn")
            title = top()[3:].split(" ─")[0]
            assert len(top()) == width and top().endswith("╮"), top()
            if width - 6 >= len(env):  # 80 columns: the whole path
                assert size == (80, 24) and title == env, (title, env)
            else:  # 60 columns: the start, … in the middle, and the file name with its directory
                assert size == (60, 20), (size, width)
                assert title != env and "…" in title and len(title) == width - 6, (title, width)
                start, _, end = title.partition("…")
                assert env.startswith(start) and start.startswith("/tmp/cosmictui-demo-"), title
                assert env.endswith(end) and end.endswith("/deployment/.env"), title
    finally:
        shutil.rmtree(root, ignore_errors=True)
