"""Thin asyncio driver for the sans-IO `SecretStream` (tests, benchmarks and the relay).

`SecretStreamProtocol` is an `asyncio.Protocol`: give it to `loop.create_connection` /
`loop.create_server`, or attach it to any transport-like object that offers `write`,
`close` (and optionally `write_eof`, `abort`, `pause_reading`/`resume_reading`) and calls
`connection_made`/`data_received`/`eof_received`/`connection_lost` — a UDX stream runtime
can do exactly that. It is a `relay.core.Driver` of its `SecretStream`: input with the
loop's time, events drained one at a time (a callback that sends does not re-enter delivery),
output written, one timer at the core's deadline (keep-alive, idle timeout).

Public API (stable):

- `SecretStreamProtocol(stream, *, on_event=None)`
  - `opened` (Future[Opened]), `closed` (Future[SecretStreamError | None]).
  - `send(message)`, `await drain()`, `end()`, `destroy(error=None)`, `await wait_closed()`.
  - Without `on_event`, messages queue up for `await recv()` (returns `None` once the peer
    ended; raises `SecretStreamError` if the stream failed) or `async for msg in proto`.
    With `on_event`, every `Opened`/`Message`/`Ended`/`Closed` goes to the callback
    instead (the relay's path: no queue, no extra task).
- `await connect(host, port, *, initiator=True, **stream_options) -> SecretStreamProtocol`
- `await serve(host, port, on_connection, *, initiator=False, **stream_options) -> asyncio.Server`
  where `on_connection(proto)` may be sync or async and `stream_options` are passed to
  `SecretStream` for every accepted connection (e.g. `key_pair=...`, `keep_alive=5.0`).
  A sync `on_connection` runs before the transport exists, so setting `proto.on_event` there
  sees every event; an async one is started as a task (set `on_event` before its first
  `await`).
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from relay.core import Driver
from relay.secretstream import Closed, Ended, Event, Message, Opened, SecretStream, SecretStreamError

__all__ = ["SecretStreamProtocol", "connect", "serve"]

_HIGH_WATER = 4 << 20  # queued received bytes before we stop reading the transport


class SecretStreamProtocol(Driver[Event], asyncio.Protocol):
    """Runs one `SecretStream` over one asyncio transport."""

    # slots and a read queue made on first use: a relay holds one per session
    __slots__ = (
        "_drain_waiters",
        "_ended",
        "_queue",
        "_queued_bytes",
        "_reading_paused",
        "_transport_closed",
        "_waiter",
        "_write_paused",
        "closed",
        "on_event",
        "opened",
        "stream",
        "transport",
    )

    def __init__(self, stream: SecretStream, *, on_event: Callable[[Event], None] | None = None) -> None:
        self.stream = stream
        self.on_event = on_event
        self.transport: Any = None
        loop = asyncio.get_running_loop()
        Driver.__init__(self, stream, loop)
        self.opened: asyncio.Future[Opened] = loop.create_future()
        self.closed: asyncio.Future[SecretStreamError | None] = loop.create_future()
        self._queue: deque[bytes] | None = None  # recv()'s queue, made when on_event is not set
        self._queued_bytes = 0
        self._reading_paused = False
        self._ended = False
        self._waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._transport_closed = False

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.feed(self.stream.start)

    def data_received(self, data: bytes) -> None:
        self.feed(self.stream.receive, data)

    def eof_received(self) -> bool:
        self.feed(self.stream.receive_eof)
        return not self.stream.closed  # keep the write side open for our own end()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport_closed = True
        self.stream.connection_closed(exc)
        self.pump()
        self.disarm()
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)
        self._drain_waiters.clear()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)
        self._drain_waiters.clear()

    # --- application side ---------------------------------------------------------------------

    def send(self, message: bytes | bytearray | memoryview) -> None:
        """Send one message (raises `SecretStreamError` if the stream is dead)."""
        self.feed(self.stream.send, message)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        if self._write_paused and not self._transport_closed:
            fut = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(fut)
            await fut
        if self.stream.closed and self.stream.error is not None:
            raise self.stream.error

    def end(self) -> None:
        """Finish writing; the raw stream is half-closed after queued messages."""
        if not self.stream.closed:
            self.stream.end()
            self.pump()

    def destroy(self, error: SecretStreamError | str | None = None) -> None:
        self.stream.destroy(error)
        self.pump()

    async def wait_closed(self) -> SecretStreamError | None:
        return await asyncio.shield(self.closed)

    async def recv(self) -> bytes | None:
        """Next message; None once the peer ended; raises if the stream failed."""
        while True:
            if self._queue:
                msg = self._queue.popleft()
                self._queued_bytes -= len(msg)
                if self._reading_paused and self._queued_bytes < _HIGH_WATER // 2:
                    self._reading_paused = False
                    if not self._transport_closed and hasattr(self.transport, "resume_reading"):
                        self.transport.resume_reading()
                return msg
            if self.stream.error is not None:
                raise self.stream.error
            if self._ended or self.stream.closed:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[bytes]:
        while (msg := await self.recv()) is not None:
            yield msg

    # --- plumbing -----------------------------------------------------------------------------

    # --- the driver's hooks ------------------------------------------------------------------

    def transmit(self, now: float) -> None:
        """What the core has for the transport (and its EOF), in order."""
        transport = self.transport
        if transport is not None and not self._transport_closed:
            stream = self.stream
            data = stream.data_to_send()
            if data:
                transport.write(data)
            if stream.take_eof():
                self._write_eof(transport)

    def arm(self) -> None:
        """After a pump: a closed stream closes its transport (aborts it after an error);
        an open one re-arms its timer."""
        stream = self.stream
        if not stream.closed:
            super().arm()
            return
        self.disarm()
        transport = self.transport
        if transport is not None and not self._transport_closed:
            self._transport_closed = True
            if stream.error is not None and hasattr(transport, "abort"):
                transport.abort()
            else:
                transport.close()

    @staticmethod
    def _write_eof(transport: Any) -> None:
        if getattr(transport, "can_write_eof", lambda: False)():
            transport.write_eof()
        else:
            transport.close()

    def handle_event(self, ev: Event) -> None:
        if isinstance(ev, Message):
            if self.on_event is not None:
                self.on_event(ev)
                return
            if self._queue is None:
                self._queue = deque()
            self._queue.append(ev.data)
            self._queued_bytes += len(ev.data)
            if self._queued_bytes > _HIGH_WATER and not self._reading_paused:
                self._reading_paused = True
                if hasattr(self.transport, "pause_reading"):
                    self.transport.pause_reading()
            self._wake()
            return
        if isinstance(ev, Opened):
            if not self.opened.done():
                self.opened.set_result(ev)
        elif isinstance(ev, Ended):
            self._ended = True
            self._wake()
        elif isinstance(ev, Closed):
            if not self.opened.done():
                self.opened.set_exception(ev.error or SecretStreamError("closed before the handshake finished"))
                self.opened.exception()  # mark retrieved: callers may only await `closed`
            if not self.closed.done():
                self.closed.set_result(ev.error)
            self._wake()
        if self.on_event is not None:
            self.on_event(ev)
            if isinstance(ev, Closed):  # the last event: drop the handler, often a closure over its owner
                self.on_event = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


async def connect(host: str, port: int, *, initiator: bool = True, **stream_options: Any) -> SecretStreamProtocol:
    """Open a TCP connection and run a secret stream over it (Noise XX unless handed over)."""
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(
        lambda: SecretStreamProtocol(SecretStream(initiator, **stream_options)), host, port
    )
    return proto


async def serve(
    host: str,
    port: int,
    on_connection: Callable[[SecretStreamProtocol], Awaitable[None] | None],
    *,
    initiator: bool = False,
    **stream_options: Any,
) -> asyncio.Server:
    """Accept TCP connections, each a secret stream handed to `on_connection` on arrival."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    def factory() -> SecretStreamProtocol:
        proto = SecretStreamProtocol(SecretStream(initiator, **stream_options))
        result = on_connection(proto)  # a sync callback runs before the transport exists
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        return proto

    return await loop.create_server(factory, host, port)
