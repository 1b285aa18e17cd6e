"""Every headless error points the right way: under --json it is `{error, fix, exit_code}`, its
fix names a flag the command has or a config key that exists, and the errors an operator meets
first (no cosmicac, a bad key, no --deployment, a storage that is a file, a silent bootstrap, a
relay running where `relay status` did not look) say what is really wrong."""

from __future__ import annotations

import argparse
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from cosmictui import cli
from cosmictui.ops import relayproc
from cosmictui.ops.config import _TOML_KEYS
from cosmictui.ops.setup.checks import check_storage
from tests.unit._metrics_server import FakeRelayMetrics

KEY = "yry" * 17 + "o"  # a well-formed z32 key (no relay holds it)


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return cli.main(list(argv), out=out), out.getvalue()


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """Every --flag of the parser and of its subcommands, and the names of their arguments (KEY)."""
    found: set[str] = set()
    for action in parser._actions:
        found.update(o for o in action.option_strings if o.startswith("--"))
        if not action.option_strings and isinstance(action.metavar, str) and action.metavar.isupper():
            found.add(action.metavar)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _options(sub)
    return found


FLAGS = _options(cli.build_parser())
ARGUMENTS = {f for f in FLAGS if not f.startswith("--")}
CONFIG_KEYS = {f"[{section}] {key}" for section, key in _TOML_KEYS if section} | {"deployment"}


def assert_error_shape(rc: int, out: str) -> dict[str, object]:
    doc = json.loads(out)
    assert {"error", "fix", "exit_code"} <= set(doc), doc
    assert doc["exit_code"] == rc != 0
    assert isinstance(doc["error"], str) and doc["error"]
    fix = doc["fix"]
    assert isinstance(fix, str) and fix, f"no fix for: {doc['error']}"
    named_flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", fix)) | (set(re.findall(r"\b[A-Z_]+\b", fix)) & ARGUMENTS)
    named_keys = {f"[{s}] {k}" for s, k in re.findall(r"\[(\w+)\] (\w+)", fix)}
    assert named_flags or named_keys or "deployment =" in fix, f"the fix names no flag or config key: {fix}"
    assert named_flags <= FLAGS, f"no such flag: {named_flags - FLAGS}"
    assert named_keys <= CONFIG_KEYS, f"no such config key: {named_keys - CONFIG_KEYS}"
    return doc


@pytest.fixture
def deploy(tmp_path: Path) -> Path:
    d = tmp_path / "deploy"
    d.mkdir()
    (d / ".env").write_text("A=1\n")
    return d


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """Metrics off and an empty storage: nothing of another relay on this machine is asked."""
    (tmp_path / "store").mkdir()
    cfg = tmp_path / "cosmictui.toml"
    cfg.write_text(f'[relay]\nstorage = "{tmp_path / "store"}"\nmetrics = "off"\n')
    return cfg


