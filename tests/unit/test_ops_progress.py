"""Wizard progress survives a rerun, per deployment; a corrupt file means a fresh start."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosmictui.ops.progress import clear_progress, load_progress, progress_path, save_progress


def test_round_trip_per_deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    p = load_progress("ssh://ops@gpu/opt/cosmicac")
    assert p.completed == [] and p.current_step is None
    p.complete("prereqs")
    p.complete("prereqs")
    p.current_step = "relay"
    p.relay_key = "k" * 52
    p.data["restart_output"] = ["ok"]
    path = save_progress(p)
    assert path.parent == tmp_path / "cosmictui"
    again = load_progress("ssh://ops@gpu/opt/cosmicac")
    assert again.completed == ["prereqs"] and again.current_step == "relay" and again.relay_key == "k" * 52
    assert again.data == {"restart_output": ["ok"]} and again.updated_at is not None
    assert load_progress("/other").completed == []
    assert progress_path("/a/b") != progress_path("/a_b")
    clear_progress("ssh://ops@gpu/opt/cosmicac")
    assert load_progress("ssh://ops@gpu/opt/cosmicac").completed == []


def test_corrupt_file_is_a_fresh_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    path = progress_path("/d")
    path.parent.mkdir(parents=True)
    for junk in ("{", "[]", '{"deployment": "/d", "completed": 3}', '{"deployment": "/other"}'):
        path.write_text(junk)
        assert load_progress("/d").completed == []
