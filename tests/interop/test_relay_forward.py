"""Blind forwarding in Python between two real udx-native streams, set up as blind-relay does it:
one raw stream per side, a firewall that connects it on its first packet, relay_to both ways.
With kernel forwarding also over IPv6 (relay and peers on ::1: the `inet` table's IPv6 rules)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from relay.udx import UDX, UDXSocket, UDXStream

from ._udx_peers import NodePeer

pytestmark = pytest.mark.interop

LOOP = "127.0.0.1"
LOOP6 = "::1"
MB = 1 << 20


@dataclass
class Pair:
    udx: UDX
    sock: UDXSocket
    a: NodePeer
    d: NodePeer
    rb: UDXStream  # relay stream facing A
    rc: UDXStream  # relay stream facing D
    learned: list[tuple[int, tuple[str, int]]]
    loop: str  # the loopback address of this variant's family


def blind_relay_firewall(peer_stream_id: int, learned: list[tuple[int, tuple[str, int]]]):  # type: ignore[no-untyped-def]
    """blind-relay's BlindRelayLink._onfirewall: connect to the first sender, accept the packet."""

    def firewall(stream: UDXStream, socket: UDXSocket, addr: tuple[str, int]) -> bool:
        learned.append((stream.id, addr))
        stream.connect(socket, peer_stream_id, addr)
        return False

    return firewall


def kernel_elements(sock: UDXSocket) -> int:
    """Directions in the relay's nftables table right now, as the kernel lists them."""
    assert sock.kernel is not None
    n = 0
    sets = [f"{name}{f.suffix}" for f in sock.kernel.table.families for name in ("pairs", "pairs_local")]
    for name in sets:  # remote peers' directions, loopback ones, per family
        doc = sock.kernel.nft.query(f"list set inet {sock.kernel.table.name} {name}")
        n += sum(len(item["set"].get("elem", [])) for item in doc["nftables"] if "set" in item)
    return n


