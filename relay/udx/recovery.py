"""Loss recovery timing for `UDXCore`, sans-IO: the RTT estimator and RACK/TLP windows.

`RttEstimator` is RFC 6298 (srtt, rttvar, an RTO of at least 1 s as libudx); `reo_wnd` and
`probe_timeout` are RFC 8985's reordering window and tail-loss-probe timeout. What was sent,
acknowledged and marked lost stays in the stream (it owns the packets); this module owns the
arithmetic that decides *when*.
"""

from __future__ import annotations

RTO_MIN = 1.0
RTO_MAX = 30.0
RTO_INITIAL = 1.0
TLP_MIN = 0.010
TLP_MAX_ACK_DELAY = 0.002
REO_WND_MIN = 0.001


class RttEstimator:
    """Smoothed RTT, its variation, the minimum seen and the RTO they give."""

    __slots__ = ("min_rtt", "rto", "rttvar", "sampled", "srtt")

    def __init__(self) -> None:
        self.srtt = 0.0
        self.rttvar = 0.0
        self.min_rtt = float("inf")
        self.rto = RTO_INITIAL
        self.sampled = False

    def sample(self, rtt: float) -> bool:
        """Take one RTT measurement (seconds); False if it was unusable (negative)."""
        if rtt < 0:
            return False
        if not self.sampled:
            self.sampled = True
            self.srtt = rtt
            self.rttvar = rtt / 2
        else:
            self.rttvar = (3 * self.rttvar + abs(self.srtt - rtt)) / 4
            self.srtt = (7 * self.srtt + rtt) / 8
        if rtt < self.min_rtt:
            self.min_rtt = rtt
        self.rto = min(max(self.srtt + 4 * self.rttvar, RTO_MIN), RTO_MAX)
        return True


def reo_wnd(rtt: RttEstimator, reordering_seen: bool, in_recovery: bool) -> float:
    """RFC 8985 §6.2: how long after a later packet was delivered an earlier one counts as lost."""
    if not reordering_seen and in_recovery:
        return REO_WND_MIN
    return max(min(rtt.min_rtt / 4, rtt.srtt), REO_WND_MIN)


def probe_timeout(rtt: RttEstimator, inflight: int) -> float:
    """RFC 8985 §7.2: probe after 2·srtt (+ the peer's ack delay when one packet is out)."""
    pto = 2 * rtt.srtt if rtt.sampled else 1.0
    if inflight == 1:
        pto += TLP_MAX_ACK_DELAY
    return max(pto, TLP_MIN)
