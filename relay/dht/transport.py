"""A bare UDP endpoint with the same shape as `relay.udx.UDXSocket`'s datagram side.

The DHT node only needs `send(data, addr)`, an `on_datagram(data, addr)` hook and the
bound address, so the server socket can be a UDXSocket (UDX streams and dht-rpc on one
port, as hyperdht does) and the client socket this plain endpoint.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .messages import Address

DatagramHandler = Callable[[bytes, Address], None]


class UDPEndpoint(asyncio.DatagramProtocol):
    """One bound UDP socket; every datagram goes to `on_datagram`."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.on_datagram: DatagramHandler = lambda data, addr: None
        self.closed = asyncio.Event()
        self.sent_packets = 0
        self.sent_bytes = 0
        self.received_packets = 0
        self.received_bytes = 0

    @classmethod
    async def bind(cls, host: str = "0.0.0.0", port: int = 0) -> UDPEndpoint:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_datagram_endpoint(cls, local_addr=(host, port))
        return proto

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.BaseTransport)
        self.transport = transport  # a _SelectorDatagramTransport, not a DatagramTransport subclass

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.received_packets += 1
        self.received_bytes += len(data)
        self.on_datagram(data, (addr[0], addr[1]))

    def error_received(self, exc: Exception) -> None:
        # ICMP errors (port unreachable) surface here; a lost datagram is the RPC's problem.
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()

    def send(self, data: bytes, addr: Address) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.sent_packets += 1
        self.sent_bytes += len(data)
        self.transport.sendto(data, addr)

    @property
    def address(self) -> Address:
        assert self.transport is not None
        host, port = self.transport.get_extra_info("sockname")[:2]
        return (host, port)

    async def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
            await self.closed.wait()
