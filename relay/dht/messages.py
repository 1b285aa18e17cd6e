"""Wire formats of dht-rpc (the UDP RPC frame) and hyperdht (the values it carries).

Everything here is pure: bytes in, dataclasses out and back, byte-identical to the Node
encoders (`dht-rpc/lib/io.js`, `hyperdht/lib/messages.js`). Any malformed input raises
`DHTError`, the one error type of this layer, so the node loop catches exactly one type.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TypeVar

from relay.encoding import DecodeError, Reader, Writer

Address = tuple[str, int]
T = TypeVar("T")

VERSION = 0b11
REQUEST_ID = (0b0000 << 4) | VERSION  # 0x03
RESPONSE_ID = (0b0001 << 4) | VERSION  # 0x13

BOOTSTRAP_NODES = (
    "88.99.3.86@node1.hyperdht.org:49737",
    "142.93.90.113@node2.hyperdht.org:49737",
    "138.68.147.8@node3.hyperdht.org:49737",
)
DEFAULT_PORT = 49737


class DHTError(Exception):
    """Something at the DHT layer failed: a bad datagram, a request that got no answer, a
    peer that answered with an error. `code` carries the dht-rpc / hyperdht error code."""

    def __init__(self, message: str, code: str = "DHT_ERROR") -> None:
        super().__init__(message)
        self.code = code


class Internal(IntEnum):
    """dht-rpc's own commands (request flag bit 2 set), `dht-rpc/lib/commands.js`."""

    PING = 0
    PING_NAT = 1
    FIND_NODE = 2
    DOWN_HINT = 3
    DELAYED_PING = 4


class Command(IntEnum):
    """hyperdht's commands (flag bit 2 clear), `hyperdht/lib/constants.js`."""

    PEER_HANDSHAKE = 0
    PEER_HOLEPUNCH = 1
    FIND_PEER = 2
    LOOKUP = 3
    ANNOUNCE = 4
    UNANNOUNCE = 5
    MUTABLE_PUT = 6
    MUTABLE_GET = 7
    IMMUTABLE_PUT = 8
    IMMUTABLE_GET = 9
    PLUGIN = 10


class ErrorCode(IntEnum):
    """Response `error` values (dht-rpc/lib/errors.js, hyperdht ERROR)."""

    OK = 0
    UNKNOWN_COMMAND = 1
    INVALID_TOKEN = 2
    SEQ_REUSED = 16
    SEQ_TOO_LOW = 17


class Firewall(IntEnum):
    UNKNOWN = 0
    OPEN = 1
    CONSISTENT = 2
    RANDOM = 3


class PayloadError(IntEnum):
    """`error` inside Noise and holepunch payloads."""

    NONE = 0
    ABORTED = 1
    VERSION_MISMATCH = 2
    TRY_LATER = 3


class Mode(IntEnum):
    """Who sent a PEER_HANDSHAKE / PEER_HOLEPUNCH on which hop (`hyperdht/lib/router.js`)."""

    FROM_CLIENT = 0
    FROM_SERVER = 1
    FROM_RELAY = 2
    FROM_SECOND_RELAY = 3
    REPLY = 4


# --------------------------------------------------------------------------- hashing


def hash32(data: bytes, key: bytes | None = None) -> bytes:
    """BLAKE2b-256, libsodium's crypto_generichash."""
    return hashlib.blake2b(data, digest_size=32, key=key or b"").digest()


def namespace(name: str, ids: list[int]) -> list[bytes]:
    """hypercore-crypto namespace(): H(H(name) || byte(id)) for each id."""
    base = hash32(name.encode())
    return [hash32(base + bytes([i])) for i in ids]


