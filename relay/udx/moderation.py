"""Receive coalescing for the relay's batched reader: interrupt moderation, as NICs and NAPI do it.

A relay that is faster than its senders wakes for every few datagrams: each wake pays the
event loop, one `recvmmsg`, the per-batch Python and one `sendmmsg`, and the runs it forwards
with UDP_SEGMENT are short, so the kernel cuts few datagrams per send. When a batch shows
that traffic is flowing (not a lone datagram) but the reader is ahead (the batch was not
full), the reader stops reading that socket for a short hold; the datagrams wait in the
socket buffer and the next read takes them all at once and forwards them in long runs.

- A small batch (fewer than `min_batch`: an ACK, a ping, a control message after idle) never
  waits: it is forwarded at once and the reader stays armed.
- A full batch means the reader is behind: it reads again at once.
- A hold always ends by its timer, and the reader takes whatever came in the meantime, so
  nothing is stranded when traffic stops mid-hold.

`Moderation` is the sans-IO decision (batch sizes and `now` in, a deadline out); the runtime
arms a timer for it (`relay.udx.mmsg.HoldTimer`, a timerfd: asyncio's timers have 1 ms
resolution). `UDX_COALESCE_US` sets the hold (0 turns coalescing off).
"""

from __future__ import annotations

import os

#: Default hold in microseconds: at loopback rates (~100k datagrams/s) a hold gathers a
#: batch of 10-20; 100 us saved as much CPU as 200 us in benchmarks/udx_forward.py and added
#: less to a ping's round trip during a bulk transfer (README, UDX forwarding).
DEFAULT_HOLD_US = 100
#: Batches smaller than this are latency-sensitive traffic and never wait.
MIN_BATCH = 4
#: Longest hold accepted from the environment (a hold delays the ACKs on the socket too).
MAX_HOLD_US = 5000


def hold_from_env(env: dict[str, str] | None = None) -> float:
    """The hold in seconds from `UDX_COALESCE_US` (default `DEFAULT_HOLD_US`; 0 or junk off)."""
    raw = (os.environ if env is None else env).get("UDX_COALESCE_US")
    if raw is None:
        return DEFAULT_HOLD_US / 1e6
    try:
        us = int(raw)
    except ValueError:
        return 0.0
    return min(max(us, 0), MAX_HOLD_US) / 1e6


class Moderation:
    """When to pause reading a socket after a wake, and until when.

    `after_batch(count, batch, now)` is told what the wake read (`count` entries, at most
    `batch` per read) and returns the deadline of a hold, or None to keep reading. A wake
    holds when it read a burst (`min_batch` or more) that did not fill the batch: traffic is
    flowing and the reader is ahead. Fewer (a lone ACK, a ping, packets trickling in on a
    slow path) are forwarded at once and the reader stays armed; a full batch re-reads at
    once. A hold that gathered less than a burst ends coalescing until the next burst.

    (An earlier version also held after small wakes that came within a hold of each other:
    across the lossy namespace link that kept the reader pausing for one or two datagrams at
    a time and cost the peers ~40 % of their throughput; see README, UDX forwarding.)

    `release(now)` ends the hold when its timer fires. `holding` says whether one runs.
    """

    __slots__ = ("deadline", "hold", "min_batch")

    def __init__(self, hold: float, min_batch: int = MIN_BATCH) -> None:
        self.hold = hold
        self.min_batch = min_batch
        self.deadline: float | None = None

    @property
    def holding(self) -> bool:
        return self.deadline is not None

    def after_batch(self, count: int, batch: int, now: float) -> float | None:
        """The wake read `count` entries (at most `batch` per read): hold until when?"""
        if self.hold <= 0 or count < self.min_batch or count >= batch:
            self.deadline = None
        else:
            self.deadline = now + self.hold
        return self.deadline

    def release(self, now: float) -> bool:
        """The hold's timer fired at `now`: True = read the socket now (a hold only ever ends
        sooner than its deadline, never later: the timer is the one that ends it)."""
        was = self.deadline is not None
        self.deadline = None
        return was
