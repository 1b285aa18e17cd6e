"""A real OpenSSH server (Debian `openssh-server`) for one test: loopback, ephemeral port, own keys.

Started by the fixture with its own config, host key and authorized_keys in the test's tmp dir,
and killed after it. `.ci/run` installs the package; a machine without it fails loudly here.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest


@dataclass
class OpenSSH:
    port: int
    user: str
    known_hosts: Path
    client_key: Path
    proc: subprocess.Popen[bytes]

    def spec(self, path: Path) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}{path}"

    def drop_sessions(self) -> int:
        """Kill the per-connection sshd children: every client connection drops, the listener stays."""
        children = psutil.Process(self.proc.pid).children(recursive=False)
        for c in children:
            c.kill()
        psutil.wait_procs(children, timeout=10)
        return len(children)


def _free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


@pytest.fixture
def openssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenSSH]:
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    assert os.path.exists(sshd), "sshd not found: apt-get install openssh-server (.ci/run does)"
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # only the key made here
    d = tmp_path / "sshd"
    d.mkdir()
    host_key, client_key = d / "host_ed25519", d / "id_ed25519"
    _keygen(host_key)
    _keygen(client_key)
    (d / "authorized_keys").write_bytes(client_key.with_suffix(".pub").read_bytes())
    port = _free_tcp_port()
    config = d / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
        "Subsystem sftp internal-sftp\nLogLevel ERROR\n"
    )
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(config)], stderr=open(d / "sshd.log", "wb"))  # noqa: SIM115
    try:
        deadline = time.monotonic() + 30
        while True:  # ready when the port accepts a connection (or sshd died: say why)
            if proc.poll() is not None:
                raise AssertionError(f"sshd exited {proc.returncode}: {(d / 'sshd.log').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError("sshd did not listen within 30 s") from None
                time.sleep(0.05)
        known = d / "known_hosts"
        known.write_bytes(f"[127.0.0.1]:{port} ".encode() + host_key.with_suffix(".pub").read_bytes())
        yield OpenSSH(port, getpass.getuser(), known, client_key, proc)
    finally:
        children = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        for c in children:  # session processes this sshd started for the test's connections
            with contextlib.suppress(psutil.NoSuchProcess):  # a session may end between listing and kill
                c.kill()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
