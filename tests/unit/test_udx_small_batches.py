"""The relay's paths for small and many-pair batches (a chatty pair's one-datagram wake; one
datagram each of many pairs in one read), on loopback with raw UDP sockets as the peers.

Each burst is sent with no await in between, so the relay reads it as one recvmmsg batch.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from dataclasses import dataclass

import pytest

from relay.udx import DATA, DESTROY, HEARTBEAT, UDX, UDXSocket, UDXStream, encode, mmsg
from relay.udx.packet import DEFAULT_RWND

LOOP = "127.0.0.1"

pytestmark = pytest.mark.skipif(not mmsg.available(), reason="recvmmsg/sendmmsg batching is Linux-only")


@dataclass
class Pairs:
    udx: UDX
    sock: UDXSocket
    rb: list[UDXStream]  # face A (peer ids a_ids[i])
    rc: list[UDXStream]  # face D (peer ids d_ids[i])
    a_ids: list[int]
    d_ids: list[int]
    ea: socket.socket
    eds: list[socket.socket]  # one D end per pair: each pair's datagrams go their own way
    peer_host: str = LOOP

    @property
    def ed(self) -> socket.socket:
        return self.eds[0]

    @property
    def addr(self) -> tuple[str, int]:
        return (self.peer_host, self.sock.port)

    def close(self) -> None:
        for e in (self.ea, *self.eds):
            e.close()
        self.udx.close()


def _fw(peer_id: int):  # type: ignore[no-untyped-def]
    def fw(stream, s, addr):  # type: ignore[no-untyped-def]
        stream.connect(s, peer_id, addr)
        return False

    return fw


async def recv_n(e: socket.socket, count: int) -> list[bytes]:
    loop = asyncio.get_running_loop()
    return [await asyncio.wait_for(loop.sock_recv(e, 65536), 20) for _ in range(count)]


async def _pairs(n: int, mode: str, relay_host: str = LOOP, peer_host: str = LOOP) -> Pairs:
    """`n` relayed pairs on one relay socket; all A ends share one socket, each D end has its own."""
    udx = UDX()
    sock = await udx.create_socket(relay_host, 0, use_mmsg=mode != "portable", use_gso=mode == "gso")
    a_ids = [0xA0000000 + i for i in range(n)]
    d_ids = [0xD0000000 + i for i in range(n)]
    rb = [udx.create_stream(firewall=_fw(a)) for a in a_ids]
    rc = [udx.create_stream(firewall=_fw(d)) for d in d_ids]
    for b, c in zip(rb, rc, strict=True):
        b.relay_to(c)
        c.relay_to(b)
    family = socket.AF_INET6 if ":" in peer_host else socket.AF_INET
    ea = socket.socket(family, socket.SOCK_DGRAM)
    eds = [socket.socket(family, socket.SOCK_DGRAM) for _ in range(n)]
    for e in (ea, *eds):
        e.bind((peer_host, 0))
        e.setblocking(False)
        e.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    p = Pairs(udx, sock, rb, rc, a_ids, d_ids, ea, eds, peer_host)
    for c, ed in zip(rc, eds, strict=True):  # D speaks first, then A: the relay learns both addresses
        ed.sendto(encode(HEARTBEAT, c.id, DEFAULT_RWND, 0, 0), p.addr)
    async with asyncio.timeout(20):
        while not all(c.connected for c in rc):
            await asyncio.sleep(0.001)
    for b in rb:
        ea.sendto(encode(HEARTBEAT, b.id, DEFAULT_RWND, 0, 0), p.addr)
    for ed in eds:
        await recv_n(ed, 1)  # A's heartbeat
    await recv_n(ea, n)  # D's, held until each pair was complete
    async with asyncio.timeout(20):  # a datagram each way gives both directions a fast-path route
        while mode != "portable" and not all(s.route is not None for s in (*rb, *rc)):
            for b, c, ed in zip(rb, rc, eds, strict=True):
                if b.route is None:
                    ea.sendto(encode(HEARTBEAT, b.id, DEFAULT_RWND, 0, 0), p.addr)
                    await recv_n(ed, 1)
                if c.route is None:
                    ed.sendto(encode(HEARTBEAT, c.id, DEFAULT_RWND, 0, 0), p.addr)
                    await recv_n(ea, 1)
    return p


def _rewritten(d: bytes, rid: int) -> bytes:
    return d[:4] + struct.pack("<I", rid) + d[8:]


@pytest.fixture(params=["gso", "mmsg", "portable"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_small_batch_keeps_order_around_a_datagram_the_fast_path_does_not_take(mode: str) -> None:
    """fwd, a UDX datagram for no stream, fwd: the first is sent before the second is looked
    at, both forwarded ones arrive in order, the stray one is counted."""
    p = await _pairs(1, mode)
    st = p.sock.stats
    relayed, reads = st.relayed_packets, st.reads
    one = encode(DATA, p.rb[0].id, DEFAULT_RWND, 1, 0, os.urandom(256))
    two = encode(DATA, p.rb[0].id, DEFAULT_RWND, 2, 0, os.urandom(256))
    stray = encode(DATA, 0x12345678, DEFAULT_RWND, 1, 0, os.urandom(256))
    for d in (one, stray, two):
        p.ea.sendto(d, p.addr)
    assert await recv_n(p.ed, 2) == [_rewritten(one, p.d_ids[0]), _rewritten(two, p.d_ids[0])]
    assert st.relayed_packets == relayed + 2
    assert st.dropped_by_cause.get("unknown_stream") == 1
    if mode != "portable":
        assert st.reads == reads + 1  # one read: the small-batch path took all three
    p.close()


async def test_a_destroy_in_a_small_batch_follows_the_data_before_it_and_closes_the_pair(mode: str) -> None:
    p = await _pairs(1, mode)
    data = encode(DATA, p.rb[0].id, DEFAULT_RWND, 1, 0, os.urandom(256))
    destroy = encode(DESTROY, p.rb[0].id, DEFAULT_RWND, 2, 0)
    p.ea.sendto(data, p.addr)
    p.ea.sendto(destroy, p.addr)
    assert await recv_n(p.ed, 2) == [_rewritten(data, p.d_ids[0]), _rewritten(destroy, p.d_ids[0])]
    async with asyncio.timeout(20):
        while not (p.rb[0].closed and p.rc[0].closed):
            await asyncio.sleep(0.001)
    p.close()


async def test_one_datagram_each_of_many_pairs_in_one_read_reaches_each_partner(mode: str) -> None:
    """24 pairs, one datagram each, both ways interleaved in one burst: every datagram reaches
    its own partner's peer with that peer's id, byte exact."""
    p = await _pairs(24, mode)
    st = p.sock.stats
    relayed = st.relayed_packets
    to_d = [encode(DATA, b.id, DEFAULT_RWND, 5, 0, os.urandom(200 + i)) for i, b in enumerate(p.rb)]
    to_a = [encode(DATA, c.id, DEFAULT_RWND, 7, 0, os.urandom(300 + i)) for i, c in enumerate(p.rc)]
    for x, y, ed in zip(to_d, to_a, p.eds, strict=True):
        p.ea.sendto(x, p.addr)
        ed.sendto(y, p.addr)
    for x, d, ed in zip(to_d, p.d_ids, p.eds, strict=True):
        assert await recv_n(ed, 1) == [_rewritten(x, d)]  # at its own partner's peer
    got_a = await recv_n(p.ea, len(to_a))
    assert sorted(got_a) == sorted(_rewritten(y, a) for y, a in zip(to_a, p.a_ids, strict=True))
    assert st.relayed_packets == relayed + 48 and st.dropped_packets == 0
    p.close()


async def test_a_few_pairs_in_one_read_each_reach_their_partner_whatever_the_order(mode: str) -> None:
    """Reads of a few datagrams of different pairs (a chatty relay's usual wake), the pairs in a
    new order each time: every datagram leaves with its own partner's id for its own partner's
    peer, so nothing a previous read stored (destination, id) is sent again."""
    p = await _pairs(4, mode)
    st = p.sock.stats
    for burst, order in enumerate(([0, 1, 2], [2, 0, 1], [3, 1], [1, 3, 0, 2])):
        reads, relayed = st.reads, st.relayed_packets
        sent = {i: encode(DATA, p.rb[i].id, DEFAULT_RWND, burst, 0, os.urandom(100 + i)) for i in order}
        for i in order:
            p.ea.sendto(sent[i], p.addr)
        for i in order:
            assert await recv_n(p.eds[i], 1) == [_rewritten(sent[i], p.d_ids[i])]
        assert st.relayed_packets == relayed + len(order)
        if mode != "portable":
            assert st.reads == reads + 1  # one read carried the burst
    for ed in p.eds:
        with pytest.raises(BlockingIOError):
            ed.recv(65536)
    assert st.dropped_packets == 0
    p.close()


async def test_one_datagram_from_another_address_in_a_many_pair_batch_is_dropped_alone(mode: str) -> None:
    """The same burst with one datagram for pair 3 sent from a third address: only that one is
    dropped (`wrong_address`), every other pair's datagram is forwarded."""
    p = await _pairs(12, mode)
    st = p.sock.stats
    x = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    x.bind(("127.0.0.7", 0))
    to_d = [encode(DATA, b.id, DEFAULT_RWND, 5, 0, os.urandom(256)) for b in p.rb]
    for i, d in enumerate(to_d):
        (x if i == 3 else p.ea).sendto(d, p.addr)
    for i, d in enumerate(to_d):
        if i != 3:
            assert await recv_n(p.eds[i], 1) == [_rewritten(d, p.d_ids[i])]
    async with asyncio.timeout(20):
        while st.dropped_by_cause.get("wrong_address", 0) < 1:
            await asyncio.sleep(0.001)
    assert st.dropped_by_cause == {"wrong_address": 1}
    x.close()
    p.close()


async def test_a_lone_datagram_from_another_address_is_dropped_not_forwarded(mode: str) -> None:
    """A read of one datagram (a chatty pair's usual wake) from an address that is not the
    stream's peer: dropped as `wrong_address`; the peer's next datagram is what D gets."""
    p = await _pairs(1, mode)
    st = p.sock.stats
    x = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    x.bind(("127.0.0.7", 0))
    received = st.received_packets
    x.sendto(encode(DATA, p.rb[0].id, DEFAULT_RWND, 9, 0, b"forged"), p.addr)
    async with asyncio.timeout(20):
        while st.received_packets == received:
            await asyncio.sleep(0.001)
    legit = encode(DATA, p.rb[0].id, DEFAULT_RWND, 9, 0, b"from the peer")
    p.ea.sendto(legit, p.addr)
    assert await recv_n(p.ed, 1) == [_rewritten(legit, p.d_ids[0])]
    assert st.dropped_by_cause == {"wrong_address": 1}
    x.close()
    p.close()


async def test_a_lone_datagram_that_finds_the_send_buffer_full_is_sent_when_writable() -> None:
    """The one-datagram path's send meets EAGAIN: the datagram is queued, not lost, and goes
    out in order before the next one."""
    import ctypes
    import errno

    p = await _pairs(1, "mmsg")
    io = p.sock._mmsg
    assert io is not None
    real = io._sendmsg
    refused: list[int] = []

    def full_once(fd: int, hdr: ctypes.c_void_p, flags: int) -> int:
        if not refused:
            refused.append(fd)
            ctypes.set_errno(errno.EAGAIN)
            return -1
        return int(real(fd, hdr, flags))

    io._sendmsg = full_once  # type: ignore[assignment]
    first = encode(DATA, p.rb[0].id, DEFAULT_RWND, 1, 0, b"first")
    p.ea.sendto(first, p.addr)
    assert await recv_n(p.ed, 1) == [_rewritten(first, p.d_ids[0])]
    second = encode(DATA, p.rb[0].id, DEFAULT_RWND, 2, 0, b"second")
    p.ea.sendto(second, p.addr)
    assert await recv_n(p.ed, 1) == [_rewritten(second, p.d_ids[0])]
    assert refused and p.sock.stats.send_errors == 0
    io._sendmsg = real
    p.close()


@pytest.mark.parametrize("path", ["gso", "mmsg"])
async def test_ipv6_pairs_pin_the_whole_source_address_on_the_small_paths(path: str) -> None:
    """A dual-stack relay socket, peers on ::1. A forger on 127.0.0.1 with A's own port arrives
    as ::ffff:127.0.0.1 and the same port: only the address words differ from A's pin. Alone
    (the one-datagram path) and amid A's datagrams (the small-batch path) it is dropped;
    A's datagrams reach D in order."""
    p = await _pairs(1, path, relay_host="::", peer_host="::1")
    st = p.sock.stats
    x = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    x.bind(("127.0.0.1", p.ea.getsockname()[1]))  # A's port, another address
    relay_v4 = ("127.0.0.1", p.sock.port)
    received = st.received_packets
    x.sendto(encode(DATA, p.rb[0].id, DEFAULT_RWND, 9, 0, b"forged"), relay_v4)
    async with asyncio.timeout(20):
        while st.received_packets == received:
            await asyncio.sleep(0.001)
    one = encode(DATA, p.rb[0].id, DEFAULT_RWND, 9, 0, b"one")
    two = encode(DATA, p.rb[0].id, DEFAULT_RWND, 10, 0, b"two")
    p.ea.sendto(one, p.addr)
    x.sendto(encode(DATA, p.rb[0].id, DEFAULT_RWND, 10, 0, b"forged"), relay_v4)
    p.ea.sendto(two, p.addr)
    assert await recv_n(p.ed, 2) == [_rewritten(one, p.d_ids[0]), _rewritten(two, p.d_ids[0])]
    async with asyncio.timeout(20):
        while st.dropped_by_cause.get("wrong_address", 0) < 2:
            await asyncio.sleep(0.001)
    assert st.dropped_by_cause == {"wrong_address": 2} and st.relayed_packets >= 4
    x.close()
    p.close()


async def test_the_sockets_route_table_follows_the_streams_routes() -> None:
    """The fast paths look routes up in the socket's table, not through the streams: a route
    is in it exactly while its stream has it, so a closed pair's datagrams never take a route
    it no longer has (they reach no stream: counted, not forwarded)."""
    p = await _pairs(3, "mmsg")
    table = p.sock.routes
    assert {sid: r for sid, r in table.items()} == {s.id: s.route for s in (*p.rb, *p.rc)}
    p.rb[1].drop_route()  # both directions of pair 1 leave the fast path
    assert set(table) == {s.id for s in (p.rb[0], p.rc[0], p.rb[2], p.rc[2])}
    p.rb[2].destroy()  # a pair that closes takes both its routes with it
    assert set(table) == {p.rb[0].id, p.rc[0].id}
    st = p.sock.stats
    relayed, dropped = st.relayed_packets, st.dropped_packets
    p.ea.sendto(encode(DATA, p.rb[2].id, DEFAULT_RWND, 1, 0, b"closed pair"), p.addr)
    p.ea.sendto(encode(DATA, p.rb[0].id, DEFAULT_RWND, 1, 0, b"open pair"), p.addr)
    got = await recv_n(p.eds[0], 1)
    assert got == [_rewritten(encode(DATA, p.rb[0].id, DEFAULT_RWND, 1, 0, b"open pair"), p.d_ids[0])]
    async with asyncio.timeout(20):
        while st.dropped_packets == dropped:
            await asyncio.sleep(0.001)
    assert st.relayed_packets == relayed + 1
    with pytest.raises(BlockingIOError):
        p.eds[2].recv(65536)
    p.close()
