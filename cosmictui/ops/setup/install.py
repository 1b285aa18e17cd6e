"""Keep the relay running after a reboot: install it where a hardened systemd unit can run it.

The unit `blind-relay --systemd-unit` prints hides /home, /root and /tmp from the service
(ProtectHome, PrivateTmp), so a relay run from a checkout or a venv there cannot be the unit's
command. The plan: a virtual environment under /opt made from a Python the unit can see, this
project installed into it, the unit rendered for that executable, and a storage the unit can
see holding the same key (copied, never made anew).
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import cosmictui
from cosmictui.ops.config import Settings
from cosmictui.ops.relayproc import choose_kernel_forwarding
from relay.service.systemd import DEFAULT_STATE_DIR, UnitError, hidden_by_sandbox, render_unit

DEFAULT_PREFIX = "/opt/blind-relay"
UNIT_PATH = "/etc/systemd/system/blind-relay.service"
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass(frozen=True)
class InstallPlan:
    """What Finish offers: commands the wizard runs (after a confirm), then the unit to put in place."""

    prefix: str
    python: str
    source: str
    #: run on this machine by the wizard, once confirmed: make the venv, install the relay into it
    install: list[str]
    exe: str
    storage: str
    #: the storage the unit uses differs from the wizard's (which the sandbox hides): copied, same key
    moved_from: str | None
    unit: str
    notes: list[str] = field(default_factory=list)
    #: for the operator, as root, once the install ran: the unit file, stop the wizard's relay, enable
    enable: list[str] = field(default_factory=list)


def project_source() -> str:
    """What pip installs: this checkout when the wizard runs from one, else this released version."""
    root = Path(cosmictui.__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "relay").is_dir():
        return str(root)
    return f"cosmictui=={cosmictui.__version__}"


def unit_python() -> str:
    """A Python the unit can run: a venv's interpreter links to its base, which must not be hidden."""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    if hidden_by_sandbox(base) is None and hidden_by_sandbox(os.path.realpath(sys.base_prefix)) is None:
        return base
    return SYSTEM_PYTHON


def install_plan(
    settings: Settings,
    storage: str,
    port: int,
    *,
    prefix: str = DEFAULT_PREFIX,
    relay_pid: int | None = None,
    python: str | None = None,
    source: str | None = None,
) -> InstallPlan:
    """The plan for this relay's settings; raises UnitError (with its fix) when no unit can run it."""
    python = python or unit_python()
    source = source or project_source()
    exe = f"{prefix.rstrip('/')}/bin/blind-relay"
    install = [
        f"{shlex.quote(python)} -m venv {shlex.quote(prefix)}",
        f"{shlex.quote(prefix)}/bin/pip install {shlex.quote(source)}",
    ]
    state = str(Path(storage).expanduser().absolute())
    moved_from = None
    if hidden_by_sandbox(state) is not None:
        moved_from, state = state, DEFAULT_STATE_DIR
    metrics = settings.relay_metrics if settings.relay_metrics and settings.relay_metrics != "off" else None
    kernel = choose_kernel_forwarding(settings.relay_kernel_forwarding).unit  # the unit grants CAP_NET_ADMIN
    rendered = render_unit(
        storage=state,
        port=port,
        host=settings.relay_host,
        bootstrap=",".join(settings.relay_bootstrap) or None,
        metrics=metrics or "127.0.0.1:49738",
        command=[exe],
        kernel_forwarding=kernel,
    )
    flags = [f"--storage {shlex.quote(state)}", f"--port {int(port)}", f"--host {shlex.quote(settings.relay_host)}"]
    if metrics:
        flags.append(f"--metrics {shlex.quote(metrics)}")
    if settings.relay_bootstrap:
        flags.append("--bootstrap " + shlex.quote(",".join(settings.relay_bootstrap)))
    if kernel:
        flags.append("--kernel-forwarding")
    enable: list[str] = []
    if moved_from is not None:
        enable.append(
            f"install -d -m 0700 {DEFAULT_STATE_DIR} && cp -a {shlex.quote(moved_from + '/.')} {DEFAULT_STATE_DIR}/"
        )
    enable.append(f"{shlex.quote(exe)} --systemd-unit {' '.join(flags)} > {UNIT_PATH}")
    if relay_pid is not None:
        enable.append(f"kill {int(relay_pid)}")
    enable.append("systemctl daemon-reload && systemctl enable --now blind-relay")
    return InstallPlan(prefix, python, source, install, exe, state, moved_from, rendered.text, rendered.notes, enable)


__all__ = ["DEFAULT_PREFIX", "UNIT_PATH", "InstallPlan", "UnitError", "install_plan", "project_source", "unit_python"]
