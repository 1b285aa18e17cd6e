"""The dht-rpc node's state and decisions as a sans-IO core (`dht-rpc/index.js` minus its IO).

Sans-IO: bytes and `now` in (`receive(data, addr, socket, now)`, `handle_timer(now)`),
datagrams, a deadline and events out (`datagrams_to_send`, `get_timer`, `next_event`). It owns
the `RPC` transaction layer, the routing table and its upkeep (who is pinged, evicted or swapped
in on a full row), the 5 s tick (a deadline in `get_timer` like any other, from `start(now)`:
refresh, reachability re-checks, rejoining when every node is gone, network changes, for which
it asks the runtime for this host's addresses with `InterfacesDue`), our own address
(`OwnAddress`), the answers to every command (PING, PING_NAT, FIND_NODE, DOWN_HINT,
DELAYED_PING, hyperdht storage when persistent) and the routing of PEER_HANDSHAKE /
PEER_HOLEPUNCH. Client and server code share it through `DHTNode`, which keeps only the sockets,
the futures of awaited requests and the one clock.

Work that is a sequence of awaited round trips (a walk, the PING_NAT reachability check) is
asked for with an event (`RefreshDue`, `RejoinDue`, `NetworkCheckDue`) and run by the
runtime; the verdicts are decided here (`firewall_verdict`, `network_state`).
"""

from __future__ import annotations

import heapq
import logging
import os
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Unpack

from .address import OwnAddress
from .messages import (
    Address,
    Command,
    DHTError,
    ErrorCode,
    Handshake,
    Holepunch,
    Internal,
    Mode,
    PeerRecord,
    encode_address,
    hash32,
)
from .persistent import Forward, Persistent
from .query import Query
from .router import Relay, Respond, Route, route_handshake, route_holepunch
from .rpc import (
    RPC,
    IncomingRequest,
    PendingRequest,
    Reply,
    RequestFailed,
    RequestOptions,
    RequestReceived,
    RequestRetrying,
    ResponseReceived,
    SendOptions,
)
from .table import NatSampler, Node, RoutingTable

log = logging.getLogger("relay.dht")

TICK_INTERVAL = 5.0
SLEEPING_INTERVAL = 3 * TICK_INTERVAL
REFRESH_TICKS = 60
STABLE_TICKS = 240  # ~20 min: re-check reachability if still firewalled and the NAT host changed
MORE_STABLE_TICKS = 3 * STABLE_TICKS
RECENT_NODE = 12
OLD_NODE = 360
MAX_PING_DELAY = 10.0
DOWN_HINTS_PER_TICK = 50
MAX_DELAYED_PINGS = 256  # DELAYED_PING answers waiting at once (each holds an incoming request)
REJOIN_MIN_TICKS = 1  # with no DHT node left: walk from the bootstrap nodes again after 5 s,
REJOIN_MAX_TICKS = 3  # doubling to 15 s (a node back on the network rejoins well within 30 s)
SILENT_TICKS = 2  # ticks in a row where requests timed out and nothing answered: offline


def filter_node(addr: Address) -> bool:
    """hyperdht skips a few known-bad public addresses (`hyperdht/index.js` filterNode)."""
    host, port = addr
    if port == 49738 and host in ("134.209.28.98", "167.99.142.185"):
        return False
    if port == 9400 and host == "35.233.47.252":
        return False
    return host != "150.136.142.116"


# ---------------------------------------------------------------------- events


@dataclass(slots=True)
class RefreshDue:
    """Run a background walk towards `target` (table refresh)."""

    target: bytes


@dataclass(slots=True)
class RejoinDue:
    """No DHT node is left: resolve the bootstrap nodes again and walk from them."""


@dataclass(slots=True)
class NetworkCheckDue:
    """Run the PING_NAT reachability check (`only_firewall`: do not turn persistent)."""

    only_firewall: bool


@dataclass(slots=True)
class InterfacesDue:
    """The tick wants this host's addresses: answer with `network_interfaces(addresses)`."""


@dataclass(slots=True)
class ServersRefreshDue:
    """Listening servers should announce again: the network changed, or we rejoined."""

    reason: str


@dataclass(slots=True)
class PeerHandshakeReceived:
    """A PEER_HANDSHAKE for one of our registered targets."""

    incoming: IncomingRequest
    handshake: Handshake