@pytest.fixture(params=["gso", "no-gso", "kernel", "kernel-ipv6"])
async def pair(node: str, request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    """The relay with UDP GSO/GRO on (where the kernel has them), off (as UDX_NO_GSO=1), and with
    established pairs forwarded by nftables (each relay stream's id its partner peer's, as the
    blind relay picks them)."""
    udx = UDX()
    loop = LOOP6 if request.param == "kernel-ipv6" else LOOP
    sock = await udx.create_socket(loop, 0, use_gso=request.param != "no-gso")
    same = request.param.startswith("kernel")
    if same:
        sock.enable_kernel_forwarding()
    a = await NodePeer.start(node, host=loop)
    d = await NodePeer.start(node, host=loop)
    learned: list[tuple[int, tuple[str, int]]] = []
    try:
        rb = udx.create_stream(d.id if same else None, firewall=blind_relay_firewall(a.id, learned))
        rc = udx.create_stream(a.id if same else None, firewall=blind_relay_firewall(d.id, learned))
        rb.relay_to(rc)
        rc.relay_to(rb)
        a.cmd(cmd="connect", remote_id=rb.id, port=sock.port)
        d.cmd(cmd="connect", remote_id=rc.id, port=sock.port)
        await a.expect("connected")
        await d.expect("connected")
        yield Pair(udx, sock, a, d, rb, rc, learned, loop)
    finally:
        await a.close()
        await d.close()
        udx.close()


async def test_relay_forward_32mb_each_way_between_node_streams(pair: Pair) -> None:
    size = 32 * MB
    pair.a.cmd(cmd="send", bytes=size)
    pair.d.cmd(cmd="send", bytes=size)
    sent_a = await pair.a.expect("sent", 90)
    sent_d = await pair.d.expect("sent", 90)
    got_d = await pair.d.expect("data_end", 90)
    got_a = await pair.a.expect("data_end", 90)
    assert (got_d["bytes"], got_d["sha256"]) == (size, sent_a["sha256"])
    assert (got_a["bytes"], got_a["sha256"]) == (size, sent_d["sha256"])
    await pair.a.expect("close", 30)
    await pair.d.expect("close", 30)
    assert not pair.a.has("error") and not pair.d.has("error")
    # the relay learned each side's address from its first packet, and forwarded everything
    assert sorted(pair.learned) == sorted(
        [(pair.rb.id, (pair.loop, pair.a.port)), (pair.rc.id, (pair.loop, pair.d.port))]
    )
    st = pair.sock.stats
    kernel = pair.sock.kernel
    if kernel is not None:
        kernel.refresh()
        assert kernel_elements(pair.sock) == 2  # both directions were in the kernel
        assert kernel.stats()["directions_by_family"] == {"ipv6" if ":" in pair.loop else "ipv4": 2}
        # nearly all of it never reached Python: only each side's first packets did
        assert st.kernel_packets >= 0.99 * st.relayed_packets
        assert st.kernel_bytes >= 2 * size
    assert st.relayed_bytes >= 2 * size
    assert st.relayed_packets - st.kernel_packets == st.received_packets - st.dropped_packets
    assert st.sent_packets == st.relayed_packets - st.kernel_packets
    if kernel is None:
        assert (st.gso_sends > 0) == pair.sock.gso
    # a graceful end passes through; the relay streams stay until their owner destroys them
    assert not pair.rb.closed and not pair.rc.closed
    pair.rb.destroy()
    assert pair.rb.closed and pair.rc.closed
    assert pair.rb.id not in pair.udx.streams and pair.rc.id not in pair.udx.streams
    if kernel is not None:
        await asyncio.sleep(0)  # withdrawals take effect at the end of the loop turn
        assert kernel_elements(pair.sock) == 0


async def test_relay_forward_destroy_from_one_end_tears_the_pair_down(pair: Pair) -> None:
    pair.a.cmd(cmd="send", bytes=200_000, end=False)
    pair.d.cmd(cmd="send", bytes=200_000, end=False)
    await pair.a.expect("sent", 30)
    await pair.d.expect("sent", 30)
    closes: list[object] = []
    pair.rb.on_close = closes.append
    pair.rc.on_close = closes.append
    if pair.sock.kernel is not None:
        # both ways are in the kernel once each side's packets reached a connected partner (a
        # side whose first flight came before the other's waits for its retransmission)
        async with asyncio.timeout(30):
            while kernel_elements(pair.sock) < 2:
                await asyncio.sleep(0.05)
        # A's DESTROY is not the kernel's: Python sees it
    pair.a.cmd(cmd="destroy")
    err = await pair.d.expect("error", 30)
    assert err["code"] == "ECONNRESET"  # A's DESTROY was forwarded to D
    await pair.d.expect("close", 30)
    await pair.a.expect("close", 30)
    assert pair.rb.closed and pair.rc.closed
    assert len(closes) == 2
    assert pair.rb.id not in pair.udx.streams and pair.rc.id not in pair.udx.streams
    if pair.sock.kernel is not None:
        await asyncio.sleep(0)
        assert kernel_elements(pair.sock) == 0


async def test_relay_forward_local_close_tears_the_pair_down_silently(pair: Pair) -> None:
    pair.a.cmd(cmd="send", bytes=100_000, end=False)
    await pair.a.expect("sent", 30)
    pair.d.cmd(cmd="message", hex="00")  # D's first packet connects RC
    async with asyncio.timeout(30):
        while len(pair.learned) < 2 or pair.rb.remote_addr is None:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0)
    sent_before = pair.sock.stats.sent_packets
    pair.rc.destroy()  # e.g. the blind-relay channel closed: libudx sends nothing
    assert pair.rb.closed and pair.rc.closed
    assert pair.sock.stats.sent_packets == sent_before
    await asyncio.sleep(0)  # with kernel forwarding: out of the kernel now, its last packets counted
    if pair.sock.kernel is not None:
        assert kernel_elements(pair.sock) == 0
    relayed_before = pair.sock.stats.relayed_packets
    # whatever the ends send now reaches unknown ids: nothing is forwarded
    dropped = pair.sock.stats.dropped_packets
    pair.a.cmd(cmd="message", hex="01")
    pair.d.cmd(cmd="message", hex="02")
    async with asyncio.timeout(30):
        while pair.sock.stats.dropped_packets < dropped + 2:
            await asyncio.sleep(0.01)
    assert pair.sock.stats.relayed_packets == relayed_before
    await asyncio.sleep(0)
    assert "02" not in [ev["hex"] for ev in pair.a.log if ev["event"] == "message"]
    assert not pair.d.has("message") and not pair.d.has("error")
