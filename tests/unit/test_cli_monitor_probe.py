"""`cosmictui monitor --relay-key/--bootstrap`: usage errors exit 2 before any traffic, and a
key given alone is watched by key (never swapped for the configured relay)."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest

from cosmictui.cli import build_parser, main
from cosmictui.cli.monitor import monitor_targets

KEY = "a" * 52


def run(*argv: str) -> int:
    return main(list(argv), io.StringIO())


def test_bad_relay_key_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("monitor", "--relay-key", "not-a-key") == 2
    assert "--relay-key" in capsys.readouterr().err


def test_bad_bootstrap_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("monitor", "--relay-key", KEY, "--bootstrap", "nohost") == 2
    assert "HOST:PORT" in capsys.readouterr().err


def test_a_key_alone_is_watched_by_key_beside_other_targets(tmp_path: Path) -> None:
    settings = SimpleNamespace(relay_storage=str(tmp_path / "configured"), metrics_url=None)
    args = build_parser().parse_args(["monitor", "--relay-key", KEY])
    targets = monitor_targets(args, settings)
    assert len(targets) == 1 and targets[0].key_only and targets[0].relay_key == KEY
    args = build_parser().parse_args(["monitor", "--storage", str(tmp_path), "--relay-key", KEY, "--relay-key", KEY])
    assert [t.key_only for t in monitor_targets(args, settings)] == [False, True]  # the same key once
