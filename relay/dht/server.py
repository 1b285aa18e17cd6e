"""HyperDHT server: listen on a key pair, answer handshakes, open the UDX stream.

The asyncio side of `hyperdht/lib/server.js`: registers the key's target with the node's
router, announces it (`Announcer`), answers PEER_HANDSHAKE through the sans-IO
`HandshakeResponder` (new ones wait in a `HandshakeBacklog` and are answered in short
slices between socket reads: Noise in Python is ~1 ms, and done inline a flood let the
kernel's receive queue grow into a seconds-long FIFO in front of every peer), creates
the raw UDX stream advertised in the reply and connects it
when the client's first UDX packet arrives (or at once when the client is reachable or
the handshake came direct), then hands a `Connection` with a running secret stream to
`on_connection`. When we cannot claim OPEN, a per-attempt puncher socket answers the
client's PEER_HOLEPUNCH rounds and echoes its probes (consistent NATs only).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

import psutil

from relay.core import Driver
from relay.keys import KeyPair
from relay.udx import UDXSocket

from .announcer import Announcer
from .backlog import HandshakeBacklog
from .client import connect
from .connection import KEEP_ALIVE, Connection, responder_secret_stream, start_secret_stream
from .handshake import (
    PASSIVE_CONNECT_TIMEOUT,
    Attempt,
    AttemptTimedOut,
    HandshakeResponder,
    address_token,
    seal_payload,
)
from .holepunch import HOLEPUNCH, PROBE_INTERVAL, NatAnalyzer, PunchState
from .messages import (
    Address,
    DHTError,
    Firewall,
    Handshake,
    Holepunch,
    HolepunchPayload,
    Mode,
    NoisePayload,
    PayloadError,
    hash32,
)
from .node import DHTNode, spawn
from .puncher import sample_nat
from .relaying import RELAY_TIMEOUT, RelayPairing, pair_through_relay
from .router import Relay, Respond, server_handshake_reply
from .rpc import SERVER, IncomingRequest

log = logging.getLogger("relay.dht")

MAX_PUNCHERS = 64
# New handshakes are answered from the backlog in slices of this many seconds of loop time,
# with the socket read in between (a Noise round costs ~0.5-1 ms in Python)
DRAIN_SLICE = 0.005
TIMER_GRANULARITY = 0.25  # handshake deadlines are 10 s; a quarter second late is fine

ConnectionHandler = Callable[[Connection], Any]
FirewallHook = Callable[[bytes, NoisePayload, Address], bool]
# `admit(client_address)`: None refuses the handshake, else the seconds it must wait (0.0: none)
AdmitHook = Callable[[Address], float | None]


class _Queued:
    """A new handshake waiting in the backlog, with every copy of it that reached us (one per
    announce holder that relayed it): each copy gets the reply on its own route."""

    __slots__ = ("copies",)

    def __init__(self, inc: IncomingRequest, hs: Handshake) -> None:
        self.copies = [(inc, hs)]  # each copy's mode and relay address decide its reply's route


def local_addresses(bound: Address) -> list[Address]:
    """What hyperdht lists after the public address: the bound IP, or every non-internal
    IPv4 interface with the server port (`holepuncher.js` localAddresses)."""
    host, port = bound
    if host not in ("0.0.0.0", ""):
        return [(host, port)]
    out: list[Address] = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name == "AF_INET" and not a.address.startswith("127."):
                out.append((a.address, port))
    return out or [("127.0.0.1", port)]


class _Puncher:
    """One attempt's holepunch socket (registered with the node under `name`)."""

    def __init__(self, name: str, socket: Any, state: PunchState) -> None:
        self.name = name
        self.socket = socket
        self.state = state
        self.local_secret = os.urandom(32)
        self.pinged: set[Address] = set()
        self.closed = False
        self._analyzed = asyncio.Event()

    def probe(self, addr: Address) -> None:
        if not self.closed:
            self.socket.send(HOLEPUNCH, addr)

    def wake(self) -> None:
        self._analyzed.set()

    async def analyzed(self, timeout: float) -> None:
        if self.state.nat.done:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._analyzed.wait(), timeout)


