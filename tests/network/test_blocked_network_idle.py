"""Relayed connections whose NAT mappings time out while they are idle.

The routers here forget an idle UDP mapping quickly (conntrack UDP timeouts set inside their
namespaces). hyperdht keeps a connection alive every 5 s (`connectionKeepAlive`), through the
relay, which refreshes both peers' mappings towards the relay; a mapping timeout above that
keeps the connection, one below it loses it: with `fully-random` NATs the next packet leaves
from a new public port, and the relay's answers to the old one are dropped as unsolicited.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.network.conftest import build
from tests.network.test_blocked_network import connect
from tests.network.topology import Peer, RelayInNs, Topology

pytestmark = [pytest.mark.interop, pytest.mark.timeout(150), pytest.mark.xdist_group("blocked_network_idle")]

KEEP_ALIVE_S = 5  # hyperdht DEFAULTS.connectionKeepAlive


@pytest.fixture(scope="module")
def net(netns_ready: None) -> Iterator[Topology]:
    yield from build(nat="random", udp_timeout=KEEP_ALIVE_S + 2)


@pytest.fixture(scope="module")
def relay(net: Topology, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayInNs]:
    r = net.python_relay(tmp_path_factory.mktemp("relay") / "store", 31_500)
    yield r
    r.stop()


@pytest.fixture(scope="module")
def peers(net: Topology) -> tuple[Peer, Peer]:
    return net.peer("a"), net.peer("b")


def router_udp_timeout(net: Topology, side: str) -> int:
    return int(net.exec_in(f"r{side}", "sysctl", "-n", "net.netfilter.nf_conntrack_udp_timeout_stream"))


@pytest.mark.parametrize("mode", ["client", "server"])
def test_blocked_network_relayed_connection_survives_idle_beyond_nat_timeout(
    net: Topology, relay: RelayInNs, peers: tuple[Peer, Peer], mode: str
) -> None:
    """Idle for 1.5x the routers' mapping timeout: the keep-alives through the relay hold it."""
    assert router_udp_timeout(net, "a") == router_udp_timeout(net, "b") == KEEP_ALIVE_S + 2
    idle_ms = 1500 * (KEEP_ALIVE_S + 2)
    rec, server_side = connect(
        *peers,
        server_relay=relay.key if mode == "server" else None,
        client_relay=relay.key if mode == "client" else None,
        bytes=100_000,
        idleMs=idle_ms,
        bytesAfterIdle=100_000,
    )
    assert rec["ok"] and rec["okAfterIdle"], rec
    assert rec["remotes"] == [relay.address] and server_side is not None
    assert server_side["remotes"] == [relay.address]


def test_blocked_network_nat_timeout_below_keepalive_loses_the_connection(
    net: Topology, relay: RelayInNs, peers: tuple[Peer, Peer], tmp_path: Path
) -> None:
    """The control: mappings forgotten between keep-alives really are forgotten, and then the
    connection dies (ETIMEDOUT) rather than hangs. hyperdht's limit, the same with the Node relay."""
    net.set_udp_timeout(2)
    try:
        rec, _ = connect(*peers, server_relay=None, client_relay=relay.key, bytes=10_000, idleMs=3_000)
    finally:
        net.set_udp_timeout(KEEP_ALIVE_S + 2)
    assert rec["ok"] is False and rec.get("okAfterIdle") is not True, rec
    assert "ETIMEDOUT" in rec.get("error", ""), rec
