"""Run commands and edit files on the deployment host, locally or over SSH, one interface.

`open_deployment("path")` gives a `LocalRunner`; `open_deployment("ssh://user@host[:port]/path")`
an `SSHRunner` (asyncssh; host keys checked against known_hosts; key, agent or password auth;
files over SFTP). Failures become `RunnerError` saying what failed, where, and how to fix it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

OutputCallback = Callable[[str], Awaitable[None] | None]


class RunnerError(Exception):
    """A command or file operation on the deployment host failed before producing a result."""

    def __init__(self, what: str, fix: str = "", host: str = "localhost", kind: str = "error") -> None:
        self.what = what
        self.fix = fix
        self.host = host
        self.kind = kind  # auth | host-key-mismatch | host-key-unknown | refused | unresolvable | timeout
        #                 | missing-command | missing-directory | missing-file | io | error
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
    raise NotImplementedError


class Runner:
    """Base class: `root` is the deployment directory on the host; `label` names the host."""

    root: str
    label: str

    async def run(
        self, cmd: str, cwd: str | None = None, on_output: OutputCallback | None = None, timeout: float | None = None
    ) -> CommandResult:
        """Run `cmd` in a shell in `cwd` (default: root), streaming output lines (stdout+stderr)."""
        raise NotImplementedError

    async def read_file(self, path: str) -> bytes:
        raise NotImplementedError

    async def write_file_atomic(self, path: str, data: bytes, backup: bool = True) -> str | None:
        """Replace `path` atomically keeping mode/owner; returns the timestamped backup path."""
        raise NotImplementedError

    async def exists(self, path: str) -> bool:
        raise NotImplementedError

    def resolve(self, path: str) -> str:
        """`path` relative to the deployment root (absolute paths unchanged)."""
        raise NotImplementedError

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> Runner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class LocalRunner(Runner):
    def __init__(self, root: str, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.env = dict(env or {})
        self.label = "localhost"


class SSHRunner(Runner):
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
        self.label = host


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
    raise NotImplementedError
