"""protomux: many channels over one secret-stream, as a sans-IO state machine.

Wire-compatible with npm `protomux` 3.12.1. One protomux message is one secret-stream message
(`uint(channel) ‖ uint(type) ‖ payload`); channel 0 carries control messages (batch, open,
reject, close). Channels pair by `(protocol, id)`: each side opens with its own local id, and
the channel is *fully opened* once both opens are seen, in either order.

The `Mux` never touches a socket. The runtime feeds it whole messages and writes out whatever
it produces:

    mux = Mux()
    chan = mux.open_channel("example", id=b"...", messages=[None, None])  # two raw types
    chan.send(0, b"hi")
    for msg in mux.data_to_send():           # each item = one secret-stream write
        stream.write(msg)
    mux.receive(data, now)                   # one secret-stream message in
    while (event := mux.next_event()) is not None:
        ...                                  # ChannelOpened / MessageReceived / ChannelClosed ...
    mux.connection_closed()                  # the secret-stream ended: every channel closes

Public API:

* `Mux.open_channel(protocol, id=None, *, messages=None, handshake=None, unique=True,
  user_data=None) -> Channel | None` creates a channel and sends its open at once. If the
  remote already opened the same `(protocol, id)`, the channel binds to it and
  `ChannelOpened` is queued immediately. Returns None when `unique` and one is already open
  for the key, or when the stream is gone.
* `Mux.pair(protocol, id=None)` / `Mux.unpair(...)`: without a registration a remote open that
  no local channel waits for is rejected at once (as protomux does when no `pair` handler is
  set). With one, a `ChannelRequested` event is queued instead and the app answers with
  `open_channel` (accept) or `reject(protocol, id)`; messages for it are buffered meanwhile.
  `id=None` matches every id of that protocol.
* `Mux.receive(data, now)` processes one incoming message (empty ones are ignored, batches are
  unpacked; a mux keeps no time, `now` is the contract's: `relay.core`); `Mux.next_event()`
  returns every queued event, from input and API calls alike, one at a time (None when there
  are none). Bad input raises `ProtomuxError`: the stream must then be destroyed (protomux
  destroys it too) and `connection_closed()` called.
* `Mux.data_to_send() -> list[bytes]`: messages to write, one secret-stream write each.
* `Mux.cork()` / `Mux.uncork()`: nestable; while corked, sends collect into one batch message.
* `Mux.connection_closed()`: closes every channel locally (`ChannelClosed(is_remote=True)`), as a
  closing stream does in protomux; nothing is sent.
* `Channel.send(type, message) -> bool`, `Channel.close()`, `Channel.cork()/uncork()`; fields
  `protocol`, `id`, `local_id`, `remote_id`, `opened`, `closed`, `remote_handshake`,
  `user_data`.
* `MessageType(read, write)`: a per-type codec built on `relay.encoding` (`read(Reader)`,
  `write(Writer, value)`). `messages=None` delivers every type as raw bytes; a list declares
  types 0..n-1 (`None` entries are raw bytes); types past the list are dropped, as in protomux.

Events: `ChannelOpened`, `ChannelRequested`, `MessageReceived`, `ChannelClosed`,
`OpenRejected` (we rejected a remote open that nobody waited for).

Differences from the JS package, on purpose (both wire-compatible repairs of a race that makes
protomux 3.12.1 destroy the stream when a channel is closed before the peer accepted its open
in a `pair` hook): a close for an open we have not accepted yet withdraws it with a reject
(protomux ignores it and may bind it later), and an open answering a channel we already closed
is answered with our close again (protomux only frees the id). Also: an open with id 0 raises (JS crashes building
its reject and destroys the stream), a batch nested more than `MAX_BATCH_DEPTH` deep and a
peer pushing more than `MAX_BUFFERED` bytes into channels nobody accepted yet raise
`ProtomuxError` instead of exhausting the stack or pausing the stream forever, and remote
channel ids are limited to `MAX_CHANNELS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from relay.encoding import DecodeError, Reader, Writer

__all__ = [
    "MAX_BATCH",
    "MAX_BATCH_DEPTH",
    "MAX_BUFFERED",
    "MAX_CHANNELS",
    "Channel",
    "ChannelClosed",
    "ChannelOpened",
    "ChannelRequested",
    "Event",
    "MessageReceived",
    "MessageType",
    "Mux",
    "OpenRejected",
    "ProtomuxError",
]

MAX_BATCH = 8 * 1024 * 1024
"""A batch under construction is sent and a new one started past this many bytes (as protomux)."""
MAX_BATCH_DEPTH = 4
"""Nobody nests batches (protomux never does); a little depth is tolerated, more is an attack."""
MAX_BUFFERED = 4 * 1024 * 1024
"""Bytes (counted as protomux does: 512 + payload) held for channels awaiting a local answer."""
MAX_CHANNELS = 1 << 16
"""Highest remote channel id we track; the remote table grows by one per new id."""

OP_BATCH = 0
OP_OPEN = 1
OP_REJECT = 2
OP_CLOSE = 3


class ProtomuxError(Exception):
    """The peer broke the protomux protocol; the stream has to be destroyed."""


@dataclass(frozen=True, slots=True)
class MessageType:
    """Codec for one message type of a channel; `None` read/write mean raw bytes."""

    read: Callable[[Reader], Any] | None = None
    write: Callable[[Writer, Any], object] | None = None
    name: str = ""


RAW = MessageType()


# ---------------------------------------------------------------------------------- events


class Event:
    """Base class of everything `Mux` reports."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class ChannelOpened(Event):
    """Both sides opened the channel; `handshake` is the remote open's trailing bytes (or None)."""

    channel: Channel
    handshake: bytes | None