class HyperDHTServer:
    """Accepts hyperdht connections for one key pair on a `DHTNode` built with a `UDX`."""

    def __init__(
        self,
        node: DHTNode,
        key_pair: KeyPair,
        on_connection: ConnectionHandler,
        *,
        firewall: FirewallHook | None = None,
        admit: AdmitHook | None = None,
        keep_alive: float = KEEP_ALIVE,
        share_local_address: bool = True,
        announce: bool = True,
        holepunch: bool = True,
        relay_through: bytes | None = None,
        max_reorder_bytes: int | None = None,
    ) -> None:
        self.node = node
        # bound on out-of-order bytes each accepted stream may hold (None: the UDX default, its window);
        # a blind relay's sessions carry tiny control messages, so it passes a small one
        self.max_reorder_bytes = max_reorder_bytes
        self.relay_through = relay_through  # a blind relay's key: offer it to every client (hyperdht relayThrough)
        self.key_pair = key_pair
        self.target = hash32(key_pair.public_key)
        self.on_connection = on_connection
        self.keep_alive = keep_alive
        self.share_local_address = share_local_address
        self.holepunch = holepunch  # punch (consistent NATs) when we cannot claim OPEN
        self.responder = HandshakeResponder(key_pair, firewall=firewall)
        # the cheap check, before any crypto: refuse, or say how long the handshake must wait
        self.admit = admit
        self.backlog: HandshakeBacklog[_Queued] = HandshakeBacklog()
        self._drain_handle: asyncio.Handle | None = None
        #: the backlog's one timer: when a held handshake is due, the drain runs
        self._release: Driver[None] = Driver(self.backlog, transmit=self._released)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.announcer = Announcer(node, key_pair, self.target) if announce else None
        self.listening = False
        self.accepting = True  # False once `unannounce` began: new handshakes go unanswered
        self.closed = False
        self.connections: set[Connection] = set()
        self.stats = {"handshakes": 0, "connections": 0, "holepunches": 0, "timeouts": 0}
        self._streams: dict[bytes, Any] = {}  # attempt key -> UDX stream
        #: the attempts' deadlines, batched: one scan every TIMER_GRANULARITY at most
        self._deadlines: Driver[AttemptTimedOut] = Driver(
            self.responder, on_event=self._on_attempt_timed_out, granularity=TIMER_GRANULARITY
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self._punchers = 0

    @property
    def public_key(self) -> bytes:
        return self.key_pair.public_key

    @property
    def relay_addresses(self) -> list[Address]:
        return self.announcer.relay_addresses if self.announcer else []

    async def listen(self) -> None:
        """Register with the router, then announce and wait for the first round."""
        if self.listening:
            raise DHTError("server is already listening", "ALREADY_LISTENING")
        if self.target in self.node.servers:
            raise DHTError("this key pair is already listening on this node", "KEYPAIR_ALREADY_USED")
        if self.node.udx is None:
            raise DHTError("the node needs a relay.udx.UDX to open streams", "NO_UDX")
        await self.node.bind()
        self._loop = self._release.loop = self._deadlines.loop = asyncio.get_running_loop()
        self.node.register_server(self.target, self)
        self.listening = True
        if self.announcer is not None:
            await self.announcer.start()

    def refresh(self) -> None:
        if self.announcer is not None:
            self.announcer.refresh()

    async def unannounce(self) -> None:
        """Stop answering new handshakes and withdraw the announcement; the connections made
        stay until `close` (a relay that is going away ends them itself, and a peer that
        reconnects at once must not be served by it on its way out)."""
        self.accepting = False
        if self.announcer is not None and self.listening and not self.announcer.stopped:
            with contextlib.suppress(Exception):
                await self.announcer.stop()

    async def close(self) -> None:
        """Unannounce, stop answering, destroy pending streams and open connections."""
        if self.closed:
            return
        self.closed = True
        self.node.unregister_server(self.target)
        self._deadlines.close()
        if self._drain_handle is not None:
            self._drain_handle.cancel()
        self._release.close()
        self.backlog.clear()
        for t in list(self._tasks):
            t.cancel()
        if self.announcer is not None and self.listening and not self.announcer.stopped:
            with contextlib.suppress(Exception):
                await self.announcer.stop()
        for a in list(self.responder.attempts.values()):
            self._destroy_puncher(a)
        for s in list(self._streams.values()):
            s.destroy()
        self._streams.clear()
        for c in list(self.connections):
            c.destroy()

    # ------------------------------------------------------------------ handshakes

    def on_peer_handshake(self, inc: IncomingRequest, hs: Handshake) -> None:
        """Called by the node's router for PEER_HANDSHAKE to our target.

        A copy of a handshake we answered gets the same reply at once (cheap). A new one is
        checked by `admit` (no crypto yet) and queued in the backlog; `_drain` answers it in
        a slice between socket reads, so the loop keeps reading whatever the flood."""
        if self.closed or not self.accepting or not hs.noise:
            return
        a = self.responder.lookup(hs.noise)
        if a is not None:
            self._route_reply(a, inc, hs)
            return
        queued = self.backlog.get(hs.noise)
        if queued is not None:
            self.backlog.stats["duplicates"] += 1
            if len(queued.copies) < 4:
                queued.copies.append((inc, hs))
            return
        client = hs.peer_address or inc.peer.address
        wait = 0.0 if self.admit is None else self.admit(client)
        if wait is None:
            self.responder.stats["rejected"] += 1
            return
        if not self.backlog.push(hs.noise, client[0], _Queued(inc, hs), self.node._now(), wait):
            return
        if wait > 0.0:
            self._release.arm()
        else:
            self._schedule_drain()

    def _schedule_drain(self) -> None:
        if self._drain_handle is None and not self.closed and self._loop is not None:
            self._drain_handle = self._loop.call_soon(self._drain)

    def _released(self, now: float) -> None:
        """The backlog's timer ran: what it released is answered by the drain."""
        self._schedule_drain()

    def _drain(self) -> None:
        """Answer queued handshakes for up to DRAIN_SLICE of loop time, then yield to the
        loop (its next turn reads the sockets) and come back if any are left."""
        self._drain_handle = None
        if self.closed:
            return
        start = self.node._now()
        while (q := self.backlog.pop(self.node._now())) is not None:
            try:
                self._handshake(q)
            except Exception:  # one bad handshake must not stall the backlog
                self.node.internal_errors += 1  # a bug, as at the datagram boundary (tests assert 0)
                log.exception("answering a handshake failed")
            if self.node._now() - start >= DRAIN_SLICE:
                break
        if self.backlog.ready(self.node._now()):
            self._schedule_drain()
        else:
            self._release.arm()

    def _handshake(self, q: _Queued) -> None:
        """The expensive part: Noise, the UDX stream, the reply to every copy."""
        inc, hs = q.copies[0]
        assert hs.noise is not None
        a = self.responder.lookup(hs.noise)
        if a is None:
            a = self.responder.accept(hs.noise, hs.peer_address, inc.peer.address, inc.request.to, self.node._now())
            if a is None:
                return
            self.stats["handshakes"] += 1
            self._reply_first(a, inc)
        for copy, copy_hs in q.copies:
            self._route_reply(a, copy, copy_hs)

    def _route_reply(self, a: Attempt, inc: IncomingRequest, hs: Handshake) -> None:
        if a.reply is None:
            return
        route = server_handshake_reply(hs, a.reply, inc.peer.address)
        if route is not None:
            # relayed replies leave from the puncher's socket: the client learns its mapping
            punch = a.extra.get("punch")
            sock = punch.name if punch is not None and not isinstance(route, Respond) else None
            self.node.apply_route(inc, route, sock, for_others=False)
        self._deadlines.arm()

    def _reply_first(self, a: Attempt, inc: IncomingRequest) -> None:
        stream = None
        if a.error == PayloadError.NONE:
            stream = self.node.udx.create_stream(
                firewall=lambda s, sock, addr: self._on_first_packet(a, s, sock, addr),
                max_reorder_bytes=self.max_reorder_bytes,
            )
            self._streams[a.key] = stream
        bound = self.node.local_address()
        self.responder.reply(
            a,
            self.node._now(),
            stream_id=stream.id if stream is not None else 0,
            remote_address=self.node.remote_address(),
            local_addresses=local_addresses(bound) if self.share_local_address else [],
            relay_addresses=self.relay_addresses,
            relays=self.announcer.relays if self.announcer else [],
            relay_through=self.relay_through,
        )
        if stream is None:
            return
        payload = a.remote_payload
        if payload.firewall == Firewall.OPEN or a.direct:
            # The client is reachable (or talked to us directly): connect now, as hyperdht does.
            sock = self.node.socket_for(inc.socket if a.direct else self.node.rpc.socket)
            self._connect(a, stream, sock, a.client_address)
            return
        if self.relay_through is not None or payload.relay_through is not None:
            a.deadline = self.node._now() + RELAY_TIMEOUT
            self._spawn(self._relay_connection(a, stream))
        if self.node.remote_address() is None and self.holepunch:
            self._setup_puncher(a)

    async def _relay_connection(self, a: Attempt, stream: Any) -> None:
        """hyperdht `server.js` `_relayConnection`: pair the attempt's raw stream through the
        relay we offered (initiator) or the one the client asked for (not initiator)."""
        rt = a.remote_payload.relay_through
        if self.relay_through is not None and a.relay_token is not None:
            initiator, key, token = True, self.relay_through, a.relay_token
        elif rt is not None:
            initiator, key, token = False, rt.public_key, rt.token
        else:
            return
        self.stats["relay_attempts"] = self.stats.get("relay_attempts", 0) + 1
        try:
            pairing = await pair_through_relay(
                self.node, key, token, initiator, stream.id, connect=connect, key_pair=self.key_pair
            )
        except DHTError as e:
            self.stats["relay_aborts"] = self.stats.get("relay_aborts", 0) + 1
            log.info("relaying a connection failed: %s", e)
            return
        if a.connected or self.closed or stream.closed:
            pairing.close()  # a direct path won (or we are gone)
            return
        self.stats["relay_successes"] = self.stats.get("relay_successes", 0) + 1
        self._connect(a, stream, pairing.socket, pairing.relay_address, pairing=pairing)

    def _on_first_packet(self, a: Attempt, stream: Any, sock: Any, addr: Address) -> bool:
        """UDX firewall hook: the first packet for our stream id teaches the client's address."""
        if a.connected:
            return False
        self._connect(a, stream, sock, addr)
        return False

    def _connect(
        self, a: Attempt, stream: Any, sock: Any, addr: Address, *, pairing: RelayPairing | None = None
    ) -> None:
        if a.connected or self.closed or a.result is None or a.remote_payload.udx is None:
            return
        a.connected = True
        self.responder.finish(a, self.node._now())
        self._streams.pop(a.key, None)
        stream.connect(sock, a.remote_payload.udx.id if pairing is None else pairing.remote_id, addr)
        proto = responder_secret_stream(a.result, keep_alive=self.keep_alive)
        conn = Connection(
            remote_public_key=a.remote_public_key,
            handshake=a.result,
            stream=stream,
            secret_stream=proto,
            remote_payload=a.remote_payload,
            client_address=addr,
            relayed=not a.direct,
            extra={"relay_through": pairing.relay_key} if pairing is not None else {},
        )
        self.connections.add(conn)
        self.stats["connections"] += 1
        # The handler runs before the stream starts, so whatever it sets (on_event) sees
        # every event, Opened included; a coroutine handler runs as a task right after.
        res = None
        try:
            res = self.on_connection(conn)
        except Exception:
            log.exception("on_connection handler failed")
        if proto.stream.closed:  # refused by the handler (allow-list, caps): reset the peer
            self.connections.discard(conn)
            stream.destroy()
            return
        start_secret_stream(stream, proto)
        prev_close = stream.on_close

        def on_close(err: Any) -> None:
            self.connections.discard(conn)
            if prev_close is not None:
                prev_close(err)
            if pairing is not None:
                pairing.close()

        stream.on_close = on_close
        if pairing is not None:
            pairing.on_lost = lambda: None if stream.closed else stream.destroy()
        punch: _Puncher | None = a.extra.get("punch")
        if punch is not None:
            punch.state.connected = True
            if sock is punch.socket:
                a.extra["punch_socket_in_use"] = True

                def close_punch_socket(err: Any, prev: Any = stream.on_close) -> None:
                    if prev is not None:
                        prev(err)
                    self.node.remove_socket(punch.name)
                    punch.socket.close()

                stream.on_close = close_punch_socket
            self._destroy_puncher(a)
        if inspect.isawaitable(res):
            t = asyncio.ensure_future(res)
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ holepunch

    def on_peer_holepunch(self, inc: IncomingRequest, hp: Holepunch) -> None:
        """A client's holepunch round, relayed to us by one of the DHT nodes."""
        if self.closed or hp.peer_address is None:
            return
        found = self.responder.holepunch(hp.id, hp.payload)
        if found is None:
            return
        a, msg = found
        punch: _Puncher | None = a.extra.get("punch")
        if punch is None or a.holepunch_secret is None:
            return  # OPEN or not punching: silence, as a Node server without a puncher
        self.stats["holepunches"] += 1
        self._spawn(self._holepunch_round(inc, hp.peer_address, a, punch, msg))

    async def _holepunch_round(
        self, inc: IncomingRequest, peer: Address, a: Attempt, p: _Puncher, msg: HolepunchPayload
    ) -> None:
        """hyperdht `server.js` `_onpeerholepunch`, consistent NATs only."""
        secret = a.holepunch_secret
        assert secret is not None
        if msg.error != PayloadError.NONE:
            a.round = max(a.round, msg.round)
            self._send_holepunch(inc, peer, p, secret, self._abort_payload(a))
            self._destroy_puncher(a)
            return
        token = address_token(p.local_secret, peer[0])
        via_announce_node = self.announcer is not None and self.announcer.is_relay(inc.peer.address)
        echoed = via_announce_node and msg.remote_token == token
        if inc.socket == p.name:
            p.state.nat.add(inc.request.to, inc.peer.address)
        if msg.round >= a.round:
            a.round = msg.round
            p.state.update_remote(msg.punching, msg.firewall, msg.addresses, peer[0] if echoed else None)
        await p.analyzed(5.0)
        if p.closed or self.closed:
            return
        st = p.state
        if not st.stable():
            self._send_holepunch(inc, peer, p, secret, self._abort_payload(a))
            self._destroy_puncher(a)
            return
        nat = st.nat
        if nat.firewall == Firewall.CONSISTENT and msg.remote_address and msg.remote_address in (nat.addresses or []):
            p.probe(peer)  # fast mode: the client already opened a session towards us
        if st.remote_holepunching:
            if not st.can_punch():
                self._send_holepunch(inc, peer, p, secret, self._abort_payload(a))
                self._destroy_puncher(a)
                return
            if not st.punching:
                st.punching = True
                a.deadline = self.node._now() + PASSIVE_CONNECT_TIMEOUT
                self._spawn(self._consistent_probe(a, p))
        if nat.firewall != Firewall.UNKNOWN:
            nat.freeze()
        reply = HolepunchPayload(
            error=PayloadError.NONE,
            firewall=nat.firewall,
            round=a.round,
            connected=st.connected,
            punching=st.punching,
            addresses=nat.addresses,
            token=token if via_announce_node else None,
            remote_token=msg.token,
        )
        self._send_holepunch(inc, peer, p, secret, reply)

    def _send_holepunch(
        self, inc: IncomingRequest, peer: Address, p: _Puncher, secret: bytes, payload: HolepunchPayload
    ) -> None:
        value = Holepunch(Mode.FROM_SERVER, 0, seal_payload(secret, payload), peer).encode()
        self.node.apply_route(inc, Relay(value, inc.peer.address), p.name if not p.closed else None, for_others=False)

    @staticmethod
    def _abort_payload(a: Attempt) -> HolepunchPayload:
        return HolepunchPayload(error=PayloadError.ABORTED, firewall=Firewall.UNKNOWN, round=a.round)

    async def _consistent_probe(self, a: Attempt, p: _Puncher) -> None:
        await asyncio.sleep(PROBE_INTERVAL)  # the server side lets the client go first
        while p.state.more_tries() and not p.closed and not a.connected:
            for addr in p.state.probe_targets():
                p.probe(addr)
            await asyncio.sleep(PROBE_INTERVAL)
        if not a.connected:
            self._destroy_puncher(a)

    def _setup_puncher(self, a: Attempt) -> None:
        """A fresh socket whose NAT mapping the client will punch to (hyperdht Holepuncher)."""
        if self._punchers >= MAX_PUNCHERS:
            return  # each puncher is a socket: bounded, whatever the handshake rate
        host = self.node.local_address()[0]
        try:
            # UDXSocket binds synchronously; udx.create_socket is only async by signature
            sock = UDXSocket(self.node.udx, host, 0)
        except OSError as e:
            log.warning("cannot open a holepunch socket: %s", e)
            return
        self.node.udx.sockets.append(sock)
        self._punchers += 1
        p = _Puncher(f"punch:{a.slot}:{id(a)}", sock, PunchState(NatAnalyzer(firewalled=True)))
        a.extra["punch"] = p
        self.node.add_socket(p.name, sock, on_probe=lambda data, addr: self._on_probe(a, p, addr))
        self._spawn(self._sample_nat(p))

    async def _sample_nat(self, p: _Puncher) -> None:
        await sample_nat(self.node, p.name, p.state, p.pinged, lambda: p.closed)
        p.wake()

    def _on_probe(self, a: Attempt, p: _Puncher, addr: Address) -> None:
        """A client's 1-byte probe reached our puncher: echo it (the client connects on it)."""
        if not p.closed and not a.connected:
            p.probe(addr)

    def _destroy_puncher(self, a: Attempt) -> None:
        p: _Puncher | None = a.extra.get("punch")
        if p is None or p.closed:
            return
        p.closed = True
        self._punchers -= 1
        p.wake()
        p.state.punching = False
        if a.connected and a.extra.get("punch_socket_in_use"):
            return  # the stream lives on this socket now; it is closed with the stream
        self.node.remove_socket(p.name)
        p.socket.close()

    def _spawn(self, coro: Any) -> None:
        spawn(self._tasks, coro, "holepunch task", logging.WARNING)

    # ------------------------------------------------------------------ timers

    def _on_attempt_timed_out(self, ev: AttemptTimedOut) -> None:
        """An attempt's deadline passed: its unconnected stream and its puncher go."""
        a = ev.attempt
        s = self._streams.pop(a.key, None)
        if s is not None and not a.connected:
            self.stats["timeouts"] += 1
            s.destroy()
        if not a.connected:
            self._destroy_puncher(a)


__all__ = ["SERVER", "HyperDHTServer", "local_addresses"]
