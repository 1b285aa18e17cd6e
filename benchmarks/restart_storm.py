"""A planned restart under load: how fast N relayed pairs from one worker address come back.

    python3 benchmarks/restart_storm.py [--pairs 1000] [--worker-host 127.0.0.2] [--json]

Real hyperdht peers (`tests/interop/js/relay_restart_peers.js`: each pair reconnects as soon
as it closes, retrying every 250 ms, as a job agent does) hold N relayed connections through
our relay on a loopback testnet: every server end on one worker address, every client end on
another, so each address holds N sessions (the deployment's shape). Then the relay gets
SIGTERM, is started again on the same storage and port, and this reports:

- exit: seconds from SIGTERM to the relay's exit (and its code);
- notice: seconds from SIGTERM until each peer saw its connection close, and how (codes);
- storm: seconds from the relay being back ("Server listening") until each pair was relayed
  again (p50/p99/max), the reconnect attempts that failed meanwhile (a peer gives an attempt
  `attempt_timeout`, 15 s, hyperdht's own relay pairing timeout, then tries again), what the
  relay's handshake gates and backlog refused or shed during the storm, and the CPU the new
  relay spent from its start to the storm's end (`/stats`).

`restart_storm(pairs, ...)` is the function; `main()` prints it. Runs only on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from relay.service.runtime import RETURNING_FILE  # noqa: E402
from tests.interop._relay_net import Testnet  # noqa: E402
from tests.interop._relay_proc import RelayProcess, free_udp_port  # noqa: E402
from tests.interop._restart_peers import RestartPeers  # noqa: E402


class NodeRelay:
    """The Node yardstick (`benchmarks/js/relay_node_server.js`, hyperdht + blind-relay as
    blind-relay-service runs them) with a fixed key and port, so it can be restarted like ours."""

    def __init__(self, node: str, bootstrap: str, port: int, seed: str) -> None:
        self.argv = [node, str(ROOT / "benchmarks/js/relay_node_server.js")]
        self.opts = {
            "bootstrap": bootstrap.split(","),
            "port": port,
            "host": "127.0.0.1",
            "seed": seed,
            "dht": {"firewalled": False, "ephemeral": False},  # a public relay, as the other benchmarks start it
        }
        self.proc: subprocess.Popen[str] | None = None
        self.key: str | None = None
        self.stderr = ""

    def start(self) -> NodeRelay:
        self.proc = subprocess.Popen(
            [*self.argv, json.dumps(self.opts)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self.proc.stdout is not None
        self.key = json.loads(self.proc.stdout.readline())["key"]
        return self

    def terminate(self, sig: int = signal.SIGTERM, timeout: float = 120.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def stats(self) -> dict[str, Any]:
        assert self.proc is not None
        p = psutil.Process(self.proc.pid)
        cpu = p.cpu_times()
        return {"memory": {"rss_bytes": p.memory_info().rss}, "cpu_seconds": round(cpu.user + cpu.system, 2)}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def _gates(stats: dict[str, Any]) -> dict[str, int]:
    """What the handshake gates and backlog refused or shed (cumulative since start)."""
    rejected = stats["limits"]["rejected"]
    hs = stats["handshakes"]
    return {
        "handshakes_per_address": int(rejected.get("handshakes_per_address", 0)),
        "handshakes_busy": int(rejected.get("handshakes_busy", 0)),
        "sessions_refused": int(rejected.get("sessions", 0)),
        "backlog_waited": int(hs.get("waited", 0)),
        "backlog_shed_stale": int(hs.get("shed_stale", 0)),
        "backlog_shed_full": int(hs.get("shed_full", 0)),
        "handshakes_accepted": int(hs.get("accepted", 0)),
    }


def restart_storm(
    pairs: int = 1000,
    *,
    node: str = "node",
    worker_host: str = "127.0.0.2",
    job_host: str = "127.0.0.1",
    attempt_timeout: float = 15.0,
    setup_timeout: float = 600.0,
    storm_timeout: float = 600.0,
    relay_args: tuple[str, ...] = (),
    forget_peers: bool = False,
    relay: str = "python",
) -> dict[str, Any]:
    """Open `pairs` relayed pairs, restart the relay, measure the way back (see the module).
    `relay="node"`: the Node relay instead (no /stats: gates not reported).
    `forget_peers`: remove the stop's record of who was connected before the restart, so the
    storm meets the handshake gates as a flood of strangers would (the behaviour without it)."""
    with tempfile.TemporaryDirectory(prefix="restart-storm-") as tmp, Testnet(node, size=3) as tn:
        storage = Path(tmp) / "relay"
        port = free_udp_port()
        first: RelayProcess | NodeRelay
        second: RelayProcess | NodeRelay
        if relay == "node":
            seed = os.urandom(32).hex()
            first, second = NodeRelay(node, tn.bootstrap, port, seed), NodeRelay(node, tn.bootstrap, port, seed)
        else:
            first = RelayProcess(storage, *relay_args, port=port, host="0.0.0.0", bootstrap=tn.bootstrap)
            second = RelayProcess(storage, *relay_args, port=port, host="0.0.0.0", bootstrap=tn.bootstrap)
        peers: RestartPeers | None = None
        try:
            first.start()
            assert first.key is not None, first.stderr
            t0 = time.time()
            peers = RestartPeers(
                node,
                tn.bootstrap,
                first.key,
                port,
                pairs,
                serverHost=worker_host,
                clientHost=job_host,
                timeout=int(attempt_timeout * 1000),
            )
            p = peers
            p.wait_for("every pair up", lambda: len(p.since(0, "up")) == pairs, setup_timeout)
            setup = time.time() - t0
            relayed = sum(1 for e in p.since(0, "up").values() if e["relayed"])
            before = first.stats()
            rss_before = before["memory"]["rss_bytes"]

            stopped = time.time()
            code = first.terminate(signal.SIGTERM, timeout=120)
            exit_s = time.time() - stopped
            p.wait_for(
                "every end closed",
                lambda: (
                    len(p.since(stopped, "down", "client")) == pairs
                    and len(p.since(stopped, "down", "server")) == pairs
                ),
                storm_timeout,
            )
            downs = [*p.since(stopped, "down", "client").values(), *p.since(stopped, "down", "server").values()]
            notice = [e["t"] / 1000 - stopped for e in downs]

            if forget_peers:
                (storage / RETURNING_FILE).unlink(missing_ok=True)
            second.start()
            back = time.time()
            p.wait_for("every pair relayed again", lambda: len(p.since(stopped, "up")) == pairs, storm_timeout)
            ups = p.since(stopped, "up")
            storm = [e["t"] / 1000 - back for e in ups.values()]
            failed = p.of("failed", stopped)
            after = second.stats()
            second.terminate(signal.SIGTERM, timeout=120)
            return {
                "pairs": pairs,
                "forget_peers": forget_peers,
                "worker_host": worker_host,
                "job_host": job_host,
                "setup_seconds": round(setup, 2),
                "relayed_before": relayed,
                "rss_mb_before": round(rss_before / 2**20, 1),
                "exit_code": code,
                "exit_seconds": round(exit_s, 2),
                "notice_p50": round(_pct(notice, 0.5), 3),
                "notice_max": round(max(notice), 3),
                "close_codes": dict(Counter(str(e["code"]) for e in downs)),
                "relayed_again": sum(1 for e in ups.values() if e["relayed"]),
                "storm_p50": round(_pct(storm, 0.5), 2),
                "storm_p99": round(_pct(storm, 0.99), 2),
                "storm_max": round(max(storm), 2),
                "first_back": round(min(storm), 2),
                "failed_attempts": len(failed),
                "failed_codes": dict(Counter(str(e["code"]) for e in failed)),
                "gates_after_restart": _gates(after) if relay == "python" else None,
                "rss_mb_after": round(after["memory"]["rss_bytes"] / 2**20, 1),
                "relay_cpu_seconds_storm": after["cpu_seconds"],
                "sessions_after": after["capacity"]["sessions"] if "capacity" in after else None,
                "relay": relay,
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "storm_mean": round(statistics.fmean(storm), 2),
            }
        finally:
            if peers is not None:
                peers.close()
            first.stop()
            second.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=1000)
    ap.add_argument("--worker-host", default="127.0.0.2", help="address of every server end (default 127.0.0.2)")
    ap.add_argument("--job-host", default="127.0.0.1", help="address of every client end (default 127.0.0.1)")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    ap.add_argument(
        "--forget-peers", action="store_true", help="drop the record of who was connected (gates as for strangers)"
    )
    ap.add_argument("--relay", choices=("python", "node"), default="python", help="whose relay (default ours)")
    ap.add_argument("relay_args", nargs="*", help="extra relay flags, after --")
    a = ap.parse_args()
    r = restart_storm(
        a.pairs,
        worker_host=a.worker_host,
        job_host=a.job_host,
        relay_args=tuple(a.relay_args),
        forget_peers=a.forget_peers,
        relay=a.relay,
    )
    if a.json:
        print(json.dumps(r))
        return
    for k, v in r.items():
        print(f"{k:>22}: {v}")


if __name__ == "__main__":
    main()
