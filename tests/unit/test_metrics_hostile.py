"""Hostile metrics endpoints on loopback against the scraper and `cosmictui relay status`.

A drip, a 50 MB body, text that is not Prometheus, numbers no relay has (±1e300, NaN,
Infinity) and JSON of the wrong types: each is a clear DOWN or BAD DATA, never a hang, a
traceback or output that is not JSON. Nothing here measures time: a deadline shows as its
message, and an abandoned scrape as the server seeing the client hang up.
"""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from typing import Any

import pytest

from cosmictui import cli
from cosmictui.ops.metrics import client as m
from tests.unit._hostile_http import (
    GOOD_METRICS,
    answer,
    big,
    drip,
    good_stats,
    json_answer,
    metrics_text,
    silent,
)

SAFETY = 60.0


def strict_loads(text: str) -> Any:
    """json.loads that refuses NaN/Infinity, as every JSON parser but Python's does."""

    def refuse(word: str) -> Any:
        raise ValueError(f"not JSON: {word}")

    return json.loads(text, parse_constant=refuse)


def status(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    rc = cli.main(["relay", "status", *argv], out=out)
    return rc, out.getvalue()


@pytest.mark.parametrize("path", ["metrics", "stats"])
def test_a_drip_times_out_at_the_deadline_and_the_connection_is_dropped(hostile, path: str) -> None:
    srv = hostile(**{path: drip()})
    with pytest.raises(m.MetricsError) as e:
        m.fetch(srv.url, timeout=1.0)
    assert e.value.reason == f"timed out after 1 s waiting for 127.0.0.1:{srv.port}/{path}"
    assert "log" in e.value.fix
    assert srv.gone.wait(SAFETY), "the scrape left the dripping connection open"


def test_a_silent_server_times_out_too(hostile) -> None:
    srv = hostile(metrics=silent())
    with pytest.raises(m.MetricsError, match=r"timed out after 0\.5 s"):
        m.fetch(srv.url, timeout=0.5)
    assert srv.gone.wait(SAFETY)


def test_a_50_mb_body_is_refused_without_reading_it_all(hostile) -> None:
    srv = hostile(metrics=big())
    with pytest.raises(m.MetricsError, match=r"answered more than 4\.2 MB: not a relay"):
        m.fetch(srv.url, timeout=SAFETY)
    assert srv.gone.wait(SAFETY)
    assert srv.sent_body < 50 * 1024 * 1024


@pytest.mark.parametrize(
    "body",
    [
        "this is { not prometheus",
        "blind_relay_sessions_opened one\n",
        '# TYPE x counter\nx{le="1" 3\n',
        "\x00\xff" * 100,
    ],
)
def test_invalid_exposition_text_is_a_clear_error(hostile, body: str) -> None:
    srv = hostile(metrics=answer(body))
    with pytest.raises(m.MetricsError, match="not Prometheus text") as e:
        m.fetch(srv.url, timeout=SAFETY)
    assert "relay status" in e.value.fix


ABSURD_STATS = [
    ({"uptime_seconds": 1e300}, "uptime_seconds"),
    ({"uptime_seconds": -1e300}, "uptime_seconds"),
    ({"uptime_seconds": math.nan}, "uptime_seconds"),
    ({"uptime_seconds": math.inf}, "uptime_seconds"),
    ({"uptime_seconds": "soon"}, "uptime_seconds"),
    ({"uptime_seconds": 10**400}, "uptime_seconds"),
    ({"cpu_seconds": -math.inf}, "cpu_seconds"),
    ({"pid": "x"}, "pid"),
    ({"key": 7}, "key"),
    ({"memory__rss_bytes": 1e300}, "memory.rss_bytes"),
    ({"memory": [1]}, "memory"),
    ({"dht": []}, "dht"),
    ({"dht__public_port": 70000}, "dht.public_port"),
    ({"dht__bootstrapped": "yes"}, "dht.bootstrapped"),
    ({"dht__last_announce": math.nan}, "dht.last_announce"),
    ({"sessions": "lots"}, "sessions"),
    ({"sessions__opened": True}, "sessions"),
    ({"pairings__active": -1}, "pairings"),
    ({"dropped": {"garbage": -5}}, "dropped"),
    ({"shed": {"idle": "many"}}, "shed"),
    ({"udx__gso_fallbacks": math.inf}, "udx.gso_fallbacks"),
]


@pytest.mark.parametrize(("overrides", "field"), ABSURD_STATS)
def test_absurd_stats_are_bad_data_naming_the_field(hostile, overrides: dict[str, Any], field: str) -> None:
    srv = hostile(stats=json_answer(good_stats(**overrides)))
    with pytest.raises(m.BadData) as e:
        m.fetch(srv.url, timeout=SAFETY)
    assert e.value.field == field and e.value.reason.startswith(f"bad data: {field} (")


@pytest.mark.parametrize(
    ("sample", "value"),
    [
        ("process_resident_memory_bytes", "1e300"),
        ("process_resident_memory_bytes", "-1e300"),
        ("blind_relay_relayed_bytes_total", "NaN"),
        ("blind_relay_pairings_active", "+Inf"),
        ("process_start_time_seconds", "1e300"),
    ],
)
def test_absurd_metrics_are_bad_data_naming_the_sample(hostile, sample: str, value: str) -> None:
    srv = hostile(metrics=answer(GOOD_METRICS + metrics_text(**{sample: value})))
    with pytest.raises(m.BadData) as e:
        m.fetch(srv.url, timeout=SAFETY)
    assert e.value.field == sample


def test_stats_nested_absurdly_deep_is_an_error_not_a_recursion(hostile) -> None:
    srv = hostile(stats=answer("[" * 100_000 + "]" * 100_000, "application/json"))
    with pytest.raises(m.MetricsError, match=r"expected a JSON object|nested"):
        m.fetch(srv.url, timeout=SAFETY)
    deep = good_stats(extra={"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": {"j": {}}}}}}}}}}})
    for _ in range(10):
        deep = {"x": deep}
    srv2 = hostile(stats=json_answer(deep))
    with pytest.raises(m.MetricsError, match="nested deeper than 16 levels"):
        m.fetch(srv2.url, timeout=SAFETY)


