"""The Prometheus pack (deploy/prometheus, deploy/grafana) against a real Prometheus server.

Debian's `prometheus` (installed by .ci/run) runs on a loopback port with its own storage in
tmp and the shipped example configuration, its addresses pointed at this test's relay and
bridge and its intervals at 1 s: it scrapes the relay over HTTP (`--metrics`) and through the
real hyperdht-prometheus-bridge (`--scraper-*`), loads the shipped rules, and every query of
every Grafana panel returns data.
"""

from __future__ import annotations

import io
import json
import secrets
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cosmictui.cli import main as cosmictui_main
from cosmictui.ops.metrics.prometheus import relays_from_prometheus
from tests.interop._bridge import Bridge
from tests.interop._relay_net import Testnet, run_peers
from tests.interop._relay_proc import ROOT, RelayProcess, free_tcp_port

pytestmark = [pytest.mark.interop, pytest.mark.timeout(300)]

PACK = ROOT / "deploy"
T = TypeVar("T")


def poll(what: str, fn: Callable[[], T | None], timeout: float = 90.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for: {what}")
        time.sleep(0.25)


@pytest.fixture(scope="module")
def prometheus_exe() -> str:
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.fail("prometheus is not installed: `apt-get install prometheus` (.ci/run installs it)")
    return exe


@pytest.fixture(scope="module")
def testnet(node: str) -> Iterator[Testnet]:
    with Testnet(node, size=4) as tn:
        yield tn


class Prometheus:
    def __init__(self, exe: str, config: Path, data: Path) -> None:
        self.port = free_tcp_port()
        self.proc = subprocess.Popen(
            [
                exe,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
            return json.loads(r.read())

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=5) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        doc = self.get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert doc["status"] == "success", (expr, doc)
        return list(doc["data"]["result"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def shipped_config(relay_metrics: str, bridge_http: str, targets: Path, rules: Path) -> str:
    """deploy/prometheus/prometheus.yml with this test's addresses and 1 s intervals."""
    text = (PACK / "prometheus" / "prometheus.yml").read_text()
    for old, new in (
        ("15s", "1s"),
        ("127.0.0.1:49738", relay_metrics),
        ("127.0.0.1:30000", bridge_http),
        ("- targets.json", f"- {targets}"),
        ("- blind-relay.rules.yml", f"- {rules}"),
    ):
        assert old in text, f"the shipped prometheus.yml no longer has {old!r}"
        text = text.replace(old, new)
    return text


def panel_queries() -> list[tuple[str, str]]:
    dash = json.loads((PACK / "grafana" / "blind-relay.json").read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in (
                ("$__rate_interval", "10s"),
                ("$job", "blind-relay|blind-relay-dht"),
                ("$instance", ".*"),
            ):
                expr = expr.replace(var, value)
            assert "$" not in expr, expr
            out.append((f"{panel['title']} / {target['legendFormat']}", expr))
    return out


def test_interop_prometheus_scrapes_relay_over_http_and_bridge_rules_load_every_panel_has_data(
    node: str, testnet: Testnet, prometheus_exe: str, tmp_path: Path
) -> None:
    secret, seed = secrets.token_hex(32), secrets.token_hex(32)
    bport = int(testnet.bootstrap.split(",")[0].rsplit(":", 1)[1])
    targets = tmp_path / "targets.json"
    with Bridge(node, bport, secret, seed, targets) as bridge:
        bridge.start()
        assert bridge.key is not None
        args = ("--scraper-public-key", bridge.key, "--scraper-secret", secret, "--scraper-alias", "relay-under-test")
        with RelayProcess(tmp_path / "store", *args, bootstrap=testnet.bootstrap) as relay:
            relay.start()
            assert relay.key is not None
            poll(
                "the alias in the bridge's targets.json",
                lambda: any("relay-under-test:" in t for t in bridge.targets_list()),
            )
            peers = run_peers(node, testnet.bootstrap, relay.key, relay.port, pairs=2, size=200_000)
            assert peers.all_ok, peers.stderr

            config = tmp_path / "prometheus.yml"
            rules = PACK / "prometheus" / "blind-relay.rules.yml"
            config.write_text(
                shipped_config(
                    relay.metrics_url.removeprefix("http://"), f"127.0.0.1:{bridge.http_port}", targets, rules
                )
            )
            prom = Prometheus(prometheus_exe, config, tmp_path / "tsdb")
            try:
                poll("Prometheus ready", prom.ready, timeout=60)
                up = poll(
                    "both jobs up",
                    lambda: (
                        (r := prom.query("up == 1"))
                        and {x["metric"]["job"] for x in r} >= {"blind-relay", "blind-relay-dht"}
                        and r
                    ),
                )
                dht = next(x["metric"] for x in up if x["metric"]["job"] == "blind-relay-dht")
                assert dht["instance"] == "relay-under-test" and dht["hostname"]
                groups = prom.get("/api/v1/rules")["data"]["groups"]
                assert {g["name"] for g in groups} == {"blind-relay.records", "blind-relay.alerts"}
                assert all(r["health"] == "ok" for g in groups for r in g["rules"]), groups
                # the same relay seen both ways: the same count of accepted sessions
                accepted = poll(
                    "sessions counted by both jobs",
                    lambda: (r := prom.query("blind_relay_sessions_accepted >= 4")) and len(r) == 2 and r,
                )
                assert {x["value"][1] for x in accepted} == {str(relay.stats()["sessions"]["accepted"])}
                ratio = poll(
                    "the memory budget ratio for both jobs",
                    lambda: (r := prom.query("blind_relay:memory_rss:budget_ratio")) and len(r) == 2 and r,
                )
                assert {x["metric"]["job"] for x in ratio} == {"blind-relay", "blind-relay-dht"}
                assert all(0 < float(x["value"][1]) < 1 for x in ratio)
                missing = []
                for name, expr in panel_queries():
                    try:
                        poll(name, lambda expr=expr: prom.query(expr), timeout=30)
                    except AssertionError:
                        missing.append((name, expr))
                assert not missing, missing
                firing = prom.query('ALERTS{alertname=~"BlindRelayDown|BlindRelayNotBootstrapped"}')
                assert firing == [], firing
                # `cosmictui relay status --prometheus`: the same relay, once per job, as /stats says
                rows = relays_from_prometheus(f"http://127.0.0.1:{prom.port}")
                stats = relay.stats()
                assert [(r.job, r.instance) for r in rows] == [
                    ("blind-relay", relay.metrics_url.removeprefix("http://")),
                    ("blind-relay-dht", "relay-under-test"),
                ]
                for row in rows:
                    assert row.up and row.state == "up" and row.key == relay.key and row.bootstrapped is True
                    assert row.sessions_open == stats["sessions"]["opened"] - stats["sessions"]["closed"]
                    assert row.rss_bytes is not None and 0 < row.rss_bytes < 200e6
                    assert row.scraper_registered is True and row.uptime_seconds is not None
                out = io.StringIO()
                assert cosmictui_main(["relay", "status", "--prometheus", f"127.0.0.1:{prom.port}"], out) == 0
                lines = out.getvalue().splitlines()
                assert lines[-1] == "2 relay targets, 0 not up"
                assert any(ln.startswith("▲ UP") and "relay-under-test" in ln for ln in lines), lines
                out = io.StringIO()
                assert cosmictui_main(["relay", "status", "--prometheus", f"127.0.0.1:{prom.port}", "--json"], out) == 0
                assert [r["state"] for r in json.loads(out.getvalue())["relays"]] == ["up", "up"]
            finally:
                prom.stop()
            assert relay.terminate(signal.SIGTERM) == 0
