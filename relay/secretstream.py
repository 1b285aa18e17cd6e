"""@hyperswarm/secret-stream 6.9 as a sans-IO state machine.

Every hyperdht connection — and so every blind-relay control session — is a secret stream:
`u24le(len) ‖ body` frames on a reliable byte stream, first the Noise handshake (XX run
inside the stream, or nothing when hyperdht already ran IK), then one 56-byte header each
way (stream id ‖ libsodium secretstream header), then one encrypted frame per message.
This core never touches sockets or clocks: feed it bytes and `now` (seconds, any monotonic
clock), take bytes, events and a timer deadline out. `relay.secretstream_aio` drives it
over asyncio transports. Proven against `vectors/streams.json` (`secret_stream.*`) and live
against the npm package over TCP.

Public API (stable):

- `SecretStream(initiator, *, key_pair=None, handshake=None, pattern="XX",
  remote_public_key=None, keep_alive=0.0, timeout=0.0, filter_empty=None)`
  - `handshake`: a `HandshakeResult` (or a completed `NoiseHandshake`) when hyperdht already
    ran IK; then no Noise frames are sent and the header goes out on `start`.
  - `start(now)`: the raw stream is connected; the initiator sends Noise message 1 (or
    both sides send their header on the handed-over path).
  - `receive(data, now)`, `receive_eof(now)`, `connection_closed(error=None)`: raw side in.
  - `send(message, now=None)`: one message = one frame (buffered until our header is out).
  - `end()`: no more writes; once `take_eof()` returns True (once) the driver half-closes
    the raw stream after writing `data_to_send()`.
  - `destroy(error=None)`: tear down now (queued output is dropped).
  - `data_to_send() -> bytes`: raw bytes to write, in order.
  - `next_event() -> Event | None` / `events()`: `Opened`, `Message`, `Ended`, `Closed`.
  - `get_timer() -> float | None`, `handle_timer(now)`: keep-alive and idle timeout.
  - `send_unordered(message) -> bytes`, `receive_unordered(envelope) -> bytes | None`:
    secretbox envelopes for UDX datagrams (section 4.8).
  - attributes: `initiator`, `public_key`, `remote_public_key`, `handshake_hash`, `opened`,
    `closed`, `error`, `raw_bytes_read`, `raw_bytes_written`.
- `HandshakeResult(tx, rx, hash, public_key, remote_public_key)`; `.from_noise(nh)`.
- `stream_id(handshake_hash, initiator) -> bytes`: `NoiseSecretStream.id`.
- Events: `Opened(public_key, remote_public_key, handshake_hash)` when keys exist (JS
  `connect`); `Message(data)`; `Ended()` when the peer half-closed; `Closed(error)` exactly
  once, `error` is a `SecretStreamError` or None for a clean close.
- `SecretStreamError`: the single error type; a tampered frame, a bad header, a failed
  handshake or a timeout each produce one, carried by `Closed` (never raised from
  `receive`). `send`/`end` on a dead stream raise it.

Keep-alive and timeout are seconds (hyperdht uses keep-alive 5 s). With keep-alive on,
received empty messages are dropped, as in JS.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

from nacl.bindings import (
    crypto_secretbox_easy,
    crypto_secretbox_open_easy,
    crypto_secretstream_xchacha20poly1305_init_pull,
    crypto_secretstream_xchacha20poly1305_init_push,
    crypto_secretstream_xchacha20poly1305_pull,
    crypto_secretstream_xchacha20poly1305_push,
    crypto_secretstream_xchacha20poly1305_state,
    sodium_increment,
)
from nacl.exceptions import CryptoError

from relay.keys import KeyPair, blake2b, key_pair, namespace
from relay.noise import NoiseError, NoiseHandshake

__all__ = [
    "ABYTES",
    "HEADERBYTES",
    "MAX_MESSAGE",
    "NS_INITIATOR",
    "NS_RESPONDER",
    "NS_SEND",
    "Closed",
    "Ended",
    "Event",
    "FrameTooLarge",
    "HandshakeResult",
    "Message",
    "Opened",
    "SecretStream",
    "SecretStreamError",
    "stream_id",
]

NS_INITIATOR, NS_RESPONDER, NS_SEND = namespace("hyperswarm/secret-stream", 3)
ABYTES = 17
HEADERBYTES = 24
KEYBYTES = 32
IDHEADERBYTES = 32 + HEADERBYTES
MAX_FRAME = (1 << 24) - 1
MAX_MESSAGE = MAX_FRAME - ABYTES
_HEADER_PREFIX = IDHEADERBYTES.to_bytes(3, "little")

# Only PyNaCl's public bindings: they take and return `bytes` (one copy of each frame in and
# out), which costs little next to the cipher and cannot break with a PyNaCl release or leave
# C views of our buffers alive. The tag is not checked, as in JS (every frame is a MESSAGE).
_push = crypto_secretstream_xchacha20poly1305_push
_pull = crypto_secretstream_xchacha20poly1305_pull


class SecretStreamError(Exception):
    """The secret stream failed; the message says what the peer sent or what timed out."""


class FrameTooLarge(SecretStreamError):
    """The peer announced a frame above the stream's `max_frame`."""


