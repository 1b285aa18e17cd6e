"""The relay's pairing record (`GET /pairings`) as the real `RelayApp` keeps it: a pairing opens
when two sessions match, names both peers' keys (initiator first) and when the relay first saw
each, counts what each peer itself sent, and closes when the pair's relay streams close.

Sessions are real secret-stream connections driven in-process (`benchmarks/relay_costs.Relay`);
the peers' UDX datagrams come from raw UDP sockets on loopback, sent to the stream id the relay
told each peer in its `pair` reply, as a hyperdht peer does.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import socket
import struct
import tracemalloc
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from benchmarks.relay_costs import Client, Relay
from relay.blindrelay import Pair
from relay.keys import encode_id
from relay.service.metrics import MetricsServer
from relay.service.pairings import PairingLog
from relay.udx import DATA, DESTROY, HEARTBEAT, encode
from relay.udx.packet import DEFAULT_RWND

LOOP = "127.0.0.1"


@dataclass
class Peer:
    """A blind-relay client on one session, its key, and a UDP socket for its relayed datagrams."""

    client: Client
    key: bytes
    proto: Any
    udp: socket.socket = field(default_factory=lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))

    @property
    def z32(self) -> str:
        return encode_id(self.key)

    def pair(self, initiator: bool, token: bytes, own_id: int) -> None:
        self.client.pair(initiator, token, own_id)
        self.proto.data_received(self.client.flush())

    def replies(self) -> list[Pair]:
        """The relay's `pair` replies on this session, as the peer reads them off the wire."""
        return [m for m in self.client.replies() if isinstance(m, Pair)]


def connect(relay: Relay, key: bytes | None = None) -> Peer:
    key = key or os.urandom(32)
    before = set(relay.app._sessions)
    client = relay.session(key=key, listen=True)
    (new,) = [s for s in relay.app._sessions if s not in before]
    peer = Peer(client, key, relay.app._sessions[new].conn.secret_stream)
    peer.udp.bind((LOOP, 0))
    peer.udp.setblocking(False)
    return peer


async def recv(sock: socket.socket, n: int) -> list[bytes]:
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(20):
        return [await loop.sock_recv(sock, 65536) for _ in range(n)]


def data(sid: int, seq: int, size: int) -> bytes:
    return encode(DATA, sid, DEFAULT_RWND, seq, 0, os.urandom(size))


@pytest.fixture
async def relay(tmp_path: Path) -> AsyncIterator[Relay]:
    r = Relay(tmp_path)
    await r.bind()
    yield r
    r.app.udx.close()


async def matched(relay: Relay, a: Peer, b: Peer) -> tuple[int, int]:
    """Pair a (initiator, own stream id 111) with b (222); both speak first, as secret-stream's
    header does, so the relay learns both addresses. The ids each must send to."""
    token = os.urandom(32)
    a.pair(True, token, 111)
    b.pair(False, token, 222)
    (ra,), (rb,) = a.replies(), b.replies()
    to_a, to_b = ra.id, rb.id
    addr = (LOOP, relay.socket.port)
    b.udp.sendto(encode(HEARTBEAT, to_b, DEFAULT_RWND, 0, 0), addr)
    async with asyncio.timeout(20):
        while not relay.app._streams[to_b].connected:
            await asyncio.sleep(0.001)
    a.udp.sendto(encode(HEARTBEAT, to_a, DEFAULT_RWND, 0, 0), addr)
    await recv(b.udp, 1)
    await recv(a.udp, 1)
    return to_a, to_b


HB = len(encode(HEARTBEAT, 1, DEFAULT_RWND, 0, 0))


