"""The Python hyperdht client (`relay.dht.client`) against real Node peers on a loopback testnet.

Python client -> Node server directly, through our relay and through the Node relay (npm hyperdht +
blind-relay as blind-relay-service runs them); Node client -> Python server with the server
relaying; both sides relaying; 1 MB intact each way; an unknown key fails fast with a clear error.
"relayed" is checked on the wire: the raw stream's remote port is the relay's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from relay.dht import Connection, DHTError, DHTNode, HyperDHTServer
from relay.dht.client import connect
from relay.keys import decode_id, key_pair
from relay.udx import UDX
from tests.interop._client_peers import ROOT, NodePeers, NodeRelay
from tests.interop._relay_net import Testnet
from tests.interop._relay_proc import RelayProcess

pytestmark = [pytest.mark.interop, pytest.mark.timeout(180), pytest.mark.xdist_group("interop_client")]

MB = 1 << 20


@pytest.fixture(scope="module")
def testnet(node: str) -> Iterator[Testnet]:
    with Testnet(node, 4) as tn:
        yield tn


@pytest.fixture(scope="module")
def py_relay(testnet: Testnet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    with RelayProcess(tmp_path_factory.mktemp("relay"), bootstrap=testnet.bootstrap) as r:
        r.start()
        assert r.key, r.stderr
        yield r


@pytest.fixture(scope="module")
def node_relay(node: str, testnet: Testnet) -> Iterator[NodeRelay]:
    r = NodeRelay(node, testnet.bootstrap)
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture(scope="module")
def peers(node: str, testnet: Testnet) -> Iterator[NodePeers]:
    p = NodePeers(node, testnet.bootstrap)
    try:
        yield p
    finally:
        p.stop()


@contextlib.asynccontextmanager
async def python_node(testnet: Testnet, **options: Any) -> AsyncIterator[DHTNode]:
    udx = UDX()
    dht = DHTNode(bootstrap=testnet.bootstrap.split(","), host="127.0.0.1", udx=udx, **options)
    try:
        await asyncio.wait_for(dht.bootstrap(), 30)
        yield dht
    finally:
        await dht.close()
        udx.close()


async def call(peers: NodePeers, cmd: str, **args: Any) -> dict[str, Any]:
    res = await asyncio.to_thread(peers.call, cmd, **args)
    assert res["ok"], res
    return res


async def exchange(conn: Connection, size: int = MB) -> bytes:
    """Send `size` random bytes, return what came back once `size` bytes did."""
    data = os.urandom(size)
    ss = conn.secret_stream

    async def send() -> None:
        for i in range(0, size, 60000):
            ss.send(data[i : i + 60000])
            await ss.drain()

    sender = asyncio.ensure_future(send())
    got = bytearray()
    while len(got) < size:
        msg = await asyncio.wait_for(ss.recv(), 60)
        assert msg is not None, f"stream ended after {len(got)} bytes"
        got += msg
    await sender
    assert bytes(got) == data, "echo differs"
    return bytes(got)


def hexkey(z32: str) -> str:
    return decode_id(z32).hex()


@pytest.mark.parametrize("server_open", [True, False], ids=["server-open", "server-connects-to-us"])
async def test_interop_client_python_to_node_server_direct_1mb(
    testnet: Testnet, peers: NodePeers, server_open: bool
) -> None:
    srv = await call(peers, "serve", firewalled=not server_open)
    async with python_node(testnet) as dht:
        conn = await connect(dht, bytes.fromhex(srv["key"]), timeout=30)
        try:
            assert not conn.relayed
            assert conn.remote_public_key.hex() == srv["key"]
            await exchange(conn)
            assert conn.extra["trace"].stages.keys() >= {"found", "handshake", "opened"}
        finally:
            conn.destroy()


@pytest.mark.parametrize("which", ["python", "node"])
async def test_interop_client_python_to_node_server_through_relay_1mb(
    testnet: Testnet, peers: NodePeers, py_relay: RelayProcess, node_relay: NodeRelay, which: str
) -> None:
    if which == "python":
        relay_key, relay_port, relay_ports = py_relay.key, py_relay.port, {py_relay.port}
    else:
        relay_key, relay_port, relay_ports = node_relay.key, node_relay.port, node_relay.ports
    assert relay_key is not None
    srv = await call(peers, "serve", holepunch=False, shareLocalAddress=False)
    async with python_node(testnet) as dht:
        conn = await connect(
            dht, bytes.fromhex(srv["key"]), relay_through=decode_id(relay_key), punch=False, timeout=30
        )
        try:
            assert conn.relayed and conn.remote_address == ("127.0.0.1", relay_port)
            await exchange(conn)
            served = (await call(peers, "served"))["connections"]
            assert served and served[-1]["remotePort"] in relay_ports  # the Node side's raw stream too
            stages = conn.extra["trace"].stages
            assert list(stages) == ["found", "handshake", "relay_connected", "paired", "opened"]
        finally:
            conn.destroy()
    if which == "python":
        stats = py_relay.stats()
        assert stats["pairings"]["matched"] >= 1 and stats["traffic"]["relayed_bytes"] >= 2 * MB


@pytest.mark.parametrize("relay_side", ["server", "both"])
async def test_interop_client_node_client_to_python_server_relaying_1mb(
    testnet: Testnet, peers: NodePeers, node_relay: NodeRelay, relay_side: str
) -> None:
    relay_key = decode_id(node_relay.key)
    conns: list[Connection] = []

    async def on_connection(conn: Connection) -> None:
        conns.append(conn)
        with contextlib.suppress(Exception):
            async for msg in conn.secret_stream:
                conn.secret_stream.send(msg)

    async with python_node(testnet, firewalled=True) as dht:
        kp = key_pair()
        server = HyperDHTServer(
            dht, kp, on_connection, holepunch=False, share_local_address=False, relay_through=relay_key
        )
        await asyncio.wait_for(server.listen(), 30)
        try:
            args: dict[str, Any] = {"key": kp.public_key.hex(), "bytes": MB, "holepunch": False, "timeoutMs": 40000}
            if relay_side == "both":
                args["relayThrough"] = relay_key.hex()
            res = await call(peers, "connect", timeout=60, **args)
            assert res["intact"] and res["received"] == MB
            assert res["remotePort"] in node_relay.ports  # the Node client's raw stream goes to the relay
            assert conns and conns[0].relayed and conns[0].remote_address == ("127.0.0.1", node_relay.port)
            assert conns[0].extra["relay_through"] == relay_key
        finally:
            await server.close()


async def test_interop_client_both_sides_relaying_python_client_node_server(
    testnet: Testnet, peers: NodePeers, py_relay: RelayProcess
) -> None:
    assert py_relay.key is not None
    relay_key = decode_id(py_relay.key)
    srv = await call(peers, "serve", holepunch=False, shareLocalAddress=False, relayThrough=relay_key.hex())
    before = py_relay.stats()["pairings"]["matched"]
    async with python_node(testnet) as dht:
        conn = await connect(dht, bytes.fromhex(srv["key"]), relay_through=relay_key, punch=False, timeout=30)
        try:
            assert conn.relayed and conn.remote_address == ("127.0.0.1", py_relay.port)
            await exchange(conn, 200_000)
        finally:
            conn.destroy()
    assert py_relay.stats()["pairings"]["matched"] == before + 1


async def test_interop_client_unknown_key_fails_clearly_in_bounded_time(testnet: Testnet) -> None:
    async with python_node(testnet) as dht:
        started = time.monotonic()
        with pytest.raises(DHTError) as e:
            await connect(dht, key_pair().public_key, timeout=20)
        elapsed = time.monotonic() - started
    assert e.value.code == "PEER_NOT_FOUND" and "no DHT node holds an announce" in str(e.value)
    assert elapsed < 20


def run_probe_cli(*args: str, timeout: float = 90) -> tuple[int, dict[str, Any], float]:
    started = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "cosmictui", "relay", "probe", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    elapsed = time.monotonic() - started
    assert p.stdout, p.stderr
    return p.returncode, json.loads(p.stdout), elapsed


@pytest.mark.parametrize("which", ["python", "node"])
def test_interop_client_relay_probe_cli_through_real_relays(
    testnet: Testnet, py_relay: RelayProcess, node_relay: NodeRelay, which: str
) -> None:
    key, ports = (py_relay.key, {py_relay.port}) if which == "python" else (node_relay.key, node_relay.ports)
    assert key is not None
    before = py_relay.stats()["pairings"]["matched"]
    rc, res, _ = run_probe_cli(key, "--bootstrap", testnet.bootstrap)
    assert rc == 0, res
    assert res["ok"] and res["relayed"] and res["error"] is None
    assert [s["name"] for s in res["stages"]] == [
        "key found on the DHT",
        "handshake with the relay",
        "pairing matched",
        "first echo",
        "bytes and round trip",
    ]
    assert all(s["ok"] and s["seconds"] >= 0 for s in res["stages"])
    assert int(res["relay_address"].rsplit(":", 1)[1]) in ports
    assert res["bytes"] == 2 * 64 * 1024 and res["rtt_ms"] > 0
    if which == "python":  # the relay itself saw the pair
        assert py_relay.stats()["pairings"]["matched"] == before + 1


def test_interop_client_relay_probe_cli_unknown_key_fails_in_bounded_time(testnet: Testnet) -> None:
    from relay.keys import encode_id

    rc, res, elapsed = run_probe_cli(
        encode_id(key_pair().public_key), "--bootstrap", testnet.bootstrap, "--timeout", "15"
    )
    assert rc == 1 and not res["ok"]
    assert res["stages"][0]["name"] == "key found on the DHT" and not res["stages"][0]["ok"]
    assert "no DHT node holds an announce" in res["error"]
    assert len(res["stages"]) == 1 and elapsed < 30


def test_interop_client_check_includes_the_probe_when_a_relay_runs(
    testnet: Testnet, py_relay: RelayProcess, tmp_path: Path
) -> None:
    boot = ", ".join(f'"{b}"' for b in testnet.bootstrap.split(","))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[relay]\nstorage = "{py_relay.storage}"\nport = {py_relay.port}\nbootstrap = [{boot}]\n')
    p = subprocess.run(
        [sys.executable, "-m", "cosmictui", "--config", str(cfg), "check", "--json"],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
    )
    rows = {r["name"]: r for r in json.loads(p.stdout)}
    probe = rows["Relay carries a connection (probe)"]
    assert probe["status"] == "ok" and f"127.0.0.1:{py_relay.port}" in probe["detail"], probe
    # a key nobody serves: the row fails and says at which stage, and check exits 1
    p = subprocess.run(
        [sys.executable, "-m", "cosmictui", "--config", str(cfg), "check", "--json", "--relay-key", "ab" * 32],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
    )
    rows = {r["name"]: r for r in json.loads(p.stdout)}
    probe = rows["Relay carries a connection (probe)"]
    assert p.returncode == 1 and probe["status"] == "fail" and "key found on the DHT" in probe["detail"], probe


async def test_interop_client_wizard_attaches_to_the_node_relay_by_key(
    testnet: Testnet, node_relay: NodeRelay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator who runs npm blind-relay-service: no runtime file, no /stats, only the key.
    Step 2 attaches by key, the probe's peers meet through that relay, and step 3 gets the key."""
    from textual.widgets import Input

    from cosmictui.app import WizardApp
    from cosmictui.ops.demo.sandbox import create_sandbox
    from cosmictui.ops.session import WizardContext
    from tests.e2e._wizard_support import step, wait_status

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    sb = create_sandbox(tmp_path / "demo", bootstrap=tuple(testnet.bootstrap.split(",")), start_dht=False)
    try:
        app = WizardApp(WizardContext(sb.settings, demo=sb))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_status(pilot, app, "prereqs", ("ok", "warn"), timeout=30)
            await pilot.press("n")
            relay_step = step(app, "relay")
            relay_step.query_one("#relay-by-key", Input).value = "not-a-key"
            await pilot.press("k")
            text = await wait_status(pilot, app, "relay", ("error",), timeout=10)
            assert "not a relay key" in text
            field = relay_step.query_one("#relay-by-key", Input)
            field.value = node_relay.key
            field.focus()
            await pilot.press("enter")  # Enter on the pasted key attaches by it
            text = await wait_status(pilot, app, "relay", ("ok", "error"), timeout=60)
            assert "Attached by key" in text, text
            rows = [r.text for r in relay_step.query("CheckRow")]
            assert any(r.startswith("✔ ok Relay carries a connection (probe)") for r in rows), rows
            assert app.screen.ctx.relay_key == node_relay.key
            await pilot.press("n")
            assert app.screen.index == 2  # on to the .env step with the key
        # quit and come back: the relay runs elsewhere, so there is no runtime file to find; the
        # resumed wizard must remember it was attached by key, not call it "not running"
        app = WizardApp(WizardContext(sb.settings, demo=sb))
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            ctx = app.screen.ctx
            assert ctx.relay_key == node_relay.key and ctx.relay_external and ctx.relay_problem() is None
            assert app.screen.index == 2
            await pilot.press("b")
            relay_step = step(app, "relay")
            text = await wait_status(pilot, app, "relay", ("info",), timeout=10)
            assert "Attached by key" in text and "probe it again" in text, text
            assert relay_step.query_one("#relay-by-key", Input).value == node_relay.key
            await pilot.press("k")  # the key is in its field: probe it again
            text = await wait_status(pilot, app, "relay", ("ok", "error"), timeout=60)
            assert "Attached by key" in text and ctx.relay_external, text
    finally:
        sb.close()


