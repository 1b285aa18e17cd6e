"""Helpers for the UDX interop tests: a udx-native peer in a Node subprocess, a lossy proxy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

INTEROP_DIR = Path(__file__).resolve().parent
PEER_JS = INTEROP_DIR / "js" / "udx_peer.js"


class NodePeer:
    """One udx-native stream in its own Node process, driven by JSON lines."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.events: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self.log: list[dict[str, Any]] = []
        self.ready: dict[str, Any] = {}
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, node: str, stream_id: int | None = None, host: str | None = None) -> NodePeer:
        """`host`: the address the peer binds and connects to (127.0.0.1 unless given, e.g. ::1)."""
        args = [str(PEER_JS)] + ([str(stream_id)] if stream_id is not None else [])
        env = {**os.environ, "UDX_PEER_HOST": host} if host else None
        proc = await asyncio.create_subprocess_exec(
            node, *args, cwd=INTEROP_DIR, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env
        )
        peer = cls(proc)
        peer.ready = await peer.expect("ready", 30)
        return peer

    @property
    def id(self) -> int:
        return int(self.ready["id"])

    @property
    def port(self) -> int:
        return int(self.ready["port"])

    def queue(self, name: str) -> asyncio.Queue[dict[str, Any]]:
        return self.events.setdefault(name, asyncio.Queue())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            ev = json.loads(line)
            self.log.append(ev)
            self.queue(ev["event"]).put_nowait(ev)

    async def expect(self, name: str, timeout: float = 60) -> dict[str, Any]:
        return await asyncio.wait_for(self.queue(name).get(), timeout)

    def has(self, name: str) -> bool:
        return any(ev["event"] == name for ev in self.log)

    def cmd(self, **msg: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())

    async def close(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader


@contextlib.asynccontextmanager
async def node_peers(node: str, count: int) -> AsyncIterator[list[NodePeer]]:
    peers: list[NodePeer] = []
    try:
        for _ in range(count):
            peers.append(await NodePeer.start(node))
        yield peers
    finally:
        for p in peers:
            await p.close()


class LossyProxy(asyncio.DatagramProtocol):
    """Two loopback sockets, one facing each endpoint; drops and reorders a share of datagrams.

    Endpoint A talks to `port_a`, endpoint B to `port_b`; the proxy learns each endpoint's
    address from its first datagram. Reordering holds a datagram back until `hold` later
    datagrams in the same direction have passed.
    """

    def __init__(
        self,
        loss: float,
        reorder: float,
        seed: int = 1,
        hold: int = 3,
        a: tuple[str, int] | None = None,
        b: tuple[str, int] | None = None,
    ) -> None:
        self.loss = loss
        self.reorder = reorder
        self.hold = hold
        self.rng = random.Random(seed)
        self.dropped = 0
        self.reordered = 0
        self.forwarded = 0
        self.addr: dict[str, tuple[str, int] | None] = {"a": a, "b": b}
        self.transports: dict[str, asyncio.DatagramTransport] = {}
        self.held: dict[str, list[tuple[int, bytes]]] = {"a": [], "b": []}
        self.active = True

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for side in ("a", "b"):
            t, _ = await loop.create_datagram_endpoint(lambda s=side: _Side(self, s), local_addr=("127.0.0.1", 0))
            self.transports[side] = t  # type: ignore[assignment]

    def port(self, side: str) -> int:
        return self.transports[side].get_extra_info("sockname")[1]

    def received(self, side: str, data: bytes, addr: tuple[str, int]) -> None:
        if self.addr[side] is None:
            self.addr[side] = addr
        other = "b" if side == "a" else "a"
        self._send(other, data)

    def _send(self, side: str, data: bytes) -> None:
        dst = self.addr[side]
        held = self.held[side]
        # release held datagrams whose turn has come
        keep = []
        for left, d in held:
            if left <= 1:
                self._out(side, d)
            else:
                keep.append((left - 1, d))
        self.held[side] = keep
        if dst is None:
            return
        if self.active:
            r = self.rng.random()
            if r < self.loss:
                self.dropped += 1
                return
            if r < self.loss + self.reorder:
                self.reordered += 1
                entry = (self.hold, data)
                self.held[side].append(entry)
                asyncio.get_running_loop().call_later(0.005, self._release, side, entry)
                return
        self._out(side, data)

    def _release(self, side: str, entry: tuple[int, bytes]) -> None:
        """A held datagram goes out after 5 ms even when no later traffic pushes it."""
        held = self.held[side]
        for i, e in enumerate(held):
            if e is entry:
                del held[i]
                self._out(side, e[1])
                return

    def _out(self, side: str, data: bytes) -> None:
        dst = self.addr[side]
        if dst is not None:
            self.forwarded += 1
            self.transports[side].sendto(data, dst)

    def close(self) -> None:
        for t in self.transports.values():
            t.close()


class _Side(asyncio.DatagramProtocol):
    def __init__(self, proxy: LossyProxy, side: str) -> None:
        self.proxy = proxy
        self.side = side

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.proxy.received(self.side, data, addr)
