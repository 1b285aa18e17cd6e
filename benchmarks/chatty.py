"""Small messages through the relay: Python relay vs Node relay side by side, in one run.

    python3 benchmarks/chatty.py [--pairs 1,32] [--seconds 8] [--size 256] [--rounds 3] [--kernel]
                                 [--baseline REV|DIR] [--job-rate 20] [--memory-mb 200] [--json out.json]

Job agents talk to their workers in small messages (status updates, RPCs, keystrokes), so what a
relay costs per message matters more than its bulk throughput. Each relay runs as its own process
on one loopback hyperdht testnet (npm `hyperdht/testnet`); N pairs of real Node hyperdht peers
(benchmarks/js/chatty_peers.js, client-side `relayThrough`, punching off, so every byte crosses the
relay) each do `--size`-byte request/response round trips for `--seconds`. Per relay and pair
count: the relay process's CPU ms per 1,000 round trips (psutil), round trips per second, RTT
p50/p99, and the relay's RSS. Rounds alternate which relay goes first; the table shows medians.

The capacity line turns that into what an operator plans with: jobs per core = one core's second
divided by the relay CPU one job costs per second at `--job-rate` round trips per second; jobs
under `--memory-mb` = the room above the idle RSS divided by the RSS one open pair added (from the
largest pair count). A relay carries the smaller of the two. `--baseline` also runs another
revision's relay (benchmarks/baseline.py) in the same rounds, and prints each Python relay's
per-round ratios to the Node relay of the same round.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.baseline import Baseline, baseline, baseline_env  # noqa: E402
from benchmarks.relay_bench import Relay, settle  # noqa: E402
from benchmarks.udx_forward import machine_cpu  # noqa: E402
from relay.udx.nft import NFPROTO_INET, Nft, NftError, read_counters  # noqa: E402
from tests.interop._relay_net import INTEROP, Testnet  # noqa: E402

CHATTY_JS = ROOT / "benchmarks" / "js" / "chatty_peers.js"
LABELS = {
    "python": "ours",
    "python-kernel": "ours, --kernel-forwarding",
    "node": "Node (hyperdht + blind-relay)",
    "baseline": "baseline",
}


class PacketCount:
    """Datagrams sent to the relay's port, counted by nftables before anything else sees them
    (before kernel forwarding's rewrite too): the packets a round trip costs on the wire, data and
    ACKs, whichever path carries them. Needs root; without it the column says so. The table is the
    process's own (`flags owner`): it goes when the benchmark exits."""

    def __init__(self, port: int) -> None:
        self.table = f"chatty_bench_{os.getpid()}_{port}"
        self.nft: Nft | None = None
        try:
            nft = Nft()
            nft.run(
                f"table inet {self.table} {{\n  flags owner\n  counter to_relay {{ }}\n"
                "  chain pre {\n    type filter hook prerouting priority -400; policy accept;\n"
                f'    udp dport {port} counter name "to_relay"\n  }}\n}}'
            )
            self.nft = nft
        except NftError:
            pass

    def read(self) -> int | None:
        if self.nft is None:
            return None
        try:
            return read_counters(self.table, NFPROTO_INET).get("to_relay", (0, 0))[0]
        except NftError:
            return None

    def close(self) -> None:
        if self.nft is not None:
            self.nft.close()


def run_chatty(bootstrap: str, relay: Relay, pairs: int, size: int, seconds: float) -> dict[str, Any]:
    """One chatty run: open `pairs` relayed connections, then measure the relay over the window."""
    opts = {
        "bootstrap": bootstrap.split(","),
        "relay": relay.key,
        "relayPort": relay.port,
        "pairs": pairs,
        "size": size,
        "seconds": seconds,
    }
    peers = subprocess.Popen(
        ["node", str(CHATTY_JS), json.dumps(opts)],
        cwd=INTEROP,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert peers.stdin is not None and peers.stdout is not None
    try:
        ready_line = peers.stdout.readline()
        if not ready_line:
            raise RuntimeError(f"chatty peers failed: {peers.communicate(timeout=30)[1][-2000:]}")
        ready = json.loads(ready_line)
        counted = PacketCount(relay.port)
        cpu0, m0, n0 = relay.cpu(), machine_cpu(), counted.read()
        peers.stdin.write("go\n")
        peers.stdin.flush()
        done_line = peers.stdout.readline()
        cpu, machine, n1 = relay.cpu() - cpu0, machine_cpu() - m0, counted.read()
        counted.close()
        rss = relay.rss()
        if not done_line:
            raise RuntimeError(f"chatty peers failed: {peers.communicate(timeout=30)[1][-2000:]}")
        res = json.loads(peers.stdout.readline())
        peers.wait(60)
    finally:
        if peers.poll() is None:
            peers.kill()
            peers.wait(10)
    rt = max(1, int(res["roundTrips"]))
    return {
        "pairs": pairs,
        "setup_s": ready["setupMs"] / 1000,
        "relayed": bool(ready["relayed"] and res["relayed"]),
        "round_trips": res["roundTrips"],
        "per_pair_min": res["perPairMin"],
        "seconds": res["seconds"],
        "rt_per_s": res["roundTrips"] / res["seconds"],
        "rtt_p50_ms": res["rttMs"]["p50"],
        "rtt_p99_ms": res["rttMs"]["p99"],
        "cpu_ms_per_1k": cpu * 1000 / rt * 1000,
        "relay_core_share": cpu / res["seconds"],
        "machine_cpu_ms_per_1k": machine * 1000 / rt * 1000,
        "rss_mb": rss / 2**20,
        "packets_per_rt": (n1 - n0) / rt if n0 is not None and n1 is not None else None,
    }


def measure(
    kind: str, bootstrap: str, args: argparse.Namespace, workdir: Path, other: Baseline | None = None
) -> dict[int, dict[str, Any]]:
    relay = Relay(kind, bootstrap, workdir, other if kind == "baseline" else None)
    try:
        settle(relay)
        idle = relay.rss() / 2**20
        out = {}
        for n in args.pairs:
            res = run_chatty(bootstrap, relay, n, args.size, args.seconds)
            res["idle_rss_mb"] = idle
            res["relay"] = kind
            res["load"] = os.getloadavg()[0]
            print(json.dumps(res), file=sys.stderr, flush=True)
            out[n] = res
        return out
    finally:
        relay.stop()


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, float) and all(isinstance(r[key], float) for r in runs):
            out[key] = statistics.median(float(r[key]) for r in runs)
    out["relayed"] = all(r["relayed"] for r in runs)
    return out


def capacity(res: dict[str, Any], job_rate: float, memory_mb: float) -> tuple[int, int | None]:
    """(jobs one core carries by CPU, jobs that fit under `memory_mb`; None when memory never binds)."""
    cpu_per_job_s = res["cpu_ms_per_1k"] / 1e6 * job_rate
    by_cpu = int(1 / cpu_per_job_s) if cpu_per_job_s > 0 else 10**9
    per_pair_mb = (res["rss_mb"] - res["idle_rss_mb"]) / res["pairs"]
    if per_pair_mb <= 0:
        return by_cpu, None
    return by_cpu, max(0, int((memory_mb - res["idle_rss_mb"]) / per_pair_mb))


def report(results: dict[str, dict[int, dict[str, Any]]], args: argparse.Namespace) -> str:
    node = results.get("node")
    lines = [
        "| pairs | relay | relay CPU per 1,000 round trips | round trips/s | RTT p50 / p99 "
        "| relay CPU (share of a core) | RSS | datagrams to the relay per round trip |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for n in args.pairs:
        for kind in results:
            r = results[kind][n]
            ratios = ("", "", "")
            if node is not None and kind != "node":
                b = node[n]
                ratios = (
                    f" ({r['cpu_ms_per_1k'] / b['cpu_ms_per_1k']:.2f}×)",
                    f" ({r['rt_per_s'] / b['rt_per_s']:.2f}×)",
                    f" ({r['rtt_p99_ms'] / b['rtt_p99_ms']:.2f}× p99)",
                )
            flag = "" if r["relayed"] else " (NOT all relayed)"
            per_rt = "–" if r.get("packets_per_rt") is None else f"{r['packets_per_rt']:.2f}"
            lines.append(
                f"| {n} | {LABELS[kind]}{flag} | {r['cpu_ms_per_1k']:.1f} ms{ratios[0]} "
                f"| {r['rt_per_s']:,.0f}{ratios[1]} "
                f"| {r['rtt_p50_ms']:.2f} / {r['rtt_p99_ms']:.1f} ms{ratios[2]} | {r['relay_core_share'] * 100:.0f} % "
                f"| {r['rss_mb']:.0f} MB | {per_rt} |"
            )
    top = max(args.pairs)
    cap = []
    for kind in results:
        by_cpu, by_mem = capacity(results[kind][top], args.job_rate, args.memory_mb)
        mem = "memory does not bind" if by_mem is None else f"{by_mem:,} fit under {args.memory_mb:.0f} MB"
        carried = by_cpu if by_mem is None else min(by_cpu, by_mem)
        cap.append(
            f"- {LABELS[kind]}: **~{carried:,} chatty jobs per core** "
            f"(CPU: {by_cpu:,} at {args.job_rate:g} round trips/s each; {mem})"
        )
    lines += [
        "",
        f"Capacity, from the {top}-pair rows (a job = one relayed pair doing {args.job_rate:g} round trips "
        f"of {args.size} bytes per second; RSS per pair = (RSS − idle RSS) / {top}):",
        *cap,
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--pairs",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 32],
        help="comma-separated pair counts (default 1,32; e.g. 1,32,256)",
    )
    p.add_argument("--seconds", type=float, default=8.0, help="measured window per pair count (default 8)")
    p.add_argument("--size", type=int, default=256, help="request and reply size in bytes (default 256)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, alternating which relay goes first; medians")
    p.add_argument("--kernel", action="store_true", help="also ours with --kernel-forwarding (nftables, root)")
    p.add_argument("--only", choices=("python", "node"), default=None)
    p.add_argument(
        "--baseline", default=None, help="also another revision's relay (a git revision or a checkout directory)"
    )
    p.add_argument("--baseline-env", action="append", metavar="KEY=VAL", help="set in the baseline relay's environment")
    p.add_argument("--job-rate", type=float, default=20.0, help="round trips per second one job makes (default 20)")
    p.add_argument("--memory-mb", type=float, default=200.0, help="memory budget for the capacity line (default 200)")
    p.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    args = p.parse_args()
    kinds = [k for k in ("python", "node") if not args.only or k == args.only]
    if args.kernel:
        kinds.append("python-kernel")
    if args.baseline:
        kinds.append("baseline")
        LABELS["baseline"] = f"baseline ({' '.join([args.baseline, *(args.baseline_env or ())])})"
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {k: {n: [] for n in args.pairs} for k in kinds}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="chatty-bench-") as tmp, Testnet("node", size=5) as tn:
        other = (
            baseline(args.baseline, Path(tmp) / "baseline", baseline_env(args.baseline_env)) if args.baseline else None
        )
        for r in range(args.rounds):
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                for n, res in measure(kind, tn.bootstrap, args, Path(tmp) / f"{kind}-{r}", other).items():
                    runs[kind][n].append(res)
    load_after = os.getloadavg()
    results = {k: {n: median_of(v) for n, v in per.items()} for k, per in runs.items()}
    if args.json:
        args.json.write_text(json.dumps({"medians": results, "runs": runs}, indent=2))
    print(
        f"<!-- python3 benchmarks/chatty.py {shlex.join(sys.argv[1:])}; {os.cpu_count()} CPUs; "
        f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min) -->"
    )
    print(report(results, args))
    if "node" in runs:
        for kind in ("python", "baseline"):
            for n in args.pairs if kind in runs else ():
                print(paired(runs[kind][n], runs["node"][n], f"{kind}, {n} pairs"))


def paired(ours: list[dict[str, Any]], node: list[dict[str, Any]], what: str) -> str:
    """Per round, relay CPU per round trip and round trips/s over the Node relay's of the same
    round, with their medians: the figures a before/after compares."""
    cpu = [a["cpu_ms_per_1k"] / b["cpu_ms_per_1k"] for a, b in zip(ours, node, strict=True)]
    rate = [a["rt_per_s"] / b["rt_per_s"] for a, b in zip(ours, node, strict=True)]
    return (
        f"{what} / Node per round: CPU per round trip {' '.join(f'{x:.2f}' for x in cpu)} (median "
        f"{statistics.median(cpu):.2f}), round trips/s {' '.join(f'{x:.2f}' for x in rate)} "
        f"(median {statistics.median(rate):.2f})"
    )


if __name__ == "__main__":
    main()
