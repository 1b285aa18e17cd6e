"""DHTCore on virtual time: no sockets, no event loop, every tick and timer driven by hand.

Covers what test_dht_node.py checks through real sockets (random datagrams, adaptive
persistence after 240 ticks, never persistent by default, network changes) plus the upkeep
those tests could not reach: evictions, full rows, down hints, delayed pings, PING_NAT,
rejoining after an outage, and the address an attacker cannot move.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.dht.core import (
    REJOIN_MAX_TICKS,
    TICK_INTERVAL,
    DHTCore,
    InterfacesDue,
    NetworkCheckDue,
    PeerHandshakeReceived,
    RefreshDue,
    RejoinDue,
    ReplyReceived,
    RequestGaveUp,
    RequestUnhandled,
    ServersRefreshDue,
    Walk,
    WalkFinished,
    WalkReplied,
)
from relay.dht.messages import (
    Address,
    Command,
    Handshake,
    Internal,
    Request,
    Response,
    decode_message,
    encode_address,
    hash32,
    node_id,
)
from relay.dht.query import Query
from relay.dht.table import NatSampler, Node


class Net:
    """A virtual network of cores: each socket has an address; datagrams are delivered at once
    (or dropped when an address is cut off); `run(seconds)` advances virtual time through the
    cores' timers (their 5 s ticks among them: a deadline in `get_timer` from `start`)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.cores: dict[Address, tuple[DHTCore, str]] = {}
        self.addrs: dict[tuple[int, str], Address] = {}
        self.down: set[str] = set()  # hosts whose traffic is dropped
        self.log: list[tuple[Address, Address, bytes]] = []
        self.events: dict[int, list[object]] = {}

    def add(self, core: DHTCore, host: str, port: int) -> DHTCore:
        for name, p in (("server", port), ("client", port + 1)):
            self.cores[(host, p)] = (core, name)
            self.addrs[(id(core), name)] = (host, p)
        self.events[id(core)] = []
        core.start(self.now)
        return core

    def addr(self, core: DHTCore, name: str = "server") -> Address:
        return self.addrs[(id(core), name)]

    def pump(self) -> None:
        moved = True
        while moved:
            moved = False
            for core, _ in list({id(c): (c, n) for c, n in self.cores.values()}.values()):
                while (ev := core.next_event()) is not None:
                    self.events[id(core)].append(ev)
                    if isinstance(ev, RequestUnhandled):
                        core.reply_unknown(ev.incoming)
                for sock, data, dest in core.datagrams_to_send():
                    moved = True
                    src = self.addrs[(id(core), sock)]
                    self.log.append((src, dest, data))
                    if src[0] in self.down or dest[0] in self.down or dest not in self.cores:
                        continue
                    target, name = self.cores[dest]
                    target.receive(data, src, name, self.now)

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        cores = list({id(c): c for c, _ in self.cores.values()}.values())
        while True:
            self.pump()
            timers = [t for c in cores if (t := c.get_timer()) is not None]
            at = min(timers)
            if at > end:
                break
            self.now = max(self.now, at)
            for c in cores:
                t = c.get_timer()
                if t is not None and t <= self.now:
                    c.handle_timer(self.now)
        self.now = end

    def of(self, core: DHTCore, kind: type) -> list[object]:
        return [e for e in self.events[id(core)] if isinstance(e, kind)]


def ready_core(**kw: object) -> DHTCore:
    core = DHTCore(tick=104, **kw)  # type: ignore[arg-type]
    core.ready = True
    core.nat.settle()  # as after its first walk
    return core


def persistent_peer(net: Net, host: str, port: int) -> DHTCore:
    """A reachable, persistent DHT node (id = H(its address)), as the testnet's nodes are."""
    peer = DHTCore(firewalled=False, detect_firewall=False, tick=104)
    net.add(peer, host, port)
    peer.ready = True
    peer.become_persistent(node_id((host, port)))
    return peer


def request(net: Net, core: DHTCore, to: DHTCore, command: int, **kw: object) -> Response | None:
    """`core` asks `to` something; returns the response the virtual network carried back."""
    p = core.request(net.addr(to), command, net.now, **kw)  # type: ignore[arg-type]
    net.pump()
    for ev in net.events[id(core)]:
        if isinstance(ev, ReplyReceived) and ev.reply.pending is p:
            return ev.reply.response
    return None


def known(core: DHTCore, peers: Iterable[tuple[DHTCore, Address]]) -> None:
    for _, a in peers:
        core.add_node(Node(node_id(a), a[0], a[1]))