async def test_interop_client_holepunches_a_firewalled_node_server(testnet: Testnet, peers: NodePeers) -> None:
    """Both sides firewalled (consistent NATs on loopback): two PEER_HOLEPUNCH rounds through the
    DHT node, then probes; the raw stream ends on our puncher socket, not on any relay."""
    srv = await call(peers, "serve")  # a firewalled Node server that punches
    async with python_node(testnet, firewalled=True) as dht:
        assert dht.remote_address() is None  # we cannot claim OPEN: the server cannot just connect to us
        conn = await connect(dht, bytes.fromhex(srv["key"]), timeout=30)
        try:
            assert not conn.relayed and conn.stream.socket is not dht.client_socket
            assert conn.stream.socket is not dht.server_socket  # the puncher's own socket
            await exchange(conn, 200_000)
            served = (await call(peers, "served"))["connections"]
            assert served[-1]["remotePort"] == conn.stream.socket.address[1]
        finally:
            conn.destroy()


async def test_interop_client_python_client_holepunches_a_python_server(testnet: Testnet) -> None:
    """Our client against our server's puncher (relay.dht.server), both firewalled."""
    async with python_node(testnet, firewalled=True) as srv_node, python_node(testnet, firewalled=True) as cli_node:
        conns: list[Connection] = []

        async def on_connection(conn: Connection) -> None:
            conns.append(conn)
            with contextlib.suppress(Exception):
                async for msg in conn.secret_stream:
                    conn.secret_stream.send(msg)

        kp = key_pair()
        server = HyperDHTServer(srv_node, kp, on_connection, share_local_address=False)
        await asyncio.wait_for(server.listen(), 30)
        try:
            conn = await connect(cli_node, kp.public_key, timeout=30)
            try:
                assert not conn.relayed
                await exchange(conn, 100_000)
                assert conns and conns[0].stream.socket not in (srv_node.server_socket, srv_node.client_socket)
                assert server.stats["holepunches"] >= 1
            finally:
                conn.destroy()
        finally:
            await server.close()


