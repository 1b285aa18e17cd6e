"""Issue #13's attacks against the Python relay, the Node relay and (optionally) an older Python relay, one run.

    python3 benchmarks/attacks.py [--scale 1.0] [--baseline COMMIT] [--only selfpair,pending,...] [--json out.json]

Each relay runs as its own process on one loopback hyperdht testnet (npm `hyperdht/testnet`): the
Python relay with its default limits (`python -m relay`), the Node relay built from npm hyperdht +
blind-relay exactly as blind-relay-service runs them (benchmarks/js/relay_node_server.js), and with
`--baseline` the Python relay as it was at that commit (`git archive`, run from a temp dir). Each
attack is `tests/interop/js/relay_attack.js` from 127.0.0.2+ (real hyperdht peers, hostile
messages); while it holds, 4 legitimate pairs from 127.0.0.1 (tests/interop/js/relay_peers.js, 20 s
timeout each) try to relay. Measured per relay and attack: legitimate pairs that relayed, their
median setup (connect -> open), the relay's RSS before and at its peak during the attack (psutil,
sampled every 0.25 s), and whether the relay process survived. A fresh relay per attack.
Prints a Markdown table (for README) and optionally JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
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

from benchmarks.relay_bench import BENCH_JS  # noqa: E402
from relay.service.limits import Limits  # noqa: E402
from tests.interop._relay_net import INTEROP, Testnet  # noqa: E402

DEFAULTS = Limits()
HOLD_KEEP_MS = 20_000  # a held session self-pairs a token this often: never idle, so never reaped

ATTACKS: dict[str, tuple[str, dict[str, Any]]] = {
    # name: (what the issue saw, relay_attack.js options at scale 1; "hosts" = how many 127.0.0.x)
    "selfpair": ("one session pairs 10,000 tokens with itself", {"attack": "selfpair", "sessions": 1, "pairs": 10_000}),
    "pending": (
        "130 sessions from one host re-send 64 pending tokens every 2 s",
        {"attack": "pending", "sessions": 130, "pairs": 64, "interval": 2000},
    ),
    "hold": ("one host opens 4,096 sessions and holds them", {"attack": "hold", "sessions": 4096}),
    "bigframe": (
        "12 sessions each send 16 MiB - 64 KiB of a 16 MiB control frame that never completes",
        {"attack": "bigframe", "sessions": 12, "frame": (1 << 24) - 1, "send": (1 << 24) - 65536},
    ),
    "ooo": (
        "12 sessions each park 2,000 out-of-order 1,200-byte packets on their control stream",
        {"attack": "ooo", "sessions": 12, "packets": 2000},
    ),
    "early": (
        "one session self-pairs 8,192 tokens and sends 64 packets to one side of each, never the other",
        {"attack": "selfpair", "sessions": 1, "pairs": 8192, "early": 64},
    ),
    "handshakes": (
        "64 hosts do valid handshakes at 500/s (legit pairs during the flood, from its 8th second)",
        # settle: the legit pairs start once the flood has run that long (the old relay's receive
        # queue was full by then); seconds: the flood's length at most (it ends with the pairs)
        {"attack": "handshakes", "rate": 500, "seconds": 60, "hosts": 64, "settle": 8},
    ),
    "combined": (
        # self-pairing past the active-pairs cap (8,192 fresh tokens every 15 s, 8 early packets
        # each), 130 sessions re-sending 8,320 pending tokens, the rest of the default session
        # cap held (each self-pairing every 20 s, parking 200 out-of-order packets and leaving
        # 3/4 of a frame at --max-control-frame incomplete), 12 never-completing 16 MiB frames,
        # 12 sessions parking 2,000 out-of-order packets
        "**all of the above at once** (but the handshake flood), at the default caps, from 71 hosts",
        {
            "attack": "combined",
            "parts": [
                {"attack": "selfpair", "sessions": 1, "pairs": 8192, "interval": 15_000, "early": 8, "hosts": 1},
                {"attack": "pending", "sessions": 130, "pairs": 64, "interval": 2000, "hosts": 2},
                {"attack": "bigframe", "sessions": 12, "frame": (1 << 24) - 1, "send": (1 << 24) - 65536, "hosts": 2},
                {"attack": "ooo", "sessions": 12, "packets": 2000, "hosts": 2},
                {
                    "attack": "hold",
                    "sessions": DEFAULTS.max_sessions - 1 - 130 - 12 - 12 + 1,
                    "keep": HOLD_KEEP_MS,
                    "ooo": 200,
                    # our default --max-control-frame (the largest frame it holds), 3 KiB sent: the
                    # attacker's own keep-alives and pairs would take minutes to complete it
                    "frame": DEFAULTS.max_control_frame,
                    "frameSend": DEFAULTS.max_control_frame * 3 // 4,
                    "parallel": 256,
                    "hosts": 64,
                },
            ],
        },
    ),
}
SCALED = ("sessions", "pairs", "rate")  # bigframe's sizes and the durations stay as they are


def scaled_options(opts: dict[str, Any], scale: float, first_host: int = 2) -> tuple[dict[str, Any], int]:
    """relay_attack.js options at `scale`, each part on its own 127.0.0.x hosts; (options, hosts used)."""
    opts = dict(opts)
    if "parts" in opts:
        parts, used = [], 0
        for part in opts["parts"]:
            p, n = scaled_options(part, scale, first_host + used)
            parts.append(p)
            used += n
        return opts | {"parts": parts}, used
    for k in SCALED:
        if k in opts:
            opts[k] = max(1, round(opts[k] * scale))
    nhosts = opts.pop("hosts", 1)
    opts["hosts"] = [f"127.0.0.{first_host + i}" for i in range(nhosts)]
    return opts, nhosts


class Relay:
    """One relay process: 'python' (this tree), 'node', or 'baseline' (an older tree)."""

    def __init__(self, kind: str, bootstrap: str, workdir: Path, tree: Path) -> None:
        self.kind = kind
        self.stats_url: str | None = None
        if kind in ("python", "baseline"):
            store = workdir / f"{kind}-store"
            argv = [sys.executable, "-m", "relay", "--storage", str(store), "--port", "0", "--host", "127.0.0.1"]
            argv += ["--bootstrap", bootstrap, "--metrics", "127.0.0.1:0", "--log-level", "error"]
            cwd = tree
        else:
            dht = {"firewalled": False, "ephemeral": False}
            opts = {"bootstrap": bootstrap.split(","), "host": "127.0.0.1", "dht": dht}
            argv = ["node", str(BENCH_JS / "relay_node_server.js"), json.dumps(opts)]
            cwd = INTEROP
        self.proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if kind != "node" and line.startswith("Server listening on "):
                self.key = line.split()[-1]
                runtime = json.loads((store / "relay-runtime.json").read_text())
                self.port = int(runtime["port"])
                self.stats_url = f"{runtime['metrics']}/stats" if runtime.get("metrics") else None
                break
            if kind == "node" and line.startswith("{"):
                info = json.loads(line)
                self.key, self.port = info["key"], int(info["port"])
                break
        else:
            raise RuntimeError(f"{kind} relay exited before listening")
        self.ps = psutil.Process(self.proc.pid)
        self.peak = 0
        self.held: dict[str, int] = {}  # most of each thing the relay held at once (Python relays' /stats)
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def rss(self) -> int:
        try:
            return int(self.ps.memory_info().rss)
        except psutil.Error:
            return 0

    def _sample(self) -> None:
        n = 0
        while not self._stop.wait(0.25):
            self.peak = max(self.peak, self.rss())
            n += 1
            if self.stats_url and n % 4 == 0:
                self._sample_stats()

    def stats(self) -> dict[str, Any]:
        """The Python relay's /stats ({} if it does not answer)."""
        assert self.stats_url is not None
        try:
            with urllib.request.urlopen(self.stats_url, timeout=5) as resp:
                return dict(json.load(resp))
        except (OSError, ValueError):
            return {}

    def _sample_stats(self) -> None:
        st = self.stats()
        if not st:
            return
        now = {
            "sessions": st["sessions"]["opened"] - st["sessions"]["closed"],
            "pending": st["pairings"]["pending"],
            "active_pairs": st["pairings"]["active"],
            "relay_streams": st["streams"]["opened"] - st["streams"]["closed"],
        }
        for k, v in now.items():
            self.held[k] = max(self.held.get(k, 0), int(v))

    def start_sampling(self) -> None:
        self.peak = self.rss()
        self._sampler.start()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        self._stop.set()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def legit_pairs(bootstrap: str, relay: Relay, pairs: int = 4) -> tuple[int, float | None, list[str]]:
    """(pairs that relayed, median setup ms, errors) for `pairs` sequential legitimate pairs from 127.0.0.1."""
    ok, setups, errors = 0, [], []
    for _ in range(pairs):
        opts = {"bootstrap": bootstrap.split(","), "relay": relay.key, "relayPort": relay.port, "mode": "client"}
        opts |= {"pairs": 1, "bytes": 20_000, "timeout": 20_000}
        try:
            res = subprocess.run(
                ["node", "js/relay_peers.js", json.dumps(opts)], cwd=INTEROP, capture_output=True, text=True, timeout=60
            )
        except subprocess.TimeoutExpired:
            errors.append("peers did not finish in 60 s")
            continue
        for ln in res.stdout.splitlines():
            rec = json.loads(ln) if ln.startswith("{") else {}
            if "i" in rec and rec.get("ok") and rec.get("relayed"):
                ok += 1
                setups.append(float(rec["setupMs"]))
            elif "i" in rec:
                errors.append(str(rec.get("error") or rec))
    return ok, (statistics.median(setups) if setups else None), errors


