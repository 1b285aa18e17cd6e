"""Caps and timeouts that bound what strangers can make the relay spend.

blind-relay-service keeps every pending pairing forever and accepts every session; a flood of
`pair` requests with random tokens then grows its memory without bound. Each cap here is
counted when it bites (`blind_relay_limit_rejections_total{limit=…}`), so an operator sees it.
The per-address handshake limiter is a sans-IO token bucket: it takes `now`, never reads a clock.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Names of the caps, as they appear in metrics and /stats.
LIMIT_SESSIONS = "sessions"
LIMIT_PENDING_PER_SESSION = "pending_per_session"
LIMIT_PENDING_TOTAL = "pending_total"
LIMIT_PENDING_TIMEOUT = "pending_timeout"
LIMIT_HANDSHAKES_PER_ADDRESS = "handshakes_per_address"
LIMIT_ACTIVE_PAIRS = "active_pairs"
LIMIT_NOT_ALLOWED = "not_allowed"
LIMIT_HANDSHAKES_BUSY = "handshakes_busy"  # an address holding many sessions, while the relay is busy
LIMIT_CONTROL_FRAME = "control_frame"  # a session ended for announcing a control frame over the limit
LIMIT_MEMORY = "memory"  # a newcomer refused because the memory budget is reached and nothing idle could go
ALL_LIMITS = (
    LIMIT_SESSIONS,
    LIMIT_PENDING_PER_SESSION,
    LIMIT_PENDING_TOTAL,
    LIMIT_PENDING_TIMEOUT,
    LIMIT_HANDSHAKES_PER_ADDRESS,
    LIMIT_ACTIVE_PAIRS,
    LIMIT_NOT_ALLOWED,
    LIMIT_HANDSHAKES_BUSY,
    LIMIT_CONTROL_FRAME,
    LIMIT_MEMORY,
)


@dataclass(frozen=True)
class Limits:
    """Defaults sized for a relay serving a cluster: far above honest use, far below a flood.

    Caps are fair shares, not first come: at a cap the heaviest holder (by source address, then
    session) loses its oldest or idlest entry that carries no traffic; a pair relaying traffic is
    never shed, so a relay full of them refuses the newcomer instead (`relay.blindrelay`).

    The session, pair and pending caps come from the memory budget (`relay.service.memory`,
    `for_budget`): one relayed connection is two sessions (hyperdht's client and server each open
    their own connection to the relay: connect.js, server.js) and one active pair. Measured per
    object (tracemalloc on the relay's real objects, `benchmarks/relay_costs.py`): a session
    ~8.7 KB, a pair ~5.7 KB, a pending token ~0.4 KB, plus each session's reorder and frame
    bounds. The worst case at the 200 MB defaults (every session also holding its full buffers,
    an idle relay's 48 MB included) is ~189 MB; 4,096 relayed connections (8,192 sessions) fit
    (`tests/unit/test_relay_costs.py` keeps the sum under 95 % of the budget). Admission also
    checks the process's measured RSS against the budget, so an estimate that is off cannot
    break it."""

    memory_budget: int = 200 * 2**20
    max_sessions: int = 8192
    max_pending_per_session: int = 64
    max_pending_total: int = 8192
    # hyperdht peers give up on a pairing after 15 s; keep a pending one twice that long.
    pending_timeout: float = 30.0
    # an honest relayed connection is one pair on two sessions: max_sessions / 2 of them
    max_active_pairs: int = 4096
    handshakes_per_address: int = 256  # burst per source address (a cluster behind one NAT shares it)
    handshake_refill_per_second: float = 64.0
    # a handshake over the burst waits (in the DHT server's backlog) for its address's next token
    # if that comes within this many seconds, so a cluster behind one NAT that connects all at once
    # is slowed, not refused; beyond it, refused (the hyperdht client's request lasts ~4 s, and the
    # backlog sheds what waited 2 s, so the wait must leave the backlog time to answer)
    handshake_max_wait: float = 1.0
    tracked_addresses: int = 4096  # the limiter forgets the least recently seen beyond this
    # a session with no relay link this long is closed (hyperdht pairs right after connecting)
    session_idle_timeout: float = 30.0
    # a matched pair whose streams have not both carried a packet by then is destroyed
    silent_pair_timeout: float = 20.0
    # blind-relay messages are ~40-byte frames (a channel open ~60); a bigger control frame ends
    # the session. An incomplete frame is held until it completes, so 8,192 sessions may hold
    # 8 MiB at this size (32 MiB at 4 KiB)
    max_control_frame: int = 1024
    # handshakes from an address already holding this many sessions wait behind other addresses:
    # they pass only while the relay-wide handshake budget has room
    busy_address_sessions: int = 8
    handshake_budget_per_second: float = 64.0

    def as_dict(self) -> dict[str, float | int]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def for_budget(cls, memory_budget: int, **given: Any) -> Limits:
        """Limits whose session, pair and pending caps derive from `memory_budget` (bytes),
        except those in `given` (flags the operator set)."""
        from relay.service.memory import caps_for_budget

        caps = caps_for_budget(memory_budget, given.get("max_control_frame", cls.max_control_frame))
        derived = {
            "max_sessions": caps.max_sessions,
            "max_active_pairs": caps.max_active_pairs,
            "max_pending_total": caps.max_pending_total,
        }
        return cls(memory_budget=memory_budget, **(derived | given))


@dataclass
class LimitCounters:
    """How often each cap refused something."""

    rejected: Counter[str] = field(default_factory=Counter)

    def hit(self, name: str, n: int = 1) -> None:
        self.rejected[name] += n

    def snapshot(self) -> dict[str, int]:
        return {name: self.rejected.get(name, 0) for name in ALL_LIMITS}


class HandshakeLimiter:
    """Token bucket per source host: `allow(host, now)` spends one token or says no;
    `reserve(host, now, max_wait)` may also spend one that is still to come."""

    def __init__(self, burst: int, refill_per_second: float, max_tracked: int = 4096) -> None:
        self.burst = burst
        self.refill = refill_per_second
        self.max_tracked = max_tracked
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def allow(self, host: str, now: float) -> bool:
        return self.reserve(host, now) == 0.0

    def reserve(self, host: str, now: float, max_wait: float = 0.0) -> float | None:
        """Spend `host`'s next token: 0.0 if it has one now, else the seconds until it has (the
        bucket goes into debt, so later handshakes queue behind this one) if that is at most
        `max_wait`, else None (refused; nothing spent)."""
        tokens, last = self._buckets.pop(host, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + max(0.0, now - last) * self.refill)
        wait: float | None = 0.0
        if tokens < 1.0:
            wait = (1.0 - tokens) / self.refill if self.refill > 0 else None
            if wait is not None and wait > max_wait:
                wait = None
        if wait is not None:
            tokens -= 1.0
        self._buckets[host] = (tokens, now)
        while len(self._buckets) > self.max_tracked:
            self._buckets.popitem(last=False)
        return wait

    def __len__(self) -> int:
        return len(self._buckets)


class HandshakeGate:
    """Who may hand the relay a new session: every address gets its own token bucket, and an
    address already holding `busy_sessions` sessions also needs a token from one relay-wide
    bucket, which the other addresses' handshakes drain first. So while strangers flood the
    relay with valid handshakes, a new address still gets in and a heavy one waits (its
    hyperdht peer retries). Over its burst, an address's handshake waits for its next token
    when that is due within `handshake_max_wait`: a burst of honest connections from one NAT
    is spread out instead of half refused (hyperdht's retries all come back at once, a second
    later, so a refused burst would be refused again). Sans-IO: `admit` takes `now`."""

    def __init__(self, limits: Limits) -> None:
        self.per_address = HandshakeLimiter(
            limits.handshakes_per_address, limits.handshake_refill_per_second, limits.tracked_addresses
        )
        self.busy_sessions = limits.busy_address_sessions
        self.max_wait = limits.handshake_max_wait
        self.budget = HandshakeLimiter(
            max(1, int(limits.handshake_budget_per_second)), limits.handshake_budget_per_second, 1
        )
        self._returning: dict[str, int] = {}
        self._returning_until = 0.0

    def expect_returning(self, sessions_by_host: Mapping[str, int], now: float, window: float) -> None:
        """After a planned restart: each host may reconnect as many sessions as it held when the
        relay stopped, unthrottled, for `window` seconds. A worker address holding thousands of
        jobs' connections is then not mistaken for a flood when they all come back at once (the
        backlog still serves hosts least served first), while a host the previous run did not
        serve gets nothing more than before."""
        self._returning = dict(sessions_by_host)
        self._returning_until = now + window

    def returning(self, host: str, sessions_held: int, now: float) -> bool:
        """Whether `host` is still coming back after a restart (below what it held then)."""
        if not self._returning:
            return False
        if now >= self._returning_until:
            self._returning = {}
            return False
        return sessions_held < self._returning.get(host, 0)

    def admit(self, host: str, sessions_held: int, now: float) -> float | str:
        """Seconds the handshake must wait before it is answered (0.0: now), or the name of
        the limit that refused it."""
        if self.returning(host, sessions_held, now):
            return 0.0
        wait = self.per_address.reserve(host, now, self.max_wait)
        if wait is None:
            return LIMIT_HANDSHAKES_PER_ADDRESS
        has_budget = self.budget.allow("", now)
        if sessions_held >= self.busy_sessions and not has_budget:
            return LIMIT_HANDSHAKES_BUSY
        return wait