def test_jobs_with_the_list_command_missing(deploy: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[commands]\nlist = "cosmicac-not-installed jobs list"\n')
    rc, out = run("--config", str(cfg), "--deployment", str(deploy), "jobs", "--json")
    doc = assert_error_shape(rc, out)
    assert "cosmicac-not-installed" in str(doc["error"])


def test_a_failed_list_command_names_no_wizard_key(
    deploy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Headless, the generic fix for a failed command points at its output, not at the wizard's
    command-log key (`l` means nothing to `cosmictui jobs`); the wizard still names it."""
    from cosmictui.ops.wording import OUTPUT_SHOWN_IN, command_failure_hint

    tool = tmp_path / "flaky-list"
    tool.write_text("#!/bin/sh\necho 'upstream said no' >&2\nexit 3\n")
    tool.chmod(0o755)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[commands]\nlist = "{tool} jobs list"\n')
    rc, out = run("--config", str(cfg), "--deployment", str(deploy), "jobs", "--json")
    doc = json.loads(out)
    assert rc != 0 and "exited 3" in str(doc["error"]), doc
    said = f"{doc['error']} {doc['fix']} {capsys.readouterr().err}"
    assert "Read its output, fix the cause" in said and "command log" not in said and ": l)" not in said, said
    token = OUTPUT_SHOWN_IN.set("command log: l")  # as the wizard app sets it
    try:
        assert "(command log: l)" in command_failure_hint("cosmicac jobs list", 3, "upstream said no")
    finally:
        OUTPUT_SHOWN_IN.reset(token)


@pytest.mark.parametrize(
    "argv",
    [
        ["env", "set-relay", "not-a-key", "--json"],
        ["relay", "probe", "not-a-key", "--json"],
        ["check", "--relay-key", "not-a-key", "--no-probe", "--json"],
        ["jobs", "recover", "job-1", "--create-command", " ", "--json"],
    ],
)
def test_bad_input_names_its_fix(argv: list[str], deploy: Path, config: Path) -> None:
    rc, out = run("--config", str(config), "--deployment", str(deploy), *argv)
    assert rc == 2
    assert_error_shape(rc, out)


def test_env_set_relay_without_a_deployment_refuses_and_names_the_file(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(deploy)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(deploy / "no-config"))
    rc, out = run("env", "set-relay", KEY, "--json")
    doc = assert_error_shape(rc, out)
    assert rc == 2 and "--deployment" in str(doc["fix"]) and str(deploy / ".env") in str(doc["error"])
    assert (deploy / ".env").read_text() == "A=1\n"  # nothing written
    rc, _ = run("--deployment", str(deploy), "env", "set-relay", KEY, "--json")
    assert rc == 0 and KEY in (deploy / ".env").read_text()  # named, it edits


def test_a_storage_that_is_a_file_is_said_as_such(tmp_path: Path, config: Path) -> None:
    afile = tmp_path / "storage-file"
    afile.write_text("")
    rc, out = run("--config", str(config), "relay", "status", "--storage", str(afile), "--json")
    doc = assert_error_shape(rc, out)
    assert "is a file" in str(doc["error"])
    warning = relayproc.key_change_warning(str(afile), configured_keys=[KEY]) or ""
    assert "is a file" in warning and "NEW key" not in warning and "no key yet" not in warning
    check = check_storage(str(afile))
    assert check.status == "fail" and "is a file" in check.detail and "[relay] storage" in check.fix
    with pytest.raises(relayproc.RelayProcError) as e:
        import asyncio

        asyncio.run(relayproc.start_relay(str(afile / "sub"), port=0, host="127.0.0.1", metrics="off"))
    assert "is a file" in e.value.what and "File exists" not in e.value.what


@pytest.fixture
def fake() -> Iterator[FakeRelayMetrics]:
    f = FakeRelayMetrics()
    yield f
    f.close()


def test_relay_status_without_flags_finds_the_relay_on_the_configured_metrics_address(
    tmp_path: Path, fake: FakeRelayMetrics
) -> None:
    (tmp_path / "empty").mkdir()
    cfg = tmp_path / "c.toml"  # the storage holds no relay; the metrics address answers
    cfg.write_text(f'[relay]\nstorage = "{tmp_path / "empty"}"\nmetrics = "127.0.0.1:{fake.port}"\n')
    rc, out = run("--config", str(cfg), "relay", "status", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["state"] == "up" and doc["exit_code"] == 0
    assert str(fake.port) in doc["found_by"] and doc["key"] == fake.stats()["key"]


def test_relay_status_without_flags_finds_a_relay_running_here(
    tmp_path: Path, config: Path, fake: FakeRelayMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    rt = relayproc.RelayRuntime(
        pid=1,
        storage=str(elsewhere),
        key=KEY,
        port=49737,
        host="127.0.0.1",
        metrics=fake.url,
        started_at=0.0,
        version="t",
    )
    monkeypatch.setattr(relayproc, "running_relays", lambda: [rt])
    monkeypatch.setattr(
        relayproc,
        "relay_status",
        lambda storage: relayproc.RelayStatus(  # the configured storage: nothing; elsewhere: the relay
            storage=storage,
            runtime=rt if storage == str(elsewhere) else None,
            running=storage == str(elsewhere),
            log_path=str(Path(storage) / "log"),
        ),
    )
    rc, out = run("--config", str(config), "relay", "status", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["state"] == "up" and str(elsewhere) in doc["found_by"]


def test_relay_status_that_finds_nothing_names_where_it_looked(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relayproc, "running_relays", lambda: [])
    rc, out = run("--config", str(config), "relay", "status", "--json")
    doc = assert_error_shape(rc, out)
    assert doc["state"] == "not running" and "none runs on this machine" in str(doc["error"])


def test_probe_with_no_bootstrap_answering_says_so(config: Path) -> None:
    """Bounded below the DHT node's own give-up, so the probe's timeout is what ends it."""
    rc, out = run(
        "--config", str(config), "relay", "probe", KEY, "--bootstrap", "127.0.0.1:9", "--timeout", "2", "--json"
    )
    doc = assert_error_shape(rc, out)
    assert rc == 1 and "no DHT bootstrap node answered (127.0.0.1:9)" in str(doc["error"])
    assert "--bootstrap" in str(doc["fix"])


@pytest.mark.parametrize("argv", [["jobs"], ["jobs", "recover", "job-1"], ["jobs", "recover", "job-1", "--yes"]])
def test_jobs_without_a_deployment_refuses_and_runs_nothing_here(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No deployment named: `cosmicac` is not run in whatever directory the command was typed in."""
    here = tmp_path / "somewhere"
    here.mkdir()
    tool = tmp_path / "bin" / "cosmicac"
    tool.parent.mkdir()
    tool.write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path / "ran"}"\n')
    tool.chmod(0o755)
    monkeypatch.chdir(here)
    monkeypatch.setenv("PATH", f"{tool.parent}:/usr/bin:/bin")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    rc, out = run(*argv, "--json")
    doc = assert_error_shape(rc, out)
    assert rc == 2 and "no deployment given" in str(doc["error"]) and str(here) in str(doc["error"]), doc
    assert "--deployment" in str(doc["fix"]) and "deployment =" in str(doc["fix"]), doc
    assert not (tmp_path / "ran").exists()  # nothing ran


def test_a_missing_deployment_directory_is_a_usage_error_whose_fix_names_the_flag(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`check`, `jobs` and `env set-relay` alike: exit 2 (as --help says), and the fix names --deployment."""
    gone = str(tmp_path / "nonexistent")
    for argv in (["check", "--no-probe"], ["jobs"], ["env", "set-relay", KEY]):
        rc, out = run("--config", str(config), "--deployment", gone, *argv, "--json")
        doc = assert_error_shape(rc, out)
        assert rc == 2 and gone in str(doc["error"]), (argv, doc)
        assert "--deployment" in str(doc["fix"]), (argv, doc)
    rc, _ = run("--config", str(config), "--deployment", gone, "check", "--no-probe")
    err = capsys.readouterr().err
    assert rc == 2 and "does not exist" in err and "fix: --deployment" in err, err
    help_text = cli.build_parser()._subparsers._group_actions[0].choices["check"].format_help()  # type: ignore[union-attr]
    assert "2  usage or configuration error" in help_text and "missing deployment" in help_text


@pytest.mark.parametrize(
    ("toml", "key", "said"),
    [
        ("[relay]\nport = 'many'\n", "[relay] port", "a whole number"),
        ("[jobs]\npoll_interval = 'soon'\n", "[jobs] poll_interval", "a number"),
        ("[jobs]\nstuck_statuses = 3\n", "[jobs] stuck_statuses", "a list of strings"),
        ("[commands]\nenv = 'PATH=/x'\n", "[commands] env", "a table of strings"),
        ("[relay]\nkernel_forwarding = 'yes'\n", "[relay] kernel_forwarding", 'true, false or "auto"'),
        ("deployment = 7\n", "deployment", "a string"),
    ],
)
def test_config_errors_name_the_config_key_not_the_internal_field(
    toml: str, key: str, said: str, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(toml)
    rc, out = run("--config", str(bad), "check", "--json")
    doc = assert_error_shape(rc, out)
    error = str(doc["error"])
    assert rc == 2 and f"{key} must be {said}" in error and str(bad) in error, error
    assert not re.search(r"\b(relay|jobs|ssh|env)_\w+|_command\b|command_env", error), error  # no field name
    assert "--config" in str(doc["fix"])


def test_the_wizard_with_a_bad_config_says_the_fix_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[relay]\nport = 'many'\n")
    for argv in (["--config", str(bad)], ["--config", str(tmp_path / "missing.toml")]):
        assert cli.main(argv, out=io.StringIO()) == 2
        err = capsys.readouterr().err
        assert err.startswith("cosmictui: ") and "\n  fix: " in err and "--config PATH" in err, err
