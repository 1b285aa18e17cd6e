"""The asyncio runtime on loopback: random datagrams never break it, and it keeps answering."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.dht import DHTError, DHTNode, HyperDHTServer
from relay.dht.messages import (
    Command,
    Handshake,
    Holepunch,
    Internal,
    Mode,
    Request,
    Response,
    decode_message,
    hash32,
    node_id,
)
from relay.dht.node import parse_node
from relay.keys import key_pair
from relay.udx import UDX


class Loopback:
    """A bound node + server on 127.0.0.1 inside a private event loop, for sync hypothesis tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.udx: UDX | None = None
        self.node: DHTNode | None = None
        self.server: HyperDHTServer | None = None

        async def setup() -> None:
            self.udx = UDX()
            self.node = DHTNode(bootstrap=[], host="127.0.0.1", port=0, udx=self.udx, firewalled=False)
            await self.node.bind()
            # persistent, so the storage commands (announce, mutable/immutable put...) are fuzzed too
            self.node._become_persistent(node_id(self.node.local_address()))
            self.server = HyperDHTServer(self.node, key_pair(), lambda conn: None, announce=False)
            await self.server.listen()

        self.loop.run_until_complete(setup())

    def close(self) -> None:
        async def teardown() -> None:
            assert self.server and self.node and self.udx
            await self.server.close()
            await self.node.close()
            self.udx.close()

        self.loop.run_until_complete(teardown())
        self.loop.close()

    def ping(self) -> Response:
        """A real PING over UDP from an outside socket."""
        assert self.node is not None
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        try:
            to = self.node.local_address()
            s.sendto(Request(tid=99, to=to, command=Internal.PING, internal=True).encode(), to)
            data = self.loop.run_until_complete(asyncio.wait_for(self.loop.sock_recv(s, 2048), 5))
        finally:
            s.close()
        res = decode_message(data)
        assert isinstance(res, Response)
        return res


@pytest.fixture(scope="module")
def loopback() -> Iterator[Loopback]:
    lb = Loopback()
    yield lb
    lb.close()


def frames(target: bytes, token: bytes) -> st.SearchStrategy[bytes]:
    """Random bytes, random RPC-looking frames, and well-framed garbage aimed at our server."""
    raw = st.binary(max_size=300)
    rpc = st.tuples(st.sampled_from([b"\x03", b"\x13"]), st.binary(max_size=200)).map(lambda t: t[0] + t[1])
    handshake = st.tuples(st.integers(0, 6), st.binary(max_size=200), st.booleans()).map(
        lambda t: Request(
            tid=1,
            to=("127.0.0.1", 1),
            command=Command.PEER_HANDSHAKE,
            target=target,
            value=Handshake(t[0], t[1], ("127.0.0.1", 9) if t[2] else None).encode(),
        ).encode()
    )
    holepunch = st.tuples(st.integers(0, 6), st.integers(0, 3), st.binary(max_size=120)).map(
        lambda t: Request(
            tid=2,
            to=("127.0.0.1", 1),
            command=Command.PEER_HOLEPUNCH,
            target=target,
            value=Holepunch(t[0], t[1], t[2], ("127.0.0.1", 9)).encode(),
        ).encode()
    )
    internal = st.tuples(st.integers(0, 8), st.binary(max_size=12), st.booleans()).map(
        lambda t: Request(
            tid=3, to=("127.0.0.1", 1), command=t[0], internal=True, target=b"\x01" * 32 if t[2] else None, value=t[1]
        ).encode()
    )
    storage = st.tuples(st.integers(2, 11), st.booleans(), st.binary(max_size=160), st.booleans()).map(
        lambda t: Request(
            tid=4,
            to=("127.0.0.1", 1),
            command=t[0],
            target=target if t[3] else hash32(t[2]),
            token=token if t[1] else None,
            value=t[2],
        ).encode()
    )
    return st.one_of(raw, rpc, handshake, holepunch, internal, storage)


def test_random_datagrams_never_break_the_node_loop(loopback: Loopback) -> None:
    assert loopback.node is not None and loopback.server is not None
    node, target = loopback.node, loopback.server.target

    token = node.rpc.token("127.0.0.1", 1)  # valid for 7.5 s or more: the fuzzing is faster

    @given(st.lists(st.tuples(frames(target, token), st.integers(1, 65535)), max_size=20))
    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    def feed(datagrams: list[tuple[bytes, int]]) -> None:
        for data, port in datagrams:
            node._on_datagram("server", data, ("127.0.0.1", port))
            node._on_datagram("client", data, ("127.0.0.1", port))

    feed()

    async def drained() -> None:  # the handshakes it queued are answered between loop turns
        while len(loopback.server.backlog):  # type: ignore[union-attr]
            await asyncio.sleep(0)

    loopback.loop.run_until_complete(asyncio.wait_for(drained(), 60))
    # nothing reached the catch-all at the datagram boundary or in the handshake backlog's
    # drain, and the node still answers
    assert node.internal_errors == 0
    assert node.persistent is not None and node.id is not None
    res = loopback.ping()
    assert res.tid == 99 and res.error == 0


