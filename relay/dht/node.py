"""The asyncio runtime of a dht-rpc node (`dht-rpc/index.js`).

It owns the sockets and the clock, feeds the sans-IO `RPC` core, runs iterative `Query`
walks, keeps the routing table alive (ping, refresh, evict), learns the public address
from reply `to` fields, and checks reachability with PING_NAT. It stays *ephemeral*: it
never sends its id, so other nodes do not route storage traffic to it (dht.md C3.5).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket as socketlib
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, Unpack, cast

import psutil

from .messages import (
    BOOTSTRAP_NODES,
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
    node_id,
)
from .persistent import Forward, Persistent
from .query import Candidate, Query
from .router import Relay, Respond, Route, route_handshake, route_holepunch
from .rpc import (
    CLIENT,
    RPC,
    SERVER,
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
from .transport import UDPEndpoint

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
REJOIN_MIN_TICKS = 1  # with no DHT node left: walk from the bootstrap nodes again after 5 s,
REJOIN_MAX_TICKS = 3  # doubling to 15 s (a node back on the network rejoins well within 30 s)


class DatagramSocket(Protocol):
    """What the node needs from a socket: UDXSocket and UDPEndpoint both fit."""

    # a property pair, not a plain attribute: the node only ever sets the handler, and
    # UDXSocket's own attribute is Optional (a bare UDX socket starts without one)
    @property
    def on_datagram(self) -> object: ...

    @on_datagram.setter
    def on_datagram(self, handler: Callable[[bytes, Address], None]) -> None: ...

    def send(self, data: bytes, addr: Address) -> None: ...

    @property
    def address(self) -> Address: ...


def parse_node(s: str | Address) -> tuple[str, int]:
    """`host:port` or `suggestedIP@hostname:port` (kept whole in host) → (host, port)."""
    if isinstance(s, tuple):
        return s
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise DHTError(f"bootstrap node must be host:port, got {s!r}", "BAD_BOOTSTRAP")
    return host, int(port)


def is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def filter_node(addr: Address) -> bool:
    """hyperdht skips a few known-bad public addresses (`hyperdht/index.js` filterNode)."""
    host, port = addr
    if port == 49738 and host in ("134.209.28.98", "167.99.142.185"):
        return False
    if port == 9400 and host == "35.233.47.252":
        return False
    return host != "150.136.142.116"


def spawn(tasks: set[asyncio.Task[Any]], coro: Any, what: str, level: int) -> None:
    """Run `coro` in the background, held in `tasks` until it ends so that close() can
    cancel it; its failure is logged at `level` rather than left for the loop to find."""
    t = asyncio.ensure_future(coro)
    tasks.add(t)

    def done(t: asyncio.Task[Any]) -> None:
        tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.log(level, "%s failed: %r", what, t.exception())

    t.add_done_callback(done)


class _Call:
    """Context of a plain awaited request: resolves a future."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[Reply]) -> None:
        self.future = future

    def on_reply(self, reply: Reply) -> None:
        if not self.future.done():
            self.future.set_result(reply)

    def on_retrying(self) -> None:
        pass

    def on_failed(self, error: DHTError) -> None:
        if not self.future.done():
            self.future.set_exception(error)


class _Callback:
    """Context of a fire-and-forget request with optional callbacks."""

    __slots__ = ("failed", "replied")

    def __init__(
        self, replied: Callable[[Reply], None] | None = None, failed: Callable[[DHTError], None] | None = None
    ) -> None:
        self.replied = replied
        self.failed = failed

    def on_reply(self, reply: Reply) -> None:
        if self.replied:
            self.replied(reply)

    def on_retrying(self) -> None:
        pass

    def on_failed(self, error: DHTError) -> None:
        if self.failed:
            self.failed(error)


class _Visit:
    """Context of one query request."""

    __slots__ = ("addr", "run", "slow")

    def __init__(self, run: _QueryRun, addr: Address) -> None:
        self.run = run
        self.addr = addr
        self.slow = False

    def on_reply(self, reply: Reply) -> None:
        self.run.query.on_reply(self.addr, reply, self.slow)
        if reply.error == 0 and self.run.on_data is not None:
            self.run.on_data(reply)
        self.run.pump()

    def on_retrying(self) -> None:
        if not self.slow:
            self.slow = True
            self.run.query.on_retrying()
            self.run.pump()

    def on_failed(self, error: DHTError) -> None:
        self.run.query.on_failed(self.addr, error.code == "REQUEST_TIMEOUT", self.slow)
        self.run.pump()


