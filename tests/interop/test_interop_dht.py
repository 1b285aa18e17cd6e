"""The Python DHT node and HyperDHT server against a real Node hyperdht testnet on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from relay.dht import Connection, DHTNode, HyperDHTServer
from relay.dht.messages import Command, ErrorCode, Internal, Request, Response, decode_message, hash32, node_id
from relay.keys import key_pair
from relay.udx import UDX
from tests.interop._dht_testnet import NodeTestnet
from tests.interop._relay_net import Testnet, run_peers
from tests.interop._relay_proc import RelayProcess, free_udp_port

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]


@contextlib.asynccontextmanager
async def python_node(tn: NodeTestnet, **options: Any) -> AsyncIterator[DHTNode]:
    """A bootstrapped Python node on the testnet; `options` go to DHTNode (firewalled, ephemeral)."""
    udx = UDX()
    node = DHTNode(bootstrap=tn.bootstrap, host="127.0.0.1", port=0, udx=udx, **options)
    try:
        await asyncio.wait_for(node.bootstrap(), 30)
        yield node
    finally:
        await node.close()
        udx.close()


async def wait_until(cond, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


async def echo(conn: Connection) -> None:
    with contextlib.suppress(Exception):
        async for msg in conn.secret_stream:
            conn.secret_stream.send(msg)
        conn.secret_stream.end()


async def echo_server(py: DHTNode) -> tuple[HyperDHTServer, list[Connection]]:
    """A listening server that echoes on every connection and keeps them, in order."""
    conns: list[Connection] = []

    async def on_connection(conn: Connection) -> None:
        conns.append(conn)
        await echo(conn)

    server = HyperDHTServer(py, key_pair(), on_connection)
    await asyncio.wait_for(server.listen(), 30)
    return server, conns


async def test_interop_dht_node_bootstraps_and_answers_node_peers(node: str) -> None:
    async with NodeTestnet.start(node, size=4) as tn, python_node(tn) as py:
        stats = py.stats()
        port = py.local_address()[1]
        # learned its address from reply `to` fields and passed the PING_NAT reachability check
        assert stats["bootstrapped"] and not stats["firewalled"]
        assert (stats["public_host"], stats["public_port"]) == ("127.0.0.1", port)
        assert py.remote_address() == ("127.0.0.1", port)
        # every testnet node but the (ephemeral) first one proved its id and sits in our table
        assert stats["nodes"] >= 3
        assert {n.id for n in py.table} <= {node_id(a) for a in tn.node_addresses}

        # Node pings us and sees its own address in our reply
        pong = await tn.call("ping", host="127.0.0.1", port=port)
        assert pong["ok"], pong
        assert pong["from"] == {"host": "127.0.0.1", "port": port} and pong["nodeId"] is None  # we stay ephemeral
        # a Node FIND_NODE sent to us gets closer nodes from our routing table
        target = hash32(b"some target").hex()
        fn = await tn.call("findNode", host="127.0.0.1", port=port, target=target)
        assert fn["ok"], fn
        (reply,) = fn["replies"]
        closer = {(n["host"], n["port"]) for n in reply["closerNodes"]}
        assert len(closer) >= 3 and closer <= set(tn.node_addresses)
        # hyperdht storage commands are not ours to serve while ephemeral: UNKNOWN_COMMAND + closer nodes
        unk = await tn.call("request", host="127.0.0.1", port=port, command=int(Command.LOOKUP), target=target)
        assert unk["ok"] and unk["error"] == ErrorCode.UNKNOWN_COMMAND and unk["closerNodes"] >= 3

        # and our queries are answered by Node: a FIND_NODE walk reaches every persistent node
        q = await py.find_node(hash32(b"another target"))
        assert {r.peer.address for r in q.closest_replies} == set(tn.node_addresses[1:])
        assert all(r.peer.id == node_id(r.peer.address) for r in q.closest_replies)


async def test_interop_dht_announce_found_by_node_and_unannounced_on_close(node: str) -> None:
    async with NodeTestnet.start(node, size=5) as tn, python_node(tn) as py:
        kp = key_pair()
        server = HyperDHTServer(py, kp, echo)
        await asyncio.wait_for(server.listen(), 30)
        assert len(server.announcer.announced_to) == 3
        assert py.stats()["last_announce"] is not None
        # the record sits at the 3 announce nodes; a Node findPeer walk finds it there
        res = await tn.call("findPeer", key=kp.public_key.hex())
        assert res["ok"], res
        holders = {(f["from"]["host"], f["from"]["port"]) for f in res["found"]}
        assert holders and holders <= set(server.announcer.announced_to)
        assert {f["publicKey"] for f in res["found"]} == {kp.public_key.hex()}
        await server.close()
        res = await tn.call("findPeer", key=kp.public_key.hex())
        assert res["ok"] and res["found"] == []


async def test_interop_dht_node_client_connects_and_echoes(node: str) -> None:
    async with NodeTestnet.start(node, size=4) as tn, python_node(tn) as py:
        server, conns = await echo_server(py)
        kp = server.key_pair
        message = "hello from a node hyperdht client " * 20
        res = await tn.call("connect", key=kp.public_key.hex(), message=message)
        assert res["ok"], res
        assert res["echo"] == message
        # the client's view: our key, the same Noise handshake hash, and UDX to our DHT port
        assert res["remotePublicKey"] == kp.public_key.hex()
        (conn,) = conns
        assert res["handshakeHash"] == conn.handshake_hash.hex()
        assert res["rawStream"]["remotePort"] == py.local_address()[1]
        assert res["rawStream"]["remoteId"] == conn.stream.id
        assert conn.relayed  # first contact came through the DHT node we announced to
        assert conn.remote_payload.udx is not None and conn.stream.remote_id == conn.remote_payload.udx.id
        await server.close()


async def test_interop_dht_reconnect_goes_direct_and_survives_garbage(node: str) -> None:
    async with NodeTestnet.start(node, size=4) as tn, python_node(tn) as py:
        server, conns = await echo_server(py)
        kp = server.key_pair

        # 5000 random datagrams (some shaped like dht-rpc and UDX frames) at the shared port first
        rng = random.Random(4)
        port = py.local_address()[1]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for i in range(5000):
                body = rng.randbytes(rng.randrange(0, 200))
                head = (b"\x03", b"\x13", b"\xff\x01", b"")[i % 4]
                s.sendto(head + body, ("127.0.0.1", port))
                if i % 50 == 0:
                    await asyncio.sleep(0.001)  # let the loop drain the socket: we test parsing, not buffers
        await wait_until(lambda: py.server_socket.stats.received_packets >= 5000)
        pong = await py.ping(tn.node_addresses[1])
        assert pong.error == 0
        assert py.internal_errors == 0

        first = await tn.call("connect", key=kp.public_key.hex(), message="one", client="c")
        assert first["ok"] and first["echo"] == "one", first
        # the client cached our relayAddresses (our own address first): it now talks to us directly
        second = await tn.call("connect", key=kp.public_key.hex(), message="two", client="c")
        assert second["ok"] and second["echo"] == "two", second
        assert [c.relayed for c in conns] == [True, False]
        assert conns[1].client_address == conns[1].stream.remote_addr
        assert server.responder.stats["failed"] == 0
        await server.close()


@pytest.mark.parametrize("holepunch", [False, True], ids=["lan_only", "lan_or_punch"])
async def test_interop_dht_firewalled_server_still_reached_on_same_host(node: str, holepunch: bool) -> None:
    # firewalled=True: we never claim OPEN, so the reply carries holepunch relays and no public address.
    # A Node client on the same host then pings our local address (hyperdht's same-IP shortcut) and,
    # in parallel, holepunches to the puncher socket we open for its attempt when we punch; hyperdht
    # 6.34 (connect.js holepunch()) races the two and the first to reach onsocket wins. So without
    # punching only our server socket can carry the stream; with it, either may, which depends on timing.
    async with NodeTestnet.start(node, size=4) as tn, python_node(tn, firewalled=True) as py:
        assert py.stats()["firewalled"] and py.remote_address() is None
        conns: list[tuple[Any, int]] = []

        async def on_connection(conn: Connection) -> None:
            sock = conn.stream.socket
            conns.append((sock, sock.port))  # read now: a punched stream's socket closes with it
            await echo(conn)

        server = HyperDHTServer(py, key_pair(), on_connection, holepunch=holepunch)
        await asyncio.wait_for(server.listen(), 30)
        # while firewalled we announce from the client socket; the announce nodes saw that address
        assert {r.peer_address for r in server.announcer.relays} == {py.client_socket.address}
        res = await tn.call("connect", key=server.public_key.hex(), message="behind a wall")
        assert res["ok"] and res["echo"] == "behind a wall", res
        ((sock, port),) = conns
        assert res["rawStream"]["remotePort"] == port  # both ends agree on our socket
        if sock is not py.server_socket:  # the punch won the race: a socket made for this client
            assert holepunch and sock is not py.client_socket and server.stats["holepunches"] >= 1
        await server.close()


async def test_interop_dht_refused_connection_resets_the_node_client(node: str) -> None:
    async with NodeTestnet.start(node, size=4) as tn, python_node(tn) as py:
        seen: list[bytes] = []

        def refuse(conn: Connection) -> None:
            seen.append(conn.remote_public_key)
            conn.destroy()  # e.g. not on the allow-list

        server = HyperDHTServer(py, key_pair(), refuse)
        await asyncio.wait_for(server.listen(), 30)
        res = await tn.call("connect", key=server.public_key.hex(), message="let me in", timeoutMs=8000)
        assert not res["ok"] and res["error"] == "ECONNRESET", res  # a UDX reset, not a timeout
        assert len(seen) == 1 and not server.connections
        await server.close()


async def test_interop_dht_forty_concurrent_node_clients(node: str) -> None:
    async with NodeTestnet.start(node, size=4) as tn, python_node(tn) as py:
        server = HyperDHTServer(py, key_pair(), echo)
        await asyncio.wait_for(server.listen(), 30)
        key = server.public_key.hex()
        calls = [tn.call("connect", key=key, message=f"m{i}", timeoutMs=60000) for i in range(40)]
        results = await asyncio.gather(*calls)
        assert [r.get("echo") for r in results] == [f"m{i}" for i in range(40)], [r for r in results if not r["ok"]]
        assert server.stats["connections"] == 40 and server.responder.stats["failed"] == 0
        assert py.internal_errors == 0
        await server.close()


async def test_interop_dht_reannounces_when_announce_nodes_die(node: str) -> None:
    async with NodeTestnet.start(node, size=7) as tn, python_node(tn) as py:
        server = HyperDHTServer(py, key_pair(), echo)
        await asyncio.wait_for(server.listen(), 30)
        assert server.announcer is not None
        first = set(server.announcer.announced_to)
        assert len(first) == 3
        # two of the three stop: the 3 s pings notice, and a new round announces elsewhere
        dead = sorted(first)[:2]
        await tn.call("kill", ports=[p for _, p in dead])
        announcer = server.announcer
        await wait_until(lambda: announcer.rounds >= 2 and not set(dead) & set(announcer.announced_to), 60)
        assert len(server.announcer.announced_to) == 3
        res = await tn.call("findPeer", key=server.public_key.hex())
        assert res["ok"] and res["found"], res
        res = await tn.call("connect", key=server.public_key.hex(), message="still here")
        assert res["ok"] and res["echo"] == "still here", res
        await server.close()


async def test_interop_dht_persistent_python_node_serves_storage_for_node_peers(node: str) -> None:
    # ephemeral=False: after the reachability check the node sends its id and stores for others
    async with NodeTestnet.start(node, size=3) as tn, python_node(tn, ephemeral=False) as py:
        port = py.local_address()[1]
        assert py.persistent is not None and py.id == node_id(("127.0.0.1", port))
        pong = await tn.call("ping", host="127.0.0.1", port=port)
        assert pong["ok"] and pong["nodeId"] == py.id.hex()  # Node validated our id

        # a Node server announces; with 2 persistent Node nodes around, we are an announce node
        served = await tn.call("serve")
        key = bytes.fromhex(served["key"])
        fwd = py.persistent.forwards.get(hash32(key))
        assert fwd is not None and fwd.record[:32] == key and fwd.relay in tn.node_addresses
        found = await tn.call("findPeer", key=key.hex())
        assert ("127.0.0.1", port) in {(f["from"]["host"], f["from"]["port"]) for f in found["found"]}
        res = await tn.call("connect", key=key.hex(), message="via the dht")
        assert res["ok"] and res["echo"] == "via the dht", res
        # a client told to start at our node: we relay its handshake to the Node server and back
        relayed_before = py.stats_relayed
        me = [{"host": "127.0.0.1", "port": port}]
        res = await tn.call("connect", key=key.hex(), message="through python", relayAddresses=me)
        assert res["ok"] and res["echo"] == "through python", res
        assert py.stats_relayed >= relayed_before + 2  # FROM_CLIENT out, FROM_SERVER back as REPLY

        # immutable, mutable and topic records written by Node land here and are read back
        imm = await tn.call("immutablePut", value="an immutable value")
        assert imm["ok"] and py.persistent.immutables.get(bytes.fromhex(imm["hash"])) == b"an immutable value"
        got = await tn.call("immutableGet", hash=imm["hash"])
        assert got["value"] == "an immutable value"
        mut = await tn.call("mutablePut", value="v1", seq=3)
        assert mut["ok"], mut
        stored = py.persistent.mutables.get(hash32(bytes.fromhex(mut["publicKey"])))
        assert stored is not None and b"v1" in stored
        got = await tn.call("mutableGet", publicKey=mut["publicKey"])
        assert got["value"] == "v1" and got["seq"] == 3
        topic = hash32(b"a topic").hex()
        ann = await tn.call("announceTopic", topic=topic)
        assert ann["ok"], ann
        assert py.persistent.records.get(bytes.fromhex(topic), 20)
        look = await tn.call("lookupTopic", topic=topic)
        ours = [f for f in look["found"] if (f["from"]["host"], f["from"]["port"]) == ("127.0.0.1", port)]
        assert ours and ours[0]["peers"] == [ann["publicKey"]]
        assert py.internal_errors == 0


async def test_interop_dht_firewalled_server_holepunches_with_a_firewalled_node_client(node: str) -> None:
    # neither side claims OPEN and the client's same-host shortcut is off: only a holepunch
    # through our puncher socket (its mapping sampled from DHT nodes, probes echoed) connects
    async with NodeTestnet.start(node, size=5) as tn, python_node(tn, firewalled=True) as py:
        conns: list[tuple[Connection, int]] = []

        async def on_connection(conn: Connection) -> None:
            conns.append((conn, conn.stream.socket.port))
            await echo(conn)

        server = HyperDHTServer(py, key_pair(), on_connection)
        await asyncio.wait_for(server.listen(), 30)
        res = await tn.call(
            "connect",
            key=server.public_key.hex(),
            message="punched through",
            dhtOpts={"quickFirewall": False},
            connectOpts={"localConnection": False},
            timeoutMs=30000,
        )
        assert res["ok"] and res["echo"] == "punched through", res
        assert res["clientFirewalled"]
        ((conn, port),) = conns
        assert conn.stream.socket not in (py.server_socket, py.client_socket)  # made for this client
        assert res["rawStream"]["remotePort"] == port
        assert server.stats["holepunches"] >= 1
        # the punch socket goes away with its stream (the client closed it)
        await wait_until(lambda: conn.stream.socket.closed)
        await server.close()


def wait_for_stats(relay: RelayProcess, cond: Callable[[dict[str, Any]], bool], timeout: float = 90) -> dict[str, Any]:
    """Poll the relay's /stats until `cond` holds (a bounded event wait, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = relay.stats()
        if cond(stats):
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"relay /stats never satisfied the wait: {stats['dht']}")
        time.sleep(0.2)