NS_ANNOUNCE, NS_UNANNOUNCE, NS_MUTABLE_PUT, NS_PEER_HANDSHAKE, NS_PEER_HOLEPUNCH, NS_PLUGIN = namespace(
    "hyperswarm/dht",
    [
        Command.ANNOUNCE,
        Command.UNANNOUNCE,
        Command.MUTABLE_PUT,
        Command.PEER_HANDSHAKE,
        Command.PEER_HOLEPUNCH,
        Command.PLUGIN,
    ],
)


def encode_address(addr: Address) -> bytes:
    try:
        return Writer().ipv4_address(addr).getvalue()
    except (ValueError, OverflowError) as e:
        raise DHTError(f"not an IPv4 address: {addr!r}") from e


def node_id(addr: Address) -> bytes:
    """A node's id is the hash of its public ip:port, so ids cannot be chosen freely."""
    return hash32(encode_address(addr))


def _decode_guard(what: str, fn: Callable[[Reader], T], data: bytes, start: int = 0) -> T:
    try:
        return fn(Reader(data, start))
    except (DecodeError, IndexError, KeyError, ValueError, TypeError) as e:
        raise DHTError(f"bad {what}: {e}", "BAD_MESSAGE") from None


def _addresses(r: Reader) -> list[Address]:
    return r.array(Reader.ipv4_address)


# --------------------------------------------------------------------------- dht-rpc frame


@dataclass(slots=True)
class Request:
    """A dht-rpc request. `id` is the sender's node id (already validated on decode)."""

    tid: int
    to: Address
    command: int
    internal: bool = False
    id: bytes | None = None
    token: bytes | None = None
    target: bytes | None = None
    value: bytes | None = None

    def encode(self) -> bytes:
        w = Writer()
        w.uint8(REQUEST_ID)
        flags = (
            (1 if self.id is not None else 0)
            | (2 if self.token is not None else 0)
            | (4 if self.internal else 0)
            | (8 if self.target is not None else 0)
            | (16 if self.value is not None else 0)
        )
        _write_head(w, flags, self.tid, self.to, self.id, self.token)
        w.uint(self.command)
        if self.target is not None:
            w.fixed32(self.target)
        if self.value is not None:
            w.buffer(self.value)
        return w.getvalue()


@dataclass(slots=True)
class Response:
    """A dht-rpc response; `to` is how the responder saw us (our public address sample)."""

    tid: int
    to: Address
    id: bytes | None = None
    token: bytes | None = None
    closer_nodes: list[Address] = field(default_factory=list)
    error: int = 0
    value: bytes | None = None

    def encode(self) -> bytes:
        w = Writer()
        w.uint8(RESPONSE_ID)
        flags = (
            (1 if self.id is not None else 0)
            | (2 if self.token is not None else 0)
            | (4 if self.closer_nodes else 0)
            | (8 if self.error > 0 else 0)
            | (16 if self.value is not None else 0)
        )
        _write_head(w, flags, self.tid, self.to, self.id, self.token)
        if self.closer_nodes:
            w.array(self.closer_nodes, Writer.ipv4_address)
        if self.error > 0:
            w.uint(self.error)
        if self.value is not None:
            w.buffer(self.value)
        return w.getvalue()


def _write_head(w: Writer, flags: int, tid: int, to: Address, id_: bytes | None, token: bytes | None) -> None:
    """The part of a frame after its type byte that requests and responses share."""
    w.uint8(flags)
    w.uint16(tid)
    w.ipv4_address(to)
    if id_ is not None:
        w.fixed32(id_)
    if token is not None:
        w.fixed32(token)


def _read_head(r: Reader) -> tuple[int, int, Address, bytes | None, bytes | None]:
    """flags, tid, to, id, token: the inverse of `_write_head`."""
    flags = r.uint()
    return (
        flags,
        r.uint16(),
        r.ipv4_address(),
        r.fixed32() if flags & 1 else None,
        r.fixed32() if flags & 2 else None,
    )