# ---------------------------------------------------------------------- answering


def test_ping_find_node_and_ping_nat_answers() -> None:
    net = Net()
    a = net.add(ready_core(firewalled=False, detect_firewall=False), "10.0.0.1", 4000)
    b = persistent_peer(net, "10.0.0.2", 5000)
    others = [(persistent_peer(net, f"10.0.1.{i}", 6000), (f"10.0.1.{i}", 6000)) for i in range(1, 6)]
    known(b, others)
    pong = request(net, a, b, Internal.PING, internal=True)
    assert pong is not None and pong.to == net.addr(a) and pong.id == b.id
    found = request(net, a, b, Internal.FIND_NODE, internal=True, target=b"\x07" * 32)
    assert found is not None and set(found.closer_nodes) == {addr for _, addr in others}
    # PING_NAT is answered to the port it names, from the same host: that proves the port open
    before = len(net.log)
    a.request(net.addr(b), Internal.PING_NAT, net.now, internal=True, value=struct.pack("<H", 4321), socket="client")
    net.pump()
    (reply,) = [(src, dest) for src, dest, d in net.log[before:] if src == net.addr(b)]
    assert reply[1] == ("10.0.0.1", 4321)
    unknown = request(net, a, b, 77, internal=True)
    assert unknown is not None and unknown.error != 0


def test_delayed_ping_is_answered_after_its_delay_on_virtual_time() -> None:
    net = Net()
    a = net.add(ready_core(firewalled=False, detect_firewall=False), "10.0.0.1", 4000)
    b = persistent_peer(net, "10.0.0.2", 5000)
    p = a.request(
        net.addr(b), Internal.DELAYED_PING, net.now, internal=True, value=struct.pack("<I", 3000), retries=0, timeout=10
    )
    net.run(2.9)
    assert not [e for e in net.of(a, ReplyReceived) if e.reply.pending is p]  # type: ignore[attr-defined]
    net.run(0.2)
    assert [e for e in net.of(a, ReplyReceived) if e.reply.pending is p]  # type: ignore[attr-defined]
    # more than 10 s is never answered
    q = a.request(
        net.addr(b),
        Internal.DELAYED_PING,
        net.now,
        internal=True,
        value=struct.pack("<I", 11000),
        retries=0,
        timeout=15,
    )
    net.run(16)
    assert [e for e in net.of(a, RequestGaveUp) if e.pending is q]  # type: ignore[attr-defined]


def test_handshake_for_our_target_is_an_event_and_others_are_routed_or_dropped() -> None:
    net = Net()
    server = net.add(ready_core(firewalled=False, detect_firewall=False), "10.0.0.1", 4000)
    client = persistent_peer(net, "10.0.0.2", 5000)
    target = hash32(b"a server key")
    server.register_target(target, b"k" * 32)
    value = Handshake(0, b"noise", None).encode()
    client.request(net.addr(server), Command.PEER_HANDSHAKE, net.now, target=target, value=value)
    net.pump()
    (ev,) = net.of(server, PeerHandshakeReceived)
    assert ev.handshake.noise == b"noise"  # type: ignore[attr-defined]
    # not ours, and we store nothing: answered with closer nodes only, never a crash
    client.request(net.addr(server), Command.PEER_HANDSHAKE, net.now, target=hash32(b"other"), value=value)
    client.request(net.addr(server), Command.PEER_HANDSHAKE, net.now, target=target, value=b"\xff garbage")
    net.pump()
    assert len(net.of(server, PeerHandshakeReceived)) == 1


@given(
    st.lists(
        st.tuples(st.binary(max_size=200), st.integers(1, 65535), st.sampled_from(["server", "client"])), max_size=40
    )
)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_datagrams_never_break_the_core(datagrams: list[tuple[bytes, int, str]]) -> None:
    core = ready_core(firewalled=False, detect_firewall=False)
    core.become_persistent(node_id(("10.0.0.1", 4000)))
    core.register_target(hash32(b"k"), b"k" * 32)
    token = core.rpc.token("10.9.9.9", 1)
    for data, port, sock in datagrams:
        core.receive(data, ("10.9.9.9", port), sock, 5.0)
        framed = Request(
            tid=port,
            to=("10.0.0.1", 4000),
            command=port % 12,
            internal=port % 2 == 0,
            token=token,
            target=hash32(data),
            value=data,
        )
        core.receive(framed.encode(), ("10.9.9.9", port), sock, 5.0)
        core.handle_timer(20.0)
        while core.next_event() is not None:
            pass
        core.datagrams_to_send()
    core.receive(
        Request(tid=9, to=("10.0.0.1", 4000), command=Internal.PING, internal=True).encode(),
        ("10.8.8.8", 1),
        "server",
        30.0,
    )
    (out,) = [d for _, d, to in core.datagrams_to_send() if to == ("10.8.8.8", 1)]
    res = decode_message(out)
    assert isinstance(res, Response) and res.tid == 9 and res.error == 0