def test_interop_dht_relay_started_without_a_dht_relays_once_it_appears(node: str, tmp_path: Path) -> None:
    # a boot where the network (here: the DHT) is not up yet: the relay must not exit
    port = free_udp_port()
    with RelayProcess(tmp_path / "s", bootstrap=f"127.0.0.1:{port}") as relay:
        relay.start()
        assert relay.key is not None and relay.proc is not None, relay.stderr
        assert relay.stats()["dht"]["bootstrapped"] is False
        with Testnet(node, size=4, port=port) as tn:  # the DHT appears on the bootstrap port
            stats = wait_for_stats(relay, lambda s: s["dht"]["bootstrapped"] and s["dht"]["last_announce"])
            assert stats["dht"]["nodes"] >= 1 and not stats["dht"]["firewalled"]
            res = run_peers(node, tn.bootstrap, relay.key, relay.port, mode="client")
            assert res.all_ok and all(p["relayed"] for p in res.pairs), (res.summary, res.stderr[-2000:])
        assert relay.proc.poll() is None  # still running
    assert relay.stderr.count("no DHT node answered") == 1  # warned once, then quietly retried


OUTAGE_SECONDS = float(os.environ.get("DHT_OUTAGE_SECONDS", "15"))


@contextlib.contextmanager
def cut_off(host: str) -> Iterator[Callable[[bool], None]]:
    """nftables rules (in a table of our own, named for this process) that drop every packet
    from or to `host`: the relay bound there loses its network; yields `cut(on)`."""
    table = f"dhtcore_outage_{os.getpid()}"

    def nft(*args: str) -> None:
        subprocess.run(["nft", *args], check=True, capture_output=True, text=True, timeout=30)

    nft("add", "table", "ip", table)
    try:
        nft("add", "chain", "ip", table, "out", "{ type filter hook output priority 0 ; }")

        def cut(on: bool) -> None:
            if on:
                nft("add", "rule", "ip", table, "out", "ip", "saddr", host, "drop")
                nft("add", "rule", "ip", table, "out", "ip", "daddr", host, "drop")
            else:
                nft("flush", "chain", "ip", table, "out")

        yield cut
    finally:
        subprocess.run(["nft", "delete", "table", "ip", table], capture_output=True, timeout=30)


