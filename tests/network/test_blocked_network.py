"""Real Node hyperdht peers behind NATs that block direct connections, relayed by our relay.

One topology per module (tests/network/topology.py): LAN a and LAN b behind `masquerade
fully-random` NAT routers that forward only LAN -> wan and replies, and on the wan a 12-node
hyperdht testnet and our relay (`python -m relay`, its own process). "Relayed" is what the
peers themselves see: both raw streams' remote is the relay's wan address and --port.
"""

from __future__ import annotations

import itertools
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.network.conftest import build
from tests.network.topology import Peer, RelayInNs, Topology

pytestmark = [pytest.mark.interop, pytest.mark.timeout(150), pytest.mark.xdist_group("blocked_network")]

MIB = 1 << 20
CONNECT_MS = 30_000  # hyperdht's own per-step timeout in the peer; a safety net, not a speed claim
SEND_ONE = "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('{host}', {port}))"
_ports = itertools.count(31_000)  # the relay host is our own namespace: its port space is ours alone


@pytest.fixture(scope="module")
def net(netns_ready: None) -> Iterator[Topology]:
    yield from build(nat="random")


@pytest.fixture(scope="module")
def relay(net: Topology, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayInNs]:
    r = net.python_relay(tmp_path_factory.mktemp("relay") / "store", next(_ports))
    yield r
    r.stop()


@pytest.fixture(scope="module")
def peers(net: Topology) -> tuple[Peer, Peer]:
    return net.peer("a"), net.peer("b")


def connect(
    server: Peer, client: Peer, *, server_relay: str | None, client_relay: str | None, **kw: Any
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Listen on `server`, connect from `client`, echo; the client's record and the server's view."""
    key = server.call("listen", relayThrough=server_relay)["publicKey"]
    before = len(server.call("serverConnections")["connections"])
    rec = client.call("connect", key=key, relayThrough=client_relay, timeout=CONNECT_MS, **kw)
    conns = server.call("serverConnections")["connections"]
    return rec, (conns[before] if len(conns) > before else None)


def test_blocked_network_direct_connection_fails(net: Topology, peers: tuple[Peer, Peer]) -> None:
    a, b = peers
    for p in peers:
        info = p.call("info")
        assert info["firewalled"] and info["randomized"], f"lan {p.name} is not behind a RANDOM NAT: {info}"
    assert {a.call("info")["host"], b.call("info")["host"]} == {net.router_wan("a"), net.router_wan("b")}
    rec, server_side = connect(a, b, server_relay=None, client_relay=None, bytes=1000)
    assert not rec["ok"], f"connected directly through two blocking NATs: {rec}"
    assert "HOLEPUNCH_ABORTED" in rec.get("error", ""), rec
    assert server_side is None


@pytest.mark.parametrize("mode", ["client", "server", "both"])
def test_blocked_network_relayed_echo_1mib(
    net: Topology, relay: RelayInNs, peers: tuple[Peer, Peer], mode: str
) -> None:
    a, b = peers
    rec, server_side = connect(
        a,
        b,
        server_relay=relay.key if mode in ("server", "both") else None,
        client_relay=relay.key if mode in ("client", "both") else None,
        bytes=MIB,
    )
    assert rec["ok"], rec
    assert rec["remotes"] == [relay.address], f"client's remote is not the relay: {rec['remotes']}"
    assert server_side is not None and server_side["remotes"] == [relay.address], server_side


def test_blocked_network_relay_stats_show_its_wan_address(net: Topology, relay: RelayInNs) -> None:
    dht = relay.stats()["dht"]
    assert dht["bootstrapped"] is True
    assert dht["firewalled"] is False
    assert (dht["public_host"], dht["public_port"]) == (net.relay_host, relay.port)


def test_blocked_network_relay_host_firewall_admits_only_port(
    net: Topology, relay: RelayInNs, peers: tuple[Peer, Peer], tmp_path: Path
) -> None:
    """A cloud security group: inbound only UDP --port (and replies). Our relay announces after
    its reachability check, from the server socket, so peers reach it at once."""
    port = next(_ports)
    net.firewall_relay_host(port, relay.port)
    try:
        walled = net.python_relay(tmp_path / "store", port)
        try:
            dht = walled.stats()["dht"]
            assert dht["firewalled"] is False and dht["public_port"] == port, dht
            rec, server_side = connect(*peers, server_relay=None, client_relay=walled.key, bytes=MIB)
            assert rec["ok"], rec
            assert rec["remotes"] == [walled.address] and server_side is not None
            assert server_side["remotes"] == [walled.address]
            # and the wall is real: a datagram to any other port of the relay host is dropped
            net.exec_in("dht", sys.executable, "-c", SEND_ONE.format(host=net.relay_host, port=port + 1))
            assert net.counter("relay", "inet security_group")[-1] >= 1
        finally:
            walled.stop()
    finally:
        net.open_relay_host()


def test_blocked_network_relay_restart_keeps_key_and_relays_again(
    net: Topology, peers: tuple[Peer, Peer], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    port = next(_ports)
    first = net.python_relay(store, port)
    first.proc.proc.send_signal(signal.SIGTERM)
    assert first.proc.proc.wait(30) == 0, first.proc.stderr
    second = net.python_relay(store, port)
    try:
        assert second.key == first.key
        rec, server_side = connect(*peers, server_relay=second.key, client_relay=second.key, bytes=MIB)
        assert rec["ok"], rec
        assert rec["remotes"] == [second.address] and server_side is not None
    finally:
        second.stop()


def test_blocked_network_kernel_forwarding_across_the_nats(
    net: Topology, peers: tuple[Peer, Peer], tmp_path: Path
) -> None:
    """`--kernel-forwarding` on a relay host that forwards: the pair crosses it in nftables, from
    one NAT's public mapping to the other's, and each NAT takes the packets as replies (the
    source is rewritten to the relay's address and port, or the routers would drop them)."""
    net.exec_in("relay", "sysctl", "-qw", "net.ipv4.ip_forward=1")
    kernel = net.python_relay(tmp_path / "store", next(_ports), "--kernel-forwarding")
    try:
        assert kernel.stats()["kernel"]["enabled"] is True
        rec, server_side = connect(*peers, server_relay=None, client_relay=kernel.key, bytes=4 * MIB)
        assert rec["ok"], rec
        assert rec["remotes"] == [kernel.address] and server_side is not None
        assert server_side["remotes"] == [kernel.address], server_side
        st = kernel.stats()
        traffic, k = st["traffic"], st["kernel"]
        assert k["skipped"] == {} and k["fallbacks"] == {} and k["errors"] == 0, k
        assert traffic["kernel_bytes"] >= 2 * 4 * MIB, traffic  # the echo, both ways
        assert traffic["kernel_packets"] >= 0.9 * traffic["relayed_packets"], traffic
    finally:
        kernel.stop()
        net.exec_in("relay", "sysctl", "-qw", "net.ipv4.ip_forward=0")
