"""`<storage>/relay-runtime.json`: how the wizard and monitor find a running relay.

Written atomically once the relay listens, removed at clean exit. A stale file (relay killed)
is recognisable by its pid no longer running.

`<storage>/relay-returning.json`: written at a clean exit, read (and removed) by the next start:
how many sessions each host held, so that host's reconnect storm after a restart is expected
(`relay.service.limits.HandshakeGate.expect_returning`) rather than throttled as a flood.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RUNTIME_FILE = "relay-runtime.json"
RETURNING_FILE = "relay-returning.json"
#: a record of who was connected is used only by a start this soon after the stop that wrote it
RETURNING_MAX_AGE = 600.0
#: ... and hosts beyond this many (the busiest kept) are not recorded
RETURNING_MAX_HOSTS = 4096


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


def write_returning(storage: Path, sessions_by_host: Mapping[str, int], wall_time: float) -> None:
    """Record who was connected when the relay stopped (the busiest hosts first, bounded)."""
    hosts = dict(sorted(sessions_by_host.items(), key=lambda kv: -kv[1])[:RETURNING_MAX_HOSTS])
    path = storage / RETURNING_FILE
    fd, tmp = tempfile.mkstemp(prefix=".relay-returning.", dir=storage)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"stopped_at": wall_time, "hosts": hosts}, f, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def take_returning(storage: Path, wall_time: float, max_age: float = RETURNING_MAX_AGE) -> dict[str, int]:
    """The hosts the last clean stop recorded, if it was at most `max_age` ago; the file is
    removed either way (it speaks for one restart only). Anything unreadable counts as none."""
    path = storage / RETURNING_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
    try:
        if not 0 <= wall_time - float(doc["stopped_at"]) <= max_age:
            return {}
        return {str(h): int(n) for h, n in dict(doc["hosts"]).items() if int(n) > 0}
    except (KeyError, TypeError, ValueError):
        return {}
