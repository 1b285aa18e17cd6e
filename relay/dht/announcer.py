"""Keeps a server key findable: announce to the 3 closest nodes, re-announce, unannounce.

Mirrors `hyperdht/lib/announcer.js`: a FIND_PEER walk to H(publicKey), ANNOUNCE to the
three XOR-closest responders (signed for each node's id and token), PING them every 3 s
and start over early if most go silent, a full round about every 5 minutes, UNANNOUNCE to
nodes that dropped out and to all on stop. The signing is pure (`sign_announce`); the
cycle is asyncio because it is a sequence of awaited network round trips.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

import nacl.bindings

from .messages import (
    NS_ANNOUNCE,
    NS_UNANNOUNCE,
    Address,
    Announce,
    Command,
    DHTError,
    ErrorCode,
    PeerRecord,
    RelayInfo,
    announce_signable,
)
from .node import DHTNode
from .rpc import Reply

log = logging.getLogger("relay.dht")

PINGS_PER_ROUND = 100
PING_INTERVAL = 3.0
MIN_ACTIVE = 3
RETRY_MIN = 3.0  # a round that reached no node is retried after 3 s, doubling to 60 s
RETRY_MAX = 60.0


class SigningKeyPair(Protocol):
    """Read-only, so `relay.keys.KeyPair` (a NamedTuple) fits."""

    @property
    def public_key(self) -> bytes: ...

    @property
    def secret_key(self) -> bytes: ...  # libsodium layout: seed || public key


def sign_announce(
    key_pair: SigningKeyPair, target: bytes, node_id: bytes, token: bytes, *, unannounce: bool = False
) -> Announce:
    """The ANNOUNCE/UNANNOUNCE value for one node: the signature binds record, node id and
    token, so it is only valid at that node for as long as its token is."""
    peer = PeerRecord(key_pair.public_key, [])
    signable = announce_signable(target, node_id, token, peer, None, NS_UNANNOUNCE if unannounce else NS_ANNOUNCE)
    signature = nacl.bindings.crypto_sign(signable, key_pair.secret_key)[:64]
    return Announce(peer=peer, signature=signature)


class AnnounceState:
    """The announcer's decisions, sans-IO: who to announce to, what to send, what to
    publish, whom to unannounce, when to start over. The driver only runs round trips."""

    def __init__(self, key_pair: SigningKeyPair, target: bytes) -> None:
        self.key_pair = key_pair
        self.target = target
        self.relays: list[RelayInfo] = []
        self.relay_addresses: list[Address] = []
        self.closest: list[Address] | None = None
        self.rounds = 0
        # three generations of announce nodes: [2] this round, [1] the last, [0] the one before
        self.generations: list[dict[Address, Address]] = [{}, {}, {}]
        self._round_relays: list[RelayInfo] = []
        self._round_addresses: list[Address] = []

    @property
    def announced_to(self) -> list[Address]:
        return list(self.generations[2].values())

    def is_relay(self, addr: Address) -> bool:
        return any(addr in g for g in self.generations)

    def begin_round(self, remote_address: Address | None) -> None:
        g = self.generations
        g[0], g[1], g[2] = g[1], g[2], g[0]
        g[2].clear()
        self._round_relays = []
        self._round_addresses = [remote_address] if remote_address else []

    @staticmethod
    def pick(closest_replies: list[Reply]) -> list[Reply]:
        """The 3 XOR-closest responders that proved their id and gave a token (hyperdht takes
        the 3 closest and fails on those without: then id-only repliers could take the slots)."""
        return [r for r in closest_replies if r.token is not None and r.peer.id is not None][:3]

    def announce_value(self, node_id: bytes, token: bytes) -> bytes:
        return sign_announce(self.key_pair, self.target, node_id, token).encode()

    def unannounce_value(self, node_id: bytes, token: bytes) -> bytes:
        return sign_announce(self.key_pair, self.target, node_id, token, unannounce=True).encode()

    def announced(self, node: Reply) -> None:
        """ANNOUNCE to `node` (its FIND_PEER reply) was accepted."""
        addr = node.peer.address
        if len(self._round_addresses) < 3:
            self._round_addresses.append(addr)
        self._round_relays.append(RelayInfo(addr, node.to))
        self.generations[2][addr] = addr

    def finish_round(self, closest_nodes: list[Address]) -> list[Address]:
        """Publish the round; returns last round's nodes that are no longer used (to unannounce)."""
        self.closest = closest_nodes
        self.relays = self._round_relays
        self.relay_addresses = self._round_addresses
        self.rounds += 1
        g = self.generations
        return [a for k, a in g[1].items() if k not in g[2]]

    def needs_refresh(self, pinged: int, answered: int) -> bool:
        """Start a new round early when fewer than min(n, 3) announce nodes still answer."""
        return answered < min(pinged, MIN_ACTIVE)