# ---------------------------------------------------------------------- the tick


def test_adaptive_core_asks_for_the_persistence_check_after_240_stable_ticks() -> None:
    core = ready_core(firewalled=False, detect_firewall=False, ephemeral=None)
    core.nat.add(("10.0.0.2", 1), ("10.0.0.1", 4000))
    now = 0.0
    for _ in range(239):
        now += TICK_INTERVAL
        core.tick(now)
    assert not [e for e in iter(core.next_event, None) if isinstance(e, NetworkCheckDue)]
    core.tick(now + TICK_INTERVAL)
    checks = [e for e in iter(core.next_event, None) if isinstance(e, NetworkCheckDue)]
    assert checks == [NetworkCheckDue(only_firewall=False)]
    # the runtime ran the check and it passed: id = H(public address), storage on
    assert core.network_state("10.0.0.1", 4000, core.nat, {})
    core.become_persistent(node_id(("10.0.0.1", 4000)))
    assert core.id == node_id(("10.0.0.1", 4000)) == core.table.id and core.persistent is not None


def test_default_core_never_asks_to_turn_persistent() -> None:
    core = ready_core(firewalled=False, detect_firewall=False)
    core.nat.add(("10.0.0.2", 1), ("10.0.0.1", 4000))
    for i in range(800):
        core.tick(TICK_INTERVAL * (i + 1))
    assert not [e for e in iter(core.next_event, None) if isinstance(e, NetworkCheckDue)]
    assert core.persistent is None and core.id is None


def test_network_change_asks_servers_to_announce_again() -> None:
    core = ready_core(firewalled=False, detect_firewall=False)

    def tick(now: float, addresses: frozenset[str]) -> list[object]:
        core.tick(now)
        events = []
        while (ev := core.next_event()) is not None:
            events.append(ev)
            if isinstance(ev, InterfacesDue):  # the runtime answers with the host's addresses
                core.network_interfaces(addresses)
        return events

    assert any(isinstance(e, InterfacesDue) for e in tick(5, frozenset({"127.0.0.1", "10.0.0.5"})))  # remember
    assert not [e for e in tick(10, frozenset({"127.0.0.1", "10.0.0.5"})) if isinstance(e, ServersRefreshDue)]
    assert [e for e in tick(15, frozenset({"127.0.0.1", "10.0.0.6"})) if isinstance(e, ServersRefreshDue)]


def test_the_tick_is_a_deadline_of_the_core_from_its_start() -> None:
    """No fixed period outside the core: `get_timer` says when the next tick is due, and
    `handle_timer` at that time runs it (and sets the next one)."""
    core = ready_core(firewalled=False, detect_firewall=False)
    assert core.get_timer() is None  # not started: nothing to time
    core.start(100.0)
    assert core.get_timer() == 100.0 + TICK_INTERVAL
    ticks = core.ticks
    core.handle_timer(104.0)
    assert core.ticks == ticks and core.get_timer() == 105.0
    core.handle_timer(105.0)
    assert core.ticks == ticks + 1 and core.get_timer() == 105.0 + TICK_INTERVAL
    assert any(isinstance(e, InterfacesDue) for e in iter(core.next_event, None))


def test_waking_from_sleep_pings_and_refreshes_soon() -> None:
    core = ready_core(firewalled=False, detect_firewall=False)
    core.tick(5)
    list(iter(core.next_event, None))
    core.tick(5 + 3600)  # an hour without ticks: a suspended laptop
    # everything looks old, a refresh walk at once, and a ping round in two ticks
    assert [e for e in iter(core.next_event, None) if isinstance(e, RefreshDue)]
    assert core.ticks & 7 == 6


# ---------------------------------------------------------------------- upkeep


def test_dead_nodes_are_evicted_by_the_pings_of_the_tick() -> None:
    net = Net()
    a = net.add(ready_core(firewalled=False, detect_firewall=False), "10.0.0.1", 4000)
    peers = [(persistent_peer(net, f"10.0.1.{i}", 6000), (f"10.0.1.{i}", 6000)) for i in range(1, 5)]
    known(a, peers)
    a.joined = True
    net.down.add("10.0.1.1")
    net.run(80)  # two rounds of _ping_some (every 8 ticks)
    assert {n.host for n in a.table} == {"10.0.1.2", "10.0.1.3", "10.0.1.4"}


