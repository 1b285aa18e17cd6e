"""HyperDHT server: listen on a key pair, answer handshakes, open the UDX stream.

The asyncio side of `hyperdht/lib/server.js`: registers the key's target with the node's
router, announces it (`Announcer`), answers PEER_HANDSHAKE through the sans-IO
`HandshakeResponder`, creates the raw UDX stream advertised in the reply and connects it
when the client's first UDX packet arrives (or at once when the client is reachable or
the handshake came direct), then hands a `Connection` with a running secret stream to
`on_connection`. PEER_HOLEPUNCH rounds are decrypted but not answered, as by a Node server
with `holepunch: false`: a relay must be publicly reachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable
from typing import Any

import psutil

from .announcer import Announcer, SigningKeyPair
from .connection import KEEP_ALIVE, Connection, responder_secret_stream, start_secret_stream
from .handshake import Attempt, HandshakeResponder
from .messages import (
    Address,
    DHTError,
    Firewall,
    Handshake,
    Holepunch,
    NoisePayload,
    PayloadError,
    hash32,
)
from .node import DHTNode
from .router import server_handshake_reply
from .rpc import SERVER, IncomingRequest

log = logging.getLogger("relay.dht")

ConnectionHandler = Callable[[Connection], Any]
FirewallHook = Callable[[bytes, NoisePayload, Address], bool]


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


class HyperDHTServer:
    """Accepts hyperdht connections for one key pair on a `DHTNode` built with a `UDX`."""

    def __init__(
        self,
        node: DHTNode,
        key_pair: SigningKeyPair,
        on_connection: ConnectionHandler,
        *,
        firewall: FirewallHook | None = None,
        keep_alive: float = KEEP_ALIVE,
        share_local_address: bool = True,
        announce: bool = True,
    ) -> None:
        self.node = node
        self.key_pair = key_pair
        self.target = hash32(key_pair.public_key)
        self.on_connection = on_connection
        self.keep_alive = keep_alive
        self.share_local_address = share_local_address
        self.responder = HandshakeResponder(key_pair, firewall=firewall)
        self.announcer = Announcer(node, key_pair, self.target) if announce else None
        self.listening = False
        self.closed = False
        self.connections: set[Connection] = set()
        self.stats = {"handshakes": 0, "connections": 0, "holepunches": 0, "timeouts": 0}
        self._streams: dict[bytes, Any] = {}  # attempt key -> UDX stream
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

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
        self.node.register_server(self.target, self)
        self.listening = True
        if self.announcer is not None:
            await self.announcer.start()

    def refresh(self) -> None:
        if self.announcer is not None:
            self.announcer.refresh()

    async def close(self) -> None:
        """Unannounce, stop answering, destroy pending streams and open connections."""
        if self.closed:
            return
        self.closed = True
        self.node.unregister_server(self.target)
        if self._timer:
            self._timer.cancel()
        for t in list(self._tasks):
            t.cancel()
        if self.announcer is not None and self.listening:
            with contextlib.suppress(Exception):
                await self.announcer.stop()
        for s in list(self._streams.values()):
            s.destroy()
        self._streams.clear()
        for c in list(self.connections):
            c.destroy()

    # ------------------------------------------------------------------ handshakes

    def on_peer_handshake(self, inc: IncomingRequest, hs: Handshake) -> None:
        """Called by the node's router for PEER_HANDSHAKE to our target."""
        if self.closed or not hs.noise:
            return
        now = self.node._now()
        a = self.responder.lookup(hs.noise)
        if a is None:
            a = self.responder.accept(hs.noise, hs.peer_address, inc.peer.address, inc.request.to, now)
            if a is None:
                return
            self.stats["handshakes"] += 1
            self._reply_first(a, inc)
        if a.reply is None:
            return
        route = server_handshake_reply(hs, a.reply, inc.peer.address)
        if route is not None:
            self.node.apply_route(inc, route, for_others=False)
        self._arm_timer()

    def _reply_first(self, a: Attempt, inc: IncomingRequest) -> None:
        stream = None
        if a.error == PayloadError.NONE:
            stream = self.node.udx.create_stream(firewall=lambda s, sock, addr: self._on_first_packet(a, s, sock, addr))
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
        )
        if stream is None:
            return
        payload = a.remote_payload
        if payload.firewall == Firewall.OPEN or a.direct:
            # The client is reachable (or talked to us directly): connect now, as hyperdht does.
            sock = self.node.socket_for(inc.socket if a.direct else self.node.rpc.socket)
            self._connect(a, stream, sock, a.client_address)

    def _on_first_packet(self, a: Attempt, stream: Any, sock: Any, addr: Address) -> bool:
        """UDX firewall hook: the first packet for our stream id teaches the client's address."""
        if a.connected:
            return False
        self._connect(a, stream, sock, addr)
        return False

    def _connect(self, a: Attempt, stream: Any, sock: Any, addr: Address) -> None:
        if a.connected or self.closed or a.result is None or a.remote_payload.udx is None:
            return
        a.connected = True
        self.responder.finish(a, self.node._now())
        self._streams.pop(a.key, None)
        stream.connect(sock, a.remote_payload.udx.id, addr)
        proto = responder_secret_stream(a.result, keep_alive=self.keep_alive)
        conn = Connection(
            remote_public_key=a.remote_public_key,
            handshake=a.result,
            stream=stream,
            secret_stream=proto,
            remote_payload=a.remote_payload,
            client_address=addr,
            relayed=not a.direct,
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

        stream.on_close = on_close
        if inspect.isawaitable(res):
            t = asyncio.ensure_future(res)
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ holepunch

    def on_peer_holepunch(self, inc: IncomingRequest, hp: Holepunch) -> None:
        """We do not punch: a relay has to be reachable. Rounds for a live attempt are
        decrypted and counted, then left unanswered, exactly what a Node server created with
        `holepunch: false` does (`server.js` `_onpeerholepunch` → `_abort` without a payload →
        no reply); the client's other paths (OPEN address, same-host shortcut) are unaffected."""
        if self.closed or hp.peer_address is None:
            return
        if self.responder.holepunch(hp.id, hp.payload) is not None:
            self.stats["holepunches"] += 1

    # ------------------------------------------------------------------ timers

    def _arm_timer(self) -> None:
        loop = asyncio.get_running_loop()
        at = self.responder.get_timer()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if at is not None and not self.closed:
            self._timer = loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        timed_out, _ = self.responder.expired(self.node._now())
        for a in timed_out:
            s = self._streams.pop(a.key, None)
            if s is not None and not a.connected:
                self.stats["timeouts"] += 1
                s.destroy()
        self._arm_timer()


__all__ = ["SERVER", "HyperDHTServer", "local_addresses"]
