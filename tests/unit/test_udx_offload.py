"""UDP GSO/GRO on the relay's batched path, source-address pinning of relayed streams, drop causes.

All on loopback with raw UDP sockets as the two relayed peers, so every forwarded datagram can
be compared byte for byte with what was sent.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from relay.udx import DATA, DESTROY, HEARTBEAT, UDX, UDXSocket, UDXStream, encode, mmsg
from relay.udx.packet import DEFAULT_RWND
from relay.udx.stream import UDXCore

LOOP = "127.0.0.1"
A_ID, D_ID = 0xA0000001, 0xD0000004
SOL_UDP, UDP_SEGMENT = 17, 103

pytestmark = pytest.mark.skipif(not mmsg.available(), reason="recvmmsg/sendmmsg batching is Linux-only")


@dataclass
class Relay:
    udx: UDX
    sock: UDXSocket
    rb: UDXStream  # faces A
    rc: UDXStream  # faces D
    ea: socket.socket
    ed: socket.socket

    @property
    def addr(self) -> tuple[str, int]:
        return (LOOP, self.sock.port)

    async def recv(self, e: socket.socket, count: int) -> list[bytes]:
        loop = asyncio.get_running_loop()
        return [await asyncio.wait_for(loop.sock_recv(e, 65536), 20) for _ in range(count)]


def _fw(peer_id: int):  # type: ignore[no-untyped-def]
    def fw(stream, s, addr):  # type: ignore[no-untyped-def]
        stream.connect(s, peer_id, addr)
        return False

    return fw


async def _relay(mode: str, coalesce_us: int | None = None) -> Relay:
    udx = UDX()
    sock = await udx.create_socket(LOOP, 0, use_mmsg=mode != "portable", use_gso=mode == "gso", coalesce_us=coalesce_us)
    rb = udx.create_stream(firewall=_fw(A_ID))
    rc = udx.create_stream(firewall=_fw(D_ID))
    rb.relay_to(rc)
    rc.relay_to(rb)
    ea = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for e in (ea, ed):
        e.bind((LOOP, 0))
        e.setblocking(False)
        e.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
    r = Relay(udx, sock, rb, rc, ea, ed)
    # both peers speak first (as secret-stream's headers do), so the relay learns both addresses
    ed.sendto(encode(HEARTBEAT, rc.id, DEFAULT_RWND, 0, 0), r.addr)
    async with asyncio.timeout(20):
        while not rc.connected:
            await asyncio.sleep(0.001)
    ea.sendto(encode(HEARTBEAT, rb.id, DEFAULT_RWND, 0, 0), r.addr)
    assert await r.recv(ed, 1) == [encode(HEARTBEAT, D_ID, DEFAULT_RWND, 0, 0)]
    # D's heartbeat was held until RB learned A's address, then forwarded
    assert await r.recv(ea, 1) == [encode(HEARTBEAT, A_ID, DEFAULT_RWND, 0, 0)]
    return r


@pytest.fixture(params=["gso", "mmsg", "portable"])
async def relay(request: pytest.FixtureRequest) -> AsyncIterator[Relay]:
    r = await _relay(request.param)
    yield r
    r.ea.close()
    r.ed.close()
    r.udx.close()


def _rewritten(d: bytes, rid: int) -> bytes:
    return d[:4] + struct.pack("<I", rid) + d[8:]


def test_udx_offload_support_is_detected_and_udx_no_gso_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert mmsg.offload_support() == (True, True)  # Linux >= 5.0 has both; CI runs such a kernel
    monkeypatch.setenv("UDX_NO_GSO", "1")
    assert mmsg.offload_support() == (False, False)


async def test_udx_gso_forwards_a_run_as_one_segmented_send_byte_exact() -> None:
    r = await _relay("gso")
    assert r.sock.gso and r.sock.gro
    assert r.sock.offload() == {"gso": True, "gro": True, "gso_fallbacks": 0}
    burst = [encode(DATA, r.rb.id, DEFAULT_RWND, seq, 0, os.urandom(1152)) for seq in range(40)]
    burst.append(encode(DATA, r.rb.id, DEFAULT_RWND, 40, 0, b"short tail"))
    for d in burst:  # no await in between: the relay reads them as one recvmmsg batch
        r.ea.sendto(d, r.addr)
    got = await r.recv(r.ed, len(burst))
    assert got == [_rewritten(d, D_ID) for d in burst]
    st = r.sock.stats
    assert st.gso_sends >= 1 and st.gso_segments >= 2
    assert st.relayed_packets == 2 + len(burst) and st.sent_packets == st.relayed_packets
    assert st.dropped_packets == 0 and st.send_errors == 0
    r.udx.close()


def _gso_send(e: socket.socket, datagrams: list[bytes], seg: int, dst: tuple[str, int]) -> None:
    e.sendmsg([b"".join(datagrams)], [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", seg))], 0, dst)


async def test_udx_gro_coalesced_run_is_split_rewritten_and_forwarded_byte_exact() -> None:
    """A sends one UDP_SEGMENT buffer; the relay's GRO socket receives it coalesced, rewrites every
    segment's id at once and forwards it segmented; D (no GRO) receives the datagrams one by one."""
    r = await _relay("gso")
    burst = [encode(DATA, r.rb.id, DEFAULT_RWND, seq, 0, os.urandom(1152)) for seq in range(30)]
    burst.append(encode(DATA, r.rb.id, DEFAULT_RWND, 30, 0, b"tail"))
    _gso_send(r.ea, burst, len(burst[0]), r.addr)
    got = await r.recv(r.ed, len(burst))
    assert got == [_rewritten(d, D_ID) for d in burst]
    st = r.sock.stats
    assert st.gro_buffers == 1 and st.gro_segments == len(burst)
    assert st.received_packets == 2 + len(burst)
    assert st.relayed_packets == 2 + len(burst) and st.dropped_packets == 0
    r.udx.close()


