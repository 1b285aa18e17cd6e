"""Kernel forwarding (relay.udx.kernel) of a pair relayed between two other hosts.

    ns a (10.31.0.2) -- eth0 | ra0 (10.31.0.1) -- ns r -- rd0 (10.32.0.1) | eth0 -- ns d (10.32.0.2)

A udx-native peer (tests/interop/js/udx_peer.js, bound to 0.0.0.0 instead of loopback) in a and
in d, each talking only to the relay's address on its own side; the relay (this module run as
`python -m`, its own process in r, bound to 0.0.0.0) relays them as blind-relay does, each relay
stream's id its partner peer's, with kernel forwarding on. So every kernel-forwarded packet is
really forwarded by r (ip_forward), its source rewritten to r's address on the far side (`via`),
and the delivery check sees it leave in postrouting. udx-native (1.21) takes a connected stream's
packets from any source address, so the rewrite is checked by nft counters in a and d (a peer
behind a NAT would never get a packet from another address).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import queue
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from relay.udx import UDX, UDXSocket, UDXStream
from relay.udx.kernel import raw_id
from tests.network.topology import ROOT, NsProcess, Topology, run

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

MB = 1 << 20
SIZE = 8 * MB  # each way
A_NET, D_NET = "10.31.0", "10.32.0"
A_HOST, D_HOST = f"{A_NET}.2", f"{D_NET}.2"
R_A, R_D = f"{A_NET}.1", f"{D_NET}.1"  # the relay's address on each side
INTEROP = ROOT / "tests" / "interop"
PEER_JS = INTEROP / "js" / "udx_peer.js"
# udx_peer.js binds 127.0.0.1, which cannot reach another host: run it with bind() on 0.0.0.0
PEER_ANY_ADDRESS = f"""
const UDX = require('udx-native')
const createSocket = UDX.prototype.createSocket
UDX.prototype.createSocket = function (...args) {{
  const socket = createSocket.apply(this, args)
  const bind = socket.bind
  socket.bind = function (port) {{ return bind.call(this, port, '0.0.0.0') }}
  return socket
}}
process.argv.splice(1, 0, {json.dumps(str(PEER_JS))})
require({json.dumps(str(PEER_JS))})
"""


# -- the relay, as its own process inside ns r -------------------------------------------------


def _firewall_for(peer_id: int) -> Callable[[UDXStream, UDXSocket, tuple[str, int]], bool]:
    """blind-relay's BlindRelayLink._onfirewall: connect to the first sender, accept the packet."""

    def firewall(stream: UDXStream, socket: UDXSocket, addr: tuple[str, int]) -> bool:
        stream.connect(socket, peer_id, addr)
        return False

    return firewall