def test_interop_dht_relay_heals_after_a_network_outage(node: str, tmp_path: Path) -> None:
    if shutil.which("nft") is None:
        pytest.fail("nft is not on PATH: this test needs nftables and root (.ci/run installs it)")
    # the relay on a loopback address of its own; everything else stays on 127.0.0.1
    host = f"127.{os.getpid() >> 8 & 0xFF}.{os.getpid() & 0xFF}.{random.randint(2, 254)}"
    with (
        Testnet(node, size=4) as tn,
        cut_off(host) as cut,
        RelayProcess(tmp_path / "s", host=host, bootstrap=tn.bootstrap) as relay,
    ):
        relay.start()
        assert relay.key is not None, relay.stderr
        before = wait_for_stats(relay, lambda s: s["dht"]["bootstrapped"] and s["dht"]["last_announce"])
        assert before["dht"]["public_host"] == host
        cut(True)  # the relay host loses its network: every DHT node stops answering
        cut_at = time.monotonic()
        wait_for_stats(relay, lambda s: not s["dht"]["bootstrapped"])
        noticed = time.monotonic() - cut_at
        # stay cut off past a few failed rejoins (their backoff reaches its cap); 15 s by default
        # to keep the suite lean, DHT_OUTAGE_SECONDS=60 for the minute
        wait_for_stats(relay, lambda s: time.monotonic() - cut_at >= OUTAGE_SECONDS, timeout=OUTAGE_SECONDS + 30)
        assert not relay.stats()["dht"]["bootstrapped"]
        cut(False)  # and gets it back
        back, back_wall = time.monotonic(), time.time()
        after = wait_for_stats(relay, lambda s: s["dht"]["bootstrapped"] and s["dht"]["last_announce"] > back_wall)
        res = run_peers(node, tn.bootstrap, relay.key, relay.port, mode="client")
        healed = time.monotonic() - back
        assert res.all_ok and all(p["relayed"] for p in res.pairs), (res.summary, res.stderr[-2000:])
        assert after["dht"]["public_host"] == host and not after["dht"]["firewalled"]
        outage = back - cut_at
        print(f"{outage:.0f} s outage, noticed after {noticed:.1f} s; relayed a new pair {healed:.1f} s after it")


