"""Node peers for the streams interop tests: JSON lines out of a script in tests/interop/js.

Waits end on events (a line from Node), with a generous safety timeout only; every process
is killed when its context exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

INTEROP_DIR = Path(__file__).resolve().parent
SAFETY_TIMEOUT = 30.0


class NodeLines:
    """A running Node script; `expect(key, value)` waits for the next matching JSON line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[dict[str, Any]] = []
        self._pos = 0

    async def next(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), SAFETY_TIMEOUT)
        if not line:
            err = b""
            if self.proc.stderr is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    err = await asyncio.wait_for(self.proc.stderr.read(), 5)
            raise AssertionError(f"node exited early; lines so far {self.lines}; stderr: {err.decode()[-2000:]}")
        obj = json.loads(line)
        self.lines.append(obj)
        return obj

    async def expect(self, key: str, value: Any = None) -> dict[str, Any]:
        """Next line that has `key` (equal to `value` when given); skipped lines stay in `lines`."""
        while True:
            obj = await self.next()
            if key in obj and (value is None or obj[key] == value):
                return obj

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())

    async def wait_exit(self) -> int:
        return await asyncio.wait_for(self.proc.wait(), SAFETY_TIMEOUT)


@contextlib.asynccontextmanager
async def node_script(node: str, script: str, options: dict[str, Any]) -> AsyncIterator[NodeLines]:
    """Start `js/<script>` with `options` as its JSON argument (cwd tests/interop)."""
    proc = await asyncio.create_subprocess_exec(
        node,
        str(INTEROP_DIR / "js" / script),
        json.dumps(options),
        cwd=INTEROP_DIR,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield NodeLines(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
