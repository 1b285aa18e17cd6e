"""blind-relay client side, sans-IO (npm `blind-relay` 1.6.1 `Client`).

A peer that wants its raw UDX stream relayed opens the `("blind-relay", id = its own public
key)` protomux channel on its secret-stream connection to the relay and sends
`pair{isInitiator, token, id: <its raw stream id>, seq: 0}`. When the other peer sent the same
token with the opposite role, the relay answers each side with `pair{isInitiator, token, id:
<the relay's stream id for that side>}`; the peer then connects its raw stream to the relay's
address with that id. Both peers learn the token from the hyperdht handshake payload
(`relayThrough: {publicKey, token}`).

    client = BlindRelayClient(id=my_public_key)
    client.pair(True, token, raw_stream.id)
    for msg in client.data_to_send(): secret_stream.send(msg)
    client.receive(msg, now)                        # one secret-stream message from the relay
    while (ev := client.next_event()) is not None: ...  # Paired(token, remote_id) / RelayChannelClosed
    client.connection_closed()                      # the relay connection went away

A reply for a token we did not ask for, or with the wrong role, is ignored (as in JS); bad
protomux input raises `BlindRelayError` (the caller drops the relay connection).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relay.blindrelay import PAIR_MESSAGE, PROTOCOL, UNPAIR_MESSAGE, BlindRelayError, Pair, Unpair
from relay.protomux import ChannelClosed, ChannelOpened, MessageReceived, Mux, ProtomuxError

__all__ = ["BlindRelayClient", "Paired", "RelayChannelClosed", "RelayChannelOpened"]


@dataclass(frozen=True, slots=True)
class Paired:
    """The relay matched `token`: connect the raw stream to the relay with `remote_id`."""

    token: bytes
    is_initiator: bool
    remote_id: int


@dataclass(frozen=True, slots=True)
class RelayChannelOpened:
    pass


@dataclass(frozen=True, slots=True)
class RelayChannelClosed:
    """The relay closed the channel (or the connection): every pending pairing is off."""

    pending: tuple[bytes, ...]


ClientEvent = Paired | RelayChannelOpened | RelayChannelClosed


class BlindRelayClient:
    """One blind-relay channel to a relay; any number of pairings on it."""

    def __init__(self, id: bytes | None, *, mux: Mux | None = None) -> None:
        self.mux = mux or Mux()
        channel = self.mux.open_channel(PROTOCOL, id, messages=[PAIR_MESSAGE, UNPAIR_MESSAGE])
        if channel is None:
            raise BlindRelayError("a blind-relay channel with this id is already open on this stream")
        self.channel = channel
        self.opened = False
        self.closed = False
        self._requests: dict[bytes, bool] = {}  # token -> is_initiator
        self._queued: deque[ClientEvent] = deque()

    @property
    def pending(self) -> int:
        return len(self._requests)

    def pair(self, is_initiator: bool, token: bytes, stream_id: int) -> None:
        if self.closed:
            raise BlindRelayError("the blind-relay channel is closed")
        if len(token) != 32:
            raise ValueError("a pairing token is 32 bytes")
        if token in self._requests:
            raise BlindRelayError("already pairing with this token")
        self._requests[token] = is_initiator
        self.channel.send(0, Pair(is_initiator, token, stream_id, 0))

    def unpair(self, token: bytes) -> None:
        self._requests.pop(token, None)
        if not self.closed:
            self.channel.send(1, Unpair(token))

    def close(self) -> None:
        if not self.channel.closed:
            self.channel.close()

    def data_to_send(self) -> list[bytes]:
        return self.mux.data_to_send()

    def receive(self, data: bytes | bytearray | memoryview, now: float) -> None:
        """One secret-stream message from the relay (its events: `next_event`)."""
        try:
            self.mux.receive(data, now)
        except ProtomuxError as e:
            raise BlindRelayError(str(e)) from e

    def connection_closed(self) -> None:
        """The relay connection went away: every pending pairing is off (`RelayChannelClosed`)."""
        self.mux.connection_closed()

    def next_event(self) -> ClientEvent | None:
        """The next event (from the relay's messages or our own calls, e.g. `close()`), or None."""
        while not self._queued and (ev := self.mux.next_event()) is not None:
            self._queued.extend(self._process([ev]))
        return self._queued.popleft() if self._queued else None

    def _process(self, events: list) -> list[ClientEvent]:
        out: list[ClientEvent] = []
        for ev in events:
            if getattr(ev, "channel", None) is not self.channel:
                continue
            if isinstance(ev, ChannelOpened):
                self.opened = True
                out.append(RelayChannelOpened())
            elif isinstance(ev, MessageReceived) and ev.type == 0 and isinstance(ev.message, Pair):
                m = ev.message
                role = self._requests.get(m.token)
                if role is None or role != m.is_initiator:
                    continue
                del self._requests[m.token]
                out.append(Paired(m.token, m.is_initiator, m.id))
            elif isinstance(ev, ChannelClosed) and not self.closed:
                self.closed = True
                pending = tuple(self._requests)
                self._requests.clear()
                out.append(RelayChannelClosed(pending))
        return out


if TYPE_CHECKING:
    from relay.core import ByteStreamCore

    # mypy checks the core against relay.core's contract here (never run: the guard sees no asyncio)
    def _conforms(core: BlindRelayClient) -> ByteStreamCore[ClientEvent]:
        return core
