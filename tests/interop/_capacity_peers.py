"""A worker and its jobs, every connection held open through a relay (`js/relay_capacity_peers.js`).

Used by the capacity tests and `benchmarks/capacity.py`: `open(n)` adds n relayed connections
(each one session from the worker's address and one from a job's), `echo()` checks that every
open one still carries data, `status()` counts the ones that died and why.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any

from tests.interop._relay_net import INTEROP

TERMINAL = {"open": "opened", "echo": "echoed", "status": "status", "pairRaw": "rawDone"}


@dataclass
class Opened:
    ok: int
    failed: int
    pairs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def setup_ms(self) -> list[float]:
        return sorted(p["setupMs"] for p in self.pairs if p.get("ok"))

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [p for p in self.pairs if not p.get("ok")]


class CapacityPeers:
    """`with CapacityPeers(node, bootstrap, key, port, job_hosts=[...]) as peers: peers.open(100)`."""

    def __init__(
        self,
        node: str,
        bootstrap: str,
        relay_key: str,
        relay_port: int,
        *,
        worker_host: str = "127.0.0.1",
        job_hosts: list[str] | None = None,
    ) -> None:
        self.opts = {
            "bootstrap": bootstrap.split(","),
            "relay": relay_key,
            "relayPort": relay_port,
            "workerHost": worker_host,
            "jobHosts": job_hosts or ["127.0.0.1"],
        }
        self.node = node
        self.proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.pid = 0

    def __enter__(self) -> CapacityPeers:
        self.proc = subprocess.Popen(
            [self.node, "js/relay_capacity_peers.js", json.dumps(self.opts)],
            cwd=INTEROP,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid
        threading.Thread(target=self._read, daemon=True).start()
        ready = self._next(120)
        if ready.get("ev") != "ready":
            raise RuntimeError(f"relay_capacity_peers.js did not start: {ready}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self._lines.put(json.loads(line))
        self._lines.put(None)

    def _next(self, timeout: float) -> dict[str, Any]:
        item = self._lines.get(timeout=timeout)
        if item is None:
            err = self.proc.stderr.read() if self.proc is not None and self.proc.stderr is not None else ""
            raise RuntimeError(f"relay_capacity_peers.js exited: {err[-2000:]}")
        return item

    def command(self, op: str, timeout: float = 600, **args: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Send one command; returns its final event and the events before it."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        events: list[dict[str, Any]] = []
        while True:
            ev = self._next(timeout)
            if ev.get("ev") == "command-error":
                raise RuntimeError(f"{op}: {ev.get('message')}")
            if ev.get("ev") == TERMINAL[op]:
                return ev, events
            events.append(ev)

    def open(self, n: int, *, rate: float = 40, parallel: int = 64, timeout_ms: int = 30_000) -> Opened:
        done, pairs = self.command("open", n=n, rate=rate, parallel=parallel, timeout=timeout_ms)
        return Opened(done["ok"], done["failed"], pairs)

    def echo(self, size: int = 1000, timeout_ms: int = 30_000) -> dict[str, Any]:
        return self.command("echo", bytes=size, timeout=timeout_ms)[0]

    def status(self) -> dict[str, Any]:
        return self.command("status")[0]

    def pair_raw(self, n: int, timeout_ms: int = 20_000) -> list[dict[str, Any]]:
        """n pairings straight at the relay (npm blind-relay Client, two sessions each): one
        record per side with how long it took to pair or fail, and the error."""
        return self.command("pairRaw", n=n, timeout=timeout_ms)[1]
