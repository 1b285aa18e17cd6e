"""Real Node peers for the client tests: `js/client_peers.js` (hyperdht servers and clients that
echo) and the Node blind relay (`benchmarks/js/relay_node_server.js`, npm hyperdht + blind-relay as
blind-relay-service runs them). Sync, thread-read processes so module fixtures can share them;
async tests call them with `asyncio.to_thread`. Every process started here is stopped by `stop()`.
"""

from __future__ import annotations

import itertools
import json
import queue
import subprocess
import threading
from pathlib import Path
from typing import Any

INTEROP = Path(__file__).resolve().parent
ROOT = INTEROP.parents[1]
NODE_RELAY_JS = ROOT / "benchmarks" / "js" / "relay_node_server.js"


class _LineProcess:
    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                continue
        self.lines.put(None)

    def first(self, timeout: float = 60) -> dict[str, Any]:
        line = self.lines.get(timeout=timeout)
        if line is None:
            raise RuntimeError(f"{self.proc.args} exited with {self.proc.wait(10)}")
        return line

    def stop(self) -> None:
        if self.proc.poll() is None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class NodePeers(_LineProcess):
    """`client_peers.js` on a bootstrap list; `call(cmd, **args)` returns its result dict."""

    def __init__(self, node: str, bootstrap: str) -> None:
        boot = bootstrap.split(",")
        super().__init__([node, "js/client_peers.js", json.dumps({"bootstrap": boot})], INTEROP)
        self.first()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._results: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        threading.Thread(target=self._route, daemon=True).start()

    def _route(self) -> None:
        while (ev := self.lines.get()) is not None:
            with self._cond:
                self._results[int(ev.get("id", 0))] = ev
                self._cond.notify_all()

    def call(self, cmd: str, timeout: float = 60, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        with self._lock:
            i = next(self._ids)
            self.proc.stdin.write(json.dumps({"id": i, "cmd": cmd, **args}) + "\n")
            self.proc.stdin.flush()
        with self._cond:
            if not self._cond.wait_for(lambda: i in self._results, timeout):
                raise TimeoutError(f"client_peers.js: {cmd} gave no answer in {timeout}s")
            return self._results.pop(i)


class NodeRelay(_LineProcess):
    """The Node blind relay on the testnet: `.key` (z32), `.port`, `.ports` (both its sockets:
    a peer it reached by hole punching talks to its client socket)."""

    def __init__(self, node: str, bootstrap: str) -> None:
        # a relay is a public host (blind-relay-service's premise); on the loopback testnet Node
        # only learns that after its own firewall check, which may come after the tests start
        opts = {"bootstrap": bootstrap.split(","), "host": "127.0.0.1", "dht": {"firewalled": False}}
        super().__init__([node, str(NODE_RELAY_JS), json.dumps(opts)], ROOT)
        info = self.first()
        self.key: str = info["key"]
        self.port: int = int(info["port"])
        self.ports: set[int] = {int(p) for p in info["ports"]}  # its server and client sockets
