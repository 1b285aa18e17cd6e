"""`cosmictui relay probe` usage errors: exit 2 before any network traffic."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from cosmictui.cli import main


def run(*argv: str) -> int:
    return main(list(argv), io.StringIO())


def test_bad_key_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("relay", "probe", "not-a-key", "--bootstrap", "127.0.0.1:9") == 2
    assert "not a relay key" in capsys.readouterr().err


def test_bad_bootstrap_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("relay", "probe", "ab" * 32, "--bootstrap", "nohost") == 2
    assert "HOST:PORT" in capsys.readouterr().err


def test_no_key_and_an_empty_storage_given_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # an explicit --storage without a relay never falls back to some other relay on this machine
    assert run("relay", "probe", "--storage", str(tmp_path / "none"), "--bootstrap", "127.0.0.1:9") == 2
    assert "no KEY given" in capsys.readouterr().err


def test_bad_relay_key_for_check_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("check", "--relay-key", "nope", "--port", "1") == 2
    assert "--relay-key" in capsys.readouterr().err
