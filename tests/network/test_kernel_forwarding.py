"""Kernel forwarding (relay.udx.kernel) of a pair relayed between two other hosts.

    ns a (10.31.0.2) -- eth0 | ra0 (10.31.0.1) -- ns r -- rd0 (10.32.0.1) | eth0 -- ns d (10.32.0.2)
    ns a (fd31::2)   -- eth0 | ra0 (fd31::1)   -- ns r -- rd0 (fd32::1)   | eth0 -- ns d (fd32::2)

Each test runs over IPv4 and over IPv6 (the relay's socket then bound to `::`, dual-stack, as
`--host ::` binds it): the relay's `inet` table forwards both families.

A udx-native peer (tests/interop/js/udx_peer.js, bound to 0.0.0.0 or :: instead of loopback) in
a and in d, each talking only to the relay's address on its own side; the relay (this module run
as `python -m`, its own process in r, bound to 0.0.0.0 or ::) relays them as blind-relay does, each relay
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


@dataclasses.dataclass(frozen=True)
class Family:
    """The addresses of one IP family on the two links, and how nft and the relay name it."""

    name: str
    nft: str  # nft's keyword: ip / ip6
    any: str  # the wildcard bind address
    a_host: str
    d_host: str
    r_a: str
    r_d: str
    prefix: int
    sysctl: str
    suffix: str  # of the relay's sets and counters
    relay_host: str = ""  # the relay's bind address when not the family's wildcard
    test_id: str = ""

    def set(self, name: str) -> str:
        return name + self.suffix


IPV4 = Family("ipv4", "ip", "0.0.0.0", A_HOST, D_HOST, R_A, R_D, 24, "net.ipv4.ip_forward", "")
IPV6 = Family("ipv6", "ip6", "::", "fd31::2", "fd32::2", "fd31::1", "fd32::1", 64, "net.ipv6.conf.all.forwarding", "6")
# IPv4 peers of a relay on `::` (dual-stack): their packets are IPv4 on the wire, the relay's
# socket sees them as ::ffff:a.b.c.d; the table's IPv4 rules carry them
IPV4_ON_DUAL_STACK = dataclasses.replace(IPV4, relay_host="::", test_id="ipv4-on-dual-stack")
FAMILIES = pytest.mark.parametrize("fam", [IPV4, IPV6], ids=lambda f: f.name)
INTEROP = ROOT / "tests" / "interop"
PEER_JS = INTEROP / "js" / "udx_peer.js"


def peer_any_address(any_address: str) -> str:
    """udx_peer.js binds 127.0.0.1, which cannot reach another host: run it with bind() on the
    family's wildcard address."""
    return f"""
const UDX = require('udx-native')
const createSocket = UDX.prototype.createSocket
UDX.prototype.createSocket = function (...args) {{
  const socket = createSocket.apply(this, args)
  const bind = socket.bind
  socket.bind = function (port) {{ return bind.call(this, port, {json.dumps(any_address)}) }}
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


async def _relay_main(a_id: int, d_id: int, host: str) -> None:
    udx = UDX()
    sock = await udx.create_socket(host, 0)
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
                **sock.stats.as_dict(),
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

    def __init__(self, fam: Family, *, ip_forward: bool) -> None:
        super().__init__()
        self.fam = fam
        self.ip_forward = ip_forward

    def _build(self) -> None:
        a, r, d = self._add_ns("a"), self._add_ns("r"), self._add_ns("d")
        f = self.fam
        for ns, host, r_addr, r_if in ((a, f.a_host, f.r_a, "ra0"), (d, f.d_host, f.r_d, "rd0")):
            self._veth(ns, "eth0", r, r_if)
            # nodad: an IPv6 address is usable at once, not after duplicate address detection
            nodad = ["nodad"] if f is IPV6 else []
            run("ip", "-n", r, "addr", "add", f"{r_addr}/{f.prefix}", "dev", r_if, *nodad)
            run("ip", "-n", ns, "addr", "add", f"{host}/{f.prefix}", "dev", "eth0", *nodad)
            run("ip", "-n", ns, "route", "add", "default", "via", r_addr)
        run("ip", "netns", "exec", r, "sysctl", "-qw", f"{f.sysctl}={int(self.ip_forward)}")

    def udx_peer(self, side: str) -> Events:
        p = Events(self.spawn(side, ["node", "-e", peer_any_address(self.fam.any)], cwd=INTEROP), f"peer {side}")
        p.ready = p.expect("ready")
        return p

    def relay(self, a_id: int, d_id: int) -> Events:
        host = self.fam.relay_host or self.fam.any
        argv = [sys.executable, "-m", "tests.network.test_kernel_forwarding", str(a_id), str(d_id), host]
        r = Events(self.spawn("r", argv, env={"PYTHONUNBUFFERED": "1"}), "relay")
        r.ready = r.expect("ready")
        return r

    def nft_json(self, host: str, *what: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.exec_in(host, "nft", "-j", "list", *what))
        return doc

    def tables(self, host: str) -> list[str]:
        """The "family name" of each table in `host`, from the text listing (nft 1.0.6's JSON
        listing printed a table's owner flag as broken JSON once in a run)."""
        out = self.exec_in(host, "nft", "list", "tables")
        return [line.removeprefix("table ").strip() for line in out.splitlines() if line.startswith("table ")]


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
    def fam(self) -> Family:
        return self.net.fam

    @property
    def table(self) -> str:
        return f"blind_relay_{self.port}"

    def stats(self) -> dict[str, Any]:
        self.relay.p.send("stats")
        return self.relay.expect("stats", 10)

    def pairs(self) -> list[tuple[list[Any], int]]:
        """The kernel's `pairs` set of this family in r right now: (key, packets) per direction."""
        doc = self.net.nft_json("r", "set", "inet", self.table, self.fam.set("pairs"))
        out = []
        for item in doc["nftables"]:
            for el in item.get("set", {}).get("elem", []):
                inner = el["elem"]
                out.append((inner["val"]["concat"], int(inner.get("counter", {}).get("packets", 0))))
        return out

    def watch_sources(self) -> None:
        """Count in a and d the UDX packets that reach each peer, and those from the relay's address on its side."""
        x = self.fam.nft
        for side, peer, relay_ip in (("a", self.a, self.fam.r_a), ("d", self.d, self.fam.r_d)):
            port = int(peer.ready["port"])
            self.net.nft(
                side,
                f"""
table inet watch {{
  chain input {{
    type filter hook input priority filter; policy accept;
    udp dport {port} {x} saddr {relay_ip} udp sport {self.port} counter
    meta nfproto {self.fam.name} udp dport {port} counter
  }}
}}
""",
            )

    def sources(self, side: str) -> tuple[int, int]:
        """(bytes from the relay's address and port on this side, all bytes) that reached the peer
        (bytes, not packets: what Python sends with GSO arrives as one buffer per segmented send)."""
        counted = [
            int(expr["counter"]["bytes"])
            for item in self.net.nft_json(side, "table", "inet", "watch")["nftables"]
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

    def make(fam: Family = IPV4, *, ip_forward: bool = True, hostfw: str | None = None) -> Relayed:
        net = ForwardNet(fam, ip_forward=ip_forward)
        nets.append(net)
        net.build()
        if hostfw is not None:
            net.nft("r", hostfw)
        a, d = net.udx_peer("a"), net.udx_peer("d")
        relay = net.relay(a.ready["id"], d.ready["id"])
        pair = Relayed(net, a, d, relay)
        pair.watch_sources()
        a.cmd(cmd="connect", remote_id=relay.ready["rb"], port=pair.port, host=fam.r_a)
        d.cmd(cmd="connect", remote_id=relay.ready["rc"], port=pair.port, host=fam.r_d)
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
    assert st["rb_remote"] == [pair.fam.a_host, pair.a.ready["port"]]
    assert st["rc_remote"] == [pair.fam.d_host, pair.d.ready["port"]]


# -- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fam", [IPV4, IPV6, IPV4_ON_DUAL_STACK], ids=lambda f: f.test_id or f.name)
def test_kernel_forwarding_between_hosts_8mb_each_way_and_sigkill_drops_the_table(
    make_pair: Callable[..., Relayed], fam: Family
) -> None:
    pair = make_pair(fam)
    pair.transfer(SIZE)
    st = pair.stats()
    assert_learned(pair, st)
    k = st["kernel"]
    assert k["fallbacks"] == {} and k["skipped"] == {} and k["errors"] == 0, k
    assert k["directions"] == 2 and k["directions_by_family"][fam.name] == 2, k
    assert k["families"] == (["ipv4", "ipv6"] if fam.any == "::" or fam.relay_host == "::" else ["ipv4"]), k
    assert st["kernel_packets"] >= 0.95 * st["relayed_packets"], st
    assert st["kernel_bytes"] >= 1.9 * SIZE, st
    # the pair is still up (graceful ends pass through): both directions are the kernel's, and were used
    elems = pair.pairs()
    assert sorted(key for key, _ in elems) == sorted(
        [
            [fam.a_host, pair.a.ready["port"], raw_id(pair.relay.ready["rb"])],
            [fam.d_host, pair.d.ready["port"], raw_id(pair.relay.ready["rc"])],
        ]
    ), elems
    assert all(packets > 0 for _, packets in elems), elems
    # each peer heard only the relay's address on its own side and the relay's port: the kernel
    # rewrote the source of what it forwarded (else D would see A's address, or the A side's)
    for side in ("a", "d"):
        from_relay, total = pair.sources(side)
        assert from_relay == total >= SIZE, (side, from_relay, total)
    # a relay killed outright leaves nothing forwarded: the kernel drops its `flags owner` table
    assert f"inet {pair.table}" in pair.net.tables("r")
    pair.relay.p.proc.send_signal(signal.SIGKILL)
    assert pair.relay.p.proc.wait(10) == -signal.SIGKILL
    assert f"inet {pair.table}" not in pair.net.tables("r")


HOST_FORWARD_DROP = """
table inet hostfw {
  chain forward {
    type filter hook forward priority filter; policy drop;
    counter drop
  }
}
"""


@FAMILIES
def test_kernel_forwarding_blocked_by_a_forward_firewall_falls_back_to_python(
    make_pair: Callable[..., Relayed], fam: Family
) -> None:
    pair = make_pair(fam, hostfw=HOST_FORWARD_DROP)
    pair.transfer(SIZE)
    st = pair.stats()
    assert_learned(pair, st)
    k = st["kernel"]
    assert k["fallbacks"].get("undelivered", 0) >= 1, k
    assert k["directions"] == 0 and pair.pairs() == [], k
    assert pair.net.counter("r", "inet hostfw")[0] > 0  # the firewall really dropped forwarded packets
    # what matched before the withdrawal was lost, not delivered: Python forwarded nearly all of it
    assert st["kernel_packets"] < 0.05 * st["relayed_packets"], st
    for side in ("a", "d"):
        from_relay, total = pair.sources(side)
        assert from_relay == total >= SIZE, (side, from_relay, total)


@FAMILIES
def test_kernel_forwarding_with_ip_forward_off_stays_in_python(make_pair: Callable[..., Relayed], fam: Family) -> None:
    pair = make_pair(fam, ip_forward=False)
    pair.transfer(SIZE)
    st = pair.stats()
    assert_learned(pair, st)
    k = st["kernel"]
    assert k["skipped"].get("forwarding_off", 0) >= 1 and k["fallbacks"] == {}, k
    assert k["directions"] == 0 and pair.pairs() == [], k
    # the operator is told once what to change, not once per pair
    assert pair.relay.p.stderr.count(f"{fam.sysctl} is 0 (sysctl -w {fam.sysctl}=1") == 1
    assert st["kernel_packets"] == 0 and st["relayed_bytes"] >= 2 * SIZE, st
    for side in ("a", "d"):
        from_relay, total = pair.sources(side)
        assert from_relay == total >= SIZE, (side, from_relay, total)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="the relay of these tests (run inside ns r)")
    ap.add_argument("a_id", type=int)
    ap.add_argument("d_id", type=int)
    ap.add_argument("host", nargs="?", default="0.0.0.0")
    args = ap.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_relay_main(args.a_id, args.d_id, args.host))


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
