"""The wizard against a deployment over SSH: a real asyncssh server on 127.0.0.1 (keys made here)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import pytest

from cosmictui.ops.config import Settings
from cosmictui.widgets.output_log import OutputLog
from tests.e2e._wizard_support import (
    ENV_VAR,
    KEY,
    make_app,
    make_bin,
    path_with,
    resume_at,
    snapshot_tree,
    status,
    step,
    wait_status,
)


class _Server(asyncssh.SSHServer):
    def begin_auth(self, username: str) -> bool:
        return True


async def _exec(process: asyncssh.SSHServerProcess) -> None:
    """Run the command with /bin/sh here, as sshd would."""
    proc = await asyncio.create_subprocess_shell(
        process.command or "true",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    process.stdout.write(out)
    process.exit(proc.returncode or 0)


@dataclass
class SSHDeployment:
    spec: str
    deploy: Path
    known_hosts: Path
    client_key: Path
    tmp: Path


@pytest.fixture
async def ssh_deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SSHDeployment]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    key_file = tmp_path / "id_ed25519"
    client_key.write_private_key(str(key_file))
    server = await asyncssh.create_server(
        _Server,
        "127.0.0.1",
        0,
        server_host_keys=[host_key],
        authorized_client_keys=asyncssh.import_authorized_keys(client_key.export_public_key().decode()),
        process_factory=_exec,
        sftp_factory=True,
        encoding=None,
    )
    port = server.sockets[0].getsockname()[1]
    known = tmp_path / "known_hosts"
    known.write_bytes(f"[127.0.0.1]:{port} ".encode() + host_key.export_public_key())
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / ".env").write_bytes(b"# remote deployment\nA=1\n")
    try:
        yield SSHDeployment(f"ssh://ops@127.0.0.1:{port}{deploy}", deploy, known, key_file, tmp_path)
    finally:
        server.close()
        await server.wait_closed()


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(d: SSHDeployment, *, known: Path | None = None, key: Path | None = None) -> Settings:
    return Settings(
        deployment=d.spec,
        relay_host="127.0.0.1",  # step 1 test-binds the relay port: loopback, never a fixed port
        relay_port=_free_udp_port(),
        relay_storage=str(d.tmp / "relay"),
        ssh_known_hosts=str(known or d.known_hosts),
        ssh_identity=(str(key or d.client_key),),
        ssh_connect_timeout=10,
    )


async def test_wizard_ssh_env_written_over_sftp_with_backup(ssh_deployment: SSHDeployment) -> None:
    d = ssh_deployment
    resume_at(d.spec, "env", relay_key=KEY)
    app = make_app(_settings(d))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_status(pilot, app, "env", ("info",))
        await pilot.press("w")
        text = await wait_status(pilot, app, "env", ("ok",))
        assert "Wrote the .env" in text
    assert (d.deploy / ".env").read_bytes() == b"# remote deployment\nA=1\n" + f"{ENV_VAR}='[\"{KEY}\"]'\n".encode()
    backups = [p for p in d.deploy.iterdir() if p.name.startswith(".env.bak-")]
    assert [b.read_bytes() for b in backups] == [b"# remote deployment\nA=1\n"]


@pytest.mark.parametrize("failure", ["auth", "host-key-mismatch"])
async def test_wizard_ssh_failures_are_explained_and_change_nothing(
    ssh_deployment: SSHDeployment, failure: str
) -> None:
    d = ssh_deployment
    if failure == "auth":
        stranger = asyncssh.generate_private_key("ssh-ed25519")
        key = d.tmp / "id_stranger"
        stranger.write_private_key(str(key))
        settings = _settings(d, key=key)
        expect, fix = "authentication", "Fix:"
    else:
        other = asyncssh.generate_private_key("ssh-ed25519")
        known = d.tmp / "known_wrong"
        known.write_bytes(d.known_hosts.read_bytes().split(b" ", 1)[0] + b" " + other.export_public_key())
        settings = _settings(d, known=known)
        expect, fix = "does NOT match", f"ssh-keygen -f {known} -R"
    before = snapshot_tree(d.deploy)
    # Step 1 shows the deployment host as a failed prerequisite and will not go on.
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_status(pilot, app, "prereqs", ("error",))
        rows = [r.text for r in step(app, "prereqs").query("CheckRow")]
        failed = [r for r in rows if r.startswith("✘ FAIL Deployment host reachable")]
        assert len(failed) == 1 and expect in failed[0] and (fix.rstrip(":") in failed[0] or "fix:" in failed[0])
        await pilot.press("n")
        assert app.screen.index == 0
    # Resumed at step 3, the .env step says the same and writes nothing.
    resume_at(d.spec, "env", relay_key=KEY)
    app = make_app(settings)
    async with app.run_test(size=(80, 24)) as pilot:
        text = await wait_status(pilot, app, "env", ("error",))
        assert expect in text and fix in text
        await pilot.press("w")
        assert "Nothing to write" in status(app, "env")
    assert snapshot_tree(d.deploy) == before


async def test_wizard_ssh_apply_streams_remote_output_and_stops_at_failure(ssh_deployment: SSHDeployment) -> None:
    d = ssh_deployment
    body = 'echo "task $* on $(hostname) in $(pwd)" >> calls.log\necho "rendering $1"\n'
    body += '[ "$1" = restart ] && { echo "rollout failed: ImagePullBackOff" >&2; exit 3; }\nexit 0\n'
    bin_dir = make_bin(d.tmp, {"task": body})
    resume_at(d.spec, "apply", relay_key=KEY)
    (d.deploy / ".env").write_text(f"{ENV_VAR}='[\"{KEY}\"]'\n")  # step 3 done: the .env lists the relay
    app = make_app(_settings(d).with_overrides(command_env={"PATH": path_with(bin_dir)}))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("r")
        text = await wait_status(pilot, app, "apply", ("error",))
        assert 'task restart SERVICES="cosmicac-wrk-server-k8s-nvidia" exited 3; stopped here' in text
        out = step(app, "apply").query_one("#apply-output", OutputLog).plain_lines
        assert "rendering apply-wrk-server-k8s-nvidia-common-config" in out
        assert "rollout failed: ImagePullBackOff" in out
        # the restart began (the worker may have restarted): recorded, but not as finished, so no tick
        assert app.screen.ctx.restarted_at is not None and not app.screen.ctx.facts().restart_finished
        assert "apply" not in app.screen.ctx.ticks()
    calls = (d.deploy / "calls.log").read_text().splitlines()
    assert len(calls) == 2 and calls[0].startswith("task apply-wrk-server-k8s-nvidia-common-config on ")
    assert all(c.endswith(f" in {d.deploy}") for c in calls)
