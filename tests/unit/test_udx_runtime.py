"""The asyncio runtime on loopback: socket sharing, Python<->Python streams, relay rewriting, bad input."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import socket
import struct
import tracemalloc

import pytest

from relay.udx import DATA, DESTROY, END, HEARTBEAT, MESSAGE, SACK, UDX, UDXError, encode
from relay.udx.packet import DEFAULT_RWND

LOOP = "127.0.0.1"


@pytest.fixture(params=[True, False], ids=["mmsg", "portable"])
def batched(request: pytest.FixtureRequest) -> bool:
    """Run socket-level tests on both readers: recvmmsg/sendmmsg batches and per-datagram."""
    return bool(request.param)


async def wait_for(cond, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    """Wait for a condition driven by socket traffic; the timeout is only a safety net."""
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.001)


async def connected_pair(udx_a: UDX, udx_b: UDX, batched: bool = True):  # type: ignore[no-untyped-def]
    sa = await udx_a.create_socket(LOOP, 0, use_mmsg=batched)
    sb = await udx_b.create_socket(LOOP, 0, use_mmsg=batched)
    a = udx_a.create_stream()
    b = udx_b.create_stream()
    a.connect(sa, b.id, (LOOP, sb.port))
    b.connect(sb, a.id, (LOOP, sa.port))
    return sa, sb, a, b


async def test_udx_python_streams_transfer_and_close_over_loopback(batched: bool) -> None:
    udx_a, udx_b = UDX(), UDX()
    _, _, a, b = await connected_pair(udx_a, udx_b, batched)
    payload = os.urandom(3_000_000)
    got = bytearray()

    async def reader() -> None:
        while chunk := await b.read():
            got.extend(chunk)

    r = asyncio.ensure_future(reader())
    for i in range(0, len(payload), 65536):
        if not a.write(payload[i : i + 65536]):
            await a.drain()
    a.end()
    await asyncio.wait_for(r, 30)
    assert bytes(got) == payload
    b.end()
    assert await asyncio.wait_for(a.wait_closed(), 10) is None
    assert await asyncio.wait_for(b.wait_closed(), 10) is None
    udx_a.close()
    udx_b.close()


async def test_udx_dual_stack_socket_talks_to_ipv4_peers(batched: bool) -> None:
    """A socket bound to "::" reaches IPv4 peers; addresses are reported in plain IPv4 form."""
    seen: list[tuple[str, int]] = []
    udx_a, udx_b = UDX(), UDX()
    sa = await udx_a.create_socket("::", 0, on_datagram=lambda d, addr: seen.append(addr), use_mmsg=batched)
    sb = await udx_b.create_socket(LOOP, 0)
    a, b = udx_a.create_stream(), udx_b.create_stream()
    a.connect(sa, b.id, (LOOP, sb.port))
    b.connect(sb, a.id, (LOOP, sa.port))
    a.write(b"ping")
    assert await asyncio.wait_for(b.read(), 10) == b"ping"
    b.write(b"pong")
    assert await asyncio.wait_for(a.read(), 10) == b"pong"
    sb.send(b"\x03dht", (LOOP, sa.port))
    await wait_for(lambda: bool(seen))
    assert seen == [(LOOP, sb.port)]
    back: list[bytes] = []
    sb.on_datagram = lambda d, addr: back.append(d)
    sa.send(b"\x13back", (LOOP, sb.port))  # an IPv4 destination on the IPv6 socket
    await wait_for(lambda: back == [b"\x13back"])
    assert sa.stats.send_errors == 0
    udx_a.close()
    udx_b.close()


async def test_udx_framed_stream_delivers_whole_frames() -> None:
    """framed=True hands out whole 3-byte-length-prefixed frames however the bytes were cut."""
    udx_a, udx_b = UDX(), UDX()
    sa = await udx_a.create_socket(LOOP, 0)
    sb = await udx_b.create_socket(LOOP, 0)
    a = udx_a.create_stream()
    b = udx_b.create_stream(framed=True)
    a.connect(sa, b.id, (LOOP, sb.port))
    b.connect(sb, a.id, (LOOP, sa.port))
    rng = random.Random(9)
    frames = [rng.randbytes(size) for size in (0, 1, 5, 1500, 3000, 70_000, 2)]
    wire = b"".join(len(f).to_bytes(3, "little") + f for f in frames)
    i = 0
    while i < len(wire):  # cut at random places, across frame boundaries
        step = rng.randrange(1, 4000)
        a.write(wire[i : i + step])
        i += step
    got = [await asyncio.wait_for(b.read(), 10) for _ in frames]
    assert got == [len(f).to_bytes(3, "little") + f for f in frames]
    udx_a.close()
    udx_b.close()


async def test_udx_socket_hands_foreign_datagrams_to_on_datagram(batched: bool) -> None:
    """Non-UDX datagrams go to on_datagram; a UDX datagram for no live stream is counted as
    `unknown_stream` instead (libudx passes it on, and dht-rpc can only fail to decode it)."""
    seen: list[tuple[bytes, tuple[str, int]]] = []
    udx = UDX()
    sock = await udx.create_socket(LOOP, 0, on_datagram=lambda d, a: seen.append((d, a)), use_mmsg=batched)
    s = udx.create_stream()
    raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    raw.bind((LOOP, 0))
    s.connect(sock, 77, raw.getsockname())
    foreign = [
        b"\x03\x00dht-rpc request",
        b"\x13\x00dht-rpc response",
        b"\x01",  # holepunch probe
        b"\xff\x01\x00",  # too short for UDX
        b"\xff\x02" + bytes(30),  # wrong version
    ]
    raw.sendto(encode(DATA, s.id ^ 1, DEFAULT_RWND, 0, 0, b"unknown id"), (LOOP, sock.port))
    for d in foreign:
        raw.sendto(d, (LOOP, sock.port))
    raw.sendto(encode(MESSAGE, s.id, DEFAULT_RWND, 0, 0, b"mine"), (LOOP, sock.port))
    msgs: list[bytes] = []
    s.on_message = msgs.append
    await wait_for(lambda: len(seen) == len(foreign) and msgs)
    assert [d for d, _ in seen] == foreign
    assert {a for _, a in seen} == {raw.getsockname()}
    assert msgs == [b"mine"]
    assert sock.stats.dropped_by_cause == {"unknown_stream": 1} and sock.stats.dropped_packets == 1
    sock.send(b"\x13reply", raw.getsockname())
    assert raw.recv(100) == b"\x13reply"
    raw.close()
    udx.close()


async def test_udx_destroy_propagates_between_python_streams() -> None:
    udx_a, udx_b = UDX(), UDX()
    _, _, a, b = await connected_pair(udx_a, udx_b)
    a.write(b"x")
    assert await asyncio.wait_for(b.read(), 10) == b"x"
    await a.flush()
    a.destroy()
    err = await asyncio.wait_for(b.wait_closed(), 10)
    assert isinstance(err, UDXError) and err.code == "ECONNRESET"
    with pytest.raises(UDXError):
        await b.read()
    assert a.id not in udx_a.streams and b.id not in udx_b.streams
    udx_a.close()
    udx_b.close()


def _u32(v: int) -> bytes:
    return struct.pack("<I", v)


async def test_udx_relay_rewrites_only_the_stream_id_and_learns_addresses_by_firewall(batched: bool) -> None:
    """Two raw endpoints talk through relay_to; every forwarded datagram differs only in bytes 4..7."""
    udx = UDX()
    sock = await udx.create_socket(LOOP, 0, use_mmsg=batched)
    ea = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for e in (ea, ed):
        e.bind((LOOP, 0))
        e.setblocking(False)
    loop = asyncio.get_running_loop()

    async def recv(e: socket.socket) -> bytes:
        return await asyncio.wait_for(loop.sock_recv(e, 4096), 10)

    A_ID, D_ID = 0xA0000001, 0xD0000004
    learned: list[tuple[int, tuple[str, int]]] = []

    def fw_for(peer_id: int):  # type: ignore[no-untyped-def]
        def fw(stream, s, addr):  # type: ignore[no-untyped-def]
            learned.append((stream.id, addr))
            stream.connect(s, peer_id, addr)
            return False

        return fw

    rb = udx.create_stream(firewall=fw_for(A_ID))
    rc = udx.create_stream(firewall=fw_for(D_ID))
    rb.relay_to(rc)
    rc.relay_to(rb)
    relay = (LOOP, sock.port)

    # early packet from A: RC is not connected yet, so it is held (libudx would drop it) and
    # forwarded as soon as D's first packet connects RC
    early = encode(DATA, rb.id, DEFAULT_RWND, 0, 0, b"early")
    ea.sendto(early, relay)
    await wait_for(lambda: len(learned) == 1)
    ed.sendto(encode(HEARTBEAT, rc.id, DEFAULT_RWND, 0, 0), relay)
    assert await recv(ed) == early[:4] + _u32(D_ID) + early[8:]
    assert await recv(ea) == encode(HEARTBEAT, A_ID, DEFAULT_RWND, 0, 0)

    kinds = [
        encode(DATA, rb.id, 1234, 7, 9, os.urandom(1152)),
        encode(DATA | END, rb.id, 0, 0xFFFFFFFF, 1, b"end"),
        encode(SACK, rb.id, 99, 3, 4, sacks=[(5, 9), (11, 12)]),
        encode(DATA, rb.id, 5, 6, 7, os.urandom(1200), padding=64),  # padded MTU probe
        encode(MESSAGE, rb.id, 1, 2, 3, b""),
        bytes([0xFF, 0x01, 0x2F, 0xFE]) + _u32(rb.id) + os.urandom(12),  # odd flags/offset: blind
        encode(DATA, rb.id, 1, 1, 1, os.urandom(2000)),
    ]
    for d in kinds:
        ea.sendto(d, relay)
        out = await recv(ed)
        assert out[:4] == d[:4] and out[8:] == d[8:]
        assert out[4:8] == _u32(D_ID)
        back = bytes(d[:4]) + _u32(rc.id) + bytes(d[8:])
        ed.sendto(back, relay)
        assert await recv(ea) == bytes(d[:4]) + _u32(A_ID) + bytes(d[8:])
    assert learned == [(rb.id, ea.getsockname()), (rc.id, ed.getsockname())]
    assert sock.stats.relayed_packets == 2 + 2 * len(kinds)
    assert sock.stats.dropped_packets == 0

    # a DESTROY passing through closes both relay streams after being forwarded
    ed.sendto(encode(DESTROY, rc.id, DEFAULT_RWND, 3, 3), relay)
    assert await recv(ea) == encode(DESTROY, A_ID, DEFAULT_RWND, 3, 3)
    assert rb.closed and rc.closed
    assert rb.id not in udx.streams and rc.id not in udx.streams
    # later packets hit unknown ids: nothing is forwarded
    ea.sendto(encode(DATA, rb.id, DEFAULT_RWND, 8, 0, b"late"), relay)
    await wait_for(lambda: sock.stats.dropped_packets == 1)
    with pytest.raises(BlockingIOError):
        ed.recv(2048)
    ea.close()
    ed.close()
    udx.close()


async def test_udx_relay_local_destroy_closes_partner_and_sends_nothing() -> None:
    udx = UDX()
    sock = await udx.create_socket(LOOP, 0)
    rb, rc = udx.create_stream(), udx.create_stream()
    rb.relay_to(rc)
    rc.relay_to(rb)
    with pytest.raises(UDXError):
        rb.relay_to(rc)
    closes: list[object] = []
    rc.on_close = closes.append
    rb.destroy()
    assert rb.closed and rc.closed and closes == [None]
    assert sock.stats.sent_packets == 0
    udx.close()


async def test_udx_relay_holds_early_packets_within_one_budget_for_all_streams(
    batched: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packets for a relay partner that has not connected yet are held per stream (EARLY_PACKETS)
    and within one byte budget for all streams: a pairing flood whose second sides never speak
    cannot park 64 packets on each of thousands of streams. Released bytes are given back."""
    from relay.udx import udxstream

    monkeypatch.setattr(udxstream, "EARLY_BYTES_TOTAL", 5000)
    udx = UDX()
    sock = await udx.create_socket(LOOP, 0, use_mmsg=batched)
    ea = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ea.bind((LOOP, 0))
    relay = (LOOP, sock.port)

    def connect_on_first(stream, s, addr):  # type: ignore[no-untyped-def]
        stream.connect(s, 7, addr)
        return False

    pairs = []
    for _ in range(3):
        a = udx.create_stream(firewall=connect_on_first)
        b = udx.create_stream(firewall=connect_on_first)
        a.relay_to(b)
        b.relay_to(a)
        pairs.append((a, b))
    sent = 0
    for a, _b in pairs:
        for seq in range(3):
            ea.sendto(encode(DATA, a.id, DEFAULT_RWND, seq, 0, b"x" * 1000), relay)
            sent += 1
    await wait_for(lambda: sock.stats.received_packets >= sent)
    # 4 x 1,020 B fit in 5,000 (3 for the first pair, 1 for the second); the rest are dropped
    assert [len(b._early or ()) for _a, b in pairs] == [3, 1, 0] and udx.early_bytes == 4 * 1020
    assert sock.stats.dropped_by_cause.get("relay_unconnected") == sent - 4
    pairs[0][1].destroy()  # a stream closing gives its held bytes back ...
    assert udx.early_bytes == 1020
    ed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ed.bind((LOOP, 0))
    for _a, b in pairs[1:]:  # ... and so does one that connects: what it held is forwarded
        ed.sendto(encode(HEARTBEAT, b.id, DEFAULT_RWND, 0, 0), relay)
    await wait_for(lambda: udx.early_bytes == 0)
    ea.close()
    ed.close()
    udx.close()


