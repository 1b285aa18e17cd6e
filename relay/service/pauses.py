"""How long the relay stops answering: garbage-collection pauses and event-loop stalls.

While the loop is stalled nobody reads the UDP socket, so its receive buffer fills and the kernel
drops what the peers keep sending; enough of that and control streams time out and take their
pairs with them. Full collections walk every live tracked object (tens per session and pair), so
with thousands of pairs they are the relay's longest pauses. `/stats` `pauses` reports the longest
of each so an operator can see the cause next to `socket.kernel_drops`.

`apply_gc_policy()` is the process's collection policy, applied once the relay listens (cli): everything
allocated during start-up (modules, the DHT's tables, the key material) lives for the whole run,
so it is moved out of the collector's reach (`gc.freeze`) and no full collection walks it again.
Objects made later (sessions, pairs) stay collectable: frozen objects are never freed, even if
they later become cyclic garbage, so per-connection state must never be frozen.
"""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING, Any

from relay.core import Driver, Loop

#: how often the stall watch expects to run; a stall is how late it ran
STALL_TICK = 0.05

#: the relay socket's receive buffer (asked; Linux grants and reports twice this): holds the
#: datagrams that arrive while the loop is stalled. With 4,000 relayed pairs the relay receives
#: ~6,000-9,000 datagrams a second and each takes 0.8-2.3 KB of buffer on arrival (its skb), so
#: 16 MiB asked (32 MiB granted) rides out a 2-3 s stall; 4 MiB lost 30,000-60,000 in one.
RELAY_RECEIVE_BUFFER = 16 << 20

#: collection thresholds: young collections every 20,000 net allocations instead of 700, so the
#: relay's short- and medium-lived objects (packets in flight, timers) die young instead of being
#: promoted to the old generation, whose growth is what triggers full collections
GC_THRESHOLDS = (20_000, 10, 10)


def apply_gc_policy() -> int:
    """Freeze the start-up heap out of every later collection and set GC_THRESHOLDS; returns how
    many objects were frozen. Collects first so no start-up garbage is frozen with it (frozen
    objects are never freed)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    return gc.get_freeze_count()


class Pauses:
    """Longest garbage-collection pause (by generation) and longest event-loop stall since start."""

    def __init__(self) -> None:
        self.gc_longest = [0.0, 0.0, 0.0]
        self.gc_count = [0, 0, 0]
        self.gc_seconds = 0.0
        self.stall_longest = 0.0
        self.stalls_over_1s = 0
        self._gc_started = 0.0
        #: when the stall watch is due next (None: not watching); run by a `Driver`
        self._due: float | None = None
        self._driver: Driver[None] | None = None

    def start(self, loop: Loop) -> None:
        if self._driver is not None:
            return
        gc.callbacks.append(self._on_gc)
        self._driver = Driver(self, loop)
        self._due = loop.time() + STALL_TICK
        self._driver.arm()

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.close()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # a pause inside one callback, often under a millisecond: finer than the loop's clock
        # (uvloop's counts whole milliseconds), and only a metric
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        gen = min(int(info.get("generation", 2)), 2)
        took = time.perf_counter() - self._gc_started
        self.gc_count[gen] += 1
        self.gc_seconds += took
        if took > self.gc_longest[gen]:
            self.gc_longest[gen] = took

    # the stall watch, a core of one deadline: how late the loop runs it is the stall

    def get_timer(self) -> float | None:
        return self._due

    def handle_timer(self, now: float) -> None:
        if self._due is None or now < self._due:
            return
        late = now - self._due
        if late > self.stall_longest:
            self.stall_longest = late
        if late >= 1.0:
            self.stalls_over_1s += 1
        self._due = now + STALL_TICK

    def snapshot(self) -> dict[str, Any]:
        """`/stats` `pauses`."""
        return {
            "loop_longest_stall_ms": round(self.stall_longest * 1000, 1),
            "loop_stalls_over_1s": self.stalls_over_1s,
            "gc_full_collections": self.gc_count[2],
            "gc_longest_full_ms": round(self.gc_longest[2] * 1000, 1),
            "gc_longest_young_ms": round(max(self.gc_longest[0], self.gc_longest[1]) * 1000, 1),
            "gc_seconds": round(self.gc_seconds, 3),
            "gc_frozen_objects": gc.get_freeze_count(),
            "gc_thresholds": list(gc.get_threshold()),
        }


if TYPE_CHECKING:
    from relay.core import TimedCore

    # mypy checks the core against relay.core's contract here (never run: the guard sees no asyncio)
    def _conforms(core: Pauses) -> TimedCore:
        return core