class _QueryRun:
    def __init__(
        self,
        node: DHTNode,
        query: Query,
        command: int,
        internal: bool,
        value: bytes | None,
        retries: int,
        on_data: Callable[[Reply], None] | None,
        background: bool,
    ) -> None:
        self.node = node
        self.query = query
        self.command = command
        self.internal = internal
        self.value = value
        self.retries = retries
        self.on_data = on_data
        self.background = background
        self.done: asyncio.Future[Query] = asyncio.get_running_loop().create_future()
        self.pending: list[PendingRequest] = []

    def pump(self) -> None:
        q = self.query
        if self.done.done():
            return
        if self.background:
            q.concurrency = self.node.concurrency if len(self.node.rpc.inflight) < 3 else 2
        for cand in q.next_visits():
            try:
                p = self.node._send(
                    cand.address,
                    self.command,
                    internal=self.internal,
                    target=q.target,
                    value=self.value,
                    retries=self.retries,
                    to_id=cand.id,
                    context=_Visit(self, cand.address),
                )
                self.pending.append(p)
            except DHTError as e:
                q.on_failed(cand.address, False)
                log.debug("query request to %s failed: %s", cand.address, e)
        for hint in q.take_down_hints():
            self.node._down_hint(hint.to, hint.down)
        if q.finished:
            self.done.set_result(q)

    def cancel(self) -> None:
        for p in self.pending:
            self.node.rpc.cancel(p)
        if not self.done.done():
            self.query.finished = True
            self.done.set_result(self.query)


