"""What a persistent hyperdht node stores for others, sans-IO (`hyperdht/lib/persistent.js`).

Only a node that sends its id (persistent) gets storage traffic. This keeps announce
records, forward entries (where to relay handshakes for an announced key), mutable and
immutable values, in two-generation caches that forget what was neither written nor read
for one GC period (xache / record-cache: maxAge 20 min, GC every 2/3 of it). Every handler
takes the decoded request and returns what to answer — `Answer` or None for "drop
silently", which is what hyperdht does with invalid writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import nacl.bindings
import nacl.exceptions

from relay.encoding import Reader, Writer

from .messages import (
    NS_ANNOUNCE,
    NS_MUTABLE_PUT,
    NS_UNANNOUNCE,
    Address,
    Announce,
    Command,
    DHTError,
    ErrorCode,
    LookupReply,
    PeerRecord,
    announce_signable,
    hash32,
)

MAX_AGE = 20 * 60.0
MAX_SIZE = 65536
MAX_BUMP_DRIFT = 60.0
MAX_LOOKUP = 20

K = TypeVar("K")
V = TypeVar("V")


class _TwoGenerations:
    """What xache and record-cache share: a GC every 2/3 of `max_age`, counted from the
    first tick; `gc()` (each cache's own) ages one generation out."""

    def __init__(self, max_size: int, max_age: float) -> None:
        self.max_size = max_size
        self.max_age = max_age
        self._next_gc: float | None = None

    def tick(self, now: float) -> None:
        if self._next_gc is None:
            self._next_gc = now + self.max_age * 2 / 3
        elif now >= self._next_gc:
            self._next_gc = now + self.max_age * 2 / 3
            self.gc()

    def gc(self) -> None:
        raise NotImplementedError


class GenerationCache(_TwoGenerations, Generic[K, V]):
    """xache: entries live in `latest` until a GC moves them to `oldest`; the next GC
    drops what is still there. Reading moves an entry back to `latest`."""

    def __init__(self, max_size: int = MAX_SIZE, max_age: float = MAX_AGE) -> None:
        super().__init__(max_size, max_age)
        self.latest: dict[K, V] = {}
        self.oldest: dict[K, V] = {}
        self.retained: dict[K, V] = {}

    def gc(self) -> None:
        self.oldest = self.latest
        self.latest = {}

    def set(self, k: K, v: V) -> None:
        if k in self.retained:
            return
        self.latest[k] = v
        self.oldest.pop(k, None)
        if len(self.latest) >= self.max_size:
            self.gc()

    def retain(self, k: K, v: V) -> None:
        self.retained[k] = v
        self.latest.pop(k, None)
        self.oldest.pop(k, None)

    def get(self, k: K) -> V | None:
        if k in self.retained:
            return self.retained[k]
        if k in self.latest:
            return self.latest[k]
        if k in self.oldest:
            v = self.oldest.pop(k)
            self.latest[k] = v
            return v
        return None

    def delete(self, k: K) -> bool:
        return any(d.pop(k, None) is not None for d in (self.latest, self.oldest, self.retained))

    def __len__(self) -> int:
        return len(self.latest) + len(self.oldest) + len(self.retained)


class RecordCache(_TwoGenerations):
    """record-cache: per target, records keyed by public key, fresh and stale sets."""

    def __init__(self, max_size: int = MAX_SIZE, max_age: float = MAX_AGE) -> None:
        super().__init__(max_size, max_age)
        self.fresh: dict[bytes, dict[bytes, bytes]] = {}
        self.stale: dict[bytes, dict[bytes, bytes]] = {}

    def gc(self) -> None:
        self.stale = self.fresh
        self.fresh = {}

    def size(self) -> int:
        return sum(len(s) for s in self.fresh.values()) + sum(len(s) for s in self.stale.values())

    def add(self, name: bytes, key: bytes, record: bytes) -> None:
        self._remove_from(self.stale, name, key)
        self.fresh.setdefault(name, {})[key] = record
        if self.size() > self.max_size:
            self.gc()

    def remove(self, name: bytes, key: bytes) -> None:
        self._remove_from(self.fresh, name, key)
        self._remove_from(self.stale, name, key)

    @staticmethod
    def _remove_from(store: dict[bytes, dict[bytes, bytes]], name: bytes, key: bytes) -> None:
        s = store.get(name)
        if s is not None and s.pop(key, None) is not None and not s:
            del store[name]

    def get(self, name: bytes, n: int) -> list[bytes]:
        out = list(self.fresh.get(name, {}).values()) + list(self.stale.get(name, {}).values())
        return out[:n]


@dataclass(slots=True)
class Forward:
    """Router entry: where handshakes for an announced key go (the announcer's address)."""

    relay: Address | None
    record: bytes


@dataclass(slots=True)
class Answer:
    """How to answer: `value`, and dht-rpc reply options."""

    value: bytes | None = None
    error: int = 0
    token: bool = True
    closer_nodes: bool = True


@dataclass(slots=True)
class _Refresh:
    target: bytes
    record: bytes
    announce_self: bool


def _verify(signature: bytes | None, message: bytes, public_key: bytes) -> bool:
    if signature is None or len(signature) != 64 or len(public_key) != 32:
        return False
    try:
        nacl.bindings.crypto_sign_open(signature + message, public_key)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, ValueError):
        return False
    return True


