"""The default caps add up: what they let strangers make the relay hold fits the 200 MB budget.

Per-object costs are measured in-process (tracemalloc) on the relay's real objects by
`benchmarks/relay_costs.py`; the RSS-per-traced-byte factor it applies comes from the combined
attack at the default caps (`benchmarks/attacks.py --only combined`). Memory, not speed: the
measurement does not depend on how busy the machine is.
"""

from __future__ import annotations

from benchmarks.relay_costs import MB, RSS_BUDGET, measure
from relay.service import memory
from relay.service.limits import Limits


def test_the_default_caps_fit_the_operator_pages_200_mb_at_measured_object_sizes() -> None:
    costs = measure(n_sessions=200, n_pending=2000, n_pairs=1000)
    # a session is its control UDX stream, secret stream, protomux and blind-relay state
    assert 4_000 < costs.session < 16_000, costs.session
    assert 100 < costs.pending < 1_000, costs.pending
    assert 2_000 < costs.pair < 9_000, costs.pair  # two relay UDX streams and their links
    worst = costs.worst_case()
    breakdown = {k: round(v / MB, 1) for k, v in worst.items()}
    assert worst["total"] < 0.95 * RSS_BUDGET, breakdown


def test_the_budgets_per_object_figures_are_at_least_what_the_objects_cost() -> None:
    """The caps derive from the figures in relay.service.memory: a session, pair, pending token
    or pairing record that grows past its figure fails here (raise the figure, or trim the object)."""
    costs = measure(n_sessions=200, n_pending=2000, n_pairs=1000)
    assert costs.session <= memory.SESSION_BYTES, costs.session
    assert costs.pair <= memory.PAIR_BYTES, costs.pair
    assert costs.pending <= memory.PENDING_BYTES, costs.pending
    assert costs.record <= memory.RECORD_BYTES, costs.record
    assert memory.connection_bytes() >= costs.per_connection()


def test_the_default_caps_hold_4000_relayed_connections_and_the_budget_derives_them() -> None:
    """One relayed connection is two sessions and one pair (hyperdht's client and server each
    open their own connection to the relay): the defaults let 4,000 of them in at once, and
    the measured costs say that many fit the 200 MB budget."""
    lim = Limits()
    assert lim.max_active_pairs >= 4_000 and lim.max_sessions >= 2 * lim.max_active_pairs
    costs = measure(n_sessions=200, n_pending=2000, n_pairs=1000)
    assert costs.connections_that_fit() >= lim.max_active_pairs, round(costs.per_connection())


def test_help_says_what_one_relayed_connection_costs_as_measured() -> None:
    """`blind-relay --help` names the cost of one relayed connection in sessions and memory; the
    figure stays true to the measured per-object costs (within 15 %, never below them)."""
    import re

    from relay.cli import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "One relayed connection costs two sessions" in text
    found = re.search(r"about (\d+) KB of memory at most", text)
    assert found is not None, text
    per_connection = measure(n_sessions=200, n_pending=200, n_pairs=500).per_connection()
    said = int(found.group(1)) * 1000
    assert per_connection <= said <= 1.15 * per_connection, (said, per_connection)