class DHTNode:
    """A dht-rpc node on one server socket (shareable with UDX) plus a client socket.

    `socket`: an already bound server socket (e.g. a `relay.udx.UDXSocket`); when None the
    node binds a UDP endpoint on host:port itself. `firewalled=None` detects reachability
    with PING_NAT; False claims the port is publicly reachable (like Node's
    `firewalled: false`), True never claims it.
    """

    def __init__(
        self,
        socket: DatagramSocket | None = None,
        *,
        bootstrap: Sequence[str | Address] | None = None,
        host: str = "0.0.0.0",
        port: int = 0,
        firewalled: bool | None = None,
        client_socket: DatagramSocket | None = None,
        udx: Any = None,
        ephemeral: bool | None = True,
        concurrency: int = 10,
    ) -> None:
        self.bootstrap_nodes = [parse_node(b) for b in (BOOTSTRAP_NODES if bootstrap is None else bootstrap)]
        self.host = host
        self.port = port
        self.table = RoutingTable(os.urandom(32))
        self.rpc = RPC(self.table, firewalled=firewalled is not False)
        self.nat = NatSampler()
        self.concurrency = concurrency
        self.server_socket = socket
        self.client_socket = client_socket
        self.udx = udx  # relay.udx.UDX: when set, sockets we bind are UDXSockets sharing its streams
        self._owned: list[Any] = []
        self._detect_firewall = firewalled is None
        # True: never store for others (default: a relay owes the DHT nothing, dht.md C3.5);
        # False: become persistent at bootstrap; None: adaptive, after ~20 stable minutes as Node
        self._force_persistent = ephemeral is False
        self._adaptive = ephemeral is None
        self.persistent: Persistent | None = None
        self._ready = False  # the first walk finished (dht-rpc's `bootstrapped`): upkeep runs
        self._joined = False  # some DHT node answered and sits in our table
        self._rejoin_tick = 0  # tick at which to walk from the bootstrap nodes again
        self._rejoin_ticks = REJOIN_MIN_TICKS
        self._rejoining = False
        self._warned_alone = False
        self.destroyed = False
        self.last_announce: float | None = None
        self.internal_errors = 0  # bugs caught at the datagram boundary (tests assert 0)
        self.stats_relayed = 0  # handshake messages we routed for others (either direction)
        self.on_request: Callable[[IncomingRequest], bool] | None = None
        # target -> server (HyperDHTServer): PEER_HANDSHAKE / PEER_HOLEPUNCH for our keys
        self.servers: dict[bytes, Any] = {}
        self._extra_sockets: dict[str, tuple[Any, Callable[[bytes, Address], None] | None]] = {}
        self._interfaces: frozenset[str] | None = None
        self.on_datagram: Callable[[str, bytes, Address], None] | None = None
        self._nodes: dict[bytes, Node] = {}  # insertion order = least recently seen first
        self._tick = 100 - int.from_bytes(os.urandom(1), "little") % 50
        self._refresh_ticks = REFRESH_TICKS
        self._stable_ticks = STABLE_TICKS
        self._last_host: str | None = None
        self._repinging = 0
        self._checks = 0
        self._down_hints_sent = 0
        self._none_persistent_samples: list[str] = []
        self._resolved_bootstrap: list[Address] | None = None
        self._probe: set[str] | None = None  # hosts that reached the server port during a PING_NAT check
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self._last_tick = 0.0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._bootstrapping: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ state

    @property
    def firewalled(self) -> bool:
        return self.rpc.firewalled

    @property
    def bootstrapped(self) -> bool:
        """True while we are part of the DHT: a walk reached a node and the table is not empty.
        A node that nobody answered (yet), or that lost every node, says False and keeps trying."""
        return self._joined

    @property
    def id(self) -> bytes | None:
        return None if self.rpc.ephemeral else self.table.id

    def remote_address(self) -> Address | None:
        """Our public address, only when reachable and port-preserving (dht-rpc remoteAddress)."""
        if self.nat.host is None or not self.nat.port or self.firewalled or self.server_socket is None:
            return None
        port = self.server_socket.address[1]
        if port != self.nat.port:
            return None
        return (self.nat.host, port)

    def local_address(self) -> Address:
        assert self.server_socket is not None
        return self.server_socket.address

    def address(self) -> Address:
        """The socket requests currently leave from (hyperdht's `dht.socket`)."""
        sock = self.socket_for(self.rpc.socket)
        return sock.address

    def socket_for(self, name: str) -> DatagramSocket:
        if name == SERVER:
            sock = self.server_socket
        elif name == CLIENT:
            sock = self.client_socket
        else:
            sock = self._extra_sockets[name][0]
        assert sock is not None, "node is not bound"
        return sock

    def add_socket(self, name: str, sock: Any, on_probe: Callable[[bytes, Address], None] | None = None) -> None:
        """Speak dht-rpc on another socket too (a holepuncher's); 1-byte probes go to `on_probe`."""
        self._extra_sockets[name] = (sock, on_probe)
        sock.on_datagram = lambda data, addr: self._on_datagram(name, data, addr)

    def remove_socket(self, name: str) -> None:
        self._extra_sockets.pop(name, None)

    def nodes(self) -> list[Address]:
        return [n.address for n in self._nodes.values()]

    def stats(self) -> dict[str, Any]:
        """The /stats "dht" block (interfaces.md)."""
        ra = self.remote_address()
        return {
            "bootstrapped": self.bootstrapped,
            "firewalled": self.firewalled,
            "public_host": ra[0] if ra else self.nat.host,
            "public_port": ra[1] if ra else (self.nat.port or None),
            "last_announce": self.last_announce,
            "nodes": len(self.table),
        }

    # ------------------------------------------------------------------ lifecycle

    async def bind(self) -> None:
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        if self.server_socket is None:
            try:
                self.server_socket = await self._bind_socket(self.host, self.port)
            except OSError as e:
                raise DHTError(f"cannot bind UDP {self.host}:{self.port}: {e.strerror or e}", "BIND_FAILED") from e
        if self.client_socket is None:
            self.client_socket = await self._bind_socket(self.server_socket.address[0], 0)
        self.server_socket.on_datagram = lambda data, addr: self._on_datagram(SERVER, data, addr)
        self.client_socket.on_datagram = lambda data, addr: self._on_datagram(CLIENT, data, addr)
        self._last_tick = time.monotonic()
        self._tick_handle = self._loop.call_later(TICK_INTERVAL, self._ontick)

    async def _bind_socket(self, host: str, port: int) -> Any:
        if self.udx is not None:
            sock = await self.udx.create_socket(host, port)
        else:
            sock = await UDPEndpoint.bind(host, port)
        self._owned.append(sock)
        return sock

    async def bootstrap(self, *, require_reply: bool = False) -> None:
        """Join the network: walk towards our own id, probe reachability, then ready.

        Like dht-rpc this finishes even when nobody answered (the node keeps retrying in
        the background); `require_reply=True` raises DHTError("BOOTSTRAP_FAILED") then."""
        await self.bind()
        if self._bootstrapping is None:
            self._bootstrapping = asyncio.ensure_future(self._bootstrap())
        await asyncio.shield(self._bootstrapping)
        if require_reply and self.rpc.stats["responses"] == 0:
            names = ", ".join(f"{h}:{p}" for h, p in self.bootstrap_nodes) or "none given"
            raise DHTError(f"no DHT bootstrap node answered ({names})", "BOOTSTRAP_FAILED")

    async def _bootstrap(self) -> None:
        self._resolved_bootstrap = await self._resolve_bootstrap()
        await self._join_walk()
        self._ready = True
        if not self._joined and self.bootstrap_nodes and not self._warned_alone:
            self._warned_alone = True
            names = ", ".join(f"{h}:{p}" for h, p in self.bootstrap_nodes)
            log.warning("dht bootstrap: no DHT node answered (%s); retrying in the background", names)

    async def _rejoin(self) -> None:
        """No DHT node left (never reached one, or lost them all): resolve the bootstrap names
        again (DNS may have come up) and walk; back off while nobody answers."""
        self._rejoining = True
        try:
            self._resolved_bootstrap = await self._resolve_bootstrap()
            await self._join_walk(check=True)
        finally:
            self._rejoining = False
        if not self._joined:
            self._rejoin_ticks = min(2 * self._rejoin_ticks, REJOIN_MAX_TICKS)
            self._rejoin_tick = self._tick + self._rejoin_ticks

    async def _join_walk(self, check: bool = False) -> None:
        """Walk towards our own id, probe reachability once a node answers (dht-rpc _bootstrap).

        dht-rpc's quick test needs the PING_NAT reply before the walk ends, else the check
        waits ~20 min for the stable ticks; `check` (a rejoin, where nobody waits) then runs
        the full reachability check at once."""
        first = self.firewalled and self._detect_firewall and not self._force_persistent
        test_nat = False

        def ondata(reply: Reply) -> None:
            nonlocal first, test_nat
            if not first:
                return
            first = False

            def ok(_: Reply) -> None:
                nonlocal test_nat
                test_nat = True

            self._request_cb(reply.peer.address, Internal.PING_NAT, internal=True, value=self._port_value(), replied=ok)

        await self._background_query(self.table.id, on_data=ondata)
        if (test_nat or self._force_persistent) and await self._update_network_state(
            only_firewall=not self._force_persistent
        ):
            # as dht-rpc: one more walk, now from the server socket (and with our id if persistent)
            await self._background_query(self.table.id)
        elif check and not test_nat and first is False and self._detect_firewall and self.firewalled:
            await self._update_network_state(only_firewall=not self._adaptive)
        if len(self.table) > 0:
            self._on_joined()

    def _on_joined(self) -> None:
        if self._joined:
            return
        again = self._ready
        self._joined = True
        self._rejoin_ticks = REJOIN_MIN_TICKS
        log.info(
            "dht %s: %d nodes, firewalled=%s, public=%s",
            "rejoined" if again else "bootstrapped",
            len(self.table),
            self.firewalled,
            self.remote_address(),
        )
        if again:  # announces made while alone (or before an outage) reached nobody: announce now
            for server in list(self.servers.values()):
                server.refresh()

    def _on_alone(self) -> None:
        """The last node left the table (an outage, or the DHT went away): rejoin soon."""
        if not self._joined:
            return
        self._joined = False
        self._rejoin_ticks = REJOIN_MIN_TICKS
        self._rejoin_tick = self._tick + REJOIN_MIN_TICKS
        log.warning("dht: lost every DHT node; rejoining from the bootstrap nodes")

    async def _resolve_bootstrap(self) -> list[Address]:
        out: list[Address] = []
        loop = asyncio.get_running_loop()
        for host, port in self.bootstrap_nodes:
            lookup = host
            if "@" in host:
                suggested, lookup = host.split("@", 1)
                try:
                    await self.ping((suggested, port))
                    out.append((suggested, port))
                    continue
                except DHTError:
                    pass
            if is_ipv4(lookup):
                out.append((lookup, port))
                continue
            try:
                infos = await loop.getaddrinfo(lookup, port, family=socketlib.AF_INET, type=socketlib.SOCK_DGRAM)
            except OSError:
                continue
            if infos:
                out.append((cast(str, infos[0][4][0]), port))  # AF_INET: always a str
        return out

    async def close(self) -> None:
        """Close listening servers first (they unannounce while the node can still talk)."""
        if self.destroyed:
            return
        for server in list(self.servers.values()):
            with contextlib.suppress(Exception):
                await server.close()
        self.destroyed = True
        if self._bootstrapping is not None and not self._bootstrapping.done():
            self._bootstrapping.cancel()
        for t in list(self._tasks):
            t.cancel()
        self.rpc.destroy()
        self._dispatch()
        if self._timer:
            self._timer.cancel()
        if self._tick_handle:
            self._tick_handle.cancel()
        for ep in self._owned:
            res = ep.close()
            if asyncio.iscoroutine(res):
                await res

    # ------------------------------------------------------------------ IO pump

    def _now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    def _on_datagram(self, socket: str, data: bytes, addr: Address) -> None:
        if self.destroyed:
            return
        if socket == SERVER and self._probe is not None:
            self._probe.add(addr[0])
        if len(data) < 2 or data[0] not in (0x03, 0x13):
            extra = self._extra_sockets.get(socket)
            if extra is not None and extra[1] is not None and len(data) == 1:
                extra[1](data, addr)
            elif self.on_datagram is not None:
                self.on_datagram(socket, data, addr)
            return
        try:
            self.rpc.receive(data, addr, socket, self._now())
            self._dispatch()
        except Exception:  # the loop must survive anything a peer sends
            self.internal_errors += 1
            log.exception("dropping datagram from %s after an internal error", addr)
        self._flush()

    def _flush(self) -> None:
        for sock, data, addr in self.rpc.datagrams_to_send():
            try:
                self.socket_for(sock).send(data, addr)
            except OSError as e:
                log.debug("send to %s failed: %s", addr, e)
        at = self.rpc.get_timer()
        if at != self._timer_at and self._loop is not None:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(at, self._on_timer) if at is not None else None
            self._timer_at = at

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        if self.destroyed:
            return
        self.rpc.handle_timer(self._now())
        self._dispatch()
        self._flush()

    def _dispatch(self) -> None:
        while (ev := self.rpc.next_event()) is not None:
            if isinstance(ev, RequestReceived):
                self._on_request(ev.incoming)
            elif isinstance(ev, ResponseReceived):
                r = ev.reply
                self._add_node_from_network(not r.external, r.peer.address, r.peer.id, r.to)
                ctx = r.pending.context
                if ctx is not None:
                    ctx.on_reply(r)
            elif isinstance(ev, RequestRetrying):
                if ev.pending.context is not None:
                    ev.pending.context.on_retrying()
            elif isinstance(ev, RequestFailed):
                p = ev.pending
                if p.to_id is not None and ev.error.code == "REQUEST_TIMEOUT":
                    node = self.table.get(p.to_id)
                    if node is not None:
                        self._remove_node(node)
                if p.context is not None:
                    p.context.on_failed(ev.error)

    # ------------------------------------------------------------------ requests

    def _send(self, to: Address, command: int, **options: Unpack[SendOptions]) -> PendingRequest:
        if self._loop is None:
            raise DHTError("node is not bound", "NOT_BOUND")
        p = self.rpc.request(to, command, self._now(), **options)
        self._flush()
        return p

    def _request_cb(
        self,
        to: Address,
        command: int,
        *,
        replied: Callable[[Reply], None] | None = None,
        failed: Callable[[DHTError], None] | None = None,
        **options: Unpack[RequestOptions],
    ) -> PendingRequest | None:
        try:
            return self._send(to, command, context=_Callback(replied, failed), **options)
        except DHTError as e:
            if failed:
                failed(e)
            return None

    async def request(self, to: Address, command: int, **options: Unpack[RequestOptions]) -> Reply:
        """Send one request and wait for its reply (raises DHTError on timeout). Options
        (`internal`, `target`, `value`, `token`, `socket`, `retries`, `timeout`) as `RPC.request`."""
        await self.bind()
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        p = self._send(to, command, context=_Call(fut), **options)
        try:
            return await fut
        finally:
            self.rpc.cancel(p)

    async def ping(self, to: Address, **kw: Any) -> Reply:
        return await self.request(to, Internal.PING, internal=True, **kw)

    async def query(
        self,
        target: bytes,
        command: int,
        *,
        internal: bool = False,
        value: bytes | None = None,
        nodes: list[Address] | None = None,
        concurrency: int | None = None,
        retries: int = 5,
        on_data: Callable[[Reply], None] | None = None,
        only_closest_nodes: bool = False,
        background: bool = False,
    ) -> Query:
        """Run an iterative walk to `target`; returns the finished Query (closest replies)."""
        await self.bind()
        self._refresh_ticks = REFRESH_TICKS
        if self._resolved_bootstrap is None:
            self._resolved_bootstrap = await self._resolve_bootstrap()
        q = Query(
            target,
            self.table,
            bootstrap=list(self._resolved_bootstrap),
            nodes=nodes,
            concurrency=concurrency or self.concurrency,
            only_closest_nodes=only_closest_nodes,
        )
        run = _QueryRun(self, q, command, internal, value, retries, on_data, background)
        run.pump()
        try:
            return await run.done
        finally:
            run.cancel()

    async def find_node(self, target: bytes, **kw: Any) -> Query:
        return await self.query(target, Internal.FIND_NODE, internal=True, **kw)

    async def find_peer(self, public_key: bytes, *, hash: bool = True, **kw: Any) -> Query:
        return await self.query(hash32(public_key) if hash else public_key, Command.FIND_PEER, **kw)

    async def _background_query(self, target: bytes, on_data: Callable[[Reply], None] | None = None) -> Query:
        return await self.query(
            target,
            Internal.FIND_NODE,
            internal=True,
            concurrency=min(self.concurrency, max(2, self.concurrency // 8)),
            on_data=on_data,
            background=True,
        )

    def refresh(self) -> None:
        node = self.table.random()
        self._spawn(self._background_query(node.id if node else self.table.id))

    def _spawn(self, coro: Any) -> None:
        spawn(self._tasks, coro, "background task", logging.DEBUG)

    def _down_hint(self, to: Address, down: Address) -> None:
        if self._down_hints_sent >= DOWN_HINTS_PER_TICK:
            return
        self._down_hints_sent += 1
        self._request_cb(to, Internal.DOWN_HINT, internal=True, value=encode_address(down))

    def _port_value(self) -> bytes:
        return struct.pack("<H", self.local_address()[1])

    # ------------------------------------------------------------------ routing table upkeep

    def _nat_add(self, host: str, port: int) -> None:
        self.nat.add(host, port)

    def _add_node_from_network(self, sample: bool, addr: Address, id_: bytes | None, to: Address) -> None:
        if not filter_node(addr):
            return
        if id_ is None:
            key = f"{addr[0]}:{addr[1]}"
            if len(self._none_persistent_samples) >= max(1, len(self.bootstrap_nodes)):
                return
            if key in self._none_persistent_samples:
                return
            self._none_persistent_samples.append(key)
            self._nat_add(*to)
            return
        old = self.table.get(id_)
        if old is not None:
            if sample and (old.sampled == 0 or self._tick - old.sampled >= OLD_NODE):
                old.to = to
                old.sampled = self._tick
                self._nat_add(*to)
            old.pinged = old.seen = self._tick
            self._touch(old)
            return
        self._add_node(Node(id_, addr[0], addr[1], to=to))

    def _touch(self, node: Node) -> None:
        self._nodes.pop(node.id, None)
        self._nodes[node.id] = node

    def add_node(self, addr: Address) -> None:
        """Seed the table with a known node (hyperdht `opts.nodes`)."""
        self._add_node(Node(node_id(addr), addr[0], addr[1]))

    def _add_node(self, node: Node) -> None:
        if node.id in self._nodes or node.id == self.table.id:
            return
        node.added = node.pinged = node.seen = self._tick
        res = self.table.add(node)
        if res is not True:
            if res is not False:
                self._on_full_row(node, res)
            return
        self._nodes[node.id] = node
        if node.to is not None and node.sampled == 0:
            node.sampled = self._tick
            self._nat_add(*node.to)

    def _remove_node(self, node: Node) -> None:
        if node.id not in self._nodes:
            return
        self.table.remove(node.id)
        del self._nodes[node.id]
        if not self._nodes and len(self.table) == 0:
            self._on_alone()

    def _on_full_row(self, new: Node, row: Any) -> None:
        if not self._ready or self._repinging >= 3:
            return
        oldest: Node | None = None
        for n in row.nodes:
            if n.pinged == self._tick:
                continue
            if oldest is None or oldest.pinged > n.pinged or (oldest.pinged == n.pinged and oldest.added > n.added):
                oldest = n
        if oldest is None:
            return
        if self._tick - oldest.pinged < RECENT_NODE and self._tick - oldest.added > OLD_NODE:
            return
        old = oldest
        last_seen = old.seen
        old.pinged = self._tick
        self._repinging += 1

        def swap(*_: Any) -> None:
            self._repinging -= 1
            self._remove_node(old)
            self._add_node(new)

        def ok(_: Reply) -> None:
            if old.seen <= last_seen:
                swap()
                return
            self._repinging -= 1

        self._request_cb(old.address, Internal.PING, internal=True, replied=ok, failed=swap)

    def _check(self, node: Node) -> None:
        node.pinged = self._tick
        last_seen = node.seen
        self._checks += 1

        def ok(_: Reply) -> None:
            self._checks -= 1
            if node.seen <= last_seen:
                self._remove_node(node)

        def bad(_: DHTError) -> None:
            self._checks -= 1
            self._remove_node(node)

        self._request_cb(node.address, Internal.PING, internal=True, replied=ok, failed=bad)

    def _ping_some(self) -> None:
        cnt = 3 if len(self.rpc.inflight) > 2 else 5
        nodes = list(self._nodes.values())
        if not nodes:
            self.refresh()
            return
        if self._tick - nodes[0].pinged < RECENT_NODE:
            cnt = 2
        for n in nodes[:cnt]:
            if self._tick != n.pinged:
                self._check(n)

    def _ontick(self) -> None:
        if self.destroyed or self._loop is None:
            return
        self._tick_handle = self._loop.call_later(TICK_INTERVAL, self._ontick)
        now = time.monotonic()
        if now - self._last_tick > SLEEPING_INTERVAL:
            self._tick += 2 * OLD_NODE
            self._tick += 8 - (self._tick & 7) - 2
            self._refresh_ticks = 1
        else:
            self._tick += 1
        self._last_tick = now
        if not self._ready:
            return
        if not self._joined and not self._rejoining and self._tick >= self._rejoin_tick:
            self._rejoining = True
            self._spawn(self._rejoin())
        interfaces = self.interfaces()
        if interfaces != self._interfaces:
            # hyperdht re-announces every server on a network change (`network-change`)
            changed = self._interfaces is not None
            self._interfaces = interfaces
            if changed:
                log.info("network interfaces changed: re-announcing")
                for server in list(self.servers.values()):
                    server.refresh()
        if self.persistent is not None:
            self.persistent.tick(self._loop.time())
        if (self._adaptive and self.rpc.ephemeral) or (self._detect_firewall and self.firewalled):
            self._stable_ticks -= 1
            if self._stable_ticks <= 0:
                self._stable_ticks = MORE_STABLE_TICKS
                if self._last_host != self.nat.host:
                    self._last_host = self.nat.host
                    self._spawn(self._update_network_state(only_firewall=not self._adaptive))
        if self._tick & 7 == 0:
            self._ping_some()
        self._refresh_ticks -= 1
        if ((self._tick & 63) == 0 and len(self._nodes) < self.table.k) or self._refresh_ticks <= 0:
            self.refresh()
        self._down_hints_sent = 0

    # ------------------------------------------------------------------ reachability

    async def _update_network_state(self, only_firewall: bool = True) -> bool:
        """The reachability check (dht-rpc `_updateNetworkState`). If enough nodes reach our
        server port from a host they also see, requests move to the server socket; unless
        `only_firewall`, the node also becomes persistent: id = H(public ip:port), table
        rebuilt around it, storage on."""
        if not self.rpc.ephemeral:
            return False
        if only_firewall and not self.firewalled:
            return False
        host, port = self.nat.host, self.nat.port
        if not only_firewall:
            self._stable_ticks = MORE_STABLE_TICKS
            self._last_host = host
        if host is None or port == 0:
            return False
        sampler = NatSampler() if self.firewalled else self.nat
        if self.firewalled and await self._check_if_firewalled(sampler):
            return False
        self.rpc.firewalled = False
        if not self.rpc.ephemeral or host != self.nat.host or port != self.nat.port:
            return False
        if sampler.host != host or sampler.port == 0:
            return False
        if sampler is not self.nat:
            self._none_persistent_samples = []
            self.nat = sampler
        if not only_firewall:
            self._become_persistent(node_id((sampler.host, sampler.port)))
        return True

    def _become_persistent(self, id_: bytes) -> None:
        self.rpc.ephemeral = False
        if id_ != self.table.id:
            old = list(self.table)
            self.table = self.rpc.table = RoutingTable(id_)
            for n in old:
                if n.id == id_:
                    continue
                if self.table.add(n) is not True:
                    self._nodes.pop(n.id, None)
            if self._ready:
                self.refresh()
        self.persistent = Persistent(id_)
        for target, server in self.servers.items():
            self._retain_forward(target, server)
        log.info("dht node is persistent with id %s", id_.hex()[:16])

    @staticmethod
    def interfaces() -> frozenset[str]:
        """This host's IPv4 addresses (udx watchNetworkInterfaces, polled on the 5 s tick)."""
        try:
            return frozenset(
                a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socketlib.AF_INET
            )
        except OSError:
            return frozenset()

    def register_server(self, target: bytes, server: Any) -> None:
        """A HyperDHTServer listening here: handshakes for `target` go to it."""
        self.servers[target] = server
        if self.persistent is not None:
            self._retain_forward(target, server)

    def _retain_forward(self, target: bytes, server: Any) -> None:
        """A persistent node answers FIND_PEER for its own servers' keys (never expires)."""
        assert self.persistent is not None
        self.persistent.forwards.retain(target, Forward(None, PeerRecord(server.public_key).encode()))

    def unregister_server(self, target: bytes) -> None:
        self.servers.pop(target, None)
        if self.persistent is not None:
            self.persistent.forwards.delete(target)

    async def _check_if_firewalled(self, sampler: NatSampler) -> bool:
        nodes: list[Address] = [n.address for n in reversed(self._nodes.values())][:5]
        if len(nodes) < 5:
            nodes += await self._resolve_bootstrap()
        if not nodes:
            return True
        probe = self._probe = set()
        try:
            results = await asyncio.gather(
                *(self.request(a, Internal.PING_NAT, internal=True, value=self._port_value()) for a in nodes),
                return_exceptions=True,
            )
        finally:
            self._probe = None
        count = 0
        for r in results:
            if isinstance(r, Reply) and r.peer.host in probe:
                count += 1
                sampler.add(*r.to)
        if count < (3 if len(nodes) >= 5 else 1):
            return True
        if sampler.host is None or self.nat.host != sampler.host:
            return True
        return sampler.port == 0 or sampler.port != self.local_address()[1]

    # ------------------------------------------------------------------ answering

    def _on_request(self, inc: IncomingRequest) -> None:
        if inc.peer.id is not None:
            self._add_node_from_network(not inc.external, inc.peer.address, inc.peer.id, inc.request.to)
        req = inc.request
        if req.internal:
            cmd = req.command
            if cmd == Internal.PING:
                self.rpc.reply(inc, token=False, closer_nodes=False)
                return
            if cmd == Internal.DELAYED_PING:
                self._on_delayed_ping(inc)
                return
            if cmd == Internal.PING_NAT:
                if req.value is None or len(req.value) < 2:
                    return
                port = struct.unpack_from("<H", req.value)[0]
                if port == 0:
                    return
                dest = (inc.peer.host, port)
                self.rpc.reply(inc, token=False, closer_nodes=False, to=dest)
                return
            if cmd == Internal.FIND_NODE:
                if req.target is None:
                    return
                self.rpc.reply(inc, token=False, closer_nodes=True)
                return
            if cmd == Internal.DOWN_HINT:
                if req.value is None or len(req.value) < 6:
                    return
                if self._checks < 10:
                    node = self.table.get(hash32(req.value[:6]))
                    if node is not None and (node.pinged < self._tick or node.down_hints == 0):
                        node.down_hints += 1
                        self._check(node)
                self.rpc.reply(inc, token=False, closer_nodes=False)
                return
            self.rpc.reply(inc, error=ErrorCode.UNKNOWN_COMMAND, closer_nodes=req.target is not None)
            return
        if req.command in (Command.PEER_HANDSHAKE, Command.PEER_HOLEPUNCH):
            self._route(inc)
            return
        if self.persistent is not None and not self.rpc.ephemeral:
            if req.command == Command.PLUGIN:
                return  # no plugins registered: hyperdht drops these
            if Command.FIND_PEER <= req.command <= Command.IMMUTABLE_GET:
                ans = self.persistent.handle(
                    req.command, req.target, req.token, req.value, inc.peer.address, time.time()
                )
                if ans is not None:
                    self.rpc.reply(inc, ans.value, error=ans.error, token=ans.token, closer_nodes=ans.closer_nodes)
                return
        if self.on_request is None or not self.on_request(inc):
            self.rpc.reply(inc, error=ErrorCode.UNKNOWN_COMMAND, closer_nodes=req.target is not None)

    def _route(self, inc: IncomingRequest) -> None:
        """hyperdht's Router: our own targets go to their server; others are relayed to the
        address that announced them (persistent only) or answered with closer nodes."""
        req = inc.request
        if req.value is None:
            return
        server = self.servers.get(req.target) if req.target is not None else None
        relay: Address | None = None
        if server is None and req.target is not None and self.persistent is not None:
            fwd_entry = self.persistent.forwards.get(req.target)
            relay = fwd_entry.relay if fwd_entry is not None else None
        try:
            if req.command == Command.PEER_HANDSHAKE:
                hs = Handshake.decode(req.value)
                if server is not None:
                    server.on_peer_handshake(inc, hs)
                    return
                self.apply_route(inc, route_handshake(hs, inc.peer.address, relay))
            else:
                hp = Holepunch.decode(req.value)
                if server is not None and hp.mode == Mode.FROM_RELAY:
                    if hp.peer_address is not None:
                        server.on_peer_holepunch(inc, hp)
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
        self._flush()

    def _on_delayed_ping(self, inc: IncomingRequest) -> None:
        v = inc.request.value
        if v is None or len(v) < 4:
            return
        delay = struct.unpack_from("<I", v)[0] / 1000
        if delay > MAX_PING_DELAY or self._loop is None:
            return

        def later() -> None:
            if self.destroyed:
                return
            self.rpc.reply(inc, token=False, closer_nodes=False)
            self._flush()

        self._loop.call_later(delay, later)

    def reply(self, inc: IncomingRequest, value: bytes | None = None, **kw: Any) -> None:
        """Answer an incoming request now (for handlers that answer later, e.g. handshakes)."""
        self.rpc.reply(inc, value, **kw)
        self._flush()

    def relay(self, inc: IncomingRequest, value: bytes, to: Address, socket: str | None = None) -> None:
        self.rpc.relay(inc, value, to, socket)
        self._flush()


__all__ = ["Candidate", "DHTNode", "DatagramSocket", "parse_node"]
