"""Exit codes and `--json` errors of the headless commands: a bad port or address is a usage
error at parse time (exit 2, one line, no traceback), and under `--json` every error is also a
JSON object on stdout, so a script never has to scrape stderr."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cosmictui import cli


def parse_exit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    with pytest.raises(SystemExit) as e:
        cli.main(argv, out=out)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return int(e.value.code or 0), out.getvalue(), captured.err


@pytest.mark.parametrize("port", ["70000", "0", "-1", "65536", "http", ""])
def test_check_port_out_of_range_is_a_usage_error(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = parse_exit(["check", "--port", port], capsys)
    assert code == 2 and out == ""
    assert [line for line in err.splitlines() if "error:" in line] == [
        next(line for line in err.splitlines() if "argument --port" in line)
    ]
    code, out, err = parse_exit(["check", "--port", port, "--json"], capsys)
    doc = json.loads(out)
    assert code == 2 and doc["exit_code"] == 2 and "--port" in doc["error"]


def test_check_port_at_the_edges_is_accepted() -> None:
    parser = cli.build_parser()
    assert parser.parse_args(["check", "--port", "1"]).port == 1
    assert parser.parse_args(["check", "--port", "65535"]).port == 65535


@pytest.mark.parametrize("cmd", [["relay", "status"], ["monitor"]])
def test_bad_metrics_port_is_json_too(cmd: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = parse_exit([*cmd, "--metrics", "127.0.0.1:70000", "--json"], capsys)
    assert code == 2 and "port must be 1-65535" in json.loads(out)["error"]


def test_bad_config_under_json_is_a_json_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[relay]\nport = 'many'\n")
    for argv in (["check", "--json"], ["relay", "status", "--json"], ["env", "set-relay", "k", "--json"]):
        out = io.StringIO()
        assert cli.main(["--config", str(bad), *argv], out=out) == 2
        doc = json.loads(out.getvalue())
        assert doc["exit_code"] == 2 and "[relay] port" in doc["error"]


def test_check_port_70000_as_a_real_process_exits_2_without_a_traceback() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "cosmictui", "check", "--port", "70000"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr and "port must be 1-65535" in res.stderr


def test_jobs_json_on_a_missing_deployment_is_a_json_error(tmp_path: Path) -> None:
    out = io.StringIO()
    rc = cli.main(["--deployment", str(tmp_path / "nope"), "jobs", "--json"], out=out)
    doc = json.loads(out.getvalue())
    assert rc == 2 and doc["exit_code"] == 2 and "nope" in doc["error"]
