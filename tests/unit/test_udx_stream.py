"""The sans-IO UDX stream on a virtual network with virtual time (no sockets, no sleeps)."""

from __future__ import annotations

import hashlib
import heapq
import os
import random
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.core import DatagramCore, drain_events
from relay.udx.packet import DATA, DEFAULT_RWND, DESTROY, END, HEARTBEAT, MESSAGE, SACK, decode, encode
from relay.udx.stream import (
    DataReceived,
    EndReceived,
    MessageReceived,
    StreamClosed,
    UDXCore,
)
from tests.vectors import load


class Net:
    """Two cores joined by a link with delay, loss and reordering, driven in virtual time."""

    def __init__(
        self,
        a: UDXCore,
        b: UDXCore,
        *,
        delay: float = 0.005,
        loss: float = 0.0,
        seed: int = 7,
        reorder: float = 0.0,
        drop: Callable[[str, bytes], bool] | None = None,
    ) -> None:
        self.a, self.b = a, b
        self.now = 0.0
        self.delay = delay
        self.loss = loss
        self.reorder = reorder
        self.rng = random.Random(seed)
        self.drop = drop
        self.q: list[tuple[float, int, str, bytes]] = []
        self.n = 0
        self.wire: list[tuple[str, bytes]] = []
        self.got: dict[str, list[object]] = {"a": [], "b": []}
        self.data: dict[str, bytearray] = {"a": bytearray(), "b": bytearray()}

    def core(self, side: str) -> UDXCore:
        return self.a if side == "a" else self.b

    def _collect(self) -> None:
        for side in ("a", "b"):
            core = self.core(side)
            for d in core.datagrams_to_send(self.now):
                self.wire.append((side, d))
                if self.drop is not None and self.drop(side, d):
                    continue
                if self.rng.random() < self.loss:
                    continue
                extra = self.delay * 2 if self.rng.random() < self.reorder else 0.0
                self.n += 1
                heapq.heappush(self.q, (self.now + self.delay + extra, self.n, "b" if side == "a" else "a", d))
            for ev in drain_events(core):
                self.got[side].append(ev)
                if isinstance(ev, DataReceived):
                    self.data[side] += ev.data
                    core.consumed(len(ev.data))

    def run(self, until: Callable[[], bool], limit: float = 120.0) -> None:
        while True:
            self._collect()
            if until():
                return
            times = [t for t in (self.a.get_timer(), self.b.get_timer()) if t is not None]
            if self.q:
                times.append(self.q[0][0])
            assert times, "deadlock: nothing in flight and no timer"
            self.now = max(self.now, min(times))
            assert self.now < limit, "virtual time limit reached"
            while self.q and self.q[0][0] <= self.now:
                _, _, dst, d = heapq.heappop(self.q)
                self.core(dst).receive(d, self.now)
            for c in (self.a, self.b):
                t = c.get_timer()
                if t is not None and t <= self.now:
                    c.handle_timer(self.now)


def pair(**kw: object) -> tuple[UDXCore, UDXCore, Net]:
    a, b = UDXCore(1), UDXCore(2)
    a.connect(2)
    b.connect(1)
    return a, b, Net(a, b, **kw)  # type: ignore[arg-type]


def test_stream_core_speaks_the_relay_core_vocabulary_one_event_at_a_time() -> None:
    """`relay.core.DatagramCore` (mypy checks the assignment): datagrams_to_send, get_timer,
    handle_timer, next_event; events come out one at a time, oldest first, then None."""
    a, b = UDXCore(1), UDXCore(2)
    core: DatagramCore = b
    a.connect(2)
    b.connect(1)
    a.write(b"hello")
    a.send_message(b"ping")
    for d in a.datagrams_to_send(0.0):
        b.receive(d, 0.001)
    assert a.get_timer() is not None  # the RTO of what is in flight
    first, second = core.next_event(), core.next_event()
    assert {type(first), type(second)} == {DataReceived, MessageReceived}
    assert core.next_event() is None
    a.destroy()
    for d in a.datagrams_to_send(0.002):
        b.receive(d, 0.003)
    assert isinstance(core.next_event(), StreamClosed) and core.next_event() is None


def closed(core_events: Sequence[object]) -> StreamClosed | None:
    for ev in core_events:
        if isinstance(ev, StreamClosed):
            return ev
    return None


