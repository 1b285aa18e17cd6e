"""The monitor's data layer: parsing the contract, rates, and noticing a relay go and come back."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cosmictui.ops.metrics import client as m
from tests.unit._metrics_server import FakeRelayMetrics


@pytest.fixture
def relay():
    fake = FakeRelayMetrics()
    yield fake
    fake.close()


def test_normalize_url_accepts_the_forms_operators_type():
    assert m.normalize_url("127.0.0.1:49738") == "http://127.0.0.1:49738"
    assert m.normalize_url("http://127.0.0.1:49738/") == "http://127.0.0.1:49738"
    assert m.normalize_url("http://127.0.0.1:49738/metrics") == "http://127.0.0.1:49738"
    assert m.normalize_url("https://relay.example/stats") == "https://relay.example"
    assert m.normalize_url("http://h:1/prefix/metrics") == "http://h:1/prefix"
    for bad in ("", "ftp://x", "http://"):
        with pytest.raises(ValueError):
            m.normalize_url(bad)


def test_normalize_url_refuses_addresses_http_client_cannot_connect_to():
    for bad in ("bad:addr:x", "h:0", "h:70000", "::1:9", "http://user@h:1", "h:port"):
        with pytest.raises(ValueError, match="bad metrics address"):
            m.normalize_url(bad)
    assert m.normalize_url("[::1]:9") == "http://[::1]:9"


def test_bad_address_is_a_down_relay_not_a_crash():
    with pytest.raises(m.BadAddress):
        asyncio.run(m._get("http://bad:addr:x/metrics", 1024))
    with pytest.raises(m.MetricsError, match="bad address"):
        m.fetch("bad:addr:x", timeout=1.0)


async def test_watch_of_a_bad_address_from_a_runtime_file_is_down_not_a_crash(monkeypatch):
    w = m.RelayWatch(m.Target(metrics="127.0.0.1:1"))
    w.url = "http://bad:addr:x"  # as if a runtime file named it: poll must not raise
    monkeypatch.setattr(w, "resolve", lambda: (w.url, ""))
    await w.poll(timeout=1.0)
    assert w.state is m.RelayState.DOWN and w.error is not None and "bad address" in w.error


def test_fetch_of_a_server_that_does_not_speak_http_is_an_error():
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def answer() -> None:
        conn, _ = srv.accept()
        conn.recv(1024)
        conn.sendall(b"SSH-2.0-nothttp\r\n\r\n")
        conn.close()

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        with pytest.raises(m.MetricsError, match="answered, but not with HTTP") as e:
            m.fetch(f"127.0.0.1:{srv.getsockname()[1]}", timeout=5.0)
        assert "metrics port" in e.value.fix
    finally:
        t.join(10)
        srv.close()


def test_parse_metrics_reads_contract_names_sums_labels_and_drops_created():
    text = (
        "# TYPE blind_relay_relayed_bytes counter\n"
        "blind_relay_relayed_bytes_total 1234.0\n"
        "blind_relay_relayed_bytes_created 1.7e9\n"
        "# TYPE blind_relay_pairings_active gauge\n"
        "blind_relay_pairings_active 3\n"
        '# TYPE x_total counter\nx_total{dir="in"} 5\nx_total{dir="out"} 7\n'
    )
    v = m.parse_metrics(text)
    assert v["blind_relay_relayed_bytes_total"] == 1234.0
    assert v["blind_relay_pairings_active"] == 3.0
    assert v["x_total"] == 12.0
    assert "blind_relay_relayed_bytes_created" not in v


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_parse_metrics_never_crashes_on_random_text(text):
    try:
        out = m.parse_metrics(text)
    except m.MetricsError:
        return
    assert all(isinstance(v, float) for v in out.values())


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_parse_stats_never_crashes_on_random_bytes(data):
    try:
        out = m.parse_stats(data)
    except m.MetricsError:
        return
    assert isinstance(out, dict)


def test_parse_stats_rejects_non_objects():
    with pytest.raises(m.MetricsError, match="JSON object"):
        m.parse_stats(b"[1,2]")


def test_fetch_reads_metrics_and_stats_from_the_endpoint(relay):
    relay.gauges["blind_relay_pairings_active"].set(2)
    relay.counters["blind_relay_relayed_bytes"].inc(5000)
    s = m.fetch(relay.url + "/metrics", timeout=5)
    assert s.get("blind_relay_pairings_active") == 2
    assert s.get("blind_relay_relayed_bytes_total") == 5000
    assert s.rss_bytes == 42_000_000
    assert s.stat("key") == relay.key
    assert s.stat("dht", "public_host") == "203.0.113.7"
    assert s.stat("traffic", "relayed_bytes") == 5000


def test_fetch_without_stats_endpoint_still_gives_metrics(relay):
    relay.stats_status = 404
    s = m.fetch(relay.url, timeout=5)
    assert s.stats is None
    assert s.get("blind_relay_sessions_accepted") == 0


def test_fetch_garbage_metrics_is_a_clear_error(relay):
    relay.metrics_body = b"\x00\xffthis is { not prometheus"
    with pytest.raises(m.MetricsError, match="not Prometheus text"):
        m.fetch(relay.url, timeout=5)


def test_fetch_refused_names_the_address_and_the_next_step():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(m.MetricsError, match=f"connection refused by 127.0.0.1:{port}") as e:
        m.fetch(f"127.0.0.1:{port}", timeout=5)
    assert "is the relay running?" in e.value.fix and "--metrics" in e.value.fix


def _scrape(at, pid=1, **values):
    base = {"process_start_time_seconds": 1000.0}
    return m.Scrape(at=at, wall=at, values=base | {k: float(v) for k, v in values.items()}, stats={"pid": pid})


def test_up_since_is_when_the_relay_started_not_when_the_monitor_first_saw_it():
    w = m.RelayWatch(m.Target(metrics="a:1"))
    s = m.Scrape(at=5000.0, wall=5000.0, values={"process_start_time_seconds": 1000.0}, stats={"uptime_seconds": 3600})
    w.observe(s)
    assert w.since == 5000.0  # the state change the monitor saw
    assert w.started_at() == 1400.0  # /stats uptime wins
    assert w.uptime(now=5010.0) == 3610.0
    w2 = m.RelayWatch(m.Target(metrics="a:1"))
    w2.observe(m.Scrape(at=5000.0, wall=5000.0, values={"process_start_time_seconds": 1000.0}))
    assert w2.started_at() == 1000.0  # a plain exporter: the process start time
    w2.observe_failure("gone", 5001.0)
    assert w2.started_at() is None and w2.uptime() is None


def test_rates_difference_counters_per_second():
    a = _scrape(
        10.0,
        blind_relay_relayed_bytes_total=1000,
        process_cpu_seconds_total=1.0,
        blind_relay_udp_received_packets_total=10,
        blind_relay_pairings_matched=4,
    )
    b = _scrape(
        12.0,
        blind_relay_relayed_bytes_total=5000,
        process_cpu_seconds_total=1.1,
        blind_relay_udp_received_packets_total=30,
        blind_relay_pairings_matched=8,
    )
    r = m.rates_between(a, b)
    assert r is not None and r.seconds == 2.0
    assert r["relayed_bytes"] == 2000.0
    assert r["received_packets"] == 10.0
    assert r["pairings_matched"] == 2.0
    assert r.cpu_percent == pytest.approx(5.0)
    assert r["sent_bytes"] == 0.0  # missing on both sides: no number invented


def test_rates_are_none_across_a_restart_or_a_counter_reset():
    a = _scrape(1.0, pid=1, blind_relay_relayed_bytes_total=1000)
    assert m.rates_between(a, _scrape(2.0, pid=2, blind_relay_relayed_bytes_total=10)) is None
    assert m.rates_between(a, _scrape(2.0, pid=1, blind_relay_relayed_bytes_total=10)) is None
    assert m.rates_between(a, _scrape(1.0, pid=1, blind_relay_relayed_bytes_total=2000)) is None


def test_watch_reports_news_only_when_activity_changes():
    w = m.RelayWatch(m.Target(metrics="127.0.0.1:1"))
    assert w.observe(_scrape(1.0, blind_relay_relayed_packets_total=5, blind_relay_udp_received_packets_total=5))
    # idle: nothing relayed; DHT ping/announce chatter on the UDP socket alone is not news
    assert not w.observe(_scrape(2.0, blind_relay_relayed_packets_total=5, blind_relay_udp_received_packets_total=9))
    assert w.observe(_scrape(3.0, blind_relay_relayed_packets_total=9, blind_relay_udp_received_packets_total=13))
    assert not w.observe(_scrape(4.0, blind_relay_relayed_packets_total=9, blind_relay_udp_received_packets_total=13))
    assert w.observe(_scrape(5.0, blind_relay_relayed_packets_total=9, blind_relay_pairings_pending=1))  # a pair waits
    assert [v for _, v in w.history["in_pps"]][:3] == [4.0, 4.0, 0.0]
    assert w.observe_failure("no answer", 6.0) is True
    assert w.state is m.RelayState.DOWN and w.rates is None
    assert w.observe_failure("no answer", 7.0) is False
    assert w.observe(_scrape(8.0, pid=7)) is True and w.state is m.RelayState.UP


async def test_watch_sees_a_relay_stop_answering_and_reattaches(relay):
    w = m.RelayWatch(m.Target(metrics=relay.url))
    await w.poll(timeout=5)
    assert w.state is m.RelayState.UP
    relay.counters["blind_relay_udp_sent_bytes"].inc(3000)
    await w.poll(timeout=5)
    assert w.rates is not None and w.rates["sent_bytes"] > 0
    port = relay.port
    relay.close()
    assert await w.poll(timeout=5) is True  # news on the first failed refresh
    assert w.state is m.RelayState.DOWN and f"connection refused by 127.0.0.1:{port}" in (w.error or "")
    assert w.fix and "is the relay running?" in w.fix
    # the same address answers again (a restarted relay): reattached on the next refresh
    back = FakeRelayMetrics(pid=4343, port=port)
    try:
        assert await w.poll(timeout=5) is True
        assert w.state is m.RelayState.UP and w.error is None and w.rates is None
        assert w.last is not None and w.last.stat("pid") == 4343
    finally:
        back.close()


async def test_watch_marks_a_hung_relay_down_after_its_timeout(relay):
    w = m.RelayWatch(m.Target(metrics=relay.url))
    await w.poll(timeout=5)
    relay.hang.set()
    await w.poll(timeout=0.3)
    assert w.state is m.RelayState.DOWN
    assert w.error == f"timed out after 0.3 s waiting for 127.0.0.1:{relay.port}/metrics"
    relay.hang.clear()
    relay.release.set()
    await w.poll(timeout=5)
    assert w.state is m.RelayState.UP


@pytest.fixture
def relay_named_process():
    """A live process whose command line names the relay, as ops.relayproc checks pids."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "relay"], stdin=subprocess.PIPE)
    yield p
    p.kill()
    p.wait(30)


