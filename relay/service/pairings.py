"""The relay's record of its pairings: who paired, when, and what each side sent.

The relay's totals (sessions opened, bytes relayed) move for any traffic; a verdict about one
job needs that job's own pairing. So the relay keeps the last `capacity` pairings, each with
when it opened (matched) and closed, both peers' public keys, the bytes and packets each side
sent through the relay (kernel-forwarded ones included), and when the relay first saw each
peer's key. `GET /pairings` on the metrics port serves `PairingLog.as_json()`.

The shape (all times are wall-clock seconds since the epoch, floats):

    {
      "relay_key": "<z32>",              # the relay's own key
      "started_at": 1764765000.5,         # when this relay process started: a restart resets all
      "capacity": 1024,                   # records kept; older ones are evicted
      "recorded": 1530,                   # pairings recorded since start (ids 1..recorded)
      "evicted": 506,                     # records dropped from the front (recorded - len(pairings))
      "keys_capacity": 8192,              # peer keys whose first sighting is remembered
      "keys_evicted": 0,                  # keys forgotten (a forgotten key seen again looks new)
      "keys_evicted_at": null,            # when a key was last forgotten (null: never)
      "pairings": [                       # oldest first
        {
          "id": 1025,                     # 1-based, in match order, unique per relay process
          "opened_at": 1764765100.25,     # when the pair matched (both sides present)
          "closed_at": null,              # null while either relay stream is open
          "peers": [                      # the initiator side first, then the other
            {
              "key": "<z32>",             # the peer's public key on its relay session
              "first_seen_at": 1764765099.9,   # the relay's first session from this key
              "seen_before": false,       # that first session is older than this pairing's session
              "bytes": 4096,              # UDX bytes this peer sent through the relay to the other
              "packets": 12
            },
            {...}
          ]
        }
      ]
    }

Bytes of an open pairing are read live from its relay streams; a closed one keeps the last
reading. Memory: a record is two peers and a few numbers (see `docs/relay.md`), the key
table a dict entry per key; both are bounded.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

DEFAULT_CAPACITY = 1024
DEFAULT_KEYS_CAPACITY = 8192


class RelayedCounts(Protocol):
    """What a relay stream says about the traffic it passed on (UDXStream has these)."""

    @property
    def relayed_bytes(self) -> int: ...

    @property
    def relayed_packets(self) -> int: ...


class Sighting(NamedTuple):
    """A session accepted from `key` at `at`; the relay first saw the key at `first_seen_at`."""

    key: str
    first_seen_at: float
    at: float


@dataclass(slots=True)
class PeerSide:
    """One side of a pairing: its key, when the relay first saw it, what it sent."""

    key: str
    first_seen_at: float
    seen_before: bool
    bytes: int = 0
    packets: int = 0
    #: the relay stream that receives this peer's datagrams, while the pairing is open
    stream: RelayedCounts | None = None

    def read(self) -> tuple[int, int]:
        s = self.stream
        if s is None:
            return self.bytes, self.packets
        return s.relayed_bytes, s.relayed_packets

    def as_json(self) -> dict[str, Any]:
        b, p = self.read()
        return {
            "key": self.key,
            "first_seen_at": self.first_seen_at,
            "seen_before": self.seen_before,
            "bytes": b,
            "packets": p,
        }


@dataclass(slots=True)
class PairingRecord:
    id: int
    opened_at: float
    peers: tuple[PeerSide, PeerSide]
    closed_at: float | None = None

    def close(self, at: float) -> None:
        """Keep the last byte counts and let go of the streams."""
        if self.closed_at is not None:
            return
        self.closed_at = at
        for p in self.peers:
            p.bytes, p.packets = p.read()
            p.stream = None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "opened_at": self.opened_at,
            "closed_at": self.closed_at,
            "peers": [p.as_json() for p in self.peers],
        }


class _KeyTable:
    """key -> when the relay first saw it, for at most `capacity` keys, the least recently seen
    forgotten first. Held in flat arrays made once (open addressing, tombstones, a queue of
    sightings read lazily for the LRU order): no Python object per key, so the keys a burst
    brings never pin the memory the burst took (one small long-lived object in each allocator
    arena kept ~50 MB of a 3,000-connection burst from going back). Keys are at most 63 bytes
    of UTF-8 (a z32 key is 52)."""

    SLOT = 64
    TOMB = 255

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.count = 0
        self._make(capacity)

    def _make(self, capacity: int) -> None:
        n = 8
        while 0.7 * n < capacity + 1:  # at most 70 % full, tombstones included (then rebuilt)
            n *= 2
        self._mask = n - 1
        self._keys = bytearray(n * self.SLOT)  # per slot: length byte (0 empty, 255 tombstone), key
        self._first = array("d", bytes(8 * n))
        self._tick = array("Q", bytes(8 * n))  # when each slot's key was last seen (a counter)
        self._tombs = 0
        self._clock = 0
        q = 2 * capacity + 4
        self._q_slot = array("q", bytes(8 * q))  # sightings in order; stale ones skipped
        self._q_tick = array("Q", bytes(8 * q))
        self._q_head = 0
        self._q_len = 0

    @staticmethod
    def _encode(key: str) -> bytes:
        kb = key.encode()
        if len(kb) >= _KeyTable.SLOT:
            raise ValueError(f"peer key {key[:16]!r}... is longer than {_KeyTable.SLOT - 1} bytes")
        return bytes((len(kb),)) + kb

    def _find(self, rec: bytes) -> tuple[int, int]:
        """(slot holding `rec` or -1, where it would go: the first tombstone or empty slot)."""
        keys, mask, size = self._keys, self._mask, self.SLOT
        i = hash(rec) & mask
        free = -1
        while True:
            off = i * size
            n = keys[off]
            if n == 0:
                return -1, (free if free >= 0 else i)
            if n == self.TOMB:
                if free < 0:
                    free = i
            elif keys[off : off + 1 + n] == rec:
                return i, i
            i = (i + 1) & mask

    def get(self, key: str) -> float | None:
        slot, _ = self._find(self._encode(key))
        return self._first[slot] if slot >= 0 else None

    def saw(self, key: str, now: float) -> tuple[float | None, bool]:
        """(the key's first sighting before now or None if new, whether a key was forgotten)."""
        rec = self._encode(key)
        slot, free = self._find(rec)
        self._clock += 1
        if slot >= 0:
            self._tick[slot] = self._clock
            self._push(slot)
            return self._first[slot], False
        forgot = False
        if self.count >= self.capacity:
            self._evict()
            forgot = True
            _, free = self._find(rec)
        off = free * self.SLOT
        if self._keys[off] == self.TOMB:
            self._tombs -= 1
        self._keys[off : off + len(rec)] = rec
        self._first[free] = now
        self._tick[free] = self._clock
        self.count += 1
        self._push(free)
        if self.count + self._tombs > 0.7 * (self._mask + 1):
            self._rebuild()
        return None, forgot

    def _live(self, slot: int, tick: int) -> bool:
        n = self._keys[slot * self.SLOT]
        return n not in (0, self.TOMB) and self._tick[slot] == tick

    def _entries(self) -> list[tuple[int, int]]:
        """The live sightings, least recent first: one per key."""
        q = len(self._q_slot)
        out = []
        for k in range(self._q_len):
            j = (self._q_head + k) % q
            slot, tick = self._q_slot[j], self._q_tick[j]
            if self._live(slot, tick):
                out.append((slot, tick))
        return out

    def _push(self, slot: int) -> None:
        q = len(self._q_slot)
        if self._q_len == q:  # full of stale sightings: keep the live ones, in order
            live = self._entries()
            for k, (s, t) in enumerate(live):
                self._q_slot[k], self._q_tick[k] = s, t
            self._q_head, self._q_len = 0, len(live)
        j = (self._q_head + self._q_len) % q
        self._q_slot[j], self._q_tick[j] = slot, self._clock
        self._q_len += 1

    def _evict(self) -> None:
        q = len(self._q_slot)
        while self._q_len:
            slot, tick = self._q_slot[self._q_head], self._q_tick[self._q_head]
            self._q_head = (self._q_head + 1) % q
            self._q_len -= 1
            if self._live(slot, tick):
                self._keys[slot * self.SLOT] = self.TOMB
                self._tombs += 1
                self.count -= 1
                return

    def _rebuild(self) -> None:
        """Too many tombstones: the live keys into fresh arrays, LRU order kept."""
        live = [
            (bytes(self._keys[s * self.SLOT : s * self.SLOT + 1 + self._keys[s * self.SLOT]]), self._first[s])
            for s, _ in self._entries()
        ]
        self._make(self.capacity)
        self.count = 0
        for rec, first in live:
            _, free = self._find(rec)
            self._keys[free * self.SLOT : free * self.SLOT + len(rec)] = rec
            self._first[free] = first
            self._clock += 1
            self._tick[free] = self._clock
            self.count += 1
            self._push(free)


class _Ring:
    """The last `capacity` pairings once closed, in flat arrays made once (see `_KeyTable` for
    why): record `id` lives in slot (id - 1) % capacity."""

    def __init__(self, capacity: int) -> None:
        n = max(1, capacity)
        self.capacity = capacity
        self.ids = array("Q", bytes(8 * n))
        self.opened = array("d", bytes(8 * n))
        self.closed = array("d", bytes(8 * n))
        self.keys = bytearray(2 * n * _KeyTable.SLOT)
        self.first = array("d", bytes(16 * n))
        self.before = bytearray(2 * n)
        self.bytes = array("Q", bytes(16 * n))
        self.packets = array("Q", bytes(16 * n))

    def put(self, rec: PairingRecord) -> None:
        i = (rec.id - 1) % self.capacity
        self.ids[i] = rec.id
        self.opened[i] = rec.opened_at
        self.closed[i] = rec.closed_at if rec.closed_at is not None else float("nan")
        for k, side in enumerate(rec.peers):
            j = 2 * i + k
            b, p = side.read()
            kb = _KeyTable._encode(side.key)
            self.keys[j * _KeyTable.SLOT : j * _KeyTable.SLOT + len(kb)] = kb
            self.first[j], self.before[j] = side.first_seen_at, side.seen_before
            self.bytes[j], self.packets[j] = b, p

    def as_json(self, rid: int) -> dict[str, Any]:
        i = (rid - 1) % self.capacity
        closed = self.closed[i]
        peers = []
        for j in (2 * i, 2 * i + 1):
            off = j * _KeyTable.SLOT
            peers.append(
                {
                    "key": self.keys[off + 1 : off + 1 + self.keys[off]].decode(),
                    "first_seen_at": self.first[j],
                    "seen_before": bool(self.before[j]),
                    "bytes": self.bytes[j],
                    "packets": self.packets[j],
                }
            )
        return {
            "id": rid,
            "opened_at": self.opened[i],
            "closed_at": None if closed != closed else closed,
            "peers": peers,
        }


class PairingLog:
    """The last `capacity` pairings and the first sighting of each peer key (both bounded).

    An open pairing is a `PairingRecord` (its bytes read live from its streams); once closed it
    is kept only in flat arrays made at start, as is the key table, so what the record keeps
    never holds on to the memory of a burst that has passed."""

    def __init__(
        self,
        relay_key: str,
        *,
        capacity: int = DEFAULT_CAPACITY,
        keys_capacity: int = DEFAULT_KEYS_CAPACITY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.relay_key = relay_key
        self.capacity = capacity
        self.keys_capacity = keys_capacity
        self._clock = clock
        self.started_at = clock()
        self.recorded = 0
        self.evicted = 0
        self._open: dict[int, PairingRecord] = {}
        self._ring = _Ring(capacity)
        self._keys = _KeyTable(keys_capacity)
        self.keys_evicted = 0
        self.keys_evicted_at: float | None = None

    def saw_key(self, key: str) -> Sighting:
        """A session from `key` was accepted now: when that was, and when the relay first saw
        the key (the same instant for a key new to it). Keep it with the session for `open`."""
        now = self._clock()
        first, forgot = self._keys.saw(key, now)
        if forgot:
            self.keys_evicted += 1
            self.keys_evicted_at = now
        return Sighting(key, now if first is None else first, now)

    def first_seen(self, key: str) -> float | None:
        return self._keys.get(key)

    @property
    def kept(self) -> int:
        """Pairings in the record now."""
        return min(self.recorded, self.capacity)

    def open(
        self, sides: tuple[tuple[Sighting, RelayedCounts | None], tuple[Sighting, RelayedCounts | None]]
    ) -> PairingRecord:
        """A pair matched. Each side: the sighting its session got from `saw_key` and the relay
        stream that receives its datagrams. `seen_before`: the key's first sighting is older than
        that session."""
        now = self._clock()
        peers = [PeerSide(s.key, s.first_seen_at, s.first_seen_at < s.at, stream=stream) for s, stream in sides]
        self.recorded += 1
        rec = PairingRecord(self.recorded, now, (peers[0], peers[1]))
        gone = self.recorded - self.capacity
        if gone >= 1:
            self.evicted += 1
            old = self._open.pop(gone, None)
            if old is not None:
                old.close(now)
        if self.capacity > 0:
            self._open[rec.id] = rec
            self._ring.put(rec)
        return rec

    def close(self, rec: PairingRecord) -> None:
        rec.close(self._clock())
        if self._open.pop(rec.id, None) is not None:
            self._ring.put(rec)  # its final counts; the object goes with its pair

    def as_json(self) -> dict[str, Any]:
        first = self.recorded - self.kept + 1
        pairings = []
        for rid in range(first, self.recorded + 1):
            rec = self._open.get(rid)
            pairings.append(rec.as_json() if rec is not None else self._ring.as_json(rid))
        return {
            "relay_key": self.relay_key,
            "started_at": self.started_at,
            "capacity": self.capacity,
            "recorded": self.recorded,
            "evicted": self.evicted,
            "keys_capacity": self.keys_capacity,
            "keys_evicted": self.keys_evicted,
            "keys_evicted_at": self.keys_evicted_at,
            "pairings": pairings,
        }