def run_attack(name: str, kind: str, bootstrap: str, tree: Path, scale: float) -> dict[str, Any]:
    opts, nhosts = scaled_options(ATTACKS[name][1], scale)
    settle = float(opts.pop("settle", 0))
    with tempfile.TemporaryDirectory(prefix="attacks-") as tmp:
        relay = Relay(kind, bootstrap, Path(tmp), tree)
        try:
            time.sleep(2)  # bootstrap and announce settle
            before = relay.rss()
            relay.start_sampling()
            args = {"bootstrap": bootstrap.split(","), "relay": relay.key, **opts}
            t0 = time.monotonic()
            attack = subprocess.Popen(
                ["node", "js/relay_attack.js", json.dumps(args)],
                cwd=INTEROP,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert attack.stdout is not None
            ready = json.loads(attack.stdout.readline() or "{}")
            in_place = time.monotonic() - t0
            time.sleep(settle)
            ok, setup, errors = legit_pairs(bootstrap, relay)
            out, err = attack.communicate(timeout=300)
            last = relay.stats() if relay.stats_url else {}
            done: dict[str, Any] = next((json.loads(ln) for ln in out.splitlines() if ln.startswith("{")), {})
            return {
                "attack": name,
                "relay": kind,
                "options": ATTACKS[name][1],
                "scale": scale,
                "hosts": nhosts,
                "settle": settle,
                "attack_seconds_to_place": round(in_place, 1),
                "attacker_opened": ready.get("opened"),
                "attacker_closed_by_relay": done.get("closed"),
                "legit_ok": ok,
                "legit_setup_ms": setup,
                "legit_errors": errors,
                "rss_before_mb": round(before / 2**20, 1),
                "rss_peak_mb": round(relay.peak / 2**20, 1),
                "survived": relay.alive(),
                "attack_exit": attack.returncode,
                "attack_stderr": err[-1000:] if attack.returncode else "",
                "held_at_most": relay.held,
                "shed": {k: v for k, v in last.get("shed", {}).items() if v},
                "dropped": {k: v for k, v in last.get("dropped", {}).items() if v},
                "rejected": {k: v for k, v in last.get("limits", {}).get("rejected", {}).items() if v},
            }
        finally:
            relay.stop()


def baseline_tree(commit: str, into: Path) -> Path:
    """The relay package as it was at `commit`, to run with `python -m relay` from that dir."""
    archive = subprocess.run(["git", "archive", commit, "relay"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def table(results: list[dict[str, Any]], kinds: list[str]) -> str:
    names = {"python": "Python relay", "node": "Node relay", "baseline": "Python before"}
    head = "| attack | " + " | ".join(f"{names[k]}: legit pairs, setup ms, RSS MB" for k in kinds) + " |"
    rows = [head, "|---|" + "---|" * len(kinds)]
    for name in dict.fromkeys(r["attack"] for r in results):
        cells = []
        for k in kinds:
            r = next((x for x in results if x["attack"] == name and x["relay"] == k), None)
            if r is None:
                cells.append("–")
                continue
            setup = "–" if r["legit_setup_ms"] is None else f"{r['legit_setup_ms']:.0f}"
            dead = "" if r["survived"] else " **(relay died)**"
            cells.append(f"{r['legit_ok']}/4, {setup}, {r['rss_before_mb']:.0f}→{r['rss_peak_mb']:.0f}{dead}")
        rows.append(f"| {ATTACKS[name][0]} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="multiply sessions/pairs/rates (default 1 = the issue's)")
    ap.add_argument("--baseline", default=None, help="also attack the Python relay of this commit")
    ap.add_argument("--only", default=",".join(ATTACKS), help="comma list of attacks")
    ap.add_argument("--relays", default=None, help="comma list of python,node,baseline (default: all given)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    kinds = ["python", "node"] + (["baseline"] if args.baseline else [])
    if args.relays:
        kinds = [k for k in kinds if k in args.relays.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="attacks-tree-") as tree_dir, Testnet("node", size=5) as tn:
        trees = {"python": ROOT, "node": ROOT}
        if args.baseline:
            trees["baseline"] = baseline_tree(args.baseline, Path(tree_dir))
        for name in args.only.split(","):
            for kind in kinds:
                r = run_attack(name, kind, tn.bootstrap, trees[kind], args.scale)
                print(json.dumps(r), file=sys.stderr, flush=True)
                results.append(r)
    print(table(results, kinds))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
