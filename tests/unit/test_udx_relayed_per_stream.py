"""Per relay stream: `UDXStream.relayed_packets`/`relayed_bytes` count what its peer sent that the
relay passed on to the partner's peer, whichever path passed it: the lone-datagram reader, the
batch paths (spread, runs, interleaved runs, small batches, GRO buffers), the portable reader,
the slow path, packets held early, and the kernel (its element counters, read once a second and
when a pair leaves it). On loopback with raw UDP sockets as the peers; the kernel tests load a
real nftables table (root, as the suite runs).

Every test also checks the books: the streams' counts add up to the socket's `relayed_*`.
"""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from relay.udx import DATA, DESTROY, HEARTBEAT, UDX, UDXSocket, UDXStream, encode, mmsg
from relay.udx.packet import DEFAULT_RWND
from tests.unit.test_udx_offload import A_ID, D_ID, _fw, _gso_send, _relay
from tests.unit.test_udx_small_batches import _pairs, recv_n

pytestmark = pytest.mark.skipif(not mmsg.available(), reason="recvmmsg/sendmmsg batching is Linux-only")

LOOP = "127.0.0.1"
HB = len(encode(HEARTBEAT, 1, DEFAULT_RWND, 0, 0))


def counts(s: UDXStream) -> tuple[int, int]:
    return s.relayed_packets, s.relayed_bytes


def assert_books(sock: UDXSocket, streams: list[UDXStream]) -> None:
    """What the streams relayed is what the socket relayed (nothing else relays on it here)."""
    st = sock.stats
    assert sum(s.relayed_packets for s in streams) == st.relayed_packets
    assert sum(s.relayed_bytes for s in streams) == st.relayed_bytes


def data(sid: int, seq: int, size: int) -> bytes:
    return encode(DATA, sid, DEFAULT_RWND, seq, 0, os.urandom(size))


