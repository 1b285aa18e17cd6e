"""The asyncio runtime of a dht-rpc node: sockets, the one clock, and awaited requests.

Every decision lives in the sans-IO `DHTCore` (`relay/dht/core.py`): routing-table upkeep,
the tick, reachability, our own address, the command handlers, handshake routing. This
module feeds it datagrams through its `relay.core.Driver` (which adds `loop.time()`, sends what
the core returns and runs its one timer: retransmissions, delayed pings and the 5 s tick),
resolves the futures of awaited requests, and runs what the core asks for that is
a sequence of round trips (walks, the bootstrap join, the PING_NAT reachability check). It
stays *ephemeral* by default: it never sends its id, so other nodes do not route storage
traffic to it (docs/wire/dht.md §1).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket as socketlib
import time
from collections.abc import Callable, Sequence
from typing import Any, Unpack, cast

import psutil

from relay.core import Deadlines, Driver, run_action

from .address import OwnAddress
from .calls import Call, Callback, DatagramSocket, is_ipv4, parse_node, spawn
from .core import (
    MORE_STABLE_TICKS,
    CoreEvent,
    DHTCore,
    InterfacesDue,
    NetworkCheckDue,
    PeerHandshakeReceived,
    PeerHolepunchReceived,
    RefreshDue,
    RejoinDue,
    ReplyReceived,
    RequestGaveUp,
    RequestRetried,
    RequestUnhandled,
    ServersRefreshDue,
    Walk,
    WalkFinished,
    WalkReplied,
    filter_node,
)
from .messages import BOOTSTRAP_NODES, Address, Command, DHTError, Internal, hash32, node_id
from .persistent import Persistent
from .query import Candidate, Query
from .router import Route
from .rpc import CLIENT, RPC, SERVER, IncomingRequest, PendingRequest, Reply, RequestOptions, SendOptions
from .table import NatSampler, Node, RoutingTable
from .transport import UDPEndpoint

log = logging.getLogger("relay.dht")


class DHTNode:
    """A dht-rpc node on one server socket (shareable with UDX) plus a client socket.

    `socket`: an already bound server socket (e.g. a `relay.udx.UDXSocket`); when None the
    node binds a UDP endpoint on host:port itself. `firewalled=None` detects reachability
    with PING_NAT; False claims the port is publicly reachable (like Node's
    `firewalled: false`), True never claims it. `ephemeral`: True never stores for others
    (the default: a relay owes the DHT nothing), False becomes persistent at bootstrap,
    None adapts after ~20 stable minutes as Node does.
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
        self.core = DHTCore(
            firewalled=firewalled is not False,
            detect_firewall=firewalled is None,
            ephemeral=ephemeral,
        )
        self.concurrency = concurrency
        self.server_socket = socket
        self.client_socket = client_socket
        self.udx = udx  # relay.udx.UDX: when set, sockets we bind are UDXSockets sharing its streams
        self._owned: list[Any] = []
        self._warned_alone = False
        self.destroyed = False
        self.last_announce: float | None = None
        self.internal_errors = 0  # bugs caught at the datagram boundary (tests assert 0)
        self.on_request: Callable[[IncomingRequest], bool] | None = None
        # target -> server (HyperDHTServer): PEER_HANDSHAKE / PEER_HOLEPUNCH for our keys
        self.servers: dict[bytes, Any] = {}
        self._extra_sockets: dict[str, tuple[Any, Callable[[bytes, Address], None] | None]] = {}
        self.on_datagram: Callable[[str, bytes, Address], None] | None = None
        self._resolved_bootstrap: list[Address] | None = None
        #: runs the core: its events, its datagrams, its one timer (relay.core)
        self.driver: Driver[CoreEvent] = Driver(self.core, on_event=self._on_event, transmit=self._transmit)
        #: the glue's own one-shot waits (`after`), on a driver's timer too
        self._later = Deadlines()
        self._later_driver: Driver[Callable[[], object]] = Driver(self._later, on_event=run_action)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._walks: dict[Walk, tuple[asyncio.Future[Query], Callable[[Reply], None] | None]] = {}
        self._bootstrapping: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ state (the core's)

    @property
    def rpc(self) -> RPC:
        return self.core.rpc

    @property
    def table(self) -> RoutingTable:
        return self.core.table

    @property
    def nat(self) -> OwnAddress:
        return self.core.nat

    @property
    def persistent(self) -> Persistent | None:
        return self.core.persistent

    @property
    def stats_relayed(self) -> int:
        return self.core.stats_relayed

    @property
    def firewalled(self) -> bool:
        return self.core.firewalled

    @property
    def rpc_dropped(self) -> int:
        """dht-rpc-shaped datagrams the RPC layer dropped: undecodable, or a reply nobody awaits."""
        return int(self.core.rpc.stats["dropped"])

    @property
    def bootstrapped(self) -> bool:
        """True while we are part of the DHT: a walk reached a node and the table is not empty.
        A node that nobody answered (yet), or that lost every node, says False and keeps trying."""
        return self.core.joined

    @property
    def id(self) -> bytes | None:
        return self.core.id

    def remote_address(self) -> Address | None:
        """Our public address, only when reachable and port-preserving (dht-rpc remoteAddress)."""
        return self.core.remote_address(self.server_socket.address[1] if self.server_socket is not None else None)

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
        return [n.address for n in self.core.nodes.values()]

    def add_node(self, addr: Address) -> None:
        """Seed the table with a known node (hyperdht `opts.nodes`)."""
        self.core.add_node(Node(node_id(addr), addr[0], addr[1]))

    def stats(self) -> dict[str, Any]:
        """The /stats "dht" block (docs/relay.md, Metrics)."""
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
        self._loop = self.driver.loop = self._later_driver.loop = asyncio.get_running_loop()
        # announce records carry wall-clock bumps (hyperdht's Date.now()): the offset, read once
        self.core.wall_offset = time.time() - self._loop.time()
        if self.server_socket is None:
            try:
                self.server_socket = await self._bind_socket(self.host, self.port)
            except OSError as e:
                raise DHTError(f"cannot bind UDP {self.host}:{self.port}: {e.strerror or e}", "BIND_FAILED") from e
        if self.client_socket is None:
            self.client_socket = await self._bind_socket(self.server_socket.address[0], 0)
        self.server_socket.on_datagram = lambda data, addr: self._on_datagram(SERVER, data, addr)
        self.client_socket.on_datagram = lambda data, addr: self._on_datagram(CLIENT, data, addr)
        self.core.start(self._now())
        self.driver.arm()

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
        if not self.bootstrapped and self.bootstrap_nodes and not self._warned_alone:
            self._warned_alone = True
            names = ", ".join(f"{h}:{p}" for h, p in self.bootstrap_nodes)
            log.warning("dht bootstrap: no DHT node answered (%s); retrying in the background", names)

    async def _rejoin(self) -> None:
        """No DHT node left (never reached one, or lost them all): resolve the bootstrap names
        again (DNS may have come up) and walk; the core backs off while nobody answers."""
        try:
            self._resolved_bootstrap = await self._resolve_bootstrap()
            await self._join_walk(check=True)
        finally:
            self.core.rejoining = False

    async def _join_walk(self, check: bool = False) -> None:
        """Walk towards our own id, probe reachability once a node answers (dht-rpc _bootstrap).

        The quick test is one PING_NAT to the first node that answers. dht-rpc only uses it if
        its reply beats the end of the walk, else the check waits ~20 min for the stable
        ticks (a loaded host lost that race and stayed firewalled); we wait for that one
        reply (at most its retries, ~4 s). `check` (a rejoin, where nobody waits) runs the
        full reachability check when the quick test got no reply."""
        core = self.core
        first = core.firewalled and core.detect_firewall and not core.force_persistent
        quick: asyncio.Future[bool] | None = None  # the quick test's outcome, once sent
        was_ready = core.ready

        def ondata(reply: Reply) -> None:
            nonlocal first, quick
            if not first:
                return
            first = False
            quick = asyncio.get_running_loop().create_future()

            def ok(_: Reply, quick: asyncio.Future[bool] = quick) -> None:
                if not quick.done():
                    quick.set_result(True)

            def failed(_: DHTError, quick: asyncio.Future[bool] = quick) -> None:
                if not quick.done():
                    quick.set_result(False)

            self._request_cb(
                reply.peer.address,
                Internal.PING_NAT,
                internal=True,
                value=self._port_value(),
                replied=ok,
                failed=failed,
            )

        answered = False
        try:
            q = await self._background_query(core.table.id, on_data=ondata)
            answered = q.successes > 0
            test_nat = quick is not None and await quick
            if (test_nat or core.force_persistent) and await self._update_network_state(
                only_firewall=not core.force_persistent
            ):
                # as dht-rpc: one more walk, now from the server socket (and with our id if persistent)
                await self._background_query(core.table.id)
            elif check and not test_nat and quick is not None and core.detect_firewall and core.firewalled:
                await self._update_network_state(only_firewall=not core.adaptive)
        finally:
            joined = core.joined
            core.join_walk_done(answered)
            self._flush()
        if core.joined and not joined:
            log.info(
                "dht %s: %d nodes, firewalled=%s, public=%s",
                "rejoined" if was_ready else "bootstrapped",
                len(core.table),
                core.firewalled,
                self.remote_address(),
            )

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
        self.core.destroy()
        self._later_driver.close()
        self.driver.close()
        self.driver.pump()
        for ep in self._owned:
            res = ep.close()
            if asyncio.iscoroutine(res):
                await res

    # ------------------------------------------------------------------ IO pump

    def _now(self) -> float:
        assert self._loop is not None
        return self.driver.now()

    def _on_datagram(self, socket: str, data: bytes, addr: Address) -> None:
        if self.destroyed:
            return
        if len(data) < 2 or data[0] not in (0x03, 0x13):
            extra = self._extra_sockets.get(socket)
            if extra is not None and extra[1] is not None and len(data) == 1:
                extra[1](data, addr)
            elif self.on_datagram is not None:
                self.on_datagram(socket, data, addr)
            else:  # neither UDX nor dht-rpc, and nobody here takes other datagrams
                self._count_dropped(socket, "garbage")
            return
        try:
            self.driver.feed(self.core.receive, data, addr, socket)
        except Exception:  # the loop must survive anything a peer sends
            self.internal_errors += 1
            log.exception("dropping datagram from %s after an internal error", addr)
            self.driver.pump()

    def after(self, delay: float, action: Callable[[], object]) -> None:
        """Run `action` `delay` seconds of loop time from now (a one-shot wait of the glue)."""
        self._later.add(self._now() + delay, action)
        self._later_driver.arm()

    def _count_dropped(self, socket: str, cause: str) -> None:
        """Count a datagram the node dropped on the socket it came in on (`/stats` `dropped`)."""
        try:
            count = getattr(self.socket_for(socket), "count_dropped", None)
        except KeyError:  # a puncher socket removed meanwhile
            return
        if callable(count):
            count(cause)

    def _transmit(self, now: float) -> None:
        for sock, data, addr in self.core.datagrams_to_send(now):
            try:
                self.socket_for(sock).send(data, addr)
            except (OSError, KeyError) as e:  # KeyError: a puncher socket removed meanwhile
                log.debug("send to %s failed: %r", addr, e)

    def _flush(self) -> None:
        """After the core was asked for something outside `feed`: send, dispatch, re-arm."""
        self.driver.pump()

    def _on_event(self, ev: CoreEvent) -> None:
        """Carry out what the core asked for (walks, checks, server calls, futures)."""
        if isinstance(ev, ReplyReceived):
            ctx = ev.reply.pending.context
            if ctx is not None:
                ctx.on_reply(ev.reply)
        elif isinstance(ev, RequestRetried):
            if ev.pending.context is not None:
                ev.pending.context.on_retrying()
        elif isinstance(ev, RequestGaveUp):
            if ev.pending.context is not None:
                ev.pending.context.on_failed(ev.error)
        elif isinstance(ev, PeerHandshakeReceived):
            server = self.servers.get(ev.incoming.request.target or b"")
            if server is not None:
                server.on_peer_handshake(ev.incoming, ev.handshake)
        elif isinstance(ev, PeerHolepunchReceived):
            server = self.servers.get(ev.incoming.request.target or b"")
            if server is not None:
                server.on_peer_holepunch(ev.incoming, ev.holepunch)
        elif isinstance(ev, RequestUnhandled):
            if self.on_request is None or not self.on_request(ev.incoming):
                self.core.reply_unknown(ev.incoming)
        elif isinstance(ev, WalkReplied):
            entry = self._walks.get(ev.walk)
            if entry is not None and entry[1] is not None:
                entry[1](ev.reply)
        elif isinstance(ev, WalkFinished):
            entry = self._walks.get(ev.walk)
            if entry is not None and not entry[0].done():
                entry[0].set_result(ev.walk.query)
        elif isinstance(ev, RefreshDue):
            self._spawn(self._background_query(ev.target))
        elif isinstance(ev, RejoinDue):
            self._spawn(self._rejoin())
        elif isinstance(ev, NetworkCheckDue):
            self._spawn(self._update_network_state(only_firewall=ev.only_firewall))
        elif isinstance(ev, InterfacesDue):
            self.core.network_interfaces(self.interfaces())
        elif isinstance(ev, ServersRefreshDue):
            if self.servers:
                log.info("%s: re-announcing", ev.reason)
            for server in list(self.servers.values()):
                server.refresh()

    # ------------------------------------------------------------------ requests

    def _send(self, to: Address, command: int, **options: Unpack[SendOptions]) -> PendingRequest:
        if self._loop is None:
            raise DHTError("node is not bound", "NOT_BOUND")
        return self.driver.feed(self.core.request, to, command, **options)

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
            return self._send(to, command, context=Callback(replied, failed), **options)
        except DHTError as e:
            if failed:
                failed(e)
            return None

    async def request(self, to: Address, command: int, **options: Unpack[RequestOptions]) -> Reply:
        """Send one request and wait for its reply (raises DHTError on timeout). Options
        (`internal`, `target`, `value`, `token`, `socket`, `retries`, `timeout`) as `RPC.request`."""
        await self.bind()
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        p = self._send(to, command, context=Call(fut), **options)
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
        fut: asyncio.Future[Query] = asyncio.get_running_loop().create_future()
        walk = self.core.start_walk(
            q,
            command,
            self._now(),
            internal=internal,
            value=value,
            retries=retries,
            background=background,
            full_concurrency=self.concurrency,
        )
        self._walks[walk] = (fut, on_data)
        self._flush()
        try:
            return await fut
        finally:
            self._walks.pop(walk, None)
            self.core.cancel_walk(walk)

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
        self.core.down_hint(to, down)
        self._flush()

    def _port_value(self) -> bytes:
        return self.core.port_value(self.local_address()[1])

    # ------------------------------------------------------------------ reachability

    async def _update_network_state(self, only_firewall: bool = True) -> bool:
        """The reachability check (dht-rpc `_updateNetworkState`). If enough nodes reach our
        server port from a host they also see, requests move to the server socket; unless
        `only_firewall`, the node also becomes persistent: id = H(public ip:port), table
        rebuilt around it, storage on."""
        core = self.core
        if not core.rpc.ephemeral:
            return False
        if only_firewall and not core.firewalled:
            return False
        host, port = core.nat.host, core.nat.port
        if not only_firewall:
            core.stable_ticks = MORE_STABLE_TICKS
            core.last_host = host
        if host is None or port == 0:
            return False
        sampler: NatSampler | OwnAddress = core.nat
        witnesses: dict[str, Address] = {}
        if core.firewalled:
            sampler = NatSampler()
            firewalled, witnesses = await self._check_if_firewalled(sampler)
            if firewalled:
                return False
        if not core.network_state(host, port, sampler, witnesses):
            return False
        if not only_firewall:
            assert sampler.host is not None  # network_state checked it
            self._become_persistent(node_id((sampler.host, sampler.port)))
        return True

    async def _check_if_firewalled(self, sampler: NatSampler) -> tuple[bool, dict[str, Address]]:
        nodes = self.core.probe_nodes()
        if len(nodes) < 5:
            nodes += await self._resolve_bootstrap()
        if not nodes:
            return True, {}
        self.core.probe = set()
        try:
            results = await asyncio.gather(
                *(self.request(a, Internal.PING_NAT, internal=True, value=self._port_value()) for a in nodes),
                return_exceptions=True,
            )
            replies = [r for r in results if isinstance(r, Reply)]
            return self.core.firewall_verdict(len(nodes), replies, self.local_address()[1], sampler)
        finally:
            self.core.probe = None

    def _become_persistent(self, id_: bytes) -> None:
        self.core.become_persistent(id_)
        self._flush()

    @staticmethod
    def interfaces() -> frozenset[str]:
        """This host's IPv4 addresses (udx watchNetworkInterfaces, read when the 5 s tick asks)."""
        try:
            return frozenset(
                a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socketlib.AF_INET
            )
        except OSError:
            return frozenset()

    def register_server(self, target: bytes, server: Any) -> None:
        """A HyperDHTServer listening here: handshakes for `target` go to it."""
        self.servers[target] = server
        self.core.register_target(target, server.public_key)

    def unregister_server(self, target: bytes) -> None:
        self.servers.pop(target, None)
        self.core.unregister_target(target)

    # ------------------------------------------------------------------ answering (for servers)

    def apply_route(
        self, inc: IncomingRequest, route: Route, socket: str | None = None, *, for_others: bool = True
    ) -> None:
        """Carry out a router decision: a same-tid relay request, or a response."""
        self.core.apply_route(inc, route, socket, for_others=for_others)
        self._flush()

    def reply(self, inc: IncomingRequest, value: bytes | None = None, **kw: Any) -> None:
        """Answer an incoming request now (for handlers that answer later, e.g. handshakes)."""
        self.rpc.reply(inc, value, **kw)
        self._flush()

    def relay(self, inc: IncomingRequest, value: bytes, to: Address, socket: str | None = None) -> None:
        self.rpc.relay(inc, value, to, socket)
        self._flush()


__all__ = ["Candidate", "DHTNode", "DatagramSocket", "filter_node", "parse_node"]
