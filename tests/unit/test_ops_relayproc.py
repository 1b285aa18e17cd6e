"""Start, attach to and stop the real Python relay as a detached process."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cosmictui.ops.demo.sandbox import ensure_dht, stop_dht
from cosmictui.ops.relayproc import (
    RelayProcError,
    RelayRuntime,
    attach,
    key_change_warning,
    log_path,
    pid_alive,
    read_key,
    read_runtime,
    relay_command,
    relay_status,
    running_relays,
    runtime_path,
    start_relay,
    stop_relay,
    storage_key,
)
from cosmictui.ops.setup.checks import check_udp_port, dht_ping


@pytest.fixture
async def relay(tmp_path: Path) -> AsyncIterator[RelayRuntime]:
    """The real relay on a private DHT (the relay refuses to start without one)."""
    storage = str(tmp_path / "relay-storage")
    boot = ensure_dht(tmp_path, Path(storage))
    try:
        rt = await start_relay(storage, 0, host="127.0.0.1", bootstrap=[boot], metrics="127.0.0.1:0", timeout=60)
        try:
            yield rt
        finally:
            await stop_relay(storage, timeout=10)
            with contextlib.suppress(ProcessLookupError):
                os.kill(rt.pid, signal.SIGKILL)
    finally:
        stop_dht(tmp_path)


async def test_start_attach_status_stop(relay: RelayRuntime, tmp_path: Path) -> None:
    storage = relay.storage
    assert pid_alive(relay.pid) and relay.port > 0
    assert os.getsid(relay.pid) == relay.pid  # its own session: survives the TUI's terminal
    assert relay.metrics and relay.metrics.startswith("http://127.0.0.1:")
    assert read_key(storage) == relay.key == storage_key(storage)
    log = log_path(storage).read_text()
    assert f"Server listening on {relay.key}" in log and "cosmictui started:" in log
    # the interpreter by name: no install path in a log that screenshots and tickets show
    assert f"cosmictui started: {Path(sys.executable).name} -m relay --storage" in log
    assert sys.executable not in log
    again = await start_relay(storage, 0)  # already running: attach, do not start a second one
    assert again.pid == relay.pid
    assert attach(storage) == relay
    status = relay_status(storage)
    assert status.running and not status.stale_runtime
    assert dht_ping("127.0.0.1", relay.port, 10.0)[0]  # the real relay answers dht-rpc PING
    held = check_udp_port(relay.port, "127.0.0.1", storage)
    assert held.status == "ok" and "held by our relay" in held.detail
    # a different storage would change the key: say so loudly, before anything happens
    other = str(tmp_path / "elsewhere")
    warning = key_change_warning(other, previous_storage=storage)
    assert warning is not None
    assert "NEW key" in warning and relay.key in warning and f"pid {relay.pid}" in warning
    assert "same storage directory" in warning
    mismatch = key_change_warning(storage, configured_keys=["someotherkey"])
    assert mismatch is not None and relay.key in mismatch
    assert relay in running_relays()  # found by its command line
    beside = key_change_warning(other, running=[relay])
    assert beside is not None and "1 relay with its own storage and key runs on this host" in beside
    on_port = key_change_warning(other, running=[relay], port=relay.port)
    assert on_port is not None and f"storage {storage} (pid {relay.pid}" in on_port
    assert f"holds UDP port {relay.port}" in on_port
    assert key_change_warning(storage, running=[relay]) is None
    assert await stop_relay(storage) is True
    assert not pid_alive(relay.pid)
    assert read_runtime(storage) is None and attach(storage) is None
    assert await stop_relay(storage) is False
    assert read_key(storage) == relay.key  # from the log once the runtime file is gone
    assert key_change_warning(storage, storage) is None
    assert key_change_warning(storage, configured_keys=[relay.key]) is None


async def test_relay_that_exits_early_reports_log(tmp_path: Path) -> None:
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\necho 'blind-relay: error: storage is broken' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(RelayProcError) as err:
        await start_relay(str(tmp_path / "s"), 0, python=str(fake), timeout=30)
    assert "exited with code 1" in err.value.what
    assert "storage is broken" in err.value.log_tail and "storage is broken" in err.value.fix


async def test_relay_that_never_listens_is_stopped(tmp_path: Path) -> None:
    fake = tmp_path / "fake-python"
    pidfile = tmp_path / "pid"
    fake.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 60\n")
    fake.chmod(0o755)
    with pytest.raises(RelayProcError) as err:
        await start_relay(str(tmp_path / "s"), 0, python=str(fake), timeout=1)
    assert "did not report `Server listening on`" in err.value.what
    assert not pid_alive(int(pidfile.read_text()))


def test_stale_runtime_file(tmp_path: Path) -> None:
    storage = tmp_path / "s"
    storage.mkdir()
    runtime_path(str(storage)).write_text(
        '{"pid": 999999999, "key": "k", "host": "0.0.0.0", "port": 1, "metrics": null, "started_at": 0, "version": "x"}'
    )
    status = relay_status(str(storage))
    assert not status.running and status.stale_runtime and status.runtime is not None
    assert attach(str(storage)) is None
    assert not pid_alive(0) and not pid_alive(-1) and pid_alive(os.getpid())
    runtime_path(str(storage)).write_text("{not json")
    assert read_runtime(str(storage)) is None


def test_relay_command() -> None:
    cmd = relay_command("/var/lib/blind-relay", 49737, bootstrap=["a:1", "b:2"], metrics="off", python="py")
    assert cmd == [
        "py",
        "-m",
        "relay",
        "--storage",
        "/var/lib/blind-relay",
        "--port",
        "49737",
        "--bootstrap",
        "a:1,b:2",
        "--metrics",
        "off",
    ]


def _other_relay(storage: str, n: int) -> RelayRuntime:
    return RelayRuntime(10_000 + n, f"key{n:049d}", "127.0.0.1", 40_000 + n, None, 0.0, "0.1.0", storage)


def test_restarting_on_the_known_storage_is_no_key_change_even_beside_other_relays(tmp_path: Path) -> None:
    # Seen in the wizard: restarting the relay on the storage it used last time (key already in
    # the .env) warned "This changes the relay key" only because unrelated relays ran on the host.
    storage = tmp_path / "relay-storage"
    storage.mkdir()
    (storage / "primary-key").write_bytes(os.urandom(32))
    key = storage_key(str(storage))
    assert key is not None
    others = [_other_relay(str(tmp_path / f"other{i}"), i) for i in range(6)]
    assert key_change_warning(str(storage), previous_storage=str(storage), running=others) is None
    assert key_change_warning(str(storage), configured_keys=[key], running=others) is None
    # nothing known about this deployment yet: other relays are still worth a warning, kept short
    first_time = key_change_warning(str(storage), running=others)
    assert first_time is not None and "6 relays with their own storage and key run on this host" in first_time
    assert not any(o.storage in first_time or o.key in first_time for o in others)  # one line, not a list
    # a key that differs from the .env's still warns, whatever else runs
    assert key_change_warning(str(storage), configured_keys=["someotherkey"], running=others) is not None


def test_relay_command_with_kernel_forwarding() -> None:
    cmd = relay_command("/var/lib/blind-relay", 49737, python="py", kernel_forwarding=True)
    assert cmd[-1] == "--kernel-forwarding"
    assert "--kernel-forwarding" not in relay_command("/var/lib/blind-relay", 49737, python="py")


def test_key_change_warning_names_only_the_relays_that_bear_on_this_deployment(tmp_path: Path) -> None:
    # On a shared host the warning listed other relays one by one (up to 3 long lines, then "and N
    # more"); only the relay whose key the .env lists and the one on the wizard's port matter.
    storage = tmp_path / "new-storage"
    others = [_other_relay(str(tmp_path / f"other{i}"), i) for i in range(8)]
    listed, on_port = others[2], others[5]
    warning = key_change_warning(str(storage), configured_keys=[listed.key], running=others, port=on_port.port)
    assert warning is not None
    assert f"storage {listed.storage} (pid {listed.pid}, key {listed.key})" in warning
    assert "its key is the one the .env lists" in warning
    assert f"storage {on_port.storage} (pid {on_port.pid}" in warning and f"holds UDP port {on_port.port}" in warning
    assert "6 other relays with their own storage and key run on this host" in warning
    for o in others:
        if o not in (listed, on_port):
            assert o.storage not in warning and o.key not in warning