def test_parse_node() -> None:
    assert parse_node("127.0.0.1:49737") == ("127.0.0.1", 49737)
    assert parse_node("88.99.3.86@node1.hyperdht.org:49737") == ("88.99.3.86@node1.hyperdht.org", 49737)
    for bad in ("nohost", "host:", ":1", "h:x"):
        with pytest.raises(Exception, match="host:port"):
            parse_node(bad)


async def test_port_in_use_is_one_clear_error() -> None:
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("127.0.0.1", 0))
    try:
        node = DHTNode(bootstrap=[], host="127.0.0.1", port=taken.getsockname()[1], udx=UDX())
        with pytest.raises(Exception, match="cannot bind UDP") as exc:
            await node.bind()
        assert getattr(exc.value, "code", None) == "BIND_FAILED"
    finally:
        taken.close()


async def test_unreachable_bootstrap_finishes_firewalled_and_empty(caplog: pytest.LogCaptureFixture) -> None:
    # a port nobody listens on: the walk times out (4 s) and the node says so in its stats
    caplog.set_level(logging.INFO, logger="relay.dht")
    dead = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    udx = UDX()
    node = DHTNode(bootstrap=[f"127.0.0.1:{port}"], host="127.0.0.1", port=0, udx=udx)
    try:
        await asyncio.wait_for(node.bootstrap(), 30)
        st_ = node.stats()
        # truthful: nobody answered, so not bootstrapped (the node keeps retrying in the background)
        assert not st_["bootstrapped"] and st_["firewalled"] and st_["nodes"] == 0 and st_["public_host"] is None
        assert node.remote_address() is None
        # the log must not call an empty walk "bootstrapped": it says nothing answered, as a warning
        logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name.startswith("relay.dht")]
        assert not any("dht bootstrapped" in m for _, m in logged), logged
        assert any(lvl == logging.WARNING and "no DHT node answered" in m for lvl, m in logged), logged
        with pytest.raises(DHTError, match="no DHT bootstrap node answered") as exc:
            await node.bootstrap(require_reply=True)
        assert exc.value.code == "BOOTSTRAP_FAILED"
    finally:
        await node.close()
        udx.close()


def test_relay_mode_values() -> None:
    assert [m.value for m in Mode] == [0, 1, 2, 3, 4]


# The tick's decisions (adaptive persistence after 240 ticks, never persistent by default,
# re-announcing on a network change, upkeep, rejoining) are tested on the sans-IO core with
# virtual time in test_dht_node_core.py; this file keeps what needs the runtime's sockets, and
# one check that the runtime carries out the core's requests (servers re-announce).


async def test_network_change_reannounces_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    udx = UDX()
    node = DHTNode(bootstrap=[], host="127.0.0.1", port=0, udx=udx, firewalled=False)
    try:
        await node.bind()
        node.core.ready = True
        server = HyperDHTServer(node, key_pair(), lambda conn: None, announce=False)
        await server.listen()
        refreshed: list[bool] = []
        server.refresh = lambda: refreshed.append(True)  # type: ignore[method-assign]
        addrs = frozenset({"127.0.0.1", "10.0.0.5"})
        monkeypatch.setattr(DHTNode, "interfaces", staticmethod(lambda: addrs))

        def tick() -> None:  # the tick's deadline comes: the node's driver runs the core's timer
            node.core.next_tick = node._now()
            node.driver.feed(node.core.handle_timer)

        tick()  # first look: remember, nothing to do
        tick()
        assert refreshed == []
        addrs = frozenset({"127.0.0.1", "10.0.0.6"})  # DHCP gave us a new address
        tick()
        assert refreshed == [True]
        await server.close()
    finally:
        await node.close()
        udx.close()


