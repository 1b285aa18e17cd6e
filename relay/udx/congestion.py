"""Congestion control for `UDXCore`: packet-counting NewReno, sans-IO.

libudx runs BBR; the peer does not care which algorithm the other end runs, and NewReno's
three states are easy to reason about and to test on virtual time. Kept apart from the stream
state machine so another controller can replace it without touching loss detection.

States: `OPEN` (slow start below `ssthresh`, then one packet per window of ACKs),
`RECOVERY` (a RACK loss episode: the window drops to 0.7x once until everything sent before
the episode is acknowledged) and `LOSS` (after an RTO: the window restarts from one packet).
"""

from __future__ import annotations

INITIAL_CWND = 10.0
MAX_CWND = 4096.0
MIN_CWND = 2.0
#: multiplicative decrease on a loss episode (CUBIC's beta; Reno's 0.5 is harsher on lossy links)
BETA = 0.7

OPEN = 0
RECOVERY = 1
LOSS = 2


class NewReno:
    """The window in packets, and the state that decides how ACKs and losses move it."""

    __slots__ = ("cwnd", "high_seq", "ssthresh", "state")

    def __init__(self, seq: int = 0) -> None:
        self.cwnd = INITIAL_CWND
        self.ssthresh = float("inf")
        self.state = OPEN
        #: the highest sequence sent when the episode began; acked past it, the episode ends
        self.high_seq = seq

    def on_acked(self, newly: int, inflight: int) -> None:
        """`newly` packets were acknowledged (cumulatively or by SACK) with `inflight` still out.

        Grows only when the window was in use (at least half of it), so an application that
        sends little cannot inflate it."""
        if newly and self.state == OPEN and inflight + newly >= self.cwnd / 2:
            if self.cwnd < self.ssthresh:
                self.cwnd = min(self.cwnd + newly, MAX_CWND)
            else:
                self.cwnd = min(self.cwnd + newly / self.cwnd, MAX_CWND)

    def on_cumulative_ack(self, acked: int) -> None:
        """The cumulative ack moved to `acked`: a recovery or loss episode may be over."""
        if self.state != OPEN and acked >= self.high_seq:
            if self.state == RECOVERY:
                self.cwnd = max(self.ssthresh, MIN_CWND)
            self.state = OPEN

    def on_loss_episode(self, seq: int) -> bool:
        """RACK found losses; True when this starts a new episode (the window was cut)."""
        if self.state != OPEN:
            return False
        self.state = RECOVERY
        self.high_seq = seq
        self.ssthresh = max(self.cwnd * BETA, MIN_CWND)
        self.cwnd = self.ssthresh
        return True

    def on_rto(self, inflight: int, seq: int) -> None:
        """A retransmission timeout: everything out is presumed lost; restart from one packet."""
        self.ssthresh = max(inflight / 2, MIN_CWND)
        self.cwnd = 1.0
        self.state = LOSS
        self.high_seq = seq
