"""Server side of the HyperDHT connection handshake, sans-IO (`hyperdht/lib/server.js`).

A client's Noise IK message 1 reaches us inside PEER_HANDSHAKE, directly or relayed by
the DHT node we announced to. `HandshakeResponder` decrypts it, decides the payload error,
builds message 2 with our addresses and UDX stream id, and remembers the attempt keyed
by message 1, so retransmissions and the copy relayed by a second DHT node get the
identical reply. Attempts are cleared 10 s after they finish. The UDX stream itself is
the runtime's job: `accept` tells it whether to open one, `reply` takes its id.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import nacl.bindings
import nacl.exceptions

from relay.keys import KeyPair
from relay.noise import NoiseError, NoiseHandshake
from relay.secretstream import HandshakeResult

from .messages import (
    NS_PEER_HANDSHAKE,
    NS_PEER_HOLEPUNCH,
    Address,
    DHTError,
    Firewall,
    HolepunchInfo,
    HolepunchPayload,
    NoisePayload,
    PayloadError,
    RelayInfo,
    RelayThroughInfo,
    UDXInfo,
    hash32,
)

HANDSHAKE_CLEAR_WAIT = 10.0
PASSIVE_CONNECT_TIMEOUT = 10.0
MAX_PENDING = 4096  # Node has no cap here (router.js TODO); a flood must not grow us without bound

FirewallHook = Callable[[bytes, NoisePayload, Address], bool]


@dataclass(eq=False)
class Attempt:
    """One client connection attempt, identified by its Noise message 1."""

    key: bytes
    slot: int
    noise: NoiseHandshake
    remote_payload: NoisePayload
    client_address: Address
    server_address: Address
    direct: bool
    created: float
    error: int = PayloadError.NONE
    reply: bytes | None = None
    stream_id: int = 0
    result: HandshakeResult | None = None
    holepunch_secret: bytes | None = None
    firewall: int = Firewall.UNKNOWN
    round: int = 0
    connected: bool = False
    clear_at: float | None = None
    deadline: float | None = None  # passive wait for the client's first UDX packet
    relay_token: bytes | None = None
    extra: dict = field(default_factory=dict)

    @property
    def remote_public_key(self) -> bytes:
        assert self.noise.remote_static is not None
        return self.noise.remote_static


@dataclass(frozen=True, slots=True)
class AttemptTimedOut:
    """The client never showed up on the attempt's UDX stream within its passive wait."""

    attempt: Attempt