def test_down_hint_checks_the_node_and_evicts_it_when_it_is_gone() -> None:
    net = Net()
    a = net.add(ready_core(firewalled=False, detect_firewall=False), "10.0.0.1", 4000)
    b = persistent_peer(net, "10.0.0.2", 5000)
    gone = ("10.0.1.1", 6000)
    b.add_node(Node(node_id(gone), *gone))
    b.ticks += 1  # the hinted node was pinged before this tick
    a.down_hint(net.addr(b), gone)
    net.run(10)
    assert b.table.get(node_id(gone)) is None
    hints = [d for src, _, d in net.log if src == net.addr(a)]
    assert any(encode_address(gone) in d for d in hints)


def test_full_row_swaps_in_the_newcomer_only_when_the_oldest_is_gone() -> None:
    net = Net()
    a = net.add(ready_core(firewalled=False, detect_firewall=False), "10.0.0.1", 4000)
    # fill one row: ids that share no prefix bit with ours land in row 0 (k = 20)
    row: list[Address] = []
    i = 0
    while len(row) < a.table.k:
        addr = (f"10.1.{i // 250}.{i % 250 + 1}", 7000)
        i += 1
        if (node_id(addr)[0] ^ a.table.id[0]) & 0x80:
            persistent_peer(net, *addr)
            a.add_node(Node(node_id(addr), *addr))
            row.append(addr)
    a.ticks += 40
    newcomer = next(
        (f"10.2.0.{j}", 7000) for j in range(1, 250) if (node_id((f"10.2.0.{j}", 7000))[0] ^ a.table.id[0]) & 0x80
    )
    a.add_node(Node(node_id(newcomer), *newcomer))
    net.run(5)
    assert a.table.get(node_id(newcomer)) is None  # the oldest answered: it stays
    net.down.update(h for h, _ in row)  # now the whole row is gone
    a.ticks += 40
    a.add_node(Node(node_id(newcomer), *newcomer))
    net.run(10)
    assert a.table.get(node_id(newcomer)) is not None  # the oldest did not answer: swapped
    assert sum(1 for r in row if a.table.get(node_id(r)) is None) == 1


# ---------------------------------------------------------------------- joining and outages


def test_alone_core_rejoins_with_backoff_capped_at_15_seconds() -> None:
    core = DHTCore(tick=104)
    core.join_walk_done()  # the bootstrap walk reached nobody
    assert core.ready and not core.joined
    gaps: list[int] = []
    last = core.ticks
    for _ in range(40):
        core.tick(core.ticks * TICK_INTERVAL)
        if [e for e in iter(core.next_event, None) if isinstance(e, RejoinDue)]:
            gaps.append(core.ticks - last)
            last = core.ticks
            core.join_walk_done()  # that walk reached nobody either
    assert gaps[:4] == [1, 2, 3, 3] and max(gaps) == REJOIN_MAX_TICKS
    assert REJOIN_MAX_TICKS * TICK_INTERVAL <= 15


def test_a_minute_long_outage_heals_within_15_seconds_of_the_network_coming_back() -> None:
    net = Net()
    a = net.add(ready_core(firewalled=False, detect_firewall=False), "10.0.0.1", 4000)
    boot = persistent_peer(net, "10.0.9.1", 6000)
    peers = [(persistent_peer(net, f"10.0.1.{i}", 6000), (f"10.0.1.{i}", 6000)) for i in range(1, 4)]
    known(boot, peers)
    walks: list[Walk] = []

    def runtime() -> None:
        """What DHTNode does: a RejoinDue is a walk from the bootstrap node; its end, join_walk_done."""
        for ev in list(net.events[id(a)]):
            net.events[id(a)].remove(ev)
            if isinstance(ev, RejoinDue):
                q = Query(a.table.id, a.table, bootstrap=[net.addr(boot)])
                walks.append(a.start_walk(q, Internal.FIND_NODE, net.now, internal=True))
            elif isinstance(ev, WalkFinished) and ev.walk in walks:
                a.join_walk_done(answered=ev.walk.query.successes > 0)
            elif isinstance(ev, ServersRefreshDue):
                refreshed.append(ev.reason)

    refreshed: list[str] = []
    a.join_walk_done(answered=False)  # started alone; the first tick asks to join
    while not a.joined:
        net.run(1)
        runtime()
    assert len(a.table) == 4
    net.down.add("10.0.0.1")  # our host loses its network for a minute
    lost_at = None
    for _ in range(60):
        net.run(1)
        runtime()
        if lost_at is None and not a.joined:
            lost_at = net.now
    assert lost_at is not None and not a.joined  # it noticed, though some nodes may still be listed
    attempts = len(walks)
    net.down.clear()
    back = net.now
    while not a.joined:
        net.run(1)
        runtime()
        assert net.now - back <= (REJOIN_MAX_TICKS + 1) * TICK_INTERVAL
    assert len(walks) - attempts >= 1 and "rejoined the DHT" in refreshed
    assert len(a.table) == 4