HOSTILE_CASES: dict[str, dict[str, Any]] = {
    "drip": {"metrics": drip()},
    "drip-stats": {"stats": drip()},
    "50MB": {"metrics": big()},
    "not-prometheus": {"metrics": answer("this is { not prometheus")},
    "uptime+1e300": {"stats": json_answer(good_stats(uptime_seconds=1e300))},
    "uptime-1e300": {"stats": json_answer(good_stats(uptime_seconds=-1e300))},
    "uptime-NaN": {"stats": json_answer(good_stats(uptime_seconds=math.nan))},
    "rss-Infinity": {"stats": json_answer(good_stats(memory__rss_bytes=math.inf))},
    "wrong-types": {"stats": json_answer(good_stats(sessions="lots", dht=[]))},
    "stats-not-object": {"stats": json_answer([1, 2, 3])},
    "stats-not-json": {"stats": answer("{nope", "application/json")},
    "metrics-NaN": {"metrics": answer(GOOD_METRICS + metrics_text(blind_relay_relayed_bytes_total="NaN"))},
}
EXPECTED_STATE = {
    "uptime+1e300": "bad data",
    "uptime-1e300": "bad data",
    "uptime-NaN": "bad data",
    "rss-Infinity": "bad data",
    "wrong-types": "bad data",
    "metrics-NaN": "bad data",
}