def test_interop_client_relay_probe_watch_gives_round_trips_over_time(testnet: Testnet, node_relay: NodeRelay) -> None:
    """A relay without metrics (the Node one): the round trip through it, sample after sample."""
    watch = ["--watch", "--interval", "0.2", "--count", "4", "--json"]
    p = subprocess.run(
        [sys.executable, "-m", "cosmictui", "relay", "probe", node_relay.key, "--bootstrap", testnet.bootstrap, *watch],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
    )
    samples = [json.loads(line) for line in p.stdout.splitlines()]
    assert p.returncode == 0 and len(samples) == 4, (p.stdout, p.stderr)
    assert all(s["ok"] and s["rtt_ms"] > 0 for s in samples)
    assert [s["detail"] for s in samples] == ["probed", "echo", "echo", "echo"]  # one connection, kept
    assert all(int(s["relay_address"].rsplit(":", 1)[1]) in node_relay.ports for s in samples)
    assert samples[0]["at"] < samples[-1]["at"]


async def test_interop_client_probe_of_a_server_that_is_no_relay_fails_at_pairing(testnet: Testnet) -> None:
    """A hyperdht server that is not a blind relay (it hangs up): found, handshake ok, pairing fails."""
    from cosmictui.ops.metrics.probe import run_probe

    async def hang_up(conn: Connection) -> None:
        conn.close()

    async with python_node(testnet) as dht:
        kp = key_pair()
        server = HyperDHTServer(dht, kp, hang_up)
        await asyncio.wait_for(server.listen(), 30)
        try:
            res = await run_probe(kp.public_key, testnet.bootstrap.split(","), timeout=20)
        finally:
            await server.close()
    assert not res.ok and [s.ok for s in res.stages] == [True, True, False]
    assert res.stages[2].name == "pairing matched" and "closed the connection before pairing" in res.stages[2].detail
    assert res.seconds < 20


