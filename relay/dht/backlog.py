"""Which handshake gets the CPU next: a bounded, fair, self-shedding backlog (sans-IO).

Answering a new PEER_HANDSHAKE costs a Noise IK decrypt and encrypt (~0.5-1 ms in Python), so
a flood of valid handshakes from a few dozen hosts outruns the event loop. Done inline in the
socket's read callback, that work let the kernel's receive queue (a 4 MB SO_RCVBUF) fill:
every datagram on the relay's one port - a newcomer's handshake, its PINGs, the relayed UDX
packets of live pairs - then waited 10-17 s behind the flood in one FIFO, and the kernel
dropped the rest. The runtime now only queues a new handshake here (cheap) and keeps reading;
it answers from the backlog in short slices between reads, in this order:

- the host (the client's address as the DHT node relaying the handshake saw it) served least
  recently wins: each host has a score of handshakes served, halving every `half_life`
  seconds, and the lowest score goes first, so a new address is answered before the backlog
  of busy ones, and busy hosts share what is left;
- within a host, oldest first;
- a handshake queued longer than `max_age` (2 s) is shed: its client's request (dht-rpc
  `lib/io.js`: 1 s per send, 3 retries, so ~4 s from the client's first send, which was
  before the announce holder relayed it to us) has given up or is about to, so answering it
  would only spend the CPU a fresher one needs (the client's connect tries again);
- at `max_items`, the newest entry of the host with the highest score is shed to make room;
- a handshake pushed with a `wait` (its address is over its rate, `relay.service.limits`) is
  held until then (at most `max_waiting` are held; more are refused), then queued like the
  rest; its age runs from when it arrived.

Entries are keyed by Noise message 1, so the copies relayed by other announce holders and the
client's retransmissions do not queue twice. Scores are kept in the log domain
(`log2(score) + now / half_life`), so decay needs no per-host timer and the order of hosts
never changes while time passes; a heap gives the next host in O(log n).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

T = TypeVar("T")

MAX_AGE = 2.0  # seconds a queued handshake stays worth answering (half the client's ~4 s request)
MAX_ITEMS = 512  # queued handshakes at most (each ~1 ms of CPU: half a second of work)
MAX_WAITING = 512  # handshakes held for their address's rate at most (a NAT's burst, spread out)
HALF_LIFE = 10.0  # seconds for a host's served score to halve
MAX_HOSTS = 4096  # hosts whose score is remembered (least recently served forgotten first)
# a held entry this close to its time counts as due: loop timers (uvloop's are whole
# milliseconds) may fire a little early, and re-arming for the rest would spin the loop
RELEASE_SLACK = 0.001

_NEW = -math.inf  # the log-domain score of a host never served (or long forgotten)


@dataclass(slots=True)
class _Entry(Generic[T]):
    key: bytes
    host: str
    item: T
    queued: float


class HandshakeBacklog(Generic[T]):
    """`push(key, host, item, now)` queues, `pop(now)` hands out the next item to answer;
    `get_timer()` / `handle_timer(now)` release held entries at their time (relay.core)."""

    def __init__(
        self,
        *,
        max_age: float = MAX_AGE,
        max_items: int = MAX_ITEMS,
        max_waiting: int = MAX_WAITING,
        half_life: float = HALF_LIFE,
        max_hosts: int = MAX_HOSTS,
    ) -> None:
        self.max_age = max_age
        self.max_items = max_items
        self.max_waiting = max_waiting
        self.half_life = half_life
        self.max_hosts = max_hosts
        self._queues: dict[str, deque[_Entry[T]]] = {}
        self._keys: dict[bytes, _Entry[T]] = {}
        self._scores: OrderedDict[str, float] = OrderedDict()  # host -> log-domain served score
        self._heap: list[tuple[float, int, str]] = []  # (score when scheduled, seq, host)
        self._sched: dict[str, int] = {}  # host -> seq of its one live heap entry
        self._seq = 0
        self._waiting: list[tuple[float, int, _Entry[T]]] = []  # (due, seq, entry), a heap
        self.stats = {"queued": 0, "served": 0, "duplicates": 0, "shed_stale": 0, "shed_full": 0, "waited": 0}

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: bytes) -> bool:
        return key in self._keys

    def get(self, key: bytes) -> T | None:
        """The queued item for `key`, if it is waiting."""
        e = self._keys.get(key)
        return None if e is None else e.item

    # ------------------------------------------------------------------ scores

    def score(self, host: str, now: float) -> float:
        """Handshakes served to `host`, decayed to `now` (0.0 for a host never served)."""
        s = self._scores.get(host, _NEW)
        return 0.0 if s == _NEW else 2.0 ** (s - now / self.half_life)

    def _served(self, host: str, now: float) -> None:
        s = math.log2(self.score(host, now) + 1.0) + now / self.half_life
        self._scores.pop(host, None)
        self._scores[host] = s
        if len(self._scores) > self.max_hosts:
            # forget the least recently served host that is not waiting (waiting hosts are
            # bounded by max_items, so this scan is short)
            for old in self._scores:
                if old not in self._queues and old != host:
                    del self._scores[old]
                    break

    def _schedule(self, host: str) -> None:
        """(Re)enter `host` in the heap with its current score; older entries become stale."""
        self._seq += 1
        self._sched[host] = self._seq
        heapq.heappush(self._heap, (self._scores.get(host, _NEW), self._seq, host))

    # ------------------------------------------------------------------ queue

    def push(self, key: bytes, host: str, item: T, now: float, wait: float = 0.0) -> bool:
        """Queue a handshake (held `wait` seconds first); False if it is a duplicate (a relayed
        copy, a retransmission) or the backlog is full and `host` is the heaviest waiting."""
        if key in self._keys:
            self.stats["duplicates"] += 1
            return False
        e = _Entry(key, host, item, now)
        if wait > 0.0:
            if len(self._waiting) >= self.max_waiting:
                self.stats["shed_full"] += 1
                return False
            self._seq += 1
            heapq.heappush(self._waiting, (now + wait, self._seq, e))
            self.stats["waited"] += 1
        elif not self._room_for(host, now):
            return False
        else:
            self._enqueue(e)
        self._keys[key] = e
        self.stats["queued"] += 1
        return True

    def _room_for(self, host: str, now: float) -> bool:
        """Whether one more entry of `host` may join the queues (shedding another to make room)."""
        if len(self._keys) - len(self._waiting) < self.max_items or self._shed_for(host, now):
            return True
        self.stats["shed_full"] += 1
        return False

    def _enqueue(self, e: _Entry[T]) -> None:
        q = self._queues.get(e.host)
        if q is None:
            q = self._queues[e.host] = deque()
            self._schedule(e.host)
        q.append(e)

    def _release(self, now: float) -> None:
        """Move the held entries whose time has come into their hosts' queues."""
        due = now + RELEASE_SLACK
        while self._waiting and self._waiting[0][0] <= due:
            e = self._waiting[0][2]
            room = self._room_for(e.host, now)  # while still held, `e` is not counted as queued
            heapq.heappop(self._waiting)
            if room:
                self._enqueue(e)
            else:
                del self._keys[e.key]

    def get_timer(self) -> float | None:
        """When the next held entry is due (the runtime arms its one timer for it), or None."""
        return self._waiting[0][0] if self._waiting else None

    def handle_timer(self, now: float) -> None:
        """Release the held entries due at `now` into their hosts' queues (`pop` hands them out)."""
        self._release(now)

    def ready(self, now: float) -> bool:
        """Whether `pop(now)` has something to hand out (or shed)."""
        self._release(now)
        return bool(self._queues)

    def _shed_for(self, newcomer: str, now: float) -> bool:
        """Full: drop the newest entry of the waiting host that was served most (and holds the
        most), unless that is the newcomer's own host. True if room was made."""
        if not self._queues:
            return False  # everything is held for its address's rate: the newcomer waits its turn too
        worst = max(self._queues, key=lambda h: (self.score(h, now), len(self._queues[h])))
        new = (self.score(newcomer, now), len(self._queues.get(newcomer, ())) + 1)
        if worst == newcomer or (self.score(worst, now), len(self._queues[worst])) <= new:
            return False
        self._remove_newest(worst)
        self.stats["shed_full"] += 1
        return True

    def _remove_newest(self, host: str) -> None:
        q = self._queues[host]
        e = q.pop()
        del self._keys[e.key]
        if not q:
            del self._queues[host]
            self._sched.pop(host, None)

    def pop(self, now: float) -> T | None:
        """The next handshake to answer (stale ones shed on the way), or None when empty."""
        self._release(now)
        while self._heap:
            _, seq, host = heapq.heappop(self._heap)
            if self._sched.get(host) != seq:
                continue  # stale: the host was served, emptied or re-entered since
            q = self._queues[host]
            e = q.popleft()
            del self._keys[e.key]
            fresh = now - e.queued <= self.max_age
            if fresh:
                self._served(host, now)
                self.stats["served"] += 1
            else:
                self.stats["shed_stale"] += 1
            if q:
                self._schedule(host)
            else:
                del self._queues[host]
                del self._sched[host]
            if fresh:
                return e.item
        return None

    def expire(self, now: float) -> int:
        """Shed every entry queued longer than `max_age`; how many."""
        n = 0
        for host in list(self._queues):
            q = self._queues[host]
            while q and now - q[0].queued > self.max_age:
                del self._keys[q.popleft().key]
                n += 1
            if not q:
                del self._queues[host]
                del self._sched[host]
        self.stats["shed_stale"] += n
        return n

    def oldest(self) -> float | None:
        """When the oldest queued entry was queued (for the runtime's expiry timer)."""
        return min((q[0].queued for q in self._queues.values()), default=None)

    def clear(self) -> list[T]:
        items = [e.item for e in self._keys.values()]
        self._queues.clear()
        self._keys.clear()
        self._heap.clear()
        self._sched.clear()
        self._waiting.clear()
        return items


if TYPE_CHECKING:
    from relay.core import TimedCore

    # mypy checks the core against relay.core's contract here (never run: the guard sees no asyncio)
    def _conforms(core: HandshakeBacklog[object]) -> TimedCore:
        return core
