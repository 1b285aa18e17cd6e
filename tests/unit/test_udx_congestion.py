"""NewReno and the loss-recovery timing on their own (no stream, no clock)."""

from __future__ import annotations

import pytest

from relay.udx.congestion import INITIAL_CWND, LOSS, MIN_CWND, OPEN, RECOVERY, NewReno
from relay.udx.recovery import REO_WND_MIN, RTO_MIN, TLP_MIN, RttEstimator, probe_timeout, reo_wnd


def test_newreno_slow_start_then_avoidance_and_one_cut_per_episode() -> None:
    cc = NewReno(seq=0)
    cc.on_acked(10, inflight=0)
    assert cc.cwnd == INITIAL_CWND + 10  # slow start: one packet per packet acknowledged
    cc.on_acked(1, inflight=0)  # the window was not in use: no growth
    assert cc.cwnd == INITIAL_CWND + 10
    assert cc.on_loss_episode(seq=100)
    assert cc.state == RECOVERY and cc.cwnd == pytest.approx(0.7 * 20)
    assert not cc.on_loss_episode(seq=120)  # the same episode: no second cut
    cc.on_acked(5, inflight=10)
    assert cc.cwnd == pytest.approx(14)  # no growth while recovering
    cc.on_cumulative_ack(99)
    assert cc.state == RECOVERY
    cc.on_cumulative_ack(100)
    assert cc.state == OPEN and cc.cwnd == pytest.approx(14)
    cc.on_acked(14, inflight=14)  # congestion avoidance: about one packet per window
    assert cc.cwnd == pytest.approx(15)


def test_newreno_rto_restarts_from_one_packet() -> None:
    cc = NewReno()
    cc.on_rto(inflight=40, seq=50)
    assert (cc.state, cc.cwnd, cc.ssthresh) == (LOSS, 1.0, 20)
    cc.on_cumulative_ack(50)
    assert cc.state == OPEN and cc.cwnd == 1.0  # LOSS exits without restoring the window
    cc.on_rto(inflight=1, seq=60)
    assert cc.ssthresh == MIN_CWND


def test_rtt_estimator_rfc6298_and_timing_windows() -> None:
    rtt = RttEstimator()
    assert probe_timeout(rtt, inflight=5) == 1.0  # no sample yet
    assert not rtt.sample(-0.1) and not rtt.sampled
    assert rtt.sample(0.100)
    assert (rtt.srtt, rtt.rttvar, rtt.rto) == (0.100, 0.050, RTO_MIN)
    rtt.sample(0.300)
    assert rtt.srtt == pytest.approx(0.125) and rtt.rttvar == pytest.approx(0.0875)
    assert rtt.min_rtt == 0.100
    rtt.sample(5.0)
    assert rtt.rto > RTO_MIN
    assert probe_timeout(rtt, inflight=2) == pytest.approx(2 * rtt.srtt)
    assert probe_timeout(rtt, inflight=1) == pytest.approx(2 * rtt.srtt + 0.002)
    tiny = RttEstimator()
    tiny.sample(0.0)
    assert probe_timeout(tiny, inflight=3) == TLP_MIN
    assert reo_wnd(rtt, reordering_seen=False, in_recovery=True) == REO_WND_MIN
    assert reo_wnd(rtt, reordering_seen=True, in_recovery=True) == pytest.approx(0.100 / 4)
