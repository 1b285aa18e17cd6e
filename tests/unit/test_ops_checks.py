"""Prerequisite checks; the UDP ping one-liner against a tiny dht-rpc responder made here."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from cosmictui.ops.config import Settings
from cosmictui.ops.runner import LocalRunner, open_deployment
from cosmictui.ops.setup.checks import (
    check_deployment_host,
    check_dht,
    check_memory,
    check_relay_from_deployment,
    check_relay_runs_here,
    check_storage,
    check_udp_port,
    ping_command,
    run_checks,
)
from tests.unit.test_ops_runner import SSHEnv, ssh_env  # noqa: F401  (the real asyncssh server fixture)


class PingResponder(asyncio.DatagramProtocol):
    """Answers dht-rpc PING as docs/wire/dht.md §1 and §2 say: 0x13, flags, same tid, `to` = the sender's address."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.requests: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.requests.append(data)
        if self.mode == "silent" or len(data) < 11 or data[0] != 0x03 or data[1] != 0x04 or data[10] != 0:
            return
        tid = data[2:4] if self.mode == "ok" else bytes([data[2] ^ 0xFF, data[3]])
        to = socket.inet_aton(addr[0]) + addr[1].to_bytes(2, "little")
        self.transport.sendto(b"\x13\x00" + tid + to, addr)  # type: ignore[attr-defined]


async def responder(mode: str) -> tuple[asyncio.DatagramTransport, PingResponder, int]:
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_datagram_endpoint(lambda: PingResponder(mode), local_addr=("127.0.0.1", 0))
    return transport, proto, transport.get_extra_info("sockname")[1]


async def test_ping_one_liner_gets_a_valid_reply(tmp_path: Path) -> None:
    transport, proto, port = await responder("ok")
    try:
        result = await check_relay_from_deployment(LocalRunner(str(tmp_path)), "127.0.0.1", port, timeout=10)
    finally:
        transport.close()
    assert result.status == "ok", result
    assert "sees us as 127.0.0.1:" in result.detail
    req = proto.requests[0]
    # PING request bytes: 03 04 tid(2) to=127.0.0.1:port 00
    assert req[:2] == b"\x03\x04" and req[4:10] == b"\x7f\x00\x00\x01" + port.to_bytes(2, "little")
    assert req[10:] == b"\x00"


@pytest.mark.parametrize("mode", ["silent", "wrong-tid"])
async def test_ping_one_liner_fails_without_valid_reply(tmp_path: Path, mode: str) -> None:
    transport, proto, port = await responder(mode)
    try:
        result = await check_relay_from_deployment(LocalRunner(str(tmp_path)), "127.0.0.1", port, timeout=1)
    finally:
        transport.close()
    assert result.status == "fail"
    assert f"no dht-rpc reply from 127.0.0.1:{port}" in result.detail and "UDP port" in result.fix
    assert proto.requests  # it did send


async def test_ping_over_ssh(ssh_env: SSHEnv) -> None:  # noqa: F811
    transport, _proto, port = await responder("ok")
    runner = await open_deployment(
        f"ssh://ops@127.0.0.1:{ssh_env.port}{ssh_env.tmp}",
        known_hosts=str(ssh_env.known_hosts),
        client_keys=[str(ssh_env.client_key)],
    )
    try:
        host_ok = await check_deployment_host(runner)
        result = await check_relay_from_deployment(runner, "127.0.0.1", port, timeout=10)
    finally:
        transport.close()
        await runner.close()
    assert host_ok.status == "ok" and f"127.0.0.1:{ssh_env.port}" in host_ok.detail
    assert result.status == "ok" and result.name.startswith("Relay answers from ops@127.0.0.1")


async def test_ping_without_python3_nor_bash_on_the_host_is_a_warning_with_a_manual_way(tmp_path: Path) -> None:
    runner = LocalRunner(str(tmp_path), env={"PATH": "/nonexistent"})
    result = await check_relay_from_deployment(runner, "127.0.0.1", 9, timeout=1)
    assert result.status == "warn" and "python3 is not on localhost" in result.detail
    assert "send any UDP datagram" in result.fix


def _bin_without_python(tmp_path: Path) -> str:
    """A PATH with bash and coreutils but no python3: a minimal deployment host."""
    import shutil

    d = tmp_path / "nopython"
    d.mkdir()
    for tool in ("bash", "timeout", "head", "od", "sh"):
        (d / tool).symlink_to(shutil.which(tool))  # type: ignore[arg-type]
    return str(d)


@pytest.mark.parametrize("mode", ["ok", "silent"])
async def test_ping_without_python3_falls_back_to_bash_dev_udp(tmp_path: Path, mode: str) -> None:
    transport, proto, port = await responder(mode)
    try:
        runner = LocalRunner(str(tmp_path), env={"PATH": _bin_without_python(tmp_path)})
        result = await check_relay_from_deployment(runner, "127.0.0.1", port, timeout=2)
    finally:
        transport.close()
    assert proto.requests and proto.requests[0][:2] == b"\x03\x04"  # the same PING bytes, sent by bash
    if mode == "ok":
        assert result.status == "warn" and "checked with bash /dev/udp instead" in result.detail
        assert f"127.0.0.1:{port} answered" in result.detail
    else:
        assert result.status == "fail" and "no dht-rpc reply" in result.detail


def test_ping_command_is_stdlib_only() -> None:
    cmd = ping_command("relay.example", 49737, 2.5)
    assert cmd.startswith("python3 -c ") and cmd.endswith(" relay.example 49737 2.5")
    assert "import os,socket,sys,time" in cmd and "\n" not in cmd  # one line, copyable


