"""benchmarks/wake_cost.py keeps measuring the reader the relay runs: it reaches into the
runtime (the socket's reader, its batch, its route table), so a change there must not leave it
timing something else. A short run checks every wake relayed its datagrams (the script exits
non-zero otherwise) and that both columns are filled; no timing is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from relay.udx import mmsg

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not mmsg.available(), reason="the reader it times is the Linux batched one")


def test_wake_cost_times_the_relays_reader_and_the_floor() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "wake_cost.py"), "--datagrams", "1,3", "--wakes", "64"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    rows = [line for line in out.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [r.split("|")[1].strip() for r in rows] == ["1", "3"]
    for r in rows:
        assert len(re.findall(r"\d+\.\d+ µs", r)) == 4