@pytest.fixture(params=["gso", "mmsg", "portable"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_slow_path_and_held_early_packets_count_for_the_stream_that_received_them(mode: str) -> None:
    """D speaks first: its heartbeat is held until the partner learns A's address, then passed
    on (D's stream's); A's heartbeat takes the slow path (A's stream's); a DESTROY from A too."""
    r = await _relay(mode)
    try:
        assert counts(r.rc) == (1, HB) and counts(r.rb) == (1, HB)
        assert_books(r.sock, [r.rb, r.rc])
        bye = encode(DESTROY, r.rb.id, DEFAULT_RWND, 0, 0)
        r.ea.sendto(bye, r.addr)
        await r.recv(r.ed, 1)
        assert r.rb.closed and r.rc.closed
        assert counts(r.rb) == (2, HB + len(bye)) and counts(r.rc) == (1, HB)
        assert_books(r.sock, [r.rb, r.rc])
    finally:
        r.ea.close()
        r.ed.close()
        r.udx.close()


async def test_a_lone_datagram_counts_for_its_stream(mode: str) -> None:
    """One datagram in a wake: the inline path (batched reader) or the portable reader."""
    r = await _relay(mode)
    try:
        before = r.sock.stats.forwarded_reads
        d = data(r.rb.id, 1, 300)
        r.ea.sendto(d, r.addr)
        await r.recv(r.ed, 1)
        if mode != "portable":
            assert r.sock.stats.forwarded_reads == before + 1  # the lone-datagram path took it
        assert counts(r.rb) == (2, HB + len(d)) and counts(r.rc) == (1, HB)
        # the other way, now that D's stream has a route too
        back = [data(r.rc.id, 1, 100), data(r.rc.id, 2, 100)]
        for x in back:
            r.ed.sendto(x, r.addr)
            await r.recv(r.ea, 1)
        assert counts(r.rc) == (3, HB + 2 * len(back[0]))
        assert_books(r.sock, [r.rb, r.rc])
    finally:
        r.ea.close()
        r.ed.close()
        r.udx.close()


async def test_a_run_of_one_stream_counts_once_per_datagram(mode: str) -> None:
    r = await _relay(mode)
    try:
        burst = [data(r.rb.id, seq, 1152) for seq in range(40)] + [data(r.rb.id, 40, 7)]
        for d in burst:  # no await in between: one recvmmsg batch
            r.ea.sendto(d, r.addr)
        await r.recv(r.ed, len(burst))
        assert counts(r.rb) == (1 + len(burst), HB + sum(map(len, burst)))
        assert_books(r.sock, [r.rb, r.rc])
    finally:
        r.ea.close()
        r.ed.close()
        r.udx.close()


async def test_one_datagram_each_of_many_pairs_counts_for_each_stream(mode: str) -> None:
    """The spread path: one send entry per datagram, each counted for its own stream."""
    p = await _pairs(8, mode)
    try:
        base = [counts(b) for b in p.rb]
        sizes = [50 + 10 * i for i in range(8)]
        for b, n in zip(p.rb, sizes, strict=True):
            p.ea.sendto(data(b.id, 1, n), p.addr)
        for ed in p.eds:
            await recv_n(ed, 1)
        for b, n, (k0, b0) in zip(p.rb, sizes, base, strict=True):
            assert counts(b) == (k0 + 1, b0 + 20 + n)
        assert_books(p.sock, [*p.rb, *p.rc])
    finally:
        p.close()


async def test_interleaved_runs_count_for_each_stream(mode: str) -> None:
    """Two pairs' runs interleaved in one read (regrouped stream by stream on the batched path)."""
    p = await _pairs(2, mode)
    try:
        base = [counts(b) for b in p.rb]
        burst = [data(p.rb[i % 2].id, i, 400 + i % 2) for i in range(16)]
        for d in burst:
            p.ea.sendto(d, p.addr)
        for ed in p.eds:
            await recv_n(ed, 8)
        for i, b in enumerate(p.rb):
            mine = burst[i::2]
            assert counts(b) == (base[i][0] + 8, base[i][1] + sum(map(len, mine)))
        assert_books(p.sock, [*p.rb, *p.rc])
    finally:
        p.close()


async def test_a_long_run_and_a_lone_datagram_interleaved_count_for_each_stream(mode: str) -> None:
    """Regrouped stream by stream: one stream's run and another stream's single datagram."""
    p = await _pairs(2, mode)
    try:
        base = [counts(b) for b in p.rb]
        run = [data(p.rb[0].id, i, 500) for i in range(12)]
        lone = data(p.rb[1].id, 1, 33)
        for d in [*run[:6], lone, *run[6:]]:
            p.ea.sendto(d, p.addr)
        await recv_n(p.eds[0], len(run))
        await recv_n(p.eds[1], 1)
        assert counts(p.rb[0]) == (base[0][0] + 12, base[0][1] + sum(map(len, run)))
        assert counts(p.rb[1]) == (base[1][0] + 1, base[1][1] + len(lone))
        assert_books(p.sock, [*p.rb, *p.rc])
    finally:
        p.close()


async def test_a_read_holding_a_gro_buffer_and_plain_datagrams_counts_each() -> None:
    """Slot by slot: one pair's coalesced run and another pair's plain datagram in one read."""
    p = await _pairs(2, "gso")
    try:
        base = [counts(b) for b in p.rb]
        run = [data(p.rb[0].id, i, 1000) for i in range(8)]
        plain = data(p.rb[1].id, 1, 70)
        _gso_send(p.ea, run, len(run[0]), p.addr)
        p.ea.sendto(plain, p.addr)
        await recv_n(p.eds[0], len(run))
        await recv_n(p.eds[1], 1)
        assert p.sock.stats.gro_buffers >= 1
        assert counts(p.rb[0]) == (base[0][0] + 8, base[0][1] + sum(map(len, run)))
        assert counts(p.rb[1]) == (base[1][0] + 1, base[1][1] + len(plain))
        assert_books(p.sock, [*p.rb, *p.rc])
    finally:
        p.close()


async def test_datagrams_whose_batched_send_is_refused_still_count_once() -> None:
    """A lone datagram and a many-pair batch whose `sendmsg`/`sendmmsg` meets EAGAIN go out one
    by one after it, and count once for their streams (as the socket counts them relayed)."""
    import ctypes
    import errno

    p = await _pairs(3, "mmsg")
    io = p.sock._mmsg
    assert io is not None
    real_one, real_many = io._sendmsg, io._sendmmsg
    refused: list[int] = []

    def full(*args: object) -> int:
        refused.append(1)
        ctypes.set_errno(errno.EAGAIN)
        return -1

    try:
        base = [counts(b) for b in p.rb]
        io._sendmsg = io._sendmmsg = full  # type: ignore[assignment]
        lone = data(p.rb[0].id, 1, 40)
        p.ea.sendto(lone, p.addr)
        assert await recv_n(p.eds[0], 1)
        assert refused == [1] and counts(p.rb[0]) == (base[0][0] + 1, base[0][1] + len(lone))
        assert_books(p.sock, [*p.rb, *p.rc])
        base = [counts(b) for b in p.rb]
        many = [data(b.id, 2, 20) for b in p.rb]
        for d in many:
            p.ea.sendto(d, p.addr)
        for ed in p.eds:
            await recv_n(ed, 1)
        assert len(refused) == 2
        for b, (k0, b0), d in zip(p.rb, base, many, strict=True):
            assert counts(b) == (k0 + 1, b0 + len(d))
        assert_books(p.sock, [*p.rb, *p.rc])
    finally:
        io._sendmsg, io._sendmmsg = real_one, real_many
        p.close()


async def test_a_small_batch_with_a_slow_path_datagram_counts_only_what_was_passed_on(mode: str) -> None:
    p = await _pairs(2, mode)
    try:
        base = [counts(b) for b in p.rb]
        one, two = data(p.rb[0].id, 1, 90), data(p.rb[1].id, 1, 60)
        for d in (one, encode(DATA, 0x12345678, DEFAULT_RWND, 1, 0, b"nobody"), two):
            p.ea.sendto(d, p.addr)
        await recv_n(p.eds[0], 1)
        await recv_n(p.eds[1], 1)
        assert counts(p.rb[0]) == (base[0][0] + 1, base[0][1] + len(one))
        assert counts(p.rb[1]) == (base[1][0] + 1, base[1][1] + len(two))
        assert p.sock.stats.dropped_by_cause == {"unknown_stream": 1}
        assert_books(p.sock, [*p.rb, *p.rc])
    finally:
        p.close()


async def test_gro_buffers_count_every_segment_for_its_stream() -> None:
    """A coalesced run of one stream (forwarded whole) and a mixed buffer (segment by segment)."""
    r = await _relay("gso")
    try:
        run = [data(r.rb.id, seq, 1152) for seq in range(30)] + [data(r.rb.id, 30, 3)]
        _gso_send(r.ea, run, len(run[0]), r.addr)
        await r.recv(r.ed, len(run))
        assert r.sock.stats.gro_buffers == 1
        assert counts(r.rb) == (1 + len(run), HB + sum(map(len, run)))
        fwd1, fwd2 = data(r.rb.id, 31, 180), data(r.rb.id, 32, 180)
        _gso_send(r.ea, [fwd1, encode(DATA, 0x12345678, DEFAULT_RWND, 1, 0, bytes(180)), fwd2], 200, r.addr)
        await r.recv(r.ed, 2)
        assert counts(r.rb) == (3 + len(run), HB + sum(map(len, run)) + 400)
        assert_books(r.sock, [r.rb, r.rc])
    finally:
        r.ea.close()
        r.ed.close()
        r.udx.close()


async def test_a_stream_keeps_its_count_when_its_route_goes() -> None:
    """A route carries the fast paths' counts; when it goes (the peer's address changes, the
    pair closes) they stay with the stream."""
    r = await _relay("mmsg")
    try:
        d = data(r.rb.id, 1, 500)
        r.ea.sendto(d, r.addr)
        await r.recv(r.ed, 1)
        assert r.rb.route is not None and r.rb.route.relayed_packets == 1
        r.rb.drop_route()
        assert r.rb.route is None and counts(r.rb) == (2, HB + len(d))
        assert_books(r.sock, [r.rb, r.rc])
    finally:
        r.ea.close()
        r.ed.close()
        r.udx.close()


# --- the kernel path ----------------------------------------------------------------------------


async def _kernel_pair() -> tuple[UDX, UDXSocket, UDXStream, UDXStream, socket.socket, socket.socket]:
    """A pair whose both directions are in the kernel's table (each relay stream's id its partner
    peer's, as the blind relay picks them)."""
    udx = UDX()
    sock = await udx.create_socket(LOOP, 0)
    k = sock.enable_kernel_forwarding()
    rb = udx.create_stream(D_ID, firewall=_fw(A_ID))  # faces A
    rc = udx.create_stream(A_ID, firewall=_fw(D_ID))  # faces D
    rb.relay_to(rc)
    rc.relay_to(rb)
    ea, ed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for e in (ea, ed):
        e.bind((LOOP, 0))
        e.setblocking(False)
    dst = (LOOP, sock.port)
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(20):
        ed.sendto(encode(HEARTBEAT, rc.id, DEFAULT_RWND, 0, 0), dst)
        while not rc.connected:
            await asyncio.sleep(0.001)
        ea.sendto(encode(HEARTBEAT, rb.id, DEFAULT_RWND, 0, 0), dst)
        await loop.sock_recv(ed, 2048)
        await loop.sock_recv(ea, 2048)  # D's, held until A was known
        ed.sendto(encode(HEARTBEAT, rc.id, DEFAULT_RWND, 0, 0), dst)  # D's way goes in too
        await loop.sock_recv(ea, 2048)
        while len(k.table.directions) < 2 or k._flush_handle is not None:
            await asyncio.sleep(0.001)
    return udx, sock, rb, rc, ea, ed


async def test_kernel_forwarded_packets_count_for_the_stream_whose_peer_sent_them() -> None:
    udx, sock, rb, rc, ea, ed = await _kernel_pair()
    loop = asyncio.get_running_loop()
    try:
        assert sock.kernel is not None
        py_b, py_c = counts(rb), counts(rc)
        assert py_b == (1, HB) and py_c == (2, 2 * HB)  # before the kernel: Python's
        burst = [data(rb.id, seq, 300 + seq) for seq in range(10)]
        for d in burst:
            ea.sendto(d, (LOOP, sock.port))
        for d in burst:  # the kernel forwards them: the id needs no rewrite
            assert await asyncio.wait_for(loop.sock_recv(ed, 2048), 20) == d
        assert counts(rb) == py_b  # not read yet
        sock.kernel.refresh()
        assert sock.stats.kernel_packets == len(burst)
        assert counts(rb) == (py_b[0] + len(burst), py_b[1] + sum(map(len, burst)))
        assert counts(rc) == py_c
        assert_books(sock, [rb, rc])
        # the last packets before a close are the stream's before its close is reported
        seen: list[tuple[int, int]] = []
        rc.on_close = lambda _err: seen.append(counts(rc))
        tail = [data(rc.id, seq, 64) for seq in range(3)]
        for d in tail:
            ed.sendto(d, (LOOP, sock.port))
        for d in tail:
            assert await asyncio.wait_for(loop.sock_recv(ea, 2048), 20) == d
        rb.destroy()
        assert seen == [(py_c[0] + 3, py_c[1] + sum(map(len, tail)))]
        sock.kernel.refresh()  # the totals catch up with what the streams were told
        assert_books(sock, [rb, rc])
    finally:
        ea.close()
        ed.close()
        udx.close()


async def test_a_pair_leaving_the_kernel_keeps_what_the_kernel_forwarded_for_it() -> None:
    """An address change takes the direction out of the kernel: its last counts are read then."""
    udx, sock, rb, rc, ea, ed = await _kernel_pair()
    loop = asyncio.get_running_loop()
    try:
        before = counts(rb)
        d = data(rb.id, 1, 200)
        ea.sendto(d, (LOOP, sock.port))
        assert await asyncio.wait_for(loop.sock_recv(ed, 2048), 20) == d
        assert sock.kernel is not None
        rb.change_remote(sock, A_ID, ("127.0.0.1", 9))  # leaves the kernel, both ways
        assert counts(rb) == (before[0] + 1, before[1] + len(d))
        assert sock.kernel.table.directions == {}
        await asyncio.sleep(0)  # the withdrawal's transaction
        sock.kernel.refresh()
        assert_books(sock, [rb, rc])
    finally:
        ea.close()
        ed.close()
        udx.close()