async def _relay_main(a_id: int, d_id: int) -> None:
    udx = UDX()
    sock = await udx.create_socket("0.0.0.0", 0)
    kernel = sock.enable_kernel_forwarding()
    rb = udx.create_stream(d_id, firewall=_firewall_for(a_id))  # faces A: its id is D's
    rc = udx.create_stream(a_id, firewall=_firewall_for(d_id))  # faces D: its id is A's
    rb.relay_to(rc)
    rc.relay_to(rb)
    print(json.dumps({"event": "ready", "port": sock.port, "rb": rb.id, "rc": rc.id}), flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        if line.strip() == b"stats":
            kernel.refresh()
            out = {
                "event": "stats",
                **dataclasses.asdict(sock.stats),
                "kernel": kernel.stats(),
                "rb_remote": rb.remote_addr,
                "rc_remote": rc.remote_addr,
            }
            print(json.dumps(out), flush=True)
    udx.close()


# -- the network and its processes -------------------------------------------------------------


class Events:
    """JSON-line events of one process in a namespace, kept by name (none is lost while waiting for another)."""

    def __init__(self, p: NsProcess, what: str) -> None:
        self.p = p
        self.what = what
        self.log: list[dict[str, Any]] = []
        self.ready: dict[str, Any] = {}
        self._unread: dict[str, list[dict[str, Any]]] = {}

    def expect(self, name: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self._unread.get(name):
            left = deadline - time.monotonic()
            try:
                line = self.p.lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                raise TimeoutError(
                    f"{self.what}: no {name!r} within {timeout}s; events {self.log}; stderr: {self.p.stderr}"
                ) from None
            if line is None:
                raise RuntimeError(f"{self.what} exited ({self.p.proc.wait()}) waiting for {name!r}: {self.p.stderr}")
            if line.startswith("{"):
                ev = json.loads(line)
                self.log.append(ev)
                self._unread.setdefault(ev["event"], []).append(ev)
        return self._unread[name].pop(0)

    def has(self, name: str) -> bool:
        return any(ev["event"] == name for ev in self.log)

    def cmd(self, **msg: Any) -> None:
        self.p.send(json.dumps(msg))


class ForwardNet(Topology):
    """Three namespaces: a and d, each on its own link to r, which routes between them."""

    def __init__(self, *, ip_forward: bool) -> None:
        super().__init__()
        self.ip_forward = ip_forward

    def _build(self) -> None:
        a, r, d = self._add_ns("a"), self._add_ns("r"), self._add_ns("d")
        for ns, net, r_if in ((a, A_NET, "ra0"), (d, D_NET, "rd0")):
            self._veth(ns, "eth0", r, r_if)
            run("ip", "-n", r, "addr", "add", f"{net}.1/24", "dev", r_if)
            run("ip", "-n", ns, "addr", "add", f"{net}.2/24", "dev", "eth0")
            run("ip", "-n", ns, "route", "add", "default", "via", f"{net}.1")
        run("ip", "netns", "exec", r, "sysctl", "-qw", f"net.ipv4.ip_forward={int(self.ip_forward)}")

    def udx_peer(self, side: str) -> Events:
        p = Events(self.spawn(side, ["node", "-e", PEER_ANY_ADDRESS], cwd=INTEROP), f"peer {side}")
        p.ready = p.expect("ready")
        return p

    def relay(self, a_id: int, d_id: int) -> Events:
        argv = [sys.executable, "-m", "tests.network.test_kernel_forwarding", str(a_id), str(d_id)]
        r = Events(self.spawn("r", argv, env={"PYTHONUNBUFFERED": "1"}), "relay")
        r.ready = r.expect("ready")
        return r

    def nft_json(self, host: str, *what: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.exec_in(host, "nft", "-j", "list", *what))
        return doc

    def tables(self, host: str) -> list[str]:
        return [
            f"{i['table']['family']} {i['table']['name']}"
            for i in self.nft_json(host, "tables")["nftables"]
            if "table" in i
        ]


@dataclasses.dataclass
class Relayed:
    net: ForwardNet
    a: Events
    d: Events
    relay: Events

    @property
    def port(self) -> int:
        return int(self.relay.ready["port"])

    @property
    def table(self) -> str:
        return f"blind_relay_{self.port}"

    def stats(self) -> dict[str, Any]:
        self.relay.p.send("stats")
        return self.relay.expect("stats", 10)

    def pairs(self) -> list[tuple[list[Any], int]]:
        """The kernel's `pairs` set in r right now: (key, packets) per direction."""
        doc = self.net.nft_json("r", "set", "ip", self.table, "pairs")
        out = []
        for item in doc["nftables"]:
            for el in item.get("set", {}).get("elem", []):
                inner = el["elem"]
                out.append((inner["val"]["concat"], int(inner.get("counter", {}).get("packets", 0))))
        return out

    def watch_sources(self) -> None:
        """Count in a and d the UDX packets that reach each peer, and those from the relay's address on its side."""
        for side, peer, relay_ip in (("a", self.a, R_A), ("d", self.d, R_D)):
            port = int(peer.ready["port"])
            self.net.nft(
                side,
                f"""
table ip watch {{
  chain input {{
    type filter hook input priority filter; policy accept;
    udp dport {port} ip saddr {relay_ip} udp sport {self.port} counter
    udp dport {port} counter
  }}
}}
""",
            )

    def sources(self, side: str) -> tuple[int, int]:
        """(bytes from the relay's address and port on this side, all bytes) that reached the peer
        (bytes, not packets: what Python sends with GSO arrives as one buffer per segmented send)."""
        counted = [
            int(expr["counter"]["bytes"])
            for item in self.net.nft_json(side, "table", "ip", "watch")["nftables"]
            for expr in item.get("rule", {}).get("expr", [])
            if "counter" in expr
        ]
        assert len(counted) == 2, counted
        return counted[0], counted[1]

    def transfer(self, size: int, timeout: float = 30) -> None:
        """`size` random bytes each way, then both ends end: byte-exact both ways."""
        self.a.cmd(cmd="send", bytes=size)
        self.d.cmd(cmd="send", bytes=size)
        sent_a = self.a.expect("sent", timeout)
        sent_d = self.d.expect("sent", timeout)
        got_d = self.d.expect("data_end", timeout)
        got_a = self.a.expect("data_end", timeout)
        assert (got_d["bytes"], got_d["sha256"]) == (size, sent_a["sha256"])
        assert (got_a["bytes"], got_a["sha256"]) == (size, sent_d["sha256"])
        self.a.expect("close", timeout)
        self.d.expect("close", timeout)
        assert not self.a.has("error") and not self.d.has("error"), (self.a.log, self.d.log)


@pytest.fixture
def make_pair(netns_ready: None, node: str) -> Iterator[Callable[..., Relayed]]:
    """A, D and the relay in their namespaces, both peers connected to the relay on their side;
    `hostfw` is an nft ruleset put in r before anything is sent."""
    nets: list[ForwardNet] = []

    def make(*, ip_forward: bool = True, hostfw: str | None = None) -> Relayed:
        net = ForwardNet(ip_forward=ip_forward)
        nets.append(net)
        net.build()
        if hostfw is not None:
            net.nft("r", hostfw)
        a, d = net.udx_peer("a"), net.udx_peer("d")
        relay = net.relay(a.ready["id"], d.ready["id"])
        pair = Relayed(net, a, d, relay)
        pair.watch_sources()
        a.cmd(cmd="connect", remote_id=relay.ready["rb"], port=pair.port, host=R_A)
        d.cmd(cmd="connect", remote_id=relay.ready["rc"], port=pair.port, host=R_D)
        a.expect("connected")
        d.expect("connected")
        return pair

    try:
        yield make
    finally:
        for net in nets:
            net.close()


def assert_learned(pair: Relayed, st: dict[str, Any]) -> None:
    """The relay learned each peer's own address (no NAT between them): the packets were forwarded, not masqueraded."""
    assert st["rb_remote"] == [A_HOST, pair.a.ready["port"]]
    assert st["rc_remote"] == [D_HOST, pair.d.ready["port"]]


# -- the tests ---------------------------------------------------------------------------------


def test_kernel_forwarding_between_hosts_8mb_each_way_and_sigkill_drops_the_table(
    make_pair: Callable[..., Relayed],
) -> None:
    pair = make_pair()
    pair.transfer(SIZE)
    st = pair.stats()
    assert_learned(pair, st)
    k = st["kernel"]
    assert k["fallbacks"] == {} and k["skipped"] == {} and k["errors"] == 0, k
    assert k["directions"] == 2, k
    assert st["kernel_packets"] >= 0.95 * st["relayed_packets"], st
    assert st["kernel_bytes"] >= 1.9 * SIZE, st
    # the pair is still up (graceful ends pass through): both directions are the kernel's, and were used
    elems = pair.pairs()
    assert sorted(key for key, _ in elems) == sorted(
        [
            [A_HOST, pair.a.ready["port"], raw_id(pair.relay.ready["rb"])],
            [D_HOST, pair.d.ready["port"], raw_id(pair.relay.ready["rc"])],
        ]
    ), elems
    assert all(packets > 0 for _, packets in elems), elems
    # each peer heard only the relay's address on its own side and the relay's port: the kernel
    # rewrote the source of what it forwarded (else D would see A's address, or the A side's)
    for side in ("a", "d"):
        from_relay, total = pair.sources(side)
        assert from_relay == total >= SIZE, (side, from_relay, total)
    # a relay killed outright leaves nothing forwarded: the kernel drops its `flags owner` table
    assert f"ip {pair.table}" in pair.net.tables("r")
    pair.relay.p.proc.send_signal(signal.SIGKILL)
    assert pair.relay.p.proc.wait(10) == -signal.SIGKILL
    assert f"ip {pair.table}" not in pair.net.tables("r")


HOST_FORWARD_DROP = """
table ip hostfw {
  chain forward {
    type filter hook forward priority filter; policy drop;
    counter drop
  }
}
"""


def test_kernel_forwarding_blocked_by_a_forward_firewall_falls_back_to_python(
    make_pair: Callable[..., Relayed],
) -> None:
    pair = make_pair(hostfw=HOST_FORWARD_DROP)
    pair.transfer(SIZE)
    st = pair.stats()
    assert_learned(pair, st)
    k = st["kernel"]
    assert k["fallbacks"].get("undelivered", 0) >= 1, k
    assert k["directions"] == 0 and pair.pairs() == [], k
    assert pair.net.counter("r", "ip hostfw")[0] > 0  # the firewall really dropped forwarded packets
    # what matched before the withdrawal was lost, not delivered: Python forwarded nearly all of it
    assert st["kernel_packets"] < 0.05 * st["relayed_packets"], st
    for side in ("a", "d"):
        from_relay, total = pair.sources(side)
        assert from_relay == total >= SIZE, (side, from_relay, total)


def test_kernel_forwarding_with_ip_forward_off_stays_in_python(make_pair: Callable[..., Relayed]) -> None:
    pair = make_pair(ip_forward=False)
    pair.transfer(SIZE)
    st = pair.stats()
    assert_learned(pair, st)
    k = st["kernel"]
    assert k["skipped"].get("forwarding_off", 0) >= 1 and k["fallbacks"] == {}, k
    assert k["directions"] == 0 and pair.pairs() == [], k
    # the operator is told once what to change, not once per pair
    assert pair.relay.p.stderr.count("net.ipv4.ip_forward is 0 (sysctl -w net.ipv4.ip_forward=1") == 1
    assert st["kernel_packets"] == 0 and st["relayed_bytes"] >= 2 * SIZE, st
    for side in ("a", "d"):
        from_relay, total = pair.sources(side)
        assert from_relay == total >= SIZE, (side, from_relay, total)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="the relay of these tests (run inside ns r)")
    ap.add_argument("a_id", type=int)
    ap.add_argument("d_id", type=int)
    args = ap.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_relay_main(args.a_id, args.d_id))