def test_new_handshakes_wait_in_the_backlog_and_a_new_address_is_answered_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under a flood the read callback only queues new handshakes (no crypto inline); the loop
    answers them between its other work, one slice at a time, a new address before the backlog of
    a busy one; the admit hook runs before any crypto (its refusals are never decrypted)."""
    import relay.dht.server as server_mod
    from relay.dht.messages import NS_PEER_HANDSHAKE, NoisePayload, UDXInfo
    from relay.noise import NoiseHandshake

    monkeypatch.setattr(server_mod, "DRAIN_SLICE", 0.0)  # one handshake per slice: deterministic
    lb = Loopback()
    relay_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # plays the announce holder
    relay_sock.bind(("127.0.0.1", 0))
    relay_sock.setblocking(False)
    second = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # another announce holder
    second.bind(("127.0.0.1", 0))
    second.setblocking(False)
    try:
        assert lb.node is not None and lb.server is not None
        node, server = lb.node, lb.server
        admitted: list[str] = []
        server.admit = lambda addr: None if admitted.append(addr[0]) or addr[0] == "127.0.0.66" else 0.0
        busy, new, refused = ("127.0.0.21", 9), ("127.0.0.22", 9), ("127.0.0.66", 9)

        def handshake(tid: int, client: tuple[str, int], garbage: bool = False) -> bytes:
            nh = NoiseHandshake("IK", True, key_pair(), server.public_key, prologue=NS_PEER_HANDSHAKE)
            msg1 = nh.send(NoisePayload(version=1, udx=UDXInfo(id=tid), secret_stream=True).encode())
            hs = Handshake(Mode.FROM_RELAY, bytes(len(msg1)) if garbage else msg1, client)
            req = Request(tid, node.local_address(), Command.PEER_HANDSHAKE, target=server.target, value=hs.encode())
            node._on_datagram("server", req.encode(), relay_sock.getsockname())
            return req.encode()

        for _ in range(3):  # the busy host was answered a lot already (its score is high)
            server.backlog._served(busy[0], node._now())
        # then a burst: 12 from the busy host, one from a new host, one the admit hook refuses
        first = handshake(1, busy)
        for tid in range(2, 13):
            handshake(tid, busy)
        handshake(50, new)
        handshake(60, refused, garbage=True)
        node._on_datagram("server", first, second.getsockname())  # relayed by another holder: queued once
        assert server.responder.stats == {"handshakes": 0, "rejected": 1, "failed": 0, "duplicates": 0}
        assert len(server.backlog) == 13 and server.backlog.stats["duplicates"] == 1
        assert admitted.count("127.0.0.66") == 1  # refused before its (garbage) Noise was read

        answered_when_other_work_ran: list[int] = []
        lb.loop.call_soon(lambda: answered_when_other_work_ran.append(server.responder.stats["handshakes"]))

        async def replies(n: int) -> list[Handshake]:
            out = []
            while len(out) < n:
                data = await asyncio.wait_for(lb.loop.sock_recv(relay_sock, 2048), 10)
                msg = decode_message(data)
                if isinstance(msg, Request) and msg.command == Command.PEER_HANDSHAKE and msg.value:
                    out.append(Handshake.decode(msg.value))
            return out

        got = lb.loop.run_until_complete(replies(13))
        copy = decode_message(lb.loop.run_until_complete(asyncio.wait_for(lb.loop.sock_recv(second, 2048), 10)))
        assert isinstance(copy, Request) and copy.tid == 1 and copy.value  # the copy got its own reply
        assert Handshake.decode(copy.value).peer_address == busy
        assert [h.mode for h in got] == [Mode.FROM_SERVER] * 13
        assert got[0].peer_address == new  # queued 13th, answered first
        assert [h.peer_address for h in got[1:]] == [busy] * 12
        assert answered_when_other_work_ran and answered_when_other_work_ran[0] < 13  # the loop was not held
        assert server.responder.stats["handshakes"] == 13 and server.responder.stats["failed"] == 0
        assert server.backlog.stats["served"] == 13 and len(server.backlog) == 0
    finally:
        relay_sock.close()
        second.close()
        lb.close()


def test_a_handshake_the_admit_hook_holds_is_answered_after_its_wait_not_refused() -> None:
    """Over its address's burst a handshake waits (the admit hook says how long) in the
    backlog's waiting room: nothing is answered before the loop's release timer, a
    retransmission meanwhile is a duplicate, and then it is answered like any other."""
    from relay.dht.messages import NS_PEER_HANDSHAKE, NoisePayload, UDXInfo
    from relay.noise import NoiseHandshake

    lb = Loopback()
    holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # plays the announce holder
    holder.bind(("127.0.0.1", 0))
    holder.setblocking(False)
    try:
        assert lb.node is not None and lb.server is not None
        node, server = lb.node, lb.server
        server.admit = lambda addr: 0.2
        nh = NoiseHandshake("IK", True, key_pair(), server.public_key, prologue=NS_PEER_HANDSHAKE)
        msg1 = nh.send(NoisePayload(version=1, udx=UDXInfo(id=7), secret_stream=True).encode())
        hs = Handshake(Mode.FROM_RELAY, msg1, ("127.0.0.30", 9))
        req = Request(1, node.local_address(), Command.PEER_HANDSHAKE, target=server.target, value=hs.encode())
        node._on_datagram("server", req.encode(), holder.getsockname())
        node._on_datagram("server", req.encode(), holder.getsockname())  # the client retransmitted
        assert server.backlog.stats["waited"] == 1 and server.backlog.stats["duplicates"] == 1
        due = server.backlog.get_timer()
        assert due is not None

        async def turns(n: int) -> None:  # let the loop run whatever is ready, n times
            for _ in range(n):
                await asyncio.sleep(0)

        lb.loop.run_until_complete(turns(20))
        assert server.responder.stats["handshakes"] == 0 and lb.loop.time() < due  # held, not answered
        data = lb.loop.run_until_complete(asyncio.wait_for(lb.loop.sock_recv(holder, 2048), 10))
        assert lb.loop.time() >= due - 0.001  # answered by the release timer, not before
        msg = decode_message(data)
        assert isinstance(msg, Request) and msg.command == Command.PEER_HANDSHAKE and msg.value
        assert Handshake.decode(msg.value).mode == Mode.FROM_SERVER
        assert server.responder.stats["handshakes"] == 1 and server.responder.stats["rejected"] == 0
        assert len(server.backlog) == 0 and server.backlog.get_timer() is None
    finally:
        holder.close()
        lb.close()