@dataclass(slots=True)
class PeerHolepunchReceived:
    """A relayed PEER_HOLEPUNCH (FROM_RELAY) for one of our registered targets."""

    incoming: IncomingRequest
    holepunch: Holepunch


@dataclass(slots=True)
class RequestUnhandled:
    """A request no core handler answers (a plugin may; else `reply_unknown`)."""

    incoming: IncomingRequest


@dataclass(slots=True, eq=False)
class WalkReplied:
    """A successful reply during `walk` (hyperdht's query 'data')."""

    walk: Walk
    reply: Reply


@dataclass(slots=True, eq=False)
class WalkFinished:
    walk: Walk


@dataclass(slots=True)
class ReplyReceived:
    """The reply to a request the runtime sent (its context is the runtime's)."""

    reply: Reply


@dataclass(slots=True)
class RequestRetried:
    pending: PendingRequest


@dataclass(slots=True)
class RequestGaveUp:
    pending: PendingRequest
    error: DHTError


CoreEvent = (
    RefreshDue
    | RejoinDue
    | NetworkCheckDue
    | InterfacesDue
    | ServersRefreshDue
    | PeerHandshakeReceived
    | PeerHolepunchReceived
    | RequestUnhandled
    | ReplyReceived
    | RequestRetried
    | RequestGaveUp
    | WalkReplied
    | WalkFinished
)


class _Own:
    """Context of a request the core itself sent (upkeep pings, down hints, rechecks)."""

    __slots__ = ("failed", "replied")

    def __init__(
        self, replied: Callable[[Reply], None] | None = None, failed: Callable[[DHTError], None] | None = None
    ) -> None:
        self.replied = replied
        self.failed = failed


class Walk:
    """One iterative walk: the sans-IO `Query` decides whom to ask next, the core sends."""

    __slots__ = (
        "background",
        "command",
        "done",
        "full_concurrency",
        "internal",
        "pending",
        "query",
        "retries",
        "value",
    )

    def __init__(
        self,
        query: Query,
        command: int,
        *,
        internal: bool,
        value: bytes | None,
        retries: int,
        background: bool,
        full_concurrency: int,
    ) -> None:
        self.query = query
        self.command = command
        self.internal = internal
        self.value = value
        self.retries = retries
        self.background = background
        self.full_concurrency = full_concurrency
        self.pending: list[PendingRequest] = []
        self.done = False


class _Visit:
    """Context of one walk request."""

    __slots__ = ("addr", "slow", "walk")

    def __init__(self, walk: Walk, addr: Address) -> None:
        self.walk = walk
        self.addr = addr
        self.slow = False


@dataclass(order=True)
class _Delayed:
    at: float
    seq: int
    incoming: IncomingRequest = field(compare=False)


# ---------------------------------------------------------------------- the core