async def test_deployment_host_missing_directory(tmp_path: Path) -> None:
    result = await check_deployment_host(LocalRunner(str(tmp_path / "gone")))
    assert result.status == "fail" and "does not exist" in result.detail


def test_relay_runs_here() -> None:
    result = check_relay_runs_here()
    assert result.status == "ok" and "Noise XX round trip passed" in result.detail


@pytest.fixture
def busy_udp_port() -> Iterator[int]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", 0))
    yield s.getsockname()[1]
    s.close()


def test_udp_port_free_and_taken(busy_udp_port: int) -> None:
    taken = check_udp_port(busy_udp_port)
    assert taken.status == "fail" and "already in use" in taken.detail and taken.fix
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", 0))
    port = s.getsockname()[1]
    s.close()
    assert check_udp_port(port).status == "ok"


def test_memory() -> None:
    assert check_memory(1).status == "ok"
    low = check_memory(1 << 60)
    assert low.status == "fail" and "the relay needs up to" in low.detail


def test_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp_result = check_storage(str(tmp_path / "relay"))
    assert tmp_result.status == "warn" and "temporary" in tmp_result.detail
    monkeypatch.chdir(tmp_path)
    rel = check_storage("./corestore")
    assert rel.status == "warn" and "relative" in rel.detail and "/var/lib/blind-relay" in rel.fix
    (tmp_path / "file").write_text("x")
    bad = check_storage(str(tmp_path / "file" / "relay"))
    assert bad.status == "fail" and "not a directory" in bad.detail
    assert check_storage("/proc/cosmictui-relay").status == "fail"


def test_dht_from_stats() -> None:
    assert check_dht(None).status == "warn"
    base = {
        "port": 49737,
        "dht": {
            "bootstrapped": True,
            "firewalled": False,
            "public_host": "203.0.113.5",
            "public_port": 49737,
            "nodes": 20,
        },
    }
    ok = check_dht(base)
    assert ok.status == "ok" and "203.0.113.5:49737" in ok.detail
    fw = check_dht({**base, "dht": {**base["dht"], "firewalled": True}})
    assert fw.status == "fail" and "firewalled" in fw.detail and "UDP port 49737" in fw.fix
    assert check_dht({**base, "dht": {"bootstrapped": False, "firewalled": True}}).status == "fail"


async def test_run_checks_local_order(tmp_path: Path) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", 0))
    port = s.getsockname()[1]
    s.close()
    settings = Settings(deployment=str(tmp_path), relay_storage=str(tmp_path / "relay"), relay_port=port)
    results = await run_checks(settings, LocalRunner(str(tmp_path)), ping_timeout=0.5)
    names = [r.name for r in results]
    assert names[:5] == [
        "Relay runs here",
        f"UDP port {port}",
        "Free memory",
        "Storage directory",
        "DHT reachable, port open",
    ]
    assert names[5:] == [
        "Bootstrap node answers",
        "Deployment host reachable",
        "Taskfile tasks",
        "Jobs can be listed",
        "Relay answers from localhost",
    ]
    assert results[-1].status == "fail"  # no relay runs on that port
    assert results[7].status == "fail" and results[8].status == "fail"  # no task, no cosmicac here


async def test_bootstrap_node_answers_configured_silent_and_public_unreachable() -> None:
    from cosmictui.ops.setup.checks import check_bootstrap

    transport, proto, port = await responder("ok")
    silent, _, quiet_port = await responder("silent")
    try:
        ok = await check_bootstrap(Settings(relay_bootstrap=(f"127.0.0.1:{quiet_port}", f"127.0.0.1:{port}")))
        assert ok.status == "ok" and f"1 of 2 answered (127.0.0.1:{port})" in ok.detail, ok
        assert proto.requests and proto.requests[0][:2] == b"\x03\x04"  # a real dht-rpc PING
        bad = await check_bootstrap(Settings(relay_bootstrap=(f"127.0.0.1:{quiet_port}",)), timeout=0.5)
        assert bad.status == "fail" and "[relay] bootstrap" in bad.fix
        public = await check_bootstrap(Settings(), timeout=0.5)  # the public nodes (loopback in tests)
        assert public.status == "warn" and "public HyperDHT bootstrap nodes" in public.detail
        malformed = await check_bootstrap(Settings(relay_bootstrap=("nonsense",)))
        assert malformed.status == "fail" and "is not HOST:PORT" in malformed.detail
    finally:
        transport.close()
        silent.close()


def test_a_running_relay_without_metrics_is_not_called_not_running(tmp_path: Path) -> None:
    """The DHT row of a relay that runs with its metrics off says it runs (pid) and why the DHT view
    is unknown; it said "the relay is not running (or its metrics are off)"."""
    import json
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "relay-stand-in"])
    try:
        (tmp_path / "relay-runtime.json").write_text(
            json.dumps({"pid": proc.pid, "key": "k" * 52, "host": "127.0.0.1", "port": 49999, "metrics": None})
        )
        results = asyncio.run(
            run_checks(Settings(relay_storage=str(tmp_path), relay_port=49999, relay_bootstrap=("127.0.0.1:9",)))
        )
    finally:
        proc.kill()
        proc.wait()
    dht = next(r for r in results if r.name == "DHT reachable, port open")
    assert dht.status == "warn" and "not running" not in dht.detail, dht
    assert f"pid {proc.pid}" in dht.detail and "metrics" in dht.detail, dht
    assert "[relay] metrics" in dht.fix, dht