async def test_each_peer_is_credited_with_what_it_sent_and_the_pairing_closes_with_its_streams(
    relay: Relay,
) -> None:
    app = relay.app
    a, b = connect(relay), connect(relay)
    to_a, to_b = await matched(relay, a, b)
    addr = (LOOP, relay.socket.port)
    sent_by_a = [data(to_a, s, 900) for s in range(1, 4)]  # three big ones from the initiator
    for d in sent_by_a:
        a.udp.sendto(d, addr)
    got = await recv(b.udp, 3)
    assert [struct.unpack_from("<I", g, 4)[0] for g in got] == [222] * 3  # they went to b's stream
    sent_by_b = data(to_b, 1, 40)  # one small one back
    b.udp.sendto(sent_by_b, addr)
    await recv(a.udp, 1)

    doc = json.loads(json.dumps(app.pairings_record()))
    assert doc["relay_key"] == app.key and doc["recorded"] == 1
    (p,) = doc["pairings"]
    assert p["closed_at"] is None and p["id"] == 1
    first, second = p["peers"]
    assert first["key"] == a.z32 and second["key"] == b.z32  # the initiator first
    assert (first["packets"], first["bytes"]) == (4, HB + sum(len(d) for d in sent_by_a))
    assert (second["packets"], second["bytes"]) == (2, HB + len(sent_by_b))
    assert sum(x["bytes"] for x in p["peers"]) == relay.socket.stats.relayed_bytes

    bye = encode(DESTROY, to_a, DEFAULT_RWND, 0, 0)  # a leaves: both relay streams close
    a.udp.sendto(bye, addr)
    await recv(b.udp, 1)
    async with asyncio.timeout(20):
        while app.pairings_record()["pairings"][0]["closed_at"] is None:
            await asyncio.sleep(0.001)
    (p,) = app.pairings_record()["pairings"]
    assert p["opened_at"] <= p["closed_at"]
    assert p["peers"][0]["bytes"] == HB + sum(len(d) for d in sent_by_a) + len(bye)
    assert p["peers"][1]["bytes"] == HB + len(sent_by_b)
    assert app.pairings._open == {}  # the closed pairing holds no stream, nor any object of its own
    for x in (a, b):
        x.udp.close()


async def test_a_key_seen_before_says_so_with_its_first_sighting(relay: Relay) -> None:
    app = relay.app
    key = os.urandom(32)
    a1, b1 = connect(relay, key), connect(relay)
    token = os.urandom(32)
    a1.pair(True, token, 1)
    b1.pair(False, token, 2)
    a2, c = connect(relay, key), connect(relay)  # the same key on a new session, later
    token = os.urandom(32)
    c.pair(True, token, 3)
    a2.pair(False, token, 4)
    first, second = app.pairings_record()["pairings"]
    assert [(x["key"], x["seen_before"]) for x in first["peers"]] == [(a1.z32, False), (b1.z32, False)]
    assert [(x["key"], x["seen_before"]) for x in second["peers"]] == [(c.z32, False), (a1.z32, True)]
    assert second["peers"][1]["first_seen_at"] == first["peers"][0]["first_seen_at"]
    for rec in (first, second):  # matched, never used: nothing sent, still open
        assert rec["closed_at"] is None and all(x["bytes"] == 0 == x["packets"] for x in rec["peers"])
    for x in (a1, b1, a2, c):
        x.udp.close()


async def test_a_refused_session_is_not_sighted_and_a_pairing_closes_when_its_session_goes(relay: Relay) -> None:
    app = relay.app
    app.config.allow = frozenset()  # nobody may pair: the session is refused before it is accepted
    key = os.urandom(32)
    relay.session(key=key)
    assert app.pairings.first_seen(encode_id(key)) is None
    app.config.allow = None
    a, b = connect(relay, key), connect(relay)
    token = os.urandom(32)
    a.pair(True, token, 1)
    b.pair(False, token, 2)
    assert app.pairings.first_seen(a.z32) is not None
    app._sessions[next(iter(app._sessions))].conn.destroy()  # a's connection breaks
    async with asyncio.timeout(20):
        while app.pairings_record()["pairings"][0]["closed_at"] is None:
            await asyncio.sleep(0.001)
    assert not app._streams
    for x in (a, b):
        x.udp.close()