@dataclass(frozen=True, slots=True)
class ChannelRequested(Event):
    """The remote opened a paired `(protocol, id)` nobody waits for; accept or reject it."""

    protocol: str
    id: bytes | None
    remote_id: int


@dataclass(frozen=True, slots=True)
class MessageReceived(Event):
    channel: Channel
    type: int
    message: Any


@dataclass(frozen=True, slots=True)
class ChannelClosed(Event):
    """The channel is gone: closed by us, by the remote, rejected by the remote, or the stream closed."""

    channel: Channel
    is_remote: bool
    rejected: bool = False


@dataclass(frozen=True, slots=True)
class OpenRejected(Event):
    """We answered a remote open with reject (no local channel and no `pair` registration)."""

    protocol: str
    id: bytes | None
    remote_id: int


# ---------------------------------------------------------------------------------- state


def _key(protocol: str, id: bytes | None) -> tuple[str, bytes]:
    return (protocol, bytes(id) if id else b"")


@dataclass(slots=True)
class _Info:
    """Per-(protocol, id) bookkeeping, as protomux's `info` objects."""

    key: tuple[str, bytes]
    opened: int = 0
    # lists, not deques: they hold a channel id or two, and an empty deque costs ~600 bytes
    # (two per session were 1.2 KB of the relay's ~11 KB per session)
    incoming: list[int] = field(default_factory=list)
    outgoing: list[int] = field(default_factory=list)
    last_channel: Channel | None = None


@dataclass(slots=True)
class _Remote:
    """One slot of the remote channel table (index = remote id - 1)."""

    protocol: str
    id: bytes | None
    handshake: bytes
    pending: list[tuple[int, bytes]] | None
    channel: Channel | None = None