def test_udx_stream_transfer_both_ways_and_graceful_close() -> None:
    a, b, net = pair()
    da, db = os.urandom(300_000), os.urandom(200_001)
    a.write(da)
    b.write(db)
    a.end()
    b.end()
    net.run(lambda: a.closed and b.closed)
    assert bytes(net.data["b"]) == da
    assert bytes(net.data["a"]) == db
    assert closed(net.got["a"]) == StreamClosed(None)
    assert closed(net.got["b"]) == StreamClosed(None)
    assert any(isinstance(e, EndReceived) for e in net.got["a"])
    assert a.stats.retransmits == 0 and b.stats.retransmits == 0
    # per-packet sequence numbers, payload never above 1152 bytes at the base MTU
    sizes = [len(d) - 20 for s, d in net.wire if s == "a" and d[2] & DATA]
    assert max(sizes) == 1152


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_udx_stream_recovers_loss_and_reordering_with_sack_and_rack(seed: int) -> None:
    a, b, net = pair(loss=0.05, reorder=0.05, seed=seed, delay=0.01)
    da, db = os.urandom(2_000_000), os.urandom(1_000_000)
    a.write(da)
    b.write(db)
    a.end()
    b.end()
    net.run(lambda: a.closed and b.closed, limit=300)
    assert hashlib.sha256(net.data["b"]).digest() == hashlib.sha256(da).digest()
    assert hashlib.sha256(net.data["a"]).digest() == hashlib.sha256(db).digest()
    # losses are found from SACKs (RACK), not by waiting for 1-second RTOs
    assert a.stats.rack_losses > 40
    assert a.stats.rto_count <= 3
    assert a.stats.sacks_rx > 0 and b.stats.sacks_tx > 0
    assert a.stats.retransmits > 40


def test_udx_stream_acks_like_node_in_the_loss_capture() -> None:
    """Replay A's packets of [cap:loss_sack_and_rack_recovery] into our B: same ACK bytes as Node's B."""
    scen = next(s for s in load("udx")["scenarios"] if s["name"] == "loss_sack_and_rack_recovery")
    b = UDXCore(2)
    b.connect(1)
    ours: list[str] = []
    for p in scen["packets"]:
        if p["from"] == "A" and not p.get("dropped_by_proxy"):
            assert b.receive(bytes.fromhex(p["hex"]), 0.0)
            for ev in b.events:
                assert isinstance(ev, DataReceived)
                b.consumed(len(ev.data))
            b.events.clear()
            ours += [d.hex() for d in b.datagrams_to_send(0.0)]
    node = [p["hex"] for p in scen["packets"] if p["from"] == "B"]
    assert ours == node


def test_udx_stream_tail_loss_is_repaired_by_the_probe() -> None:
    sent: list[int] = []

    def drop_last_first_time(side: str, d: bytes) -> bool:
        p = decode(d)
        if side == "a" and p.type & DATA and p.seq == 9 and p.seq not in sent:
            sent.append(p.seq)
            return True
        return False

    a, _b, net = pair(drop=drop_last_first_time)
    a.write(os.urandom(1152 * 10))
    net.run(lambda: len(net.data["b"]) == 1152 * 10 and a.inflight == 0)
    assert a.stats.tlp_probes == 1
    assert a.stats.rto_count == 0
    assert net.now < 0.2


def test_udx_stream_end_order_matches_libudx() -> None:
    """[cap:basic_exchange_and_graceful_end]: END consumes a seq, the 'final state' ACK, no DESTROY."""
    a, b, net = pair()
    a.write(b"hello")
    b.write(b"world")
    net.run(lambda: net.data["b"] == b"hello" and net.data["a"] == b"world" and a.inflight == b.inflight == 0)
    start = len(net.wire)
    a.end()
    net.run(lambda: b.ended_remote and a.ended)
    b.end()
    net.run(lambda: a.closed and b.closed)
    kinds = [(s, decode(d).type, decode(d).seq, decode(d).ack) for s, d in net.wire[start:]]
    assert kinds == [
        ("a", END, 1, 1),  # A's END takes seq 1
        ("b", 0, 1, 2),  # B acknowledges it
        ("a", 0, 2, 1),  # A's "final state" ACK
        ("b", END, 1, 2),
        ("a", 0, 2, 2),  # A acknowledges and closes; B closes on receipt
    ]
    assert not any(decode(d).type & DESTROY for _, d in net.wire)


def test_udx_stream_end_with_data_is_one_packet() -> None:
    a, b, net = pair()
    a.write(b"bye")
    a.end()
    net.run(lambda: b.ended_remote)
    assert [decode(d).type for s, d in net.wire if s == "a"] == [DATA | END]


def test_udx_stream_destroy_resets_peer_and_old_destroy_is_ignored() -> None:
    a, b, net = pair()
    a.write(b"x")
    net.run(lambda: bytes(net.data["b"]) == b"x" and a.inflight == 0)
    # a DESTROY with a seq older than what b already has is ignored (libudx rule)
    assert b.receive(encode(DESTROY, 2, DEFAULT_RWND, 0, 0), net.now)
    assert not b.closed
    a.destroy()
    assert closed(a.events) == StreamClosed(None)
    net.run(lambda: b.closed)
    ev = closed(net.got["b"])
    assert ev is not None and ev.error is not None and ev.error.code == "ECONNRESET"
    d = [decode(x) for s, x in net.wire if s == "a"][-1]
    assert d.type == DESTROY and d.seq == 1


def test_udx_stream_heartbeat_gets_an_ack_and_message_does_not() -> None:
    _a, b, _net = pair()
    assert b.receive(encode(HEARTBEAT, 2, 0, 0, 0), 0.0)
    out = b.datagrams_to_send(0.0)
    assert [decode(d).type for d in out] == [0]
    assert b.receive(encode(MESSAGE, 2, DEFAULT_RWND, 0, 0, b"dgram"), 0.0)
    assert b.datagrams_to_send(0.0) == []
    assert b.events == [MessageReceived(b"dgram")]
    # the heartbeat's (zero) window was not adopted: b still sends data
    b.write(b"go")
    assert [decode(d).type for d in b.datagrams_to_send(0.0)] == [DATA]


