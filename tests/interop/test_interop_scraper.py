"""`--scraper-*` against the real npm hyperdht-prometheus-bridge 2.1.1 on a loopback testnet.

The relay registers its alias with the bridge over the DHT, the bridge's HTTP endpoint serves
the relay's samples (values as in /stats), a restarted bridge (that lost its targets file) and a
restarted relay (new target key) are registered again, a wrong secret and a silent scraper cost
the relay nothing but a counted, once-logged failure, and the Node reference relay
(hyperdht + blind-relay + hyper-instrument 3.2.1) exports the same metric names.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from relay.keys import decode_id
from tests.interop._bridge import Bridge, parse_samples
from tests.interop._relay_net import INTEROP, Testnet, run_peers
from tests.interop._relay_proc import RelayProcess

pytestmark = [pytest.mark.interop, pytest.mark.timeout(300)]

T = TypeVar("T")
# blind-relay-service's gauges (bin.mjs), served to the scraper by both relays
SERVICE_GAUGES = {
    f"blind_relay_{g}_{n}"
    for g, names in (
        ("sessions", ("accepted", "opened", "closed")),
        ("pairings", ("requested", "matched", "cancelled", "pending", "active")),
        ("streams", ("opened", "closed", "errors")),
    )
    for n in names
}
# what hyper-instrument adds that our relay provides too (same names, same meaning)
INSTRUMENT_GAUGES = {
    "process_pid",
    "dht_nr_nodes",
    "dht_is_firewalled",
    "udx_total_bytes_transmitted",
    "udx_total_packets_transmitted",
    "udx_total_bytes_received",
    "udx_total_packets_received",
}


def poll(what: str, fn: Callable[[], T | None], timeout: float = 90.0, every: float = 0.25) -> T:
    """fn() until it returns something truthy; a generous timeout that names what never happened."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for: {what}")
        time.sleep(every)


@pytest.fixture(scope="module")
def testnet(node: str) -> Iterator[Testnet]:
    with Testnet(node, size=4) as tn:
        yield tn


def bootstrap_port(tn: Testnet) -> int:
    return int(tn.bootstrap.split(",")[0].rsplit(":", 1)[1])


def scraped(bridge: Bridge, alias: str) -> str | None:
    status, body = bridge.scrape(alias)
    return body if status == 200 else None


def names(text: str) -> set[str]:
    return {k.split("{", 1)[0] for k in parse_samples(text)}


def scraper_stats(relay: RelayProcess) -> dict[str, Any]:
    return dict(relay.stats().get("scraper") or {})


