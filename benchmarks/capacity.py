"""How many relayed connections each relay holds open under the memory budget, side by side.

    python3 benchmarks/capacity.py [--pairs 4000] [--shape worker,spread] [--rate 25] [--relays python,node]
                                   [--json out.json]

The deployment's shape: one worker (a hyperdht server on 127.0.0.1) and jobs connecting to it,
every connection through the relay and held open (`tests/interop/js/relay_capacity_peers.js`).
hyperdht opens one relay connection per side of each relayed connection, so each is two relay
sessions: one from the worker's address, one from the job's. Shapes: `worker` = all jobs on one
more address (one address holds every worker session, another every job session); `spread` =
jobs over 64 addresses (127.0.0.10-73). Relays: ours (`python -m relay`, default limits) and the
Node relay built from npm hyperdht + blind-relay as blind-relay-service runs them
(benchmarks/js/relay_node_server.js), each fresh on its own loopback testnet.

Connections start at `--rate` per second (ours lets a busy address hand it 64 handshakes a second
relay-wide, and each connection is two of them). Measured per relay: connections open, setup time
(connect -> open) p50/p99, failures and why, whether every open one then echoes, the relay's RSS
and open fds with them all open, and for ours what its counters say (refused, shed). `--then`
runs follow-up measurements on the same open connections (see `FOLLOW_UPS`). Prints a Markdown
table and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.relay_bench import Relay as NodeOrPythonRelay  # noqa: E402
from tests.interop._capacity_peers import CapacityPeers, Opened  # noqa: E402
from tests.interop._relay_net import Testnet  # noqa: E402
from tests.interop._relay_proc import RelayProcess  # noqa: E402

MB = 2**20
SHAPES = {
    "worker": ["127.0.0.2"],
    "spread": [f"127.0.0.{i}" for i in range(10, 74)],
}


@dataclass
class Run:
    """One relay holding one shape's connections: what a follow-up measurement may use."""

    kind: str
    shape: str
    bootstrap: str
    key: str
    port: int
    pid: int
    peers: CapacityPeers
    workdir: Path
    relay: Any
    result: dict[str, Any] = field(default_factory=dict)


#: Follow-up measurements, by name, run on a `Run` once every connection is open and echoed; each
#: returns columns for the table (e.g. how long the open connections take to come back after the
#: relay restarts). Selected with `--then NAME`.
FOLLOW_UPS: dict[str, Callable[[Run], dict[str, Any]]] = {}


class PeakRSS:
    """Samples a process's RSS every 0.25 s in a thread; `peak` is the largest seen."""

    def __init__(self, pid: int) -> None:
        self.ps = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.ps.memory_info().rss)
            except psutil.Error:
                return
            self._stop.wait(0.25)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


def start_relay(kind: str, bootstrap: str, workdir: Path) -> tuple[Any, str, int, int]:
    """(handle, key, port, pid) of a fresh relay on the testnet."""
    if kind == "python":
        r = RelayProcess(workdir / "py-store", "--log-level", "warning", bootstrap=bootstrap)
        r.start()
        assert r.key is not None and r.proc is not None, r.stderr[-2000:]
        return r, r.key, r.port, r.proc.pid
    n = NodeOrPythonRelay("node", bootstrap, workdir)
    return n, n.key, n.port, n.proc.pid


