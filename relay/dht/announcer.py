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


class SigningKeyPair(Protocol):
    public_key: bytes
    secret_key: bytes  # libsodium layout: seed || public key


def sign_announce(
    key_pair: SigningKeyPair, target: bytes, node_id: bytes, token: bytes, *, unannounce: bool = False
) -> Announce:
    """The ANNOUNCE/UNANNOUNCE value for one node: the signature binds record, node id and
    token, so it is only valid at that node for as long as its token is."""
    peer = PeerRecord(key_pair.public_key, [])
    signable = announce_signable(target, node_id, token, peer, None, NS_UNANNOUNCE if unannounce else NS_ANNOUNCE)
    signature = nacl.bindings.crypto_sign(signable, key_pair.secret_key)[:64]
    return Announce(peer=peer, signature=signature)


class Announcer:
    def __init__(self, node: DHTNode, key_pair: SigningKeyPair, target: bytes) -> None:
        self.node = node
        self.key_pair = key_pair
        self.target = target
        self.relays: list[RelayInfo] = []
        self.relay_addresses: list[Address] = []
        self.stopped = False
        self.rounds = 0
        self._refreshing = False
        self._closest: list[Address] | None = None
        self._generations: list[dict[Address, Address]] = [{}, {}, {}]
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._updating: asyncio.Task[None] | None = None

    @property
    def announced_to(self) -> list[Address]:
        return list(self._generations[2].values())

    def is_relay(self, addr: Address) -> bool:
        return any(addr in g for g in self._generations)

    async def start(self) -> None:
        """First round, awaited (listen() returns once we are findable), then the loop."""
        await self._run_update()
        if not self.stopped:
            self._task = asyncio.ensure_future(self._background())

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

    async def _background(self) -> None:
        while not self.stopped and not self.node.destroyed:
            try:
                self._refreshing = False
                for _ in range(PINGS_PER_ROUND):
                    if self.stopped or self._refreshing:
                        break
                    nodes = self.announced_to
                    results = await asyncio.gather(*(self.node.ping(n) for n in nodes), return_exceptions=True)
                    active = sum(1 for r in results if isinstance(r, Reply))
                    if active < min(len(nodes), MIN_ACTIVE):
                        self.refresh()
                    if self.stopped:
                        return
                    if not self._refreshing:
                        await self._sleep(PING_INTERVAL)
                if not self.stopped:
                    await self._run_update()
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
        g = self._generations
        g[0], g[1], g[2] = g[1], g[2], g[0]
        g[2].clear()
        q = await self.node.find_peer(self.target, hash=False, nodes=self._closest)
        if self.stopped:
            return
        best = q.closest_replies[:3]
        relays: list[RelayInfo] = []
        relay_addresses: list[Address] = []
        if not self.node.firewalled:
            ra = self.node.remote_address()
            if ra:
                relay_addresses.append(ra)
        await asyncio.gather(*(self._commit(r, relays, relay_addresses) for r in best), return_exceptions=True)
        if self.stopped:
            return
        self._closest = q.closest_nodes
        self.relays = relays
        self.relay_addresses = relay_addresses
        self.rounds += 1
        if relays:
            self.node.last_announce = time.time()
        log.info("announced %s to %d nodes", self.target.hex()[:16], len(relays))
        removed = [a for k, a in g[1].items() if k not in g[2]]
        await self._unannounce_all(removed)

    async def _commit(self, reply: Reply, relays: list[RelayInfo], relay_addresses: list[Address]) -> None:
        if reply.token is None or reply.peer.id is None:
            return
        token = reply.token
        res: Reply | None = None
        for _ in range(2):  # a token rotated away in flight gets one retry with the fresh one
            ann = sign_announce(self.key_pair, self.target, reply.peer.id, token)
            res = await self.node.request(
                reply.peer.address, Command.ANNOUNCE, target=self.target, token=token, value=ann.encode()
            )
            if res.error == ErrorCode.INVALID_TOKEN and res.token is not None:
                token = res.token
                continue
            break
        if res is None or res.error != 0:
            return
        addr = reply.peer.address
        if len(relay_addresses) < 3:
            relay_addresses.append(addr)
        relays.append(RelayInfo(addr, reply.to))
        self._generations[2][addr] = addr

    async def _unannounce_all(self, nodes: list[Address]) -> None:
        if nodes:
            await asyncio.gather(*(self._unannounce(n) for n in nodes), return_exceptions=True)

    async def _unannounce(self, to: Address) -> None:
        try:
            res = await self.node.request(to, Command.FIND_PEER, target=self.target)
            if res.token is None or res.peer.id is None or res.value is None:
                return
            unann = sign_announce(self.key_pair, self.target, res.peer.id, res.token, unannounce=True)
            await self.node.request(to, Command.UNANNOUNCE, target=self.target, token=res.token, value=unann.encode())
        except DHTError as e:
            log.debug("unannounce to %s failed: %s", to, e)
