"""The Prometheus pack shipped with cosmictui (`deploy/prometheus`, `deploy/grafana`): print or install it.

The files are package data (`prometheus/`, `grafana/` here link to the repository's `deploy/`), so
an installed cosmictui has them. Installing never overwrites a file that differs from ours unless
asked (`force`): an operator's edited rules are not lost; the result says what was written, what
was already identical and what was kept.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

#: kind -> (files in install order, the one printed by default)
KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    "prometheus": (("blind-relay.rules.yml", "blind-relay.rules.test.yml", "prometheus.yml"), "blind-relay.rules.yml"),
    "grafana": (("blind-relay.json",), "blind-relay.json"),
}


class PackError(Exception):
    """A bad kind, file or target directory; `fix` names what to do."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


def files(kind: str) -> tuple[str, ...]:
    if kind not in KINDS:
        raise PackError(f"unknown pack {kind!r}", f"use one of: {', '.join(KINDS)}")
    return KINDS[kind][0]


def read(kind: str, name: str | None = None) -> str:
    """The text of one pack file (by default the one worth printing: the rules, the dashboard)."""
    names = files(kind)
    name = name or KINDS[kind][1]
    if name not in names:
        raise PackError(f"the {kind} pack has no file {name!r}", f"--file {' | '.join(names)}")
    return resources.files(__package__).joinpath(kind, name).read_text(encoding="utf-8")


@dataclass
class InstallResult:
    directory: Path
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    """Existing files that differ from ours, left as they were (pass force to replace them)."""
    check: str | None = None
    """`promtool check rules` output when promtool is installed (prometheus pack), else None."""
    check_ok: bool | None = None


def install(kind: str, directory: Path, *, force: bool = False) -> InstallResult:
    """Write the pack's files into `directory` (made if missing)."""
    names = files(kind)
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise PackError(f"{directory} is not a directory", "give --install a directory (it is made if missing)")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PackError(f"cannot make {directory}: {e.strerror or e}", "pick a directory you can write") from None
    result = InstallResult(directory)
    for name in names:
        ours = read(kind, name)
        target = directory / name
        try:
            current = target.read_text(encoding="utf-8") if target.exists() else None
        except (OSError, UnicodeDecodeError):
            current = ""
        if current == ours:
            result.unchanged.append(name)
            continue
        if current is not None and not force:
            result.kept.append(name)
            continue
        tmp = target.with_name(f".{name}.tmp")
        try:
            tmp.write_text(ours, encoding="utf-8")
            tmp.replace(target)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise PackError(f"cannot write {target}: {e.strerror or e}", "pick a directory you can write") from None
        result.written.append(name)
    if kind == "prometheus":
        promtool = shutil.which("promtool")
        if promtool is not None:
            r = subprocess.run(
                [promtool, "check", "rules", "blind-relay.rules.yml"],
                cwd=directory,
                capture_output=True,
                text=True,
                timeout=60,
            )
            result.check = (r.stdout + r.stderr).strip()
            result.check_ok = r.returncode == 0
    return result