class HandshakeResult(NamedTuple):
    """A finished Noise handshake handed to the stream (hyperdht's `NoiseWrap.final()`)."""

    tx: bytes
    rx: bytes
    hash: bytes
    public_key: bytes
    remote_public_key: bytes

    @classmethod
    def from_noise(cls, nh: NoiseHandshake) -> HandshakeResult:
        if not nh.complete or nh.tx is None or nh.rx is None or nh.hash is None or nh.remote_static is None:
            raise SecretStreamError("Noise handshake is not complete")
        return cls(nh.tx, nh.rx, nh.hash, nh.static.public_key, nh.remote_static)


class Opened(NamedTuple):
    public_key: bytes
    remote_public_key: bytes
    handshake_hash: bytes


class Message(NamedTuple):
    data: bytes


class Ended(NamedTuple):
    pass


class Closed(NamedTuple):
    error: SecretStreamError | None


Event = Opened | Message | Ended | Closed


def stream_id(handshake_hash: bytes, initiator: bool) -> bytes:
    """`NoiseSecretStream.id`: BLAKE2b-256(NS_INITIATOR|NS_RESPONDER; key = handshake hash)."""
    return blake2b(NS_INITIATOR if initiator else NS_RESPONDER, key=handshake_hash)


_HANDSHAKE, _HEADER, _OPEN, _CLOSED = range(4)