def _read_request(r: Reader) -> Request:
    flags, tid, to, id_, token = _read_head(r)
    command = r.uint()
    target = r.fixed32() if flags & 8 else None
    value = r.buffer() if flags & 16 else None
    return Request(tid, to, command, bool(flags & 4), id_, token, target, value)


def _read_response(r: Reader) -> Response:
    flags, tid, to, id_, token = _read_head(r)
    closer = _addresses(r) if flags & 4 else []
    error = r.uint() if flags & 8 else 0
    value = r.buffer() if flags & 16 else None
    return Response(tid, to, id_, token, closer, error, value)


def decode_message(data: bytes) -> Request | Response:
    """Decode one dht-rpc datagram. The `id` field is returned as sent: validating it
    against the source address is the caller's job (it knows the source)."""
    if len(data) < 2:
        raise DHTError("datagram too short for dht-rpc", "BAD_MESSAGE")
    kind = data[0]
    if kind == REQUEST_ID:
        return _decode_guard("request", _read_request, data, 1)
    if kind == RESPONSE_ID:
        return _decode_guard("response", _read_response, data, 1)
    raise DHTError(f"not a dht-rpc datagram (type byte 0x{kind:02x})", "BAD_MESSAGE")


# --------------------------------------------------------------------------- hyperdht values


@dataclass(slots=True)
class Handshake:
    """Value of PEER_HANDSHAKE."""

    mode: int
    noise: bytes
    peer_address: Address | None = None
    relay_address: Address | None = None

    def encode(self) -> bytes:
        w = Writer()
        w.uint((1 if self.peer_address else 0) | (2 if self.relay_address else 0))
        w.uint(self.mode)
        w.buffer(self.noise)
        if self.peer_address:
            w.ipv4_address(self.peer_address)
        if self.relay_address:
            w.ipv4_address(self.relay_address)
        return w.getvalue()

    @staticmethod
    def decode(data: bytes) -> Handshake:
        def read(r: Reader) -> Handshake:
            flags = r.uint()
            mode = r.uint()
            noise = r.buffer()
            peer = r.ipv4_address() if flags & 1 else None
            relay = r.ipv4_address() if flags & 2 else None
            return Handshake(mode, noise, peer, relay)

        return _decode_guard("handshake", read, data)


@dataclass(slots=True)
class Holepunch:
    """Value of PEER_HOLEPUNCH."""

    mode: int
    id: int
    payload: bytes
    peer_address: Address | None = None

    def encode(self) -> bytes:
        w = Writer()
        w.uint(1 if self.peer_address else 0)
        w.uint(self.mode)
        w.uint(self.id)
        w.buffer(self.payload)
        if self.peer_address:
            w.ipv4_address(self.peer_address)
        return w.getvalue()

    @staticmethod
    def decode(data: bytes) -> Holepunch:
        def read(r: Reader) -> Holepunch:
            flags = r.uint()
            mode = r.uint()
            id_ = r.uint()
            payload = r.buffer()
            peer = r.ipv4_address() if flags & 1 else None
            return Holepunch(mode, id_, payload, peer)

        return _decode_guard("holepunch", read, data)


@dataclass(slots=True)
class RelayInfo:
    relay_address: Address
    peer_address: Address


@dataclass(slots=True)
class HolepunchInfo:
    id: int
    relays: list[RelayInfo]


@dataclass(slots=True)
class UDXInfo:
    id: int
    reusable_socket: bool = False
    seq: int = 0
    version: int = 1


@dataclass(slots=True)
class RelayThroughInfo:
    public_key: bytes
    token: bytes
    version: int = 1


