"""Python relay vs Node relay (npm hyperdht + blind-relay, as blind-relay-service runs them), one run.

    python3 benchmarks/relay_bench.py [--bytes 67108864] [--setup 20] [--pending 1000] [--rounds 3] [--kernel]
                                      [--baseline REV|DIR [--baseline-env KEY=VAL]] [--json out.json]

Both relays run as their own processes on one loopback hyperdht testnet (npm `hyperdht/testnet`);
the peers are real Node hyperdht peers (benchmarks/js/relay_bench_peers.js) using client-side
`relayThrough` with punching disabled, so every byte crosses the relay. Measured per relay:

* connection setup: `connect()` → `open` of the relayed connection, and → first echoed byte;
* end-to-end relayed throughput (one direction, `--bytes`), and the relay's CPU seconds per GB
  relayed (psutil, relay process only);
* idle RSS after bootstrap, and RSS while `--pending` pairings wait for a partner
  (tests/interop/js/relay_flood.js, sessions of 50 pairings each, below the Python per-session cap).

Prints a Markdown table with Python/Node ratios (for README) and optionally JSON. `--baseline`
also runs another revision's relay (benchmarks/baseline.py) in the same rounds: a before/after
from one run, each beside Node.
The Node relay is told it is publicly reachable (`firewalled: false, ephemeral: false`), as a
relay on a public address becomes after dht-rpc's NAT check; on a loopback testnet that check
cannot conclude on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.baseline import Baseline, baseline, baseline_env  # noqa: E402
from benchmarks.udx_forward import machine_cpu  # noqa: E402
from tests.interop._relay_net import INTEROP, Testnet  # noqa: E402

BENCH_JS = ROOT / "benchmarks" / "js"


class Relay:
    """A relay process (Python or Node) with its key, port and psutil handle."""

    def __init__(self, kind: str, bootstrap: str, workdir: Path, other: Baseline | None = None) -> None:
        """`kind`: python, python-kernel, node, or baseline (`other`'s relay, as python)."""
        self.kind = kind
        if kind != "node":
            argv = [
                sys.executable if other is None else other.python,
                "-m",
                "relay",
                "--storage",
                str(workdir / "py-store"),
                "--port",
                "0",
                "--host",
                "127.0.0.1",
                "--bootstrap",
                bootstrap,
                "--metrics",
                "off",
                "--log-level",
                "warning",
                *(["--kernel-forwarding"] if kind == "python-kernel" else []),
            ]
            cwd = ROOT if other is None else other.tree
        else:
            opts = {
                "bootstrap": bootstrap.split(","),
                "host": "127.0.0.1",
                "dht": {"firewalled": False, "ephemeral": False},
            }
            argv = ["node", str(BENCH_JS / "relay_node_server.js"), json.dumps(opts)]
            cwd = INTEROP
        env = {**os.environ, **dict(other.env)} if other is not None and other.env else None
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if kind != "node" and line.startswith("Server listening on "):
                self.key = line.split()[-1]
                rt = json.loads((workdir / "py-store" / "relay-runtime.json").read_text())
                self.port = int(rt["port"])
                break
            if kind == "node" and line.startswith("{"):
                info = json.loads(line)
                self.key, self.port = info["key"], int(info["port"])
                break
        else:
            raise RuntimeError(f"{kind} relay exited before listening")
        self.ps = psutil.Process(self.proc.pid)

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return float(t.user + t.system)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def settle(relay: Relay, seconds: float = 2.0) -> None:
    """Let start-up work (bootstrap, announce) finish before an idle measurement."""
    time.sleep(seconds)


def run_peers(bootstrap: str, relay: Relay, setup: int, nbytes: int) -> dict[str, Any]:
    opts = {
        "bootstrap": bootstrap.split(","),
        "relay": relay.key,
        "relayPort": relay.port,
        "setup": setup,
        "bytes": nbytes,
    }
    res = subprocess.run(
        ["node", str(BENCH_JS / "relay_bench_peers.js"), json.dumps(opts)],
        cwd=INTEROP,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if res.returncode != 0:
        raise RuntimeError(f"bench peers failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def pending_rss(bootstrap: str, relay: Relay, pending: int) -> int:
    sessions = max(1, -(-pending // 50))
    opts = {"bootstrap": bootstrap.split(","), "relay": relay.key, "sessions": sessions, "pairs": 50, "hold": True}
    flood = subprocess.Popen(
        ["node", "js/relay_flood.js", json.dumps(opts)],
        cwd=INTEROP,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert flood.stdout is not None
        json.loads(flood.stdout.readline())
        time.sleep(2.0)  # the requests are written; give the relay time to take them in
        return relay.rss()
    finally:
        assert flood.stdin is not None
        flood.stdin.close()
        try:
            flood.wait(20)
        except subprocess.TimeoutExpired:
            flood.kill()


def measure(
    kind: str, bootstrap: str, args: argparse.Namespace, workdir: Path, other: Baseline | None = None
) -> dict[str, Any]:
    relay = Relay(kind, bootstrap, workdir, other if kind == "baseline" else None)
    try:
        settle(relay)
        idle = relay.rss()
        setup = run_peers(bootstrap, relay, args.setup, 0)
        cpu0, m0 = relay.cpu(), machine_cpu()
        tp = run_peers(bootstrap, relay, 0, args.bytes)
        cpu, machine = relay.cpu() - cpu0, machine_cpu() - m0
        busy_rss = relay.rss()
        pend = pending_rss(bootstrap, relay, args.pending)
        opens = [s["openMs"] for s in setup["setup"]]
        echoes = [s["firstEchoMs"] for s in setup["setup"]]
        return {
            "relay": kind,
            "relayed": setup["relayed"] and tp["relayed"],
            "setup_open_ms_median": statistics.median(opens),
            "setup_first_echo_ms_median": statistics.median(echoes),
            "setup_first_echo_ms_p90": sorted(echoes)[int(0.9 * (len(echoes) - 1))],
            "throughput_mb_s": tp["throughput"]["mbps"],
            "bytes": tp["throughput"]["bytes"],
            # CPU for the throughput run (which also includes one connection setup) per GB relayed
            "cpu_s_per_gb": cpu / (tp["throughput"]["bytes"] / 1e9),
            # the whole machine's (peers, testnet, relay, kernel): kernel forwarding's work is
            # not the relay process's, so only this total compares it fairly
            "machine_cpu_s_per_gb": machine / (tp["throughput"]["bytes"] / 1e9),
            "idle_rss_mb": idle / 2**20,
            "rss_after_transfer_mb": busy_rss / 2**20,
            "pending_rss_mb": pend / 2**20,
            "pending": args.pending,
        }
    finally:
        relay.stop()


ROWS = [
    ("connection setup, connect → open (median ms)", "setup_open_ms_median", "lower"),
    ("connection setup, connect → first echo (median ms)", "setup_first_echo_ms_median", "lower"),
    ("relayed throughput, end to end (MB/s)", "throughput_mb_s", "higher"),
    ("relay CPU-seconds per GB relayed", "cpu_s_per_gb", "lower"),
    ("machine CPU-seconds per GB relayed (every process and the kernel)", "machine_cpu_s_per_gb", "lower"),
    ("idle RSS (MB)", "idle_rss_mb", "lower"),
    ("RSS with {pending} pending pairings (MB)", "pending_rss_mb", "lower"),
]


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-metric median over rounds (numbers only; the rest from the first round)."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, float):
            out[key] = statistics.median(r[key] for r in runs)
    out["relayed"] = all(r["relayed"] for r in runs)
    return out


def table(
    py: dict[str, Any], nd: dict[str, Any], kern: dict[str, Any] | None = None, base: dict[str, Any] | None = None
) -> str:
    head = "| measure | Python relay | Node relay | Python / Node |"
    rule = "|---|---:|---:|---:|"
    if kern is not None:
        head += " Python --kernel-forwarding | --kernel-forwarding / Node |"
        rule += "---:|---:|"
    if base is not None:
        head += " baseline | baseline / Node |"
        rule += "---:|---:|"
    lines = [head, rule]
    for label, key, _better in ROWS:
        a, b = py[key], nd[key]
        row = f"| {label.format(pending=py['pending'])} | {a:.1f} | {b:.1f} | {a / b:.2f} |"
        for other in (kern, base):
            if other is not None:
                row += f" {other[key]:.1f} | {other[key] / b:.2f} |"
        lines.append(row)
    return "\n".join(lines)


def paired(runs: dict[str, list[dict[str, Any]]], kind: str) -> str:
    """Per round, `kind`'s relay CPU per GB and throughput over Node's of the same round, and
    the medians and spreads of those ratios: the figures a before/after compares."""
    cpu = [r["cpu_s_per_gb"] / n["cpu_s_per_gb"] for r, n in zip(runs[kind], runs["node"], strict=True)]
    tp = [r["throughput_mb_s"] / n["throughput_mb_s"] for r, n in zip(runs[kind], runs["node"], strict=True)]
    return (
        f"{kind} / Node per round: CPU per GB {' '.join(f'{x:.2f}' for x in cpu)} (median "
        f"{statistics.median(cpu):.2f}), throughput {' '.join(f'{x:.2f}' for x in tp)} "
        f"(median {statistics.median(tp):.2f})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", type=int, default=64 * 2**20, help="bytes for the throughput run (default 64 MiB)")
    p.add_argument("--setup", type=int, default=20, help="sequential connections for setup timing")
    p.add_argument("--pending", type=int, default=1000, help="pending pairings for the memory figure")
    p.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    p.add_argument("--only", choices=("python", "node"), default=None)
    p.add_argument("--rounds", type=int, default=1, help="repeat, alternating which relay goes first; medians")
    p.add_argument(
        "--kernel", action="store_true", help="also the Python relay with --kernel-forwarding (nftables, root)"
    )
    p.add_argument(
        "--baseline", default=None, help="also another revision's relay (a git revision or a checkout directory)"
    )
    p.add_argument("--baseline-env", action="append", metavar="KEY=VAL", help="set in the baseline relay's environment")
    args = p.parse_args()
    kinds = [k for k in ("python", "node") if not args.only or k == args.only]
    if args.kernel:
        kinds.append("python-kernel")
    if args.baseline:
        kinds.append("baseline")
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="relay-bench-") as tmp, Testnet("node", size=5) as tn:
        env = baseline_env(args.baseline_env)
        other = baseline(args.baseline, Path(tmp) / "baseline", env) if args.baseline else None
        for r in range(args.rounds):
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                res = measure(kind, tn.bootstrap, args, Path(tmp) / f"{kind}-{r}", other)
                res["load"] = os.getloadavg()[0]
                runs[kind].append(res)
                print(json.dumps(res), file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    results = {k: median_of(v) for k, v in runs.items()}
    if args.json:
        args.json.write_text(json.dumps({"medians": results, "runs": runs}, indent=2))
    if "python" in results and "node" in results:
        print(
            f"<!-- python3 benchmarks/relay_bench.py {shlex.join(sys.argv[1:])}; {os.cpu_count()} CPUs; "
            f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min) -->"
        )
        print(table(results["python"], results["node"], results.get("python-kernel"), results.get("baseline")))
        for kind in ("python", "baseline"):
            if kind in runs:
                print(paired(runs, kind))


if __name__ == "__main__":
    main()