def test_udx_stream_drops_packets_acknowledging_unsent_data() -> None:
    b = UDXCore(2)
    b.connect(1)
    assert not b.receive(encode(DATA, 2, DEFAULT_RWND, 0, 5, b"evil"), 0.0)
    assert b.stats.dropped == 1
    assert b.events == [] and b.datagrams_to_send(0.0) == []


def test_udx_stream_times_out_after_six_rtos_without_destroy() -> None:
    a, _b, net = pair(drop=lambda side, d: side == "a")
    a.write(b"lost forever")
    net.run(lambda: a.closed, limit=60)
    ev = closed(net.got["a"])
    assert ev is not None and ev.error is not None and ev.error.code == "ETIMEDOUT"
    sends = [decode(d).seq for s, d in net.wire if s == "a"]
    assert sends == [0] * 7  # first send + 6 retransmissions, then ETIMEDOUT
    assert 12.5 < net.now < 14.0  # 1 s, then every 2 s: libudx's schedule
    assert not any(decode(d).type & DESTROY for _, d in net.wire)


def test_udx_stream_zero_window_probes_then_resumes() -> None:
    a = UDXCore(1)
    a.connect(2)
    a.receive(encode(0, 1, 0, 0, 0), 0.0)  # peer advertises rwnd 0
    a.write(b"data")
    out = [decode(d) for d in a.datagrams_to_send(0.0)]
    assert [p.type for p in out] == [HEARTBEAT]
    a.handle_timer(a.get_timer() or 0.0)
    assert [decode(d).type for d in a.datagrams_to_send(1.0)] == [HEARTBEAT]
    a.receive(encode(0, 1, DEFAULT_RWND, 1, 0), 1.5)  # window update (newer seq)
    assert [decode(d).type for d in a.datagrams_to_send(1.5)] == [DATA]


def test_udx_stream_receive_window_shrinks_while_the_app_does_not_read() -> None:
    a, b = UDXCore(1), UDXCore(2, rwnd_max=20_000)
    a.connect(2)
    b.connect(1)
    a.write(os.urandom(30_000))
    for d in a.datagrams_to_send(0.0):
        b.receive(d, 0.001)
    acks = [decode(d) for d in b.datagrams_to_send(0.001)]
    assert acks[-1].rwnd == 20_000 - 10 * 1152  # ten packets delivered, none consumed
    b.consumed(10 * 1152)
    b.receive(encode(HEARTBEAT, 2, 0, 0, 0), 0.002)
    assert decode(b.datagrams_to_send(0.002)[-1]).rwnd == 20_000


def test_udx_stream_keepalive_sends_heartbeats_while_idle() -> None:
    a, _b, net = pair()
    a.set_keepalive(1.0, 0.0)

    def beats() -> list[str]:
        return [s for s, d in net.wire if decode(d).type == HEARTBEAT]

    net.run(lambda: len(beats()) == 3, limit=10)
    assert beats() == ["a", "a", "a"]
    assert net.now == pytest.approx(3.0)
    net.run(lambda: net.now > 3.1, limit=10)
    acks = [s for s, d in net.wire if s == "b" and decode(d).type == 0]
    assert len(acks) == 3


def test_udx_stream_buffers_data_before_connect_and_acks_on_connect() -> None:
    b = UDXCore(2)
    assert b.receive(encode(DATA, 2, DEFAULT_RWND, 0, 0, b"early"), 0.0)
    assert b.datagrams_to_send(0.0) == []
    b.connect(1)
    assert [decode(d).ack for d in b.datagrams_to_send(0.0)] == [1]
    assert b.events == [DataReceived(b"early")]


def test_udx_stream_sack_blocks_are_capped_at_fifty() -> None:
    b = UDXCore(2)
    b.connect(1)
    for seq in range(1, 200, 2):
        b.receive(encode(DATA, 2, DEFAULT_RWND, seq, 0, b"x"), 0.0)
    p = decode(b.datagrams_to_send(0.0)[-1])
    assert p.type == SACK and len(p.sacks) == 50
    assert p.sacks[0] == (1, 2) and p.sacks[-1] == (99, 100)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=80), max_size=30), st.integers(0, 2**32 - 1))
def test_udx_stream_random_datagrams_never_raise(junk: list[bytes], seq: int) -> None:
    b = UDXCore(2)
    b.connect(1)
    b.write(b"abc")
    b.datagrams_to_send(0.0)
    for i, j in enumerate(junk):
        raw = b"\xff\x01" + j[:2] + (2).to_bytes(4, "little") + j[2:]
        b.receive(raw, i * 0.01)
        b.receive(encode(j[0] if j else 0, 2, seq, seq, seq, j), i * 0.01)
        b.datagrams_to_send(i * 0.01)
        b.handle_timer(i * 0.01 + 5)
