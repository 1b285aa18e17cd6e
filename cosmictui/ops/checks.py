"""Prerequisite checks, one function per prerequisite on the operator page.

Each returns a `CheckResult` with a status ("ok" | "warn" | "fail"), what was seen, and how
to fix it; none raises for an expected failure. Sync checks look at this machine; async
ones go through a runner to the deployment host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from cosmictui.ops.config import Settings
from cosmictui.ops.runner import Runner

Status = Literal["ok", "warn", "fail"]
MIN_FREE_RAM = 200 * 1024 * 1024


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    detail: str
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "fail"


def check_relay_runs_here() -> CheckResult:
    """Our relay package imports and its crypto works (key pair + Noise round trip / signature)."""
    raise NotImplementedError


def check_udp_port(port: int, host: str = "0.0.0.0", storage: str | None = None) -> CheckResult:
    """The UDP port is free, or held by our relay (per `<storage>/relay-runtime.json`)."""
    raise NotImplementedError


def check_memory(minimum: int = MIN_FREE_RAM) -> CheckResult:
    """At least 200 MB of RAM available (the relay's budget on the operator page)."""
    raise NotImplementedError


def check_storage(path: str) -> CheckResult:
    """Storage directory writable and persistent (warn on relative paths, tmpfs, /tmp)."""
    raise NotImplementedError


def check_dht(stats: dict[str, Any] | None) -> CheckResult:
    """From the relay's `/stats`: bootstrapped and not firewalled."""
    raise NotImplementedError


async def fetch_stats(metrics_url: str, timeout: float = 3.0) -> dict[str, Any] | None:
    """GET `<metrics_url>/stats` as JSON; None when the relay does not answer."""
    raise NotImplementedError


async def check_deployment_host(runner: Runner) -> CheckResult:
    """The deployment host answers and its directory exists."""
    raise NotImplementedError


def ping_command(host: str, port: int, timeout: float = 3.0, python: str = "python3") -> str:
    """A stdlib-only `python3 -c` one-liner that sends a dht-rpc PING and prints the reply."""
    raise NotImplementedError


async def check_relay_from_deployment(runner: Runner, host: str, port: int, timeout: float = 3.0) -> CheckResult:
    """From the deployment host, the relay's UDP port answers a dht-rpc PING."""
    raise NotImplementedError


async def run_checks(settings: Settings, runner: Runner | None = None) -> list[CheckResult]:
    """Every check, in the wizard's order (remote ones only when a runner is given)."""
    raise NotImplementedError
