"""Allow-list parsing, the handshake limiter (virtual time) and the systemd unit."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.keys import encode_id, key_pair
from relay.service.allow import AllowListError, build_allow_list, read_allow_file
from relay.service.limits import HandshakeLimiter, LimitCounters, Limits
from relay.service.metrics import parse_address
from relay.service.systemd import render_unit

K1 = key_pair(b"\x01" * 32).public_key
K2 = key_pair(b"\x02" * 32).public_key


def test_allow_list_default_is_open() -> None:
    assert build_allow_list([], []) is None


def test_allow_list_takes_z32_and_hex_and_files(tmp_path: Path) -> None:
    f = tmp_path / "allow"
    f.write_text(f"# agents\n\n{K2.hex().upper()}  # worker\n")
    assert build_allow_list([encode_id(K1)], [str(f)]) == frozenset({K1, K2})


def test_allow_file_errors_say_where(tmp_path: Path) -> None:
    f = tmp_path / "allow"
    f.write_text(f"{encode_id(K1)}\nbogus\n")
    with pytest.raises(AllowListError, match=rf"{f}:2: 'bogus' is not a public key"):
        read_allow_file(f)
    with pytest.raises(AllowListError, match="cannot read allow file"):
        read_allow_file(tmp_path / "missing")


def test_handshake_limiter_is_a_token_bucket_on_virtual_time() -> None:
    lim = HandshakeLimiter(burst=3, refill_per_second=1.0)
    assert [lim.allow("10.0.0.1", 0.0) for _ in range(4)] == [True, True, True, False]
    assert lim.allow("10.0.0.2", 0.0)  # other addresses are unaffected
    assert not lim.allow("10.0.0.1", 0.5)
    assert lim.allow("10.0.0.1", 1.6)
    assert not lim.allow("10.0.0.1", 1.6)
    assert [lim.allow("10.0.0.1", 100.0) for _ in range(4)] == [True, True, True, False]  # refills to burst only


def test_handshake_limiter_forgets_old_addresses() -> None:
    lim = HandshakeLimiter(burst=1, refill_per_second=0.0, max_tracked=100)
    for i in range(1000):
        lim.allow(f"10.0.{i // 256}.{i % 256}", 0.0)
    assert len(lim) == 100


def test_limit_counters_list_every_cap() -> None:
    c = LimitCounters()
    c.hit("pending_total", 2)
    snap = c.snapshot()
    assert snap["pending_total"] == 2 and snap["sessions"] == 0
    assert set(Limits().as_dict()) >= {"max_sessions", "max_pending_total", "pending_timeout"}


def _unit(**kw: object) -> str:
    args = {
        "storage": "/var/lib/blind-relay",
        "port": 49737,
        "host": "0.0.0.0",
        "bootstrap": None,
        "metrics": "127.0.0.1:49738",
    }
    args.update(kw)
    return render_unit(**args)  # type: ignore[arg-type]


def test_unit_is_hardened_and_runs_the_given_flags() -> None:
    unit = _unit(allow=[encode_id(K1)], bootstrap="127.0.0.1:5000")
    lines = unit.splitlines()
    for must in (
        "DynamicUser=yes",
        "User=blind-relay",
        "StateDirectory=blind-relay",
        "Restart=on-failure",
        "NoNewPrivileges=yes",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "CapabilityBoundingSet=",
        "WantedBy=multi-user.target",
    ):
        assert must in lines, must
    exec_line = next(ln for ln in lines if ln.startswith("ExecStart="))
    for part in (
        "--storage /var/lib/blind-relay",
        "--port 49737",
        "--bootstrap 127.0.0.1:5000",
        f"--allow {encode_id(K1)}",
        "--metrics 127.0.0.1:49738",
    ):
        assert part in exec_line


def test_unit_outside_var_lib_and_low_port() -> None:
    unit = _unit(storage="/srv/relay", port=443)
    assert "ReadWritePaths=/srv/relay" in unit and "StateDirectory" not in unit
    assert "AmbientCapabilities=CAP_NET_BIND_SERVICE" in unit


def test_cli_prints_the_unit_for_its_flags() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "relay", "--systemd-unit", "-p", "5000", "--max-sessions", "10"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    exec_line = next(ln for ln in out.splitlines() if ln.startswith("ExecStart="))
    assert "--storage /var/lib/blind-relay" in exec_line and "--port 5000" in exec_line
    assert "--max-sessions 10" in exec_line


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed on this machine")
def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "relay", "--systemd-unit"], capture_output=True, text=True, check=True
    ).stdout
    unit = tmp_path / "blind-relay.service"
    unit.write_text(out)
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [ln for ln in (res.stdout + res.stderr).splitlines() if "blind-relay.service" in ln]
    assert res.returncode == 0 and not problems, res.stdout + res.stderr


@given(st.text(max_size=80))
@settings(deadline=None)
def test_parse_address_never_raises_anything_but_value_error(text: str) -> None:
    try:
        out = parse_address(text)
    except ValueError:
        return
    assert out is None or (isinstance(out[0], str) and 0 <= out[1] <= 65535)


@given(st.text(max_size=300))
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=50, deadline=None)
def test_allow_file_random_text_is_keys_or_a_located_error(tmp_path: Path, text: str) -> None:
    f = tmp_path / "allow"
    f.write_text(text)
    try:
        keys = read_allow_file(f)
    except AllowListError as e:
        assert str(e).startswith(f"{f}:")
        return
    assert all(len(k) == 32 for k in keys)