class DHTCore:
    """One dht-rpc node's state machine; see the module docstring."""

    def __init__(
        self,
        *,
        firewalled: bool = True,
        detect_firewall: bool = True,
        ephemeral: bool | None = True,
        table_id: bytes | None = None,
        tick: int | None = None,
        wall_offset: float = 0.0,
    ) -> None:
        self.table = RoutingTable(table_id or os.urandom(32))
        self.rpc = RPC(self.table, firewalled=firewalled)
        self.nat = OwnAddress()  # learned from replies only (relay/dht/address.py)
        self.persistent: Persistent | None = None
        self.detect_firewall = detect_firewall
        # True: never store for others (a relay owes the DHT nothing, docs/wire/dht.md §1); False:
        # persistent at bootstrap; None: adaptive, after ~20 stable minutes as Node
        self.force_persistent = ephemeral is False
        self.adaptive = ephemeral is None
        self.wall_offset = wall_offset  # unix time = now + wall_offset (announce bumps are wall-clock)
        self.nodes: dict[bytes, Node] = {}  # insertion order = least recently seen first
        self.targets: dict[bytes, bytes] = {}  # our servers: target -> public key
        self.ready = False  # the first walk finished (dht-rpc's `bootstrapped`): upkeep runs
        self.joined = False  # some DHT node answered and sits in our table
        self.rejoining = False
        self.ticks = tick if tick is not None else 100 - int.from_bytes(os.urandom(1), "little") % 50
        self.refresh_ticks = REFRESH_TICKS
        self.stable_ticks = STABLE_TICKS
        self.rejoin_tick = 0
        self.rejoin_ticks = REJOIN_MIN_TICKS
        self.last_host: str | None = None
        self.interfaces: frozenset[str] | None = None
        self.repinging = 0
        self.checks = 0
        self.down_hints_sent = 0
        self.stats_relayed = 0  # handshake messages we routed for others (either direction)
        self.probe: set[str] | None = None  # hosts that reached the server port during a PING_NAT check
        self._last_tick: float | None = None
        #: when the next tick is due (None until `start`)
        self.next_tick: float | None = None
        self.silent_ticks = 0
        self._seen_responses = 0
        self._seen_timeouts = 0
        self._now = 0.0
        self._delayed: list[_Delayed] = []
        self._delayed_seq = 0
        self._events: deque[CoreEvent] = deque()

    # ------------------------------------------------------------------ state

    @property
    def firewalled(self) -> bool:
        return self.rpc.firewalled

    @property
    def id(self) -> bytes | None:
        return None if self.rpc.ephemeral else self.table.id

    def remote_address(self, server_port: int | None) -> Address | None:
        """Our public address, only when reachable and port-preserving (dht-rpc remoteAddress)."""
        if self.nat.host is None or not self.nat.port or self.firewalled or server_port is None:
            return None
        return (self.nat.host, server_port) if server_port == self.nat.port else None

    # ------------------------------------------------------------------ outputs

    def datagrams_to_send(self, now: float = 0.0) -> list[tuple[str, bytes, Address]]:
        """(socket, datagram, destination) to send now (the DHT paces nothing: `now` is unused)."""
        return self.rpc.datagrams_to_send()

    def get_timer(self) -> float | None:
        at = self.rpc.get_timer()
        if self._delayed and (at is None or self._delayed[0].at < at):
            at = self._delayed[0].at
        t = self.next_tick
        if t is not None and (at is None or t < at):
            return t
        return at

    def next_event(self) -> CoreEvent | None:
        return self._events.popleft() if self._events else None

    # ------------------------------------------------------------------ inputs

    def start(self, now: float) -> None:
        """The node is bound: its tick runs every TICK_INTERVAL from here (`get_timer`)."""
        if self.next_tick is None:
            self.next_tick = now + TICK_INTERVAL

    def receive(self, data: bytes, addr: Address, socket: str, now: float) -> None:
        """One dht-rpc datagram from `addr` on `socket`; anything malformed is dropped."""
        self._now = now
        if socket == "server" and self.probe is not None:
            self.probe.add(addr[0])
        self.rpc.receive(data, addr, socket, now)
        self._process()

    def handle_timer(self, now: float) -> None:
        self._now = now
        self.rpc.handle_timer(now)
        while self._delayed and self._delayed[0].at <= now:
            d = heapq.heappop(self._delayed)
            self.rpc.reply(d.incoming, token=False, closer_nodes=False)
        if self.next_tick is not None and now >= self.next_tick:
            self.next_tick = now + TICK_INTERVAL
            self.tick(now)
        self._process()

    def request(self, to: Address, command: int, now: float, **options: Unpack[SendOptions]) -> PendingRequest:
        """Send a request whose outcome the runtime hears as Reply/Retried/GaveUp events."""
        self._now = now
        return self.rpc.request(to, command, now, **options)

    def tick(self, now: float) -> None:
        """The 5 s tick (dht-rpc `_ontick`), run by `handle_timer` when `next_tick` is due."""
        self._now = now
        if self._last_tick is not None and now - self._last_tick > SLEEPING_INTERVAL:
            # we slept (laptop lid, stopped VM): everything is old now, ping and refresh soon
            self.ticks += 2 * OLD_NODE
            self.ticks += 8 - (self.ticks & 7) - 2
            self.refresh_ticks = 1
        else:
            self.ticks += 1
        self._last_tick = now
        if not self.ready:
            return
        self._health()
        if not self.joined and not self.rejoining and self.ticks >= self.rejoin_tick:
            self.rejoining = True
            self._events.append(RejoinDue())
        self._events.append(InterfacesDue())  # a network change is seen from the host's addresses
        if self.persistent is not None:
            self.persistent.tick(now)
        if (self.adaptive and self.rpc.ephemeral) or (self.detect_firewall and self.firewalled):
            self.stable_ticks -= 1
            if self.stable_ticks <= 0:
                self.stable_ticks = MORE_STABLE_TICKS
                if self.last_host != self.nat.host:
                    self.last_host = self.nat.host
                    self._events.append(NetworkCheckDue(only_firewall=not self.adaptive))
        if self.ticks & 7 == 0:
            self._ping_some()
        self.refresh_ticks -= 1
        if ((self.ticks & 63) == 0 and len(self.nodes) < self.table.k) or self.refresh_ticks <= 0:
            self.refresh()
        self.down_hints_sent = 0
        self._process()

    def network_interfaces(self, interfaces: frozenset[str]) -> None:
        """This host's addresses, as the tick asked (`InterfacesDue`): a change re-announces."""
        if interfaces != self.interfaces:
            changed = self.interfaces is not None
            self.interfaces = interfaces
            if changed:  # hyperdht re-announces every server on a network change
                self._events.append(ServersRefreshDue("network interfaces changed"))

    # ------------------------------------------------------------------ joining

    def _health(self) -> None:
        """dht-rpc's health window, reduced: when, tick after tick, our requests time out and
        nothing answers, we are offline even if the table still lists nodes (a minute of
        outage evicts only some); say so (not bootstrapped) and rejoin until answers return."""
        responses, timeouts = self.rpc.stats["responses"], self.rpc.stats["timeouts"]
        answered, lost = responses - self._seen_responses, timeouts - self._seen_timeouts
        self._seen_responses, self._seen_timeouts = responses, timeouts
        if answered > 0:
            self.silent_ticks = 0
        elif lost > 0:
            self.silent_ticks += 1
            if self.silent_ticks < SILENT_TICKS and self.joined:
                self._ping_some()  # confirm now rather than at the next ping round (40 s)
            elif self.joined:
                self.joined = False
                self.rejoin_ticks = REJOIN_MIN_TICKS
                self.rejoin_tick = self.ticks
                log.warning("dht: no DHT node answers any more; rejoining")

    def walk_started(self) -> None:
        """Any walk resets the refresh countdown (dht-rpc does so in every query)."""
        self.refresh_ticks = REFRESH_TICKS

    def refresh(self) -> None:
        node = self.table.random()
        self._events.append(RefreshDue(node.id if node else self.table.id))

    def join_walk_done(self, answered: bool = True) -> None:
        """A (re)join walk ended: joined if some node `answered` it and the table is not
        empty, else back off."""
        was_ready = self.ready
        self.ready = True
        self.rejoining = False
        self.nat.settle()
        if answered and len(self.table) > 0:
            self.silent_ticks = 0
            if not self.joined:
                self.joined = True
                self.rejoin_ticks = REJOIN_MIN_TICKS
                if was_ready:  # announces made while alone (or before an outage) reached nobody
                    self._events.append(ServersRefreshDue("rejoined the DHT"))
            return
        if was_ready:
            self.rejoin_ticks = min(2 * self.rejoin_ticks, REJOIN_MAX_TICKS)
        self.rejoin_tick = self.ticks + self.rejoin_ticks

    def _on_alone(self) -> None:
        """The last node left the table (an outage, or the DHT went away): rejoin soon."""
        if not self.joined:
            return
        self.joined = False
        self.rejoin_ticks = REJOIN_MIN_TICKS
        self.rejoin_tick = self.ticks + REJOIN_MIN_TICKS
        log.warning("dht: lost every DHT node; rejoining from the bootstrap nodes")

    # ------------------------------------------------------------------ reachability

    def port_value(self, server_port: int) -> bytes:
        return struct.pack("<H", server_port)

    def probe_nodes(self) -> list[Address]:
        """The 5 most recently seen nodes, asked to PING_NAT our server port."""
        return [n.address for n in reversed(self.nodes.values())][:5]

    def firewall_verdict(
        self, asked: int, replies: list[Reply], server_port: int, sampler: NatSampler
    ) -> tuple[bool, dict[str, Address]]:
        """dht-rpc `_checkIfFirewalled`: still firewalled unless enough of the nodes we asked
        reached our server port (their host is in `probe`) and saw the address we know, with
        our port. Returns (firewalled, witnesses: host -> node that reached us)."""
        probe = self.probe or set()
        witnesses: dict[str, Address] = {}
        for r in replies:
            if r.peer.host in probe:
                sampler.add(*r.to)
                witnesses[r.peer.host] = r.peer.address
        count = sum(1 for r in replies if r.peer.host in probe)
        if count < (3 if asked >= 5 else 1):
            return True, witnesses
        if sampler.host is None or self.nat.host != sampler.host:
            return True, witnesses
        return sampler.port == 0 or sampler.port != server_port, witnesses

    def network_state(
        self, host: str | None, port: int, sampler: NatSampler | OwnAddress, witnesses: dict[str, Address]
    ) -> bool:
        """After a passed check (dht-rpc `_updateNetworkState`): requests leave from the server
        socket; True when the address held still and is consistent, so the caller may go on."""
        self.rpc.firewalled = False
        if not self.rpc.ephemeral or host != self.nat.host or port != self.nat.port:
            return False
        if sampler.host is None or sampler.host != host or sampler.port == 0:
            return False
        if sampler is not self.nat:
            # the nodes that reached our server port witnessed this address
            self.nat = OwnAddress.adopted((sampler.host, sampler.port), witnesses)
        return True

    def become_persistent(self, id_: bytes) -> None:
        """id = H(public ip:port), table rebuilt around it, hyperdht storage on."""
        self.rpc.ephemeral = False
        if id_ != self.table.id:
            old = list(self.table)
            self.table = self.rpc.table = RoutingTable(id_)
            for n in old:
                if n.id == id_:
                    continue
                if self.table.add(n) is not True:
                    self.nodes.pop(n.id, None)
            if self.ready:
                self.refresh()
        self.persistent = Persistent(id_)
        for target, public_key in self.targets.items():
            self._retain_forward(target, public_key)
        log.info("dht node is persistent with id %s", id_.hex()[:16])

    def register_target(self, target: bytes, public_key: bytes) -> None:
        self.targets[target] = public_key
        if self.persistent is not None:
            self._retain_forward(target, public_key)

    def unregister_target(self, target: bytes) -> None:
        self.targets.pop(target, None)
        if self.persistent is not None:
            self.persistent.forwards.delete(target)

    def _retain_forward(self, target: bytes, public_key: bytes) -> None:
        """A persistent node answers FIND_PEER for its own servers' keys (never expires)."""
        assert self.persistent is not None
        self.persistent.forwards.retain(target, Forward(None, PeerRecord(public_key).encode()))

    # ------------------------------------------------------------------ own requests

    def _send(
        self,
        to: Address,
        command: int,
        *,
        replied: Callable[[Reply], None] | None = None,
        failed: Callable[[DHTError], None] | None = None,
        **options: Unpack[RequestOptions],
    ) -> None:
        try:
            self.rpc.request(to, command, self._now, context=_Own(replied, failed), **options)
        except DHTError as e:
            if failed:
                failed(e)

    def down_hint(self, to: Address, down: Address) -> None:
        """Tell `to` that `down`, which it gave us, did not answer (bounded per tick)."""
        if self.down_hints_sent >= DOWN_HINTS_PER_TICK:
            return
        self.down_hints_sent += 1
        self._send(to, Internal.DOWN_HINT, internal=True, value=encode_address(down))

    # ------------------------------------------------------------------ walks

    def start_walk(
        self,
        query: Query,
        command: int,
        now: float,
        *,
        internal: bool = False,
        value: bytes | None = None,
        retries: int = 5,
        background: bool = False,
        full_concurrency: int = 10,
    ) -> Walk:
        """Begin a walk; its replies come out as WalkReplied, its end as WalkFinished."""
        self._now = now
        self.walk_started()
        walk = Walk(
            query,
            command,
            internal=internal,
            value=value,
            retries=retries,
            background=background,
            full_concurrency=full_concurrency,
        )
        self._pump_walk(walk)
        return walk

    def cancel_walk(self, walk: Walk) -> None:
        for p in walk.pending:
            self.rpc.cancel(p)
        walk.pending.clear()
        if not walk.done:
            walk.done = True
            walk.query.finished = True

    def _pump_walk(self, walk: Walk) -> None:
        q = walk.query
        if walk.done:
            return
        if walk.background:  # background walks yield to other traffic
            q.concurrency = walk.full_concurrency if len(self.rpc.inflight) < 3 else 2
        for cand in q.next_visits():
            try:
                p = self.rpc.request(
                    cand.address,
                    walk.command,
                    self._now,
                    internal=walk.internal,
                    target=q.target,
                    value=walk.value,
                    retries=walk.retries,
                    to_id=cand.id,
                    context=_Visit(walk, cand.address),
                )
                walk.pending.append(p)
            except DHTError as e:
                q.on_failed(cand.address, False)
                log.debug("walk request to %s failed: %s", cand.address, e)
        for hint in q.take_down_hints():
            self.down_hint(hint.to, hint.down)
        if q.finished:
            walk.done = True
            self.nat.settle()  # everyone this walk reached has answered (or never will)
            self._events.append(WalkFinished(walk))

    def _on_visit_reply(self, visit: _Visit, reply: Reply) -> None:
        walk = visit.walk
        if walk.done:
            return
        walk.query.on_reply(visit.addr, reply, visit.slow)
        if reply.error == 0:
            self._events.append(WalkReplied(walk, reply))
        self._pump_walk(walk)

    def _on_visit_retrying(self, visit: _Visit) -> None:
        if not visit.slow and not visit.walk.done:
            visit.slow = True
            visit.walk.query.on_retrying()
            self._pump_walk(visit.walk)

    def _on_visit_failed(self, visit: _Visit, error: DHTError) -> None:
        if visit.walk.done:
            return
        visit.walk.query.on_failed(visit.addr, error.code == "REQUEST_TIMEOUT", visit.slow)
        self._pump_walk(visit.walk)

    # ------------------------------------------------------------------ routing table upkeep

    def _learn_address(self, reply: Reply) -> None:
        """Our address as a node saw it, from its reply to our request (never from a request:
        anyone can send those, claiming anything); rechecks go to the old witnesses."""
        if not filter_node(reply.peer.address):
            return
        nat = self.nat
        nat.add(reply.peer.address, reply.to)
        for witness in nat.take_rechecks():

            def failed(_: DHTError, w: Address = witness) -> None:
                nat.recheck_failed(w)

            self._send(witness, Internal.PING, internal=True, failed=failed)

    def add_node_from_network(self, sample: bool, addr: Address, id_: bytes | None, to: Address) -> None:
        if not filter_node(addr) or id_ is None:
            return
        old = self.table.get(id_)
        if old is not None:
            if sample and (old.sampled == 0 or self.ticks - old.sampled >= OLD_NODE):
                old.to = to
                old.sampled = self.ticks
            old.pinged = old.seen = self.ticks
            self._touch(old)
            return
        self.add_node(Node(id_, addr[0], addr[1], to=to))

    def _touch(self, node: Node) -> None:
        self.nodes.pop(node.id, None)
        self.nodes[node.id] = node

    def add_node(self, node: Node) -> None:
        if node.id in self.nodes or node.id == self.table.id:
            return
        node.added = node.pinged = node.seen = self.ticks
        res = self.table.add(node)
        if res is not True:
            if res is not False:
                self._on_full_row(node, res)
            return
        self.nodes[node.id] = node
        if node.to is not None and node.sampled == 0:
            node.sampled = self.ticks

    def remove_node(self, node: Node) -> None:
        if node.id not in self.nodes:
            return
        self.table.remove(node.id)
        del self.nodes[node.id]
        if not self.nodes and len(self.table) == 0:
            self._on_alone()

    def _on_full_row(self, new: Node, row: Any) -> None:
        """A full bucket: ping its least recently pinged node; swap the newcomer in if it is gone."""
        if not self.ready or self.repinging >= 3:
            return
        oldest: Node | None = None
        for n in row.nodes:
            if n.pinged == self.ticks:
                continue
            if oldest is None or oldest.pinged > n.pinged or (oldest.pinged == n.pinged and oldest.added > n.added):
                oldest = n
        if oldest is None:
            return
        if self.ticks - oldest.pinged < RECENT_NODE and self.ticks - oldest.added > OLD_NODE:
            return
        old = oldest
        last_seen = old.seen
        old.pinged = self.ticks
        self.repinging += 1

        def swap(*_: Any) -> None:
            self.repinging -= 1
            self.remove_node(old)
            self.add_node(new)

        def ok(_: Reply) -> None:
            if old.seen <= last_seen:
                swap()
                return
            self.repinging -= 1

        self._send(old.address, Internal.PING, internal=True, replied=ok, failed=swap)

    def _check(self, node: Node) -> None:
        node.pinged = self.ticks
        last_seen = node.seen
        self.checks += 1

        def ok(_: Reply) -> None:
            self.checks -= 1
            if node.seen <= last_seen:
                self.remove_node(node)

        def bad(_: DHTError) -> None:
            self.checks -= 1
            self.remove_node(node)

        self._send(node.address, Internal.PING, internal=True, replied=ok, failed=bad)

    def _ping_some(self) -> None:
        cnt = 3 if len(self.rpc.inflight) > 2 else 5
        nodes = list(self.nodes.values())
        if not nodes:
            self.refresh()
            return
        if self.ticks - nodes[0].pinged < RECENT_NODE:
            cnt = 2
        for n in nodes[:cnt]:
            if self.ticks != n.pinged:
                self._check(n)

    # ------------------------------------------------------------------ events from the RPC layer

    def _process(self) -> None:
        while (ev := self.rpc.next_event()) is not None:
            if isinstance(ev, RequestReceived):
                self._on_request(ev.incoming)
            elif isinstance(ev, ResponseReceived):
                r = ev.reply
                if not r.external:  # a reply on the socket we send from: its `to` is our address there
                    self._learn_address(r)
                self.add_node_from_network(not r.external, r.peer.address, r.peer.id, r.to)
                ctx = r.pending.context
                if isinstance(ctx, _Own):
                    if ctx.replied:
                        ctx.replied(r)
                elif isinstance(ctx, _Visit):
                    self._on_visit_reply(ctx, r)
                else:
                    self._events.append(ReplyReceived(r))
            elif isinstance(ev, RequestRetrying):
                ctx = ev.pending.context
                if isinstance(ctx, _Visit):
                    self._on_visit_retrying(ctx)
                elif not isinstance(ctx, _Own):
                    self._events.append(RequestRetried(ev.pending))
            elif isinstance(ev, RequestFailed):
                p = ev.pending
                if p.to_id is not None and ev.error.code == "REQUEST_TIMEOUT":
                    node = self.table.get(p.to_id)
                    if node is not None:
                        self.remove_node(node)
                if isinstance(p.context, _Own):
                    if p.context.failed:
                        p.context.failed(ev.error)
                elif isinstance(p.context, _Visit):
                    self._on_visit_failed(p.context, ev.error)
                else:
                    self._events.append(RequestGaveUp(p, ev.error))

    # ------------------------------------------------------------------ answering

    def _on_request(self, inc: IncomingRequest) -> None:
        if inc.peer.id is not None:
            self.add_node_from_network(not inc.external, inc.peer.address, inc.peer.id, inc.request.to)
        req = inc.request
        if req.internal:
            self._on_internal(inc)
            return
        if req.command in (Command.PEER_HANDSHAKE, Command.PEER_HOLEPUNCH):
            self._route(inc)
            return
        if self.persistent is not None and not self.rpc.ephemeral:
            if req.command == Command.PLUGIN:
                return  # no plugins registered: hyperdht drops these
            if Command.FIND_PEER <= req.command <= Command.IMMUTABLE_GET:
                ans = self.persistent.handle(
                    req.command, req.target, req.token, req.value, inc.peer.address, self._now + self.wall_offset
                )
                if ans is not None:
                    self.rpc.reply(inc, ans.value, error=ans.error, token=ans.token, closer_nodes=ans.closer_nodes)
                return
        self._events.append(RequestUnhandled(inc))

    def reply_unknown(self, inc: IncomingRequest) -> None:
        self.rpc.reply(inc, error=ErrorCode.UNKNOWN_COMMAND, closer_nodes=inc.request.target is not None)

    def _on_internal(self, inc: IncomingRequest) -> None:
        req = inc.request
        cmd = req.command
        if cmd == Internal.PING:
            self.rpc.reply(inc, token=False, closer_nodes=False)
        elif cmd == Internal.DELAYED_PING:
            v = req.value
            if v is None or len(v) < 4 or len(self._delayed) >= MAX_DELAYED_PINGS:
                return
            delay = struct.unpack_from("<I", v)[0] / 1000
            if delay <= MAX_PING_DELAY:
                self._delayed_seq += 1
                heapq.heappush(self._delayed, _Delayed(self._now + delay, self._delayed_seq, inc))
        elif cmd == Internal.PING_NAT:
            if req.value is None or len(req.value) < 2:
                return
            port = struct.unpack_from("<H", req.value)[0]
            if port != 0:  # answer to the port it asks for: proves that port reachable
                self.rpc.reply(inc, token=False, closer_nodes=False, to=(inc.peer.host, port))
        elif cmd == Internal.FIND_NODE:
            if req.target is not None:
                self.rpc.reply(inc, token=False, closer_nodes=True)
        elif cmd == Internal.DOWN_HINT:
            if req.value is None or len(req.value) < 6:
                return
            if self.checks < 10:
                node = self.table.get(hash32(req.value[:6]))
                if node is not None and (node.pinged < self.ticks or node.down_hints == 0):
                    node.down_hints += 1
                    self._check(node)
            self.rpc.reply(inc, token=False, closer_nodes=False)
        else:
            self.reply_unknown(inc)

    def _route(self, inc: IncomingRequest) -> None:
        """hyperdht's Router: our own targets go to their server; others are relayed to the
        address that announced them (persistent only) or answered with closer nodes."""
        req = inc.request
        if req.value is None:
            return
        ours = req.target is not None and req.target in self.targets
        relay: Address | None = None
        if not ours and req.target is not None and self.persistent is not None:
            fwd_entry = self.persistent.forwards.get(req.target)
            relay = fwd_entry.relay if fwd_entry is not None else None
        try:
            if req.command == Command.PEER_HANDSHAKE:
                hs = Handshake.decode(req.value)
                if ours:
                    self._events.append(PeerHandshakeReceived(inc, hs))
                    return
                self.apply_route(inc, route_handshake(hs, inc.peer.address, relay))
            else:
                hp = Holepunch.decode(req.value)
                if ours and hp.mode == Mode.FROM_RELAY:
                    if hp.peer_address is not None:
                        self._events.append(PeerHolepunchReceived(inc, hp))
                    return
                self.apply_route(inc, route_holepunch(hp, inc.peer.address, relay))
        except DHTError as e:
            log.debug("dropping %s from %s: %s", Command(req.command).name, inc.peer.address, e)

    def apply_route(
        self, inc: IncomingRequest, route: Route, socket: str | None = None, *, for_others: bool = True
    ) -> None:
        """Carry out a router decision: a same-tid relay request, or a response."""
        if isinstance(route, Relay):
            self.rpc.relay(inc, route.value, route.to, socket)
            self.stats_relayed += for_others
        elif isinstance(route, Respond):
            self.rpc.reply(inc, route.value, token=False, closer_nodes=route.closer_nodes, to=route.to, socket=socket)
            if route.value is not None:
                self.stats_relayed += for_others

    def destroy(self) -> None:
        self._delayed.clear()
        self.rpc.destroy()
        self._process()


__all__ = [
    "CoreEvent",
    "DHTCore",
    "NetworkCheckDue",
    "PeerHandshakeReceived",
    "PeerHolepunchReceived",
    "RefreshDue",
    "RejoinDue",
    "ReplyReceived",
    "RequestGaveUp",
    "RequestRetried",
    "RequestUnhandled",
    "ServersRefreshDue",
    "Walk",
    "WalkFinished",
    "WalkReplied",
    "filter_node",
]


if TYPE_CHECKING:
    from relay.core import DatagramCore, DrivenCore

    # mypy checks the core against relay.core's contract here (never run: the guard sees no asyncio)
    def _conforms(core: DHTCore) -> tuple[DatagramCore[CoreEvent], DrivenCore[CoreEvent]]:
        return core, core
