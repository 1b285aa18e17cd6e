"""`blind-relay --systemd-unit`: a hardened unit for the flags given, ready for /etc/systemd/system.

The relay needs a UDP port, its storage directory and nothing else, so the unit runs it as a
dedicated user (dynamic for a storage under /var/lib, else a fixed system user) with the rest of
the system read-only and most kernel surfaces closed. The key must survive the move into the
sandbox: a storage, allow file or executable the sandbox hides (/tmp, /home, /root, ...) is
refused with a fix, never rendered into a unit that would fail or start with a new key.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import relay

DEFAULT_STATE_DIR = "/var/lib/blind-relay"
SERVICE_USER = "blind-relay"

# Paths the unit's sandbox hides from the service, and why. A storage there would be missing
# (start failure) or empty (a NEW key, silently); an executable there would not start.
HIDDEN_PATHS: dict[str, str] = {
    "/tmp": "PrivateTmp=yes gives the service its own empty /tmp",
    "/var/tmp": "PrivateTmp=yes gives the service its own empty /var/tmp",
    "/home": "ProtectHome=yes hides /home from the service",
    "/root": "ProtectHome=yes hides /root from the service",
    "/run/user": "ProtectHome=yes hides /run/user from the service",
}

_PLAIN_WORD = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
_PATH_FORBIDDEN = re.compile(r"[\s\"'\\]|[\x00-\x1f\x7f]")


class UnitError(ValueError):
    """The unit for these flags would not run as asked (or would change the key); says how to fix it."""


@dataclass
class RenderedUnit:
    """The unit text (stdout) and notes for the operator (stderr): what to create before starting it."""

    text: str
    notes: list[str] = field(default_factory=list)


def hidden_by_sandbox(path: str | Path) -> str | None:
    """Why the unit's sandbox hides `path` from the service, or None when the service sees it."""
    p = Path(path)
    for root, why in HIDDEN_PATHS.items():
        if p == Path(root) or p.is_relative_to(root):
            return why
    return None


def exec_word(arg: str) -> str:
    """One ExecStart= argument in systemd's syntax: `%` and `$` doubled, quoted when needed."""
    if re.search(r"[\x00-\x1f\x7f]", arg):
        raise UnitError(f"{arg!r} holds a control character; it cannot be put in a unit file")
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if _PLAIN_WORD.fullmatch(arg):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unit_path(path: Path, what: str) -> str:
    """A path for StateDirectory=/ReadWritePaths= (space-separated lists): refuse what systemd would split."""
    if _PATH_FORBIDDEN.search(str(path)):
        raise UnitError(
            f"{what} {str(path)!r} holds a space, quote, backslash or control character; systemd reads "
            "StateDirectory=/ReadWritePaths= as a space-separated list and would see other directories. "
            f"Use a path without them (e.g. sudo mv {shlex.quote(str(path))} {_suggest(path)}) "
            "and pass that to --storage"
        )
    return str(path).replace("%", "%%")


def _suggest(path: Path) -> str:
    return str(path.parent / re.sub(r"[^A-Za-z0-9_.-]+", "-", path.name).strip("-") or "blind-relay")


def default_command() -> list[str]:
    """The relay that is running now: its `blind-relay` script, else this Python with `-m relay`.

    Not whatever `blind-relay` PATH finds first: that may be another install (a home-dir venv
    while the operator ran /opt/blind-relay/bin/blind-relay).
    """
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if argv0 is not None and argv0.name == "blind-relay" and argv0.is_file():
        return [os.path.abspath(argv0)]
    return [sys.executable, "-m", "relay"]


