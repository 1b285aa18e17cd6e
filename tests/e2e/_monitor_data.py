"""A fixed two-minute story of a busy relay, for the monitor's snapshot tests.

Snapshots must not change from run to run, so these scrapes are made up — in the exact shape
the real `/metrics` + `/stats` have — and fed through the same `RelayWatch.observe` the live
monitor uses. The live behaviour is proven against real relays in test_monitor_live.py.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from cosmictui.ops.metrics.client import BadData, RelayState, RelayWatch, Scrape, Target, _failure

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
SECONDS = 120
END = T0 + SECONDS
KEY = "rbpmw4ay5x8xaj8p5ehgo1cwasrprdf1gh8w3x8j7g5bwq5zxqfo"
LOG_LINES = [
    "Using corestore storage at /var/lib/blind-relay",
    "Server listening on " + KEY,
    "2027-01-15T05:00:01Z INFO    relay: relay listening port=49737 host=0.0.0.0 metrics=http://127.0.0.1:49738",
    "2027-01-15T05:00:03Z INFO    dht: bootstrapped nodes=24 public=203.0.113.7:49737 firewalled=false",
    "2027-01-15T07:58:10Z INFO    blindrelay: pair matched token=3f9a…c1 streams=2",
    "2027-01-15T07:59:21Z INFO    blindrelay: pair matched token=77b0…e4 streams=2",
    "2027-01-15T07:59:58Z INFO    dht: announced key=" + KEY[:8] + "… nodes=20",
]


def write_log(storage: Path) -> None:
    storage.mkdir(parents=True, exist_ok=True)
    (storage / "blind-relay.log").write_text("\n".join(LOG_LINES) + "\n")


def _scrape(i: int, pid: int, key: str, rss_base: float, load: float, extra: dict[str, Any] | None = None) -> Scrape:
    wave = 1 + 0.5 * math.sin(i / 9) + 0.25 * math.sin(i / 3.7)
    bytes_s = 1.4e6 * load * wave
    pkts_s = bytes_s / 1100
    cum = lambda rate: rate * i + 5e9 * load  # noqa: E731 - plenty relayed before the window
    relayed = cum(1.4e6 * load) + 1.4e6 * load * (-4.5 * math.cos(i / 9) - 0.925 * math.cos(i / 3.7))
    values = {
        "blind_relay_sessions_accepted": 41.0,
        "blind_relay_sessions_opened": 41.0,
        "blind_relay_sessions_closed": 35.0,
        "blind_relay_pairings_requested": 40.0,
        "blind_relay_pairings_matched": 17.0 + (i // 40),
        "blind_relay_pairings_cancelled": 2.0,
        "blind_relay_pairings_pending": 1.0,
        "blind_relay_pairings_active": 3.0,
        "blind_relay_streams_opened": 36.0,
        "blind_relay_streams_closed": 30.0,
        "blind_relay_streams_errors": 1.0,
        "blind_relay_relayed_bytes_total": relayed,
        "blind_relay_relayed_packets_total": relayed / 1100,
        "blind_relay_dropped_packets_total": 12.0,
        "blind_relay_udp_received_bytes_total": relayed * 1.02,
        "blind_relay_udp_sent_bytes_total": relayed * 1.01,
        "blind_relay_udp_received_packets_total": relayed * 1.02 / 1100,
        "blind_relay_udp_sent_packets_total": relayed * 1.01 / 1100,
        "process_resident_memory_bytes": rss_base + 2.5e6 * math.sin(i / 20) + 10_000 * i,
        "process_cpu_seconds_total": 900.0 + 0.004 * i * load * 10 + 0.01 * pkts_s / 1000 * i,
        "process_start_time_seconds": T0 - 3 * 3600,
    }
    stats = {
        "key": key,
        "version": "0.1.0",
        "pid": pid,
        "uptime_seconds": 3 * 3600 + i,
        "storage": "/var/lib/blind-relay",
        "host": "0.0.0.0",
        "port": 49737,
        "dht": {
            "bootstrapped": True,
            "firewalled": False,
            "public_host": "203.0.113.7",
            "public_port": 49737,
            "last_announce": T0 + SECONDS - 42,
            "nodes": 24,
        },
    }
    for name, value in (extra or {}).items():
        if isinstance(value, dict) and isinstance(stats.get(name), dict):
            stats[name] = {**stats[name], **value}
        else:
            stats[name] = value
    t = T0 + i
    return Scrape(at=t, wall=t, values=values, stats=stats)


def busy_watch(
    storage: Path,
    pid: int = 48211,
    key: str = KEY,
    rss: float = 46e6,
    load: float = 1.0,
    seconds: int = SECONDS,
    extra: dict[str, Any] | None = None,
) -> RelayWatch:
    """A relay seen for two minutes at 1 Hz, relaying ~1.4 MB/s with three active pairs;
    `extra` adds or overrides /stats blocks (e.g. the newer dropped/shed)."""
    w = RelayWatch(Target(storage=storage))
    for i in range(seconds + 1):
        w.observe(_scrape(i, pid, key, rss, load, extra))
    return w


NEW_STATS = {
    "dropped": {"garbage": 1204, "unknown_stream": 37, "wrong_address": 5, "firewalled": 0},
    "shed": {"idle_session": 12, "heaviest_address": 3},
}
"""The /stats blocks the relay added for issue 13 (seam in the brief), as the monitor shows them."""


def bad_data_watch(address: str) -> RelayWatch:
    """A relay that answers with an uptime no relay has (as a hostile endpoint did)."""
    w = RelayWatch(Target(metrics=address))
    e = BadData("/stats", "uptime_seconds", "1e+300 is out of range").at("http://" + address)
    w.observe_failure(e.reason, END, RelayState.BAD_DATA, e.fix)
    return w


def down_watch(storage: Path) -> RelayWatch:
    """The same relay, then two refreshes without an answer."""
    w = busy_watch(storage, seconds=SECONDS - 2)
    e = _failure("http://127.0.0.1:49738", "/metrics", ConnectionRefusedError(), 2.0)  # the words the scraper uses
    w.observe_failure(e.reason, T0 + SECONDS - 1, fix=e.fix)
    w.observe_failure(e.reason, T0 + SECONDS, fix=e.fix)
    return w


def timed_out_watch(address: str) -> RelayWatch:
    w = RelayWatch(Target(metrics=address))
    e = _failure("http://" + address, "/metrics", TimeoutError(), 2.0)
    w.observe_failure(e.reason, END, fix=e.fix)
    return w
