"""Helpers for the protomux / blind-relay interop tests: a Node peer driven over stdin/stdout,
and an asyncio driver for our sans-IO `SecretStream` on a TCP connection.

Everything waits on events (lines from Node, messages from the stream) with a generous safety
timeout; nothing sleeps. Every Node process is killed when its context exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from relay.keys import KeyPair
from relay.secretstream import Closed, Ended, Message, Opened, SecretStream

INTEROP_DIR = Path(__file__).resolve().parent
SAFETY_TIMEOUT = 20.0  # a safety net only: every wait ends on an event long before this


class NodePeer:
    """A Node script from tests/interop/js taking JSON commands and printing JSON events."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.events: list[dict[str, Any]] = []
        self._seen = 0
        self._changed = asyncio.Condition()
        self._seq = 0
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            ev = json.loads(line)
            async with self._changed:
                self.events.append(ev)
                self._changed.notify_all()
        async with self._changed:
            self.events.append({"ev": "exit"})
            self._changed.notify_all()

    def send(self, op: str, **args: Any) -> None:
        assert self.proc.stdin is not None
        self._seq += 1
        self.proc.stdin.write((json.dumps({"op": op, "seq": self._seq, **args}) + "\n").encode())

    async def call(self, op: str, **args: Any) -> None:
        """Send a command and wait until Node ran it; a JS exception fails the test."""
        self.send(op, **args)
        seq = self._seq
        ev = await self.expect(lambda e: e.get("seq") == seq and e["ev"] in ("done", "command-error"))
        assert ev["ev"] == "done", f"node {op} failed: {ev}"

    async def expect(self, pred: Callable[[dict[str, Any]], bool] | str, **match: Any) -> dict[str, Any]:
        """Wait for the first event, not yet consumed, matching `pred` (or `ev` name + fields)."""
        if isinstance(pred, str):
            name = pred

            def pred(e: dict[str, Any]) -> bool:
                return e["ev"] == name and all(e.get(k) == v for k, v in match.items())

        async def find() -> dict[str, Any]:
            async with self._changed:
                while True:
                    for e in self.events:
                        if not e.get("_used") and pred(e):
                            e["_used"] = True
                            return e
                    if self.events and self.events[-1]["ev"] == "exit":
                        raise AssertionError(f"node exited; events: {self.events}")
                    await self._changed.wait()

        try:
            return await asyncio.wait_for(find(), SAFETY_TIMEOUT)
        except TimeoutError:
            raise AssertionError(f"node never reported the expected event; it reported {self.events}") from None

    def unused(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["ev"] == name and not e.get("_used")]


@contextlib.asynccontextmanager
async def node_peer(node: str, script: str) -> AsyncIterator[NodePeer]:
    proc = await asyncio.create_subprocess_exec(
        node,
        f"js/{script}",
        cwd=INTEROP_DIR,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=64 * 1024 * 1024,  # events carry payloads as hex on one line
    )
    peer = NodePeer(proc)
    try:
        yield peer
    finally:
        if proc.returncode is None:
            proc.kill()
        stderr = await proc.stderr.read() if proc.stderr else b""
        await proc.wait()
        peer._reader.cancel()
        if stderr.strip():
            print("node stderr:", stderr.decode(errors="replace"))


class SecretConn:
    """Drives a `SecretStream` over an asyncio TCP connection: whole messages in and out.

    This is the one seam the interop tests need from the stream layer: swap the class to run
    protomux over another message transport.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        initiator: bool,
        key_pair: KeyPair | None = None,
        on_message: Callable[[bytes], None],
        on_open: Callable[[Opened], None] | None = None,
        on_close: Callable[[Exception | None], None] | None = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.stream = SecretStream(initiator, key_pair=key_pair)
        self.on_message = on_message
        self.on_open = on_open
        self.on_close = on_close
        self.opened = asyncio.Event()
        self.closed = asyncio.Event()
        self.raw_messages: list[bytes] = []  # every message received, as delivered
        self.stream.start(time.monotonic())
        self._flush()
        self.task = asyncio.get_running_loop().create_task(self._run())

    @property
    def remote_public_key(self) -> bytes | None:
        return self.stream.remote_public_key

    def send(self, messages: list[bytes]) -> None:
        if self.stream.closed:
            return
        for m in messages:
            self.stream.send(m, time.monotonic())
        self._flush()

    def destroy(self) -> None:
        self.stream.destroy()
        self._dispatch()
        self.writer.close()

    def _flush(self) -> None:
        data = self.stream.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)
        if self.stream.take_eof() and self.writer.can_write_eof():
            self.writer.write_eof()

    def _dispatch(self) -> None:
        for ev in self.stream.events():
            if isinstance(ev, Opened):
                self.opened.set()
                if self.on_open:
                    self.on_open(ev)
            elif isinstance(ev, Message):
                self.raw_messages.append(ev.data)
                self.on_message(ev.data)
            elif isinstance(ev, Ended):
                if not self.stream.closed:
                    self.stream.end()
            elif isinstance(ev, Closed):
                self.closed.set()
                if self.on_close:
                    self.on_close(ev.error)
            self._flush()
        self._flush()

    async def _run(self) -> None:
        try:
            while data := await self.reader.read(65536):
                self.stream.receive(data, time.monotonic())
                self._dispatch()
            self.stream.receive_eof(time.monotonic())
            self._dispatch()
        except (ConnectionError, OSError) as e:
            self.stream.connection_closed(e)
        self.stream.connection_closed(None)
        self._dispatch()
        self.writer.close()


class Watch:
    """Wakes waiters whenever the watched state may have changed (`notify` is sync)."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def notify(self) -> None:
        for f in self._waiters:
            if not f.done():
                f.set_result(None)
        self._waiters.clear()

    async def until(self, pred: Callable[[], bool]) -> None:
        """Wait until `pred()` holds, re-checking after each `notify`."""

        async def loop() -> None:
            while not pred():
                f = asyncio.get_running_loop().create_future()
                self._waiters.append(f)
                await f

        await asyncio.wait_for(loop(), SAFETY_TIMEOUT)