async def test_interop_client_probe_from_the_deployment_host(
    testnet: Testnet, py_relay: RelayProcess, tmp_path: Path
) -> None:
    """Where cosmictui is installed on the deployment host, the probe runs there too (here: a
    local runner whose PATH has this venv's `cosmictui`); where it is not, no row at all."""
    from cosmictui.ops.metrics.probe import probe_from_host
    from cosmictui.ops.runner import LocalRunner

    assert py_relay.key is not None
    venv_bin = str(Path(sys.executable).parent)
    with_it = LocalRunner(str(tmp_path), env={"PATH": f"{venv_bin}:/usr/bin:/bin"})
    row = await probe_from_host(with_it, py_relay.key, testnet.bootstrap.split(","), timeout=20)
    assert row is not None and row.status == "ok", row
    assert f"127.0.0.1:{py_relay.port}" in row.detail and row.name.startswith("Relay carries a connection from")
    without = LocalRunner(str(tmp_path), env={"PATH": "/nonexistent"})
    assert await probe_from_host(without, py_relay.key, testnet.bootstrap.split(","), timeout=20) is None


async def test_interop_client_probe_watch_notices_a_relay_that_dies(testnet: Testnet, tmp_path: Path) -> None:
    """Samples keep coming when the relay goes away: a lost echo, then a failed probe, bounded."""
    from cosmictui.ops.metrics.probe import watch_probe

    relay = RelayProcess(tmp_path / "r", bootstrap=testnet.bootstrap)
    try:
        relay.start()
        assert relay.key is not None
        samples = []
        boot = testnet.bootstrap.split(",")
        # generous bounds for what must work; the dead relay only ever makes us wait them out
        async for s in watch_probe(relay.key, boot, interval=0.2, timeout=20, count=3, echo_timeout=2):
            samples.append(s)
            if len(samples) == 1:
                assert s.ok and s.detail == "probed"
                relay.stop()  # SIGKILL: no goodbye to anyone
    finally:
        relay.stop()
    assert [s.ok for s in samples] == [True, False, False], samples
    assert samples[1].detail.startswith("echo lost")
    assert samples[2].detail.startswith(("handshake with the relay", "pairing matched")), samples[2]
    assert samples[2].at - samples[0].at < 30
