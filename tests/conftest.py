"""Shared fixtures: where the real Node peers live."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

INTEROP_DIR = Path(__file__).resolve().parent / "interop"
NODE_MODULES = INTEROP_DIR / "node_modules"


@pytest.fixture(scope="session")
def node() -> str:
    """Path to node, with the pinned npm packages installed; fails loudly when they are not."""
    exe = shutil.which("node")
    if exe is None:
        pytest.fail("node is not on PATH: the interop tests need Node 20 (see README)")
    if not (NODE_MODULES / "hyperdht").is_dir():
        pytest.fail(f"{NODE_MODULES} is missing: run `npm ci --prefix tests/interop` (README's test command does)")
    return exe
