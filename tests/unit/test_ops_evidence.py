"""Relay evidence beside the jobs: counters since the worker restart, and which case it is."""

from __future__ import annotations

from datetime import UTC, datetime

from cosmictui.ops.jobs.evidence import counters, evidence_from, name_case, relay_evidence
from cosmictui.ops.metrics.client import Scrape, scrape
from tests.unit._metrics_server import FakeRelayMetrics


async def test_counters_since_the_restart_from_a_metrics_endpoint() -> None:
    relay = FakeRelayMetrics()
    try:
        relay.gauges["blind_relay_sessions_opened"].set(3)
        relay.gauges["blind_relay_pairings_matched"].set(5)
        relay.counters["blind_relay_relayed_bytes"].inc(1000)
        at_restart = counters(await scrape(relay.url))  # what step 4 keeps at the worker restart
        restart = datetime.now(UTC)
        relay.gauges["blind_relay_sessions_opened"].set(4)
        relay.gauges["blind_relay_pairings_matched"].set(7)
        relay.counters["blind_relay_relayed_bytes"].inc(2_500_000)
        ev = await relay_evidence(relay.url, at_restart, restart)
    finally:
        relay.server.shutdown()
    assert ev.reachable and ev.since == "since the worker restart"
    assert (ev.sessions_opened, ev.pairings_matched, ev.relayed_bytes) == (1, 2, 2_500_000)
    assert ev.carried and "1 session(s) opened, 2 pairing(s) matched" in ev.line()
    assert name_case(True, ev)[0] == "relayed"


def test_without_a_reading_at_the_restart_the_totals_say_so() -> None:
    now = {"sessions_opened": 2.0, "pairings_matched": 0.0, "relayed_bytes": 0.0, "relay_started_at": 1000.0}
    old_restart = datetime.fromtimestamp(2000.0, UTC)  # relay started before the restart
    ev = evidence_from(now, None, old_restart)
    assert "no reading from the restart" in ev.since and ev.sessions_opened == 2
    later = datetime.fromtimestamp(500.0, UTC)  # the relay started after the restart: all counts are since
    assert "started after it" in evidence_from(now, None, later).since
    # another relay process than the one read at the restart: its numbers are not differenced
    other = evidence_from(now, {"sessions_opened": 9.0, "relay_started_at": 1.0}, old_restart)
    assert other.sessions_opened == 2


def test_the_three_cases_and_an_unreachable_relay() -> None:
    none = evidence_from({"sessions_opened": 0.0, "pairings_matched": 0.0, "relayed_bytes": 0.0}, None, None)
    kind, text = name_case(False, none)
    assert kind == "no-session" and "UDP port" in text and "[relay] address" in text
    assert name_case(True, none)[0] == "direct"
    session = evidence_from({"sessions_opened": 1.0}, None, None)
    assert name_case(False, session)[0] == "waiting"


async def test_untrusted_values_and_a_relay_that_does_not_answer() -> None:
    relay = FakeRelayMetrics()
    relay.metrics_body = b"blind_relay_sessions_opened -4\nblind_relay_pairings_matched 3\n"
    try:
        negative = await relay_evidence(relay.url, None, None)
        relay.metrics_body = b"blind_relay_sessions_opened NaN\n"
        nan = await relay_evidence(relay.url, None, None)
    finally:
        relay.server.shutdown()
    # The scraper refuses them: no numbers, and why — never a made-up count.
    assert not negative.reachable and "out of range" in negative.detail
    assert not nan.reachable and "not finite" in nan.detail
    # … and the evidence itself drops what is not a finite count >= 0, whatever hands it over.
    s = Scrape(0.0, 0.0, {"blind_relay_sessions_opened": -4.0, "blind_relay_pairings_matched": float("nan")})
    assert counters(s) == {}
    down = await relay_evidence("http://127.0.0.1:9", None, None, timeout=0.5)
    assert not down.reachable and name_case(True, down)[0] == "unknown"
    assert (await relay_evidence(None, None, None)).detail.startswith("the relay's metrics are off")
