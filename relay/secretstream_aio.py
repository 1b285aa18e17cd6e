"""Thin asyncio driver for the sans-IO `SecretStream` (tests, benchmarks and the relay).

`SecretStreamProtocol` is an `asyncio.Protocol`: give it to `loop.create_connection` /
`loop.create_server`, or attach it to any transport-like object that offers `write`,
`close` (and optionally `write_eof`, `abort`, `pause_reading`/`resume_reading`) and calls
`connection_made`/`data_received`/`eof_received`/`connection_lost` — a UDX stream runtime
can do exactly that. The clock is `loop.time()`; timers are one lazily re-armed
`call_at` handle.

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

from relay.secretstream import Closed, Ended, Event, Message, Opened, SecretStream, SecretStreamError

__all__ = ["SecretStreamProtocol", "connect", "serve"]

_HIGH_WATER = 4 << 20  # queued received bytes before we stop reading the transport


class SecretStreamProtocol(asyncio.Protocol):
    """Runs one `SecretStream` over one asyncio transport."""

    # slots and a read queue made on first use: a relay holds one per session
    __slots__ = (
        "_dispatching",
        "_drain_waiters",
        "_ended",
        "_loop",
        "_queue",
        "_queued_bytes",
        "_reading_paused",
        "_timer",
        "_timer_at",
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
        self._loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[Opened] = self._loop.create_future()
        self.closed: asyncio.Future[SecretStreamError | None] = self._loop.create_future()
        self._queue: deque[bytes] | None = None  # recv()'s queue, made when on_event is not set
        self._queued_bytes = 0
        self._reading_paused = False
        self._ended = False
        self._waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._transport_closed = False
        self._dispatching = False

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.stream.start(self._loop.time())
        self._flush()

    def data_received(self, data: bytes) -> None:
        self.stream.receive_data(data, self._loop.time())
        self._flush()

    def eof_received(self) -> bool:
        self.stream.receive_eof(self._loop.time())
        self._flush()
        return not self.stream.closed  # keep the write side open for our own end()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport_closed = True
        self.stream.connection_lost(exc)
        self._flush()
        self._cancel_timer()
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
        self.stream.send(message, self._loop.time())
        self._flush()

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        if self._write_paused and not self._transport_closed:
            fut = self._loop.create_future()
            self._drain_waiters.append(fut)
            await fut
        if self.stream.closed and self.stream.error is not None:
            raise self.stream.error

    def end(self) -> None:
        """Finish writing; the raw stream is half-closed after queued messages."""
        if not self.stream.closed:
            self.stream.end()
            self._flush()

    def destroy(self, error: SecretStreamError | str | None = None) -> None:
        self.stream.destroy(error)
        self._flush()

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
            self._waiter = self._loop.create_future()
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

    def _flush(self) -> None:
        stream = self.stream
        transport = self.transport
        if transport is not None and not self._transport_closed:
            data = stream.data_to_send()
            if data:
                transport.write(data)
            if stream.take_eof():
                self._write_eof(transport)
        if not self._dispatching:  # a callback that sends must not re-enter event delivery
            self._dispatching = True
            try:
                for ev in stream.events():
                    self._dispatch(ev)
            finally:
                self._dispatching = False
            if transport is not None and not self._transport_closed:
                data = stream.data_to_send()  # written by callbacks during dispatch
                if data:
                    transport.write(data)
                if stream.take_eof():
                    self._write_eof(transport)
        if stream.closed:
            self._cancel_timer()
            if transport is not None and not self._transport_closed:
                self._transport_closed = True
                if stream.error is not None and hasattr(transport, "abort"):
                    transport.abort()
                else:
                    transport.close()
        else:
            self._arm_timer()

    @staticmethod
    def _write_eof(transport: Any) -> None:
        if getattr(transport, "can_write_eof", lambda: False)():
            transport.write_eof()
        else:
            transport.close()

    def _dispatch(self, ev: Event) -> None:
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

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _arm_timer(self) -> None:
        deadline = self.stream.get_timer()
        if deadline is None:
            return
        if self._timer_at is not None and self._timer_at <= deadline:
            return  # the armed timer fires first; it re-arms itself
        self._cancel_timer()
        self._timer_at = deadline
        self._timer = self._loop.call_at(deadline, self._on_timer)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_at = None

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self.stream.handle_timer(self._loop.time())
        self._flush()


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
