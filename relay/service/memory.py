"""The memory budget: the caps derive from it, admission checks the process's own RSS against it,
and memory a burst took is handed back once the burst is over.

The operator page promises "the relay uses up to 200 MB of RAM". Counting objects alone cannot
keep that promise (allocator overhead, buffers and fragmentation are outside any sum), so the
budget is enforced twice: the session, pair and pending caps derive from it with per-object costs
measured on the relay's real objects (`benchmarks/relay_costs.py` re-measures them and
`tests/unit/test_relay_costs.py` fails if one outgrows its figure here), and every admission
reads the process's resident set (`/proc/self/statm`, one `pread`, ~2 us). While the RSS plus what
the objects already held may still grow by (`MemoryBudget.reserve`) passes the budget, the relay
is *full*: it admits a newcomer only in place of something that carries no traffic, as at its
caps, and refuses it (counted) when nothing may go. A pair that carries traffic is never shed.

After a burst RSS stays at the burst's peak unless the relay hands memory back. CPython's
small-object allocator frees a 1 MiB arena only when nothing in it is alive, and a few hundred
objects that outlive a burst (the event loop's handle free lists, a stream left in the send
vector's slots) keep nearly every arena it filled: 3,000 connections left 120 MB behind. So the
relay runs on glibc's malloc (`run_on_malloc`: `PYTHONMALLOC=malloc`, set by re-running the
program at start), where `malloc_trim(0)` returns any free 4 KiB page, anywhere in the heap.
`MemoryWatch` notices when what the relay holds has fallen well below its high-water mark, then
collects garbage (the relay's collection thresholds are high: an idle relay allocates too little
to trigger one), a few hundred sessions at a time while the fall goes on, and once it is over
drops what still points at closed streams and trims. A closed session itself leaves no cycles (its
stream, transport and secret stream drop their hooks on close), so these collections find little
and cost the walk over what is still alive.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("relay")

MB = 2**20
#: the operator page's figure
DEFAULT_BUDGET = 200 * MB
#: below this an idle relay (~45 MB), the admission margin and a few connections do not fit
MIN_BUDGET = 80 * MB

#: Out-of-order bytes a session's control stream may hold (payload + 128 B per packet). Its
#: blind-relay messages are ~40-byte frames, so 1 KiB still parks ~6 of them behind a lost
#: packet, while 8,192 sessions parking all they may cost 8 MiB (at 256 KiB it was 1 GiB: the
#: combined attack at the default caps reached 506 MB; at 4 KiB, 32 MiB of the 200 MB budget at
#: 8,192 sessions). A packet over it is dropped and counted (`dropped{reorder_limit}`); the peer
#: retransmits it.
CONTROL_REORDER_BYTES = 1024

# Per-object costs (bytes traced by tracemalloc on the relay's real objects, rounded up;
# `benchmarks/relay_costs.py` measures them, `tests/unit/test_relay_costs.py` keeps them true).
#: a session: control UDX stream, secret stream, protomux, blind-relay state, its key's sighting
SESSION_BYTES = 8_700
#: an active pair: two relay UDX streams, their links and hooks, its entry in the pairing record
PAIR_BYTES = 5_700
#: a pending pairing token
PENDING_BYTES = 420
#: the pairing record when full (1,024 pairings, 8,192 keys' first sightings)
RECORD_BYTES = int(1.95 * MB)
#: what the relay process holds before any peer (RSS of an idle relay joined to a testnet:
#: 42-45 MB on Python 3.11 + uvloop), rounded up
IDLE_RSS = 48 * MB
#: RSS grows more than tracemalloc counts for small objects (pymalloc arenas, fragmentation): the
#: combined attack at the default caps grew RSS by 93 MB while holding what these costs put at
#: 81.5 MB traced, 1.14 RSS bytes per traced byte; rounded up
RSS_PER_TRACED_BYTE = 1.25
#: ... and for the big buffers (reordered payloads, incomplete frames, early packets: malloc'd
#: blocks of ~1-4 KiB, held whole): malloc's headers and a bytearray's over-allocation
RSS_PER_BUFFER_BYTE = 1.1
#: share of the budget the caps may plan for; the rest absorbs what no count sees
CAPS_SHARE = 0.95
#: headroom the admission check keeps beyond the held objects' own growth while the caps derive
#: from the budget (they already keep the modelled worst case within CAPS_SHARE of it): this
#: share of the budget, at least BASE_MARGIN_MIN
BASE_MARGIN_SHARE = 0.02
BASE_MARGIN_MIN = 4 * MB
#: ... and while a cap is set above what the budget derives, so RSS alone holds it: under a sustained
#: churn at a full relay (newcomers taking shed holders' places) RSS overshot the admission
#: limit by 15-28 MB at 64 and 100 MB budgets (what was shed waits for a
#: collection before its memory can be reused, and the allocator's pools fragment), so: this
#: share of the budget, at least MARGIN_MIN
MARGIN_SHARE = 0.12
MARGIN_MIN = 24 * MB
#: the caps are rounded down to a multiple of this many relayed connections
CAPS_STEP = 256
#: the pending cap is twice the pair cap (each relayed connection pairs once from each side), at most
MAX_PENDING_CAP = 8192


def session_buffer_bytes(max_control_frame: int) -> float:
    """RSS one session's bounded buffers may take: its out-of-order budget and an incomplete frame."""
    return (CONTROL_REORDER_BYTES + max_control_frame + 3) * RSS_PER_BUFFER_BYTE


