"""Manage the relay process on this machine: start detached, attach, status, stop, key.

The relay writes `<storage>/relay-runtime.json` once listening (pid, key, port, metrics);
we start it in its own session so it outlives the TUI, with stdout/stderr appended to
`<storage>/blind-relay.log`. The key derives from the storage directory, so anything that
would switch storage directories gets a warning first (`key_change_warning`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

RUNTIME_FILE = "relay-runtime.json"
LOG_FILE = "blind-relay.log"


class RelayProcError(Exception):
    """Starting, attaching to or stopping the relay failed; says why and how to fix it."""

    def __init__(self, what: str, fix: str = "", log_tail: str = "") -> None:
        self.what = what
        self.fix = fix
        self.log_tail = log_tail
        super().__init__(what + (f" — {fix}" if fix else ""))


@dataclass(frozen=True)
class RelayRuntime:
    """The contents of `relay-runtime.json` plus where it was found."""

    pid: int
    key: str
    host: str
    port: int
    metrics: str | None
    started_at: float
    version: str
    storage: str


@dataclass(frozen=True)
class RelayStatus:
    storage: str
    running: bool
    runtime: RelayRuntime | None
    log_path: str
    stale_runtime: bool = False  # a runtime file whose pid is gone


def runtime_path(storage: str) -> Path:
    return Path(storage).expanduser().absolute() / RUNTIME_FILE


def log_path(storage: str) -> Path:
    return Path(storage).expanduser().absolute() / LOG_FILE


def read_runtime(storage: str) -> RelayRuntime | None:
    """The runtime file, or None when absent or unreadable."""
    raise NotImplementedError


def pid_alive(pid: int) -> bool:
    raise NotImplementedError


def relay_status(storage: str) -> RelayStatus:
    raise NotImplementedError


def attach(storage: str) -> RelayRuntime | None:
    """The running relay of `storage` (runtime file present and its pid alive), else None."""
    raise NotImplementedError


def relay_command(
    storage: str,
    port: int,
    host: str = "0.0.0.0",
    bootstrap: tuple[str, ...] | list[str] = (),
    metrics: str | None = None,
    python: str = sys.executable,
) -> list[str]:
    """`python -m relay --storage S --port P [--host H] [--bootstrap ...] [--metrics ...]`."""
    raise NotImplementedError


async def start_relay(
    storage: str,
    port: int,
    host: str = "0.0.0.0",
    bootstrap: tuple[str, ...] | list[str] = (),
    metrics: str | None = None,
    timeout: float = 30.0,
    python: str = sys.executable,
) -> RelayRuntime:
    """Start the relay detached and wait until it listens; attach instead if it already runs."""
    raise NotImplementedError


async def stop_relay(storage: str, timeout: float = 10.0) -> bool:
    """SIGTERM the relay of `storage` and wait for it to exit; False when none was running."""
    raise NotImplementedError


def read_key(storage: str) -> str | None:
    """The relay key: from the runtime file, else the last `Server listening on` in the log."""
    raise NotImplementedError


def key_change_warning(storage: str, previous_storage: str | None = None) -> str | None:
    """A warning when using `storage` would change the relay key (else None)."""
    raise NotImplementedError
