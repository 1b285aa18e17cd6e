"""Allow-list parsing, the handshake limiter (virtual time) and the systemd unit."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.keys import encode_id, key_pair
from relay.service.allow import AllowListError, build_allow_list, read_allow_file
from relay.service.limits import HandshakeGate, HandshakeLimiter, LimitCounters, Limits
from relay.service.metrics import parse_address
from relay.service.systemd import RenderedUnit, UnitError, render_unit

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


def test_handshake_limiter_reserve_waits_for_a_token_within_max_wait_only() -> None:
    lim = HandshakeLimiter(burst=1, refill_per_second=2.0)
    assert lim.reserve("h", 0.0, max_wait=1.0) == 0.0
    assert lim.reserve("h", 0.0, max_wait=1.0) == pytest.approx(0.5)  # in debt: the next token is its
    assert lim.reserve("h", 0.0, max_wait=1.0) == pytest.approx(1.0)
    assert lim.reserve("h", 0.0, max_wait=1.0) is None  # 1.5 s away: refused
    assert lim.reserve("h", 0.25, max_wait=1.0) is None  # and that spent nothing: still 1.25 s
    assert lim.reserve("h", 0.5, max_wait=1.0) == pytest.approx(1.0)
    assert not lim.allow("h", 1.5)  # allow never goes into debt
    assert HandshakeLimiter(burst=1, refill_per_second=0.0).reserve("h", 0.0, 5.0) == 0.0


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


# A relay installed system-wide: the unit must not run the one in this checkout's home-dir venv.
SYSTEM_RELAY = ["/usr/bin/python3", "-m", "relay"]


def _unit(**kw: object) -> RenderedUnit:
    args: dict[str, object] = {
        "storage": "/var/lib/blind-relay",
        "port": 49737,
        "host": "0.0.0.0",
        "bootstrap": None,
        "metrics": "127.0.0.1:49738",
        "command": SYSTEM_RELAY,
    }
    args.update(kw)
    return render_unit(**args)  # type: ignore[arg-type]


def _unit_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relay", "--systemd-unit", "--unit-exec", " ".join(SYSTEM_RELAY), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def _exec_words(unit: str) -> list[str]:
    """ExecStart= split as systemd does for what we emit (double quotes, \\ and \\" escapes, %% and $$)."""
    line = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line.removeprefix("ExecStart="))]


def test_unit_is_hardened_and_runs_the_given_flags() -> None:
    unit = _unit(allow=[encode_id(K1)], bootstrap="127.0.0.1:5000").text
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
        "PrivateTmp=yes",
        "CapabilityBoundingSet=",
        "WantedBy=multi-user.target",
    ):
        assert must in lines, must
    exec_line = next(ln for ln in lines if ln.startswith("ExecStart="))
    assert exec_line.startswith("ExecStart=/usr/bin/python3 -m relay ")
    for part in (
        "--storage /var/lib/blind-relay",
        "--port 49737",
        "--bootstrap 127.0.0.1:5000",
        f"--allow {encode_id(K1)}",
        "--metrics 127.0.0.1:49738",
    ):
        assert part in exec_line


def test_unit_low_port_gets_only_the_bind_capability() -> None:
    unit = _unit(port=443).text.splitlines()
    assert "AmbientCapabilities=CAP_NET_BIND_SERVICE" in unit
    assert "CapabilityBoundingSet=CAP_NET_BIND_SERVICE" in unit


def test_unit_with_kernel_forwarding_gets_net_admin_and_netlink() -> None:
    lines = _unit_cli("--kernel-forwarding", "-p", "443").stdout.splitlines()
    assert "AmbientCapabilities=CAP_NET_BIND_SERVICE CAP_NET_ADMIN" in lines
    assert "CapabilityBoundingSet=CAP_NET_BIND_SERVICE CAP_NET_ADMIN" in lines
    assert "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK" in lines
    assert "--kernel-forwarding" in _exec_words("\n".join(lines))
    plain = _unit().text.splitlines()
    assert "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX" in plain and "CapabilityBoundingSet=" in plain