async def test_udx_socket_survives_100k_bad_datagrams_and_counts_them(batched: bool) -> None:
    """Random and damaged datagrams never raise out of the loop, are all counted as dropped, and
    memory stays flat; the live stream still works afterwards."""
    udx_a, udx_b = UDX(), UDX()
    _sa, sb, a, b = await connected_pair(udx_a, udx_b, batched)
    a.write(b"before")
    assert await asyncio.wait_for(b.read(), 10) == b"before"
    await a.flush()
    lonely = udx_b.create_stream()  # no firewall: packets before connect are dropped
    relay_x, relay_y = udx_b.create_stream(firewall=lambda s, k, addr: False), udx_b.create_stream()
    relay_x.relay_to(relay_y)  # relay_y never connects: forwarding drops
    errors: list[object] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))

    rng = random.Random(1234)
    ids = [b.id, lonely.id, relay_x.id]

    def damaged(i: int) -> bytes:
        k = i % 8
        if k == 0:
            return rng.randbytes(rng.randrange(0, 1500))
        if k == 1:
            return b"\xff\x01" + rng.randbytes(rng.randrange(0, 18))  # truncated header
        if k == 2:
            return b"\xff" + bytes([rng.choice([0, 2, 255])]) + rng.randbytes(40)  # wrong version
        if k == 3:
            unknown = rng.getrandbits(32)
            while unknown in udx_b.streams:
                unknown = rng.getrandbits(32)
            return encode(rng.randrange(64), unknown, rng.getrandbits(32), 0, 0)  # id of no stream
        if k == 4:  # our stream, acknowledging data never sent (absurd ack), any type but heartbeat
            t = rng.randrange(64) & ~HEARTBEAT
            ack = (b.core.seq + rng.randrange(1, 2**31)) & 0xFFFFFFFF
            return encode(t, b.id, rng.getrandbits(32), rng.getrandbits(32), ack, rng.randbytes(rng.randrange(64)))
        if k == 5:  # our stream, data_offset beyond the datagram
            d = bytearray(encode(DATA, b.id, DEFAULT_RWND, b.core.ack, 0, rng.randbytes(8)))
            d[3] = rng.randrange(9, 256)
            return bytes(d)
        if k == 6:  # our stream, absurd sequence number far beyond the window
            seq = (b.core.ack + rng.randrange(1 << 16, 1 << 31)) & 0xFFFFFFFF
            return encode(DATA, b.id, rng.getrandbits(32), seq, 0, rng.randbytes(32))
        return encode(rng.randrange(64), rng.choice(ids[1:]), rng.getrandbits(32), rng.getrandbits(32), 0, b"zz")

    raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    raw.bind((LOOP, 0))
    dst = (LOOP, sb.port)
    total = 100_000
    sent = 0
    base_rx = sb.stats.received_packets
    base_drop = sb.stats.dropped_packets

    async def blast(n: int) -> None:
        nonlocal sent
        for _ in range(n // 500):
            for _ in range(500):
                raw.sendto(damaged(sent), dst)
                sent += 1
            target = sent
            await wait_for(lambda t=target: sb.stats.received_packets - base_rx == t, 60)

    await blast(10_000)  # warm up caches, then measure
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    await blast(total - 10_000)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    growth = sum(s.size_diff for s in after.compare_to(before, "filename"))

    relay_x.destroy()  # up to 64 packets held for relay_y are dropped with it
    assert relay_y.closed
    assert sent == total
    assert sb.stats.received_packets - base_rx == total
    assert sb.stats.dropped_packets - base_drop == total
    assert sb.stats.callback_errors == 0 and errors == []
    assert not b.closed and not lonely.connected
    assert growth < 1_000_000, f"memory grew by {growth} bytes"
    a.write(b"after")
    assert await asyncio.wait_for(b.read(), 10) == b"after"
    raw.close()
    udx_a.close()
    udx_b.close()


@pytest.mark.parametrize("gso", [False, True], ids=["no-gso", "gso"])
async def test_udx_batched_relay_keeps_order_when_the_socket_buffer_is_full(gso: bool) -> None:
    """sendmmsg reporting EAGAIN part-way: the rest is queued in order and sent when writable."""
    import ctypes
    import errno

    udx = UDX()
    sock = await udx.create_socket(LOOP, 0, use_mmsg=True, use_gso=gso)
    io = sock._mmsg
    assert io is not None
    real = io._sendmmsg
    calls: list[int] = []

    def full_after_one(fd: int, hdr: ctypes.c_void_p, n: int, flags: int) -> int:
        calls.append(n)
        if len(calls) == 1:
            return real(fd, hdr, 1, flags)  # the kernel takes one datagram...
        ctypes.set_errno(errno.EAGAIN)  # ...then the send buffer is full
        return -1

    io._sendmmsg = full_after_one
    ea = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for e in (ea, ed):
        e.bind((LOOP, 0))
        e.setblocking(False)
    loop = asyncio.get_running_loop()

    def fw_for(peer_id: int):  # type: ignore[no-untyped-def]
        def fw(stream, s, addr):  # type: ignore[no-untyped-def]
            stream.connect(s, peer_id, addr)
            return False

        return fw

    rb = udx.create_stream(firewall=fw_for(0xA))
    rc = udx.create_stream(firewall=fw_for(0xD))
    rb.relay_to(rc)
    rc.relay_to(rb)
    relay = (LOOP, sock.port)
    # connect both sides (slow path), then a burst on the fast path
    ed.sendto(encode(HEARTBEAT, rc.id, DEFAULT_RWND, 0, 0), relay)
    await wait_for(lambda: rc.connected)
    ea.sendto(encode(HEARTBEAT, rb.id, DEFAULT_RWND, 0, 0), relay)
    assert await asyncio.wait_for(loop.sock_recv(ed, 2048), 10) == encode(HEARTBEAT, 0xD, DEFAULT_RWND, 0, 0)
    await wait_for(lambda: rb.route is not None)
    # growing sizes: each datagram needs an entry of its own even with GSO (a run is same-size)
    burst = [encode(DATA, rb.id, DEFAULT_RWND, seq, 0, bytes([seq]) * (100 + seq)) for seq in range(5)]
    for d in burst:
        ea.sendto(d, relay)
    got = [await asyncio.wait_for(loop.sock_recv(ed, 2048), 10) for _ in burst]
    assert got == [d[:4] + struct.pack("<I", 0xD) + d[8:] for d in burst]
    assert len(calls) >= 2 and sock.stats.send_errors == 0  # EAGAIN was hit and recovered from
    assert not sock._sendq
    io._sendmmsg = real
    ea.close()
    ed.close()
    udx.close()
