"""The runner, locally and against a real asyncssh server on 127.0.0.1 (keys made in the test)."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import pytest

from cosmictui.ops.runner import LocalRunner, RunnerError, SSHRunner, open_deployment, parse_deployment

# --- local -------------------------------------------------------------------------------------


async def test_local_run_streams_lines_and_returns_exit_code(tmp_path: Path) -> None:
    seen: list[str] = []
    runner = LocalRunner(str(tmp_path), env={"GREETING": "hello"})
    result = await runner.run('echo "$GREETING"; pwd; echo oops >&2; exit 3', on_output=seen.append)
    assert result.exit_code == 3 and not result.ok
    assert seen == ["hello", str(tmp_path), "oops"]
    assert result.output == f"hello\n{tmp_path}\noops"


async def test_local_async_callback_and_cwd(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    seen: list[str] = []

    async def collect(line: str) -> None:
        seen.append(line)

    result = await LocalRunner(str(tmp_path)).run("pwd", cwd="sub", on_output=collect)
    assert result.ok and seen == [str(tmp_path / "sub")]


async def test_local_missing_command_and_directory(tmp_path: Path) -> None:
    runner = LocalRunner(str(tmp_path), env={"PATH": "/nonexistent"})
    with pytest.raises(RunnerError) as err:
        await runner.run("cosmicac jobs list")
    assert err.value.kind == "missing-command"
    assert "`cosmicac` is not installed or not on PATH on localhost" in str(err.value)
    with pytest.raises(RunnerError) as err:
        await LocalRunner(str(tmp_path / "gone")).run("true")
    assert err.value.kind == "missing-directory" and "gone" in err.value.what


async def test_local_timeout_kills_the_command(tmp_path: Path) -> None:
    with pytest.raises(RunnerError) as err:
        await LocalRunner(str(tmp_path)).run("echo $$ > pid; exec sleep 30", timeout=1.0)
    assert err.value.kind == "timeout"
    pid = int((tmp_path / "pid").read_text())
    await asyncio.sleep(0)  # reaped by the runner already; the pid must be gone
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_local_cancel_kills_and_reaps_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Ctrl-C in `cosmictui jobs --watch` cancels a running command: it must be killed AND reaped
    # before the cancellation finishes, or its transport outlives the event loop ("Event loop is
    # closed" traceback at exit).
    procs: list[asyncio.subprocess.Process] = []
    real = asyncio.create_subprocess_shell

    async def spy(*args: object, **kwargs: object) -> asyncio.subprocess.Process:
        proc = await real(*args, **kwargs)  # type: ignore[arg-type]
        procs.append(proc)
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_shell", spy)
    started = asyncio.Event()
    task = asyncio.ensure_future(
        LocalRunner(str(tmp_path)).run("echo up; sleep 60", on_output=lambda line: started.set())
    )
    await asyncio.wait_for(started.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert procs and procs[0].returncode is not None  # reaped, not just signalled


async def test_local_cancel_while_spawning_still_kills_and_reaps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Cancelled while the process is being made (a step left before its first command began): the
    # process exists by the time the spawn finishes, so it must be killed and reaped too.
    procs: list[asyncio.subprocess.Process] = []
    spawning, release = asyncio.Event(), asyncio.Event()
    real = asyncio.create_subprocess_shell

    async def slow_spy(*args: object, **kwargs: object) -> asyncio.subprocess.Process:
        proc = await real(*args, **kwargs)  # type: ignore[arg-type]
        procs.append(proc)
        spawning.set()
        await release.wait()  # the cancellation lands here: the process runs, the caller never got it
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_shell", slow_spy)
    task = asyncio.ensure_future(LocalRunner(str(tmp_path)).run("sleep 60"))
    await asyncio.wait_for(spawning.wait(), 30)
    task.cancel()
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert procs and procs[0].returncode is not None  # the late process was killed and reaped


async def test_local_atomic_write_keeps_mode_and_makes_backup(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_bytes(b"A=1\r\n")
    env.chmod(0o640)
    runner = LocalRunner(str(tmp_path))
    backup = await runner.write_file_atomic(".env", b"A=2\r\n")
    assert backup is not None and Path(backup).read_bytes() == b"A=1\r\n"
    assert Path(backup).name.startswith(".env.bak-")
    assert env.read_bytes() == b"A=2\r\n"
    assert stat.S_IMODE(env.stat().st_mode) == 0o640
    again = await runner.write_file_atomic(".env", b"A=3\r\n")  # same second: distinct backup
    assert again != backup and Path(again or "").read_bytes() == b"A=2\r\n"
    assert sorted(p.name for p in tmp_path.iterdir() if ".tmp" in p.name) == []
    assert await runner.read_file(".env") == b"A=3\r\n"


async def test_local_write_through_symlink_keeps_the_link(tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir()
    target = tmp_path / "shared" / "cosmicac.env"
    target.write_bytes(b"A=1\n")
    (tmp_path / ".env").symlink_to("shared/cosmicac.env")
    backup = await LocalRunner(str(tmp_path)).write_file_atomic(".env", b"A=2\n")
    assert (tmp_path / ".env").is_symlink() and target.read_bytes() == b"A=2\n"
    assert backup is not None and Path(backup).parent == target.parent


async def test_local_read_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RunnerError) as err:
        await LocalRunner(str(tmp_path)).read_file(".env")
    assert err.value.kind == "missing-file" and ".env does not exist" in err.value.what


def test_parse_deployment() -> None:
    d = parse_deployment("ssh://ops@gpu-1.example:2222/opt/cosmicac")
    assert (d.username, d.host, d.port, d.path, d.remote) == ("ops", "gpu-1.example", 2222, "/opt/cosmicac", True)
    assert parse_deployment("ssh://gpu/~/cosmicac").path == "~/cosmicac"
    assert parse_deployment("ssh://gpu").port == 22
    assert not parse_deployment("/opt/x").remote
    with pytest.raises(RunnerError):
        parse_deployment("ftp://x/y")


async def test_open_local_deployment_requires_directory(tmp_path: Path) -> None:
    runner = await open_deployment(str(tmp_path))
    assert isinstance(runner, LocalRunner)
    with pytest.raises(RunnerError) as err:
        await open_deployment(str(tmp_path / "nope"))
    assert err.value.kind == "missing-directory"


# --- SSH, against a real asyncssh server ----------------------------------------------------------


class _Server(asyncssh.SSHServer):
    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return True

    def validate_password(self, username: str, password: str) -> bool:
        return username == "ops" and password == "s3cret"


async def _exec(process: asyncssh.SSHServerProcess) -> None:
    """Run the requested command with /bin/sh on this machine, like sshd would."""
    proc = await asyncio.create_subprocess_shell(
        process.command or "true",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    process.stdout.write(out)
    process.stderr.write(err)
    process.exit(proc.returncode or 0)


@dataclass
class SSHEnv:
    port: int
    known_hosts: Path
    client_key: Path
    tmp: Path


@pytest.fixture
async def ssh_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SSHEnv]:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    key_file = tmp_path / "id_ed25519"
    client_key.write_private_key(str(key_file))
    key_file.chmod(0o600)
    authorized = asyncssh.import_authorized_keys(client_key.export_public_key().decode())
    server = await asyncssh.create_server(
        _Server,
        "127.0.0.1",
        0,
        server_host_keys=[host_key],
        authorized_client_keys=authorized,
        process_factory=_exec,
        sftp_factory=True,
        encoding=None,
    )
    port = server.sockets[0].getsockname()[1]
    known = tmp_path / "known_hosts"
    known.write_bytes(f"[127.0.0.1]:{port} ".encode() + host_key.export_public_key())
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    try:
        yield SSHEnv(port, known, key_file, tmp_path)
    finally:
        server.close()
        await server.wait_closed()


async def test_ssh_key_auth_runs_commands_and_edits_files_over_sftp(ssh_env: SSHEnv) -> None:
    deploy = ssh_env.tmp / "deploy"
    (deploy / ".env").write_bytes(b"# remote\nA=1")
    (deploy / ".env").chmod(0o600)
    runner = await open_deployment(
        f"ssh://ops@127.0.0.1:{ssh_env.port}{deploy}",
        known_hosts=str(ssh_env.known_hosts),
        client_keys=[str(ssh_env.client_key)],
        env={"MARK": "it works"},
    )
    async with runner:
        assert isinstance(runner, SSHRunner)
        seen: list[str] = []
        result = await runner.run('pwd; echo "$MARK"; echo err >&2; exit 4', on_output=seen.append)
        assert result.exit_code == 4
        assert seen == [str(deploy), "it works", "err"] and result.output == "\n".join(seen)
        assert await runner.read_file(".env") == b"# remote\nA=1"
        backup = await runner.write_file_atomic(".env", b"# remote\nA=2\n")
        assert backup is not None and Path(backup).read_bytes() == b"# remote\nA=1"
        assert (deploy / ".env").read_bytes() == b"# remote\nA=2\n"
        assert stat.S_IMODE((deploy / ".env").stat().st_mode) == 0o600
        assert [p.name for p in deploy.iterdir() if p.name.endswith(".tmp")] == []
        with pytest.raises(RunnerError) as err:
            await runner.read_file("missing.env")
        assert err.value.kind == "missing-file"
        (deploy / "real.env").write_bytes(b"B=1\n")
        (deploy / "link.env").symlink_to("real.env")
        await runner.write_file_atomic("link.env", b"B=2\n")
        assert (deploy / "link.env").is_symlink() and (deploy / "real.env").read_bytes() == b"B=2\n"


async def test_ssh_password_auth_and_missing_command(ssh_env: SSHEnv) -> None:
    deploy = ssh_env.tmp / "deploy"
    runner = await open_deployment(
        f"ssh://ops@127.0.0.1:{ssh_env.port}{deploy}",
        known_hosts=str(ssh_env.known_hosts),
        client_keys=[],
        password="s3cret",
        env={"PATH": "/nonexistent"},
    )
    async with runner:
        with pytest.raises(RunnerError) as err:
            await runner.run("cosmicac jobs list")
        assert err.value.kind == "missing-command"
        assert f"`cosmicac` is not installed or not on PATH on ops@127.0.0.1:{ssh_env.port}" in str(err.value)
        with pytest.raises(RunnerError) as err:
            await runner.run("true", cwd="no-such-dir")
        assert err.value.kind == "missing-directory"


@pytest.fixture
def agent(ssh_env: SSHEnv, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real ssh-agent holding the client key (killed in teardown)."""
    sock = str(ssh_env.tmp / "agent.sock")
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        env = dict(os.environ, SSH_AUTH_SOCK=sock)
        for _ in range(200):  # the socket appears once the agent listens; ssh-add fails until then
            if subprocess.run(["ssh-add", str(ssh_env.client_key)], env=env, capture_output=True).returncode == 0:
                break
            time.sleep(0.05)
        else:
            pytest.fail("ssh-agent did not accept the key")
        monkeypatch.setenv("SSH_AUTH_SOCK", sock)
        yield sock
    finally:
        proc.kill()
        proc.wait()


