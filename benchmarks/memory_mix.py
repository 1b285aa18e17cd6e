"""The 200 MB promise under attack plus real load, side by side with the Node relay, and whether
memory comes back afterwards.

    python3 benchmarks/memory_mix.py [--pairs 3000] [--rate 25] [--relays python,node] [--no-attack]
                                     [--after 60] [--json out.json]

Per relay (ours: `python -m relay`, default flags, 200 MB budget; Node: npm hyperdht + blind-relay
as blind-relay-service runs them, benchmarks/js/relay_node_server.js), each fresh on its own
loopback testnet:

1. the attack mix from six addresses (127.0.0.2-7, `tests/interop/js/relay_attack.js combined`):
   idle-session hoarding (2,000 sessions held with keep-alive self-pairs, each parking 200
   out-of-order packets and 3/4 of a 1 KiB control frame), 130 sessions re-sending 64 pending
   tokens every 2 s, one session self-pairing 4,096 fresh tokens every 15 s with 8 early packets
   each, 12 never-completing 16 MiB control frames, 12 sessions parking 2,000 out-of-order packets;
2. once it is in place, `--pairs` real relayed connections held open in the deployment's shape
   (`tests/interop/js/relay_capacity_peers.js`: a worker on 127.0.0.20, its jobs on 127.0.0.21, so
   each connection is a session from each of two worker-side addresses), opened at `--rate` per
   second, then each echoes 1,000 bytes;
3. meanwhile legitimate pairs from 127.0.0.1 (`js/relay_peers.js`, 20 s timeout each), one after
   another until the real connections are open and echoed;
4. then everything closes (the burst ends) and the relay's RSS is read again `--after` seconds later.

Measured: RSS before the attack, peak RSS (sampled every 0.25 s) and the kernel's high-water mark
(VmHWM), the real connections open / asked and echoed, legit pairs relayed, and, for ours, the
matches the relay made against the connections asked for (churn: a held pair that closes and
pairs again shows as extra matches), what it refused and shed and why, and RSS after the burst.
Prints a Markdown table and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.capacity import PeakRSS  # noqa: E402
from benchmarks.relay_bench import BENCH_JS  # noqa: E402
from tests.interop._capacity_peers import CapacityPeers  # noqa: E402
from tests.interop._relay_net import INTEROP, Testnet  # noqa: E402
from tests.interop._relay_proc import RelayProcess  # noqa: E402

MB = 2**20
ATTACK_HOSTS = [f"127.0.0.{i}" for i in range(2, 8)]
WORKER, JOBS = "127.0.0.20", ["127.0.0.21"]
FRAME = (1 << 24) - 1


def attack_mix(hold: int = 2000) -> dict[str, Any]:
    """relay_attack.js `combined` options: the issue's mix, each part on its own addresses."""
    h = iter(ATTACK_HOSTS)
    return {
        "attack": "combined",
        "parts": [
            {
                "attack": "hold",
                "sessions": hold,
                "keep": 20_000,
                "ooo": 200,
                "frame": 1024,
                "frameSend": 768,
                "parallel": 256,
                "hosts": [next(h), next(h)],
            },
            {"attack": "pending", "sessions": 130, "pairs": 64, "interval": 2000, "hosts": [next(h)]},
            {"attack": "selfpair", "sessions": 1, "pairs": 4096, "interval": 15_000, "early": 8, "hosts": [next(h)]},
            {"attack": "bigframe", "sessions": 12, "frame": FRAME, "send": FRAME - 65535, "hosts": [next(h)]},
            {"attack": "ooo", "sessions": 12, "packets": 2000, "hosts": [next(h)]},
        ],
    }