@dataclass(slots=True)
class NoisePayload:
    """Plaintext inside both Noise IK messages of the DHT handshake."""

    version: int = 1
    error: int = 0
    firewall: int = Firewall.UNKNOWN
    holepunch: HolepunchInfo | None = None
    addresses4: list[Address] = field(default_factory=list)
    addresses6: list[Address] = field(default_factory=list)
    udx: UDXInfo | None = None
    secret_stream: bool = False
    relay_through: RelayThroughInfo | None = None
    relay_addresses: list[Address] | None = None

    def encode(self) -> bytes:
        flags = (
            (1 if self.holepunch else 0)
            | (2 if self.addresses4 else 0)
            | (4 if self.addresses6 else 0)
            | (8 if self.udx else 0)
            | (16 if self.secret_stream else 0)
            | (32 if self.relay_through else 0)
            | (64 if self.relay_addresses is not None else 0)
        )
        w = Writer()
        w.uint(1).uint(flags).uint(self.error).uint(self.firewall)
        if self.holepunch:
            w.uint(self.holepunch.id)
            w.uint(len(self.holepunch.relays))
            for ri in self.holepunch.relays:
                w.ipv4_address(ri.relay_address).ipv4_address(ri.peer_address)
        if self.addresses4:
            w.array(self.addresses4, Writer.ipv4_address)
        if self.addresses6:
            w.array(self.addresses6, Writer.ipv6_address)
        if self.udx:
            w.uint(1).uint(1 if self.udx.reusable_socket else 0).uint(self.udx.id).uint(self.udx.seq)
        if self.secret_stream:
            w.uint(1)
        if self.relay_through:
            w.uint(1).uint(0).fixed32(self.relay_through.public_key).fixed32(self.relay_through.token)
        if self.relay_addresses is not None:
            w.array(self.relay_addresses, Writer.ipv4_address)
        return w.getvalue()

    @staticmethod
    def decode(data: bytes) -> NoisePayload:
        def read(r: Reader) -> NoisePayload:
            version = r.uint()
            if version != 1:  # the Node decoder stops here too: the caller answers VERSION_MISMATCH
                return NoisePayload(version=version)
            flags = r.uint()
            p = NoisePayload(version=1, error=r.uint(), firewall=r.uint())
            if flags & 1:
                hp_id = r.uint()
                relays = r.array(lambda rr: RelayInfo(rr.ipv4_address(), rr.ipv4_address()))
                p.holepunch = HolepunchInfo(hp_id, relays)
            if flags & 2:
                p.addresses4 = _addresses(r)
            if flags & 4:
                p.addresses6 = r.array(Reader.ipv6_address)
            if flags & 8:
                version_ = r.uint()
                features = r.uint()
                p.udx = UDXInfo(id=r.uint(), reusable_socket=bool(features & 1), seq=r.uint(), version=version_)
            if flags & 16:
                r.uint()
                p.secret_stream = True
            if flags & 32:
                version_ = r.uint()
                r.uint()
                p.relay_through = RelayThroughInfo(r.fixed32(), r.fixed32(), version_)
            if flags & 64:
                p.relay_addresses = _addresses(r)
            return p

        return _decode_guard("noise payload", read, data)


@dataclass(slots=True)
class HolepunchPayload:
    """Encrypted inside `Holepunch.payload` (secretbox under the holepunch secret)."""

    error: int = 0
    firewall: int = Firewall.UNKNOWN
    round: int = 0
    connected: bool = False
    punching: bool = False
    addresses: list[Address] | None = None
    remote_address: Address | None = None
    token: bytes | None = None
    remote_token: bytes | None = None

    def encode(self) -> bytes:
        flags = (
            (1 if self.connected else 0)
            | (2 if self.punching else 0)
            | (4 if self.addresses is not None else 0)
            | (8 if self.remote_address else 0)
            | (16 if self.token else 0)
            | (32 if self.remote_token else 0)
        )
        w = Writer().uint(flags).uint(self.error).uint(self.firewall).uint(self.round)
        if self.addresses is not None:
            w.array(self.addresses, Writer.ipv4_address)
        if self.remote_address:
            w.ipv4_address(self.remote_address)
        if self.token:
            w.fixed32(self.token)
        if self.remote_token:
            w.fixed32(self.remote_token)
        return w.getvalue()

    @staticmethod
    def decode(data: bytes) -> HolepunchPayload:
        def read(r: Reader) -> HolepunchPayload:
            flags = r.uint()
            p = HolepunchPayload(error=r.uint(), firewall=r.uint(), round=r.uint())
            p.connected = bool(flags & 1)
            p.punching = bool(flags & 2)
            p.addresses = _addresses(r) if flags & 4 else None
            p.remote_address = r.ipv4_address() if flags & 8 else None
            p.token = r.fixed32() if flags & 16 else None
            p.remote_token = r.fixed32() if flags & 32 else None
            return p

        return _decode_guard("holepunch payload", read, data)


