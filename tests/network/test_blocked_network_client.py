"""Our own Python hyperdht client (`relay.dht.client`) across the blocked network: from LAN b,
through our relay on the wan, to a real Node hyperdht server in LAN a, echoing 1 MiB."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.network.conftest import build
from tests.network.topology import Peer, RelayInNs, Topology

pytestmark = [pytest.mark.interop, pytest.mark.timeout(150), pytest.mark.xdist_group("blocked_network_client")]

PY_CLIENT = Path(__file__).resolve().parent / "py_client.py"
MIB = 1 << 20


@pytest.fixture(scope="module")
def net(netns_ready: None) -> Iterator[Topology]:
    yield from build(nat="random")


@pytest.fixture(scope="module")
def relay(net: Topology, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayInNs]:
    r = net.python_relay(tmp_path_factory.mktemp("relay") / "store", 31_900)
    yield r
    r.stop()


@pytest.fixture(scope="module")
def server(net: Topology) -> Peer:
    return net.peer("a")


@pytest.mark.parametrize("mode", ["client", "server", "both"])
def test_blocked_network_python_client_through_our_relay(
    net: Topology, relay: RelayInNs, server: Peer, mode: str
) -> None:
    key = server.call("listen", relayThrough=relay.key if mode in ("server", "both") else None)["publicKey"]
    opts = {"bootstrap": net.bootstrap, "key": key, "bytes": MIB}
    if mode in ("client", "both"):
        opts["relay"] = relay.key
    out = net.exec_in("b", sys.executable, str(PY_CLIENT), json.dumps(opts), timeout=120)
    rec = json.loads(out.strip().splitlines()[-1])
    assert rec["ok"] and rec["relayed"], rec
    assert rec["remote"] == relay.address, rec
    assert server.call("serverConnections")["connections"][-1]["remotes"] == [relay.address]
