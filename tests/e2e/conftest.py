"""Fixtures shared by the wizard's end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cosmictui.ops.demo.sandbox import Sandbox, create_sandbox


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    """A demo sandbox (its own state directory), closed after the test."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    sb = create_sandbox(tmp_path / "demo")
    try:
        yield sb
    finally:
        sb.close()  # the relay the wizard started (detached) and the sandbox's private DHT
