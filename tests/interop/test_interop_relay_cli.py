"""The `blind-relay` process as operators meet it, listening on a loopback testnet: output, runtime file, signals."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.interop._relay_net import Testnet
from tests.interop._relay_proc import DEFAULT_METRICS, RelayProcess

pytestmark = [pytest.mark.interop, pytest.mark.timeout(180)]

Z32 = set("ybndrfg8ejkmcpqxot1uwisza345h769")


@pytest.fixture(scope="module")
def testnet(node: str) -> Iterator[Testnet]:
    with Testnet(node, size=4) as tn:
        yield tn


def test_interop_relay_cli_prints_two_lines_writes_runtime_exits_0(tmp_path: Path, testnet: Testnet) -> None:
    storage = tmp_path / "store"
    with RelayProcess(storage, bootstrap=testnet.bootstrap) as r:
        r.start()
        assert r.proc is not None and r.proc.poll() is None, r.stderr
        assert r.stdout_lines[0] == f"Using corestore storage at {storage.resolve()}"
        key = r.stdout_lines[1].removeprefix("Server listening on ")
        assert len(key) == 52 and set(key) <= Z32
        rt = r.runtime
        assert rt is not None
        assert rt["key"] == key and rt["pid"] == r.proc.pid and rt["host"] == "127.0.0.1"
        assert isinstance(rt["port"], int) and rt["port"] > 0
        assert rt["metrics"].startswith("http://127.0.0.1:")
        assert isinstance(rt["started_at"], int) and isinstance(rt["version"], str)
        # the UDP port is really held by the relay
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s, pytest.raises(OSError):
            s.bind(("127.0.0.1", rt["port"]))
        assert r.terminate(signal.SIGTERM) == 0
        assert not (storage / "relay-runtime.json").exists()
        assert "Traceback" not in r.stderr
        assert len(r.stdout_lines) == 2


def test_interop_relay_cli_sigint_and_same_storage_same_key(tmp_path: Path, testnet: Testnet) -> None:
    keys = []
    for _ in range(2):
        with RelayProcess(tmp_path / "s", bootstrap=testnet.bootstrap) as r:
            r.start()
            keys.append(r.key)
            assert r.terminate(signal.SIGINT) == 0, r.stderr
    assert keys[0] == keys[1] and keys[0] is not None
    with RelayProcess(tmp_path / "other", bootstrap=testnet.bootstrap) as r:
        r.start()
        assert r.key != keys[0]


def test_interop_relay_cli_second_relay_on_one_storage_exits_1_and_keeps_the_first_runtime(
    tmp_path: Path, testnet: Testnet
) -> None:
    storage = tmp_path / "s"
    with RelayProcess(storage, bootstrap=testnet.bootstrap) as first:
        first.start()
        assert first.proc is not None and first.key is not None, first.stderr
        runtime_file = storage / "relay-runtime.json"
        runtime_before = runtime_file.read_bytes()
        with RelayProcess(storage, bootstrap=testnet.bootstrap) as second:
            second.start()  # returns once it exited: it must never print a key
            assert second.wait() == 1, second.stderr
        assert second.key is None and len(second.stdout_lines) == 1
        assert second.stderr.strip().splitlines()[-1] == (
            f"blind-relay: error: storage {storage.resolve()} is in use by pid {first.proc.pid} (another relay); "
            "stop it or use another --storage"
        )
        # on its way out the second relay touched nothing of the first's: runtime file and lock intact
        assert runtime_file.read_bytes() == runtime_before
        assert json.loads(runtime_before)["pid"] == first.proc.pid
        assert (storage / "relay.lock").read_text() == f"{first.proc.pid}\n"
        assert first.proc.poll() is None and first.stats()["key"] == first.key
        assert first.terminate(signal.SIGTERM) == 0, first.stderr
    assert not runtime_file.exists()  # the owner removes it at its clean exit


def test_interop_relay_cli_json_logs(tmp_path: Path, testnet: Testnet) -> None:
    with RelayProcess(tmp_path / "s", "--log-format", "json", bootstrap=testnet.bootstrap) as r:
        r.start()
        assert r.terminate() == 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines, "no log lines"
    objs = [json.loads(ln) for ln in lines]
    assert any(o["msg"] == "relay listening" and o["port"] == r.port for o in objs)
    assert all({"ts", "level", "logger", "msg"} <= o.keys() for o in objs)


async def test_interop_relay_cli_sigterm_unannounces_the_key(node: str, tmp_path: Path) -> None:
    """While listening a Node findPeer finds the relay key; after SIGTERM (exit 0) it is gone."""
    from relay.keys import decode_id
    from tests.interop._dht_testnet import NodeTestnet

    async with NodeTestnet.start(node, size=5) as tn:
        with RelayProcess(tmp_path / "s", bootstrap=",".join(tn.bootstrap)) as r:
            await asyncio.to_thread(r.start)
            assert r.key is not None, r.stderr
            key_hex = decode_id(r.key).hex()
            found = await tn.call("findPeer", key=key_hex)
            assert found["ok"] and {f["publicKey"] for f in found["found"]} == {key_hex}, found
            assert await asyncio.to_thread(r.terminate, signal.SIGTERM) == 0, r.stderr
        gone = await tn.call("findPeer", key=key_hex)
        assert gone["ok"] and gone["found"] == [], gone


def test_interop_relay_cli_second_relay_with_default_flags_starts_beside_the_first(
    tmp_path: Path, testnet: Testnet
) -> None:
    """`blind-relay -s a` and `blind-relay -s b` on one host (blind-relay-service runs both): the
    second finds the default metrics address taken, serves metrics on a free port, says so in
    one line and records it in its runtime file. (Another engineer's relay may hold 49738 here
    too; the first then falls back as well, which this test accepts.)"""
    with (
        RelayProcess(tmp_path / "a", metrics=DEFAULT_METRICS, bootstrap=testnet.bootstrap) as a,
        RelayProcess(tmp_path / "b", metrics=DEFAULT_METRICS, bootstrap=testnet.bootstrap) as b,
    ):
        a.start()
        assert a.key is not None, a.stderr
        b.start()
        assert b.key is not None and b.proc is not None and b.proc.poll() is None, b.stderr
        urls = {a.metrics_url, b.metrics_url}
        assert len(urls) == 2 and all(u.startswith("http://127.0.0.1:") for u in urls)
        assert b.metrics_url != "http://127.0.0.1:49738"
        notes = [ln for ln in b.stderr.splitlines() if "metrics address 127.0.0.1:49738 is in use" in ln]
        assert len(notes) == 1 and b.metrics_url in notes[0], b.stderr
        assert b.stats()["key"] == b.key and a.stats()["key"] == a.key
        assert "Traceback" not in a.stderr + b.stderr
        assert b.terminate() == 0 and a.terminate() == 0


def test_interop_relay_cli_explicit_metrics_that_cannot_bind_is_an_error(tmp_path: Path, testnet: Testnet) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with RelayProcess(tmp_path / "s", metrics=f"127.0.0.1:{port}", bootstrap=testnet.bootstrap) as r:
            r.start()
            assert r.wait() == 1 and r.key is None
        assert r.stderr.strip().splitlines()[-1] == (
            f"blind-relay: error: cannot serve metrics on 127.0.0.1:{port}: address already in use "
            "(use --metrics HOST:PORT or off)"
        )


def test_interop_relay_cli_scraper_flags_start_the_relay_while_the_scraper_is_unreachable(
    tmp_path: Path, testnet: Testnet
) -> None:
    """No scraper announces this key: the relay still starts at once and says what it registers
    (the registration itself: tests/interop/test_interop_scraper.py)."""
    args = ("--scraper-public-key", "ab" * 32, "--scraper-secret", "cd" * 32, "--scraper-alias", "gpu-relay-1")
    with RelayProcess(tmp_path / "s", *args, bootstrap=testnet.bootstrap) as r:
        r.start()
        assert r.key is not None and r.proc is not None and r.proc.poll() is None, r.stderr
        stats = r.stats()
        assert stats["key"] == r.key
        assert stats["scraper"]["alias"] == "gpu-relay-1" and stats["scraper"]["registered"] is False
        assert r.terminate() == 0
        assert "Traceback" not in r.stderr


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs the test mounts (root only) and fills; unmounted whatever happens."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=True, timeout=30)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, timeout=30)


def _fill(mnt: Path) -> None:
    with (mnt / "filler").open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC


@pytest.mark.parametrize("with_key", [False, True])
def test_interop_relay_cli_full_disk_is_one_error_line(full_disk: Path, testnet: Testnet, with_key: bool) -> None:
    storage = full_disk / "store"
    if with_key:  # a relay that ran once: key there, no relay.lock yet
        storage.mkdir()
        (storage / "primary-key").write_bytes(os.urandom(32))
    _fill(full_disk)
    assert not (storage / "relay.lock").exists()
    with RelayProcess(storage, bootstrap=testnet.bootstrap) as r:
        r.start()
        assert r.wait() == 1 and r.key is None
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in r.stderr
    assert len(lines) == 1 and lines[0].startswith("blind-relay: error: "), r.stderr
    assert "No space left on device" in lines[0], r.stderr
