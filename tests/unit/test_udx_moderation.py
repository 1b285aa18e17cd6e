"""Receive coalescing's decision (relay.udx.moderation), sans-IO: batch sizes and `now` in."""

from __future__ import annotations

from relay.udx.moderation import DEFAULT_HOLD_US, MAX_HOLD_US, MIN_BATCH, Moderation, hold_from_env

BATCH = 64
HOLD = 200e-6


def test_lone_datagram_after_idle_never_waits() -> None:
    m = Moderation(HOLD)
    assert m.after_batch(1, BATCH, 10.0) is None
    assert not m.holding
    # a quiet spell longer than a hold, then another lone one: still read at once
    assert m.after_batch(1, BATCH, 10.0 + 10 * HOLD) is None
    assert m.after_batch(MIN_BATCH - 1, BATCH, 20.0) is None


def test_burst_that_did_not_fill_the_batch_holds() -> None:
    m = Moderation(HOLD)
    assert m.after_batch(MIN_BATCH, BATCH, 5.0) == 5.0 + HOLD
    assert m.holding


def test_full_batch_means_behind_and_reads_again_at_once() -> None:
    m = Moderation(HOLD)
    assert m.after_batch(BATCH, BATCH, 1.0) is None
    assert m.after_batch(3 * BATCH, BATCH, 1.0) is None  # several reads in one wake
    assert not m.holding


def test_small_wakes_in_quick_succession_never_hold() -> None:
    """Datagrams trickling in (a slow or lossy path: one or two per wake) are not held back."""
    m = Moderation(HOLD)
    for k in range(10):
        assert m.after_batch(1 + k % 2, BATCH, 1.0 + k * HOLD / 4) is None
    assert not m.holding


def test_hold_repeats_while_it_gathers_bursts_and_ends_when_traffic_thins() -> None:
    m = Moderation(HOLD)
    now = 1.0
    assert m.after_batch(10, BATCH, now) is not None
    now += HOLD
    assert m.release(now)
    assert not m.holding
    assert m.after_batch(MIN_BATCH, BATCH, now) is not None  # still a burst: hold again
    now += HOLD
    assert m.release(now)
    assert m.after_batch(MIN_BATCH - 1, BATCH, now) is None  # thinned out: read at once again
    assert not m.holding
    assert m.after_batch(0, BATCH, now + HOLD) is None  # a hold that gathered nothing: nothing more
    assert m.after_batch(1, BATCH, now + 1.0) is None


def test_release_without_a_hold_is_a_no_op_and_an_early_timer_still_releases() -> None:
    m = Moderation(HOLD)
    assert not m.release(1.0)
    deadline = m.after_batch(8, BATCH, 2.0)
    assert deadline is not None
    assert m.release(deadline - HOLD / 2)  # a hold ends no later than its timer


def test_zero_hold_is_off() -> None:
    m = Moderation(0.0)
    for count in (1, MIN_BATCH, 10, BATCH - 1):
        assert m.after_batch(count, BATCH, 1.0) is None


def test_hold_from_env() -> None:
    assert hold_from_env({}) == DEFAULT_HOLD_US / 1e6
    assert hold_from_env({"UDX_COALESCE_US": "0"}) == 0.0
    assert hold_from_env({"UDX_COALESCE_US": "350"}) == 350e-6
    assert hold_from_env({"UDX_COALESCE_US": "junk"}) == 0.0
    assert hold_from_env({"UDX_COALESCE_US": "-5"}) == 0.0
    assert hold_from_env({"UDX_COALESCE_US": "999999"}) == MAX_HOLD_US / 1e6
