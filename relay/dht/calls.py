"""The DHT node's calls and what its glue shares: the contexts of requests (an awaited one
resolves a future, a fire-and-forget one calls back), the socket it needs, bootstrap names,
background tasks."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .messages import Address, DHTError
from .rpc import Reply

log = logging.getLogger("relay.dht")


class DatagramSocket(Protocol):
    """What the node needs from a socket: UDXSocket and UDPEndpoint both fit."""

    # a property pair, not a plain attribute: the node only ever sets the handler, and
    # UDXSocket's own attribute is Optional (a bare UDX socket starts without one)
    @property
    def on_datagram(self) -> object: ...

    @on_datagram.setter
    def on_datagram(self, handler: Callable[[bytes, Address], None]) -> None: ...

    def send(self, data: bytes, addr: Address) -> None: ...

    @property
    def address(self) -> Address: ...


def parse_node(s: str | Address) -> tuple[str, int]:
    """`host:port` or `suggestedIP@hostname:port` (kept whole in host) → (host, port)."""
    if isinstance(s, tuple):
        return s
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise DHTError(f"bootstrap node must be host:port, got {s!r}", "BAD_BOOTSTRAP")
    return host, int(port)


def is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def spawn(tasks: set[asyncio.Task[Any]], coro: Any, what: str, level: int) -> None:
    """Run `coro` in the background, held in `tasks` until it ends so that close() can
    cancel it; its failure is logged at `level` rather than left for the loop to find."""
    t = asyncio.ensure_future(coro)
    tasks.add(t)

    def done(t: asyncio.Task[Any]) -> None:
        tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.log(level, "%s failed: %r", what, t.exception())

    t.add_done_callback(done)


class Call:
    """Context of a plain awaited request: resolves a future."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[Reply]) -> None:
        self.future = future

    def on_reply(self, reply: Reply) -> None:
        if not self.future.done():
            self.future.set_result(reply)

    def on_retrying(self) -> None:
        pass

    def on_failed(self, error: DHTError) -> None:
        if not self.future.done():
            self.future.set_exception(error)


class Callback:
    """Context of a fire-and-forget request with optional callbacks."""

    __slots__ = ("failed", "replied")

    def __init__(
        self, replied: Callable[[Reply], None] | None = None, failed: Callable[[DHTError], None] | None = None
    ) -> None:
        self.replied = replied
        self.failed = failed

    def on_reply(self, reply: Reply) -> None:
        if self.replied:
            self.replied(reply)

    def on_retrying(self) -> None:
        pass

    def on_failed(self, error: DHTError) -> None:
        if self.failed:
            self.failed(error)


@dataclass
class ConnectTrace:
    """When each step of one connect finished, in seconds since it started (for the probe)."""

    #: the loop time the connect started (set by `connect` unless the caller set it)
    started: float | None = None
    stages: dict[str, float] = field(default_factory=dict)
    stage: str = "find"  # what we are waiting for now (named in timeout errors)

    def mark(self, name: str, now: float, next_stage: str | None = None) -> None:
        """Step `name` finished at loop time `now`."""
        if self.started is None:
            self.started = now
        self.stages.setdefault(name, round(now - self.started, 4))
        if next_stage is not None:
            self.stage = next_stage
