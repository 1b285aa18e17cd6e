"""A real relay process for the monitor's tests, started the way the wizard starts it:
`python -m relay` detached, stdout/stderr appended to `<storage>/blind-relay.log`.

Waiting is on conditions (runtime file written, process gone) with generous safety timeouts.
Every process started here is killed by `stop()` (the fixture's teardown).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
INTEROP = ROOT / "tests" / "interop"
SAFETY = 60.0


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond: Callable[[], Any], what: str, timeout: float = SAFETY) -> Any:
    """Poll a cheap condition until it holds; the timeout is a safety net, not a speed claim."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout}s for {what}")
        time.sleep(0.02)


class NodeTestnet:
    """A hyperdht testnet from npm (tests/interop/js/dht_testnet.js) for the relay to join:
    since the relay announces itself on the DHT, it refuses to start without one."""

    def __init__(self, node: str, size: int = 3) -> None:
        self.proc = subprocess.Popen(
            [node, str(INTEROP / "js" / "dht_testnet.js"), str(size)],
            cwd=INTEROP,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until ready (or EOF if node failed)
        if not line:
            self.stop()
            raise RuntimeError("the Node testnet exited before it was ready")
        ready = json.loads(line)
        self.bootstrap = ",".join(f"{b['host']}:{b['port']}" for b in ready["bootstrap"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(SAFETY)


class MonitoredRelay:
    """`python -m relay --storage S --port 0 --host 127.0.0.1 --metrics …` with a log file."""

    def __init__(self, storage: Path, bootstrap: str, metrics: str = "127.0.0.1:0") -> None:
        self.storage = Path(storage)
        self.metrics = metrics
        self.bootstrap = bootstrap  # a loopback testnet: the relay never reaches public nodes
        self.proc: subprocess.Popen[bytes] | None = None
        self.runtime: dict[str, Any] = {}

    @property
    def log(self) -> Path:
        return self.storage / "blind-relay.log"

    @property
    def runtime_file(self) -> Path:
        return self.storage / "relay-runtime.json"

    def start(self) -> MonitoredRelay:
        self.storage.mkdir(parents=True, exist_ok=True)
        self.runtime_file.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "relay", "--storage", str(self.storage), "--port", "0", "--host", "127.0.0.1"]
        argv += ["--metrics", self.metrics, "--bootstrap", self.bootstrap]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )
        proc = self.proc

        def ready() -> dict[str, Any] | None:
            if proc.poll() is not None:
                raise RuntimeError(f"relay exited {proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                rt = json.loads(self.runtime_file.read_text())
            except (OSError, ValueError):
                return None
            return rt if rt.get("pid") == proc.pid else None

        self.runtime = wait_for(ready, "the relay's runtime file")
        return self

    @property
    def key(self) -> str:
        return str(self.runtime["key"])

    @property
    def metrics_url(self) -> str:
        return str(self.runtime["metrics"])

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(SAFETY)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(SAFETY)
