"""`blind-relay --systemd-unit`: a hardened unit for the flags given, ready for /etc/systemd/system.

The relay needs a UDP port, its storage directory and nothing else, so the unit runs it as a
dynamic dedicated user with the rest of the system read-only and most kernel surfaces closed.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

DEFAULT_STATE_DIR = "/var/lib/blind-relay"


def exec_start(args: Sequence[str]) -> str:
    """The command: the installed `blind-relay` script if on PATH, else this Python with `-m relay`."""
    script = shutil.which("blind-relay")
    base = [script] if script else [sys.executable, "-m", "relay"]
    return " ".join(shlex.quote(a) for a in [*base, *args])


def render_unit(
    *,
    storage: str | None,
    port: int,
    host: str,
    bootstrap: str | None,
    metrics: str,
    allow: Sequence[str] = (),
    allow_files: Sequence[str] = (),
    log_format: str = "text",
    extra_args: Sequence[str] = (),
) -> str:
    """Render the unit. A storage under /var/lib/ becomes the unit's StateDirectory."""
    state = Path(storage or DEFAULT_STATE_DIR)
    if not state.is_absolute():
        state = Path(DEFAULT_STATE_DIR)
    args = ["--storage", str(state), "--port", str(port), "--host", host, "--metrics", metrics]
    if bootstrap:
        args += ["--bootstrap", bootstrap]
    for k in allow:
        args += ["--allow", k]
    for f in allow_files:
        args += ["--allow-file", str(Path(f).resolve())]
    if log_format != "text":
        args += ["--log-format", log_format]
    args += list(extra_args)

    storage_lines: list[str]
    rel = state.relative_to("/var/lib") if state.is_relative_to("/var/lib") and state != Path("/var/lib") else None
    if rel is not None:
        storage_lines = [f"StateDirectory={rel}", "StateDirectoryMode=0700"]
    else:
        storage_lines = [f"ReadWritePaths={state}"]
    caps = (
        ["AmbientCapabilities=CAP_NET_BIND_SERVICE", "CapabilityBoundingSet=CAP_NET_BIND_SERVICE"]
        if port < 1024
        else ["CapabilityBoundingSet="]
    )
    command = exec_start(args)
    warn: list[str] = []
    if command.startswith(("/root/", "/home/")):
        warn = [
            "# NOTE: the relay is installed under a home directory, which this unit hides (ProtectHome=yes)",
            "# from its dynamic user; install it system-wide (python3 -m venv /opt/blind-relay) and fix ExecStart.",
        ]
    lines = [
        *warn,
        "[Unit]",
        "Description=Blind relay for HyperDHT peers (CosmicAC; drop-in for blind-relay-service)",
        "Documentation=https://github.com/holepunchto/blind-relay-service",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={command}",
        "# systemctl reload: reread --allow-file",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
        "RestartSec=5s",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=15s",
        "# A dedicated, unprivileged user that exists only while the relay runs.",
        "DynamicUser=yes",
        "User=blind-relay",
        "Group=blind-relay",
        *storage_lines,
        "UMask=0077",
        "Environment=PYTHONUNBUFFERED=1",
        "# Hardening: the relay needs UDP/TCP sockets and its storage, nothing else.",
        "NoNewPrivileges=yes",
        *caps,
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "ProtectProc=invisible",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        "RestrictNamespaces=yes",
        "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "SystemCallArchitectures=native",
        "SystemCallFilter=@system-service",
        "SystemCallFilter=~@privileged @resources",
        "LimitNOFILE=65536",
        "MemoryMax=512M",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)