def test_unit_without_storage_notes_the_unit_key_path_and_the_plain_run_path(tmp_path: Path) -> None:
    res = _unit_cli(cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "StateDirectory=blind-relay" in res.stdout.splitlines()
    note = res.stderr.strip()
    assert note.startswith("blind-relay: note: no --storage: the unit keeps its key in /var/lib/blind-relay")
    assert f"a plain `blind-relay` run from here uses {tmp_path.resolve() / 'corestore'}" in note
    # with --storage the operator chose the key: no note
    chosen = _unit_cli("--storage", "/var/lib/blind-relay", cwd=tmp_path)
    assert chosen.returncode == 0 and chosen.stderr == ""


@pytest.mark.parametrize(
    ("storage", "directive"),
    [
        ("/tmp/relay", "PrivateTmp=yes"),
        ("/var/tmp/relay", "PrivateTmp=yes"),
        ("/home/alice/corestore", "ProtectHome=yes"),
        ("/root/corestore", "ProtectHome=yes"),
        ("/run/user/1000/relay", "ProtectHome=yes"),
    ],
)
def test_unit_refuses_storage_hidden_by_the_sandbox(storage: str, directive: str) -> None:
    with pytest.raises(UnitError) as e:
        _unit(storage=storage)
    msg = str(e.value)
    assert msg.startswith(f"the unit cannot use storage {storage}: {directive}")
    assert "NEW key" in msg and f"sudo cp -a {storage}/. /var/lib/blind-relay/" in msg


def test_cli_unit_for_a_storage_under_tmp_is_a_usage_error() -> None:
    res = _unit_cli("--storage", "/tmp/relay-store")
    assert res.returncode == 2 and res.stdout == ""
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("blind-relay: error: the unit cannot use storage /tmp/relay-store: PrivateTmp=yes")


@pytest.mark.parametrize(
    "command",
    [
        ["/home/alice/venv/bin/blind-relay"],
        ["/tmp/venv/bin/python", "-m", "relay"],
        ["/root/.local/bin/blind-relay"],
    ],
)
def test_unit_refuses_an_executable_hidden_by_the_sandbox(command: list[str]) -> None:
    with pytest.raises(UnitError, match=rf"cannot run the relay executable {command[0]}: .*--unit-exec"):
        _unit(command=command)


def test_unit_refuses_this_python_when_the_relay_package_lives_in_a_home(monkeypatch: pytest.MonkeyPatch) -> None:
    import relay
    from relay.service import systemd

    monkeypatch.setattr(systemd, "default_command", lambda: ["/usr/bin/python3", "-m", "relay"])
    monkeypatch.setattr(relay, "__file__", "/home/dev/cosmictui/relay/__init__.py")
    with pytest.raises(UnitError, match="cannot run the relay package /home/dev/cosmictui/relay: ProtectHome"):
        _unit(command=None)


def test_unit_runs_the_relay_that_printed_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from relay.service.systemd import default_command

    script = tmp_path / "opt" / "bin" / "blind-relay"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    monkeypatch.setattr(sys, "argv", [str(script), "--systemd-unit"])
    assert default_command() == [str(script)]  # not another blind-relay that PATH finds first
    monkeypatch.setattr(sys, "argv", [str(Path("relay/__main__.py").resolve()), "--systemd-unit"])
    assert default_command() == [sys.executable, "-m", "relay"]


def test_cli_unit_exec_under_home_is_a_usage_error() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "relay", "--systemd-unit", "--unit-exec", "/home/alice/venv/bin/blind-relay"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and res.stdout == ""
    assert "cannot run the relay executable /home/alice/venv/bin/blind-relay" in res.stderr.splitlines()[-1]


def test_unit_refuses_an_allow_file_hidden_by_the_sandbox() -> None:
    with pytest.raises(UnitError, match="cannot read allow file /home/alice/allow: ProtectHome"):
        _unit(allow_files=["/home/alice/allow"])


def test_unit_outside_var_lib_runs_as_a_fixed_user_who_must_own_the_storage() -> None:
    unit = _unit(storage="/srv/relay")
    lines = unit.text.splitlines()
    assert "DynamicUser=yes" not in lines and not any(ln.startswith("StateDirectory") for ln in lines)
    assert "User=blind-relay" in lines and "ReadWritePaths=/srv/relay" in lines
    (note,) = unit.notes
    assert "sudo useradd --system --user-group --no-create-home --shell /usr/sbin/nologin blind-relay" in note
    assert "sudo install -d -m 0700 -o blind-relay -g blind-relay /srv/relay" in note
    assert "sudo chown -R blind-relay:blind-relay /srv/relay" in note
    # the CLI prints that note on stderr, the unit alone on stdout
    res = _unit_cli("--storage", "/srv/relay")
    assert res.returncode == 0 and res.stdout == unit.text
    assert "blind-relay: note: storage /srv/relay is outside /var/lib" in res.stderr


@pytest.mark.parametrize("storage", ["/var/lib/my relay", "/srv/a\tb", '/var/lib/re"lay', "/var/lib/a\\b"])
def test_unit_refuses_storage_paths_systemd_would_split(storage: str) -> None:
    with pytest.raises(UnitError, match="space, quote, backslash or control character"):
        _unit(storage=storage)


def test_cli_unit_storage_with_a_space_is_a_usage_error() -> None:
    res = _unit_cli("--storage", "/var/lib/my relay")
    assert res.returncode == 2 and res.stdout == ""
    assert "'/var/lib/my relay' holds a space" in res.stderr.splitlines()[-1]
    assert "sudo mv '/var/lib/my relay' /var/lib/my-relay" in res.stderr


def test_unit_quotes_and_escapes_exec_start_arguments() -> None:
    odd = '/etc/blind relay/allow 100% "$HOME".txt'
    unit = _unit(storage="/var/lib/relay%i", allow_files=[odd]).text
    lines = unit.splitlines()
    assert "StateDirectory=relay%%i" in lines  # % is a specifier: doubled
    words = _exec_words(unit)
    assert words[:3] == SYSTEM_RELAY
    assert words[words.index("--storage") + 1] == "/var/lib/relay%i"
    assert words[words.index("--allow-file") + 1] == odd
    with pytest.raises(UnitError, match="control character"):
        _unit(allow_files=["/etc/allow\nExecStartPre=/bin/sh"])


def test_cli_prints_the_unit_for_its_flags() -> None:
    res = _unit_cli("-p", "5000", "--max-sessions", "10", "--storage", "/var/lib/blind-relay")
    assert res.returncode == 0, res.stderr
    exec_line = next(ln for ln in res.stdout.splitlines() if ln.startswith("ExecStart="))
    assert "--storage /var/lib/blind-relay" in exec_line and "--port 5000" in exec_line
    assert "--max-sessions 10" in exec_line


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    assert shutil.which("systemd-analyze"), "systemd-analyze missing: install Debian's systemd (.ci/run does)"
    units = {
        "blind-relay.service": _unit_cli().stdout,
        "blind-relay-srv.service": _unit(storage="/srv/relay", port=443).text,
        "blind-relay-odd.service": _unit(
            storage="/var/lib/relay%i", allow_files=['/etc/blind relay/allow 100% "$HOME".txt'], log_format="json"
        ).text,
        "blind-relay-kernel.service": _unit_cli("--kernel-forwarding", "-p", "443").stdout,
    }
    for name, text in units.items():
        assert text.startswith("[Unit]"), name
        (tmp_path / name).write_text(text)
    res = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / n) for n in units)], capture_output=True, text=True, timeout=120
    )
    problems = [ln for ln in (res.stdout + res.stderr).splitlines() if any(n in ln for n in units)]
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