async def test_ssh_agent_auth(ssh_env: SSHEnv, agent: str) -> None:
    runner = await open_deployment(
        f"ssh://ops@127.0.0.1:{ssh_env.port}{ssh_env.tmp}", known_hosts=str(ssh_env.known_hosts)
    )
    async with runner:
        assert (await runner.run("echo via-agent")).output == "via-agent"


async def test_ssh_auth_failure(ssh_env: SSHEnv) -> None:
    with pytest.raises(RunnerError) as err:
        await open_deployment(
            f"ssh://ops@127.0.0.1:{ssh_env.port}/tmp",
            known_hosts=str(ssh_env.known_hosts),
            client_keys=[],
            password="wrong",
        )
    assert err.value.kind == "auth" and "authentication" in err.value.what and err.value.fix


async def test_ssh_host_key_mismatch_and_unknown_host(ssh_env: SSHEnv) -> None:
    other = asyncssh.generate_private_key("ssh-ed25519")
    wrong = ssh_env.tmp / "known_wrong"
    wrong.write_bytes(f"[127.0.0.1]:{ssh_env.port} ".encode() + other.export_public_key())
    with pytest.raises(RunnerError) as err:
        await open_deployment(
            f"ssh://ops@127.0.0.1:{ssh_env.port}/tmp", known_hosts=str(wrong), client_keys=[str(ssh_env.client_key)]
        )
    assert err.value.kind == "host-key-mismatch" and "does NOT match" in err.value.what
    # The fix names the configured known_hosts file, not the default one.
    assert f"ssh-keygen -f {wrong} -R '[127.0.0.1]:{ssh_env.port}'" in err.value.fix
    empty = ssh_env.tmp / "known_empty"
    empty.write_text("")
    for known in (empty, ssh_env.tmp / "absent_known_hosts"):
        with pytest.raises(RunnerError) as err:
            await open_deployment(
                f"ssh://ops@127.0.0.1:{ssh_env.port}/tmp",
                known_hosts=str(known),
                client_keys=[str(ssh_env.client_key)],
            )
        assert err.value.kind == "host-key-unknown" and "ssh-keyscan" in err.value.fix


async def test_ssh_connection_refused(tmp_path: Path) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(RunnerError) as err:
        await open_deployment(f"ssh://ops@127.0.0.1:{port}/tmp", client_keys=[], known_hosts=None)
    assert err.value.kind == "refused"