async def test_storage_target_follows_the_runtime_file(tmp_path: Path, relay, relay_named_process):
    w = m.RelayWatch(m.Target(storage=tmp_path))
    await w.poll()
    assert w.state is m.RelayState.NOT_RUNNING and m.RUNTIME_FILE in (w.error or "")
    # a runtime file left by a dead process is not a running relay
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    rt = {
        "pid": int(dead.stdout),
        "key": relay.key,
        "host": "0.0.0.0",
        "port": 1,
        "metrics": relay.url,
        "started_at": 0,
        "version": "x",
    }
    (tmp_path / m.RUNTIME_FILE).write_text(json.dumps(rt))
    await w.poll()
    assert w.state is m.RelayState.NOT_RUNNING and "gone" in (w.error or "")
    assert w.fix == f"start it: blind-relay --storage {tmp_path}"
    assert w.key == relay.key  # known from the runtime file even while not running
    rt["pid"] = relay_named_process.pid
    (tmp_path / m.RUNTIME_FILE).write_text(json.dumps(rt))
    await w.poll(timeout=5)
    assert w.state is m.RelayState.UP and w.key == relay.key
    assert w.target.log_path() == tmp_path / m.LOG_FILE
    rt["metrics"], rt["started_at"] = None, 50.0
    (tmp_path / m.RUNTIME_FILE).write_text(json.dumps(rt))
    await w.poll()
    # the pid is alive: running, just without numbers (not "NOT RUNNING")
    assert w.state is m.RelayState.METRICS_OFF and w.state in m.RUNNING
    assert w.error == "metrics off — start the relay with --metrics HOST:PORT to see numbers"
    assert m.STATE_BADGE[w.state] == "▲ RUNNING" and w.fix is None
    assert w.started_at() == 50.0 and w.uptime(now=100.0) == 50.0  # from the runtime file's started_at
    assert m.summarize([w])["up"] == 1