async def test_udx_gro_mixed_buffer_is_taken_segment_by_segment() -> None:
    """Segments of one coalesced buffer for different streams: forwarded ones rewritten, an
    unknown id counted, a local stream's packet delivered — each on its own."""
    r = await _relay("gso")
    seg = 200
    fwd1 = encode(DATA, r.rb.id, DEFAULT_RWND, 1, 0, os.urandom(seg - 20))
    unknown = encode(DATA, 0x12345678, DEFAULT_RWND, 1, 0, os.urandom(seg - 20))
    fwd2 = encode(DATA, r.rb.id, DEFAULT_RWND, 2, 0, os.urandom(seg - 20))
    garbage = bytes([0x42]) * seg
    _gso_send(r.ea, [fwd1, unknown, fwd2, garbage], seg, r.addr)
    got = await r.recv(r.ed, 2)
    assert got == [_rewritten(fwd1, D_ID), _rewritten(fwd2, D_ID)]
    st = r.sock.stats
    async with asyncio.timeout(20):
        while st.dropped_packets < 2:
            await asyncio.sleep(0.001)
    assert st.gro_buffers == 1 and st.gro_segments == 4
    assert st.dropped_by_cause == {"unknown_stream": 1, "garbage": 1}
    r.udx.close()


async def test_udx_gso_refused_by_the_kernel_falls_back_and_counts_it() -> None:
    """EIO for a segmented entry (a device without checksum offload): GSO goes off for this
    socket, the run is resent datagram by datagram, nothing is lost or reordered."""
    r = await _relay("gso")
    io = r.sock._mmsg
    assert io is not None
    real = io._sendmmsg
    refused: list[int] = []

    def no_gso(fd: int, hdr: ctypes.c_void_p, n: int, flags: int) -> int:
        first = io.entry_of(hdr.value or 0)
        if io.segmented(first):  # this entry carries UDP_SEGMENT
            refused.append(first)
            ctypes.set_errno(errno.EIO)
            return -1
        return int(real(fd, hdr, 1, flags))

    io._sendmmsg = no_gso
    burst = [encode(DATA, r.rb.id, DEFAULT_RWND, seq, 0, os.urandom(1000)) for seq in range(20)]
    for d in burst:
        r.ea.sendto(d, r.addr)
    got = await r.recv(r.ed, len(burst))
    assert got == [_rewritten(d, D_ID) for d in burst]
    assert len(refused) == 1
    assert not r.sock.gso and r.sock.offload()["gso_fallbacks"] == 1
    # later runs go out one datagram per entry, and still arrive
    more = [encode(DATA, r.rb.id, DEFAULT_RWND, seq, 0, os.urandom(1000)) for seq in range(20, 30)]
    for d in more:
        r.ea.sendto(d, r.addr)
    assert await r.recv(r.ed, len(more)) == [_rewritten(d, D_ID) for d in more]
    assert len(refused) == 1 and r.sock.stats.send_errors == 0
    io._sendmmsg = real
    r.udx.close()


