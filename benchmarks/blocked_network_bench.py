"""Our relay vs the Node relay across the mission's network: NATed LANs, delay and loss on the wan.

    python3 benchmarks/blocked_network_bench.py [--delay-ms 10] [--loss 1] [--mib 8] [--setup 10]
        [--rounds 3] [--upgrade-runs 0] [--firewall-starts 0] [--json out.json]

Needs root (network namespaces), `ip`, `nft` and the npm packages of tests/interop. The topology
is tests/network/topology.py: two LANs behind `masquerade fully-random` NAT routers (RANDOM
NATs: hyperdht cannot punch, every byte crosses the relay), a 12-node hyperdht testnet and both
relays on the wan. Delay is a userspace delay line on each router's uplink (`--delay-ms` one way
per uplink, so LAN a -> relay -> LAN b is 2x that one way); loss is nftables `numgen random` on
the wan bridge (`--loss` percent of every UDP datagram crossing it, DHT traffic included). Both
are measured before use (UDP probe RTT, datagrams answered), and the table says what was measured.

Per relay, alternating which goes first each round, medians over rounds:
* setup: client `connect(relayThrough)` -> `open`, `--setup` sequential connections per round;
* echo throughput: `--mib` MiB written and echoed back through the relay (MB/s of payload);
* relay CPU-seconds per GB crossing it (psutil user+sys of the relay process; echo = 2x payload).

`--upgrade-runs N`: consistent NATs, relayThrough set, punching on: N connections per relay and
mode; a run "hangs" when it is not on a direct path, echoing, within 30 s.
`--firewall-starts N`: N fresh starts of each relay behind a security group that admits only
its --port; time from start to its first relayed echo (tried at once, then every 10 s, up to
330 s), and the same without the security group as the control.

Importable, for other benchmarks that need a lossy target (e.g. issue 12):

    from benchmarks.blocked_network_bench import Wan
    with Wan(delay_ms=10, loss_percent=1) as wan:
        relay = wan.start_relay("python")          # or "node"
        result = wan.echo(relay, 8 << 20)          # {"ok", "echoMs", "setupMs", ...}
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.network.topology import Peer, RelayInNs, Topology, missing_requirements  # noqa: E402

KINDS = ("python", "node")
_ports = itertools.count(33_000)
_seeds = itertools.count(1)

UDP_ECHO = (
    "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.bind(('0.0.0.0', 7))\n"
    "print('up', flush=True)\nwhile True:\n    d, a = s.recvfrom(2048)\n    s.sendto(d, a)\n"
)
UDP_PROBE = """import socket, statistics, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)
rtts = []
n = int(sys.argv[2])
for i in range(n):
    t = time.perf_counter(); s.sendto(b'x' * 100, (sys.argv[1], 7))
    try:
        s.recvfrom(2048); rtts.append((time.perf_counter() - t) * 1000)
    except socket.timeout:
        pass
