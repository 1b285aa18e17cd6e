"""Holepunch sockets: sampling how our NAT maps a fresh socket, and the client's puncher.

hyperdht punches from a socket of its own per attempt: a few DHT nodes are PINGed from it and
their replies (`to`) say how the NAT maps it (`relay.dht.holepunch.NatAnalyzer`, sans-IO). The
server's puncher is in `relay.dht.server`; both sample the same way (`sample_nat`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from relay.udx import UDXSocket

from .holepunch import HOLEPUNCH, MIN_SAMPLES, NatAnalyzer, PunchState
from .messages import Address, Internal

if TYPE_CHECKING:
    from .node import DHTNode


async def sample_nat(
    node: DHTNode, socket_name: str, state: PunchState, pinged: set[Address], closed: Callable[[], bool]
) -> None:
    """PING a few DHT nodes from a puncher socket; their replies say how our NAT maps it.

    Shared by the server's and the client's punchers (hyperdht samples the same way on both sides).
    """
    nodes = node.nodes()[::-1]
    if len(nodes) >= 8:
        nodes = nodes[5:]  # as hyperdht: skip the most recent ones
    for _ in range(2):
        batch = [n for n in nodes if n not in pinged][: max(0, MIN_SAMPLES - state.nat.sampled)]
        pinged.update(batch)
        replies = await asyncio.gather(
            *(node.request(n, Internal.PING, internal=True, socket=socket_name, retries=0) for n in batch),
            return_exceptions=True,
        )
        for r in replies:
            if not isinstance(r, BaseException):
                state.nat.add(r.to, r.peer.address)
        if state.nat.done or closed():
            break
    state.nat.give_up()


class ClientPuncher:
    """The client's per-attempt punching socket (hyperdht `Holepuncher` as initiator)."""

    def __init__(self, node: DHTNode, on_probe: Any) -> None:
        self.node = node
        host = node.local_address()[0]
        self.socket = UDXSocket(node.udx, host, 0)  # binds now: create_socket is async by signature only
        node.udx.sockets.append(self.socket)
        self.name = f"cpunch:{id(self)}"
        self.state = PunchState(NatAnalyzer(firewalled=True))
        self.local_secret = os.urandom(32)
        self.closed = False
        self.in_use = False  # the connected stream lives on this socket
        self._analyzed = asyncio.Event()
        node.add_socket(self.name, self.socket, on_probe=on_probe)

    def probe(self, addr: Address) -> None:
        if not self.closed:
            self.socket.send(HOLEPUNCH, addr)

    async def sample_nat(self) -> None:
        """PING a few DHT nodes from this socket: their `to` fields say how our NAT maps it."""
        await sample_nat(self.node, self.name, self.state, set(), lambda: self.closed)
        self._analyzed.set()

    async def analyzed(self, timeout: float) -> None:
        if self.state.nat.done:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._analyzed.wait(), timeout)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.state.punching = False
        self._analyzed.set()
        self.node.remove_socket(self.name)
        with contextlib.suppress(Exception):
            self.socket.close()