class SecretStream:
    """One secret stream end; see the module docstring for the driving protocol."""

    # slots: a relay holds one per session (4,096 at the default cap)
    __slots__ = (
        "_counter",
        "_counter_start",
        "_events",
        "_forced_ephemeral",
        "_forced_header",
        "_handoff",
        "_key_pair",
        "_last_read",
        "_last_write",
        "_need",
        "_noise",
        "_now",
        "_out",
        "_partial",
        "_pattern",
        "_pending",
        "_phase",
        "_pull_state",
        "_push_state",
        "_recv_key",
        "_rx",
        "_send_key",
        "_started",
        "closed",
        "eof_pending",
        "error",
        "filter_empty",
        "handshake_hash",
        "initiator",
        "keep_alive",
        "local_ended",
        "max_frame",
        "opened",
        "public_key",
        "raw_bytes_read",
        "raw_bytes_written",
        "remote_ended",
        "remote_public_key",
        "timeout",
    )

    def __init__(
        self,
        initiator: bool,
        *,
        key_pair: KeyPair | None = None,
        handshake: HandshakeResult | NoiseHandshake | None = None,
        pattern: str = "XX",
        remote_public_key: bytes | None = None,
        keep_alive: float = 0.0,
        timeout: float = 0.0,
        filter_empty: bool | None = None,
        max_frame: int = MAX_FRAME,
    ) -> None:
        self.initiator = initiator
        self.max_frame = max_frame
        """Frames announcing more than this many bytes end the stream (a relay's control stream
        carries tiny messages; without a bound one peer parks 16 MiB per stream)."""
        self.keep_alive = keep_alive
        self.timeout = timeout
        self.filter_empty = keep_alive > 0 if filter_empty is None else filter_empty
        self.public_key: bytes | None = None
        self.remote_public_key: bytes | None = remote_public_key
        self.handshake_hash: bytes | None = None
        self.opened = False
        self.closed = False
        self.error: SecretStreamError | None = None
        self.local_ended = False
        self.remote_ended = False
        self.eof_pending = False
        self.raw_bytes_read = 0
        self.raw_bytes_written = 0

        if isinstance(handshake, NoiseHandshake):
            handshake = HandshakeResult.from_noise(handshake)
        self._handoff = handshake
        self._key_pair = key_pair
        self._pattern = pattern
        self._noise: NoiseHandshake | None = None
        self._phase = _HANDSHAKE
        self._started = False
        self._now = 0.0

        self._out: list[bytes] = []
        self._pending: list[bytes] = []  # app messages queued before our header is out
        self._events: list[Event] = []  # not a deque: ~600 bytes empty, one per relay session

        # frame parser
        self._partial = bytearray()  # bytes of an incomplete frame (length prefix included)
        self._need = 3  # bytes still missing in _partial for the current step

        self._push_state: crypto_secretstream_xchacha20poly1305_state | None = None
        self._pull_state: crypto_secretstream_xchacha20poly1305_state | None = None

        self._send_key: bytes | None = None
        self._recv_key: bytes | None = None
        self._counter: bytearray | None = None
        self._counter_start = b""
        self._rx = b""

        self._last_write = 0.0
        self._last_read = 0.0
        self._forced_header: bytes | None = None  # test hook: fixed secretstream header
        self._forced_ephemeral: KeyPair | None = None  # test hook: fixed Noise ephemeral key

    # --- lifecycle --------------------------------------------------------------------------

    def start(self, now: float) -> None:
        """The raw stream is connected: begin the handshake, or send the header at once."""
        if self._started:
            return
        self._started = True
        self._now = self._last_write = self._last_read = now
        if self.closed:
            return
        try:
            self._start()
        except SecretStreamError as e:
            self._close(e)

    def _start(self) -> None:
        if self._handoff is not None:
            h = self._handoff
            self._setup(h.tx, h.rx, h.hash, h.public_key, h.remote_public_key)
            return
        kp = self._key_pair if self._key_pair is not None else key_pair()
        try:
            self._noise = NoiseHandshake(
                self._pattern,  # type: ignore[arg-type]
                self.initiator,
                kp,
                remote_static=self.remote_public_key if self._pattern != "XX" else None,
                ephemeral=self._forced_ephemeral,
            )
        except NoiseError as e:
            raise SecretStreamError(f"Noise handshake failed: {e}") from None
        self.public_key = kp.public_key
        if self.initiator:
            self._handshake_send()

    def end(self) -> None:
        """Finish writing: queued messages go out, then the raw stream is half-closed."""
        if self.closed:
            raise SecretStreamError("stream is closed")
        if self.local_ended:
            return
        self.local_ended = True
        if self._phase == _OPEN or self._phase == _HEADER:
            self.eof_pending = True
        # else: eof goes out once the header (and pending messages) have been written
        if self.remote_ended:
            self._close(None)

    def destroy(self, error: SecretStreamError | str | None = None) -> None:
        """Tear the stream down now; queued output is dropped."""
        if isinstance(error, str):
            error = SecretStreamError(error)
        self._close(error)

    def connection_closed(self, error: BaseException | None = None) -> None:
        """The raw stream is gone (closed or errored)."""
        if self.closed:
            return
        if error is not None:
            self._close(SecretStreamError(f"raw stream failed: {error}"))
        elif not self.opened or self._phase != _OPEN:
            self._close(SecretStreamError("raw stream closed before the secret stream was set up"))
        else:  # as in JS: a raw close after setup destroys the stream without an error
            self._close(None)

    def receive_eof(self, now: float) -> None:
        """The peer half-closed the raw stream: no more messages will come."""
        if self.closed or self.remote_ended:
            return
        self._now = now
        self.remote_ended = True
        if self._phase != _OPEN:
            self._fail("raw stream ended before the secret stream was set up")
            return
        self._events.append(Ended())
        if self.local_ended:
            self._close(None)

    # --- output -----------------------------------------------------------------------------

    def send(self, message: bytes | bytearray | memoryview, now: float | None = None) -> None:
        """Queue one message; it arrives at the peer as exactly one message."""
        if self.closed:
            raise SecretStreamError(f"cannot send on a closed stream ({self.error or 'closed'})")
        if self.local_ended:
            raise SecretStreamError("cannot send after end()")
        n = message.nbytes if isinstance(message, memoryview) else len(message)
        if n > MAX_MESSAGE:
            raise SecretStreamError(
                f"Message is too large for an atomic write. Max size is {MAX_FRAME} bytes (got {n + ABYTES})"
            )
        if type(message) is not bytes:
            message = bytes(message)  # also flattens memoryviews of wider items to their bytes
        if now is not None:
            self._now = now
        if self._push_state is None:
            self._pending.append(message)
            return
        self._encrypt(message, n)

    def _encrypt(self, message: bytes, n: int) -> None:
        # prefix and ciphertext stay two pieces: `data_to_send` joins them in its single copy
        clen = n + ABYTES
        out = self._out
        out.append(clen.to_bytes(3, "little"))
        out.append(_push(self._push_state, message))  # type: ignore[arg-type]
        self.raw_bytes_written += 3 + clen
        self._last_write = self._now

    def take_eof(self) -> bool:
        """True exactly once, when the driver should half-close the raw stream (after `end`)."""
        if self.eof_pending:
            self.eof_pending = False
            return True
        return False

    def data_to_send(self) -> bytes:
        """Everything to write to the raw stream now, in order."""
        out = self._out
        if not out:
            return b""
        self._out = []
        if len(out) == 1:
            return out[0]
        return b"".join(out)

    # --- input ------------------------------------------------------------------------------

    def receive(self, data: bytes | bytearray | memoryview, now: float) -> None:
        """Raw bytes from the peer, chunked any way; never raises for bad input."""
        if self.closed:
            return
        self._now = self._last_read = now
        if not self._started:
            self.start(now)
        try:
            self._parse(data)
        except SecretStreamError as e:
            self._close(e)
        except Exception as e:  # defensive: a bug here must not leak a raw library error
            self._close(SecretStreamError(f"internal error while reading: {e!r}"))

    def _parse(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        size = len(view)
        pos = 0
        partial = self._partial
        while pos < size and not self.closed:
            if partial:
                # finish the frame we were collecting
                take = min(self._need, size - pos)
                partial += view[pos : pos + take]
                pos += take
                self._need -= take
                if self._need:
                    return
                if len(partial) == 3:
                    self._need = partial[0] | partial[1] << 8 | partial[2] << 16
                    self._check_frame(self._need)
                    if self._need:
                        continue
                body = memoryview(partial)[3:]
                try:
                    self._frame(body)
                finally:
                    body.release()
                partial.clear()
                self._need = 3
                continue
            if size - pos < 3:
                partial += view[pos:size]
                self._need = 3 - (size - pos)
                return
            length = view[pos] | view[pos + 1] << 8 | view[pos + 2] << 16
            self._check_frame(length)
            end = pos + 3 + length
            if end > size:
                partial += view[pos:size]
                self._need = end - size
                return
            if self._phase == _OPEN and length >= ABYTES:
                # the common case: a whole encrypted message inside this chunk, copied once
                self._decrypt(view[pos + 3 : end].tobytes())
                self.raw_bytes_read += length + 3
            else:
                self._frame(view[pos + 3 : end])
            pos = end

    def _check_frame(self, length: int) -> None:
        if length > self.max_frame:
            raise FrameTooLarge(f"frame of {length} bytes is over this stream's limit of {self.max_frame}")

    def _decrypt(self, ciphertext: bytes) -> None:
        """Open one message frame (at least ABYTES long) and queue its `Message`."""
        try:
            plain = _pull(self._pull_state, ciphertext)[0]  # type: ignore[arg-type]
        except CryptoError:
            plain = None
        if plain is None:  # raised here, outside the `except`: no chained library traceback
            raise SecretStreamError(
                f"message {len(ciphertext)}-byte frame failed authentication (tampered, reordered or wrong keys)"
            )
        if plain or not self.filter_empty:
            self._events.append(Message(plain))

    def _frame(self, body: memoryview) -> None:
        n = len(body)
        self.raw_bytes_read += n + 3
        phase = self._phase
        if phase == _OPEN:
            if n < ABYTES:
                raise SecretStreamError(f"Invalid message received: {n}-byte frame is shorter than {ABYTES}")
            self._decrypt(body.tobytes())
        elif phase == _HEADER:
            if n != IDHEADERBYTES:
                raise SecretStreamError(f"Invalid header message received: {n} bytes, expected {IDHEADERBYTES}")
            raw = bytes(body)
            expected = stream_id(self.handshake_hash, not self.initiator)  # type: ignore[arg-type]
            if raw[:32] != expected:
                raise SecretStreamError("Invalid header received: stream id does not match the handshake")
            st = crypto_secretstream_xchacha20poly1305_state()
            crypto_secretstream_xchacha20poly1305_init_pull(st, raw[32:], self._rx)
            self._pull_state = st
            self._phase = _OPEN
        elif phase == _HANDSHAKE:
            assert self._noise is not None
            try:
                self._noise.recv(bytes(body))
            except NoiseError as e:
                raise SecretStreamError(f"Noise handshake failed: {e}") from None
            if self._noise.complete:
                self._handshake_done()
            else:
                self._handshake_send()

    # --- handshake and setup ----------------------------------------------------------------

    def _handshake_send(self) -> None:
        assert self._noise is not None
        try:
            msg = self._noise.send()
        except NoiseError as e:
            raise SecretStreamError(f"Noise handshake failed: {e}") from None
        self._out.append(len(msg).to_bytes(3, "little") + msg)
        self.raw_bytes_written += 3 + len(msg)
        self._last_write = self._now
        if self._noise.complete:
            self._handshake_done()

    def _handshake_done(self) -> None:
        nh = self._noise
        assert nh is not None and nh.tx is not None and nh.rx is not None and nh.hash is not None
        self._noise = None
        self._setup(nh.tx, nh.rx, nh.hash, nh.static.public_key, nh.remote_static)  # type: ignore[arg-type]

    def _setup(self, tx: bytes, rx: bytes, hash_: bytes, public_key: bytes, remote_public_key: bytes) -> None:
        if len(tx) < KEYBYTES or len(rx) < KEYBYTES or len(hash_) != 64:
            raise SecretStreamError("handshake result needs 32-byte tx/rx and a 64-byte hash")
        self._rx = bytes(rx[:KEYBYTES])
        self.public_key = public_key
        self.remote_public_key = remote_public_key
        self.handshake_hash = bytes(hash_)
        st = crypto_secretstream_xchacha20poly1305_state()
        if self._forced_header is not None:
            crypto_secretstream_xchacha20poly1305_init_pull(st, self._forced_header, bytes(tx[:KEYBYTES]))
            header = self._forced_header
        else:
            header = crypto_secretstream_xchacha20poly1305_init_push(st, bytes(tx[:KEYBYTES]))
        self._push_state = st
        self._setup_unordered()
        self._out.append(_HEADER_PREFIX + stream_id(self.handshake_hash, self.initiator) + header)
        self.raw_bytes_written += 3 + IDHEADERBYTES
        self._last_write = self._now
        self._phase = _HEADER
        self.opened = True
        self._events.append(Opened(public_key, remote_public_key, self.handshake_hash))
        pending, self._pending = self._pending, []
        for m in pending:
            self._encrypt(m, len(m))
        if self.local_ended:
            self.eof_pending = True

    # --- unordered messages (UDX datagrams) ---------------------------------------------------

    def _setup_unordered(self) -> None:
        h = self.handshake_hash
        mine, theirs = (NS_INITIATOR, NS_RESPONDER) if self.initiator else (NS_RESPONDER, NS_INITIATOR)
        self._send_key = blake2b(mine + NS_SEND, key=h)
        self._recv_key = blake2b(theirs + NS_SEND, key=h)
        start = os.urandom(8)
        self._counter = bytearray(start)
        self._counter_start = start

    def send_unordered(self, message: bytes) -> bytes:
        """Seal one datagram: `counter(8) ‖ secretbox(message, nonce = counter ‖ 0*16)`."""
        if self._counter is None or self._send_key is None:
            raise SecretStreamError("unordered messages need a finished handshake")
        if self.closed:
            raise SecretStreamError("stream is closed")
        counter = bytes(sodium_increment(bytes(self._counter)))
        if counter == self._counter_start:
            self._close(SecretStreamError("udp send nonce exhausted"))
            raise self.error  # type: ignore[misc]
        self._counter = bytearray(counter)
        return counter + crypto_secretbox_easy(bytes(message), counter + bytes(16), self._send_key)

    def receive_unordered(self, envelope: bytes) -> bytes | None:
        """Open one datagram; None (silently dropped, as in JS) if short or forged."""
        if self._recv_key is None or len(envelope) < 24:
            return None
        env = bytes(envelope)
        try:
            return crypto_secretbox_open_easy(env[8:], env[:8] + bytes(16), self._recv_key)
        except CryptoError:
            return None

    # --- timers -----------------------------------------------------------------------------

    def get_timer(self) -> float | None:
        """Earliest deadline (same clock as `now`) at which `handle_timer` must run."""
        if self.closed or not self._started:
            return None
        deadlines = []
        if self.keep_alive > 0 and self.opened and not self.local_ended:
            deadlines.append(self._last_write + self.keep_alive)
        if self.timeout > 0:
            deadlines.append(self._last_read + self.timeout)
        return min(deadlines) if deadlines else None

    def handle_timer(self, now: float) -> None:
        """Send a keep-alive (empty message) or destroy on idle timeout, when due."""
        if self.closed:
            return
        self._now = now
        if self.timeout > 0 and now >= self._last_read + self.timeout:
            self._fail("Stream timed out")
            return
        if self.keep_alive > 0 and self.opened and not self.local_ended and now >= self._last_write + self.keep_alive:
            self.send(b"", now)

    # --- events -----------------------------------------------------------------------------

    def next_event(self) -> Event | None:
        return self._events.pop(0) if self._events else None

    def events(self) -> Iterator[Event]:
        """Drain the queued events."""
        ev = self._events
        while ev:
            yield ev.pop(0)

    # --- internals --------------------------------------------------------------------------

    def _fail(self, reason: str) -> None:
        self._close(SecretStreamError(reason))

    def _close(self, error: SecretStreamError | None) -> None:
        if self.closed:
            return
        self.closed = True
        if error is not None:
            # the message says it all; a traceback or chained library error would pin the
            # reader's frames, and with them the caller's receive buffer, for as long as
            # anyone holds `stream.error` (and put them in GC cycles with the stream)
            error.__traceback__ = None
            error.__cause__ = error.__context__ = None
        self.error = error
        self._phase = _CLOSED
        self._noise = None
        self._partial = bytearray()
        self._pending = []
        if error is not None:
            self._out = []
        self.eof_pending = False
        self._events.append(Closed(error))

    # test hook -----------------------------------------------------------------------------

    def _force_header(self, header: bytes) -> None:
        """Use a fixed secretstream header (tests reproduce the JS vectors this way)."""
        if len(header) != HEADERBYTES:
            raise ValueError("header must be 24 bytes")
        self._forced_header = bytes(header)

    def _force_ephemeral(self, ephemeral: KeyPair) -> None:
        """Use a fixed Noise ephemeral key (the JS vectors inject one the same way)."""
        self._forced_ephemeral = ephemeral


if TYPE_CHECKING:
    from relay.core import ByteStreamCore, DrivenCore

    # mypy checks the core against relay.core's contract here (never run: the guard sees no asyncio)
    def _conforms(core: SecretStream) -> tuple[ByteStreamCore[Event], DrivenCore[Event]]:
        return core, core
