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
