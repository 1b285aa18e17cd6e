"""What keeps running when the wizard quits, said before it does.

On a real deployment the wizard never stops the relay it started or attached to: jobs reach the
worker through it. An operator quitting must know that a process stays behind, which one (pid,
port, key), until when (a reboot, unless systemd runs it) and how to stop it. The demo is
different: its relay goes with its sandbox, so there is nothing to say.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from cosmictui.ops.config import Settings
from cosmictui.ops.relayproc import RelayRuntime, attach

_UNIT = re.compile(r"/system\.slice/(?:.*/)?([^/]+\.service)$")


@dataclass(frozen=True)
class LeftRunning:
    """The question to ask before quitting, in words: the relay that stays and how to stop it."""

    runtime: RelayRuntime
    title: str
    body: str
    stop: list[str]
    unit: str | None


def systemd_unit(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The system service that runs `pid` (`blind-relay.service`), None when none does."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        m = _UNIT.search(line.rsplit(":", 1)[-1])
        if m:
            return m.group(1)
    return None


def resume_command(settings: Settings) -> str:
    """How to open this deployment's wizard again (it resumes where it stopped)."""
    cmd = ["cosmictui", "--deployment", settings.deployment]
    if settings.config_path:
        cmd += ["--config", settings.config_path]
    return shlex.join(cmd)


def left_running(
    settings: Settings, storage: str | None, *, external: bool, demo: bool, resume_at: str
) -> LeftRunning | None:
    """What quitting now leaves running on this machine; None when nothing (no relay runs here, a
    relay attached by key runs elsewhere, or the demo, whose relay goes with it)."""
    if demo or external or not storage:
        return None
    rt = attach(storage)
    if rt is None:
        return None
    unit = systemd_unit(rt.pid)
    if unit is not None:
        until = f"systemd runs it ({unit}), so it also starts again after a reboot."
        stop = [f"systemctl stop {unit}"]
    else:
        until = (
            "It runs until this host reboots: Finish (n in step 6) installs it for systemd, so it comes back after one."
        )
        stop = [f"kill {rt.pid}"]
    body = (
        "The relay on this machine keeps running after you quit: the wizard does not stop it, and jobs "
        "whose .env lists its key reach the worker through it.\n"
        f"  pid {rt.pid} · UDP port {rt.port} · storage {rt.storage}\n"
        f"  key {rt.key}\n"
        f"{until} Your progress is saved: {resume_command(settings)} resumes at {resume_at}.\n"
        "To stop the relay (jobs that use it then stay in Creating):"
    )
    return LeftRunning(rt, "Quit: the relay keeps running", body, stop, unit)
