"""A planned restart peers notice at once: real Node hyperdht peers holding relayed connections
(`js/relay_restart_peers.js`, reconnecting as soon as one closes, as a job agent does) see the
relay's SIGTERM as a reset of their connection (ECONNRESET), not a timeout 13-17 s later, and
are relayed again within seconds of the relay being back on the same storage and port."""

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
PAIRS = 6
#: the target: every pair relayed again within 3 s of the relay being back
RECONNECT_TARGET = 3.0


@pytest.fixture(scope="module")
def testnet(node: str) -> Iterator[Testnet]:
    with Testnet(node, size=3) as tn:
        yield tn


def test_interop_relay_sigterm_peers_see_a_close_and_reconnect_once_it_is_back(
    node: str, tmp_path: Path, testnet: Testnet
) -> None:
    storage = tmp_path / "relay"
    port = free_udp_port()
    first = RelayProcess(storage, port=port, bootstrap=testnet.bootstrap)
    second = RelayProcess(storage, port=port, bootstrap=testnet.bootstrap)
    peers: RestartPeers | None = None
    try:
        first.start()
        assert first.key is not None, first.stderr
        peers = RestartPeers(node, testnet.bootstrap, first.key, port, PAIRS)
        p = peers
        p.wait_for("relayed connections", lambda: len(p.since(0, "up")) == PAIRS)
        assert all(e["relayed"] for e in p.since(0, "up").values()), p.since(0, "up")

        stopped = time.time()
        assert first.terminate(signal.SIGTERM, timeout=60) == 0, first.stderr
        exit_seconds = time.time() - stopped
        assert "Traceback" not in first.stderr, first.stderr

        # every connection closed on both ends, as a reset: the peers saw the relay go
        p.wait_for(
            "close on both ends of every pair",
            lambda: (
                len(p.since(stopped, "down", "client")) == PAIRS and len(p.since(stopped, "down", "server")) == PAIRS
            ),
        )
        downs = [*p.since(stopped, "down", "client").values(), *p.since(stopped, "down", "server").values()]
        assert {e["code"] for e in downs} == {"ECONNRESET"}, downs
        noticed = max(e["t"] / 1000 for e in downs) - stopped

        second.start()
        back = time.time()  # "Server listening" was read: the relay is back
        assert second.key == first.key, second.stderr
        p.wait_for("relayed connections after the restart", lambda: len(p.since(stopped, "up")) == PAIRS)
        ups = p.since(stopped, "up")
        assert all(e["relayed"] for e in ups.values()), ups
        reconnect = max(e["t"] / 1000 for e in ups.values()) - back
        print(
            f"\nrestart with {PAIRS} pairs: relay exited {exit_seconds:.2f}s after SIGTERM, peers saw the close "
            f"within {noticed:.2f}s, all relayed again {reconnect:.2f}s after the relay was back"
        )
        assert reconnect <= RECONNECT_TARGET, (reconnect, ups)
        assert second.terminate(signal.SIGTERM, timeout=60) == 0, second.stderr
    finally:
        if peers is not None:
            peers.close()
        first.stop()
        second.stop()