async def test_udx_relayed_stream_drops_packets_from_other_addresses(relay: Relay) -> None:
    """Once a relayed stream has its peer's address, another address can neither inject data
    nor tear the pair down with a forged DESTROY; both are counted as `wrong_address`."""
    x = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    x.bind(("127.0.0.7", 0))  # another host on loopback
    y = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    y.bind((LOOP, 0))  # same host, other port
    st = relay.sock.stats
    for s in (x, y):
        for _ in range(3):
            s.sendto(encode(DATA, relay.rb.id, DEFAULT_RWND, 5, 0, b"injected"), relay.addr)
        s.sendto(encode(DESTROY, relay.rb.id, DEFAULT_RWND, 5, 0), relay.addr)
        s.sendto(encode(DESTROY, relay.rc.id, DEFAULT_RWND, 5, 0), relay.addr)
    async with asyncio.timeout(20):
        while st.dropped_packets < 10:
            await asyncio.sleep(0.001)
    assert st.dropped_by_cause == {"wrong_address": 10}
    assert not relay.rb.closed and not relay.rc.closed
    # the real peers still relay both ways, and nothing injected came through before it
    d = encode(DATA, relay.rb.id, DEFAULT_RWND, 1, 0, b"real")
    relay.ea.sendto(d, relay.addr)
    assert await relay.recv(relay.ed, 1) == [_rewritten(d, D_ID)]
    back = encode(DATA, relay.rc.id, DEFAULT_RWND, 1, 0, b"back")
    relay.ed.sendto(back, relay.addr)
    assert await relay.recv(relay.ea, 1) == [_rewritten(back, A_ID)]
    # and the real peer's DESTROY still tears the pair down
    relay.ed.sendto(encode(DESTROY, relay.rc.id, DEFAULT_RWND, 2, 2), relay.addr)
    assert await relay.recv(relay.ea, 1) == [encode(DESTROY, A_ID, DEFAULT_RWND, 2, 2)]
    assert relay.rb.closed and relay.rc.closed
    x.close()
    y.close()


async def test_udx_drop_causes_add_up_to_dropped_packets(relay: Relay) -> None:
    lonely = relay.udx.create_stream()  # no firewall: drops packets from anyone
    raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    raw.bind((LOOP, 0))
    for d in (b"junk", bytes(40), encode(DATA, 0x0BADBEEF, 0, 0, 0), encode(DATA, lonely.id, 0, 0, 0)):
        raw.sendto(d, relay.addr)
    st = relay.sock.stats
    async with asyncio.timeout(20):
        while st.dropped_packets < 4:
            await asyncio.sleep(0.001)
    assert st.dropped_by_cause == {"garbage": 2, "unknown_stream": 1, "firewalled": 1}
    assert sum(st.dropped_by_cause.values()) == st.dropped_packets
    relay.sock.count_dropped("garbage")  # what an on_datagram handler reports
    assert st.dropped_by_cause["garbage"] == 3 and st.dropped_packets == 5
    raw.close()


def test_udx_out_of_order_bytes_per_stream_are_bounded() -> None:
    """Parking out-of-order packets cannot grow a stream's memory past `max_reorder_bytes`;
    the in-order packet is always taken, and what was refused is repaired by retransmission."""
    core = UDXCore(1, max_reorder_bytes=20_000)
    core.connect(2)
    payloads = [os.urandom(1000) for _ in range(200)]
    accepted = [core.receive(encode(DATA, 1, DEFAULT_RWND, seq, 0, payloads[seq]), 0.0) for seq in range(1, 200)]
    assert core.reorder_bytes <= 20_000
    assert accepted.count(True) == 20_000 // (1000 + 128)
    assert core.drop_reason == "reorder_limit" and core.stats.extra["reorder_limit"] == 199 - accepted.count(True)
    assert core.receive(encode(DATA, 1, DEFAULT_RWND, 0, 0, payloads[0]), 0.0)
    assert core.reorder_bytes == 0 and core.ack == 1 + accepted.count(True)
    for seq in range(core.ack, 200):  # the sender's retransmissions, in order now
        assert core.receive(encode(DATA, 1, DEFAULT_RWND, seq, 0, payloads[seq]), 1.0)
    delivered = b"".join(ev.data for ev in core.events if hasattr(ev, "data"))
    assert delivered == b"".join(payloads)


