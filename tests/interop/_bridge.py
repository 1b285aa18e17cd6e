"""The real npm hyperdht-prometheus-bridge (2.1.1) as a child process on a loopback testnet.

`Bridge(node, bootstrap_port, secret_hex, seed_hex, targets)` runs its `run.js` with the
environment variables its README documents; `start()` returns once it logged its DHT key.
Every process started here is killed by `stop()`.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

from tests.interop._relay_proc import free_tcp_port

INTEROP = Path(__file__).resolve().parent
RUN_JS = INTEROP / "node_modules" / "hyperdht-prometheus-bridge" / "run.js"


class Bridge:
    def __init__(self, node: str, bootstrap_port: int, secret: str, seed: str, targets: Path) -> None:
        self.node = node
        self.http_port = free_tcp_port()
        self.targets = targets
        self.env = {
            **os.environ,
            "HYPERDHT_PROM_SHARED_SECRET": secret,
            "HYPERDHT_PROM_KEY_PAIR_SEED": seed,
            "HYPERDHT_PROM_BOOTSTRAP_PORT": str(bootstrap_port),
            "HYPERDHT_PROM_HTTP_PORT": str(self.http_port),
            "HYPERDHT_PROM_HTTP_HOST": "127.0.0.1",
            "HYPERDHT_PROM_PROMETHEUS_TARGETS_LOC": str(targets),
            "HYPERDHT_PROM_LOG_LEVEL": "info",
        }
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.key: str | None = None

    def start(self, timeout: float = 60.0) -> Bridge:
        self.proc = subprocess.Popen(
            [self.node, str(RUN_JS)],
            cwd=INTEROP,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()
        while self.key is None:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"the bridge did not start within {timeout}s: {self.lines}") from None
            if line is None:
                raise RuntimeError(f"the bridge exited: {self.lines}")
            msg = _msg(line)
            if msg.startswith("DHT RPC ready at public key "):
                self.key = msg.rsplit(" ", 1)[1]
        return self

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._lines.put(line)
        self._lines.put(None)

    def messages(self) -> list[str]:
        return [_msg(ln) for ln in list(self.lines)]

    def scrape(self, alias: str) -> tuple[int, str]:
        """GET /scrape/<alias>/metrics: (status, body)."""
        url = f"http://127.0.0.1:{self.http_port}/scrape/{alias}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def targets_list(self) -> list[str]:
        try:
            return list(json.loads(self.targets.read_text())[0]["targets"])
        except (OSError, ValueError, LookupError):
            return []

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> Bridge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _msg(line: str) -> str:
    try:
        return str(json.loads(line).get("msg", ""))
    except ValueError:
        return line.strip()


def parse_samples(text: str) -> dict[str, float]:
    """Prometheus text -> {name{labels}: value} (comments skipped)."""
    out: dict[str, float] = {}
    for ln in text.splitlines():
        if not ln or ln.startswith("#"):
            continue
        name, _, value = ln.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out