def exec_start(args: Sequence[str], command: Sequence[str] | None = None) -> str:
    """The ExecStart= value, refused when the executable (or the package it runs) is hidden by the sandbox."""
    base = list(command) if command else default_command()
    exe = base[0]
    if not exe.startswith("/"):
        found = shutil.which(exe)
        if found is None:
            raise UnitError(f"--unit-exec: {exe!r} is not an absolute path and not on PATH")
        exe = base[0] = found
    checks = [("executable", exe)]
    if not command and base[1:3] == ["-m", "relay"]:
        checks.append(("package", str(Path(relay.__file__).resolve().parent)))
    for what, path in checks:
        why = hidden_by_sandbox(path)
        if why is not None:
            raise UnitError(
                f"the unit cannot run the relay {what} {path}: {why}, so the service would not start. "
                "Install the relay system-wide (sudo python3 -m venv /opt/blind-relay && "
                "sudo /opt/blind-relay/bin/pip install <this project>) and pass "
                "--unit-exec /opt/blind-relay/bin/blind-relay"
            )
    return " ".join(exec_word(a) for a in [*base, *args])


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
    command: Sequence[str] | None = None,
    kernel_forwarding: bool = False,
) -> RenderedUnit:
    """Render the unit, or raise UnitError when the service would fail or run with another key.

    A storage under /var/lib/ becomes the unit's StateDirectory (dynamic user, systemd owns the
    directory); any other storage runs as the fixed user `blind-relay`, who must own it (the notes
    say how). Storage and allow files hidden by the sandbox are refused.
    """
    state = Path(storage or DEFAULT_STATE_DIR)
    if not state.is_absolute():
        raise UnitError(f"--storage {storage!r} must be an absolute path in a unit")
    why = hidden_by_sandbox(state)
    if why is not None:
        raise UnitError(
            f"the unit cannot use storage {state}: {why}, so the service would fail or make a NEW key. "
            f"Move the key out first (sudo install -d -m 0700 {DEFAULT_STATE_DIR} && "
            f"sudo cp -a {shlex.quote(str(state) + '/.')} {DEFAULT_STATE_DIR}/) "
            f"and pass --storage {DEFAULT_STATE_DIR}: same key"
        )
    if state == Path("/var/lib"):
        raise UnitError(
            "--storage /var/lib is the whole state tree; use a directory below it, e.g. /var/lib/blind-relay"
        )
    state_text = unit_path(state, "storage")
    args = ["--storage", str(state), "--port", str(port), "--host", host, "--metrics", metrics]
    if bootstrap:
        args += ["--bootstrap", bootstrap]
    for k in allow:
        args += ["--allow", k]
    for f in allow_files:
        path = Path(f).resolve()
        why = hidden_by_sandbox(path)
        if why is not None:
            raise UnitError(
                f"the unit cannot read allow file {path}: {why}; put it under /etc (e.g. /etc/blind-relay/allow)"
            )
        args += ["--allow-file", str(path)]
    if log_format != "text":
        args += ["--log-format", log_format]
    if kernel_forwarding:
        args.append("--kernel-forwarding")
    args += list(extra_args)

    notes: list[str] = []
    if state.is_relative_to("/var/lib"):
        user_lines = [
            "# A dedicated, unprivileged user that exists only while the relay runs;",
            f"# systemd creates {state} and gives it to that user.",
            "DynamicUser=yes",
            f"User={SERVICE_USER}",
            f"Group={SERVICE_USER}",
            f"StateDirectory={state_text.removeprefix('/var/lib/')}",
            "StateDirectoryMode=0700",
        ]
    else:
        setup = [
            f"sudo useradd --system --user-group --no-create-home --shell /usr/sbin/nologin {SERVICE_USER}",
            f"sudo install -d -m 0700 -o {SERVICE_USER} -g {SERVICE_USER} {shlex.quote(str(state))}",
            f"sudo chown -R {SERVICE_USER}:{SERVICE_USER} {shlex.quote(str(state))}",
        ]
        notes.append(
            f"storage {state} is outside /var/lib, so the unit runs as the fixed user {SERVICE_USER} "
            "(a DynamicUser cannot write a directory it does not own). Before starting it, run:\n  "
            + "\n  ".join(setup)
        )
        user_lines = [
            f"# A dedicated system user that must own {state}; create it first:",
            *(f"#   {c}" for c in setup),
            f"User={SERVICE_USER}",
            f"Group={SERVICE_USER}",
            f"ReadWritePaths={state_text}",
            "RemoveIPC=yes",
        ]
    wanted = [c for c, need in (("CAP_NET_BIND_SERVICE", port < 1024), ("CAP_NET_ADMIN", kernel_forwarding)) if need]
    caps = (
        [f"AmbientCapabilities={' '.join(wanted)}", f"CapabilityBoundingSet={' '.join(wanted)}"]
        if wanted
        else ["CapabilityBoundingSet="]
    )
    if kernel_forwarding:  # nftables speaks netlink; the table dies with the relay's socket
        caps.insert(0, "# --kernel-forwarding: CAP_NET_ADMIN and AF_NETLINK for the relay's nftables table")
    families = "AF_INET AF_INET6 AF_UNIX" + (" AF_NETLINK" if kernel_forwarding else "")
    command = exec_start(args, command)
    lines = [
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
        *user_lines,
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
        f"RestrictAddressFamilies={families}",
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
    return RenderedUnit("\n".join(lines), notes)
