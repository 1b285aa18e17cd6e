"""The `blind-relay` command as operators meet it: output lines, runtime file, signals, one-line errors."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

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
        "--scraper-public-key",
        "--scraper-secret",
        "--scraper-alias",
        "--session-idle-timeout",
        "--silent-pair-timeout",
        "--max-control-frame",
        "--busy-address-sessions",
        "--handshake-budget",
    ):
        assert flag in out
    # the exit codes are documented where operators look
    codes = out[out.index("exit codes:") :]
    assert "0  clean exit" in codes and "1  runtime error" in codes and "2  usage error" in codes


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


def test_unreachable_bootstrap_listens_warns_once_and_says_not_bootstrapped(tmp_path: Path) -> None:
    # as blind-relay-service: no bootstrap node answering is no reason to exit (the network may not
    # be up yet at boot); the relay prints its key, warns once, keeps trying, and /stats says so
    from tests.interop._relay_proc import RelayProcess

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # bound, never answers
        with RelayProcess(tmp_path / "s", bootstrap=f"127.0.0.1:{dead}") as relay:
            relay.start()
            assert relay.key is not None, relay.stderr
            assert relay.stdout_lines[0] == f"Using corestore storage at {(tmp_path / 's').resolve()}"
            stats = relay.stats()
            assert stats["key"] == relay.key and stats["dht"]["bootstrapped"] is False
            assert stats["dht"]["nodes"] == 0
            assert relay.terminate() == 0
    err = relay.stderr
    assert "Traceback" not in err and "error" not in err
    warned = [ln for ln in err.splitlines() if f"127.0.0.1:{dead}" in ln and "WARNING" in ln.upper()]
    assert len(warned) == 1 and "retrying in the background" in warned[0], err
    # where the key is, said once: path and layout, no repeated "primary-key"
    key_file = (tmp_path / "s" / "primary-key").resolve()
    (key_line,) = [ln for ln in err.splitlines() if "key" in ln and "relay:" in ln]
    assert key_line.endswith(f"relay: new key created in {key_file} (primary-key file)")


def test_signal_while_joining_the_dht_exits_0_without_listening(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))  # a bootstrap node that never answers: joining takes a while
        dead = s.getsockname()[1]
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "relay",
                "--storage",
                str(tmp_path / "s"),
                "--port",
                "0",
                "--host",
                "127.0.0.1",
                "--metrics",
                "off",
                "--bootstrap",
                f"127.0.0.1:{dead}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stderr is not None
            for line in proc.stderr:  # wait for the relay to say it is joining (signal handlers are set)
                if "joining the DHT" in line:
                    break
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert proc.returncode == 0, err
    assert "Server listening" not in out and "Traceback" not in err
    assert not (tmp_path / "s" / "relay-runtime.json").exists()


def test_storage_in_use_by_another_relay_is_one_clear_line(tmp_path: Path) -> None:
    from relay.service.storage import StorageLock, load_primary_key

    storage = tmp_path / "s"
    load_primary_key(storage)
    lock = StorageLock(storage)  # as a running relay holds it
    try:
        res = _run("--storage", str(storage), "--port", "0", "--metrics", "off", "--bootstrap", "127.0.0.1:9")
    finally:
        lock.release()
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1] == (
        f"blind-relay: error: storage {storage} is in use by pid {os.getpid()} (another relay); "
        "stop it or use another --storage"
    )
    # released: the next relay may take it (a crash releases it too: flock dies with the process)
    StorageLock(storage).release()


def test_version() -> None:
    import relay

    res = _run("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"blind-relay (cosmictui relay) {relay.__version__}"


def test_bad_flags_are_usage_errors(tmp_path: Path) -> None:
    storage = tmp_path / "s"
    for args, says in (
        (["--port", "70000"], "argument -p/--port: port 70000 is out of range 0-65535"),
        (["--metrics", "nonsense"], "argument --metrics:"),
        (["--bootstrap", "hostwithoutport"], "argument --bootstrap: 'hostwithoutport' is not HOST:PORT"),
        (["--max-sessions", "0"], "argument --max-sessions: 0 must be at least 1"),
        (["--max-pending", "many"], "argument --max-pending: 'many' is not a whole number"),
        (["--pending-timeout", "-1"], "argument --pending-timeout: -1 must be a positive number of seconds"),
        (["--pending-timeout", "nan"], "argument --pending-timeout: nan must be a positive number of seconds"),
        (["--unit-exec", "/usr/bin/blind-relay"], "--unit-exec only goes with --systemd-unit"),
    ):
        res = _run("--storage", str(storage), "--metrics", "off", *args)
        assert res.returncode == 2, args
        lines = res.stderr.strip().splitlines()  # one line: the usage is for --help
        assert len(lines) == 1 and lines[0].startswith(f"blind-relay: error: {says}"), res.stderr
    assert not storage.exists()  # nothing was created for a command line that cannot work


def test_bad_allow_key_is_a_usage_error_in_one_clear_line(tmp_path: Path) -> None:
    res = _run("--storage", str(tmp_path / "s"), "--allow", "notakey", "--metrics", "off")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == (
        "blind-relay: error: --allow: 'notakey' is not a public key (52 z32 or 64 hex characters)"
    )
    assert "Traceback" not in res.stderr and res.stdout == ""


def test_unreadable_allow_file_is_a_runtime_error(tmp_path: Path) -> None:
    missing = tmp_path / "allow"
    res = _run("--storage", str(tmp_path / "s"), "--allow-file", str(missing), "--metrics", "off")
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1] == (
        f"blind-relay: error: cannot read allow file {missing}: No such file or directory"
    )


def test_python_m_relay_and_console_script_are_one_program() -> None:
    from relay import cli

    assert cli.build_parser().prog == "blind-relay"
    res = _run("--systemd-unit", "--storage", "/var/lib/blind-relay", "--unit-exec", "/usr/bin/python3 -m relay")
    assert res.returncode == 0 and "StateDirectory=blind-relay" in res.stdout


def test_scraper_flags_and_fair_share_limits_parse() -> None:
    from relay.cli import _limits, _unit_extra_args, parse_args

    args = parse_args(["--scraper-public-key", "ab" * 32, "--scraper-secret", "cd" * 32, "--scraper-alias", "r1"])
    assert (args.scraper_public_key, args.scraper_secret, args.scraper_alias) == ("ab" * 32, "cd" * 32, "r1")
    assert parse_args(["--scraper-alias"]).scraper_alias == ""  # paparam's `[value]`: the value is optional
    assert parse_args([]).metrics is None  # no --metrics: the default address, with a fallback if taken
    flags = ["--session-idle-timeout", "5", "--silent-pair-timeout", "2.5", "--max-control-frame", "2048"]
    flags += ["--busy-address-sessions", "16", "--handshake-budget", "50"]
    args = parse_args(flags)
    lim = _limits(args)
    assert (lim.session_idle_timeout, lim.silent_pair_timeout, lim.max_control_frame) == (5.0, 2.5, 2048)
    assert (lim.busy_address_sessions, lim.handshake_budget_per_second) == (16, 50.0)
    extra = _unit_extra_args(args)  # a systemd unit runs the relay with exactly these limits
    for flag in flags[::2]:
        assert flag in extra
