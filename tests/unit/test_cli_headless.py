"""`cosmictui` headless commands as scripts use them: output, --json shape, exit codes.

0 ok · 1 check failed / relay down / deployment command failed · 2 usage or config error.
"""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cosmictui import cli
from tests.unit._metrics_server import FakeRelayMetrics


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    rc = cli.main(list(argv), out=out)
    return rc, out.getvalue()


@pytest.fixture
def fake() -> Iterator[FakeRelayMetrics]:
    f = FakeRelayMetrics()
    yield f
    f.close()


@pytest.fixture
def loopback_config(tmp_path: Path) -> Path:
    """Checks bind 127.0.0.1 only (tests never touch other addresses)."""
    cfg = tmp_path / "cosmictui.toml"
    cfg.write_text(f'[relay]\nhost = "127.0.0.1"\nstorage = "{tmp_path / "store"}"\n')
    (tmp_path / "store").mkdir()
    return cfg


def test_help_lists_subcommands_and_exit_codes() -> None:
    res = subprocess.run([sys.executable, "-m", "cosmictui", "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    for word in ("monitor", "check", "env", "jobs", "relay", "exit codes:", "usage or configuration error"):
        assert word in res.stdout
    sub = subprocess.run(
        [sys.executable, "-m", "cosmictui", "relay", "status", "--help"], capture_output=True, text=True, timeout=60
    )
    assert sub.returncode == 0 and "--json" in sub.stdout and "exit codes:" in sub.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["monitor", "--interval", "0"],
        ["monitor", "--interval", "soon"],
        ["relay"],
        ["env", "set-relay"],
        ["no-such-command"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert "usage:" in capsys.readouterr().err


@pytest.mark.parametrize("addr", ["ftp://relay:1", "bad:addr:x", "relay:0", "relay:70000"])
@pytest.mark.parametrize("cmd", [["monitor"], ["relay", "status"]])
def test_bad_metrics_address_is_a_usage_error_at_parse_time(
    cmd: list[str], addr: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main([*cmd, "--metrics", addr])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if "error:" in line] == [
        next(line for line in err.splitlines() if "argument --metrics" in line and addr in line)
    ]


def test_missing_or_bad_config_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("--config", str(tmp_path / "missing.toml"), "relay", "status")[0] == 2
    assert "missing.toml" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[relay]\nport = 'many'\n")
    assert run("--config", str(bad), "check")[0] == 2
    assert "[relay] port" in capsys.readouterr().err


def test_relay_status_by_metrics_address_up(fake: FakeRelayMetrics) -> None:
    fake.gauges["blind_relay_pairings_active"].set(2)
    rc, out = run("relay", "status", "--metrics", fake.url)
    assert rc == 0
    assert f"▲ UP   key {fake.key}" in out
    assert "2 active" in out and "public 203.0.113.7:49737" in out and "bootstrapped yes" in out
    rc, out = run("relay", "status", "--metrics", fake.url, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["state"] == "up" and doc["stats"]["key"] == fake.key and doc["error"] is None
    assert doc["key"] == fake.key
    assert doc["rss_bytes"] == 42_000_000


def test_relay_status_down_exits_1(fake: FakeRelayMetrics) -> None:
    url = fake.url
    fake.close()
    rc, out = run("relay", "status", "--metrics", url, "--json")
    doc = json.loads(out)
    hostport = url.removeprefix("http://")
    assert rc == 1 and doc["state"] == "down" and doc["error"] == f"connection refused by {hostport}"
    assert "is the relay running?" in doc["fix"]
    rc, out = run("relay", "status", "--metrics", url)
    assert rc == 1 and "✖ DOWN" in out and f"note     connection refused by {hostport}" in out
    assert "next     is the relay running?" in out


def test_relay_status_by_storage(tmp_path: Path, fake: FakeRelayMetrics) -> None:
    storage = tmp_path / "store"
    storage.mkdir()
    rc, out = run("relay", "status", "--storage", str(storage), "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["state"] == "not running" and str(storage) in doc["error"]
    rc, out = run("relay", "status", "--storage", str(storage))
    assert rc == 1 and "■ NOT RUNNING" in out
    # a live process that looks like the relay, announcing the fake endpoint
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "relay"], stdin=subprocess.PIPE)
    try:
        rt = {"pid": proc.pid, "key": fake.key, "host": "127.0.0.1", "port": 1, "metrics": fake.url}
        (storage / "relay-runtime.json").write_text(json.dumps(rt | {"started_at": 1, "version": "t"}))
        rc, out = run("relay", "status", "--storage", str(storage), "--json")
        doc = json.loads(out)
        assert rc == 0 and doc["state"] == "up" and doc["runtime"]["pid"] == proc.pid
        assert doc["metrics"] == fake.url and doc["stats"]["pid"] == fake.pid and doc["key"] == fake.key
        # metrics off: still up, and the key comes from the runtime file (not null)
        (storage / "relay-runtime.json").write_text(json.dumps(rt | {"metrics": None, "started_at": 1, "version": "t"}))
        rc, out = run("relay", "status", "--storage", str(storage), "--json")
        doc = json.loads(out)
        assert rc == 0 and doc["state"] == "up" and doc["stats"] is None and doc["key"] == fake.key
    finally:
        proc.kill()
        proc.wait(30)
    rc, out = run("relay", "status", "--storage", str(storage), "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["state"] == "not running" and "gone" in doc["error"]


def test_check_json_shape_and_exit_code_follow_the_results(loopback_config: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    rc, out = run("--config", str(loopback_config), "check", "--json", "--port", str(free))
    results = json.loads(out)
    assert results and all(set(r) == {"name", "status", "detail", "fix"} for r in results)
    assert all(r["status"] in ("ok", "warn", "fail") for r in results)
    port = next(r for r in results if r["name"] == f"UDP port {free}")
    assert port["status"] == "ok"
    assert rc == (1 if any(r["status"] == "fail" for r in results) else 0)


def test_check_fails_with_exit_1_when_the_port_is_taken(loopback_config: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        taken = s.getsockname()[1]
        rc, out = run("--config", str(loopback_config), "check", "--port", str(taken))
    assert rc == 1
    line = next(ln for ln in out.splitlines() if f"UDP port {taken}" in ln)
    assert line.startswith("[FAIL]") and "already in use" in line
    assert "fix: stop that process" in out
    summary = re.fullmatch(r"(\d+) checks: (\d+) failed, (\d+) warnings", out.rstrip().splitlines()[-1])
    assert summary is not None and int(summary[2]) >= 1


def test_no_subcommand_hands_the_flags_to_the_wizard(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import cosmictui.app as app_mod

    calls: list[tuple[object, ...]] = []
    cfg = tmp_path / "c.toml"
    cfg.write_text("")

    def fake_wizard(deployment: str | None, demo: bool, config: str | None) -> int:
        calls.append((deployment, demo, config))
        return 2 if config == str(cfg) else 0

    monkeypatch.setattr(app_mod, "main_wizard", fake_wizard)
    assert cli.main(["--demo"]) == 0
    assert cli.main(["--deployment", "ssh://ops@gpu-host/opt/cosmicac"]) == 0
    assert cli.main(["--config", str(cfg)]) == 2  # the wizard's exit code is the command's
    assert cli.main(["--config", str(tmp_path / "missing.toml")]) == 2  # said before any wizard
    assert calls == [(None, True, None), ("ssh://ops@gpu-host/opt/cosmicac", False, None), (None, False, str(cfg))]


def test_check_with_an_unreachable_ssh_deployment_keeps_the_local_checks(loopback_config: Path) -> None:
    with socket.socket() as s:  # a loopback TCP port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    spec = f"ssh://ops@127.0.0.1:{closed}/opt/cosmicac"
    rc, out = run("--config", str(loopback_config), "--deployment", spec, "check", "--json", "--port", str(free))
    results = {r["name"]: r for r in json.loads(out)}
    assert rc == 1
    assert results["Deployment host reachable"]["status"] == "fail"
    assert "deployment host" not in results
    assert results[f"UDP port {free}"]["status"] == "ok"  # the local checks are still there
    assert len(results) > 2
