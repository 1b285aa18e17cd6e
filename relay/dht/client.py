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

`punch=False` is the blocked cluster network: we claim no reachable address (firewall
UNKNOWN, no local addresses), never connect the raw stream anywhere but the relay, and
drop UDX packets that try to reach it another way. Client-side hole punching of a
firewalled server is not implemented: without a relay that case fails with
`CANNOT_HOLEPUNCH` (the server side does punch, `relay.dht.server`).

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
import time
from dataclasses import dataclass, field
from typing import Any

from relay.keys import KeyPair, encode_id, key_pair
from relay.noise import NoiseError, NoiseHandshake
from relay.secretstream import HandshakeResult, SecretStream, SecretStreamError
from relay.secretstream_aio import SecretStreamProtocol

from .blindclient import BlindRelayClient, Paired, RelayChannelClosed
from .connection import KEEP_ALIVE, Connection, start_secret_stream
from .messages import (
    NS_PEER_HANDSHAKE,
    Address,
    Command,
    DHTError,
    Firewall,
    Handshake,
    Mode,
    NoisePayload,
    PayloadError,
    PeerRecord,
    RelayThroughInfo,
    UDXInfo,
    hash32,
)
from .node import DHTNode

log = logging.getLogger("relay.dht.client")

CONNECT_TIMEOUT = 20.0
RELAY_TIMEOUT = 15.0  # hyperdht: relayTimeout 15000 ms
RELAY_KEEP_ALIVE = 5.0  # hyperdht: relayKeepAlive 5000 ms
PASSIVE_CONNECT_TIMEOUT = 10.0  # hyperdht: passiveConnectTimeout when we claimed OPEN

__all__ = ["CONNECT_TIMEOUT", "ConnectTrace", "RelayPairing", "connect", "pair_through_relay", "public_address"]


@dataclass
class ConnectTrace:
    """When each step of one connect finished, in seconds since it started (for the probe)."""

    started: float = field(default_factory=time.monotonic)
    stages: dict[str, float] = field(default_factory=dict)
    stage: str = "find"  # what we are waiting for now (named in timeout errors)

    def mark(self, name: str, next_stage: str | None = None) -> None:
        self.stages.setdefault(name, round(time.monotonic() - self.started, 4))
        if next_stage is not None:
            self.stage = next_stage


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
                self.trace.mark("found", "handshake")
                queue.put_nowait(reply.peer.address)

        async def walk() -> None:
            try:
                await self.node.query(self.target, Command.FIND_PEER, on_data=on_data, retries=3)
            finally:
                queue.put_nowait(None)

        walker = asyncio.ensure_future(walk())
        try:
            while True:
                addr = await queue.get()
                if addr is None:
                    return False
                if addr in tried:
                    continue
                tried.add(addr)
                try:
                    await self._handshake(addr)
                    return True
                except DHTError as e:
                    log.debug("handshake through %s failed: %s", addr, e)
                    errors.append(f"{addr[0]}:{addr[1]}: {e}")
                    if e.code in ("SERVER_ERROR", "SERVER_INCOMPATIBLE", "CANNOT_HOLEPUNCH"):
                        raise
        finally:
            walker.cancel()
            with contextlib.suppress(BaseException):
                await walker

    async def _handshake(self, addr: Address) -> None:
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
        self.noise = noise
        self.result = HandshakeResult.from_noise(noise)
        self.payload = payload
        self.client_address = reply.to
        relayed = hs.peer_address is not None
        server_address = hs.peer_address or addr
        self.trace.mark("found")
        self.trace.mark("handshake", "connect")
        use_relay = self.relay_through is not None or payload.relay_through is not None
        if use_relay:
            self.trace.stage = "relay"
            self._spawn(self._relay())
        if not self.punch and use_relay:
            return  # blocked network: the relay is the only way
        if self.server_seen is not None:
            self._connect_raw(*self.server_seen)
        elif payload.firewall == Firewall.OPEN or (relayed and not (payload.holepunch and payload.holepunch.relays)):
            target = public_address(payload.addresses4) or server_address
            self._connect_raw(self.node.socket_for(self.node.rpc.socket), target)
        elif not relayed:
            self._connect_raw(self.node.socket_for(self.node.rpc.socket), addr)
        elif self.claimed_open:
            # we said we are reachable: the server connects to us, our firewall hook takes it
            self._loop.call_later(PASSIVE_CONNECT_TIMEOUT, self._passive_timeout)
        elif not use_relay:
            raise DHTError(
                "the server is firewalled and this client does not hole-punch; use a relay (relay_through)",
                "CANNOT_HOLEPUNCH",
            )

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
                self.node, key, token, initiator, self.stream.id, key_pair=self.key_pair, trace=self.trace
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
        self.trace.mark("opened", "done")
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
        if self.pairing is not None:
            self.pairing.close()
            self.pairing = None