print(len(rtts), n, statistics.median(rtts) if rtts else -1)
"""


class Wan:
    """One topology with both relays available; `echo` runs one relayed transfer from LAN b to LAN a."""

    def __init__(
        self,
        *,
        delay_ms: float = 0,
        loss_percent: float = 0,
        nat: str = "random",
        dht_size: int = 12,
        relay_delay_ms: float = 0,
    ):
        missing = missing_requirements()
        if missing:
            raise SystemExit("blocked_network_bench needs: " + "; ".join(missing))
        self.topo = Topology(
            nat=nat, wan_delay_ms=delay_ms, wan_loss_percent=loss_percent, relay_delay_ms=relay_delay_ms
        )
        self.dht_size = dht_size
        self.tmp = Path(tempfile.mkdtemp(prefix="bnbench"))
        self.a: Peer
        self.b: Peer

    def __enter__(self) -> Wan:
        try:
            self.topo.build()
            self.topo.start_testnet(self.dht_size)
            self.a, self.b = self.topo.peer("a"), self.topo.peer("b")
        except BaseException:
            self.topo.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.topo.close()

    def start_relay(
        self, kind: str, port: int | None = None, *, told_public: bool = False, extra: tuple[str, ...] = ()
    ) -> RelayInNs:
        """`told_public`: the Node relay starts as `firewalled: false, ephemeral: false` (what it
        becomes once dht-rpc's NAT check concludes), as benchmarks/relay_bench.py runs it."""
        port = next(_ports) if port is None else port
        if kind == "python":
            store = self.tmp / f"store{port}"
            return self.topo.python_relay(store, port, "--log-level", "warning", *extra)
        dht = {"firewalled": False, "ephemeral": False} if told_public else None
        return self.topo.node_relay(f"{next(_seeds):064x}", port, dht=dht)

    def echo(self, relay: RelayInNs | None, nbytes: int, *, timeout_ms: int = 60_000, **kw: Any) -> dict[str, Any]:
        key = self.a.call("listen", **kw.pop("server", {}))["publicKey"]
        return self.b.call(
            "connect",
            key=key,
            relayThrough=relay.key if relay else None,
            bytes=nbytes,
            timeout=timeout_ms,
            **kw,
        )

    def probe_rtt(self, n: int = 40) -> dict[str, float]:
        """UDP echo RTT LAN a -> relay host (its uplink's delay line twice) and datagrams answered."""
        echo = self.topo.spawn("relay", [sys.executable, "-c", UDP_ECHO])
        try:
            echo.wait_line(lambda ln: ln == "up", 30, "udp echo")
            res = self.topo.exec_in("a", sys.executable, "-c", UDP_PROBE, self.topo.relay_host, str(n))
            got, sent, rtt = res.split()
            return {"answered": int(got), "sent": int(sent), "rtt_ms": float(rtt)}
        finally:
            echo.stop()


def cpu_seconds(relay: RelayInNs) -> float:
    t = psutil.Process(relay.proc.proc.pid).cpu_times()
    return float(t.user + t.system)


def warm_up(wan: Wan, relay: RelayInNs, limit_s: float = 330, every_s: float = 10) -> float | None:
    """Seconds from now until the relay first carries an echo (tried at once, then every `every_s`)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        r = wan.echo(relay, 10_000, timeout_ms=15_000)
        if r.get("ok"):
            return time.monotonic() - t0
        print(f"    {relay.port}: not yet ({r.get('error')})", file=sys.stderr, flush=True)
        time.sleep(max(0.0, every_s - (time.monotonic() - t0) % every_s))
    return None


def measure(wan: Wan, relay: RelayInNs, mib: int, setup_n: int) -> dict[str, float]:
    setups = []
    for _ in range(setup_n):
        r = wan.echo(relay, 1000)
        if r.get("ok"):
            setups.append(r["setupMs"])
    nbytes = mib << 20
    cpu0 = cpu_seconds(relay)
    r = wan.echo(relay, nbytes, timeout_ms=300_000)
    cpu = cpu_seconds(relay) - cpu0
    ok = bool(r.get("ok")) and len(r["remotes"]) == 1 and relay.is_relay(r["remotes"][0])
    return {
        "setup_ms": statistics.median(setups) if setups else float("nan"),
        "setup_ok": len(setups) / setup_n,
        "mb_s": nbytes / 1e6 / (r["echoMs"] / 1000) if ok else float("nan"),
        "cpu_s_per_gb": cpu / (2 * nbytes / 1e9) if ok else float("nan"),
        "ok": float(ok),
    }


def scenario(delay_ms: float, loss: float, mib: int, setup_n: int, rounds: int) -> dict[str, Any]:
    with Wan(delay_ms=delay_ms, loss_percent=loss) as wan:
        probe = wan.probe_rtt()
        relays = {k: wan.start_relay(k, told_public=True) for k in KINDS}
        ready = {k: warm_up(wan, r) for k, r in relays.items()}  # steady state only: start-up is --firewall-starts
        per: dict[str, list[dict[str, float]]] = {k: [] for k in KINDS}
        for i in range(rounds):
            for k in KINDS if i % 2 == 0 else reversed(KINDS):
                per[k].append(measure(wan, relays[k], mib, setup_n))
                print(f"  round {i + 1} {k}: {per[k][-1]}", file=sys.stderr, flush=True)
        med = {k: {m: statistics.median(r[m] for r in rs) for m in rs[0]} for k, rs in per.items()}
        return {"delay_ms": delay_ms, "loss": loss, "probe": probe, "ready_s": ready, "relays": med, "rounds": per}


def upgrade_race(runs: int, relay_delay_ms: float = 0) -> dict[str, Any]:
    """Hang rate of relayed -> direct upgrades, per relay and relaying mode (`relay_delay_ms`: a
    distant relay, so the direct path between the nearby peers can form before the relayed one)."""
    out: dict[str, Any] = {}
    with Wan(nat="consistent", relay_delay_ms=relay_delay_ms) as wan:
        relays = {k: wan.start_relay(k, told_public=True) for k in KINDS}
        for i in range(runs):
            for mode in ("client", "server", "both"):
                for k in KINDS if i % 2 == 0 else reversed(KINDS):
                    rk = relays[k].key
                    server = {"relayThrough": rk} if mode in ("server", "both") else {}
                    r = wan.echo(
                        relays[k] if mode in ("client", "both") else None,
                        100_000,
                        timeout_ms=30_000,
                        upgrade=True,
                        server=server,
                    )
                    direct = bool(r.get("remotes")) and r["remotes"][-1]["host"] == wan.topo.router_wan("a")
                    s = out.setdefault(f"{k}/{mode}", {"runs": 0, "hangs": 0, "errors": []})
                    s["runs"] += 1
                    if not (r.get("ok") and direct):
                        s["hangs"] += 1
                        s["errors"].append(r.get("error"))
        return out


def firewall_starts(starts: int, *, loss: float = 0, limit_s: float = 330, every_s: float = 10) -> dict[str, Any]:
    """Seconds from a fresh relay start (as blind-relay-service runs it) to its first relayed echo:
    behind a security group admitting only --port, on an open host, and (with `loss`) on an open
    host with that much wan loss."""
    out: dict[str, Any] = {}
    conditions = [("security group", True, 0.0), ("open", False, 0.0)]
    if loss:
        conditions.append((f"open, {loss:g} % wan loss", False, loss))
    for name, walled, lossy in conditions:
        with Wan(loss_percent=lossy) as wan:
            for i in range(starts):
                for k in KINDS if i % 2 == 0 else reversed(KINDS):
                    port = next(_ports)
                    if walled:
                        wan.topo.firewall_relay_host(port)
                    relay = wan.start_relay(k, port)
                    first = warm_up(wan, relay, limit_s, every_s)
                    relay.stop()
                    wan.topo.open_relay_host()
                    out.setdefault(f"{k} / {name}", []).append({"first_echo_s": first})
                    print(f"  {k} / {name}: first relayed echo after {first} s", file=sys.stderr, flush=True)
    return out


def table(results: list[dict[str, Any]]) -> str:
    rows = [
        "| wan (one way per uplink / loss) | measured RTT LAN→relay, answered | relay | setup ms | echo MB/s "
        "| CPU-s per GB |",
        "|---|---|---|---:|---:|---:|",
    ]
    for s in results:
        p = s["probe"]
        wan = f"{s['delay_ms']:g} ms / {s['loss']:g} %"
        probe = f"{p['rtt_ms']:.2f} ms, {p['answered']}/{p['sent']}"
        for k in KINDS:
            m = s["relays"][k]
            rows.append(f"| {wan} | {probe} | {k} | {m['setup_ms']:.0f} | {m['mb_s']:.1f} | {m['cpu_s_per_gb']:.2f} |")
        py, nd = s["relays"]["python"], s["relays"]["node"]
        rows.append(
            f"| {wan} | | **python / node** | {py['setup_ms'] / nd['setup_ms']:.2f} | "
            f"{py['mb_s'] / nd['mb_s']:.2f} | {py['cpu_s_per_gb'] / nd['cpu_s_per_gb']:.2f} |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay-ms", type=float, default=10)
    ap.add_argument("--loss", type=float, default=1)
    ap.add_argument("--mib", type=int, default=8)
    ap.add_argument("--setup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--upgrade-runs", type=int, default=0)
    ap.add_argument("--relay-delay-ms", type=float, default=0, help="with --upgrade-runs: one-way delay to the relay")
    ap.add_argument("--firewall-starts", type=int, default=0)
    ap.add_argument("--start-loss", type=float, default=0, help="with --firewall-starts: also start on a lossy wan")
    ap.add_argument("--no-clean", action="store_true", help="skip the 0 ms / 0 %% baseline")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so every topology's teardown still runs
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report: dict[str, Any] = {"argv": sys.argv[1:], "scenarios": []}
    wans = [] if args.no_clean else [(0.0, 0.0)]
    wans += [(args.delay_ms, 0.0), (args.delay_ms, args.loss)]
    if args.rounds == 0:
        wans = []
    for delay, loss in wans:
        print(f"wan {delay} ms / {loss} %", file=sys.stderr, flush=True)
        report["scenarios"].append(scenario(delay, loss, args.mib, args.setup, args.rounds))
    if report["scenarios"]:
        print(table(report["scenarios"]))
    if args.upgrade_runs:
        report["upgrade_race"] = upgrade_race(args.upgrade_runs, args.relay_delay_ms)
        print("\n| relay/mode | runs | hangs |\n|---|---:|---:|")
        for k, v in report["upgrade_race"].items():
            print(f"| {k} | {v['runs']} | {v['hangs']} |")
    if args.firewall_starts:
        report["firewall"] = firewall_starts(args.firewall_starts, loss=args.start_loss)
        print("\n| relay / relay host | starts | first relayed echo after start (s) |\n|---|---:|---|")
        for k, v in report["firewall"].items():
            firsts = ", ".join("never" if r["first_echo_s"] is None else f"{r['first_echo_s']:.1f}" for r in v)
            print(f"| {k} | {len(v)} | {firsts} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
