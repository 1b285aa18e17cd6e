"""Where PEER_HANDSHAKE and PEER_HOLEPUNCH messages go next (`hyperdht/lib/router.js`), sans-IO.

Every hop re-sends the request with the *same tid* (a relay request), so the client's
original transaction travels client → DHT node → server → DHT node → client and the final
hop answers it with a response. These functions only decide: given the decoded message,
who sent it and where the key was announced from, they return a `Relay` (send a request
with the same tid to `to`), a `Respond` (answer the pending request, possibly to another
address), or None (drop, as hyperdht does).
"""

from __future__ import annotations

from dataclasses import dataclass

from .messages import Address, Handshake, Holepunch, Mode


@dataclass(slots=True, frozen=True)
class Relay:
    value: bytes
    to: Address


@dataclass(slots=True, frozen=True)
class Respond:
    value: bytes | None
    to: Address | None = None  # None: back to the sender
    closer_nodes: bool = False


Route = Relay | Respond | None


def route_handshake(hs: Handshake, sender: Address, relay: Address | None) -> Route:
    """An ordinary DHT node's move; `relay` is the address the key was announced from."""
    if hs.mode == Mode.FROM_CLIENT:
        if not hs.noise:
            return None
        to = hs.relay_address or relay
        if to is None:
            return Respond(None, closer_nodes=True)  # no record here: help the client route
        return Relay(Handshake(Mode.FROM_RELAY, hs.noise, sender).encode(), to)
    if hs.mode == Mode.FROM_RELAY:
        if relay is None or not hs.noise:
            return None
        return Relay(Handshake(Mode.FROM_SECOND_RELAY, hs.noise, hs.peer_address, sender).encode(), relay)
    if hs.mode == Mode.FROM_SERVER:
        if hs.peer_address is None or not hs.noise:
            return None
        return Respond(Handshake(Mode.REPLY, hs.noise, sender).encode(), to=hs.peer_address)
    return None


def server_handshake_reply(hs: Handshake, msg2: bytes, sender: Address) -> Route:
    """The server's answer carrying Noise message 2, by how message 1 reached it."""
    if hs.mode == Mode.FROM_CLIENT:
        return Respond(Handshake(Mode.REPLY, msg2).encode())
    if hs.mode == Mode.FROM_RELAY:
        return Relay(Handshake(Mode.FROM_SERVER, msg2, hs.peer_address).encode(), sender)
    if hs.mode == Mode.FROM_SECOND_RELAY and hs.relay_address is not None:
        return Relay(Handshake(Mode.FROM_SERVER, msg2, hs.peer_address).encode(), hs.relay_address)
    return None


def route_holepunch(hp: Holepunch, sender: Address, relay: Address | None) -> Route:
    """An ordinary DHT node's move for PEER_HOLEPUNCH (FROM_RELAY is the server's business)."""
    if hp.mode == Mode.FROM_CLIENT:
        to = hp.peer_address or relay
        if to is None:
            return None
        return Relay(Holepunch(Mode.FROM_RELAY, hp.id, hp.payload, sender).encode(), to)
    if hp.mode == Mode.FROM_SERVER:
        if hp.peer_address is None:
            return None
        return Respond(Holepunch(Mode.REPLY, hp.id, hp.payload, sender).encode(), to=hp.peer_address)
    return None