class Announcer:
    """Drives `AnnounceState` over a `DHTNode` (hyperdht `lib/announcer.js`)."""

    def __init__(self, node: DHTNode, key_pair: SigningKeyPair, target: bytes) -> None:
        self.node = node
        self.target = target
        self.state = AnnounceState(key_pair, target)
        self.stopped = False
        self._refreshing = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._updating: asyncio.Task[None] | None = None

    @property
    def relays(self) -> list[RelayInfo]:
        return self.state.relays

    @property
    def relay_addresses(self) -> list[Address]:
        return self.state.relay_addresses

    @property
    def rounds(self) -> int:
        return self.state.rounds

    @property
    def announced_to(self) -> list[Address]:
        return self.state.announced_to

    def is_relay(self, addr: Address) -> bool:
        return self.state.is_relay(addr)

    async def start(self) -> None:
        """First round, awaited (listen() returns once we are findable), then the loop. A
        node that has not joined the DHT yet does not wait: the loop announces once it can."""
        joined = self.node.bootstrapped
        if joined:
            await self._run_update()
        if not self.stopped:
            self._task = asyncio.ensure_future(self._background(first_round=not joined))

    def refresh(self) -> None:
        self._refreshing = True
        self._wake.set()

    async def stop(self) -> None:
        self.stopped = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._updating is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._updating
        await self._unannounce_all(self.announced_to)

    async def _sleep(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _background(self, first_round: bool = False) -> None:
        retry = RETRY_MIN
        update = first_round
        while not self.stopped and not self.node.destroyed:
            try:
                if update:
                    self._refreshing = False
                    await self._run_update()
                update = True
                if not self.announced_to and not self.stopped:
                    # nobody holds our announce (no DHT yet, or an outage): hyperdht would ping
                    # nobody for ~5 min; try again soon, at once when the node (re)joins
                    if not self._refreshing:
                        await self._sleep(retry)
                    retry = min(2 * retry, RETRY_MAX)
                    continue
                retry = RETRY_MIN
                for _ in range(PINGS_PER_ROUND):
                    if self.stopped or self._refreshing:
                        break
                    nodes = self.announced_to
                    results = await asyncio.gather(*(self.node.ping(n) for n in nodes), return_exceptions=True)
                    active = sum(1 for r in results if isinstance(r, Reply))
                    if self.state.needs_refresh(len(nodes), active):
                        self.refresh()
                    if self.stopped:
                        return
                    if not self._refreshing:
                        await self._sleep(PING_INTERVAL)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("announce round failed; retrying")
                await self._sleep(PING_INTERVAL)

    async def _run_update(self) -> None:
        self._updating = asyncio.ensure_future(self._update())
        try:
            await self._updating
        finally:
            self._updating = None

    async def _update(self) -> None:
        st = self.state
        st.begin_round(None if self.node.firewalled else self.node.remote_address())
        q = await self.node.find_peer(self.target, hash=False, nodes=st.closest)
        if self.stopped:
            return
        await asyncio.gather(*(self._commit(r) for r in st.pick(q.closest_replies)), return_exceptions=True)
        if self.stopped:
            return
        removed = st.finish_round(q.closest_nodes)
        if st.relays:
            self.node.last_announce = time.time()
        log.info("announced %s to %d nodes", self.target.hex()[:16], len(st.relays))
        await self._unannounce_all(removed)

    async def _commit(self, reply: Reply) -> None:
        assert reply.token is not None and reply.peer.id is not None
        token = reply.token
        for _ in range(2):  # a token rotated away in flight gets one retry with the fresh one
            value = self.state.announce_value(reply.peer.id, token)
            res = await self.node.request(
                reply.peer.address, Command.ANNOUNCE, target=self.target, token=token, value=value
            )
            if res.error == ErrorCode.INVALID_TOKEN and res.token is not None:
                token = res.token
                continue
            if res.error == 0:
                self.state.announced(reply)
            return

    async def _unannounce_all(self, nodes: list[Address]) -> None:
        if nodes:
            await asyncio.gather(*(self._unannounce(n) for n in nodes), return_exceptions=True)

    async def _unannounce(self, to: Address) -> None:
        try:
            res = await self.node.request(to, Command.FIND_PEER, target=self.target)
            if res.token is None or res.peer.id is None or res.value is None:
                return
            value = self.state.unannounce_value(res.peer.id, res.token)
            await self.node.request(to, Command.UNANNOUNCE, target=self.target, token=res.token, value=value)
        except DHTError as e:
            log.debug("unannounce to %s failed: %s", to, e)