def test_interop_scraper_registers_serves_stats_and_reregisters_after_restarts(
    node: str, testnet: Testnet, tmp_path: Path
) -> None:
    secret, seed = secrets.token_hex(32), secrets.token_hex(32)
    targets = tmp_path / "targets.json"
    bridge = Bridge(node, bootstrap_port(testnet), secret, seed, targets).start()
    try:
        assert bridge.key is not None
        # the key in z32 (as the bridge prints it), the secret in hex: both spellings accepted
        args = ("--scraper-public-key", bridge.key, "--scraper-secret", secret)
        with RelayProcess(tmp_path / "store", *args, bootstrap=testnet.bootstrap) as relay:
            relay.start()
            assert relay.key is not None
            alias = f"blind-relay-{relay.key}"
            poll("the bridge serving our alias", lambda: scraped(bridge, alias))
            first_target = scraper_stats(relay)["target"]
            assert f"{alias}:{first_target}:" in "".join(bridge.targets_list())
            assert bridge.targets_list()[0].endswith(":blind-relay")

            peers = run_peers(node, testnet.bootstrap, relay.key, relay.port, pairs=1, size=50_000)
            assert peers.all_ok, peers.stderr
            before = relay.stats()
            text = poll("a scrape", lambda: scraped(bridge, alias))
            after = relay.stats()
            samples = parse_samples(text)
            assert names(text) >= SERVICE_GAUGES, SERVICE_GAUGES - names(text)
            for group in ("sessions", "pairings", "streams"):
                for name, value in before[group].items():
                    metric = f"blind_relay_{group}_{name}"
                    if metric in SERVICE_GAUGES:
                        lo, hi = sorted((value, after[group][name]))
                        assert lo <= samples[metric] <= hi, (metric, value, samples[metric])
            assert samples["blind_relay_sessions_accepted"] >= 2 and samples["blind_relay_pairings_matched"] >= 1
            lo, hi = before["traffic"]["relayed_bytes"], after["traffic"]["relayed_bytes"]
            assert lo > 0 and lo <= samples["blind_relay_relayed_bytes_total"] <= hi
            assert samples["process_pid"] == relay.proc.pid  # type: ignore[union-attr]
            assert samples["blind_relay_scraper_registered"] == 1

            # the scraper restarts and lost its targets file: only our re-registration brings the alias back
            bridge.stop(signal.SIGTERM)
            targets.unlink()
            bridge = Bridge(node, bootstrap_port(testnet), secret, seed, targets).start()
            poll("the restarted bridge serving our alias again", lambda: scraped(bridge, alias))
            assert scraper_stats(relay)["registrations"] >= 2
            assert any("Alias request from" in m and alias in m for m in bridge.messages())
            relay.terminate(signal.SIGTERM)
            assert "Traceback" not in relay.stderr

        # the relay restarts: a new target key, registered under the same alias
        with RelayProcess(tmp_path / "store", *args, bootstrap=testnet.bootstrap) as relay:
            relay.start()
            second_target = poll(
                "a registration", lambda: scraper_stats(relay).get("registered") and scraper_stats(relay)["target"]
            )
            assert second_target != first_target
            poll(
                "the alias pointing at the new target",
                lambda: f"{alias}:{second_target}:" in "".join(bridge.targets_list()),
            )
            poll("the bridge serving the restarted relay", lambda: scraped(bridge, alias))
            assert relay.terminate(signal.SIGTERM) == 0
            assert "Traceback" not in relay.stderr
    finally:
        bridge.stop()


def test_interop_scraper_wrong_secret_is_counted_and_said_once(node: str, testnet: Testnet, tmp_path: Path) -> None:
    secret, seed = secrets.token_hex(32), secrets.token_hex(32)
    with Bridge(node, bootstrap_port(testnet), secret, seed, tmp_path / "targets.json") as bridge:
        bridge.start()
        assert bridge.key is not None
        wrong = secrets.token_hex(32)
        args = ("--scraper-public-key", bridge.key, "--scraper-secret", wrong, "--scraper-alias", "gpu-relay-1")
        with RelayProcess(tmp_path / "store", *args, bootstrap=testnet.bootstrap) as relay:
            relay.start()
            st = poll(
                "two failed registrations, the latest refused as unauthorised",
                lambda: (
                    (s := scraper_stats(relay))["registration_failures"] >= 2
                    and "Unauthorised" in (s["last_error"] or "")
                    and s
                ),
            )
            assert st["registered"] is False and st["registrations"] == 0
            assert "--scraper-secret" in st["last_error"]
            # said once: later failures are at debug level
            warned = [ln for ln in relay.stderr.splitlines() if "relay.scraper" in ln and "WARNING" in ln]
            assert len(warned) == 1, relay.stderr
            assert bridge.scrape("gpu-relay-1")[0] == 404
            assert relay.terminate(signal.SIGTERM) == 0