@pytest.mark.parametrize("case", list(HOSTILE_CASES))
def test_relay_status_against_a_hostile_endpoint(hostile, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    srv = hostile(**HOSTILE_CASES[case])
    address = f"127.0.0.1:{srv.port}"
    rc, out = status("--metrics", address, "--json", "--timeout", "1")
    doc = strict_loads(out)
    assert rc == 1
    assert doc["state"] == EXPECTED_STATE.get(case, "down")
    assert address in doc["error"] or doc["error"].startswith("bad data: ")
    assert doc["fix"]
    assert doc["stats"] is None  # nothing of an untrusted answer is passed on
    rc, out = status("--metrics", address, "--timeout", "1")
    assert rc == 1
    badge = "✖ BAD DATA" if doc["state"] == "bad data" else "✖ DOWN"
    assert out.startswith(f"relay    {badge}")
    assert f"note     {doc['error']}" in out and f"next     {doc['fix']}" in out
    assert "Traceback" not in capsys.readouterr().err


def test_relay_status_json_is_strict_when_an_unread_field_is_not_finite(hostile) -> None:
    srv = hostile(stats=json_answer(good_stats(something_new=math.nan, more={"x": [math.inf, 1.5]})))
    rc, out = status("--metrics", srv.url, "--json")
    doc = strict_loads(out)
    assert rc == 0 and doc["state"] == "up"
    assert doc["stats"]["something_new"] is None and doc["stats"]["more"] == {"x": [None, 1.5]}


def test_relay_status_shows_dropped_shed_and_not_bootstrapped(hostile) -> None:
    stats = good_stats(
        dropped={"garbage": 12, "unknown_stream": 3, "wrong_address": 0},
        shed={"idle_session": 2},
        dht__bootstrapped=False,
    )
    srv = hostile(stats=json_answer(stats))
    rc, out = status("--metrics", srv.url)
    assert rc == 1  # listening without the DHT: no peer can find it, so not up
    assert "dropped  garbage 12 · unknown_stream 3\n" in out
    assert "shed     idle_session 2\n" in out
    assert "✖ NOT JOINED" in out and "not joined to the DHT yet (it keeps retrying)" in out
    rc, out = status("--metrics", srv.url, "--json")
    doc = strict_loads(out)
    assert doc["stats"]["dropped"]["garbage"] == 12 and doc["stats"]["dht"]["bootstrapped"] is False


async def test_a_watch_of_a_hostile_relay_is_bad_data_then_up_again(hostile) -> None:
    srv = hostile(stats=json_answer(good_stats(uptime_seconds=math.nan)))
    w = m.RelayWatch(m.Target(metrics=srv.url))
    assert await w.poll(timeout=SAFETY) is True
    assert w.state is m.RelayState.BAD_DATA and w.error is not None and "uptime_seconds" in w.error
    assert w.last is None  # a bad scrape is never kept, so nothing formats or plots it
    srv.routes["/stats"] = json_answer(good_stats())
    await w.poll(timeout=SAFETY)
    assert w.state is m.RelayState.UP and w.uptime() is not None


def test_strict_json_turns_every_non_finite_into_null() -> None:
    doc = {"a": math.nan, "b": [math.inf, -math.inf, 1.0, "x"], 3: {"c": (math.nan,)}}
    out = json.dumps(m.strict_json(doc), allow_nan=False)
    assert strict_loads(out) == {"a": None, "b": [None, None, 1.0, "x"], "3": {"c": [None]}}


def test_a_dns_lookup_that_hangs_is_a_timeout_and_never_holds_up_the_exit() -> None:
    """getaddrinfo blocked forever (a dead resolver), in a real process: `relay status` says
    timed out at its deadline and the process exits (asyncio's own lookup runs in an executor
    thread that is joined at exit, so it would never have)."""
    code = (
        "import socket, sys, threading\n"
        "socket.getaddrinfo = lambda *a, **k: threading.Event().wait()\n"  # no packet ever leaves
        "from cosmictui import cli\n"
        "sys.exit(cli.main(['relay', 'status', '--metrics', 'relay.example:49738', '--timeout', '0.5', '--json']))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SAFETY * 2)
    doc = strict_loads(res.stdout)
    assert res.returncode == 1 and doc["error"] == "timed out after 0.5 s waiting for relay.example:49738/metrics"
