"""Run commands and edit files on the deployment host, locally or over SSH, one interface.

`open_deployment("path")` gives a `LocalRunner`; `open_deployment("ssh://user@host[:port]/path")`
an `SSHRunner` (asyncssh; host keys checked against known_hosts; key, agent or password auth;
files over SFTP). Failures become `RunnerError` saying what failed, where, and how to fix it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import posixpath
import re
import secrets
import shlex
import signal
import socket
import stat
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import asyncssh

OutputCallback = Callable[[str], Awaitable[None] | None]


class RunnerError(Exception):
    """A command or file operation on the deployment host failed before producing a result."""

    def __init__(self, what: str, fix: str = "", host: str = "localhost", kind: str = "error") -> None:
        self.what = what
        self.fix = fix
        self.host = host
        self.kind = kind  # auth | host-key-mismatch | host-key-unknown | refused | unresolvable | timeout
        #                 | missing-command | missing-directory | missing-file | io | disconnected | error
        super().__init__(what + (f" — {fix}" if fix else ""))


@dataclass(frozen=True)
class CommandResult:
    cmd: str
    exit_code: int
    output: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class DeploymentSpec:
    """A parsed deployment: a local directory or `ssh://user@host[:port]/path`."""

    path: str
    host: str | None = None
    port: int = 22
    username: str | None = None

    @property
    def remote(self) -> bool:
        return self.host is not None


def parse_deployment(spec: str) -> DeploymentSpec:
    """`ssh://user@host[:port]/path` or a local directory (`~` expanded, made absolute)."""
    if spec.startswith("ssh://"):
        parts = urlsplit(spec)
        if not parts.hostname:
            raise RunnerError(f"no host in {spec!r}", "write it as ssh://user@host[:port]/path", spec, "error")
        try:
            port = parts.port or 22
        except ValueError:
            raise RunnerError(
                f"bad port in {spec!r}", "write it as ssh://user@host[:port]/path", spec, "error"
            ) from None
        path = unquote(parts.path) or "."
        if path.startswith("/~"):  # ssh://host/~/x: relative to the login directory
            path = path[1:]
        return DeploymentSpec(path, parts.hostname, port, unquote(parts.username) if parts.username else None)
    if "://" in spec:
        raise RunnerError(f"unsupported deployment {spec!r}", "use a local path or ssh://user@host[:port]/path")
    return DeploymentSpec(os.path.abspath(os.path.expanduser(spec)))


def _backup_name(path: str) -> str:
    return f"{path}.bak-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"


def _missing_command(cmd: str, output: str, host: str) -> RunnerError:
    """Exit 127: the shell did not find a program; name the one it reported (or the first word)."""
    try:
        words = shlex.split(cmd)
    except ValueError:
        words = cmd.split()
    prog = words[0] if words else cmd
    for line in output.splitlines():
        m = re.search(r"([^\s:]+): (?:command )?not found", line)
        if m:
            prog = m.group(1)
            break
    return RunnerError(
        f"`{prog}` is not installed or not on PATH on {host}",
        f"install `{prog}` there, add its directory to [commands] env PATH in config.toml, or give its full "
        "path in that command's key ([commands] list, apply, restart, …)",
        host,
        "missing-command",
    )


async def _emit(on_output: OutputCallback | None, line: str) -> None:
    if on_output is not None:
        result = on_output(line)
        if inspect.isawaitable(result):
            await result


class Runner:
    """Base class: `root` is the deployment directory on the host; `label` names the host."""

    root: str
    label: str

    async def run(
        self, cmd: str, cwd: str | None = None, on_output: OutputCallback | None = None, timeout: float | None = None
    ) -> CommandResult:
        """Run `cmd` in a shell in `cwd` (default: root), streaming output lines (stdout+stderr).

        A non-zero exit is a result, not an error; exit 127 (command not found), a missing
        directory and a timeout raise RunnerError.
        """
        raise NotImplementedError

    async def read_file(self, path: str) -> bytes:
        raise NotImplementedError

    async def write_file_atomic(
        self, path: str, data: bytes, backup: bool = True, expect: bytes | None = None
    ) -> str | None:
        """Replace `path` atomically keeping mode/owner; returns the timestamped backup path.

        `expect`: the bytes the caller planned against. The file must still hold them, and must
        not change (size, mtime, inode) until the rename; otherwise RunnerError(kind="changed")
        and nothing is written, so another writer's edit is never lost.
        """
        raise NotImplementedError

    async def exists(self, path: str) -> bool:
        raise NotImplementedError

    def resolve(self, path: str) -> str:
        """`path` relative to the deployment root (absolute paths unchanged)."""
        return posixpath.join(self.root, path)

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> Runner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class LocalRunner(Runner):
    """The deployment directory is on this machine."""

    def __init__(self, root: str, env: dict[str, str] | None = None) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))
        self.env = dict(env or {})
        self.label = "localhost"

    async def run(
        self, cmd: str, cwd: str | None = None, on_output: OutputCallback | None = None, timeout: float | None = None
    ) -> CommandResult:
        where = self.resolve(cwd) if cwd else self.root
        if not os.path.isdir(where):
            raise RunnerError(
                f"directory {where} does not exist on {self.label}",
                "check the deployment path",
                self.label,
                "missing-directory",
            )
        spawn = asyncio.ensure_future(
            asyncio.create_subprocess_shell(
                cmd,
                cwd=where,
                env={**os.environ, **self.env},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        )
        try:
            proc = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            # cancelled while the process was being made: it may exist already, with no one to reap
            # it; finish the spawn, take the command down and reap it before the cancellation ends
            with contextlib.suppress(BaseException):
                late = await spawn
                _kill_group(late.pid)
                await late.wait()
            raise
        lines: list[str] = []

        async def pump() -> int:
            assert proc.stdout is not None
            async for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                lines.append(line)
                await _emit(on_output, line)
            return await proc.wait()

        try:
            code = await asyncio.wait_for(pump(), timeout)
        except TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            raise RunnerError(
                f"`{cmd}` did not finish within {timeout:g} s on {self.label}",
                "run it by hand to see where it hangs",
                self.label,
                "timeout",
            ) from None
        except BaseException:  # cancelled by the UI or Ctrl-C: take the command down with us
            _kill_group(proc.pid)
            # reap it before the cancellation ends, so its transport never outlives the event loop
            with contextlib.suppress(BaseException):
                await asyncio.shield(proc.wait())
            raise
        output = "\n".join(lines)
        if code == 127:
            raise _missing_command(cmd, output, self.label)
        return CommandResult(cmd, code, output)

    async def read_file(self, path: str) -> bytes:
        full = self.resolve(path)
        try:
            return await asyncio.to_thread(Path(full).read_bytes)
        except IsADirectoryError:
            raise RunnerError(
                f"{full} is a directory, not a file", "pass the .env file itself with --env", self.label, "not-a-file"
            ) from None
        except FileNotFoundError:
            raise RunnerError(
                f"{full} does not exist on {self.label}",
                "check the deployment directory and the env file path",
                self.label,
                "missing-file",
            ) from None
        except OSError as e:
            raise RunnerError(f"cannot read {full}: {e.strerror or e}", "", self.label, "io") from None

    async def write_file_atomic(
        self, path: str, data: bytes, backup: bool = True, expect: bytes | None = None
    ) -> str | None:
        full = os.path.realpath(self.resolve(path))  # a symlinked .env stays a symlink
        try:
            return await asyncio.to_thread(_write_local_atomic, full, data, backup, expect)
        except FileChanged as e:
            raise RunnerError(
                f"{full} changed while it was being written ({e}); nothing was written",
                "someone else edited it: review the new diff and run again",
                self.label,
                "changed",
            ) from None
        except OSError as e:
            raise RunnerError(
                f"cannot write {full}: {e.strerror or e}", "check permissions on its directory", self.label, "io"
            ) from None

    async def exists(self, path: str) -> bool:
        return os.path.exists(self.resolve(path))


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class FileChanged(OSError):
    """The file is not what the write was planned against, or changed during the write."""


BEFORE_RENAME: list[Callable[[str], None]] = []
"""Called with the target path after the new bytes are on disk and just before the final check
and rename: how tests make "another writer appends right now" happen every time, not by luck."""


def _signature(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)


def _create_like(path: str, st: os.stat_result | None, exclusive: bool = True) -> int:
    """Open a new file that is 0600 from its first moment, then owned and moded like `st`
    (the original) before a byte is written, so no other user can read it even briefly."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags | (os.O_EXCL if exclusive else os.O_TRUNC), 0o600)
    try:
        if st is not None:
            if (st.st_uid, st.st_gid) != (os.fstat(fd).st_uid, os.fstat(fd).st_gid):
                with contextlib.suppress(PermissionError):  # not root: ours, still 0600 or stricter
                    os.fchown(fd, st.st_uid, st.st_gid)
            os.fchmod(fd, stat.S_IMODE(st.st_mode))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_fd(fd: int, data: bytes) -> None:
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_local_atomic(full: str, data: bytes, backup: bool, expect: bytes | None = None) -> str | None:
    """Temp file beside the target, same mode/owner, fsync, re-check, rename; the backup keeps
    the old bytes with the original's owner and mode from its first byte."""
    directory = os.path.dirname(full) or "."
    old: bytes | None = None
    try:
        with open(full, "rb") as f:
            st: os.stat_result | None = os.fstat(f.fileno())
            old = f.read()
    except FileNotFoundError:
        st = None
    if expect is not None and (old or b"") != expect:
        raise FileChanged("its content is not what the edit was planned against")
    saved = None
    if st is not None and old is not None and backup:
        n = 0
        while True:
            saved = _backup_name(full) + (f"-{n}" if n else "")
            try:
                _write_fd(_create_like(saved, st), old)
                break
            except FileExistsError:
                n += 1
    tmp = os.path.join(directory, f".{os.path.basename(full)}.{secrets.token_hex(6)}.tmp")
    try:
        _write_fd(_create_like(tmp, st), data)
        for hook in BEFORE_RENAME:
            hook(full)
        try:
            now = _signature(os.stat(full)) if st is not None else None
        except FileNotFoundError:
            now = None
        if now != (_signature(st) if st is not None else None):
            raise FileChanged("its size, time or inode moved after it was read")
        os.replace(tmp, full)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if saved is not None and isinstance(sys.exc_info()[1], FileChanged):
            with contextlib.suppress(OSError):
                os.unlink(saved)  # nothing was written: no backup of a write that did not happen
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return saved