def mutable_signable(seq: int, value: bytes) -> bytes:
    return NS_MUTABLE_PUT + hash32(Writer().uint(seq).buffer(value).getvalue())


class Persistent:
    """Storage commands of a persistent node. `forwards` is shared with the router."""

    def __init__(self, node_id: bytes, *, max_size: int = MAX_SIZE, max_age: float = MAX_AGE) -> None:
        self.node_id = node_id
        self.forwards: GenerationCache[bytes, Forward] = GenerationCache(max_size, max_age)
        self.records = RecordCache(max_size, max_age)
        self.bumps: GenerationCache[bytes, int] = GenerationCache(max_size, max_age)
        self.refreshes: GenerationCache[bytes, _Refresh] = GenerationCache(max_size, max_age)
        self.mutables: GenerationCache[bytes, bytes] = GenerationCache(max_size // 2, 48 * 3600.0)
        self.immutables: GenerationCache[bytes, bytes] = GenerationCache(max_size // 2, 48 * 3600.0)

    def caches(self) -> Iterator[_TwoGenerations]:
        yield from (self.forwards, self.records, self.bumps, self.refreshes, self.mutables, self.immutables)

    def tick(self, now: float) -> None:
        for c in self.caches():
            c.tick(now)

    def handle(
        self,
        command: int,
        target: bytes | None,
        token: bytes | None,
        value: bytes | None,
        src: Address,
        wall_clock: float,
    ) -> Answer | None:
        """Answer one storage command (token already checked by the RPC layer);
        `wall_clock` (unix seconds) bounds announce bumps, which are wall-clock ms."""
        if target is None:
            return None
        try:
            if command == Command.FIND_PEER:
                fwd = self.forwards.get(target)
                return Answer(fwd.record if fwd else None)
            if command == Command.LOOKUP:
                records = self.records.get(target, MAX_LOOKUP)
                fwd = self.forwards.get(target)
                if fwd is not None and len(records) < MAX_LOOKUP:
                    records.append(fwd.record)
                if not records:
                    return Answer(None)
                bump = self.bumps.get(target) or 0
                return Answer(_raw_lookup(records, bump))
            if command == Command.ANNOUNCE:
                return self._announce(target, token, value, src, wall_clock)
            if command == Command.UNANNOUNCE:
                return self._unannounce(target, token, value)
            if command == Command.MUTABLE_GET:
                if value is None:
                    return None
                seq = Reader(value).uint()
                stored = self.mutables.get(target)
                if stored is None:
                    return Answer(None)
                return Answer(None if Reader(stored).uint() < seq else stored)
            if command == Command.MUTABLE_PUT:
                return self._mutable_put(target, token, value)
            if command == Command.IMMUTABLE_GET:
                return Answer(self.immutables.get(target))
            if command == Command.IMMUTABLE_PUT:
                if token is None or value is None or hash32(value) != target:
                    return None
                self.immutables.set(target, value)
                return Answer(None)
        except (DHTError, ValueError, IndexError):  # DecodeError is a ValueError: malformed = drop
            return None
        return None

    def _announce(
        self, target: bytes, token: bytes | None, value: bytes | None, src: Address, wall_clock: float
    ) -> Answer | None:
        if token is None or value is None:
            return None
        ann = Announce.decode(value)
        if ann.peer is None:
            if ann.refresh is None:
                return None
            return self._refresh(ann.refresh, token, src)
        signable = announce_signable(target, self.node_id, token, ann.peer, ann.refresh, NS_ANNOUNCE)
        if not _verify(ann.signature, signable, ann.peer.public_key):
            return None
        peer = PeerRecord(ann.peer.public_key, ann.peer.relay_addresses[:3])
        record = peer.encode()
        announce_self = hash32(peer.public_key) == target
        if not announce_self:
            current = self.bumps.get(target) or 0
            if current < ann.bump <= (wall_clock + MAX_BUMP_DRIFT) * 1000:
                self.bumps.set(target, ann.bump)
        self._store(target, peer.public_key, record, announce_self, src)
        if ann.refresh is not None:
            self.refreshes.set(ann.refresh, _Refresh(target, record, announce_self))
        return Answer(None, token=False, closer_nodes=False)

    def _refresh(self, refresh: bytes, token: bytes, src: Address) -> Answer | None:
        active = hash32(refresh)
        r = self.refreshes.get(active)
        if r is None:
            return None
        self._store(r.target, r.record[:32], r.record, r.announce_self, src)
        self.refreshes.delete(active)
        self.refreshes.set(token, r)
        return Answer(None, token=False, closer_nodes=False)

    def _store(self, target: bytes, public_key: bytes, record: bytes, announce_self: bool, src: Address) -> None:
        """An announce of the key itself is a forward (handshakes for it go to `src`);
        any other is one more record under `target`."""
        if announce_self:
            self.forwards.set(target, Forward(src, record))
            self.records.remove(target, public_key)
        else:
            self.records.add(target, public_key, record)

    def _unannounce(self, target: bytes, token: bytes | None, value: bytes | None) -> Answer | None:
        if token is None or value is None:
            return None
        ann = Announce.decode(value)
        if ann.peer is None:
            return None
        signable = announce_signable(target, self.node_id, token, ann.peer, ann.refresh, NS_UNANNOUNCE)
        if not _verify(ann.signature, signable, ann.peer.public_key):
            return None
        if hash32(ann.peer.public_key) == target:
            self.forwards.delete(target)
        self.records.remove(target, ann.peer.public_key)
        return Answer(None, token=False, closer_nodes=False)

    def _mutable_put(self, target: bytes, token: bytes | None, value: bytes | None) -> Answer | None:
        if token is None or value is None:
            return None
        r = Reader(value)
        public_key, seq, data, signature = r.fixed32(), r.uint(), r.buffer(), r.fixed64()
        if hash32(public_key) != target or not data:
            return None
        if not _verify(signature, mutable_signable(seq, data), public_key):
            return None
        stored = self.mutables.get(target)
        if stored is not None:
            sr = Reader(stored)
            old_seq, old_value = sr.uint(), sr.buffer()
            if old_value and old_seq == seq and old_value != data:
                return Answer(error=ErrorCode.SEQ_REUSED, token=False)
            if seq < old_seq:
                return Answer(error=ErrorCode.SEQ_TOO_LOW, token=False)
        self.mutables.set(target, Writer().uint(seq).buffer(data).fixed64(signature).getvalue())
        return Answer(None)


def _raw_lookup(records: list[bytes], bump: int) -> bytes:
    w = Writer().uint(len(records))
    for rec in records:
        w.raw(rec)
    return w.uint(bump).getvalue()


__all__ = ["Answer", "Forward", "GenerationCache", "LookupReply", "Persistent", "RecordCache", "mutable_signable"]
