"""HyperDHT client: reach a server by its public key, directly or through a blind relay.

The asyncio side of `hyperdht/lib/connect.js`, on a `DHTNode` built with a `relay.udx.UDX`:

1. FIND_PEER walk towards `hash(public_key)`; every node that answers with the server's
   record holds its announce and can forward a handshake to it;
2. PEER_HANDSHAKE as Noise IK initiator through such a node (message 1 carries our UDX
   stream id, firewall and, with `relay_through`, the relay key and a fresh token); a copy
   of the Noise state is used per attempt, so a hostile node's garbage reply costs one
   attempt, never the connection;
3. the path: the server is OPEN or answered directly -> connect the raw stream to it; one
   side asked for a relay (`relay_through` here, or the server's `relayThrough` in message
   2) -> connect to the relay (this same function, recursively), send blind-relay `pair`
   with the token and our raw stream id, and when the relay answers with its stream id,
   connect the raw stream to the relay's address: the relay joins it to the peer's;
4. the secret stream starts on the raw stream with the Noise result (no second handshake).

When the server is firewalled and answered through a DHT node, we hole-punch as hyperdht's
client does, for consistent NATs on both sides (`relay.dht.holepunch` decides): a fresh
puncher socket samples its NAT mapping from PINGs to DHT nodes, two PEER_HOLEPUNCH rounds
through the node that relays for the server swap NAT types, addresses and tokens (sealed
with the holepunch secret), then both sides send 1-byte probes; the first probe that
reaches our puncher connects the raw stream on that socket. Random NATs (birthday sockets)
are not punched: that case fails with `CANNOT_HOLEPUNCH` unless a relay carries it.

`punch=False` is the blocked cluster network: we claim no reachable address (firewall
UNKNOWN, no local addresses), never punch, never connect the raw stream anywhere but the
relay, and drop UDX packets that try to reach it another way.

Every failure is a `DHTError` with a code (`PEER_NOT_FOUND`, `PEER_CONNECTION_FAILED`,
`SERVER_ERROR`, `SERVER_INCOMPATIBLE`, `HANDSHAKE_INVALID`, `CANNOT_HOLEPUNCH`,
`RELAY_ABORTED`, `CONNECT_TIMEOUT`) and a sentence an operator can read; bad answers from
peers never escape as anything else.

    conn = await connect(node, server_key, relay_through=relay_key, punch=False, timeout=20)
    conn.relayed, conn.remote_address, conn.secret_stream.send(b"hi"), await conn.secret_stream.recv()
    conn.extra["trace"].stages   # {"found": s, "handshake": s, "relay_connected": s, "paired": s, "opened": s}
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ipaddress
import logging
import os
from typing import Any

from relay.keys import KeyPair, encode_id, key_pair
from relay.noise import NoiseError, NoiseHandshake
from relay.secretstream import HandshakeResult, SecretStream
from relay.secretstream_aio import SecretStreamProtocol

from .calls import ConnectTrace
from .connection import KEEP_ALIVE, Connection, start_secret_stream
from .handshake import address_token, open_payload, seal_payload
from .holepunch import PROBE_INTERVAL
from .messages import (
    NS_PEER_HANDSHAKE,
    NS_PEER_HOLEPUNCH,
    Address,
    Command,
    DHTError,
    Firewall,
    Handshake,
    Holepunch,
    HolepunchPayload,
    Mode,
    NoisePayload,
    PayloadError,
    PeerRecord,
    RelayInfo,
    RelayThroughInfo,
    UDXInfo,
    hash32,
)
from .node import DHTNode
from .puncher import ClientPuncher
from .relaying import RelayPairing, pair_through_relay

log = logging.getLogger("relay.dht.client")

CONNECT_TIMEOUT = 20.0
PASSIVE_CONNECT_TIMEOUT = 10.0  # hyperdht: passiveConnectTimeout when we claimed OPEN
PARALLEL_HANDSHAKES = 2  # hyperdht: a semaphore of 2 connect attempts through announce holders

__all__ = [
    "CONNECT_TIMEOUT",
    "ConnectTrace",
    "RelayPairing",
    "choose_path",
    "connect",
    "pair_through_relay",
    "public_address",
]


def public_address(addresses: list[Address]) -> Address | None:
    """hyperdht's getFirstRemoteAddress: the first address that is not a bogon."""
    for host, port in addresses:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            continue
        if ip.is_global:
            return (host, port)
    return None