def _sftp_signature(attrs: asyncssh.SFTPAttrs | None) -> tuple[Any, ...] | None:
    return None if attrs is None else (attrs.size, attrs.mtime, getattr(attrs, "mtime_ns", None))


class SSHRunner(Runner):
    """The deployment directory is on another host, reached with asyncssh (commands + SFTP)."""

    def __init__(
        self,
        host: str,
        root: str,
        *,
        port: int = 22,
        username: str | None = None,
        known_hosts: str | None = "~/.ssh/known_hosts",
        client_keys: list[str] | None = None,
        password: str | None = None,
        env: dict[str, str] | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        self.host = host
        self.root = root
        self.port = port
        self.username = username
        self.known_hosts = known_hosts
        self.client_keys = client_keys
        self.password = password
        self.env = dict(env or {})
        self.connect_timeout = connect_timeout
        who = f"{username}@" if username else ""
        self.label = f"{who}{host}" + (f":{port}" if port != 22 else "")
        self._conn: asyncssh.SSHClientConnection | None = None
        self._sftp: asyncssh.SFTPClient | None = None

    async def connect(self) -> None:
        """Open the SSH connection; every way it can fail becomes a RunnerError with a fix."""
        known: Any
        known_file = os.path.expanduser(self.known_hosts) if self.known_hosts else None
        if self.known_hosts is None:
            known = None  # verification explicitly disabled by the caller
        elif known_file and os.path.isfile(known_file):
            known = known_file
        else:
            known = asyncssh.import_known_hosts("")
        options: dict[str, Any] = {
            "port": self.port,
            "known_hosts": known,
            "connect_timeout": self.connect_timeout,
        }
        if self.username:
            options["username"] = self.username
        if self.client_keys is not None:
            options["client_keys"] = [os.path.expanduser(k) for k in self.client_keys]
        if self.password is not None:
            options["password"] = self.password
        try:
            self._conn = await asyncssh.connect(self.host, **options)
        except asyncssh.HostKeyNotVerifiable:
            raise self._host_key_error(known_file) from None
        except asyncssh.PermissionDenied:
            raise RunnerError(
                f"SSH authentication to {self.label} failed",
                "check the user name in the deployment (ssh://USER@host/path), load your key into ssh-agent "
                '(ssh-add), or name the key file in the config ([ssh] identity = ["~/.ssh/id_ed25519"])',
                self.label,
                "auth",
            ) from None
        except ConnectionRefusedError:
            raise RunnerError(
                f"{self.host} refused the SSH connection on port {self.port}",
                "check that sshd runs there and the port is right",
                self.label,
                "refused",
            ) from None
        except socket.gaierror as e:
            raise RunnerError(
                f"cannot resolve host {self.host}: {e.strerror or e}",
                "check the host name in the deployment",
                self.label,
                "unresolvable",
            ) from None
        except TimeoutError:
            raise RunnerError(
                f"no SSH answer from {self.label} within {self.connect_timeout:g} s",
                "check the address, the port and firewalls",
                self.label,
                "timeout",
            ) from None
        except (OSError, asyncssh.Error) as e:
            raise RunnerError(f"SSH connection to {self.label} failed: {e}", "", self.label, "error") from None

    def _host_key_error(self, known_file: str | None) -> RunnerError:
        listed = False
        if known_file and os.path.isfile(known_file):
            try:
                known = asyncssh.read_known_hosts(known_file)
                trusted, cas, *_ = known.match(self.host, self.host, self.port)
                listed = bool(trusted or cas)
            except (OSError, ValueError, asyncssh.Error):
                listed = False
        entry = self.host if self.port == 22 else f"[{self.host}]:{self.port}"
        if listed:
            return RunnerError(
                f"the host key of {self.label} does NOT match the one in {known_file} — possibly a different "
                "machine or a man-in-the-middle",
                f"if the host was reinstalled, verify its new key out of band, then "
                f"`ssh-keygen -f {shlex.quote(known_file or '~/.ssh/known_hosts')} -R {shlex.quote(entry)}`",
                self.label,
                "host-key-mismatch",
            )
        return RunnerError(
            f"{self.label} is not in {known_file or 'known_hosts'}, so its host key cannot be verified",
            f"connect once with `ssh -o UserKnownHostsFile={shlex.quote(known_file or '~/.ssh/known_hosts')} "
            f"-p {self.port} {self.host}` and check the fingerprint, or "
            f"`ssh-keyscan -p {self.port} {self.host} >> {shlex.quote(known_file or '~/.ssh/known_hosts')}` "
            "after verifying it ([ssh] known_hosts in the config names that file)",
            self.label,
            "host-key-unknown",
        )

    @property
    def lost(self) -> bool:
        """The SSH connection was open and is gone (server restarted, network dropped)."""
        return self._conn is not None and self._conn.is_closed()

    def _lost(self, e: BaseException) -> RunnerError:
        return RunnerError(
            f"the SSH connection to {self.label} was lost ({type(e).__name__}: {e})".replace(": )", ")"),
            "the next action connects again",
            self.label,
            "disconnected",
        )

    @property
    def conn(self) -> asyncssh.SSHClientConnection:
        if self._conn is None:
            raise RunnerError(f"not connected to {self.label}", "call connect() first", self.label)
        return self._conn

    async def sftp(self) -> asyncssh.SFTPClient:
        if self.lost:
            raise self._lost(ConnectionError("closed"))
        if self._sftp is None:
            try:
                self._sftp = await self.conn.start_sftp_client()
            except (asyncssh.Error, OSError) as e:
                if self.lost:
                    raise self._lost(e) from None
                raise RunnerError(
                    f"SFTP is not available on {self.label}: {e}", "enable the sftp subsystem in sshd", self.label, "io"
                ) from None
        return self._sftp

    async def run(
        self, cmd: str, cwd: str | None = None, on_output: OutputCallback | None = None, timeout: float | None = None
    ) -> CommandResult:
        where = self.resolve(cwd) if cwd else self.root
        sftp = await self.sftp()
        try:
            isdir = await sftp.isdir(where)
        except (asyncssh.Error, OSError) as e:
            raise self._lost(e) from None
        if not isdir:
            raise RunnerError(
                f"directory {where} does not exist on {self.label}",
                "check the path in the deployment (--deployment ssh://user@host/path, or deployment in the config)",
                self.label,
                "missing-directory",
            )
        exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in self.env.items())
        full = f"cd {shlex.quote(where)} && {exports}{cmd}"
        lines: list[str] = []
        try:
            proc = await self.conn.create_process(
                full, stdin=asyncssh.DEVNULL, stderr=asyncssh.STDOUT, encoding="utf-8", errors="replace"
            )
        except (asyncssh.Error, OSError) as e:
            if self.lost:
                raise self._lost(e) from None
            raise RunnerError(f"cannot start `{cmd}` on {self.label}: {e}", "", self.label, "error") from None

        async def pump() -> int:
            async for raw in proc.stdout:
                if not raw:  # end of stream, not an empty line (that would be "\n")
                    continue
                line = raw.rstrip("\r\n")
                lines.append(line)
                await _emit(on_output, line)
            await proc.wait_closed()
            if proc.exit_status is None or proc.exit_status < 0:
                return -1
            return proc.exit_status

        try:
            code = await asyncio.wait_for(pump(), timeout)
        except TimeoutError:
            proc.close()
            raise RunnerError(
                f"`{cmd}` did not finish within {timeout:g} s on {self.label}",
                "run it by hand to see where it hangs",
                self.label,
                "timeout",
            ) from None
        except (asyncssh.Error, OSError) as e:
            proc.close()
            raise self._lost(e) from None
        except BaseException:
            proc.close()
            raise
        output = "\n".join(lines)
        if code == 127:
            raise _missing_command(cmd, output, self.label)
        return CommandResult(cmd, code, output)

    def resolve(self, path: str) -> str:
        return posixpath.join(self.root, path)

    async def read_file(self, path: str) -> bytes:
        full = self.resolve(path)
        sftp = await self.sftp()
        try:
            async with sftp.open(full, "rb") as f:
                return await f.read()
        except asyncssh.SFTPNoSuchFile:
            raise RunnerError(
                f"{full} does not exist on {self.label}",
                "check the deployment directory and the env file path",
                self.label,
                "missing-file",
            ) from None
        except (asyncssh.SFTPError, OSError) as e:
            if self.lost or isinstance(e, asyncssh.SFTPNoConnection | asyncssh.SFTPConnectionLost):
                raise self._lost(e) from None
            raise RunnerError(f"cannot read {full} on {self.label}: {e}", "", self.label, "io") from None

    async def write_file_atomic(
        self, path: str, data: bytes, backup: bool = True, expect: bytes | None = None
    ) -> str | None:
        sftp = await self.sftp()
        full = self.resolve(path)
        with contextlib.suppress(asyncssh.SFTPError):
            if await sftp.islink(full):  # a symlinked .env stays a symlink: write its target
                full = await sftp.realpath(full)
        directory, name = posixpath.split(full)
        tmp = posixpath.join(directory or ".", f".{name}.{secrets.token_hex(6)}.tmp")
        saved: str | None = None
        try:
            try:
                attrs: asyncssh.SFTPAttrs | None = await sftp.stat(full)
            except asyncssh.SFTPNoSuchFile:
                attrs = None
            old = b""
            if attrs is not None:
                async with sftp.open(full, "rb") as f:
                    old = cast(bytes, await f.read())  # opened "rb": asyncssh types read() as str
            if expect is not None and old != expect:
                raise FileChanged("its content is not what the edit was planned against")
            if attrs is not None and backup:
                saved = _backup_name(full)
                n = 1
                while await sftp.exists(saved):  # two writes in one second: distinct backups
                    saved, n = f"{_backup_name(full)}-{n}", n + 1
                await self._write(sftp, saved, old, attrs)
            await self._write(sftp, tmp, data, attrs)
            for hook in BEFORE_RENAME:
                hook(full)
            try:
                now: asyncssh.SFTPAttrs | None = await sftp.stat(full)
            except asyncssh.SFTPNoSuchFile:
                now = None
            if _sftp_signature(now) != _sftp_signature(attrs):
                raise FileChanged("its size or time moved after it was read")
            try:
                await sftp.posix_rename(tmp, full)
            except asyncssh.SFTPOpUnsupported:
                await sftp.rename(tmp, full, flags=0)
        except FileChanged as e:
            with contextlib.suppress(asyncssh.SFTPError, OSError):
                await sftp.remove(tmp)
            if saved is not None:
                with contextlib.suppress(asyncssh.SFTPError, OSError):
                    await sftp.remove(saved)
            raise RunnerError(
                f"{full} on {self.label} changed while it was being written ({e}); nothing was written",
                "someone else edited it: review the new diff and run again",
                self.label,
                "changed",
            ) from None
        except (asyncssh.SFTPError, OSError) as e:
            with contextlib.suppress(asyncssh.SFTPError, OSError):
                await sftp.remove(tmp)
            raise RunnerError(
                f"cannot write {full} on {self.label}: {e}", "check permissions on its directory", self.label, "io"
            ) from None
        return saved

    @staticmethod
    async def _write(sftp: asyncssh.SFTPClient, path: str, data: bytes, attrs: asyncssh.SFTPAttrs | None) -> None:
        private = asyncssh.SFTPAttrs(permissions=0o600)  # never readable by others, even briefly
        async with sftp.open(path, "xb", private) as f:
            if attrs is not None:  # owner and mode like the original before the first byte
                if attrs.uid is not None and attrs.gid is not None:
                    with contextlib.suppress(asyncssh.SFTPError):
                        await f.chown(attrs.uid, attrs.gid)
                if attrs.permissions is not None:
                    await f.chmod(stat.S_IMODE(attrs.permissions))
            await f.write(data)
            with contextlib.suppress(asyncssh.SFTPError):
                await f.fsync()

    async def exists(self, path: str) -> bool:
        return await (await self.sftp()).exists(self.resolve(path))

    async def close(self) -> None:
        if self._sftp is not None:
            self._sftp.exit()
            self._sftp = None
        if self._conn is not None:
            self._conn.close()
            with contextlib.suppress(Exception):
                await self._conn.wait_closed()
            self._conn = None


async def open_deployment(
    spec: str,
    *,
    env: dict[str, str] | None = None,
    known_hosts: str | None = "~/.ssh/known_hosts",
    client_keys: list[str] | None = None,
    password: str | None = None,
    connect_timeout: float = 10.0,
) -> Runner:
    """A connected runner for a deployment spec; raises RunnerError when it cannot connect."""
    d = parse_deployment(spec)
    if not d.remote:
        runner = LocalRunner(d.path, env=env)
        if not os.path.isdir(runner.root):
            raise RunnerError(
                f"deployment directory {runner.root} does not exist",
                '--deployment DIR, the directory that holds the deployment\'s .env and Taskfile (or deployment = "DIR" '
                "in the config)",
                "localhost",
                "missing-directory",
            )
        return runner
    assert d.host is not None
    ssh = SSHRunner(
        d.host,
        d.path,
        port=d.port,
        username=d.username,
        known_hosts=known_hosts,
        client_keys=client_keys,
        password=password,
        env=env,
        connect_timeout=connect_timeout,
    )
    await ssh.connect()
    return ssh
