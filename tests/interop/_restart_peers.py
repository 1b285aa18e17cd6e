"""Real hyperdht peers holding relayed connections that reconnect as soon as one closes
(`js/relay_restart_peers.js`), run in the background with their events collected: the restart
test and `benchmarks/restart_storm.py` read when each pair went down, how, and when it was
relayed again."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

INTEROP = Path(__file__).resolve().parent
WAIT = 90.0


class RestartPeers:
    """`js/relay_restart_peers.js` in the background; its JSON lines collected as they come."""

    def __init__(self, node: str, bootstrap: str, relay_key: str, relay_port: int, pairs: int, **options: Any) -> None:
        """`options` go to the script as they are: serverHost/clientHost (the address each side's
        DHT node binds, default 127.0.0.1), retryMs, bytes, timeout."""
        opts = {"bootstrap": bootstrap.split(","), "relay": relay_key, "relayPort": relay_port, "pairs": pairs}
        opts.update(options)
        self.proc = subprocess.Popen(
            [node, "js/relay_restart_peers.js", json.dumps(opts)],
            cwd=INTEROP,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                with self._lock:
                    self.events.append(json.loads(line))

    def of(self, event: str, t: float = 0.0) -> list[dict[str, Any]]:
        """Every `event` at or after `t`."""
        with self._lock:
            return [e for e in self.events if e["event"] == event and e["t"] / 1000 >= t]

    def tally(self, t: float = 0.0) -> dict[str, int]:
        """How many events of each kind (event/side/code) at or after `t`, to say where a wait stuck."""
        out: dict[str, int] = {}
        with self._lock:
            for e in self.events:
                if e["t"] / 1000 >= t:
                    k = "/".join(str(e[f]) for f in ("event", "side", "code") if e.get(f) is not None)
                    out[k] = out.get(k, 0) + 1
        return out

    def since(self, t: float, event: str, side: str | None = None) -> dict[int, dict[str, Any]]:
        """The first `event` of each pair at or after `t` (seconds since the epoch)."""
        first: dict[int, dict[str, Any]] = {}
        with self._lock:
            for e in self.events:
                ok = e["event"] == event and e["t"] / 1000 >= t and (side is None or e.get("side") == side)
                if ok and e.get("i") is not None:
                    first.setdefault(e["i"], e)
        return first

    def wait_for(self, what: str, done: Callable[[], bool], timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if self.proc.poll() is not None:
                raise AssertionError(f"peers exited ({self.proc.returncode}) waiting for {what}: {self.stderr()}")
            if time.monotonic() > deadline:
                with self._lock:
                    tail = self.events[-5:]
                raise AssertionError(f"peers: no {what} within {timeout:g}s; all events: {self.tally()}; last: {tail}")
            time.sleep(0.05)

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr is not None and self.proc.poll() is not None else ""

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
