"""A Node hyperdht testnet in a subprocess (js/dht_testnet.js), driven by JSON lines.

Usable by other tests (e.g. relayThrough tests on top of the Python server):

    async with NodeTestnet.start(node_exe, size=4) as tn:
        tn.bootstrap            # ["127.0.0.1:port", ...] for DHTNode(bootstrap=...)
        await tn.call("connect", key=pk.hex(), message="hi")
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

INTEROP_DIR = Path(__file__).resolve().parent
TESTNET_JS = INTEROP_DIR / "js" / "dht_testnet.js"


class NodeTestnet:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.ready: dict[str, Any] = {}
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ready: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    @contextlib.asynccontextmanager
    async def start(cls, node: str, size: int = 4) -> AsyncIterator[NodeTestnet]:
        proc = await asyncio.create_subprocess_exec(
            node,
            str(TESTNET_JS),
            str(size),
            cwd=INTEROP_DIR,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        tn = cls(proc)
        try:
            tn.ready = await asyncio.wait_for(tn._ready, 60)
            yield tn
        finally:
            await tn.stop()

    @property
    def bootstrap(self) -> list[str]:
        return [f"{b['host']}:{b['port']}" for b in self.ready["bootstrap"]]

    @property
    def node_addresses(self) -> list[tuple[str, int]]:
        return [(n["host"], n["port"]) for n in self.ready["nodes"]]

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "ready" and not self._ready.done():
                self._ready.set_result(ev)
            elif ev.get("event") == "result":
                fut = self._waiting.pop(ev.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(ev)
        if not self._ready.done():
            self._ready.set_exception(RuntimeError("dht_testnet.js exited before it was ready"))
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(RuntimeError("dht_testnet.js exited"))

    async def call(self, cmd: str, timeout: float = 60, **args: Any) -> dict[str, Any]:
        """Run one command in the Node process; returns its result dict (check ["ok"])."""
        assert self.proc.stdin is not None
        i = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[i] = fut
        self.proc.stdin.write((json.dumps({"id": i, "cmd": cmd, **args}) + "\n").encode())
        await self.proc.stdin.drain()
        return await asyncio.wait_for(fut, timeout)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(Exception):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
