"""`blind-relay` checks every flag and address before it touches anything: a bad flag is one
`blind-relay: error: …` line and exit code 2 (the usage is for `--help`), the metrics address is
bound before the storage is created or a key made, and a `primary-key` of the wrong length is
refused with one line naming the file.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from relay.cli import main
from relay.service.storage import PRIMARY_KEY_FILE, StorageError, load_primary_key

ROOT = Path(__file__).resolve().parents[2]
#: 192.0.2.0/24 is TEST-NET-1: never an address of this machine (binding it fails, nothing is sent)
ELSEWHERE = "192.0.2.1"

BAD_FLAGS = [
    ["--port", "abc"],
    ["--port", "70000"],
    ["--host", "999.1.1.1"],
    ["--host", "relay.example"],
    ["--host", ELSEWHERE],
    ["--metrics", "999.1.1.1:8080"],
    ["--metrics", f"{ELSEWHERE}:8080"],
    ["--metrics", "127.0.0.1:http"],
    ["--metrics", "127.0.0.1:70000"],
    ["--metrics", "nonsense"],
    ["--bootstrap", "nohost"],
    ["--bootstrap", "127.0.0.1:0"],
    ["--max-sessions", "0"],
    ["--max-active-pairs", "-3"],
    ["--pending-timeout", "-1"],
    ["--max-control-frame", "big"],
    ["--memory-budget", "10"],
    ["--memory-budget", "lots"],
    ["--allow", "notakey"],
    ["--log-level", "loud"],
    ["--log-format", "xml"],
    ["--unit-exec", "/opt/blind-relay/bin/blind-relay"],
    ["--scraper-public-key", "a" * 64],
    ["--frobnicate"],
]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("bad", BAD_FLAGS, ids=lambda b: " ".join(b)[:40])
def test_every_bad_flag_is_one_line_exit_2_and_creates_nothing(
    bad: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = tmp_path / "fresh"
    args = ["--storage", str(storage), "--host", "127.0.0.1", "--port", "0", "--bootstrap", "127.0.0.1:9"]
    code, out, err = run([*args, "--metrics", "127.0.0.1:0", *bad], capsys)
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("blind-relay: error: "), err
    assert "usage" not in err and out == ""
    assert not storage.exists()  # no storage directory, no key


def test_help_still_shows_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--help"], capsys)
    assert code == 0 and out.startswith("usage: blind-relay") and "--memory-budget MB" in out


def test_an_explicit_metrics_address_in_use_stops_the_relay_before_any_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        storage = tmp_path / "fresh"
        code, out, err = run(
            ["--storage", str(storage), "--metrics", f"127.0.0.1:{port}", "--port", "0", "--host", "127.0.0.1"],
            capsys,
        )
    assert code == 1 and out == "", (code, out, err)
    assert err.strip() == (
        f"blind-relay: error: cannot serve metrics on 127.0.0.1:{port}: address already in use "
        "(use --metrics HOST:PORT or off)"
    )
    assert not storage.exists()


def test_a_udp_port_in_use_stops_the_relay_before_any_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        storage = tmp_path / "fresh"
        code, _, err = run(
            ["--storage", str(storage), "--metrics", "off", "--port", str(port), "--host", "127.0.0.1"], capsys
        )
    assert code == 1 and err.count("\n") == 1 and "already in use" in err, err
    assert not storage.exists()


@pytest.mark.parametrize("size", [31, 33, 64])
def test_a_primary_key_of_the_wrong_length_is_refused_and_kept(tmp_path: Path, size: int) -> None:
    key = tmp_path / PRIMARY_KEY_FILE
    key.write_bytes(b"\x42" * size)
    with pytest.raises(StorageError) as e:
        load_primary_key(tmp_path)
    assert f"{key} holds {size} bytes, a primary key is exactly 32" in str(e.value)
    assert key.read_bytes() == b"\x42" * size


def test_the_relay_refuses_a_64_byte_primary_key_in_one_line_naming_the_file(tmp_path: Path) -> None:
    key = tmp_path / PRIMARY_KEY_FILE
    key.write_bytes(bytes(range(64)))
    argv = ["--storage", str(tmp_path), "--metrics", "off", "--host", "127.0.0.1", "--port", "0"]
    res = subprocess.run(
        [sys.executable, "-m", "relay", *argv, "--bootstrap", "127.0.0.1:9"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"blind-relay: error: {key} holds 64 bytes"), res.stderr
    assert "Server listening" not in res.stdout and key.read_bytes() == bytes(range(64))