def choose_path(
    *,
    server_firewall: int,
    relayed: bool,
    holepunchable: bool,
    claimed_open: bool,
    punch: bool,
    relaying: bool,
    server_seen: bool,
) -> str:
    """How the raw stream gets to the server after message 2 (hyperdht connect.js order).

    "relay": only the blind relay (punching off); "seen": the server's first packet already
    reached us; "open": the server is reachable (or answered via a node and cannot punch);
    "direct": the handshake went to the server itself; "passive": we claimed OPEN, the server
    connects to us; "holepunch": both firewalled, punch through the server's relay node;
    "none": no way at all (CANNOT_HOLEPUNCH). Any path but "none" races a relay pairing
    that `relaying` started.
    """
    if relaying and not punch:
        return "relay"
    if server_seen:
        return "seen"
    if server_firewall == Firewall.OPEN or (relayed and not holepunchable):
        return "open"
    if not relayed:
        return "direct"
    if claimed_open:
        return "passive"
    if holepunchable and punch:
        return "holepunch"
    return "relay" if relaying else "none"


def _key_text(key: bytes) -> str:
    return encode_id(key) if len(key) == 32 else key.hex()


async def connect(
    node: DHTNode,
    remote_public_key: bytes,
    *,
    key_pair: KeyPair | None = None,
    relay_through: bytes | None = None,
    punch: bool = True,
    timeout: float = CONNECT_TIMEOUT,
    keep_alive: float = KEEP_ALIVE,
    relay_addresses: list[Address] | None = None,
    trace: ConnectTrace | None = None,
) -> Connection:
    """Connect to the hyperdht server announcing `remote_public_key`; returns once the
    secret stream is open. `relay_through`: a blind relay's key to carry the raw stream
    (as hyperdht's `relayThrough`); `relay_addresses`: DHT nodes to try first."""
    if node.udx is None:
        raise DHTError("the node needs a relay.udx.UDX to open streams", "NO_UDX")
    if len(remote_public_key) != 32:
        raise DHTError("a hyperdht public key is 32 bytes", "BAD_KEY")
    await node.bind()
    c = _Connector(node, remote_public_key, key_pair or key_pair_default(), relay_through, punch, keep_alive)
    c.trace = trace or ConnectTrace()
    if c.trace.started is None:
        c.trace.started = node._now()
    try:
        return await asyncio.wait_for(c.run(relay_addresses or []), timeout)
    except TimeoutError:
        c.destroy()
        stage = c.trace.stage
        raise DHTError(
            f"connecting to {_key_text(remote_public_key)} timed out after {timeout:g}s ({stage})",
            "CONNECT_TIMEOUT",
        ) from None
    except BaseException:
        c.destroy()
        raise


def key_pair_default() -> KeyPair:
    return key_pair()