class HandshakeResponder:
    """Noise IK responder plus the dedup table for one announced key pair."""

    def __init__(
        self, key_pair: KeyPair, *, firewall: FirewallHook | None = None, max_pending: int = MAX_PENDING
    ) -> None:
        self.key_pair = key_pair
        self.firewall = firewall
        self.max_pending = max_pending
        self.attempts: dict[bytes, Attempt] = {}
        self.slots: list[Attempt | None] = []
        self.stats = {"handshakes": 0, "rejected": 0, "failed": 0, "duplicates": 0}
        self._events: deque[AttemptTimedOut] = deque()

    # ------------------------------------------------------------------ handshake

    def lookup(self, msg1: bytes) -> Attempt | None:
        a = self.attempts.get(msg1)
        if a is not None:
            self.stats["duplicates"] += 1
        return a

    def accept(
        self,
        msg1: bytes,
        peer_address: Address | None,
        req_from: Address,
        req_to: Address,
        now: float,
        *,
        ephemeral: KeyPair | None = None,
    ) -> Attempt | None:
        """Consume message 1. None means drop silently (bad Noise, firewalled, too many)."""
        if msg1 in self.attempts:
            return self.lookup(msg1)
        if len(self.attempts) >= self.max_pending:
            self.stats["rejected"] += 1
            return None
        noise = NoiseHandshake("IK", False, self.key_pair, prologue=NS_PEER_HANDSHAKE, ephemeral=ephemeral)
        try:
            plain = noise.recv(msg1)
            payload = NoisePayload.decode(plain)
        except (NoiseError, DHTError):
            self.stats["failed"] += 1
            return None
        client = peer_address or req_from
        assert noise.remote_static is not None
        if self.firewall is not None and self.firewall(noise.remote_static, payload, client):
            self.stats["rejected"] += 1
            return None
        slot = self._slot()
        a = Attempt(msg1, slot, noise, payload, client, req_to, peer_address is None, now)
        if payload.version != 1:
            a.error = PayloadError.VERSION_MISMATCH
        elif payload.udx is None:
            a.error = PayloadError.ABORTED
        self.attempts[msg1] = a
        self.slots[slot] = a
        self.stats["handshakes"] += 1
        return a

    def _slot(self) -> int:
        for i, s in enumerate(self.slots):
            if s is None:
                return i
        self.slots.append(None)
        return len(self.slots) - 1

    def reply(
        self,
        a: Attempt,
        now: float,
        *,
        stream_id: int,
        remote_address: Address | None,
        local_addresses: list[Address],
        relay_addresses: list[Address],
        relays: list[RelayInfo],
        relay_through: bytes | None = None,
        reusable_socket: bool = False,
    ) -> bytes:
        """Build message 2 (once); `remote_address` set means we claim firewall OPEN."""
        if a.reply is not None:
            return a.reply
        a.stream_id = stream_id
        a.firewall = Firewall.OPEN if remote_address else Firewall.UNKNOWN
        addresses = ([remote_address] if remote_address else []) + list(local_addresses)
        if relay_through is not None:
            a.relay_token = os.urandom(32)
        payload = NoisePayload(
            version=1,
            error=a.error,
            firewall=a.firewall,
            holepunch=None if remote_address else HolepunchInfo(a.slot, list(relays)),
            addresses4=addresses,
            udx=UDXInfo(id=stream_id, reusable_socket=reusable_socket),
            secret_stream=True,
            relay_through=RelayThroughInfo(relay_through, a.relay_token) if relay_through and a.relay_token else None,
            relay_addresses=list(relay_addresses) if relay_addresses else None,
        )
        a.reply = a.noise.send(payload.encode())
        assert a.noise.complete and a.noise.hash is not None
        a.result = HandshakeResult.from_noise(a.noise)
        a.holepunch_secret = hash32(NS_PEER_HOLEPUNCH, a.noise.hash)
        if a.error != PayloadError.NONE:
            self.finish(a, now)
        else:
            a.deadline = now + PASSIVE_CONNECT_TIMEOUT
        return a.reply

    def finish(self, a: Attempt, now: float) -> None:
        """Connected, failed or timed out: keep answering duplicates for 10 s, then forget."""
        a.deadline = None
        if a.clear_at is None:
            a.clear_at = now + HANDSHAKE_CLEAR_WAIT

    def drop(self, a: Attempt) -> None:
        if self.attempts.get(a.key) is a:
            del self.attempts[a.key]
        if a.slot < len(self.slots) and self.slots[a.slot] is a:
            self.slots[a.slot] = None
            while self.slots and self.slots[-1] is None:
                self.slots.pop()

    def handle_timer(self, now: float) -> None:
        """Time out the attempts whose passive wait ran out at `now` (each an `AttemptTimedOut`
        from `next_event`) and forget those past their dedup window."""
        for a in list(self.attempts.values()):
            if a.deadline is not None and now >= a.deadline:
                self._events.append(AttemptTimedOut(a))
                self.finish(a, now)
            if a.clear_at is not None and now >= a.clear_at:
                self.drop(a)

    def get_timer(self) -> float | None:
        """The earliest attempt deadline or dedup expiry, or None."""
        times = [t for a in self.attempts.values() for t in (a.deadline, a.clear_at) if t is not None]
        return min(times) if times else None

    def next_event(self) -> AttemptTimedOut | None:
        """The next attempt that timed out (the runtime destroys its stream and puncher)."""
        return self._events.popleft() if self._events else None

    # ------------------------------------------------------------------ holepunch

    def holepunch(self, slot: int, payload: bytes) -> tuple[Attempt, HolepunchPayload] | None:
        """Decrypt a client's holepunch round for `slot`; None = not ours / garbage."""
        a = self.slots[slot] if 0 <= slot < len(self.slots) else None
        if a is None or a.holepunch_secret is None:
            return None
        msg = open_payload(a.holepunch_secret, payload)
        if msg is None:
            return None
        return a, msg


def seal_payload(secret: bytes, msg: HolepunchPayload, nonce: bytes | None = None) -> bytes:
    """hyperdht SecurePayload.encrypt: nonce || secretbox(plaintext)."""
    nonce = nonce or os.urandom(24)
    return nonce + nacl.bindings.crypto_secretbox(msg.encode(), nonce, secret)


def open_payload(secret: bytes, data: bytes) -> HolepunchPayload | None:
    if len(data) < 24 + 16:
        return None
    try:
        plain = nacl.bindings.crypto_secretbox_open(data[24:], data[:24], secret)
        return HolepunchPayload.decode(plain)
    except (nacl.exceptions.CryptoError, DHTError):
        return None


def address_token(local_secret: bytes, host: str) -> bytes:
    return hash32(host.encode(), local_secret)


if TYPE_CHECKING:
    from relay.core import DrivenCore

    # mypy checks the core against relay.core's contract here (never run: the guard sees no asyncio)
    def _conforms(core: HandshakeResponder) -> DrivenCore[AttemptTimedOut]:
        return core