class Channel:
    """One end of a protomux channel; made by `Mux.open_channel`."""

    __slots__ = (
        "_info",
        "_mux",
        "closed",
        "handshake",
        "id",
        "local_id",
        "messages",
        "opened",
        "protocol",
        "remote_handshake",
        "remote_id",
        "user_data",
    )

    def __init__(
        self,
        mux: Mux,
        info: _Info,
        protocol: str,
        id: bytes | None,
        messages: Sequence[MessageType | None] | None,
        handshake: bytes | None,
        user_data: Any,
    ) -> None:
        self._mux = mux
        self._info = info
        self.protocol = protocol
        self.id = bytes(id) if id else None
        self.messages: list[MessageType] | None = None if messages is None else [m or RAW for m in messages]
        self.handshake = handshake
        self.user_data = user_data
        self.local_id = 0
        self.remote_id = 0
        self.opened = False
        self.closed = False
        self.remote_handshake: bytes | None = None

    def __repr__(self) -> str:
        state = "closed" if self.closed else "opened" if self.opened else "opening"
        key = (self.id or b"").hex()[:16]
        return f"<Channel {self.protocol!r} id={key} local={self.local_id} remote={self.remote_id} {state}>"

    def send(self, type: int, message: Any = b"") -> bool:
        """Queue message `type`; allowed before the channel is fully opened. False once closed."""
        if self.closed:
            return False
        codec = RAW
        if self.messages is not None:
            if not 0 <= type < len(self.messages):
                raise ValueError(f"channel {self.protocol!r} has no message type {type}")
            codec = self.messages[type]
        if codec.write is None:
            payload = bytes(message)
        else:
            w = Writer()
            codec.write(w, message)
            payload = w.getvalue()
        self._mux._send(self.local_id, type, payload)
        return True

    def close(self) -> None:
        """Send close and tear down locally; the remote does not answer it."""
        if self.closed:
            return
        local_id = self.local_id
        self._mux._close_channel(self, is_remote=False)
        self._mux._write_control(OP_CLOSE, Writer().uint(local_id).getvalue())

    def cork(self) -> None:
        self._mux.cork()

    def uncork(self) -> None:
        self._mux.uncork()

    def _deliver(self, type: int, payload: bytes) -> None:
        codec = RAW
        if self.messages is not None:
            if type >= len(self.messages):
                return  # unknown types are dropped, as in protomux
            codec = self.messages[type]
        if codec.read is None:
            message: Any = payload
        else:
            try:
                message = codec.read(Reader(payload))
            except DecodeError as e:
                raise ProtomuxError(f"channel {self.protocol!r}: bad message type {type}: {e}") from e
        self._mux._events.append(MessageReceived(self, type, message))