def early_bytes() -> float:
    """RSS the relay streams' shared early-packet budget may take (payload + per-packet overhead)."""
    from relay.udx.stream import REORDER_OVERHEAD
    from relay.udx.udxstream import EARLY_BYTES_TOTAL  # the UDX runtime only when the relay runs

    return EARLY_BYTES_TOTAL * (1 + REORDER_OVERHEAD / 1200) * RSS_PER_BUFFER_BYTE


def connection_bytes(max_control_frame: int = 1024) -> float:
    """RSS one relayed connection may hold at worst: two sessions (hyperdht's client and server
    each open one to the relay), each with its full buffers, and one active pair."""
    return (2 * SESSION_BYTES + PAIR_BYTES) * RSS_PER_TRACED_BYTE + 2 * session_buffer_bytes(max_control_frame)


def fixed_bytes() -> float:
    """RSS the relay holds whatever its load: the idle process, early packets, a full record."""
    return IDLE_RSS + early_bytes() + RECORD_BYTES * RSS_PER_TRACED_BYTE


@dataclass(frozen=True)
class Caps:
    max_sessions: int
    max_active_pairs: int
    max_pending_total: int


def caps_for_budget(budget: int, max_control_frame: int = 1024) -> Caps:
    """The session, pair and pending caps whose worst case, all held at once with full buffers
    beside the idle relay, fits `CAPS_SHARE` of `budget`. 200 MB gives 4,096 relayed
    connections (8,192 sessions, 8,192 pending tokens)."""
    room = CAPS_SHARE * budget - fixed_bytes()
    per = connection_bytes(max_control_frame) + 2 * PENDING_BYTES * RSS_PER_TRACED_BYTE
    pairs = max(0, int(room // per))
    pairs = max(16, pairs - pairs % CAPS_STEP if pairs >= CAPS_STEP else pairs)
    return Caps(2 * pairs, pairs, min(MAX_PENDING_CAP, 2 * pairs))


def caps_beyond(budget: int, max_sessions: int, max_active_pairs: int, max_pending_total: int, frame: int) -> bool:
    """Whether any cap lets the relay hold more than the budget's own caps would."""
    c = caps_for_budget(budget, frame)
    given = (max_sessions, max_active_pairs, max_pending_total)
    return any(g > d for g, d in zip(given, (c.max_sessions, c.max_active_pairs, c.max_pending_total), strict=True))


def smallest_budget_for(pairs: int, max_control_frame: int = 1024) -> int:
    """The budget in MB whose caps reach `pairs` relayed connections (for an error message)."""
    per = connection_bytes(max_control_frame) + 2 * PENDING_BYTES * RSS_PER_TRACED_BYTE
    return int((fixed_bytes() + pairs * per) / CAPS_SHARE // MB) + 1


class MemoryBudget:
    """Whether the relay is full at a given RSS: sans-IO, numbers in and a verdict out.
    `caps_beyond_budget`: a cap was set above what the budget derives, so the wider margin."""

    def __init__(self, budget: int, max_control_frame: int = 1024, *, caps_beyond_budget: bool = False) -> None:
        self.budget = budget
        self.per_session = session_buffer_bytes(max_control_frame)
        if caps_beyond_budget:
            self.margin = max(MARGIN_MIN, MARGIN_SHARE * budget)
        else:
            self.margin = max(BASE_MARGIN_MIN, BASE_MARGIN_SHARE * budget)
        self.early = early_bytes()

    def reserve(self, sessions: int) -> float:
        """What the objects held now may still grow by without any newcomer (every session
        filling its bounded buffers, the early-packet budget filling), plus the margin."""
        return sessions * self.per_session + self.early + self.margin

    def limit(self, sessions: int) -> int:
        """The RSS at which the relay is full while holding `sessions` sessions."""
        return int(self.budget - self.reserve(sessions))

    def full(self, rss: int, sessions: int) -> bool:
        return rss > self.limit(sessions)


class ResidentSet:
    """The process's resident set size from `/proc/self/statm` (one pread; psutil as a fallback)."""

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._fd: int | None = None
        with contextlib.suppress(OSError):
            self._fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)

    def __call__(self) -> int:
        if self._fd is not None:
            with contextlib.suppress(OSError, ValueError, IndexError):
                return int(os.pread(self._fd, 128, 0).split()[1]) * self._page
        import psutil

        return int(psutil.Process().memory_info().rss)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


class EmbeddedResidentSet(ResidentSet):
    """For a relay made inside a process that holds other things (a test run, a benchmark): what the
    process grew by since the relay was made, on top of an idle relay's resident set. The
    `blind-relay` process itself counts its whole RSS, which is what the operator's budget is."""

    def __init__(self) -> None:
        super().__init__()
        self._start = super().__call__()

    def __call__(self) -> int:
        return IDLE_RSS + max(0, super().__call__() - self._start)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None (another libc: freed pages go back as that allocator decides)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


#: the allocator the relay runs on (`run_on_malloc`); an operator's own PYTHONMALLOC is kept
ALLOCATOR = "malloc"


def allocator_environment(environ: Mapping[str, str]) -> dict[str, str] | None:
    """The environment to re-run the relay in so that what a burst frees can go back to the
    system, or None to run on as it is: the allocator was chosen already (PYTHONMALLOC set by the
    operator, or by this re-run), or there is no glibc `malloc_trim` to hand pages back with."""
    if "PYTHONMALLOC" in environ or _malloc_trim() is None:
        return None
    return {**environ, "PYTHONMALLOC": ALLOCATOR}


def run_on_malloc() -> None:
    """Re-run this program (same process id, arguments and descriptors) on glibc's malloc; returns
    only when it runs on it already or cannot be re-run. Before anything is read or bound."""
    env = allocator_environment(os.environ)
    if env is None or not sys.executable or not getattr(sys, "orig_argv", None):
        return
    with contextlib.suppress(OSError):
        os.execve(sys.executable, sys.orig_argv, env)


def allocator() -> str:
    """What `/stats` `memory.allocator` says: the allocator Python's objects come from."""
    return os.environ.get("PYTHONMALLOC") or "pymalloc"


#: a trim is due once what the relay holds fell below this share of its high-water mark ...
TRIM_FALL = 0.25
#: ... by at least this many sessions (a handful coming and going is not a burst) ...
TRIM_MIN_SESSIONS = 256
#: ... and runs this many seconds after the last such fall (a burst ends over a few seconds)
TRIM_DELAY = 2.0
#: once sessions fell below TRIM_FALL of their high-water mark, garbage is collected each time this
#: many more have closed, so that one collection frees what a few hundred closed sessions may have
#: left in cycles (2-3 us an object), not all the rest of a fall's
COLLECT_STEP = 256
#: ... this long after the step was reached (closes come in runs: one collection for a run)
COLLECT_STEP_DELAY = 0.1
#: RSS readings for the admission verdict are at most this old while messages flow
READ_EVERY = 0.05
#: while full, RSS growing by this much lowers the mark to what the relay holds then
MARK_GROWTH = 1 * MB
#: while full, garbage is collected at most this often (and at most a tenth of the time)
COLLECT_EVERY = 0.2
#: the "budget reached" warning at most this often
SAY_EVERY = 60.0


def held_bytes(sessions: int, pairs: int, pending: int) -> float:
    """The objects' share of RSS the relay holds (the budget's per-object figures)."""
    return (sessions * SESSION_BYTES + pairs * PAIR_BYTES + pending * PENDING_BYTES) * RSS_PER_TRACED_BYTE


class MemoryWatch:
    """The relay's side of the budget: reads RSS at admission, says full or not, counts what was
    refused for memory, and trims after a burst. Its only timer is the one-shot trim."""

    def __init__(
        self,
        budget: MemoryBudget,
        *,
        rss: Callable[[], int] | None = None,
        release: Callable[[], None] | None = None,
    ) -> None:
        """`release`: called before a trim's collection to drop what still points at closed
        sessions and streams (the relay's send vectors, its emptied tables)."""
        self.budget = budget
        self.rss = rss or ResidentSet()
        self.release = release
        self._trim_fn = _malloc_trim()
        self.last_rss = 0
        self.last_read = float("-inf")
        self.full = False
        self.full_since: float | None = None
        self.times_full = 0
        self.refused_sessions = 0
        self.peak_rss = 0
        self.high_sessions = 0
        #: sessions held at the last collection of a fall (or since: the most held after it)
        self.collected_at = 0
        self.sessions = 0
        self._step_handle: Any = None
        self.step_collections = 0
        self.longest_pause = 0.0
        self.trims = 0
        self.trimmed_bytes = 0
        self.last_trim: dict[str, Any] | None = None
        self._trim_handle: Any = None
        self.mark: float | None = None
        self.mark_rss = 0
        self.last_collect = float("-inf")
        self.collect_every = COLLECT_EVERY
        self.collections = 0
        self.collected = 0
        self.last_said = float("-inf")

    def check(self, now: float, sessions: int, held: float = 0.0, *, fresh: bool = True) -> bool:
        """Whether the relay is full, holding `sessions` sessions and objects estimated at
        `held` bytes (`held_bytes`). Reads RSS unless `fresh` is False and the last reading is
        younger than READ_EVERY.

        RSS over the admission limit is not enough: memory freed inside the process (shed or
        closed sessions) is reused by newcomers without the RSS growing, and the allocator
        rarely hands it back. So when RSS first passes the limit the relay marks what it held;
        while RSS stays over it, it is full only when it holds at least that much again, and the
        mark comes down to what it holds whenever RSS grows further. While full, cyclic garbage
        (what was shed) is collected, at most once every `collect_every` seconds, so its memory
        is free for reuse before it is relied on."""
        if self.mark is not None and now - self.last_collect >= self.collect_every:
            self._collect(now)
            fresh = True
        if fresh or now - self.last_read >= READ_EVERY:
            self.last_rss = self.rss()
            self.last_read = now
            if self.last_rss > self.peak_rss:
                self.peak_rss = self.last_rss
        if not self.budget.full(self.last_rss, sessions):
            self.mark = None
            self.full_since = None
            full = False
        else:
            if self.mark is None:  # a new episode: RSS passed the admission limit
                self.times_full += 1
                self.full_since = now
                if self.times_full == 1 or now - self.last_said >= SAY_EVERY:
                    self.last_said = now
                    log.warning(
                        "memory budget reached: newcomers only in place of idle holders, else refused",
                        extra={"rss": self.last_rss, "budget": self.budget.budget, "sessions": sessions},
                    )
            if self.mark is None or self.last_rss > self.mark_rss + MARK_GROWTH:
                self.mark = held if self.mark is None else min(self.mark, held)
                self.mark_rss = self.last_rss
            full = held >= self.mark
        self.full = full
        return full

    def _collect(self, now: float) -> None:
        t0 = time.perf_counter()
        self.collected += gc.collect()
        took = time.perf_counter() - t0
        self.collections += 1
        self.last_collect = now
        # at most a tenth of the time in collections, however many objects are left
        self.collect_every = max(COLLECT_EVERY, 10 * took)

    def held(self, sessions: int, schedule: Callable[[float, Callable[[], None]], Any]) -> None:
        """What the relay holds now (sessions). After a large fall from the high-water mark a trim
        is scheduled (`schedule(delay, fn)`, the relay's `after`), pushed back while the fall goes
        on, and meanwhile a collection each COLLECT_STEP more sessions gone."""
        self.sessions = sessions
        if sessions > self.collected_at:
            self.collected_at = sessions
        if sessions > self.high_sessions:
            self.high_sessions = sessions
            return
        fell = self.high_sessions - sessions
        low = fell >= TRIM_MIN_SESSIONS and sessions <= TRIM_FALL * self.high_sessions
        # a step only once the relay holds little: a collection walks every live object too
        # (~1 s with 6,000 sessions held), and a busy relay is not paused for one
        if low and self.collected_at - sessions >= COLLECT_STEP and self._step_handle is None:
            self._step_handle = schedule(COLLECT_STEP_DELAY, self._step)
        if low:
            if self._trim_handle is not None:
                self._trim_handle.cancel()
            self._trim_handle = schedule(TRIM_DELAY, self._trim_now)

    def _paused(self, seconds: float) -> None:
        if seconds > self.longest_pause:
            self.longest_pause = seconds

    def _step(self) -> None:
        """One step of a fall: collect what the sessions closed since the last step left."""
        self._step_handle = None
        self.collected_at = self.sessions
        t0 = time.perf_counter()
        gc.collect()
        self._paused(time.perf_counter() - t0)
        self.step_collections += 1

    def _trim_now(self) -> None:
        self._trim_handle = None
        self.trim()

    def trim(self) -> int:
        """Drop what points at closed streams, collect the cyclic garbage the last step left and
        hand free heap pages back; the bytes RSS fell by."""
        before = self.rss()
        if self._step_handle is not None:  # this collection is that step's too
            self._step_handle.cancel()
            self._step_handle = None
        t0 = time.perf_counter()
        if self.release is not None:
            self.release()
        collected = gc.collect()
        t1 = time.perf_counter()
        trimmed = bool(self._trim_fn(0)) if self._trim_fn is not None else False
        t2 = time.perf_counter()
        self._paused(t2 - t0)
        after = self.rss()
        self.last_rss = after
        self.high_sessions = self.collected_at = self.sessions  # the next burst is measured from here
        self.trims += 1
        self.trimmed_bytes += max(0, before - after)
        self.last_trim = {
            "rss_before_bytes": before,
            "rss_after_bytes": after,
            "collected_objects": collected,
            "malloc_trim": trimmed,
            "seconds": round(t2 - t0, 4),
            "collect_seconds": round(t1 - t0, 4),
            "malloc_trim_seconds": round(t2 - t1, 4),
        }
        log.info("memory handed back after a burst", extra=self.last_trim)
        return before - after

    def close(self) -> None:
        for handle in (self._trim_handle, self._step_handle):
            if handle is not None:
                handle.cancel()
        self._trim_handle = self._step_handle = None
        if isinstance(self.rss, ResidentSet):
            self.rss.close()

    def snapshot(self, sessions: int) -> dict[str, Any]:
        """`/stats` `memory`."""
        return {
            "rss_bytes": self.last_rss,
            "peak_rss_bytes": self.peak_rss,
            "budget_bytes": self.budget.budget,
            "admission_limit_bytes": self.budget.limit(sessions),
            "full": self.full,
            "over_limit": self.mark is not None,
            "times_full": self.times_full,
            "refused_sessions": self.refused_sessions,
            "trims": self.trims,
            "trimmed_bytes": self.trimmed_bytes,
            "collections_while_full": self.collections,
            "collections_while_falling": self.step_collections,
            "longest_pause_ms": round(self.longest_pause * 1000, 1),
            "allocator": allocator(),
            "last_trim": self.last_trim,
        }
