"""NATs that *can* be punched (consistent mappings) with `relayThrough` set: the connection starts
on our relay and upgrades to a direct path between the two routers, and never hangs.

Both routers use plain `masquerade` (source ports kept, so hyperdht rates them CONSISTENT) and
still forward only LAN -> wan and replies: the direct path exists only because both peers punch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.network.conftest import build
from tests.network.test_blocked_network import connect
from tests.network.topology import Peer, RelayInNs, Topology

pytestmark = [pytest.mark.interop, pytest.mark.timeout(150), pytest.mark.xdist_group("blocked_network_upgrade")]


@pytest.fixture(scope="module")
def net(netns_ready: None) -> Iterator[Topology]:
    yield from build(nat="consistent")


@pytest.fixture(scope="module")
def relay(net: Topology, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayInNs]:
    r = net.python_relay(tmp_path_factory.mktemp("relay") / "store", 31_700)
    yield r
    r.stop()


@pytest.fixture(scope="module")
def peers(net: Topology) -> tuple[Peer, Peer]:
    return net.peer("a"), net.peer("b")


def test_blocked_network_consistent_nats_are_punchable(peers: tuple[Peer, Peer]) -> None:
    for p in peers:
        info = p.call("info")
        assert info["firewalled"] and not info["randomized"], f"lan {p.name}: {info}"


@pytest.mark.parametrize("mode", ["client", "server", "both"])
def test_blocked_network_relayed_connection_upgrades_to_direct(
    net: Topology, relay: RelayInNs, peers: tuple[Peer, Peer], mode: str
) -> None:
    a, b = peers
    rec, server_side = connect(
        a,
        b,
        server_relay=relay.key if mode in ("server", "both") else None,
        client_relay=relay.key if mode in ("client", "both") else None,
        bytes=200_000,
        upgrade=True,
    )
    assert rec["ok"] and rec["okAfterUpgrade"], rec  # bounded: the peer gives up after 30 s per step
    assert rec["remotes"][0] == relay.address, f"did not start on the relay: {rec['remotes']}"
    assert rec["remotes"][-1]["host"] == net.router_wan("a"), f"did not end direct: {rec['remotes']}"
    assert server_side is not None
    assert server_side["remotes"][0] == relay.address
    # the server switches on its own punch result; poll its view (bounded) until it has
    deadline = time.monotonic() + 30
    while server_side["remotes"][-1]["host"] != net.router_wan("b") and time.monotonic() < deadline:
        time.sleep(0.1)
        server_side = a.call("serverConnections")["connections"][-1]
    assert server_side["remotes"][-1]["host"] == net.router_wan("b"), server_side