async def test_udx_socket_counts_reorder_limit_drops() -> None:
    udx = UDX()
    sock = await udx.create_socket(LOOP, 0)
    s = udx.create_stream(max_reorder_bytes=4096)
    raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    raw.bind((LOOP, 0))
    s.connect(sock, 77, raw.getsockname())
    for seq in range(1, 101):
        raw.sendto(encode(DATA, s.id, DEFAULT_RWND, seq, 0, bytes(1000)), (LOOP, sock.port))
    async with asyncio.timeout(20):
        while sock.stats.received_packets < 100:
            await asyncio.sleep(0.001)
    assert s.core.reorder_bytes <= 4096
    assert sock.stats.dropped_by_cause == {"reorder_limit": 100 - 4096 // 1128}
    raw.close()
    udx.close()


async def test_udx_python_streams_send_segmented_and_receive_coalesced() -> None:
    """Between two Python endpoints a stream's runs go out with UDP_SEGMENT and arrive coalesced."""
    udx_a, udx_b = UDX(), UDX()
    sa = await udx_a.create_socket(LOOP, 0)
    sb = await udx_b.create_socket(LOOP, 0)
    a, b = udx_a.create_stream(), udx_b.create_stream()
    a.connect(sa, b.id, (LOOP, sb.port))
    b.connect(sb, a.id, (LOOP, sa.port))
    payload = os.urandom(4_000_000)
    got = bytearray()

    async def reader() -> None:
        while chunk := await b.read():
            got.extend(chunk)

    r = asyncio.ensure_future(reader())
    for i in range(0, len(payload), 65536):
        if not a.write(payload[i : i + 65536]):
            await a.drain()
    a.end()
    await asyncio.wait_for(r, 60)
    assert bytes(got) == payload
    assert sa.stats.gso_sends > 0 and sa.stats.gso_segments > sa.stats.gso_sends
    assert sb.stats.gro_buffers > 0 and sb.stats.gro_segments > sb.stats.gro_buffers
    udx_a.close()
    udx_b.close()


async def test_udx_relay_keeps_per_destination_order_across_interleaved_runs_and_destroy(relay: Relay) -> None:
    """Runs of A's data broken by D's ACKs, then a DESTROY at the end of a run: D gets A's
    datagrams in order with the DESTROY last, A gets D's; then the pair is gone."""
    a_sent = [encode(DATA, relay.rb.id, DEFAULT_RWND, seq, 0, os.urandom(1000)) for seq in range(12)]
    d_sent = [encode(0, relay.rc.id, DEFAULT_RWND, 0, seq) for seq in range(3)]
    destroy = encode(DESTROY, relay.rb.id, DEFAULT_RWND, 12, 0)
    for k in range(3):  # no await: one recvmmsg batch on the batched paths
        for d in a_sent[4 * k : 4 * k + 4]:
            relay.ea.sendto(d, relay.addr)
        relay.ed.sendto(d_sent[k], relay.addr)
    relay.ea.sendto(destroy, relay.addr)
    got_d = await relay.recv(relay.ed, len(a_sent) + 1)
    assert got_d == [_rewritten(d, D_ID) for d in [*a_sent, destroy]]
    assert await relay.recv(relay.ea, len(d_sent)) == [_rewritten(d, A_ID) for d in d_sent]
    assert relay.rb.closed and relay.rc.closed


async def test_udx_relay_forwards_interleaved_streams_one_run_each_in_order(relay: Relay) -> None:
    """A's data between D's ACKs in one batch: each peer gets the other's datagrams in order,
    and with GSO each stream's run leaves as one segmented send (not cut at every ACK)."""
    a_sent = [encode(DATA, relay.rb.id, DEFAULT_RWND, seq, 0, os.urandom(1000)) for seq in range(12)]
    d_sent = [encode(0, relay.rc.id, DEFAULT_RWND, 0, seq) for seq in range(6)]
    first = encode(0, relay.rc.id, DEFAULT_RWND, 0, 0)  # D's first relayed packet sets up its route
    relay.ed.sendto(first, relay.addr)
    assert await relay.recv(relay.ea, 1) == [_rewritten(first, A_ID)]
    sends0 = relay.sock.stats.gso_sends
    for k in range(6):  # no await: one recvmmsg batch on the batched paths
        for d in a_sent[2 * k : 2 * k + 2]:
            relay.ea.sendto(d, relay.addr)
        relay.ed.sendto(d_sent[k], relay.addr)
    assert await relay.recv(relay.ed, len(a_sent)) == [_rewritten(d, D_ID) for d in a_sent]
    assert await relay.recv(relay.ea, len(d_sent)) == [_rewritten(d, A_ID) for d in d_sent]
    if relay.sock.gso:
        assert relay.sock.stats.gso_sends - sends0 == 2
    assert not relay.rb.closed and not relay.rc.closed


async def test_udx_coalescing_hold_releases_what_arrived_during_it() -> None:
    """A burst starts a hold (the reader pauses); what arrives during the hold is forwarded
    when its timer ends it, nothing is stranded when traffic stops mid-hold, and afterwards
    the reader is armed again for a lone datagram."""
    r = await _relay("gso", coalesce_us=500_000)
    try:
        fast = r.sock.fast
        assert fast is not None
        mod = fast._moderation
        assert mod is not None
        # let the setup's hold (if any) end: the reader is armed again
        async with asyncio.timeout(20):
            while mod.holding or not fast._reading:
                await asyncio.sleep(0.01)
        burst = [encode(DATA, r.rb.id, DEFAULT_RWND, seq, 0, os.urandom(1000)) for seq in range(8)]
        holds = r.sock.stats.holds
        for d in burst:
            r.ea.sendto(d, r.addr)
        assert await r.recv(r.ed, len(burst)) == [_rewritten(d, D_ID) for d in burst]  # read at once
        assert r.sock.stats.holds == holds + 1 and mod.holding and not fast._reading
        later = [encode(DATA, r.rb.id, DEFAULT_RWND, seq, 0, os.urandom(900)) for seq in range(8, 11)]
        for d in later:  # mid-hold, then the traffic stops
            r.ea.sendto(d, r.addr)
        assert await r.recv(r.ed, len(later)) == [_rewritten(d, D_ID) for d in later]
        async with asyncio.timeout(20):  # the next hold gathers nothing: the reader is re-armed
            while mod.holding or not fast._reading:
                await asyncio.sleep(0.01)
        lone = encode(DATA, r.rb.id, DEFAULT_RWND, 11, 0, b"x" * 40)
        r.ea.sendto(lone, r.addr)
        assert await r.recv(r.ed, 1) == [_rewritten(lone, D_ID)]
    finally:
        r.ea.close()
        r.ed.close()
        r.udx.close()


@pytest.mark.parametrize("mode", ["gso", "mmsg"])
async def test_udx_relay_many_interleaved_pairs_each_destination_in_order(mode: str) -> None:
    """Three pairs on one socket, their datagrams (data one way, ACKs the other, runs of 1 to
    9) interleaved in one batch: every peer gets exactly its partner's datagrams, in order."""
    udx = UDX()
    sock = await udx.create_socket(LOOP, 0, use_gso=mode == "gso")
    addr = (LOOP, sock.port)
    loop = asyncio.get_running_loop()
    ends: list[tuple[UDXStream, socket.socket, int]] = []  # relay stream, its peer's socket, peer id
    try:
        for p in range(3):
            pair = []
            for side in range(2):
                e = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                e.bind((LOOP, 0))
                e.setblocking(False)
                e.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
                peer_id = 0xB0000000 + 16 * p + side
                pair.append((udx.create_stream(firewall=_fw(peer_id)), e, peer_id))
            pair[0][0].relay_to(pair[1][0])
            pair[1][0].relay_to(pair[0][0])
            ends += pair
        for k, (s, e, _) in enumerate(ends):  # each peer speaks first: addresses learned, routes built
            e.sendto(encode(HEARTBEAT, s.id, DEFAULT_RWND, 0, 0), addr)
            if k % 2:
                for x in (k - 1, k):
                    partner = ends[x ^ 1]
                    await asyncio.wait_for(loop.sock_recv(partner[1], 2048), 20)
        for k, (s, e, _) in enumerate(ends):
            partner = ends[k ^ 1]
            e.sendto(encode(HEARTBEAT, s.id, DEFAULT_RWND, 1, 0), addr)
            await asyncio.wait_for(loop.sock_recv(partner[1], 2048), 20)
        sent: dict[int, list[bytes]] = {k: [] for k in range(len(ends))}
        order = [0, 0, 1, 2, 2, 2, 3, 4, 5, 0, 1, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2, 3, 4, 0, 0, 0, 0, 0, 1]
        for seq, k in enumerate(order, start=2):
            s, e, _ = ends[k]
            size = 1000 if k % 2 == 0 else 0  # data one way, bare ACKs the other
            d = encode(DATA if size else 0, s.id, DEFAULT_RWND, seq, 0, os.urandom(size))
            sent[k].append(d)
            e.sendto(d, addr)  # no await: one recvmmsg batch
        for k in range(len(ends)):
            partner = ends[k ^ 1]
            got = [await asyncio.wait_for(loop.sock_recv(partner[1], 65536), 20) for _ in sent[k]]
            assert got == [_rewritten(d, partner[2]) for d in sent[k]]
        assert sock.stats.dropped_packets == 0
    finally:
        for _, e, _ in ends:
            e.close()
        udx.close()
