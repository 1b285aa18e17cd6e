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
from collections import OrderedDict, deque
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


class PairingLog:
    """The last `capacity` pairings and the first sighting of each peer key (both bounded)."""

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
        self.records: deque[PairingRecord] = deque()
        self.recorded = 0
        self.evicted = 0
        #: key -> wall time of the relay's first session from it, least recently seen first
        self._first_seen: OrderedDict[str, float] = OrderedDict()
        self.keys_evicted = 0
        self.keys_evicted_at: float | None = None

    def saw_key(self, key: str) -> Sighting:
        """A session from `key` was accepted now: when that was, and when the relay first saw
        the key (the same instant for a key new to it). Keep it with the session for `open`."""
        now = self._clock()
        first = self._first_seen.get(key)
        if first is not None:
            self._first_seen.move_to_end(key)
            return Sighting(key, first, now)
        self._first_seen[key] = now
        if len(self._first_seen) > self.keys_capacity:
            self._first_seen.popitem(last=False)
            self.keys_evicted += 1
            self.keys_evicted_at = now
        return Sighting(key, now, now)

    def first_seen(self, key: str) -> float | None:
        return self._first_seen.get(key)

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
        self.records.append(rec)
        if len(self.records) > self.capacity:
            old = self.records.popleft()
            old.close(old.closed_at or now)
            self.evicted += 1
        return rec

    def close(self, rec: PairingRecord) -> None:
        rec.close(self._clock())

    def as_json(self) -> dict[str, Any]:
        return {
            "relay_key": self.relay_key,
            "started_at": self.started_at,
            "capacity": self.capacity,
            "recorded": self.recorded,
            "evicted": self.evicted,
            "keys_capacity": self.keys_capacity,
            "keys_evicted": self.keys_evicted,
            "keys_evicted_at": self.keys_evicted_at,
            "pairings": [r.as_json() for r in self.records],
        }