def test_handshake_gate_lets_new_addresses_in_while_busy_ones_wait() -> None:
    gate = HandshakeGate(
        Limits(
            handshakes_per_address=1000,
            handshake_refill_per_second=1000,
            busy_address_sessions=4,
            handshake_budget_per_second=10,
        )
    )
    t = 100.0
    # below its share an address always passes, and spends the relay-wide budget
    assert all(gate.admit("10.0.0.9", 3, t) == 0.0 for _ in range(30))
    # the budget is gone: the busy address waits, a new one still gets in
    assert gate.admit("10.0.0.9", 4, t) == "handshakes_busy"
    assert gate.admit("10.0.0.1", 0, t) == 0.0
    # time refills the budget: the busy address gets its turn again
    assert gate.admit("10.0.0.9", 50, t + 1.0) == 0.0


def test_handshake_gate_keeps_the_per_address_bucket() -> None:
    gate = HandshakeGate(Limits(handshakes_per_address=2, handshake_refill_per_second=1, handshake_max_wait=0))
    assert [gate.admit("h", 0, 0.0) for _ in range(3)] == [0.0, 0.0, "handshakes_per_address"]
    assert gate.admit("other", 0, 0.0) == 0.0


def test_handshake_gate_spreads_a_burst_over_the_refill_instead_of_refusing_it() -> None:
    """20 handshakes at once from one NAT with a burst of 2 at 64/s: 2 now, the next 18 each
    wait for their own token (1/64 s apart), and one due later than the 1 s cap is refused.
    Refused, the 18 would all retry together a second later and meet the same empty bucket."""
    gate = HandshakeGate(Limits(handshakes_per_address=2, handshake_refill_per_second=64, handshake_max_wait=1.0))
    waits = [gate.admit("nat", 0, 10.0) for _ in range(20)]
    assert waits[:2] == [0.0, 0.0]
    assert waits[2:] == pytest.approx([k / 64 for k in range(1, 19)])
    more = [gate.admit("nat", 0, 10.0) for _ in range(60)]
    assert more[:46] == pytest.approx([k / 64 for k in range(19, 65)])  # the 64th token is due at 1.0 s
    assert more[46:] == ["handshakes_per_address"] * 14  # beyond the cap: refused, nothing spent
    assert gate.admit("nat", 0, 10.5) == pytest.approx(0.5 + 1 / 64)  # still behind the 64 it owes
    assert gate.admit("other", 0, 10.0) == 0.0  # another address is not behind them
