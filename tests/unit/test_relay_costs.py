"""The default caps add up: what they let strangers make the relay hold fits the 200 MB budget.

Per-object costs are measured in-process (tracemalloc) on the relay's real objects by
`benchmarks/relay_costs.py`; the RSS-per-traced-byte factor it applies comes from the combined
attack at the default caps (`benchmarks/attacks.py --only combined`). Memory, not speed: the
measurement does not depend on how busy the machine is.
"""

from __future__ import annotations

from benchmarks.relay_costs import MB, RSS_BUDGET, measure


def test_the_default_caps_fit_the_operator_pages_200_mb_at_measured_object_sizes() -> None:
    costs = measure(n_sessions=200, n_pending=2000, n_pairs=1000)
    # a session is its control UDX stream, secret stream, protomux and blind-relay state
    assert 4_000 < costs.session < 16_000, costs.session
    assert 100 < costs.pending < 1_000, costs.pending
    assert 2_000 < costs.pair < 9_000, costs.pair  # two relay UDX streams and their links
    worst = costs.worst_case()
    breakdown = {k: round(v / MB, 1) for k, v in worst.items()}
    assert worst["total"] < 0.95 * RSS_BUDGET, breakdown
