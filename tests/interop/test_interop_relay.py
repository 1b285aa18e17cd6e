"""The Python relay (its own process, `python -m relay`) carrying real Node hyperdht connections.

Everything runs on 127.0.0.1: a Node `hyperdht/testnet`, our relay bootstrapped on it, and Node
peers (`js/relay_peers.js`) that connect with `relayThrough: <our key>`. "Relayed" is checked
the way the peers see it: both ends' `rawStream.remotePort` is the relay's UDP port.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from relay.keys import encode_id, key_pair
from tests.interop._relay_net import INTEROP, Testnet, run_peers
from tests.interop._relay_proc import RelayProcess

pytestmark = [pytest.mark.interop, pytest.mark.timeout(240)]

PAYLOAD = 200_000


@pytest.fixture(scope="module")
def testnet(node: str) -> Iterator[Testnet]:
    with Testnet(node, size=5) as tn:
        yield tn


@pytest.fixture(scope="module")
def relay(testnet: Testnet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    store = tmp_path_factory.mktemp("relay") / "store"
    with RelayProcess(store, "--log-level", "debug", bootstrap=testnet.bootstrap) as r:
        r.start()
        assert r.key is not None, r.stderr
        yield r


def metrics(r: RelayProcess) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(r.get("/metrics").decode()):
        for s in fam.samples:
            key = s.name if not s.labels else f"{s.name}{{{','.join(f'{k}={v}' for k, v in s.labels.items())}}}"
            out[key] = s.value
    return out


def wait_until(cond: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll a condition (a safety-net timeout only: the condition is what we wait on)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


def assert_relayed(res, relay: RelayProcess, pairs: int = 1) -> None:  # type: ignore[no-untyped-def]
    assert res.all_ok, (res.pairs, res.summary, res.stderr[-2000:], relay.stderr[-3000:])
    assert len(res.pairs) == pairs
    for p in res.pairs:
        assert p["ok"], p
        assert p["relayed"], p
        assert p["clientRemotePort"] == relay.port and p["serverRemotePort"] == relay.port, p


@pytest.mark.parametrize("mode", ["client", "server", "both"])
def test_interop_relay_relay_through_echoes_200kb(node: str, testnet: Testnet, relay: RelayProcess, mode: str) -> None:
    """client-side relayThrough, server-side (punching off), both sides: 200 kB echoed intact via our port."""
    res = run_peers(node, testnet.bootstrap, relay.key or "", relay.port, mode, size=PAYLOAD)
    assert_relayed(res, relay)


def test_interop_relay_metrics_move_with_a_real_pair(node: str, testnet: Testnet, relay: RelayProcess) -> None:
    before = metrics(relay)
    res = run_peers(node, testnet.bootstrap, relay.key or "", relay.port, "client", size=PAYLOAD)
    assert_relayed(res, relay)

    def settled() -> bool:
        m = metrics(relay)
        return (
            m["blind_relay_sessions_closed"] >= before["blind_relay_sessions_closed"] + 2
            and m["blind_relay_streams_closed"] >= before["blind_relay_streams_closed"] + 2
        )

    wait_until(settled)
    after = metrics(relay)
    assert after["blind_relay_sessions_accepted"] - before["blind_relay_sessions_accepted"] == 2
    assert after["blind_relay_sessions_opened"] - before["blind_relay_sessions_opened"] == 2
    assert after["blind_relay_pairings_requested"] - before["blind_relay_pairings_requested"] == 2
    assert after["blind_relay_pairings_matched"] - before["blind_relay_pairings_matched"] == 1
    assert after["blind_relay_streams_opened"] - before["blind_relay_streams_opened"] == 2
    assert after["blind_relay_pairings_pending"] == 0
    # the peers closed: both relay streams and the pairing are gone again
    assert after["blind_relay_streams_closed"] - before["blind_relay_streams_closed"] == 2
    assert after["blind_relay_pairings_active"] == 0
    # the 200 kB went out and came back through the relay: at least 400 kB of UDX packets forwarded
    relayed = after["blind_relay_relayed_bytes_total"] - before["blind_relay_relayed_bytes_total"]
    assert relayed >= 2 * PAYLOAD, relayed
    assert after["blind_relay_relayed_packets_total"] > before["blind_relay_relayed_packets_total"]
    assert after["blind_relay_udp_received_bytes_total"] - before["blind_relay_udp_received_bytes_total"] >= relayed
    stats = relay.stats()
    assert stats["dht"]["bootstrapped"] is True and stats["dht"]["nodes"] >= 3
    assert stats["key"] == relay.key and stats["port"] == relay.port


def test_interop_relay_default_path_upgrades_to_direct(node: str, testnet: Testnet, relay: RelayProcess) -> None:
    """hyperdht's default: relayed through our relay first, then the peers punch through and drop it.

    Both sides name the relay and keep punching on. The JS peers hold the client's hole punching
    until every pair has echoed 20 kB through the relay, as hyperdht's own upgrade tests do: left
    free, the direct path sometimes wins on loopback before the client's relay pairing and
    hyperdht strands the server's first packets at the relay (both ends ETIMEDOUT, ~28 s). That
    stall is hyperdht's, not the relay's: with the old free-running peers the npm blind-relay
    failed 8 of 75 rounds and ours 9 of 75, same signature (js/relay_peers.js has the details).
    Every pair must start on the relay's port, change remote on both ends, and echo again.
    """
    before = metrics(relay)
    res = run_peers(node, testnet.bootstrap, relay.key or "", relay.port, "upgrade-both", pairs=3, size=20_000)
    assert_relayed(res, relay, pairs=3)  # all started on our port and echoed 20 kB through it
    for p in res.pairs:
        assert p["okAfterUpgrade"], p
        assert p["upgradedRemotePort"] != relay.port and p["serverUpgradedRemotePort"] != relay.port, p
    after = metrics(relay)
    assert after["blind_relay_pairings_matched"] - before["blind_relay_pairings_matched"] == 3
    relayed = after["blind_relay_relayed_bytes_total"] - before["blind_relay_relayed_bytes_total"]
    assert relayed >= 2 * 3 * 20_000, relayed  # each pair's 20 kB went out and came back via the relay
    # the peers left the relay once direct: every pairing and its two streams are released
    wait_until(lambda: metrics(relay)["blind_relay_pairings_active"] == 0)


def test_interop_relay_40_concurrent_pairs(node: str, testnet: Testnet, relay: RelayProcess) -> None:
    res = run_peers(
        node, testnet.bootstrap, relay.key or "", relay.port, "server", pairs=40, size=20_000, timeout_ms=60_000
    )
    assert_relayed(res, relay, pairs=40)


def test_interop_relay_survives_5000_garbage_datagrams(node: str, testnet: Testnet, relay: RelayProcess) -> None:
    before = metrics(relay)["blind_relay_udp_received_packets_total"]
    rng = random.Random(5000)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for i in range(5000):
            n = rng.randrange(0, 1500)
            data = bytes(rng.getrandbits(8) for _ in range(n))
            if i % 4 == 0 and n >= 20:  # UDX-looking headers with random stream ids
                data = b"\xff\x01" + data[2:]
            elif i % 4 == 1 and n >= 2:  # dht-rpc-looking request/response bytes
                data = bytes([0x03 if i % 8 == 1 else 0x13]) + data[1:]
            s.sendto(data, ("127.0.0.1", relay.port))
    # received and counted (dropped / ignored); a few may be lost by the kernel under load
    wait_until(lambda: metrics(relay)["blind_relay_udp_received_packets_total"] - before >= 4500)
    assert relay.proc is not None and relay.proc.poll() is None
    assert "Traceback" not in relay.stderr
    res = run_peers(node, testnet.bootstrap, relay.key or "", relay.port, "client", size=PAYLOAD)
    assert_relayed(res, relay)


def test_interop_relay_flood_of_pair_requests_is_bounded(node: str, testnet: Testnet, relay: RelayProcess) -> None:
    """10,000 pair requests with random tokens from 10 sessions: capped, RSS bounded, still relays."""
    rss_before = relay.stats()["memory"]["rss_bytes"]
    before = metrics(relay)
    flood = subprocess.Popen(
        [
            node,
            "js/relay_flood.js",
            json.dumps(
                {
                    "bootstrap": testnet.bootstrap.split(","),
                    "relay": relay.key,
                    "sessions": 10,
                    "pairs": 1000,
                    "hold": True,
                }
            ),
        ],
        cwd=INTEROP,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert flood.stdout is not None
        assert json.loads(flood.stdout.readline()) == {"sent": 10_000, "sessions": 10}

        wait_until(
            lambda: (
                metrics(relay)["blind_relay_pairings_requested"] - before["blind_relay_pairings_requested"] >= 10_000
            )
        )
        m = metrics(relay)
        # the per-session share (64) holds: each new request cancels its session's oldest one
        # (never refused: the newest is the one a live peer still waits for), counted as shed
        assert m["blind_relay_pairings_pending"] == 640
        shed = "blind_relay_shed_total{cause=pending_per_session}"
        assert m[shed] - before.get(shed, 0) == 9_360
        rss = relay.stats()["memory"]["rss_bytes"]
        # stated bound: the flood costs the relay less than 25 MB, and it stays under 150 MB in all
        # (the operator page budgets 200 MB for blind-relay-service)
        assert rss - rss_before < 25 * 2**20, (rss_before, rss)
        assert rss < 150 * 2**20, rss
        # and a real pair is still relayed while the flood's sessions hold their pending entries
        res = run_peers(node, testnet.bootstrap, relay.key or "", relay.port, "client", size=PAYLOAD)
        assert_relayed(res, relay)
    finally:
        if flood.stdin is not None:
            flood.stdin.close()
        try:
            flood.wait(20)
        except subprocess.TimeoutExpired:
            flood.kill()
            flood.wait(10)
    # closing the flood's sessions cancels their pending entries
    wait_until(lambda: metrics(relay)["blind_relay_pairings_pending"] == 0)


def test_interop_relay_restart_keeps_key_and_relays_again(node: str, testnet: Testnet, tmp_path: Path) -> None:
    storage = tmp_path / "store"
    keys = []
    for _ in range(2):
        with RelayProcess(storage, bootstrap=testnet.bootstrap) as r:
            r.start()
            assert r.key is not None, r.stderr
            keys.append(r.key)
            res = run_peers(node, testnet.bootstrap, r.key, r.port, "both", size=20_000)
            assert_relayed(res, r)
            assert r.terminate() == 0, r.stderr
            assert not (storage / "relay-runtime.json").exists()
    assert keys[0] == keys[1]


def test_interop_relay_allow_list(node: str, testnet: Testnet, tmp_path: Path) -> None:
    allowed_seed, other_seed = os.urandom(32).hex(), os.urandom(32).hex()
    allowed = encode_id(key_pair(bytes.fromhex(allowed_seed)).public_key)
    allow_file = tmp_path / "allow"
    allow_file.write_text(f"# the CosmicAC peers\n{allowed}\n")
    with RelayProcess(tmp_path / "store", "--allow-file", str(allow_file), bootstrap=testnet.bootstrap) as r:
        r.start()
        assert r.key is not None, r.stderr
        ok = run_peers(node, testnet.bootstrap, r.key, r.port, "client", size=20_000, seed=allowed_seed)
        assert_relayed(ok, r)
        refused = run_peers(
            node, testnet.bootstrap, r.key, r.port, "client", size=20_000, seed=other_seed, timeout_ms=20_000
        )
        assert refused.summary.get("failed") == 1 and not refused.pairs[0]["ok"], refused.pairs
        m = metrics(r)
        assert m["blind_relay_limit_rejections_total{limit=not_allowed}"] >= 1
        assert m["blind_relay_pairings_matched"] == 1
        # the operator adds the other peer's key and sends SIGHUP: no restart, same key, it relays now
        other = encode_id(key_pair(bytes.fromhex(other_seed)).public_key)
        allow_file.write_text(f"{allowed}\n{other}\n")
        assert r.proc is not None
        r.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "allow-list reloaded" in r.stderr)
        now_ok = run_peers(node, testnet.bootstrap, r.key, r.port, "client", size=20_000, seed=other_seed)
        assert_relayed(now_ok, r)


def test_interop_relay_pending_caps_and_timeout(node: str, testnet: Testnet, tmp_path: Path) -> None:
    """--max-pending 100 holds against 4 sessions x 50 requests; --pending-timeout 1 then empties it."""
    args = ("--max-pending", "100", "--pending-timeout", "1")
    with RelayProcess(tmp_path / "store", *args, bootstrap=testnet.bootstrap) as r:
        r.start()
        assert r.key is not None, r.stderr
        opts = {"bootstrap": testnet.bootstrap.split(","), "relay": r.key, "sessions": 4, "pairs": 50, "hold": True}
        flood = subprocess.Popen(
            [node, "js/relay_flood.js", json.dumps(opts)],
            cwd=INTEROP,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert flood.stdout is not None
            assert json.loads(flood.stdout.readline()) == {"sent": 200, "sessions": 4}
            total = "blind_relay_shed_total{cause=pending_total}"
            timed_out = "blind_relay_shed_total{cause=pending_timeout}"
            # every request is held; at the total cap (100) the heaviest session loses its oldest
            # one; held ones expire after a second while the sessions stay open
            wait_until(lambda: metrics(r)["blind_relay_pairings_requested"] >= 200)
            m = metrics(r)
            assert m[total] > 0 and m["blind_relay_pairings_pending"] <= 100
            wait_until(lambda: metrics(r)["blind_relay_pairings_pending"] == 0)
            m = metrics(r)
            assert m["blind_relay_pairings_requested"] == 200
            assert m[timed_out] + m[total] == 200
            assert m["blind_relay_limit_rejections_total{limit=pending_timeout}"] == m[timed_out]
            assert m["blind_relay_pairings_cancelled"] == 200
            assert m["blind_relay_sessions_closed"] == 0  # the sessions were not punished, only their requests
        finally:
            if flood.stdin is not None:
                flood.stdin.close()
            try:
                flood.wait(20)
            except subprocess.TimeoutExpired:
                flood.kill()
                flood.wait(10)


def test_interop_relay_handshake_rate_limit_per_address(node: str, testnet: Testnet, tmp_path: Path) -> None:
    """A burst of 2 handshakes per source address: 20 relay connections from 127.0.0.1 at once.
    Over the burst they wait for the address's next token (64/s) instead of being refused, so
    every pair relays. Refused, they failed 3 of 13 runs here: hyperdht's retries of a refused
    burst all come back together a second later and meet the same empty bucket, and a
    connection out of retries fails its pair with CHANNEL_CLOSED."""
    with RelayProcess(tmp_path / "store", "--handshakes-per-address", "2", bootstrap=testnet.bootstrap) as r:
        r.start()
        assert r.key is not None, r.stderr
        res = run_peers(node, testnet.bootstrap, r.key, r.port, "server", pairs=10, size=20_000, timeout_ms=60_000)
        assert_relayed(res, r, pairs=10)
        m = metrics(r)
        assert m["blind_relay_handshakes_waited_total"] > 0
        assert m["blind_relay_handshakes_total{result=accepted}"] >= 20


def test_interop_relay_session_cap(node: str, testnet: Testnet, tmp_path: Path) -> None:
    """--max-sessions 1: a pair needs two sessions; the second peer's session makes the relay close
    the first (the heaviest address's idlest session; counted), so the pair fails; the relay carries on."""
    with RelayProcess(tmp_path / "store", "--max-sessions", "1", bootstrap=testnet.bootstrap) as r:
        r.start()
        assert r.key is not None, r.stderr
        res = run_peers(node, testnet.bootstrap, r.key, r.port, "client", size=1000, timeout_ms=20_000)
        assert res.summary.get("failed") == 1, res.pairs
        m = metrics(r)
        assert m["blind_relay_shed_total{cause=sessions}"] >= 1
        assert m["blind_relay_pairings_matched"] == 0
        assert r.proc is not None and r.proc.poll() is None