def test_summary_adds_up_relays_that_answer():
    a, b = m.RelayWatch(m.Target(metrics="a:1")), m.RelayWatch(m.Target(metrics="b:1"))
    a.observe(_scrape(1.0, process_resident_memory_bytes=10e6, blind_relay_pairings_active=2))
    b.observe(_scrape(1.0, process_resident_memory_bytes=30e6, blind_relay_pairings_active=1))
    b.observe_failure("no answer", 2.0)
    s = m.summarize([a, b])
    assert (s["relays"], s["up"], s["rss_bytes"], s["pairings_active"]) == (2, 1, 10e6, 2)


def test_log_tail_reads_the_end_and_only_rereads_on_change(tmp_path: Path):
    log = tmp_path / m.LOG_FILE
    t = m.LogTail(log, lines=3, max_bytes=64)
    assert t.read() == ([], False)
    log.write_text("".join(f"line {i}\n" for i in range(50)))
    lines, changed = t.read()
    assert changed and lines == ["line 47", "line 48", "line 49"]
    assert t.read() == (lines, False)
    with log.open("a") as f:
        f.write("Server listening on abc\n")
    lines, changed = t.read()
    assert changed and lines[-1] == "Server listening on abc"
    log.unlink()
    assert t.read() == ([], True)


def test_human_units():
    assert m.human_bytes(512) == "512 B"
    assert m.human_bytes(1536, per_second=True) == "1.5 KB/s"
    assert m.human_bytes(None) == "–"
    assert m.human_duration(3725) == "1h02m05s"
    assert m.human_duration(90061) == "1d 01h01m"


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.05, 30.0), st.integers(0, 10**9), st.booleans()),
        min_size=2,
        max_size=30,
    )
)
def test_rates_add_back_up_to_the_counter_and_a_restart_never_goes_negative(steps):
    """Sum of rate × interval over a watch's samples equals what the counter grew by; a restart
    (new pid, counter from zero) starts fresh instead of producing a negative rate."""
    w = m.RelayWatch(m.Target(metrics="127.0.0.1:1"))
    t, counter, pid, grown = 0.0, 0, 1, 0.0
    first = True
    for dt, inc, restart in steps:
        t += dt
        if restart and not first:
            pid, counter = pid + 1, 0
        else:
            counter += inc
            if not first:
                grown += inc
        w.observe(_scrape(t, pid=pid, blind_relay_relayed_bytes_total=counter))
        if w.rates is not None:
            assert w.rates["relayed_bytes"] >= 0
            grown -= w.rates["relayed_bytes"] * w.rates.seconds
        elif not first:
            grown = 0.0  # a restart: nothing to account for across it
        first = False
    assert abs(grown) <= 1e-6 * max(1.0, float(counter))
