"""`<storage>/relay-runtime.json`: how the wizard and monitor find a running relay.

Written atomically once the relay listens, removed at clean exit. A stale file (relay killed)
is recognisable by its pid no longer running.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

RUNTIME_FILE = "relay-runtime.json"


def runtime_path(storage: Path) -> Path:
    return storage / RUNTIME_FILE


def write_runtime(storage: Path, info: dict[str, Any]) -> Path:
    path = runtime_path(storage)
    fd, tmp = tempfile.mkstemp(prefix=".relay-runtime.", dir=storage)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(info, f, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def remove_runtime(storage: Path, pid: int | None = None) -> None:
    """Remove the file, but only if it is ours (another relay may have taken the storage over)."""
    path = runtime_path(storage)
    with contextlib.suppress(FileNotFoundError, ValueError, OSError):
        if pid is not None and json.loads(path.read_text()).get("pid") != pid:
            return
        path.unlink()