class HostilePeer(asyncio.DatagramProtocol):
    """A dht-rpc peer on its own 127.x address that lies about our address: its PINGs (with a
    valid id) claim we are at `fake`, and so does its answer to anything we ask it."""

    def __init__(self, fake: tuple[str, int]) -> None:
        self.fake = fake
        self.transport: asyncio.DatagramTransport | None = None
        self.answered = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    @property
    def address(self) -> tuple[str, int]:
        assert self.transport is not None
        return self.transport.get_extra_info("sockname")[:2]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        assert self.transport is not None
        try:
            msg = decode_message(data)
        except Exception:
            return
        if isinstance(msg, Request):
            self.answered += 1
            res = Response(tid=msg.tid, to=self.fake, id=node_id(self.address))
            self.transport.sendto(res.encode(), addr)

    def ping(self, to: tuple[str, int], tid: int) -> None:
        assert self.transport is not None
        req = Request(tid=tid, to=self.fake, command=Internal.PING, internal=True, id=node_id(self.address))
        self.transport.sendto(req.encode(), to)


async def test_interop_dht_hostile_hosts_cannot_move_our_public_address(node: str) -> None:
    fake = ("203.0.113.66", 4444)
    base = random.randint(2, 200)
    hosts = [f"127.{base}.{os.getpid() & 0xFF}.{i}" for i in range(1, 9)]  # eight hosts of one attacker
    async with NodeTestnet.start(node, size=4) as tn, python_node(tn) as py:
        port = py.local_address()[1]
        ours = ("127.0.0.1", port)
        assert py.remote_address() == ours
        server, _ = await echo_server(py)  # a relay that already listens when the attack starts
        loop = asyncio.get_running_loop()
        peers: list[HostilePeer] = []
        try:
            for h in hosts:
                _, p = await loop.create_datagram_endpoint(lambda: HostilePeer(fake), local_addr=(h, 0))
                peers.append(p)
            # 80 PINGs from each host claiming we are at `fake` (dht-rpc samples these)
            for p in peers:
                for tid in range(80):
                    p.ping(ours, tid)
            # and every one of our own requests to them is answered with `fake` too: now the
            # attacker holds 8 of the 9 hosts we heard from, so `fake` wins the vote...
            for p in peers:
                reply = await py.ping(p.address)
                assert reply.to == fake
            # ...and the witness of our address (the testnet host) is asked again: it still sees us
            await wait_until(lambda: py.nat.candidate is None and py.nat.refused >= 1, 30)
            assert py.remote_address() == ours and py.nat.moves == 0
            assert (py.stats()["public_host"], py.stats()["public_port"]) == ours
            # a Node client still gets our real address in the handshake and connects
            res = await tn.call("connect", key=server.public_key.hex(), message="still me")
            assert res["ok"] and res["echo"] == "still me", res
            assert res["rawStream"]["remotePort"] == port
            assert py.internal_errors == 0
            await server.close()
        finally:
            for p in peers:
                if p.transport is not None:
                    p.transport.close()