def test_kernel_forwarding_falls_back_for_a_trickle_blocked_after_it_entered_the_kernel(
    make_pair: Callable[..., Relayed],
) -> None:
    """The firewall appears once the pair is in the kernel, and then only 2 kB move: the sender
    retransmits on a doubling timer, one packet a reading or fewer, so the delivery check must
    add them up over readings (it once needed 8 in one second and the stream died), and both ways
    must leave the kernel together (else the ACKs of what Python forwards are lost: 1 in 5 runs
    stalled past 40 s while the other way waited for its own lost packets)."""
    pair = make_pair()
    pair.a.cmd(cmd="send", bytes=100_000, end=False)
    pair.d.cmd(cmd="send", bytes=100_000, end=False)
    pair.a.expect("sent")
    pair.d.expect("sent")
    deadline = time.monotonic() + 30
    while len(pair.pairs()) < 2:  # both ways in the kernel (one may wait for a retransmission)
        assert time.monotonic() < deadline, pair.stats()["kernel"]
        time.sleep(0.05)
    pair.net.nft("r", HOST_FORWARD_DROP)
    pair.a.cmd(cmd="send", bytes=2_000, end=True)
    got = pair.d.expect("data_end", 60)
    assert got["bytes"] == 102_000
    k = pair.stats()["kernel"]
    assert k["fallbacks"] == {"undelivered": 1} and k["directions"] == 0, k  # one pair, both ways
