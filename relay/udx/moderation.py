"""Receive coalescing for the relay's batched reader: interrupt moderation, as NICs and NAPI do it.

A relay that is faster than its senders wakes for every few datagrams: each wake pays the
event loop, one `recvmmsg`, the per-batch Python and one `sendmmsg`, and the runs it forwards
with UDP_SEGMENT are short, so the kernel cuts few datagrams per send. When a batch shows
that traffic is flowing (not a lone datagram) but the reader is ahead (the batch was not
full), the reader stops reading that socket for a short hold; the datagrams wait in the
socket buffer and the next read takes them all at once and forwards them in long runs.

- A small batch (fewer than `min_batch`: an ACK, a ping, a control message after idle) never
  waits: it is forwarded at once and the reader stays armed; holds that gather too little
  pause holding for a while (a slow path gains nothing from them).
- A full batch means the reader is behind: it reads again at once.
- A hold always ends by its timer, and the reader takes whatever came in the meantime, so
  nothing is stranded when traffic stops mid-hold.

`Moderation` is the sans-IO decision (batch sizes and `now` in, a deadline out); the runtime
arms a timer for it (`relay.udx.mmsg.HoldTimer`, a timerfd: asyncio's timers have 1 ms
resolution). `UDX_COALESCE_US` sets the hold; it is off (0) unless set.
"""

from __future__ import annotations

import os

#: Default hold in microseconds: 0, off. Measured side by side (README, UDX forwarding), a
#: 100 us hold saved ~10 % of the relay's CPU only while one pair saturated the loopback
#: forwarding path; across the lossy namespace link and end to end through the real relay
#: (sender-limited, bursty traffic) it cost more CPU than it saved. UDX_COALESCE_US=100 turns
#: it on for a relay that forwards saturated flows.
DEFAULT_HOLD_US = 0
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


#: After a hold that gathered less than a burst, bursts are read without holding for this
#: long before a hold is tried again (seconds): on a slow path holds would only add wakes.
RETRY_AFTER = 0.010


class Moderation:
    """When to pause reading a socket after a wake, and until when.

    `after_batch(count, batch, now)` is told what the wake read (`count` entries, at most
    `batch` per read) and returns the deadline of a hold, or None to keep reading:

    - fewer than `min_batch` (a lone ACK, a ping, a control message after idle) or a full
      batch (the reader is behind): no hold, read on;
    - a burst that did not fill the batch: hold, so the next read takes more at once;
    - a hold pays only if a burst arrives during it. When one gathered less, holds stop until
      `RETRY_AFTER` has passed (packets trickling in on a slow or lossy path would otherwise
      cost a timer wake per burst and save nothing: measured across the lossy namespace link);
    - `coalesced`: the kernel already merged runs (UDP GRO with a flush timeout): it is
      moderating, so nothing is held on top.

    `release(now)` ends the hold when its timer fires. `holding` says whether one runs.
    """

    __slots__ = ("deadline", "hold", "min_batch", "released", "retry_at")

    def __init__(self, hold: float, min_batch: int = MIN_BATCH) -> None:
        self.hold = hold
        self.min_batch = min_batch
        self.deadline: float | None = None
        self.released = False  # the wake being decided is a hold's end
        self.retry_at = 0.0  # no hold before this after one that did not pay

    @property
    def holding(self) -> bool:
        return self.deadline is not None

    def after_batch(self, count: int, batch: int, now: float, *, coalesced: bool = False) -> float | None:
        """The wake read `count` entries (at most `batch` per read): hold until when?"""
        released, self.released = self.released, False
        self.deadline = None
        if self.hold <= 0 or coalesced or count >= batch:
            return None
        if count < self.min_batch:
            if released:  # the hold gathered too little to be worth another soon
                self.retry_at = now + RETRY_AFTER
            return None
        if not released and now < self.retry_at:
            return None
        self.deadline = now + self.hold
        return self.deadline

    def release(self, now: float) -> bool:
        """The hold's timer fired at `now`: True = read the socket now (a hold only ever ends
        sooner than its deadline, never later: the timer is the one that ends it)."""
        was = self.deadline is not None
        self.deadline = None
        self.released = was
        return was
