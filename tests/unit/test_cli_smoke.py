"""The `blind-relay` command as operators meet it: output lines, runtime file, signals, one-line errors."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.interop._relay_proc import RelayProcess

Z32 = set("ybndrfg8ejkmcpqxot1uwisza345h769")


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "relay", *args], capture_output=True, text=True, timeout=timeout)


def test_relay_help_lists_the_blind_relay_flags() -> None:
    out = _run("--help").stdout
    for flag in (
        "--storage",
        "--port",
        "--host",
        "--bootstrap",
        "--metrics",
        "--allow",
        "--allow-file",
        "--log-format",
        "--systemd-unit",
    ):
        assert flag in out


def test_prints_the_two_lines_writes_runtime_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    storage = tmp_path / "store"
    with RelayProcess(storage) as r:
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


def test_sigint_also_exits_0_and_same_storage_gives_same_key(tmp_path: Path) -> None:
    keys = []
    for _ in range(2):
        with RelayProcess(tmp_path / "s") as r:
            r.start()
            keys.append(r.key)
            assert r.terminate(signal.SIGINT) == 0, r.stderr
    assert keys[0] == keys[1] and keys[0] is not None
    with RelayProcess(tmp_path / "other") as r:
        r.start()
        assert r.key != keys[0]


def test_port_in_use_is_one_clear_line(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        res = _run("--storage", str(tmp_path / "s"), "--port", str(port), "--host", "127.0.0.1", "--metrics", "off")
    assert res.returncode == 1
    err = res.stderr.strip().splitlines()
    assert err[-1] == (
        f"blind-relay: error: UDP port {port} on 127.0.0.1 is already in use "
        "(is another relay running? pick one with --port)"
    )
    assert "Traceback" not in res.stderr
    assert "Server listening" not in res.stdout


def test_metrics_port_in_use_is_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = _run(
            "--storage", str(tmp_path / "s"), "--port", "0", "--host", "127.0.0.1", "--metrics", f"127.0.0.1:{port}"
        )
    assert res.returncode == 1
    assert (
        res.stderr.strip().splitlines()[-1].startswith(f"blind-relay: error: cannot serve metrics on 127.0.0.1:{port}")
    )
    assert "Traceback" not in res.stderr


def test_storage_that_is_not_a_directory_is_one_clear_line(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    res = _run("--storage", str(f / "sub"), "--port", "0", "--metrics", "off")
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"blind-relay: error: cannot create storage directory {f / 'sub'}")
    assert "Traceback" not in res.stderr


def test_bad_flags_are_usage_errors() -> None:
    assert _run("--port", "70000").returncode == 2
    assert _run("--metrics", "nonsense").returncode == 2
    assert _run("--bootstrap", "hostwithoutport").returncode == 2


def test_bad_allow_key_is_one_clear_line(tmp_path: Path) -> None:
    res = _run("--storage", str(tmp_path / "s"), "--allow", "notakey", "--metrics", "off")
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1] == (
        "blind-relay: error: --allow: 'notakey' is not a public key (52 z32 or 64 hex characters)"
    )


def test_json_logs_are_one_object_per_line(tmp_path: Path) -> None:
    with RelayProcess(tmp_path / "s", "--log-format", "json") as r:
        r.start()
        assert r.terminate() == 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines, "no log lines"
    objs = [json.loads(ln) for ln in lines]
    assert any(o["msg"] == "relay listening" and o["port"] == r.port for o in objs)
    assert all({"ts", "level", "logger", "msg"} <= o.keys() for o in objs)


def test_python_m_relay_and_console_script_are_one_program() -> None:
    from relay import cli

    assert cli.build_parser().prog == "blind-relay"
    res = _run("--systemd-unit", "--storage", "/var/lib/blind-relay")
    assert res.returncode == 0 and "StateDirectory=blind-relay" in res.stdout
