"""Another revision's relay, run beside this tree's in the same benchmark run (`--baseline`).

A before/after measured in two runs an hour apart on a shared box cannot tell a change from the
box's load; measured in one run, rounds alternating, it can. `--baseline REV` runs the relay as
revision REV has it (`git archive` of `relay/` and the benchmark's own relay script into a
temporary directory), `--baseline DIR` the one in another checkout (a `git worktree`); either
runs with DIR's `.venv` interpreter when it has one, else this one. Everything else (the peers,
the Node relay, the measuring) is this tree's.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Baseline:
    """Where the other relay's code lies and which interpreter runs it."""

    tree: Path
    python: str
    name: str


def baseline(spec: str, into: Path) -> Baseline:
    """A checkout directory as it is, or revision `spec` extracted under `into`."""
    path = Path(spec)
    if (path / "relay" / "__init__.py").is_file():
        venv = path / ".venv" / "bin" / "python"
        return Baseline(path.resolve(), str(venv) if venv.exists() else sys.executable, spec)
    paths = ["relay", "benchmarks/udx_relay_py.py"]
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", spec, *paths], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return Baseline(into, sys.executable, spec)
