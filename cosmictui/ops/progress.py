"""Wizard progress saved per deployment, so a rerun resumes where the operator left off.

Stored as JSON in `$XDG_STATE_HOME/cosmictui/` (default `~/.local/state/cosmictui/`), one file
per deployment spec. A corrupt file is treated as no progress (and left for inspection).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class WizardProgress:
    """Where the wizard stands for one deployment."""

    deployment: str
    current_step: str | None = None
    completed: list[str] = field(default_factory=list)
    relay_storage: str | None = None
    relay_key: str | None = None
    #: step 2 attached to a relay by its key (it runs elsewhere: no runtime file here to check)
    relay_external: bool = False
    env_backup: str | None = None
    restarted_at: float | None = None
    data: dict[str, Any] = field(default_factory=dict)
    updated_at: float | None = None

    def complete(self, step: str) -> None:
        if step not in self.completed:
            self.completed.append(step)

    def is_done(self, step: str) -> bool:
        return step in self.completed


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "cosmictui"


def progress_path(deployment: str) -> Path:
    """One file per deployment: a readable slug plus a hash so distinct specs never collide."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", deployment).strip("_")[-60:] or "deployment"
    digest = hashlib.sha256(deployment.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return state_dir() / f"progress-{slug}-{digest}.json"


def load_progress(deployment: str) -> WizardProgress:
    """Saved progress for `deployment`, or a fresh one."""
    path = progress_path(deployment)
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return WizardProgress(deployment=deployment)
    if not isinstance(data, dict) or data.get("deployment") != deployment:
        return WizardProgress(deployment=deployment)
    known = {k: data[k] for k in WizardProgress.__dataclass_fields__ if k in data}
    try:
        progress = WizardProgress(**known)
    except TypeError:
        return WizardProgress(deployment=deployment)
    if not isinstance(progress.completed, list) or not isinstance(progress.data, dict):
        return WizardProgress(deployment=deployment)
    return progress


def save_progress(progress: WizardProgress) -> Path:
    """Write atomically (temp file + rename) so a crash never leaves half a file."""
    progress.updated_at = time.time()
    path = progress_path(progress.deployment)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".progress-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(asdict(progress), f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def clear_progress(deployment: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        progress_path(deployment).unlink()


def journal_path(deployment: str) -> Path:
    """The command log on disk, beside the progress file (same name, `.log`)."""
    return progress_path(deployment).with_suffix(".log")


class CommandJournal:
    """The wizard's command log appended to a file, so it outlives the screen.

    A poll repeated with the same command, output and exit code is written once and then
    counted ("same again ×N"), so the 5 s jobs polling cannot bury a delete's output.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._last: tuple[str, str, tuple[str, ...], int] | None = None
        self._repeats = 0
        self._last_at = 0.0

    def _append(self, text: str) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8", errors="replace") as f:
                f.write(text)
        except OSError:
            pass  # the on-screen log still has it; a full disk must not stop the wizard

    def _flush_repeats(self) -> None:
        if self._repeats:
            at = time.strftime("%H:%M:%S", time.localtime(self._last_at))
            self._append(f"  (same again {self._repeats} more time(s), the last at {at})\n")
            self._repeats = 0

    def command(self, cmd: str, where: str, output: list[str], exit_code: int, mark: str, started: float) -> None:
        key = (cmd, where, tuple(output), exit_code)
        if key == self._last:
            self._repeats += 1
            self._last_at = time.time()
            return
        self._flush_repeats()
        self._last = key
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
        body = "".join(f"  │ {line}\n" for line in output)
        self._append(f"{stamp} $ {cmd}    [{where}]\n{body}  └ exit {exit_code} ({mark})\n")

    def note(self, text: str) -> None:
        self._flush_repeats()
        self._last = None
        self._append(time.strftime("%Y-%m-%d %H:%M:%S ") + f"# {text}\n")

    def close(self) -> None:
        self._flush_repeats()


# -- the keys this machine's probes used ----------------------------------------------------------

PROBE_KEYS_FILE = "probe-keys.json"
#: How many probe keys are kept, and for how long: a verdict only looks back to the last restart.
PROBE_KEYS_KEPT = 4096
PROBE_KEYS_DAYS = 30


def probe_keys_path() -> Path:
    return state_dir() / PROBE_KEYS_FILE


def _read_probe_keys(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("keys"), dict):
        return {}
    return {k: float(v) for k, v in data["keys"].items() if isinstance(k, str) and isinstance(v, int | float)}


def remember_probe_keys(keys: list[str], at: float | None = None) -> None:
    """Note the keys a probe's peers use toward a relay (wizard, `relay probe`, the monitor's probe
    rows): the relay records them in the probe's pairing, and the verify verdict must not take that
    pairing for a job's. Kept in one file per machine (the state directory), under a lock, so
    every cosmictui process here sees every probe. A state directory that cannot be written
    loses the note, as it loses the wizard's progress."""
    import fcntl

    now = time.time() if at is None else at
    path = probe_keys_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            kept = _read_probe_keys(path)
            for k in keys:
                kept[k] = now
            cutoff = now - PROBE_KEYS_DAYS * 86400
            newest = sorted(((t, k) for k, t in kept.items() if t >= cutoff), reverse=True)[:PROBE_KEYS_KEPT]
            fd, tmp = tempfile.mkstemp(prefix=".probe-keys-", dir=path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"keys": {k: t for t, k in newest}}, f)
            os.replace(tmp, path)
    except OSError:
        pass


def probe_keys() -> frozenset[str]:
    """Every key a probe on this machine used lately (see `remember_probe_keys`)."""
    return frozenset(_read_probe_keys(probe_keys_path()))