async def test_the_record_is_bounded_and_older_pairings_are_evicted_closed(relay: Relay) -> None:
    app = relay.app
    app.pairings = PairingLog(app.key, capacity=2, keys_capacity=3)
    peers = [connect(relay) for _ in range(6)]
    for i in range(3):
        token = os.urandom(32)
        peers[2 * i].pair(True, token, 10 + 2 * i)
        peers[2 * i + 1].pair(False, token, 11 + 2 * i)
    doc = app.pairings_record()
    assert [p["id"] for p in doc["pairings"]] == [2, 3]
    assert doc["recorded"] == 3 and doc["evicted"] == 1
    assert doc["keys_evicted"] == 3 and doc["keys_evicted_at"] is not None
    assert app.blind.stats.pairings_active == 3  # the record forgets; the relay does not
    for x in peers:
        x.udp.close()


def test_a_full_record_stays_small() -> None:
    """1,024 pairings of two 52-character keys: a few hundred KB of JSON (the wizard reads up to
    4 MB), whatever the relay carried."""
    log = PairingLog(encode_id(os.urandom(32)))
    for _ in range(log.capacity + 10):
        sides = [(log.saw_key(encode_id(os.urandom(32))), None) for _ in range(2)]
        rec = log.open((sides[0], sides[1]))
        for side in rec.peers:
            side.bytes, side.packets = 2**60, 2**50
        log.close(rec)
    assert log.as_json()["pairings"][-1]["peers"][0]["bytes"] == 2**60
    body = json.dumps(log.as_json()).encode()
    assert len(log.as_json()["pairings"]) == log.capacity and len(body) < 600_000, len(body)


async def test_pairings_are_served_beside_stats(relay: Relay) -> None:
    app = relay.app
    a, b = connect(relay), connect(relay)
    token = os.urandom(32)
    a.pair(True, token, 1)
    b.pair(False, token, 2)
    server = MetricsServer(app.snapshot, LOOP, 0, pairings=app.pairings_record)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection(LOOP, server.port)
        writer.write(b"GET /pairings HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = await reader.read()
        writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"application/json" in head
        doc = json.loads(body)
        assert [x["key"] for x in doc["pairings"][0]["peers"]] == [a.z32, b.z32]
    finally:
        await server.close()
    assert MetricsServer(app.snapshot).render("/pairings")[0] == 404  # a server without a record
    for x in (a, b):
        x.udp.close()


def test_the_key_table_forgets_the_least_recently_seen_key_as_a_dict_would() -> None:
    """The flat key table against an OrderedDict model, through thousands of evictions and the
    rebuilds its tombstones force."""
    rng = random.Random(7)
    clock = iter(range(1, 10**6))
    log = PairingLog("relay", keys_capacity=8, clock=lambda: float(next(clock)))
    model: OrderedDict[str, float] = OrderedDict()
    forgotten = 0
    for _ in range(20_000):
        key = f"key-{rng.randrange(40)}"
        s = log.saw_key(key)
        if key in model:
            model.move_to_end(key)
            assert s.first_seen_at == model[key] < s.at
        else:
            assert s.first_seen_at == s.at
            model[key] = s.at
            if len(model) > 8:
                model.popitem(last=False)
                forgotten += 1
        assert log.keys_evicted == forgotten
    for i in range(40):
        assert log.first_seen(f"key-{i}") == model.get(f"key-{i}")


def test_what_the_record_keeps_is_allocated_once_not_per_pairing_or_key() -> None:
    """Closed pairings and remembered keys live in arrays made at start: a burst's worth of them
    leaves no small objects behind (each would pin an allocator arena the burst filled)."""
    log = PairingLog("relay", capacity=64, keys_capacity=256)

    def burst(n: int) -> None:
        for i in range(n):
            rec = log.open(((log.saw_key(f"a{i}-{n}"), None), (log.saw_key(f"b{i}-{n}"), None)))
            log.close(rec)

    burst(1000)  # fills the arrays' slots once
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    burst(2000)
    gc.collect()
    diff = tracemalloc.take_snapshot().compare_to(before, "traceback")
    tracemalloc.stop()
    # blocks of 512 B or less come from the small-object allocator's arenas (rebuilt tables are
    # big blocks from malloc, which malloc_trim can hand back)
    small = sum(d.count_diff for d in diff if d.count and d.size <= 512 * d.count)
    assert small < 20, [str(d) for d in diff[:5]]  # nothing per pairing or per key
