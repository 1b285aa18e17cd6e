"""A loopback hyperdht testnet and real Node peers for the relay tests (and the benchmarks).

`Testnet` runs `js/relay_testnet.js` (npm `hyperdht/testnet`, host 127.0.0.1, free ports) and
stops when its stdin closes, so a crashed test never leaves it behind. `run_peers` runs
`js/relay_peers.js`: a hyperdht server and client that connect through a relay and echo.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INTEROP = Path(__file__).resolve().parent


class Testnet:
    __test__ = False  # not a pytest class
    """`with Testnet(node, size) as tn: tn.bootstrap` -> "127.0.0.1:port"; `port` fixes the
    bootstrap node's port (for a relay started before its DHT)."""

    def __init__(self, node: str, size: int = 5, port: int | None = None) -> None:
        self.node = node
        self.size = size
        self.port = port
        self.proc: subprocess.Popen[str] | None = None
        self.bootstrap = ""

    def start(self) -> Testnet:
        self.proc = subprocess.Popen(
            [self.node, "js/relay_testnet.js", str(self.size), *([str(self.port)] if self.port else [])],
            cwd=INTEROP,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until the testnet is up (or the process died)
        if not line:
            raise RuntimeError(f"relay_testnet.js exited with {self.proc.wait(10)}")
        self.bootstrap = ",".join(f"{b['host']}:{b['port']}" for b in json.loads(line)["bootstrap"])
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> Testnet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class PeersResult:
    pairs: list[dict[str, Any]]
    summary: dict[str, Any]
    returncode: int
    stderr: str

    @property
    def all_ok(self) -> bool:
        return self.returncode == 0 and self.summary.get("failed") == 0 and len(self.pairs) > 0


def run_peers(
    node: str,
    bootstrap: str,
    relay_key: str,
    relay_port: int,
    mode: str = "client",
    *,
    pairs: int = 1,
    size: int = 200_000,
    seed: str | None = None,
    timeout_ms: int = 30_000,
    process_timeout: float = 120,
) -> PeersResult:
    """Run Node peers connecting through the relay; one record per pair (see js/relay_peers.js)."""
    opts: dict[str, Any] = {
        "bootstrap": bootstrap.split(","),
        "relay": relay_key,
        "relayPort": relay_port,
        "mode": mode,
        "pairs": pairs,
        "bytes": size,
        "timeout": timeout_ms,
    }
    if seed is not None:
        opts["seed"] = seed
    res = subprocess.run(
        [node, "js/relay_peers.js", json.dumps(opts)],
        cwd=INTEROP,
        capture_output=True,
        text=True,
        timeout=process_timeout,
    )
    records = [json.loads(ln) for ln in res.stdout.splitlines() if ln.startswith("{")]
    summary = next((r for r in records if r.get("done")), {})
    return PeersResult([r for r in records if "i" in r], summary, res.returncode, res.stderr)
