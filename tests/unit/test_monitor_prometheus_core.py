"""PrometheusWatch's core (rows in, the monitor's RelayWatches out) and `cosmictui monitor --prometheus`'s
choice of server. What Prometheus holds is as untrusted as a relay's own /metrics. (The monitor fed
by a real Prometheus: tests/e2e/test_monitor_prometheus.py.)"""

from __future__ import annotations

import argparse

import pytest

from cosmictui.cli.monitor import monitor_targets, prometheus_url
from cosmictui.cli.output import UsageError
from cosmictui.ops.config import Settings
from cosmictui.ops.metrics.client import RelayState
from cosmictui.ops.metrics.prometheus import GONE, PrometheusError, PrometheusWatch, PromRelay

KEY = "yry" * 17 + "o"


def relay(instance: str, **kw: object) -> PromRelay:
    base: dict[str, object] = {
        "job": "blind-relay",
        "instance": instance,
        "up": True,
        "key": KEY,
        "version": "0.1.0",
        "bootstrapped": True,
        "rss_bytes": 40e6,
        "uptime_seconds": 100.0,
        "samples": {"blind_relay_pairings_active": 2.0, "blind_relay_sessions_opened": 5.0},
        "rates": {"received_bytes": 1500.0, "sent_bytes": 900.0, "cpu_seconds": 0.02},
    }
    return PromRelay(**{**base, **kw})  # type: ignore[arg-type]


def test_rows_become_watches_that_keep_their_places_and_never_vanish() -> None:
    pw = PrometheusWatch("127.0.0.1:9090")
    assert pw.url == "http://127.0.0.1:9090" and pw.line().startswith("… Prometheus")
    assert pw.observe([relay("b:1")], 1000.0)
    assert pw.observe([relay("a:1"), relay("b:1")], 1001.0)
    a, b = pw.relays[("blind-relay", "a:1")], pw.relays[("blind-relay", "b:1")]
    assert pw.watches == [b, a]  # the order Prometheus first named them, not sorted again
    assert a.state is RelayState.UP and a.key == KEY and a.last is not None and a.last.rss_bytes == 40e6
    assert a.rates is not None and a.rates["received_bytes"] == 1500.0 and a.rates.cpu_percent == pytest.approx(2.0)
    assert a.history["in_bps"][-1] == (1001.0, 1500.0) and a.uptime(1001.0) == pytest.approx(100.0)
    assert a.target.short_label == "a:1" and "via Prometheus" in a.target.label
    assert pw.line() == "Prometheus 127.0.0.1:9090 · 2 relay targets, 0 not up"
    pw.observe([relay("a:1", up=False)], 1002.0)
    assert a.state is RelayState.DOWN and a.error is not None and "up == 0" in a.error
    assert a.fix is not None and "http://127.0.0.1:9090/targets" in a.fix
    assert b.state is RelayState.DOWN and b.error == GONE  # left the answer: kept, marked
    assert pw.watches == [b, a] and pw.line().endswith("2 relay targets, 2 not up")


def test_no_rate_yet_is_no_numbers_not_zeros() -> None:
    pw = PrometheusWatch("http://p:9090")
    pw.observe([relay("a:1", rates={})], 1.0)
    w = pw.watches[0]
    assert w.state is RelayState.UP and w.rates is None and not w.history["in_bps"]


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"rss_bytes": 1e300, "samples": {}}, "process_resident_memory_bytes"),
        ({"uptime_seconds": -5.0}, "uptime_seconds"),
        ({"samples": {"blind_relay_pairings_active": -1.0}}, "blind_relay_pairings_active"),
        ({"rates": {"received_bytes": -3.0}}, "received_bytes"),
        ({"rates": {"sent_bytes": 1e300}}, "sent_bytes"),
    ],
)
def test_numbers_no_relay_has_are_bad_data_for_that_row_only(row: dict[str, object], field: str) -> None:
    pw = PrometheusWatch("p:9090")
    pw.observe([relay("bad:1", **row), relay("good:1")], 1.0)
    bad, good = pw.relays[("blind-relay", "bad:1")], pw.relays[("blind-relay", "good:1")]
    assert bad.state is RelayState.BAD_DATA and bad.error is not None and f"bad data: {field}" in bad.error
    assert bad.last is None and not bad.history["rss_mb"]  # nothing of it is shown, added or plotted
    assert good.state is RelayState.UP


def test_an_unreadable_server_keeps_the_rows_and_says_since_when() -> None:
    pw = PrometheusWatch("p:9090")
    pw.observe([relay("a:1")], 1.0)
    assert pw.observe_failure(PrometheusError("cannot read http://p:9090: connection refused", "curl it"), 2.0)
    assert not pw.observe_failure(PrometheusError("cannot read http://p:9090: connection refused", "curl it"), 3.0)
    line = pw.line()
    assert line.startswith("✖ Prometheus cannot read http://p:9090: connection refused (numbers from ")
    assert line.endswith("— next: curl it")
    assert pw.watches[0].state is RelayState.UP  # Prometheus being unreadable says nothing about the relay
    pw.observe([relay("a:1")], 4.0)
    assert pw.error is None


def args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {"storage": [], "metrics": [], "relay_key": [], "prometheus": None}
    return argparse.Namespace(**{**base, **kw})


def test_monitor_picks_the_flag_else_the_config_key_unless_a_relay_is_named() -> None:
    configured = Settings(monitor_prometheus="10.0.0.9:9090")
    assert prometheus_url(args(), configured) == "http://10.0.0.9:9090"
    assert monitor_targets(args(), configured) == []  # the configured server's relays only
    assert prometheus_url(args(prometheus="https://p.example/prom/"), configured) == "https://p.example/prom"
    assert prometheus_url(args(metrics=["127.0.0.1:49738"]), configured) is None
    assert prometheus_url(args(), Settings()) is None
    with pytest.raises(UsageError) as e:
        prometheus_url(args(prometheus="ftp://p:9090"), Settings())
    assert "--prometheus" in str(e.value)
    with pytest.raises(UsageError) as e:
        prometheus_url(args(), Settings(monitor_prometheus="p:99999"))
    assert "[monitor] prometheus" in str(e.value)