def test_interop_scraper_that_never_answers_costs_the_relay_nothing(
    node: str, testnet: Testnet, tmp_path: Path
) -> None:
    silent = subprocess.Popen(
        [node, "js/silent_scraper.js", json.dumps({"bootstrap": testnet.bootstrap.split(",")})],
        cwd=INTEROP,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert silent.stdout is not None
        key = json.loads(silent.stdout.readline())["key"]
        args = ("--scraper-public-key", key, "--scraper-secret", secrets.token_hex(32))
        with RelayProcess(tmp_path / "store", *args, bootstrap=testnet.bootstrap) as relay:
            relay.start()
            assert relay.key is not None
            peers = run_peers(node, testnet.bootstrap, relay.key, relay.port, pairs=2, size=100_000)
            assert peers.all_ok, peers.stderr
            st = poll(
                "a registration that timed out waiting for the answer",
                lambda: "in time" in ((s := scraper_stats(relay))["last_error"] or "") and s,
            )
            assert st["registered"] is False
            assert relay.stats()["pairings"]["matched"] >= 2
            failures = scraper_stats(relay)["registration_failures"]
            assert relay.terminate(signal.SIGTERM) == 0
            warned = [ln for ln in relay.stderr.splitlines() if "relay.scraper" in ln and "WARNING" in ln]
            assert len(warned) == 1, relay.stderr
    finally:
        assert silent.stdin is not None
        silent.stdin.close()
        silent.wait(20)
        out = silent.stdout.read() if silent.stdout else ""
    # one attempt at a time: the silent scraper saw no more connections than attempts were made
    # (those that failed, plus at most the one under way, plus one started as the relay stopped)
    connections = [json.loads(ln) for ln in out.splitlines() if ln.startswith('{"connection"')]
    assert 1 <= len(connections) <= failures + 2


def test_interop_scraper_node_reference_relay_exports_the_same_names(
    node: str, testnet: Testnet, tmp_path: Path
) -> None:
    secret, seed = secrets.token_hex(32), secrets.token_hex(32)
    with Bridge(node, bootstrap_port(testnet), secret, seed, tmp_path / "targets.json") as bridge:
        bridge.start()
        assert bridge.key is not None
        opts = {"bootstrap": testnet.bootstrap.split(","), "scraperPublicKey": bridge.key, "scraperSecret": secret}
        ref = subprocess.Popen(
            [node, "js/instrumented_relay.js", json.dumps({**opts, "alias": "node-relay"})],
            cwd=INTEROP,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert ref.stdout is not None
            json.loads(ref.stdout.readline())
            node_text = poll("the Node relay's metrics through the bridge", lambda: scraped(bridge, "node-relay"))
        finally:
            assert ref.stdin is not None
            ref.stdin.close()
            ref.wait(20)
        args = ("--scraper-public-key", bridge.key, "--scraper-secret", secret, "--scraper-alias", "python-relay")
        with RelayProcess(tmp_path / "store", *args, bootstrap=testnet.bootstrap) as relay:
            relay.start()
            ours = poll("our relay's metrics through the bridge", lambda: scraped(bridge, "python-relay"))
            relay.terminate(signal.SIGTERM)
    node_names, our_names = names(node_text), names(ours)
    node_blind = {n for n in node_names if n.startswith("blind_relay_")}
    assert node_blind == SERVICE_GAUGES
    assert node_blind <= our_names
    assert node_names >= INSTRUMENT_GAUGES, INSTRUMENT_GAUGES - node_names
    assert our_names >= INSTRUMENT_GAUGES
    assert "package_version" in node_names and "package_version" in our_names


CONNECT_JS = """
const DHT = require('hyperdht')
const [bootstrap, key] = process.argv.slice(1)
const [host, port] = bootstrap.split(':')
const dht = new DHT({ bootstrap: [{ host, port: Number(port) }] })
const socket = dht.connect(Buffer.from(key, 'hex'))
const timer = setTimeout(() => done('timeout'), 30000)
socket.on('open', () => done('open'))
socket.on('error', (e) => done(e.code || e.message))
function done (r) { clearTimeout(timer); console.log(r); dht.destroy().then(() => process.exit(0)) }
"""


def test_interop_scraper_target_key_admits_only_the_scraper(node: str, testnet: Testnet, tmp_path: Path) -> None:
    """Another hyperdht peer cannot read the relay's metrics through the target key: its handshake
    is dropped (as dht-prom-client's firewall does) and counted."""
    args = ("--scraper-public-key", "ab" * 32, "--scraper-secret", "cd" * 32)
    with RelayProcess(tmp_path / "store", *args, bootstrap=testnet.bootstrap) as relay:
        relay.start()
        target = decode_id(scraper_stats(relay)["target"]).hex()
        first = testnet.bootstrap.split(",")[0]
        r = subprocess.run(
            [node, "-e", CONNECT_JS, first, target], cwd=INTEROP, capture_output=True, text=True, timeout=90
        )
        assert r.stdout.strip() not in ("", "open"), r.stdout + r.stderr
        poll("the refusal counted", lambda: scraper_stats(relay)["connections_refused"] >= 1)
        assert scraper_stats(relay)["metrics_served"] == 0
        assert relay.terminate(signal.SIGTERM) == 0
