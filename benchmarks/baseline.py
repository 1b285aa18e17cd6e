"""Another revision's relay, run beside this tree's in the same benchmark run (`--baseline`).

A before/after measured in two runs an hour apart on a shared box cannot tell a change from the
box's load; measured in one run, rounds alternating, it can. `--baseline REV` runs the relay as
revision REV has it (`git archive` of `relay/` and the benchmark's own relay script into a
temporary directory), `--baseline DIR` the one in another checkout (a `git worktree`); either
runs with DIR's `.venv` interpreter when it has one, else this one. Everything else (the peers,
the Node relay, the measuring) is this tree's. `--baseline-env KEY=VAL` sets variables in the other
relay's environment only (`--baseline . --baseline-env PYTHONMALLOC=pymalloc`: this tree's relay
on another allocator, in the same rounds).
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
    #: variables set in the other relay's environment (`--baseline-env`)
    env: tuple[tuple[str, str], ...] = ()


def baseline_env(items: list[str] | None) -> tuple[tuple[str, str], ...]:
    """`--baseline-env KEY=VAL` arguments as pairs; a clear error for one without `=`."""
    pairs = []
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--baseline-env wants KEY=VAL, not {item!r}")
        pairs.append((key, value))
    return tuple(pairs)


def baseline(spec: str, into: Path, env: tuple[tuple[str, str], ...] = ()) -> Baseline:
    """A checkout directory as it is, or revision `spec` extracted under `into`."""
    path = Path(spec)
    if (path / "relay" / "__init__.py").is_file():
        venv = path / ".venv" / "bin" / "python"
        return Baseline(path.resolve(), str(venv) if venv.exists() else sys.executable, spec, env)
    paths = ["relay", "benchmarks/udx_relay_py.py"]
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", spec, *paths], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return Baseline(into, sys.executable, spec, env)
