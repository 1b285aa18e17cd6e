"""A connection the HyperDHT server hands out: UDX stream + finished handshake + secret stream.

`UDXTransport` lets the asyncio `SecretStreamProtocol` run over a `relay.udx.UDXStream`
(write / write_eof / close / abort, with drain-based back-pressure), so the secret stream
needs no second handshake: hyperdht's Noise IK result goes straight into it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from relay.secretstream import HandshakeResult, SecretStream
from relay.secretstream_aio import SecretStreamProtocol

from .messages import Address, NoisePayload

KEEP_ALIVE = 5.0  # hyperdht connectionKeepAlive, blind-relay-service setKeepAlive(5000)


#: what a closed transport's `protocol` is: nothing is delivered after the close
_CLOSED = asyncio.Protocol()


class UDXTransport:
    """asyncio-transport face of a UDX stream for `SecretStreamProtocol`."""

    def __init__(self, stream: Any, protocol: asyncio.Protocol) -> None:
        self.stream = stream
        self.protocol = protocol
        self._closing = False
        self._paused = False
        self._drain_task: asyncio.Task[None] | None = None
        stream.on_data = protocol.data_received
        stream.on_end = self._on_end
        stream.on_close = self._on_close

    def _on_end(self) -> None:
        self.protocol.eof_received()

    def _on_close(self, error: BaseException | None) -> None:
        self._closing = True
        if self._drain_task is not None:
            self._drain_task.cancel()
        protocol = self.protocol
        self.protocol = _CLOSED  # the protocol holds us as its transport: no cycle left behind
        protocol.connection_lost(error if isinstance(error, Exception) else None)

    def write(self, data: bytes) -> None:
        if self._closing or self.stream.closed:
            return
        if not self.stream.write(data) and not self._paused:
            self._paused = True
            self.protocol.pause_writing()
            self._drain_task = asyncio.ensure_future(self._wait_drain())

    async def _wait_drain(self) -> None:
        with contextlib.suppress(Exception):
            await self.stream.drain()
        self._paused = False
        self._drain_task = None
        if not self._closing:
            self.protocol.resume_writing()

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if not self.stream.closed:
            self.stream.end()

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if not self.stream.closed:
            self.stream.end()

    def abort(self) -> None:
        self._closing = True
        if not self.stream.closed:
            self.stream.destroy()

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self.stream.remote_addr
        return default


@dataclass(eq=False)
class Connection:
    """One accepted hyperdht connection, ready to use.

    `secret_stream` is the asyncio `SecretStreamProtocol` (send / recv / end / on_event);
    `stream` the raw `UDXStream` under it (its `socket`, `remote_addr`, `remote_id`).
    """

    remote_public_key: bytes
    handshake: HandshakeResult
    stream: Any
    secret_stream: SecretStreamProtocol
    remote_payload: NoisePayload
    client_address: Address
    relayed: bool
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def handshake_hash(self) -> bytes:
        return self.handshake.hash

    @property
    def remote_address(self) -> Address | None:
        return self.stream.remote_addr

    def close(self) -> None:
        self.secret_stream.end()

    def destroy(self) -> None:
        self.secret_stream.destroy()


def responder_secret_stream(
    handshake: HandshakeResult, *, keep_alive: float = KEEP_ALIVE, on_event: Any = None
) -> SecretStreamProtocol:
    """The responder end of the secret stream, not yet started (see `start_secret_stream`)."""
    return SecretStreamProtocol(SecretStream(False, handshake=handshake, keep_alive=keep_alive), on_event=on_event)


def start_secret_stream(stream: Any, proto: SecretStreamProtocol) -> UDXTransport:
    """Attach the protocol to a connected UDX stream: our header goes out now."""
    transport = UDXTransport(stream, proto)
    proto.connection_made(transport)
    return transport