def test_reachability_verdicts() -> None:
    core = ready_core()
    core.nat.add(("10.0.1.1", 6000), ("10.0.0.1", 4001))  # our client socket as one node saw it
    core.probe = {"10.0.1.1", "10.0.1.2", "10.0.1.3"}

    def reply(host: str, to: Address) -> object:
        from relay.dht.rpc import Peer, Reply

        return Reply(None, Response(tid=1, to=to), Peer(host, 6000), True)  # type: ignore[arg-type]

    ok = [reply(f"10.0.1.{i}", ("10.0.0.1", 4000)) for i in (1, 2, 3)]
    firewalled, witnesses = core.firewall_verdict(5, ok, 4000, NatSampler())  # type: ignore[arg-type]
    assert not firewalled and set(witnesses) == {"10.0.1.1", "10.0.1.2", "10.0.1.3"}
    # only two of five reached our server port: still firewalled
    assert core.firewall_verdict(5, ok[:2], 4000, NatSampler())[0]  # type: ignore[arg-type]
    # they reached a different port (a NAT that does not preserve it): still firewalled
    moved = [reply(f"10.0.1.{i}", ("10.0.0.1", 9999)) for i in (1, 2, 3)]
    assert core.firewall_verdict(5, moved, 4000, NatSampler())[0]  # type: ignore[arg-type]
    sampler = NatSampler()
    core.firewall_verdict(5, ok, 4000, sampler)  # type: ignore[arg-type]
    assert core.network_state("10.0.0.1", 4001, sampler, witnesses)
    assert not core.firewalled and core.remote_address(4000) == ("10.0.0.1", 4000)


def test_pings_claiming_another_address_do_not_move_ours() -> None:
    net = Net()
    a = net.add(ready_core(firewalled=False, detect_firewall=False), "10.0.0.1", 4000)
    witness = persistent_peer(net, "10.0.0.2", 5000)
    assert request(net, a, witness, Internal.PING, internal=True) is not None
    assert a.nat.address == ("10.0.0.1", 4000)
    fake = ("203.0.113.66", 4444)
    for port in range(1000, 1080):  # 80 PINGs from one host, valid ids, claiming `fake`
        src = ("10.6.6.6", port)
        ping = Request(tid=port, to=fake, command=Internal.PING, internal=True, id=node_id(src)).encode()
        a.receive("server", ping, src, net.now)
    net.pump()
    assert a.nat.address == ("10.0.0.1", 4000) and a.remote_address(4000) == ("10.0.0.1", 4000)


def test_a_walk_from_a_bootstrap_node_joins_and_down_hints_the_dead() -> None:
    net = Net()
    a = net.add(DHTCore(firewalled=False, detect_firewall=False, tick=104), "10.0.0.1", 4000)
    boot = persistent_peer(net, "10.0.9.1", 6000)
    peers = [(persistent_peer(net, f"10.0.1.{i}", 6000), (f"10.0.1.{i}", 6000)) for i in range(1, 8)]
    known(boot, peers)
    dead = ("10.0.1.7", 6000)
    net.down.add(dead[0])
    walk = a.start_walk(
        Query(a.table.id, a.table, bootstrap=[net.addr(boot)]), Internal.FIND_NODE, net.now, internal=True
    )
    net.run(30)
    assert walk.done and net.of(a, WalkFinished)
    replied = {e.reply.peer.address for e in net.of(a, WalkReplied)}  # type: ignore[attr-defined]
    assert replied == {net.addr(boot)} | {addr for _, addr in peers if addr != dead}
    a.join_walk_done()
    assert a.joined and a.table.get(node_id(dead)) is None and len(a.table) == 7  # boot + 6 live
    # the bootstrap node that named the dead one was told, and checked and evicted it
    assert boot.table.get(node_id(dead)) is None
    assert a.nat.address == ("10.0.0.1", 4000)
