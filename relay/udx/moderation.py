"""Receive coalescing for the relay's batched reader: interrupt moderation, as NICs and NAPI do it.

A relay that is faster than its senders wakes for every few datagrams: each wake pays the
event loop, one `recvmmsg`, the per-batch Python and one `sendmmsg`, and the runs it forwards
with UDP_SEGMENT are short, so the kernel cuts few datagrams per send. When a batch shows
that traffic is flowing (not a lone datagram) but the reader is ahead (the batch was not
full), the reader stops reading that socket for a short hold; the datagrams wait in the
socket buffer and the next read takes them all at once and forwards them in long runs.

- A datagram after a quiet spell (an ACK, a ping, a control message) never waits: the reader
  is armed, it is forwarded at once. Holds start only once datagrams come in bursts or
  faster than one per hold (as a NIC's interrupt throttling: the first one interrupts).
- A full batch means the reader is behind: it reads again at once.
- A hold always ends by its timer, and the reader takes whatever came in the meantime, so
  nothing is stranded when traffic stops mid-hold.

`Moderation` is the sans-IO decision (batch sizes and `now` in, a deadline out); the runtime
arms a timer for it (`relay.udx.mmsg.HoldTimer`, a timerfd: asyncio's timers have 1 ms
resolution). `UDX_COALESCE_US` sets the hold (0 turns coalescing off).
"""

from __future__ import annotations

import os

#: Default hold in microseconds: long enough to gather a few dozen datagrams at loopback
#: rates, short against any WAN round trip (measured in benchmarks/udx_forward.py).
DEFAULT_HOLD_US = 200
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
    """When to pause reading a socket after a batch, and until when.

    `after_batch(count, batch, now)` is told what the last wake read (`count` entries of a
    `batch`-entry receive vector) and returns the deadline of a hold, or None to keep
    reading. A wake holds when traffic is flowing and the reader is ahead:

    - after a hold: if it gathered anything (and not a full batch), hold again; a hold that
      gathered nothing means the traffic stopped, and the reader is armed again;
    - otherwise: if the wake read a burst (`min_batch` or more) or came within `hold` of the
      previous one (datagrams arrive faster than one per hold), hold. A lone datagram after
      a quiet spell is read at once and starts nothing.

    `release(now)` ends the hold when its timer fires. `holding` says whether one runs.
    """

    __slots__ = ("deadline", "hold", "last", "min_batch", "released")

    def __init__(self, hold: float, min_batch: int = MIN_BATCH) -> None:
        self.hold = hold
        self.min_batch = min_batch
        self.deadline: float | None = None
        self.last: float | None = None  # when the previous wake read
        self.released = False  # the current wake is a hold's end

    @property
    def holding(self) -> bool:
        return self.deadline is not None

    def after_batch(self, count: int, batch: int, now: float) -> float | None:
        """The wake read `count` entries (at most `batch` per read): hold until when?"""
        released, self.released = self.released, False
        last, self.last = self.last, now
        if self.hold <= 0 or count <= 0 or count >= batch:
            self.deadline = None
        elif released or count >= self.min_batch or (last is not None and now - last < self.hold):
            self.deadline = now + self.hold
        else:
            self.deadline = None
        return self.deadline

    def release(self, now: float) -> bool:
        """The hold's timer fired at `now`: True = read the socket now (a hold only ever ends
        sooner than its deadline, never later: the timer is the one that ends it)."""
        was = self.deadline is not None
        self.deadline = None
        self.released = was
        return was