class Mux:
    """Sans-IO protomux over one stream of whole messages; see the module docstring."""

    __slots__ = (
        "_batch",
        "_batch_size",
        "_buffered",
        "_corked",
        "_events",
        "_free",
        "_infos",
        "_local",
        "_notify",
        "_notify_any",
        "_out",
        "_remote",
        "destroyed",
    )

    def __init__(self) -> None:
        self._local: list[Channel | None] = []
        self._free: list[int] = []
        self._remote: list[_Remote | None] = []
        self._infos: dict[tuple[str, bytes], _Info] = {}
        # dicts as sets: an empty dict is 64 bytes, an empty set 216, and every session has a Mux
        self._notify: dict[tuple[str, bytes], None] = {}
        self._notify_any: dict[str, None] = {}
        self._out: list[bytes] = []
        self._events: list[Event] = []
        self._corked = 0
        self._batch: list[tuple[int, bytes]] | None = None
        self._batch_size = 0
        self._buffered = 0
        self.destroyed = False

    # ---------------------------------------------------------------- app API

    def __iter__(self) -> Iterator[Channel]:
        return (c for c in self._local if c is not None)

    def pair(self, protocol: str, id: bytes | None = None) -> None:
        """Let remote opens of `(protocol, id)` wait for a local decision instead of a reject."""
        if id is None:
            self._notify_any[protocol] = None
        else:
            self._notify[_key(protocol, id)] = None

    def unpair(self, protocol: str, id: bytes | None = None) -> None:
        if id is None:
            self._notify_any.pop(protocol, None)
        else:
            self._notify.pop(_key(protocol, id), None)

    def opened(self, protocol: str, id: bytes | None = None) -> bool:
        info = self._infos.get(_key(protocol, id))
        return bool(info and info.opened > 0)

    def open_channel(
        self,
        protocol: str,
        id: bytes | None = None,
        *,
        messages: Sequence[MessageType | None] | None = None,
        handshake: bytes | None = None,
        unique: bool = True,
        user_data: Any = None,
    ) -> Channel | None:
        """Create a channel and send its open; binds to a waiting remote open of the same key."""
        if self.destroyed:
            return None
        info = self._get_info(protocol, id)
        if unique and info.opened > 0:
            return None
        chan = Channel(self, info, protocol, id, messages, handshake, user_data)
        remote: _Remote | None = None
        while info.incoming and remote is None:
            rid = info.incoming.pop(0)
            remote = self._remote[rid - 1]
            if remote is not None:
                chan.remote_id = rid
                remote.channel = chan
        self._open(chan)
        if remote is not None:
            try:
                self._fully_open(chan, remote)  # delivers what the peer sent meanwhile
            except ProtomuxError:
                self.destroyed = True
                raise
        return chan

    def reject(self, protocol: str, id: bytes | None = None) -> None:
        """Refuse every remote open of `(protocol, id)` still waiting (after `ChannelRequested`)."""
        info = self._infos.get(_key(protocol, id))
        if info is None:
            return
        while info.incoming:
            rid = info.incoming.pop(0)
            self._reject_remote(rid)
        self._gc(info)

    def receive(self, data: bytes | bytearray | memoryview, now: float) -> None:
        """Process one secret-stream message; its events go to `next_event`. Raises `ProtomuxError`."""
        if self.destroyed:
            raise ProtomuxError("the mux was destroyed by an earlier protocol error")
        n = len(data)
        if n > 2 and 0 < data[0] <= 0xFC and data[1] <= 0xFC and data[0] <= len(self._remote):
            slot = self._remote[data[0] - 1]  # fast path: a message on an open channel
            if slot is not None and slot.pending is None and slot.channel is not None:
                try:
                    slot.channel._deliver(data[1], bytes(data[2:]))
                except ProtomuxError:
                    self.destroyed = True
                    raise
                return
        if n:
            buf = bytes(data)
            try:
                r = Reader(buf)
                self._decode(r.uint(), r, 0)
            except DecodeError as e:
                self.destroyed = True
                raise ProtomuxError(f"bad protomux message: {e}") from e
            except ProtomuxError:
                self.destroyed = True
                raise

    def next_event(self) -> Event | None:
        """The oldest event queued (by input or by API calls: open, close, send), or None."""
        return self._events.pop(0) if self._events else None

    def data_to_send(self) -> list[bytes]:
        out, self._out = self._out, []
        return out

    def cork(self) -> None:
        self._corked += 1
        if self._corked == 1:
            self._batch = []
            self._batch_size = 1

    def uncork(self) -> None:
        if self._corked == 0:
            return
        self._corked -= 1
        if self._corked == 0:
            assert self._batch is not None
            self._send_batch(self._batch)
            self._batch = None

    def connection_closed(self) -> None:
        """The underlying stream is gone: close every channel locally (events to `next_event`)."""
        self.destroyed = True
        for chan in list(self._local):
            if chan is not None:
                self._close_channel(chan, is_remote=True)

    @property
    def buffered(self) -> int:
        """Bytes held for remote channels that no local channel accepted yet."""
        return self._buffered

    # ---------------------------------------------------------------- sending

    def _emit(self, data: bytes) -> None:
        if not self.destroyed:
            self._out.append(data)

    def _send(self, local_id: int, type: int, payload: bytes) -> None:
        if self._batch is None and local_id <= 0xFC and type <= 0xFC:  # the common case: 2 one-byte uints
            self._emit(bytes((local_id, type)) + payload)
            return
        item = Writer().uint(type).raw(payload).getvalue()
        if self._batch is not None:
            self._push_batch(local_id, item)
        else:
            self._emit(Writer().uint(local_id).raw(item).getvalue())

    def _write_control(self, op: int, body: bytes) -> None:
        self._send(0, op, body)

    def _push_batch(self, local_id: int, item: bytes) -> None:
        assert self._batch is not None
        if self._batch_size >= MAX_BATCH:
            self._send_batch(self._batch)
            self._batch = []
            self._batch_size = 1
        if not self._batch or self._batch[-1][0] != local_id:
            self._batch_size += 1 + len(Writer().uint(local_id).buf)
        self._batch_size += len(Writer().uint(len(item)).buf) + len(item)
        self._batch.append((local_id, item))

    def _send_batch(self, batch: list[tuple[int, bytes]]) -> None:
        if not batch:
            return
        prev = batch[0][0]
        w = Writer().uint8(0).uint8(OP_BATCH).uint(prev)
        for local_id, item in batch:
            if local_id != prev:
                prev = local_id
                w.uint8(0).uint(prev)
            w.buffer(item)
        self._emit(w.getvalue())

    # ---------------------------------------------------------------- channel lifecycle

    def _get_info(self, protocol: str, id: bytes | None) -> _Info:
        key = _key(protocol, id)
        info = self._infos.get(key)
        if info is None:
            info = self._infos[key] = _Info(key)
        return info

    def _gc(self, info: _Info) -> None:
        if info.opened == 0 and not info.outgoing and not info.incoming:
            self._infos.pop(info.key, None)

    def _open(self, chan: Channel) -> None:
        if self._free:
            idx = self._free.pop()
        else:
            self._local.append(None)
            idx = len(self._local) - 1
        chan._info.opened += 1
        chan._info.last_channel = chan
        chan.local_id = idx + 1
        self._local[idx] = chan
        if chan.remote_id == 0:
            chan._info.outgoing.append(chan.local_id)
        w = Writer().uint(chan.local_id).string(chan.protocol).optional_buffer(chan.id)
        if chan.handshake is not None:
            w.raw(chan.handshake)
        self._write_control(OP_OPEN, w.getvalue())

    def _fully_open(self, chan: Channel, remote: _Remote) -> None:
        if chan.opened or chan.closed:
            return
        chan.remote_handshake = remote.handshake if chan.handshake is not None else None
        remote.channel = chan
        pending, remote.pending = remote.pending, None
        chan.opened = True
        self._events.append(ChannelOpened(chan, chan.remote_handshake))
        if pending:
            for type, payload in pending:
                self._buffered -= 512 + len(payload)
                chan._deliver(type, payload)

    def _close_channel(self, chan: Channel, *, is_remote: bool, rejected: bool = False) -> None:
        if chan.closed:
            return
        chan.closed = True
        info = chan._info
        info.opened -= 1
        if info.last_channel is chan:
            info.last_channel = None
        if chan.remote_id > 0:
            self._remote[chan.remote_id - 1] = None
            chan.remote_id = 0
            self._free.append(chan.local_id - 1)  # the remote has acked: reuse now
        self._local[chan.local_id - 1] = None
        self._gc(info)
        self._events.append(ChannelClosed(chan, is_remote, rejected))

    def _reject_remote(self, remote_id: int) -> None:
        r = self._remote[remote_id - 1]
        if r is not None and r.pending:
            self._buffered -= sum(512 + len(p) for _, p in r.pending)
        self._remote[remote_id - 1] = None
        self._write_control(OP_REJECT, Writer().uint(remote_id).getvalue())

    # ---------------------------------------------------------------- receiving

    def _decode(self, remote_id: int, r: Reader, depth: int) -> None:
        type = r.uint()
        if remote_id == 0:
            if type == OP_BATCH:
                self._on_batch(r, depth)
            elif type == OP_OPEN:
                self._on_open(r)
            elif type == OP_REJECT:
                self._on_reject(r)
            elif type == OP_CLOSE:
                self._on_close(r)
            return  # unknown control messages are ignored
        slot = self._remote[remote_id - 1] if remote_id <= len(self._remote) else None
        if slot is None:
            return  # closed or unknown channel: could be a message in flight
        payload = r.raw()
        if slot.pending is not None:
            slot.pending.append((type, payload))
            self._buffered += 512 + len(payload)
            if self._buffered > MAX_BUFFERED:
                raise ProtomuxError(f"peer buffered over {MAX_BUFFERED} bytes on channels nobody accepted")
            return
        assert slot.channel is not None
        slot.channel._deliver(type, payload)

    def _on_batch(self, r: Reader, depth: int) -> None:
        if depth >= MAX_BATCH_DEPTH:
            raise ProtomuxError("batch nested too deep")
        end = r.end
        remote_id = r.uint()
        corked = False
        try:
            while r.pos < end:
                n = r.uint()
                if n == 0:
                    remote_id = r.uint()
                    continue
                item_end = min(r.pos + n, end)  # protomux clamps an overlong length
                if item_end != end and not corked:
                    corked = True  # several items: answer with one batch, as protomux does
                    self.cork()
                r.end = item_end
                self._decode(remote_id, r, depth + 1)
                r.pos = item_end
                r.end = end
        finally:
            r.end = end
            if corked:
                self.uncork()

    def _on_open(self, r: Reader) -> None:
        remote_id = r.uint()
        raw_protocol = r.buffer()
        protocol = raw_protocol.decode("utf-8", "replace")  # as JS decodes: never throws
        id = r.optional_buffer()
        handshake = r.raw()
        if remote_id == 0:
            raise ProtomuxError("remote opened channel id 0 (the control channel)")
        if remote_id > MAX_CHANNELS:
            raise ProtomuxError(f"remote channel id {remote_id} is above {MAX_CHANNELS}")
        rid = remote_id - 1
        if len(self._remote) == rid:
            self._remote.append(None)
        if rid >= len(self._remote) or self._remote[rid] is not None:
            raise ProtomuxError(f"invalid open: remote id {remote_id} skips ahead or is still in use")
        info = self._get_info(protocol, id)
        if info.outgoing:
            local_id = info.outgoing.pop(0)
            chan = self._local[local_id - 1]
            if chan is None:
                # We closed it before this open came. protomux frees the id here; we also repeat
                # our close, so a peer that accepted the open late frees its slot for that id
                # instead of choking on our next open with it ("Invalid open message").
                self._free.append(local_id - 1)
                self._gc(info)
                self._write_control(OP_CLOSE, Writer().uint(local_id).getvalue())
                return
            slot = _Remote(protocol, id, handshake, None, chan)
            self._remote[rid] = slot
            chan.remote_id = remote_id
            self._fully_open(chan, slot)
            return
        self._remote[rid] = _Remote(protocol, id, handshake, [])
        if _key(protocol, id) in self._notify or protocol in self._notify_any:
            info.incoming.append(remote_id)
            self._events.append(ChannelRequested(protocol, id, remote_id))
            return
        self._reject_remote(remote_id)
        self._gc(info)
        self._events.append(OpenRejected(protocol, id, remote_id))

    def _on_reject(self, r: Reader) -> None:
        local_id = r.uint()
        for info in self._infos.values():
            if local_id not in info.outgoing:
                continue
            info.outgoing.remove(local_id)
            chan = self._local[local_id - 1]
            self._free.append(local_id - 1)
            if chan is not None:
                self._close_channel(chan, is_remote=True, rejected=True)
            self._gc(info)
            return
        raise ProtomuxError(f"invalid reject: we have no unanswered open with id {local_id}")

    def _on_close(self, r: Reader) -> None:
        remote_id = r.uint()
        if remote_id == 0 or remote_id > len(self._remote):
            return
        slot = self._remote[remote_id - 1]
        if slot is None:
            return
        if slot.channel is not None:
            self._close_channel(slot.channel, is_remote=True)
            return
        # Closed before anyone here accepted it. protomux ignores this, keeps the open queued and
        # may bind it later to a channel the peer no longer has; we withdraw it with a reject,
        # which is also what frees the id on the peer's side.
        info = self._infos.get(_key(slot.protocol, slot.id))
        if info is not None and remote_id in info.incoming:
            info.incoming.remove(remote_id)
            self._reject_remote(remote_id)
            self._gc(info)


if TYPE_CHECKING:
    from relay.core import ByteStreamCore

    # mypy checks the core against relay.core's contract here (never run: the guard sees no asyncio)
    def _conforms(core: Mux) -> ByteStreamCore[Event]:
        return core
