"""Shared fixtures: where the real Node peers live."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.unit._hostile_http import HostileHTTP

# Property tests draw the same examples on every run by default, so a suite run (and CI) passes
# or fails on the code, not on the draw: a rare input found at random once cost a whole CI run
# (tests/unit/test_ops_jobs.py's "0of0"). `HYPOTHESIS_PROFILE=explore` draws fresh ones (and
# replays failures from .hypothesis/): run it to hunt, and pin what it finds with @example.
settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

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


@pytest.fixture(autouse=True)
def _no_public_bootstrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests send no traffic off the machine: the wizard's "Bootstrap node answers" check pings
    the public HyperDHT nodes when none is configured, so here they are a silent loopback port."""
    monkeypatch.setattr("cosmictui.ops.setup.checks.PUBLIC_BOOTSTRAP", ("127.0.0.1:9",))


@pytest.fixture
def hostile() -> Iterator[Callable[..., HostileHTTP]]:
    """Hostile HTTP endpoints on loopback (drip, silence, huge bodies, bad numbers), closed after the test."""
    servers: list[HostileHTTP] = []

    def make(**routes: Any) -> HostileHTTP:
        s = HostileHTTP(**routes)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()
