"""The hyperdht client against hostile DHT nodes on loopback (no Node): bad answers are the
client's DHTError with a reason, in bounded time, never a crash or a hang."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from relay.dht import DHTError, DHTNode
from relay.dht.client import connect, public_address
from relay.dht.messages import Command, Handshake, Mode, PeerRecord, hash32
from relay.keys import key_pair
from relay.udx import UDX

pytestmark = pytest.mark.timeout(60)


class HostileHolder:
    """Holds an 'announce' for `public_key` and answers every handshake with `answer(hs)`."""

    def __init__(self, node: DHTNode, public_key: bytes, answer: Callable[[Handshake], bytes | None]) -> None:
        self.node = node
        self.public_key = public_key  # DHTNode.register_server reads it (the node keeps a forward for the key)
        self.answer = answer
        self.handshakes = 0

    def on_peer_handshake(self, inc: Any, hs: Handshake) -> None:
        self.handshakes += 1
        value = self.answer(hs)
        if value is not None:
            self.node.reply(inc, value, token=False, closer_nodes=False)


@contextlib.asynccontextmanager
async def hostile_network(answer: Callable[[Handshake], bytes | None]) -> AsyncIterator[tuple[DHTNode, bytes, Any]]:
    """A lone hostile node that claims to hold `pk`'s announce, and a client node bootstrapped on it."""
    pk = key_pair().public_key
    udx_h, udx_c = UDX(), UDX()
    hostile = DHTNode(bootstrap=[], host="127.0.0.1", udx=udx_h, firewalled=False)
    await hostile.bind()
    holder = HostileHolder(hostile, pk, answer)
    hostile.register_server(hash32(pk), holder)

    def on_request(inc: Any) -> bool:
        if inc.request.command == Command.FIND_PEER:
            hostile.reply(inc, PeerRecord(pk).encode(), closer_nodes=True)
            return True
        return False

    hostile.on_request = on_request
    client = DHTNode(bootstrap=[hostile.local_address()], host="127.0.0.1", udx=udx_c)
    try:
        await asyncio.wait_for(client.bootstrap(), 30)
        yield client, pk, holder
    finally:
        await client.close()
        await hostile.close()
        udx_c.close()
        udx_h.close()


@pytest.mark.parametrize(
    "answer, why",
    [
        (lambda hs: Handshake(Mode.REPLY, os.urandom(96)).encode(), "does not verify"),
        (lambda hs: b"\xff\xff\xff", "bad"),
        (lambda hs: Handshake(Mode.FROM_SERVER, hs.noise).encode(), "bad handshake reply"),  # our own msg1 back
        (lambda hs: None, "timed out"),  # silence
    ],
    ids=["garbage-noise", "undecodable", "wrong-mode", "silence"],
)
async def test_hostile_announce_holder_fails_the_connect_clearly(answer: Any, why: str) -> None:
    async with hostile_network(answer) as (client, pk, holder):
        started = asyncio.get_running_loop().time()
        with pytest.raises(DHTError) as e:
            await connect(client, pk, timeout=15)
        elapsed = asyncio.get_running_loop().time() - started
        assert holder.handshakes >= 1
        assert e.value.code in ("PEER_CONNECTION_FAILED", "CONNECT_TIMEOUT"), e.value
        assert why in str(e.value).lower(), e.value
        assert elapsed < 15
        assert client.internal_errors == 0  # nothing escaped the datagram boundary
        assert not [s for s in client.udx.streams.values() if not s.closed]  # the raw stream is gone


async def test_connect_needs_a_udx_and_a_32_byte_key() -> None:
    with pytest.raises(DHTError) as e:
        await connect(DHTNode(bootstrap=[]), os.urandom(32))
    assert e.value.code == "NO_UDX"
    udx = UDX()
    try:
        with pytest.raises(DHTError) as e:
            await connect(DHTNode(bootstrap=[], udx=udx), b"short")
        assert e.value.code == "BAD_KEY"
    finally:
        udx.close()


def test_public_address_skips_bogons() -> None:
    assert public_address([("127.0.0.1", 1), ("10.0.0.2", 2), ("8.8.8.8", 3)]) == ("8.8.8.8", 3)
    assert public_address([("192.168.1.1", 1), ("not-an-ip", 2)]) is None


@pytest.mark.parametrize(
    "kw, path",
    [
        ({"relaying": True, "punch": False, "server_firewall": 1}, "relay"),  # blocked: even an OPEN server
        ({"server_seen": True}, "seen"),
        ({"server_firewall": 1, "relayed": True, "holepunchable": True}, "open"),
        ({"relayed": True, "holepunchable": False}, "open"),  # answered via a node, cannot punch: try it
        ({"relayed": False}, "direct"),
        ({"relayed": True, "holepunchable": True, "claimed_open": True}, "passive"),
        ({"relayed": True, "holepunchable": True}, "holepunch"),
        ({"relayed": True, "holepunchable": True, "punch": False}, "none"),
        ({"relayed": True, "holepunchable": True, "punch": False, "relaying": True}, "relay"),
    ],
)
def test_choose_path_follows_hyperdht(kw: dict[str, Any], path: str) -> None:
    from relay.dht.client import choose_path

    args = {
        "server_firewall": 0,
        "relayed": True,
        "holepunchable": True,
        "claimed_open": False,
        "punch": True,
        "relaying": False,
        "server_seen": False,
    }
    assert choose_path(**(args | kw)) == path