class _Connector:
    """The state of one `connect` (hyperdht's `c` object)."""

    def __init__(
        self,
        node: DHTNode,
        remote_public_key: bytes,
        kp: KeyPair,
        relay_through: bytes | None,
        punch: bool,
        keep_alive: float,
    ) -> None:
        self.node = node
        self.remote_public_key = remote_public_key
        self.target = hash32(remote_public_key)
        self.key_pair = kp
        self.relay_through = relay_through
        self.relay_token = os.urandom(32) if relay_through else None
        self.punch = punch
        self.keep_alive = keep_alive
        self.trace = ConnectTrace()
        self.noise = NoiseHandshake("IK", True, kp, remote_static=remote_public_key, prologue=NS_PEER_HANDSHAKE)
        self.stream = node.udx.create_stream(framed=True, firewall=self._firewall)
        self.msg1: bytes | None = None
        self.result: HandshakeResult | None = None
        self.payload: NoisePayload | None = None
        self.client_address: Address | None = None
        self.server_seen: tuple[Any, Address] | None = None  # (socket, address) of an early server packet
        self.pairing: RelayPairing | None = None
        self.proto: SecretStreamProtocol | None = None
        self.relayed = False
        self._loop = asyncio.get_running_loop()
        self._connected: asyncio.Future[None] = self._loop.create_future()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.claimed_open = False
        self.puncher: ClientPuncher | None = None
        self.round = 0
        self.done = False

    # ------------------------------------------------------------------ steps

    def _message1(self) -> bytes:
        ra = self.node.remote_address() if self.punch else None
        self.claimed_open = ra is not None
        addresses: list[Address] = [ra] if ra else []
        payload = NoisePayload(
            version=1,
            error=PayloadError.NONE,
            firewall=Firewall.OPEN if ra else Firewall.UNKNOWN,
            holepunch=None,
            addresses4=addresses,
            udx=UDXInfo(id=self.stream.id),
            secret_stream=True,
            relay_through=RelayThroughInfo(self.relay_through, self.relay_token)
            if self.relay_through and self.relay_token
            else None,
        )
        return self.noise.send(payload.encode())

    async def run(self, relay_addresses: list[Address]) -> Connection:
        self.msg1 = self._message1()
        errors: list[str] = []
        found = await self._find_and_handshake(relay_addresses, errors)
        if not found:
            if errors:
                raise DHTError(
                    f"{_key_text(self.remote_public_key)} was found on the DHT but no handshake succeeded: "
                    + "; ".join(errors[:3]),
                    "PEER_CONNECTION_FAILED",
                )
            raise DHTError(f"no DHT node holds an announce for {_key_text(self.remote_public_key)}", "PEER_NOT_FOUND")
        return await self._open()

    async def _find_and_handshake(self, relay_addresses: list[Address], errors: list[str]) -> bool:
        """FIND_PEER; each node holding the record gets the handshake until one works."""
        queue: asyncio.Queue[Address | None] = asyncio.Queue()
        tried: set[Address] = set()
        for a in relay_addresses:
            queue.put_nowait(a)

        def on_data(reply: Any) -> None:
            if not reply.value:
                return
            try:
                rec = PeerRecord.decode(reply.value)
            except DHTError:
                return  # a garbage record is that node's problem
            if rec.public_key == self.remote_public_key:
                self.trace.mark("found", self.node._now(), "handshake")
                queue.put_nowait(reply.peer.address)

        async def walk() -> None:
            try:
                await self.node.query(self.target, Command.FIND_PEER, on_data=on_data, retries=3)
            finally:
                queue.put_nowait(None)

        walker = asyncio.ensure_future(walk())
        attempts: dict[asyncio.Task[Any], Address] = {}
        getter: asyncio.Task[Address | None] | None = None
        walked = False
        try:
            while True:
                if getter is None and not walked:
                    getter = asyncio.ensure_future(queue.get())
                if not attempts and getter is None:
                    return False  # the walk is over and every holder failed
                waiting: set[asyncio.Future[Any]] = set(attempts)
                if getter is not None and len(attempts) < PARALLEL_HANDSHAKES:
                    waiting.add(getter)
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if getter is not None and getter in done:
                    addr = getter.result()
                    getter = None
                    if addr is None:
                        walked = True
                    elif addr not in tried:
                        tried.add(addr)
                        attempts[asyncio.ensure_future(self._exchange(addr))] = addr
                for t in [t for t in done if t in attempts]:
                    addr = attempts.pop(t)
                    try:
                        found = t.result()
                    except DHTError as e:
                        log.debug("handshake through %s failed: %s", addr, e)
                        errors.append(f"{addr[0]}:{addr[1]}: {e}")
                        if e.code in ("SERVER_ERROR", "SERVER_INCOMPATIBLE"):
                            raise
                        continue
                    self._adopt(addr, *found)  # raises CANNOT_HOLEPUNCH: the server's property, final
                    return True
        finally:
            for t in attempts:
                t.cancel()
            if getter is not None:
                getter.cancel()
            walker.cancel()
            with contextlib.suppress(BaseException):
                await walker

    async def _exchange(self, addr: Address) -> tuple[Any, Handshake, NoiseHandshake, NoisePayload]:
        """PEER_HANDSHAKE through `addr` and message 2 checked, on a copy of our Noise state;
        nothing of ours changes, so attempts can run side by side."""
        assert self.msg1 is not None
        value = Handshake(Mode.FROM_CLIENT, self.msg1).encode()
        reply = await self.node.request(addr, Command.PEER_HANDSHAKE, target=self.target, value=value)
        if not reply.value:
            raise DHTError("the node answered without a handshake (it lost the announce)", "BAD_HANDSHAKE_REPLY")
        hs = Handshake.decode(reply.value)
        if hs.mode != Mode.REPLY or not hs.noise or reply.peer.address != addr:
            raise DHTError("bad handshake reply", "BAD_HANDSHAKE_REPLY")
        noise = copy.deepcopy(self.noise)  # a bad message 2 must not spoil the next attempt
        try:
            payload = NoisePayload.decode(noise.recv(hs.noise))
        except (NoiseError, DHTError) as e:
            raise DHTError(f"the server's handshake reply does not verify: {e}", "HANDSHAKE_INVALID") from None
        if payload.version != 1:
            raise DHTError(f"server speaks handshake version {payload.version}, not 1", "SERVER_INCOMPATIBLE")
        if payload.error != PayloadError.NONE:
            raise DHTError(f"the server refused the handshake (error {payload.error})", "SERVER_ERROR")
        if payload.udx is None:
            raise DHTError("the server did not send UDX data", "SERVER_ERROR")
        return reply, hs, noise, payload

    def _adopt(self, addr: Address, reply: Any, hs: Handshake, noise: NoiseHandshake, payload: NoisePayload) -> None:
        """The first good message 2 wins: finish the handshake and start the path(s) to the server."""
        self.noise = noise
        self.result = HandshakeResult.from_noise(noise)
        self.payload = payload
        self.client_address = reply.to
        relayed = hs.peer_address is not None
        server_address = hs.peer_address or addr
        now = self.node._now()
        self.trace.mark("found", now)
        self.trace.mark("handshake", now, "connect")
        use_relay = self.relay_through is not None or payload.relay_through is not None
        if use_relay:
            self.trace.stage = "relay"
            self._spawn(self._relay())
        path = choose_path(
            server_firewall=payload.firewall,
            relayed=relayed,
            holepunchable=bool(payload.holepunch and payload.holepunch.relays),
            claimed_open=self.claimed_open,
            punch=self.punch,
            relaying=use_relay,
            server_seen=self.server_seen is not None,
        )
        sock = self.node.socket_for(self.node.rpc.socket)
        if path == "seen":
            assert self.server_seen is not None
            self._connect_raw(*self.server_seen)
        elif path == "open":
            self._connect_raw(sock, public_address(payload.addresses4) or server_address)
        elif path == "direct":
            self._connect_raw(sock, addr)
        elif path == "passive":
            # we said we are reachable: the server connects to us, our firewall hook takes it
            self.node.after(PASSIVE_CONNECT_TIMEOUT, self._passive_timeout)
        elif path == "holepunch":
            self.trace.stage = "holepunch"
            self._spawn(self._holepunch(addr, server_address, use_relay))
        elif path == "none":
            raise DHTError("the server is firewalled and offers no holepunch relay", "CANNOT_HOLEPUNCH")
        # "relay": the pairing started above is the only way

    # ------------------------------------------------------------------ holepunch

    async def _holepunch(self, relay_address: Address, server_address: Address, relaying: bool) -> None:
        """hyperdht connect.js `holepunch` for consistent NATs; a failure only fails the
        connect when no relay is carrying it."""
        try:
            await self._punch(relay_address, server_address)
        except DHTError as e:
            self._destroy_puncher()
            if not relaying and not self._connected.done():
                self._connected.set_exception(e)

    async def _punch(self, relay_address: Address, server_address: Address) -> None:
        assert self.payload is not None and self.payload.holepunch is not None and self.result is not None
        hp = self.payload.holepunch
        p = self.puncher = ClientPuncher(self.node, self._on_probe)
        p.state.remote_firewall = self.payload.firewall
        self._spawn(p.sample_nat())
        server_relay = next((r for r in hp.relays if r.relay_address == relay_address), hp.relays[0])
        token, peer_address = await self._probe_round(p, server_address, server_relay, retry=True)
        if server_relay.relay_address == relay_address and peer_address != server_address:
            server_address = peer_address  # the server re-rolled its socket: use the one it picked
            p.probe(server_address)
        st = p.state
        st.nat.freeze()
        if st.nat.firewall == Firewall.RANDOM or st.remote_firewall == Firewall.RANDOM:
            await self._abort_punch(p, server_relay)
            raise DHTError("a random NAT on one side: not hole-punched (no birthday sockets here)", "CANNOT_HOLEPUNCH")
        await self._update(
            p,
            server_address,
            relay_address,
            HolepunchPayload(
                error=PayloadError.NONE,
                firewall=st.nat.firewall,
                round=self._next_round(),
                punching=True,
                addresses=st.nat.addresses,
                token=address_token(p.local_secret, server_address[0]),
                remote_token=token,
            ),
        )
        if not st.remote_holepunching:
            raise DHTError("the server is not hole-punching", "REMOTE_NOT_HOLEPUNCHING")
        if not st.can_punch():
            raise DHTError("the server's NAT cannot be hole-punched from ours", "REMOTE_NOT_HOLEPUNCHABLE")
        st.punching = True
        while st.more_tries() and not self.stream.connected and not self.done:
            for target in st.probe_targets():
                p.probe(target)
            await asyncio.sleep(PROBE_INTERVAL)
        if not self.stream.connected:
            raise DHTError(f"no probe came through after {st.tries} rounds", "HOLEPUNCH_PROBE_TIMEOUT")

    async def _probe_round(
        self, p: ClientPuncher, server_address: Address, server_relay: RelayInfo, *, retry: bool
    ) -> tuple[bytes | None, Address]:
        p.probe(server_address)  # open a session towards the server's address
        reply, peer_address, remote = await self._update(
            p,
            server_relay.peer_address,
            server_relay.relay_address,
            HolepunchPayload(
                error=PayloadError.NONE,
                firewall=p.state.nat.firewall,
                round=self._next_round(),
                addresses=p.state.nat.addresses,
                remote_address=server_address,
            ),
        )
        p.state.nat.add(reply.to, reply.peer.address)
        if p.state.remote_firewall == Firewall.UNKNOWN:
            await asyncio.sleep(1.0)  # let the server's NAT analysis finish
        await p.analyzed(5.0)
        if (p.state.remote_firewall == Firewall.UNKNOWN or not remote.token) and retry:
            return await self._probe_round(p, server_address, server_relay, retry=False)
        if p.state.remote_firewall == Firewall.UNKNOWN or p.state.nat.firewall == Firewall.UNKNOWN:
            await self._abort_punch(p, server_relay)
            raise DHTError("the NAT types could not be told apart in time", "HOLEPUNCH_PROBE_TIMEOUT")
        if not p.state.stable():
            await self._abort_punch(p, server_relay)
            raise DHTError("both sides are behind random NATs", "HOLEPUNCH_DOUBLE_RANDOMIZED_NATS")
        return remote.token, peer_address

    async def _update(
        self, p: ClientPuncher, peer_address: Address, relay_address: Address, msg: HolepunchPayload
    ) -> tuple[Any, Address, HolepunchPayload]:
        """One PEER_HOLEPUNCH round from the puncher socket; the answer updates our view."""
        assert self.payload is not None and self.payload.holepunch is not None and self.result is not None
        secret = hash32(NS_PEER_HOLEPUNCH, self.result.hash)
        value = Holepunch(Mode.FROM_CLIENT, self.payload.holepunch.id, seal_payload(secret, msg), peer_address)
        reply = await self.node.request(
            relay_address, Command.PEER_HOLEPUNCH, target=self.target, value=value.encode(), socket=p.name
        )
        if not reply.value:
            raise DHTError("empty holepunch reply", "BAD_HOLEPUNCH_REPLY")
        hp = Holepunch.decode(reply.value)
        if hp.mode != Mode.REPLY or reply.peer.address != relay_address:
            raise DHTError("bad holepunch reply", "BAD_HOLEPUNCH_REPLY")
        remote = open_payload(secret, hp.payload)
        if remote is None:
            raise DHTError("the server's holepunch answer does not decrypt", "HOLEPUNCH_INVALID")
        if remote.error != PayloadError.NONE:
            raise DHTError(f"the server aborted the holepunch (error {remote.error})", "REMOTE_ABORTED")
        echoed = remote.remote_token is not None and msg.token is not None and remote.remote_token == msg.token
        peer = hp.peer_address or peer_address
        p.state.update_remote(remote.punching, remote.firewall, remote.addresses, peer[0] if echoed else None)
        return reply, peer, remote

    async def _abort_punch(self, p: ClientPuncher, server_relay: RelayInfo) -> None:
        msg = HolepunchPayload(error=PayloadError.ABORTED, firewall=Firewall.UNKNOWN, round=self._next_round())
        with contextlib.suppress(DHTError):
            await self._update(p, server_relay.peer_address, server_relay.relay_address, msg)

    def _next_round(self) -> int:
        self.round += 1
        return self.round - 1

    def _on_probe(self, data: bytes, addr: Address) -> None:
        """A server probe reached our puncher socket: the hole is open, connect there."""
        p = self.puncher
        if p is None or p.closed or self.stream.connected or self.result is None:
            return
        p.state.connected = True
        self._connect_raw(p.socket, addr)
        if self.stream.connected and self.stream.socket is p.socket:
            p.in_use = True
            prev = self.stream.on_close

            def close_puncher(err: Any) -> None:
                if prev is not None:
                    prev(err)
                p.close()

            self.stream.on_close = close_puncher

    def _destroy_puncher(self) -> None:
        if self.puncher is not None and not self.puncher.in_use:
            self.puncher.close()

    async def _relay(self) -> None:
        """Pair our raw stream through the relay; the first path to connect wins."""
        assert self.payload is not None
        if self.payload.relay_through is not None:
            initiator, key, token = False, self.payload.relay_through.public_key, self.payload.relay_through.token
        else:
            assert self.relay_through is not None and self.relay_token is not None
            initiator, key, token = True, self.relay_through, self.relay_token
        try:
            self.pairing = await pair_through_relay(
                self.node,
                key,
                token,
                initiator,
                self.stream.id,
                connect=connect,
                key_pair=self.key_pair,
                trace=self.trace,
            )
        except DHTError as e:
            if not self._connected.done():
                self._connected.set_exception(e)
            return
        if self.stream.connected or self.done:
            self.pairing.close()  # the direct path won
            self.pairing = None
            return
        self.relayed = True
        p = self.pairing
        self._connect_raw(p.socket, p.relay_address, remote_id=p.remote_id)

    def _passive_timeout(self) -> None:
        if not self._connected.done() and not self.done and (self.pairing is None or not self.relay_through):
            self._connected.set_exception(
                DHTError(
                    f"the server did not reach us within {PASSIVE_CONNECT_TIMEOUT:g}s "
                    "although we claimed to be reachable",
                    "HOLEPUNCH_ABORTED",
                )
            )

    def _firewall(self, stream: Any, sock: Any, addr: Address) -> bool:
        """UDX firewall of our raw stream: True drops the packet."""
        if stream.connected or not self.punch:
            return True  # no path changes after connect; the blocked network takes the relay only
        if self.result is None:
            self.server_seen = (sock, addr)
            return True
        if self.pairing is not None and addr == self.pairing.relay_address:
            return True
        self._connect_raw(sock, addr)
        return False

    def _connect_raw(self, sock: Any, addr: Address, *, remote_id: int | None = None) -> None:
        if self.stream.connected or self.stream.closed or self._connected.done():
            return
        assert self.payload is not None and self.payload.udx is not None and self.result is not None
        self.stream.connect(sock, self.payload.udx.id if remote_id is None else remote_id, addr)
        self.proto = SecretStreamProtocol(SecretStream(True, handshake=self.result, keep_alive=self.keep_alive))
        start_secret_stream(self.stream, self.proto)
        self.trace.stage = "secret stream"
        self._connected.set_result(None)

    async def _open(self) -> Connection:
        await self._connected
        assert self.proto is not None and self.result is not None and self.payload is not None
        closed: asyncio.Future[Any] = asyncio.ensure_future(self.proto.wait_closed())
        opened: asyncio.Future[Any] = self.proto.opened
        try:
            await asyncio.wait([opened, closed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
        if not self.proto.opened.done():
            err = self.proto.stream.error
            raise DHTError(f"the secret stream closed before it opened: {err or 'peer went away'}", "SECRET_STREAM")
        self.trace.mark("opened", self.node._now(), "done")
        self.done = True
        conn = Connection(
            remote_public_key=self.remote_public_key,
            handshake=self.result,
            stream=self.stream,
            secret_stream=self.proto,
            remote_payload=self.payload,
            client_address=self.client_address or ("0.0.0.0", 0),
            relayed=self.relayed,
            extra={"trace": self.trace, "relay_through": self.pairing.relay_key if self.pairing else None},
        )
        pairing = self.pairing
        if pairing is not None:
            prev = self.stream.on_close

            def on_close(err: Any) -> None:
                if prev is not None:
                    prev(err)
                pairing.close()

            self.stream.on_close = on_close
            pairing.on_lost = lambda: self.stream.destroy() if not self.stream.closed else None
        return conn

    # ------------------------------------------------------------------ plumbing

    def _spawn(self, coro: Any) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def destroy(self) -> None:
        """A failed or cancelled connect: nothing of it may linger."""
        self.done = True
        for t in list(self._tasks):
            t.cancel()
        if not self.stream.closed:
            self.stream.destroy()
        self._destroy_puncher()
        if self.pairing is not None:
            self.pairing.close()
            self.pairing = None