def measure(kind: str, shape: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"capacity-{kind}-") as tmp, Testnet("node", size=4) as tn:
        workdir = Path(tmp)
        relay, key, port, pid = start_relay(kind, tn.bootstrap, workdir)
        ps = psutil.Process(pid)
        try:
            time.sleep(2)  # start-up work (bootstrap, announce) done before the idle figure
            rss_idle = ps.memory_info().rss
            with (
                CapacityPeers("node", tn.bootstrap, key, port, job_hosts=SHAPES[shape]) as peers,
                PeakRSS(pid) as peak,
            ):
                t0 = time.monotonic()
                opened: Opened = peers.open(args.pairs, rate=args.rate, parallel=args.parallel)
                open_s = time.monotonic() - t0
                rss_open = ps.memory_info().rss
                fds = ps.num_fds()
                echoed = peers.echo(size=1000, timeout_ms=60_000)
                status = peers.status()
                setup = opened.setup_ms
                errors = Counter(p.get("error", "?") for p in opened.failures)
                out: dict[str, Any] = {
                    "relay": kind,
                    "shape": shape,
                    "asked": args.pairs,
                    "open": opened.ok,
                    "failed": opened.failed,
                    "errors": dict(errors.most_common(3)),
                    "open_seconds": round(open_s, 1),
                    "setup_p50_ms": round(percentile(setup, 50), 1),
                    "setup_p99_ms": round(percentile(setup, 99), 1),
                    "echoed": echoed["ok"],
                    "echo_failed": echoed["failed"],
                    "died": status["closed"],
                    "died_of": status.get("errors", {}),
                    "echo_errors": echoed.get("errors", {}),
                    "relay_cpu_seconds": round(sum(ps.cpu_times()[:2]), 1),
                    "rss_idle_mb": round(rss_idle / MB, 1),
                    "rss_open_mb": round(rss_open / MB, 1),
                    "rss_peak_mb": round(max(peak.peak, rss_open) / MB, 1),
                    "fds": fds,
                }
                if kind == "python":
                    s = relay.stats()
                    out["relay_counters"] = {
                        "sessions": s["capacity"]["sessions"],
                        "active_pairs": s["capacity"]["active_pairs"],
                        "refused": s["capacity"]["refused_sessions"] + s["capacity"]["refused_pairings"],
                        "shed": {k: v for k, v in s["shed"].items() if v},
                        "dropped": {k: v for k, v in s["dropped"].items() if v},
                        "kernel_drops": relay.kernel_drops(),
                        "pauses": s.get("pauses"),
                        "socket": s.get("socket"),
                        "handshakes_refused": s["limits"]["rejected"].get("handshakes_busy", 0)
                        + s["limits"]["rejected"].get("handshakes_per_address", 0),
                    }
                run = Run(kind, shape, tn.bootstrap, key, port, pid, peers, workdir, relay, out)
                for name in args.then:
                    out |= FOLLOW_UPS[name](run)
                return out
        finally:
            relay.stop()


def table(rows: list[dict[str, Any]]) -> str:
    extra = [k for r in rows for k in r if k.startswith("then_")]
    head = [
        "relay",
        "shape",
        "open / asked",
        "setup p50 / p99 ms",
        "echoed",
        "died",
        "RSS idle -> open (peak) MB",
        "fds",
        *dict.fromkeys(extra),
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            "ours" if r["relay"] == "python" else "Node",
            r["shape"],
            f"{r['open']:,} / {r['asked']:,}",
            f"{r['setup_p50_ms']} / {r['setup_p99_ms']}",
            f"{r['echoed']:,}",
            str(r["died"]),
            f"{r['rss_idle_mb']} -> {r['rss_open_mb']} ({r['rss_peak_mb']})",
            str(r["fds"]),
            *(str(r.get(k, "")) for k in dict.fromkeys(extra)),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=4000, help="relayed connections to open (default 4000)")
    ap.add_argument("--shape", default="worker,spread", help="worker, spread or both (comma-separated)")
    ap.add_argument("--relays", default="python,node", help="python, node or both (comma-separated)")
    ap.add_argument("--rate", type=float, default=25.0, help="connections started per second (default 25)")
    ap.add_argument("--parallel", type=int, default=64, help="connections setting up at once (default 64)")
    ap.add_argument("--then", action="append", default=[], choices=sorted(FOLLOW_UPS) or None, metavar="NAME")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args()
    rows = []
    load_before = os.getloadavg()
    for shape in args.shape.split(","):
        for kind in args.relays.split(","):
            print(f"-- {kind} relay, {shape} shape, {args.pairs} connections at {args.rate}/s", file=sys.stderr)
            row = measure(kind, shape, args)
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
    load_after = os.getloadavg()
    print(table(rows))
    print(f"\nload average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min); {os.cpu_count()} cores")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