class NodeRelay:
    """The Node relay; `stats()` asks it for blind-relay's counters (SIGUSR2)."""

    def __init__(self, bootstrap: str) -> None:
        dht = {"firewalled": False, "ephemeral": False}
        opts = {"bootstrap": bootstrap.split(","), "host": "127.0.0.1", "dht": dht}
        self.proc = subprocess.Popen(
            ["node", str(BENCH_JS / "relay_node_server.js"), json.dumps(opts)],
            cwd=INTEROP,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        info = json.loads(self.proc.stdout.readline())
        self.key, self.port, self.pid = info["key"], int(info["port"]), self.proc.pid
        self._stats: list[dict[str, Any]] = []
        self._got = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith('{"stats"'):
                self._stats.append(json.loads(line)["stats"])
                self._got.set()

    def stats(self) -> dict[str, Any]:
        self._got.clear()
        self.proc.send_signal(signal.SIGUSR2)
        self._got.wait(10)
        return self._stats[-1] if self._stats else {}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def vm_hwm(pid: int) -> int:
    """The kernel's record of the process's peak resident set (bytes)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def legit_loop(bootstrap: str, key: str, port: int, stop: threading.Event, out: dict[str, Any]) -> None:
    """Legitimate pairs from 127.0.0.1, one after another until `stop`."""
    while not stop.is_set():
        opts = {"bootstrap": bootstrap.split(","), "relay": key, "relayPort": port, "mode": "client"}
        opts |= {"pairs": 1, "bytes": 20_000, "timeout": 20_000}
        try:
            res = subprocess.run(
                ["node", "js/relay_peers.js", json.dumps(opts)], cwd=INTEROP, capture_output=True, text=True, timeout=90
            )
            recs = [json.loads(ln) for ln in res.stdout.splitlines() if ln.startswith('{"i"')]
        except subprocess.TimeoutExpired:
            recs = [{"ok": False, "error": "peers did not finish in 90 s"}]
        for r in recs:
            out["tried"] += 1
            if r.get("ok") and r.get("relayed"):
                out["relayed"] += 1
            else:
                out["errors"].append(str(r.get("error")))


def py_stats(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url + "/stats", timeout=10) as r:
            return dict(json.load(r))
    except (OSError, ValueError):
        return {}


def measure(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"memory-mix-{kind}-") as tmp, Testnet("node", size=4) as tn:
        py: RelayProcess | None = None
        node: NodeRelay | None = None
        if kind == "python":
            env = dict(kv.split("=", 1) for kv in args.env)
            py = RelayProcess(Path(tmp) / "store", "--log-level", "warning", bootstrap=tn.bootstrap, env=env)
            py.start()
            assert py.key is not None and py.proc is not None, py.stderr[-2000:]
            key, port, pid = py.key, py.port, py.proc.pid
        else:
            node = NodeRelay(tn.bootstrap)
            key, port, pid = node.key, node.port, node.pid
        ps = psutil.Process(pid)
        out: dict[str, Any] = {"relay": kind, "asked": args.pairs, "attack": not args.no_attack}
        try:
            time.sleep(2)  # start-up work (bootstrap, announce) done before the idle figure
            out["rss_before_mb"] = round(ps.memory_info().rss / MB, 1)
            legit = {"tried": 0, "relayed": 0, "errors": []}
            stop = threading.Event()
            attack: subprocess.Popen[str] | None = None
            with PeakRSS(pid) as peak:
                if not args.no_attack:
                    opts = {"bootstrap": tn.bootstrap.split(","), "relay": key, **attack_mix(args.hold)}
                    attack = subprocess.Popen(
                        ["node", "js/relay_attack.js", json.dumps(opts)],
                        cwd=INTEROP,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                    assert attack.stdout is not None
                    ready = json.loads(attack.stdout.readline() or "{}")
                    out["attacker_sessions"] = ready.get("opened")
                    out["rss_attack_in_place_mb"] = round(ps.memory_info().rss / MB, 1)
                legit_thread = threading.Thread(target=legit_loop, args=(tn.bootstrap, key, port, stop, legit))
                legit_thread.start()
                t0 = time.monotonic()
                with CapacityPeers("node", tn.bootstrap, key, port, worker_host=WORKER, job_hosts=JOBS) as peers:
                    opened = peers.open(args.pairs, rate=args.rate, parallel=args.parallel)
                    out["open_seconds"] = round(time.monotonic() - t0, 1)
                    out["rss_open_mb"] = round(ps.memory_info().rss / MB, 1)
                    echoed = peers.echo(size=1000, timeout_ms=60_000)
                    status = peers.status()
                    stop.set()
                    legit_thread.join()
                    out |= {
                        "open": opened.ok,
                        "failed": opened.failed,
                        "errors": {
                            e: sum(1 for p in opened.failures if p.get("error") == e)
                            for e in {p.get("error") for p in opened.failures}
                        },
                        "echoed": echoed["ok"],
                        "died": status["closed"],
                        "died_of": status.get("errors", {}),
                        "legit_relayed": legit["relayed"],
                        "legit_tried": legit["tried"],
                        "legit_errors": sorted(set(legit["errors"]))[:3],
                    }
                    if py is not None:
                        s = py_stats(py.metrics_url)
                        out["stats_under_load"] = {
                            "matched": s["pairings"]["matched"],
                            "active": s["pairings"]["active"],
                            "sessions": s["capacity"]["sessions"],
                            "refusals": {k: v for k, v in s["refusals"].items() if v},
                            "shed": {k: v for k, v in s["shed"].items() if v},
                            "rejected": {k: v for k, v in s["limits"]["rejected"].items() if v},
                            "memory": s["memory"],
                        }
                    elif node is not None:
                        out["stats_under_load"] = node.stats()
                    if attack is not None:
                        attack.communicate(timeout=60)  # stdin closed: the attack stops
            out["rss_peak_mb"] = round(peak.peak / MB, 1)
            out["vm_hwm_mb"] = round(vm_hwm(pid) / MB, 1)
            out["rss_end_mb"] = round(ps.memory_info().rss / MB, 1)  # everyone just left
            t_end = time.monotonic()
            while time.monotonic() - t_end < args.after:
                time.sleep(1)
            out["rss_after_mb"] = round(ps.memory_info().rss / MB, 1)
            out["after_seconds"] = args.after
            if py is not None:
                s = py_stats(py.metrics_url)
                out["stats_after"] = {
                    "sessions": s["capacity"]["sessions"],
                    "matched": s["pairings"]["matched"],
                    "memory": s["memory"],
                }
            elif node is not None:
                out["stats_after"] = node.stats()
            return out
        finally:
            if py is not None:
                py.stop()
            if node is not None:
                node.stop()


def table(rows: list[dict[str, Any]]) -> str:
    head = [
        "relay",
        "real connections open / asked (echoed)",
        "legit pairs relayed",
        "RSS before → peak (VmHWM) MB",
        "RSS right after → after N s MB",
        "matches / refused",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        st = r.get("stats_under_load", {})
        if r["relay"] == "python":
            refused = sum(st.get("refusals", {}).get(k, 0) for k in ("full_sessions", "full_pairs"))
            matches = f"{st.get('matched', '?'):,} / {refused:,}"
        else:
            matches = f"{st.get('pairingsMatched', st.get('pairings', {}).get('matched', '?'))} / –"
        lines.append(
            "| "
            + " | ".join(
                [
                    "ours" if r["relay"] == "python" else "Node",
                    f"{r['open']:,} / {r['asked']:,} ({r['echoed']:,})",
                    f"{r['legit_relayed']} / {r['legit_tried']}",
                    f"{r['rss_before_mb']} → {r['rss_peak_mb']} ({r['vm_hwm_mb']})",
                    f"{r['rss_end_mb']} → {r['rss_after_mb']} ({r['after_seconds']} s)",
                    matches,
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3000, help="real relayed connections to hold (default 3000)")
    ap.add_argument("--rate", type=float, default=25.0, help="real connections started per second (default 25)")
    ap.add_argument("--parallel", type=int, default=64, help="real connections setting up at once (default 64)")
    ap.add_argument("--hold", type=int, default=2000, help="sessions the hoarding attacker holds (default 2000)")
    ap.add_argument("--relays", default="python,node", help="python, node or both (comma-separated)")
    ap.add_argument("--no-attack", action="store_true", help="the real connections alone")
    ap.add_argument("--after", type=float, default=60.0, help="seconds after the burst to read RSS again")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="environment for our relay")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args()
    rows = []
    load_before = os.getloadavg()
    for kind in args.relays.split(","):
        print(f"-- {kind} relay, {args.pairs} real connections, attack {not args.no_attack}", file=sys.stderr)
        row = measure(kind, args)
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    load_after = os.getloadavg()
    print(table(rows))
    print(f"\nload average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min); {os.cpu_count()} cores")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
