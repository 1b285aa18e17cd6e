"""Run the Python relay as its own process (`python -m relay`), as operators do, and talk to it.

Reads stdout on a thread so waiting for `Server listening on …` is an event wait with a
generous safety timeout, never a sleep. Every process started here is killed by `stop()`.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0
DEFAULT_METRICS = "default"  # metrics=DEFAULT_METRICS: no --metrics flag, as an operator starts it


def free_udp_port(host: str = "127.0.0.1") -> int:
    """A UDP port that was free a moment ago (the relay must bind the port it prints in runtime.json)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_tcp_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class RelayProcess:
    """One `python -m relay` child; `start()` returns once it printed its key (or exited)."""

    def __init__(
        self,
        storage: Path,
        *args: str,
        port: int = 0,
        metrics: str | None = "127.0.0.1:0",
        host: str = "127.0.0.1",
        bootstrap: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.storage = Path(storage)
        self.argv = [
            sys.executable,
            "-m",
            "relay",
            "--storage",
            str(storage),
            "--port",
            str(port),
            "--host",
            host,
        ]
        if metrics != DEFAULT_METRICS:
            self.argv += ["--metrics", metrics or "off"]
        if not bootstrap:
            raise ValueError("tests must give the relay a loopback --bootstrap (never the public DHT)")
        self.argv += ["--bootstrap", bootstrap]
        self.argv += list(args)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.stdout_lines: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.key: str | None = None
        self.runtime: dict[str, Any] | None = None

    def start(self, timeout: float = START_TIMEOUT) -> RelayProcess:
        self.proc = subprocess.Popen(
            self.argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env
        )
        threading.Thread(target=self._pump, daemon=True).start()
        self.stderr_chunks: list[str] = []
        threading.Thread(target=self._pump_err, daemon=True).start()
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"relay did not print its key within {timeout}s; stderr: {self.stderr}") from None
            if line is None:
                return self  # exited before listening; caller inspects returncode/stderr
            if line.startswith("Server listening on "):
                self.key = line.split()[-1]
                self.runtime = json.loads((self.storage / "relay-runtime.json").read_text())
                return self

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.stdout_lines.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def _pump_err(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_chunks.append(line)

    @property
    def stderr(self) -> str:
        return "".join(getattr(self, "stderr_chunks", []))

    @property
    def port(self) -> int:
        assert self.runtime is not None
        return int(self.runtime["port"])

    @property
    def metrics_url(self) -> str:
        assert self.runtime is not None and self.runtime["metrics"]
        return str(self.runtime["metrics"])

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.metrics_url + path, timeout=10) as r:
            return r.read()

    def stats(self) -> dict[str, Any]:
        return json.loads(self.get("/stats"))

    def kernel_drops(self) -> int:
        """Datagrams the kernel dropped at the relay's port (its socket buffer was full): the
        relay never saw them, so no counter of its own can include them (/proc/net/udp)."""
        total = 0
        for table in ("/proc/net/udp", "/proc/net/udp6"):
            with open(table) as f:
                for line in f.readlines()[1:]:
                    fields = line.split()
                    if int(fields[1].rsplit(":", 1)[1], 16) == self.port:
                        total += int(fields[-1])
        return total

    def wait(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def terminate(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.wait(timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> RelayProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