# ---------------------------------------------------------------------- blind-relay pairing


class RelayPairing:
    """A matched pairing: the connection to the relay (kept open while the pair lives) and
    where our raw stream must send (`socket`, `relay_address`, `remote_id`)."""

    def __init__(self, relay_key: bytes, conn: Connection, remote_id: int) -> None:
        self.relay_key = relay_key
        self.conn = conn
        self.remote_id = remote_id
        self.on_lost: Any = None
        self._reader: asyncio.Task[None] | None = None
        self.closed = False

    @property
    def socket(self) -> Any:
        return self.conn.stream.socket

    @property
    def relay_address(self) -> Address:
        addr = self.conn.stream.remote_addr
        assert addr is not None
        return addr

    def _keep_reading(self, client: BlindRelayClient) -> None:
        async def read() -> None:
            with contextlib.suppress(Exception):
                while (msg := await self.conn.secret_stream.recv()) is not None:
                    client.receive_message(msg)
            if not self.closed:
                self.closed = True
                if self.on_lost is not None:
                    self.on_lost()

        self._reader = asyncio.ensure_future(read())

    def close(self) -> None:
        """The relayed stream is done (or another path won): end the relay connection."""
        self.closed = True
        if self._reader is not None:
            self._reader.cancel()
        with contextlib.suppress(SecretStreamError):
            self.conn.close()
        stream = self.conn.stream
        if not stream.closed:
            # end() flushes our close; destroy soon after in case the relay never answers
            asyncio.get_running_loop().call_later(2.0, lambda: None if stream.closed else stream.destroy())


async def pair_through_relay(
    node: DHTNode,
    relay_key: bytes,
    token: bytes,
    is_initiator: bool,
    stream_id: int,
    *,
    key_pair: KeyPair | None = None,
    timeout: float = RELAY_TIMEOUT,
    trace: ConnectTrace | None = None,
) -> RelayPairing:
    """Connect to the relay, `pair` our raw stream `stream_id` under `token`, wait for the
    relay's stream id. Raises DHTError("RELAY_ABORTED") with the reason."""
    name = _key_text(relay_key)
    try:
        conn = await connect(node, relay_key, key_pair=key_pair, timeout=timeout, keep_alive=RELAY_KEEP_ALIVE)
    except DHTError as e:
        raise DHTError(f"cannot reach relay {name}: {e}", "RELAY_ABORTED") from None
    if trace is not None:
        trace.mark("relay_connected", "pairing")
    client = BlindRelayClient(id=(key_pair.public_key if key_pair else conn.handshake.public_key))
    proto = conn.secret_stream

    def flush() -> None:
        for m in client.data_to_send():
            proto.send(m)

    async def wait_paired() -> int:
        client.pair(is_initiator, token, stream_id)
        flush()
        while True:
            msg = await proto.recv()
            if msg is None:
                raise DHTError(f"relay {name} closed the connection before pairing", "RELAY_ABORTED")
            for ev in client.receive_message(msg):
                if isinstance(ev, Paired):
                    flush()
                    return ev.remote_id
                if isinstance(ev, RelayChannelClosed):
                    raise DHTError(f"relay {name} closed the blind-relay channel (refused?)", "RELAY_ABORTED")
            flush()

    try:
        remote_id = await asyncio.wait_for(wait_paired(), timeout)
    except TimeoutError:
        conn.destroy()
        raise DHTError(f"relay {name} did not match the pairing within {timeout:g}s", "RELAY_ABORTED") from None
    except (SecretStreamError, Exception) as e:
        conn.destroy()
        if isinstance(e, DHTError):
            raise
        raise DHTError(f"relay {name} broke the pairing: {e}", "RELAY_ABORTED") from None
    if trace is not None:
        trace.mark("paired", "secret stream")
    pairing = RelayPairing(relay_key, conn, remote_id)
    pairing._keep_reading(client)
    return pairing
