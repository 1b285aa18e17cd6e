"""`.env` writes that lose nothing: a second writer racing us, the backup's owner and mode at
every moment, a UTF-8 BOM, and the CLI's exit codes for each.

The race is made to happen every time, not by luck: a `BEFORE_RENAME` hook runs a real second
writer (a separate `sh` process appending a line) after our new bytes are on disk and just
before the last check. Owners are a non-root uid (we run as root), so "owned like the original"
is a real chown, not a no-op.
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cosmictui import cli
from cosmictui.ops import runner as runner_mod
from cosmictui.ops.runner import LocalRunner, open_deployment
from cosmictui.ops.setup.envfile import EnvChanged, decode_text, encode_text, plan_relays, write_plan
from relay.keys import encode_id, key_pair
from tests.unit.test_ops_runner import SSHEnv, ssh_env  # noqa: F401  (a fixture, used by name)

VAR = "K8S_COMMON_CONFIG__interconnect__relays"
K1 = encode_id(key_pair(b"\x01" * 32).public_key)
K2 = encode_id(key_pair(b"\x02" * 32).public_key)
OWNER = (4242, 4343)  # not us: root would own a careless copy
ORIGINAL = b"# deployment\nA=1\nSECRET=hunter2\n"
LATE = "LATE_WRITER=1"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root (CI and helpers are root)")


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return cli.main(list(argv), out=out), out.getvalue()


@pytest.fixture
def deploy(tmp_path: Path) -> Path:
    d = tmp_path / "deploy"
    d.mkdir()
    (d / ".env").write_bytes(ORIGINAL)
    return d


@pytest.fixture
def second_writer() -> Iterator[list[str]]:
    """Installs the hook: a real other process appends a line just before our rename."""
    appended: list[str] = []

    def append(path: str) -> None:
        subprocess.run(["sh", "-c", f'printf "%s\\n" "{LATE}" >> "$1"', "sh", path], check=True, timeout=60)
        appended.append(path)

    runner_mod.BEFORE_RENAME.append(append)
    yield appended
    runner_mod.BEFORE_RENAME.remove(append)


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name != ".env")


async def test_a_line_appended_during_the_write_is_kept_and_the_write_refused(deploy: Path, second_writer) -> None:
    runner = LocalRunner(str(deploy))
    plan = plan_relays(decode_text(await runner.read_file(".env")), K1)
    with pytest.raises(EnvChanged, match="another writer changed the file"):
        await write_plan(runner, ".env", plan)
    assert second_writer == [str(deploy / ".env")]  # the race really ran
    assert (deploy / ".env").read_bytes() == ORIGINAL + f"{LATE}\n".encode()
    assert leftovers(deploy) == []  # no temp file, and no backup of a write that did not happen


async def test_the_same_race_over_ssh_is_refused_too(ssh_env: SSHEnv, second_writer) -> None:  # noqa: F811
    deploy = ssh_env.tmp / "deploy"
    (deploy / ".env").write_bytes(ORIGINAL)
    runner = await open_deployment(
        f"ssh://ops@127.0.0.1:{ssh_env.port}{deploy}",
        known_hosts=str(ssh_env.known_hosts),
        client_keys=[str(ssh_env.client_key)],
    )
    async with runner:
        plan = plan_relays(decode_text(await runner.read_file(".env")), K1)
        with pytest.raises(EnvChanged):
            await write_plan(runner, ".env", plan)
    assert second_writer and (deploy / ".env").read_bytes() == ORIGINAL + f"{LATE}\n".encode()
    assert leftovers(deploy) == []


def test_cli_exits_1_and_says_so_in_json_when_another_writer_races(deploy: Path, second_writer, capsys) -> None:
    rc, out = run("--deployment", str(deploy), "env", "set-relay", K1)
    assert rc == 1 and "another writer changed the file" in capsys.readouterr().err
    rc, out = run("--deployment", str(deploy), "env", "set-relay", K2, "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["exit_code"] == 1 and "another writer" in doc["error"] and doc["fix"]
    assert (deploy / ".env").read_bytes() == ORIGINAL + f"{LATE}\n".encode() * 2


def test_without_a_race_the_cli_writes(deploy: Path) -> None:
    rc, _ = run("--deployment", str(deploy), "env", "set-relay", K1)
    assert rc == 0 and K1 in (deploy / ".env").read_text()


@needs_root
@pytest.mark.parametrize("mode", [0o600, 0o640])
async def test_backup_and_temp_file_are_private_and_owned_like_the_original_from_the_first_byte(
    deploy: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    env = deploy / ".env"
    os.chown(env, *OWNER)
    env.chmod(mode)
    created: list[dict[str, Any]] = []
    real_open, real_write_fd = os.open, runner_mod._write_fd

    def spy_open(path: Any, flags: int, *a: Any, **kw: Any) -> int:
        fd = real_open(path, flags, *a, **kw)
        if flags & os.O_CREAT:  # the moment the file exists, before chown/chmod
            st = os.fstat(fd)
            created.append({"path": str(path), "mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid, "size": st.st_size})
        return fd

    def spy_write_fd(fd: int, data: bytes) -> None:  # the moment before its first byte
        st = os.fstat(fd)
        created.append({"first_byte": True, "mode": stat.S_IMODE(st.st_mode), "owner": (st.st_uid, st.st_gid)})
        real_write_fd(fd, data)

    monkeypatch.setattr(runner_mod.os, "open", spy_open)
    monkeypatch.setattr(runner_mod, "_write_fd", spy_write_fd)
    runner = LocalRunner(str(deploy))
    plan = plan_relays(decode_text(await runner.read_file(".env")), K1)
    backup = await write_plan(runner, ".env", plan)
    monkeypatch.undo()
    assert backup is not None
    births = [c for c in created if "path" in c]
    first_bytes = [c for c in created if "first_byte" in c]
    assert [Path(c["path"]).name.startswith(".env.bak-") for c in births] == [True, False]  # backup, then temp
    for c in births:
        assert c["mode"] & 0o077 == 0 and c["size"] == 0  # born private (umask can only narrow 0600)
    for c in first_bytes:
        assert c["owner"] == OWNER and c["mode"] == mode  # owner and mode set before any byte
    b = os.stat(backup)
    assert (b.st_uid, b.st_gid, stat.S_IMODE(b.st_mode)) == (*OWNER, mode) and Path(backup).read_bytes() == ORIGINAL
    e = env.stat()
    assert (e.st_uid, e.st_gid, stat.S_IMODE(e.st_mode)) == (*OWNER, mode) and env.read_bytes() == encode_text(plan.new)


@needs_root
async def test_backup_over_sftp_is_owned_and_moded_like_the_original(ssh_env: SSHEnv) -> None:  # noqa: F811
    deploy = ssh_env.tmp / "deploy"
    env = deploy / ".env"
    env.write_bytes(ORIGINAL)
    os.chown(env, *OWNER)
    env.chmod(0o600)
    runner = await open_deployment(
        f"ssh://ops@127.0.0.1:{ssh_env.port}{deploy}",
        known_hosts=str(ssh_env.known_hosts),
        client_keys=[str(ssh_env.client_key)],
    )
    async with runner:
        plan = plan_relays(decode_text(await runner.read_file(".env")), K1)
        backup = await write_plan(runner, ".env", plan)
    assert backup is not None
    for p in (Path(backup), env):
        st = p.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (*OWNER, 0o600)
    assert Path(backup).read_bytes() == ORIGINAL


async def test_a_bom_is_kept_and_named(deploy: Path) -> None:
    bom = b"\xef\xbb\xbf"
    (deploy / ".env").write_bytes(bom + b"A=1\r\nB=2\r\n")
    runner = LocalRunner(str(deploy))
    plan = plan_relays(decode_text(await runner.read_file(".env")), K1)
    assert plan.bom and "UTF-8 BOM, kept" in plan.diff.splitlines()[0]
    await write_plan(runner, ".env", plan)
    assert (deploy / ".env").read_bytes() == bom + f"A=1\r\nB=2\r\n{VAR}='[\"{K1}\"]'\r\n".encode()
    # an existing assignment after a BOM is found and edited in place
    plan2 = plan_relays(decode_text((deploy / ".env").read_bytes()), K2, mode="replace")
    assert plan2.old_keys == (K1,) and plan2.new.startswith("\ufeffA=1\r\n") and plan2.new.count(VAR) == 1


def test_cli_says_the_bom_in_text_and_json(deploy: Path) -> None:
    (deploy / ".env").write_bytes(b"\xef\xbb\xbfA=1\n")
    rc, out = run("--deployment", str(deploy), "env", "set-relay", K1, "--dry-run")
    assert rc == 0 and "starts with a UTF-8 byte order mark (BOM); it is kept as it was" in out
    rc, out = run("--deployment", str(deploy), "env", "set-relay", K1, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["bom"] is True and doc["written"] is True
    assert (deploy / ".env").read_bytes().startswith(b"\xef\xbb\xbfA=1\n")


def test_env_that_is_a_directory_exits_2_in_text_and_json(deploy: Path, capsys) -> None:
    (deploy / "adir").mkdir()
    rc, out = run("--deployment", str(deploy), "env", "set-relay", K1, "--env", str(deploy / "adir"))
    assert rc == 2 and "is a directory" in capsys.readouterr().err
    rc, out = run("--deployment", str(deploy), "env", "set-relay", K1, "--env", "adir", "--json")
    doc = json.loads(out)
    assert rc == 2 and doc["exit_code"] == 2 and "is a directory" in doc["error"]


@pytest.mark.parametrize(
    ("argv", "code", "words"),
    [
        (["env", "set-relay", "not-a-key"], 2, "KEY:"),
        (["env", "set-relay", K1, "--env", "missing.env"], 2, "does not exist"),
    ],
)
def test_env_set_relay_errors_are_json_on_stdout(deploy: Path, argv: list[str], code: int, words: str) -> None:
    rc, out = run("--deployment", str(deploy), *argv, "--json")
    doc = json.loads(out)
    assert rc == code and doc["exit_code"] == code and words in doc["error"]