@dataclass(slots=True)
class PeerRecord:
    """What DHT nodes store for an announced key (value of a FIND_PEER reply)."""

    public_key: bytes
    relay_addresses: list[Address] = field(default_factory=list)

    def write(self, w: Writer) -> None:
        w.fixed32(self.public_key)
        w.array(self.relay_addresses, Writer.ipv4_address)

    @staticmethod
    def read(r: Reader) -> PeerRecord:
        return PeerRecord(r.fixed32(), _addresses(r))

    def encode(self) -> bytes:
        w = Writer()
        self.write(w)
        return w.getvalue()

    @staticmethod
    def decode(data: bytes) -> PeerRecord:
        return _decode_guard("peer record", PeerRecord.read, data)


@dataclass(slots=True)
class Announce:
    """Value of ANNOUNCE / UNANNOUNCE."""

    peer: PeerRecord | None = None
    refresh: bytes | None = None
    signature: bytes | None = None
    bump: int = 0

    def encode(self) -> bytes:
        flags = (
            (1 if self.peer else 0)
            | (2 if self.refresh else 0)
            | (4 if self.signature else 0)
            | (8 if self.bump else 0)
        )
        w = Writer().uint(flags)
        if self.peer:
            self.peer.write(w)
        if self.refresh:
            w.fixed32(self.refresh)
        if self.signature:
            w.fixed64(self.signature)
        if self.bump:
            w.uint(self.bump)
        return w.getvalue()

    @staticmethod
    def decode(data: bytes) -> Announce:
        def read(r: Reader) -> Announce:
            flags = r.uint()
            return Announce(
                peer=PeerRecord.read(r) if flags & 1 else None,
                refresh=r.fixed32() if flags & 2 else None,
                signature=r.fixed64() if flags & 4 else None,
                bump=r.uint() if flags & 8 else 0,
            )

        return _decode_guard("announce", read, data)


@dataclass(slots=True)
class LookupReply:
    peers: list[PeerRecord]
    bump: int = 0

    def encode(self) -> bytes:
        w = Writer().uint(len(self.peers))
        for p in self.peers:
            p.write(w)
        return w.uint(self.bump).getvalue()

    @staticmethod
    def decode(data: bytes) -> LookupReply:
        def read(r: Reader) -> LookupReply:
            peers = r.array(PeerRecord.read)
            return LookupReply(peers, r.uint() if r.remaining > 0 else 0)

        return _decode_guard("lookup reply", read, data)


def announce_signable(
    target: bytes, node_id_: bytes, token: bytes, peer: PeerRecord, refresh: bytes | None, ns: bytes
) -> bytes:
    """64 bytes the announcer signs: binds the record to the receiving node and its token
    (`hyperdht/lib/persistent.js` annSignable)."""
    return ns + hash32(target + node_id_ + token + peer.encode() + (refresh or b""))


def encode_hyperdht_address(public_key: bytes, nodes: list[Address]) -> bytes:
    """hyperdht-address: key, flags, optional nodes; `connect()` accepts it instead of a key."""
    w = Writer().fixed32(public_key).uint(1 if nodes else 0)
    if nodes:
        w.array(nodes, Writer.ipv4_address)
    return w.getvalue()
