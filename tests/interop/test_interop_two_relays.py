"""Two of our relays serving one deployment: when one stops, new relayed connections open through
the other.

What real hyperdht peers do with several relay keys (npm hyperdht, tests/interop/node_modules,
lib/connect.js and lib/server.js, `selectRelay`): given an array as `relayThrough`, a peer picks
one key at random for each connection it opens, and uses only that relay for that connection
(when both ends name relays, the server's pick is used by both). There is no failover inside one
connection: if the relay it picked is gone, that attempt fails, and the next attempt picks again.
So a peer that retries, as a job agent does, gets through the relay that still runs; connections
already on that relay never notice the other one stopping.

The peers here (js/relay_restart_peers.js) retry a failed connection every 250 ms and report the
port each connection's raw stream goes to, which says which relay carries it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.interop._relay_net import Testnet
from tests.interop._relay_proc import RelayProcess, free_udp_port
from tests.interop._restart_peers import RestartPeers

pytestmark = pytest.mark.interop
PAIRS = 8
LATE_PAIRS = 4
#: an attempt through the stopped relay fails in ~4 s and each attempt picks it with odds 1/2:
#: 40 attempts in a row on it (odds 2^-40) would take this long
WAIT = 170.0


@pytest.fixture(scope="module")
def testnet(node: str) -> Iterator[Testnet]:
    with Testnet(node, size=3) as tn:
        yield tn


def _active_pairs(relay: RelayProcess) -> float:
    for line in relay.get("/metrics").decode().splitlines():
        if line.startswith("blind_relay_pairings_active "):
            return float(line.split()[1])
    raise AssertionError("no blind_relay_pairings_active in /metrics")


@pytest.mark.timeout(480)
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
def test_interop_two_relays_one_stops_new_connections_open_through_the_other(
    node: str, tmp_path: Path, testnet: Testnet, stop: signal.Signals
) -> None:
    """SIGTERM: a planned stop, its peers see a reset at once. SIGKILL: a host that dies, its
    peers see nothing until their connections time out."""
    a = RelayProcess(tmp_path / "a", port=free_udp_port(), bootstrap=testnet.bootstrap)
    b = RelayProcess(tmp_path / "b", port=free_udp_port(), bootstrap=testnet.bootstrap)
    peers: RestartPeers | None = None
    late: RestartPeers | None = None
    try:
        a.start()
        b.start()
        assert a.key and b.key and a.key != b.key, (a.stderr, b.stderr)
        both = {"relays": [a.key, b.key], "relayPorts": [a.port, b.port]}
        peers = RestartPeers(node, testnet.bootstrap, a.key, a.port, PAIRS, **both)
        p = peers
        p.wait_for("every pair relayed", lambda: len(p.since(0, "up")) == PAIRS)
        first = p.since(0, "up")
        assert {e["relayPort"] for e in first.values()} <= {a.port, b.port}, first
        on_a = {i for i, e in first.items() if e["relayPort"] == a.port}
        on_b = set(first) - on_a

        stopped = time.time()
        assert a.terminate(stop, timeout=60) == (0 if stop == signal.SIGTERM else -stop), a.stderr

        # the pairs on the stopped relay closed and opened again, through the other one
        p.wait_for("every pair on the stopped relay up again", lambda: set(p.since(stopped, "up")) >= on_a, WAIT)
        again = p.since(stopped, "up")
        assert {i: e["relayPort"] for i, e in again.items()} == dict.fromkeys(on_a, b.port), again
        # the pairs on the relay that still runs never noticed
        assert set(p.since(stopped, "down", "client")) <= on_a, p.since(stopped, "down", "client")

        # connections opened after the stop, by peers that never saw the first relay work
        late = RestartPeers(node, testnet.bootstrap, a.key, a.port, LATE_PAIRS, **both)
        q = late
        q.wait_for("every late pair relayed", lambda: len(q.since(0, "up")) == LATE_PAIRS, WAIT)
        assert {e["relayPort"] for e in q.since(0, "up").values()} == {b.port}, q.since(0, "up")
        failed = q.of("failed") + p.of("failed", stopped)
        codes = sorted({str(e.get("code")) for e in failed})

        # what Prometheus reads from the relay still running: every connection is its pairing
        b_pairs = _active_pairs(b)
        assert b_pairs == PAIRS + LATE_PAIRS, b_pairs
        print(
            f"\ntwo relays, {PAIRS} pairs: {len(on_a)} on the relay stopped, {len(on_b)} on the other; "
            f"after the stop all {PAIRS + LATE_PAIRS} relayed by the other; "
            f"{len(failed)} attempts failed on the way ({codes})"
        )
    finally:
        for peer in (peers, late):
            if peer is not None:
                peer.close()
        a.stop()
        b.stop()
