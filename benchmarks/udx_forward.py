"""Blind forwarding: relay.udx's relay_to (Python) against udx-native's relayTo (Node), one run.

Two udx-native endpoints A and D (tests/interop/js/udx_peer.js) connect to a relay process
set up as blind-relay does it (two raw streams, firewall-connect on the first packet,
relay_to both ways). A sends `--mb` MB to D through the relay (with `--both`, D sends the same
back at the same time). Rounds alternate Node / Python. Reported per relay: forwarded MB/s
(payload bytes / wall time), the relay process's CPU seconds (user+sys, psutil) per GB of
payload and per forwarded packet, and the Python/Node ratios.

    python benchmarks/udx_forward.py --mb 256 --rounds 5 [--both] [--portable] [--no-gso] [--coalesce] [--profile]
    python benchmarks/udx_forward.py --echo 400 [--echo-bulk-mb 128 --echo-gap-ms 2]   # ping round trips
    python benchmarks/udx_forward.py --pairs 8 --mb 256 --rounds 3     # 8 pairs at once, 256 MB in all
    python benchmarks/udx_forward.py --rss-pairs 1000 --rounds 3        # RSS with 1,000 active pairs

`--pairs N` runs N relayed pairs at once (benchmarks/js/udx_pairs.js: one process per side,
one socket per endpoint) and reports aggregate throughput and CPU per GB. `--rss-pairs N`
sets up N pairs (50 endpoints per socket), has every pair carry 16 KiB each way, and reports
the relay process's RSS while all of them are live. Rounds alternate which relay goes first.
`--kernel` also runs the Python relay with kernel forwarding (`relay.udx.kernel`, nftables,
needs root); `--no-gso` also runs the Python relay with UDX_NO_GSO=1, `--coalesce` with receive coalescing
(UDX_COALESCE_US, `--coalesce-us`, default 100). `--echo N`: N ping round trips per round
through the relay (raw UDP sockets as the two peers of one pair; `--echo-bulk-mb`: while two
udx-native peers move that much on another pair of the same relay). `--profile` adds one Python round
under cProfile and prints where the relay's time goes. `--baseline REV|DIR` also runs another
revision's Python relay (benchmarks/baseline.py) in the same rounds, for a before/after from one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pstats
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
INTEROP = ROOT / "tests" / "interop"
PEER_JS = INTEROP / "js" / "udx_peer.js"
NODE_RELAY_JS = ROOT / "benchmarks" / "js" / "udx_relay.js"
PY_RELAY = ROOT / "benchmarks" / "udx_relay_py.py"
PAIRS_JS = ROOT / "benchmarks" / "js" / "udx_pairs.js"
MB = 1 << 20


class Proc:
    """A child speaking JSON lines."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.queues: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self.log: list[dict[str, Any]] = []
        self.task = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, *argv: str, **extra_env: str) -> Proc:
        env = dict(os.environ, NODE_PATH=str(INTEROP / "node_modules"), **extra_env)
        p = await asyncio.create_subprocess_exec(
            *argv, cwd=INTEROP, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        return cls(p)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            ev = json.loads(line)
            self.log.append(ev)
            self._queue(ev.get("event", "")).put_nowait(ev)

    def _queue(self, event: str) -> asyncio.Queue[dict[str, Any]]:
        return self.queues.setdefault(event, asyncio.Queue())

    async def expect(self, event: str, timeout: float = 60) -> dict[str, Any]:
        """The next event of this kind (events of other kinds wait in their own queues)."""
        return await asyncio.wait_for(self._queue(event).get(), timeout)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((line + "\n").encode())

    def cmd(self, **msg: Any) -> None:
        self.send(json.dumps(msg))

    async def stop(self) -> None:
        if self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        self.task.cancel()


@dataclass
class Result:
    relay: str
    seconds: float
    cpu: float
    payload: int
    packets: int
    retransmits: int
    offload: str = ""
    rss: int = 0
    sys_share: float = 0.0  # kernel part of the relay's CPU
    # CPU-seconds per wall second of the sending and receiving endpoint processes: near 1.0 the
    # endpoint (one Node event loop) is what limits throughput, whichever relay is between them
    sender_busy: float = 0.0
    receiver_busy: float = 0.0
    machine: float = 0.0  # CPU-seconds of the whole machine during the round

    @property
    def machine_per_gb(self) -> float:
        return self.machine / (self.payload / 1e9)

    @property
    def mb_s(self) -> float:
        return self.payload / MB / self.seconds

    @property
    def cpu_per_gb(self) -> float:
        return self.cpu / (self.payload / 1e9)

    @property
    def us_per_packet(self) -> float:
        return self.cpu / max(self.packets, 1) * 1e6


ENVS = {
    "portable": {"UDX_NO_MMSG": "1"},
    "no-gso": {"UDX_NO_GSO": "1"},
    "coalesce": {"UDX_COALESCE_US": "100"},
}
KIND_ARGS = {"kernel": ["--kernel"]}
#: `--baseline`: the other revision's relay, run as "baseline"
BASELINE: Any = None


def machine_cpu() -> float:
    """CPU-seconds the whole machine spent busy so far (every process and the kernel's softirq
    work): kernel forwarding runs in whichever process's context the packet arrives, mostly the
    sender's, so only this total compares relays fairly."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


async def start_relay(kind: str, *ids: str, profile: str | None = None) -> Proc:
    if kind == "node":
        return await Proc.start("node", str(NODE_RELAY_JS), *ids)
    extra = (["--profile", profile] if profile else []) + KIND_ARGS.get(kind, [])
    if kind == "baseline":
        script = BASELINE.tree / "benchmarks" / "udx_relay_py.py"
        return await Proc.start(BASELINE.python, str(script), *ids, *extra)
    return await Proc.start(sys.executable, str(PY_RELAY), *ids, *extra, **ENVS.get(kind, {}))


async def offload_summary(kind: str, relay: Proc) -> str:
    """For Python relays: how the forwarded datagrams went out (mean datagrams per GSO send)."""
    if kind == "node":
        return ""
    relay.send("stats")
    st = await relay.expect("stats")
    k = st.get("kernel")
    if k is not None:
        share = 100 * k["packets"] / max(k["packets"] + st["relayed_packets"] - k["packets"], 1)
        return f"kernel forwarded {k['packets']} packets ({share:.1f}% of relayed), {k['directions']} directions"
    if not st["gso_sends"]:
        return f"gso {st['offload']['gso']}, no segmented sends"
    return (
        f"{st['gso_segments'] / st['gso_sends']:.1f} datagrams/GSO send, "
        f"{100 * st['gso_segments'] / max(st['relayed_packets'], 1):.0f}% segmented, {st.get('holds', 0)} holds, "
        f"{st['received_packets'] / max(st.get('reads', 0), 1):.1f} datagrams/read"
    )


async def connect_pair(a: Proc, d: Proc, rb: int, rc: int, port: int) -> None:
    """Connect two udx-native endpoints to their relay streams and have both speak first, as
    secret-stream's header frames do, so the relay learns both addresses (the first may reach a
    relay stream whose partner is unknown yet: udx-native drops it)."""
    a.cmd(cmd="connect", remote_id=rb, port=port)
    d.cmd(cmd="connect", remote_id=rc, port=port)
    await a.expect("connected")
    await d.expect("connected")
    got_a = asyncio.ensure_future(a.expect("message"))
    got_d = asyncio.ensure_future(d.expect("message"))
    while not (got_a.done() and got_d.done()):
        a.cmd(cmd="message", hex="00")
        d.cmd(cmd="message", hex="00")
        await asyncio.wait([got_a, got_d], timeout=0.05, return_when=asyncio.ALL_COMPLETED)


async def one_round(kind: str, size: int, both: bool, profile: str | None = None) -> Result:
    a = await Proc.start("node", str(PEER_JS))
    d = await Proc.start("node", str(PEER_JS))
    ra, rd = await a.expect("ready"), await d.expect("ready")
    relay = await start_relay(kind, str(ra["id"]), str(rd["id"]), profile=profile)
    try:
        info = await relay.expect("ready")
        await connect_pair(a, d, info["rb"], info["rc"], info["port"])
        ps = psutil.Process(relay.proc.pid)
        ends = Endpoints(a, d)
        c0 = ps.cpu_times()
        p0 = await packets_sent(a, d)
        m0 = machine_cpu()
        t0 = time.perf_counter()
        a.cmd(cmd="send", bytes=size, end=False)
        if both:
            d.cmd(cmd="send", bytes=size, end=False)
        await a.expect("sent", 300)
        a.cmd(cmd="end")
        if both:
            await d.expect("sent", 300)
            d.cmd(cmd="end")
        got = await d.expect("data_end", 300)
        if both:
            await a.expect("data_end", 300)
        t1 = time.perf_counter()
        m1 = machine_cpu()
        c1 = ps.cpu_times()
        p1 = await packets_sent(a, d)
        assert got["bytes"] == size
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        packets = p1[0] - p0[0]  # every packet either endpoint sent crossed the relay
        off = await offload_summary(kind, relay)
        res = Result(kind, t1 - t0, cpu, size * (2 if both else 1), packets, p1[1] - p0[1], off)
        res.sys_share = (c1.system - c0.system) / max(cpu, 1e-9)
        res.sender_busy, res.receiver_busy = ends.busy(t1 - t0)
        res.machine = m1 - m0
        return res
    except TimeoutError:
        for name, p in (("A", a), ("D", d), ("relay", relay)):
            print(f"{kind} relay round timed out; {name} said: {p.log[-5:]}", file=sys.stderr)
        raise
    finally:
        for p in (a, d, relay):
            await p.stop()


async def echo_round(kind: str, samples: int, gap: float, bulk: int) -> list[float]:
    """Round trips (seconds) of one small datagram through the relay and straight back: raw
    UDP sockets as two peers of one relayed pair, one ping every `gap` seconds. With `bulk`,
    two udx-native peers on a second pair of the same relay move that many bytes meanwhile."""
    from relay.udx.packet import DEFAULT_RWND, HEARTBEAT, encode

    loop = asyncio.get_running_loop()
    pa_id, pd_id = 0xE0000001, 0xE0000002
    ea, ed = (socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2))
    for e in (ea, ed):
        e.bind(("127.0.0.1", 0))
        e.setblocking(False)
    peers: list[Proc] = []
    wanted = [[pa_id, pd_id]]
    if bulk:
        a = await Proc.start("node", str(PEER_JS))
        d = await Proc.start("node", str(PEER_JS))
        peers = [a, d]
        ra, rd = await a.expect("ready"), await d.expect("ready")
        wanted.append([ra["id"], rd["id"]])
    relay = await start_relay(kind, json.dumps(wanted))
    try:
        info = await relay.expect("ready")
        (rb, rc) = info["pairs"][0]
        dst = ("127.0.0.1", info["port"])
        # both ends speak first so the relay learns both addresses (the first may be dropped)
        while True:
            ed.sendto(encode(HEARTBEAT, rc, DEFAULT_RWND, 0, 0), dst)
            ea.sendto(encode(HEARTBEAT, rb, DEFAULT_RWND, 0, 0), dst)
            try:
                await asyncio.wait_for(loop.sock_recv(ed, 2048), 0.2)
                break
            except TimeoutError:
                continue
        with contextlib.suppress(BlockingIOError):
            while True:
                ea.recv(2048)
        bulk_task = None
        if bulk:
            a, d = peers
            await connect_pair(a, d, info["pairs"][1][0], info["pairs"][1][1], info["port"])
            a.cmd(cmd="send", bytes=bulk, end=True)
            bulk_task = asyncio.ensure_future(d.expect("data_end", 300))
        rtts: list[float] = []
        for seq in range(samples):
            if bulk_task is not None and bulk_task.done():
                break
            t0 = time.perf_counter()
            ea.sendto(encode(HEARTBEAT, rb, DEFAULT_RWND, seq, 0), dst)
            await asyncio.wait_for(loop.sock_recv(ed, 2048), 10)
            ed.sendto(encode(HEARTBEAT, rc, DEFAULT_RWND, seq, 0), dst)
            await asyncio.wait_for(loop.sock_recv(ea, 2048), 10)
            rtts.append(time.perf_counter() - t0)
            await asyncio.sleep(gap)
        if bulk_task is not None:
            await bulk_task
        return rtts
    finally:
        for p in (*peers, relay):
            await p.stop()
        ea.close()
        ed.close()


async def pairs_round(kind: str, npairs: int, size: int, per_socket: int = 1, rss_only: bool = False) -> Result:
    """`npairs` relayed pairs at once: A-side endpoints send `size` bytes in all to D-side ones."""
    a = await Proc.start("node", str(PAIRS_JS), str(npairs), str(per_socket))
    d = await Proc.start("node", str(PAIRS_JS), str(npairs), str(per_socket))
    ra, rd = await a.expect("ready"), await d.expect("ready")
    relay = await start_relay(kind, json.dumps(list(zip(ra["ids"], rd["ids"], strict=True))))
    try:
        info = await relay.expect("ready")
        a.cmd(cmd="connect", remotes=[rb for rb, _ in info["pairs"]], port=info["port"])
        d.cmd(cmd="connect", remotes=[rc for _, rc in info["pairs"]], port=info["port"])
        await a.expect("connected")
        await d.expect("connected")
        while True:  # both ends speak first, so the relay learns every address
            a.cmd(cmd="hello")
            d.cmd(cmd="hello")
            ha, hd = await a.expect("hello"), await d.expect("hello")
            if ha["heard"] == npairs and hd["heard"] == npairs:
                break
            await asyncio.sleep(0.05)
        ps = psutil.Process(relay.proc.pid)
        per_pair = size // npairs
        if rss_only:  # every pair carries data both ways, all stay open: RSS of the live relay
            a.cmd(cmd="expect", bytes=per_pair)
            d.cmd(cmd="expect", bytes=per_pair)
            a.cmd(cmd="send", bytes=per_pair, end=False)
            d.cmd(cmd="send", bytes=per_pair, end=False)
            await a.expect("received", 300)
            await d.expect("received", 300)
            rss = ps.memory_info().rss
            return Result(kind, 0.0, 0.0, 2 * per_pair * npairs, 0, 0, "", rss)
        ends = Endpoints(a, d)
        c0 = ps.cpu_times()
        p0 = await packets_sent(a, d)
        m0 = machine_cpu()
        t0 = time.perf_counter()
        a.cmd(cmd="send", bytes=per_pair, end=True)
        got = await d.expect("data_end", 600)
        t1 = time.perf_counter()
        m1 = machine_cpu()
        c1 = ps.cpu_times()
        p1 = await packets_sent(a, d)
        assert got["bytes"] == per_pair * npairs, got
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        off = await offload_summary(kind, relay)
        res = Result(kind, t1 - t0, cpu, per_pair * npairs, p1[0] - p0[0], p1[1] - p0[1], off)
        res.machine = m1 - m0
        res.sys_share = (c1.system - c0.system) / max(cpu, 1e-9)
        res.sender_busy, res.receiver_busy = ends.busy(t1 - t0)
        return res
    except TimeoutError:
        for name, p in (("A", a), ("D", d), ("relay", relay)):
            print(f"{kind} relay round timed out; {name} said: {p.log[-5:]}", file=sys.stderr)
        raise
    finally:
        for p in (a, d, relay):
            await p.stop()


class Endpoints:
    """CPU times of the sending and receiving endpoint processes from now on."""

    def __init__(self, sender: Proc, receiver: Proc) -> None:
        self.procs = [psutil.Process(p.proc.pid) for p in (sender, receiver)]
        self.start = [sum(p.cpu_times()[:2]) for p in self.procs]

    def busy(self, seconds: float) -> tuple[float, float]:
        used = [sum(p.cpu_times()[:2]) - c for p, c in zip(self.procs, self.start, strict=True)]
        return used[0] / seconds, used[1] / seconds


async def packets_sent(*peers: Proc) -> tuple[int, int]:
    """(packets sent, retransmissions) summed over the endpoints."""
    total = retransmits = 0
    for p in peers:
        p.cmd(cmd="stats")
        st = await p.expect("stats")
        total += st["packetsTransmitted"]
        retransmits += st["retransmits"]
    return total, retransmits


def print_profile(path: str) -> None:
    st = pstats.Stats(path)
    st.sort_stats("tottime")
    total = sum(v[2] for v in st.stats.values())  # type: ignore[attr-defined]
    print(f"\nPython relay profile (cProfile on thread CPU time, tottime; total {total:.2f} s):")
    rows = sorted(st.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:12]  # type: ignore[attr-defined]
    for (file, line, fn), (_cc, nc, tt, _ct, _callers) in rows:
        where = f"{Path(file).name}:{line}" if line else file
        print(f"  {tt:7.3f} s  {100 * tt / total:5.1f}%  {nc:>9}  {fn}  ({where})")


LABELS = {
    "node": "Node udx-native relayTo",
    "python": "Python relay.udx relay_to",
    "no-gso": "Python, UDX_NO_GSO=1 (sendmmsg, no GSO/GRO)",
    "portable": "Python, per-datagram reader (no mmsg)",
    "coalesce": "Python, UDX_COALESCE_US=100 (receive coalescing)",
    "kernel": "Python, --kernel (established pairs forwarded by nftables)",
    "baseline": "Python, baseline",
}


def spread(values: list[float]) -> str:
    return f"{min(values):.1f}–{max(values):.1f}" if len(values) > 1 else f"{values[0]:.1f}"


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=256, help="MB per round (in all, over every pair)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--both", action="store_true", help="send in both directions at once (one pair)")
    ap.add_argument("--pairs", type=int, default=1, help="relayed pairs at once")
    ap.add_argument("--rss-pairs", type=int, default=0, help="measure RSS with this many active pairs")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument(
        "--portable", action="store_true", help="also run the Python relay without recvmmsg/sendmmsg (UDX_NO_MMSG=1)"
    )
    ap.add_argument("--no-gso", action="store_true", help="also run the Python relay with UDX_NO_GSO=1")
    ap.add_argument("--coalesce", action="store_true", help="also run the Python relay with UDX_COALESCE_US=100")
    ap.add_argument(
        "--kernel", action="store_true", help="also run the Python relay with kernel forwarding (nftables, root)"
    )
    ap.add_argument("--echo", type=int, default=0, help="measure this many ping round trips per round instead")
    ap.add_argument("--echo-gap-ms", type=float, default=5.0, help="idle time between pings")
    ap.add_argument(
        "--echo-bulk-mb", type=int, default=0, help="with --echo: a bulk transfer on another pair meanwhile"
    )
    ap.add_argument("--coalesce-us", type=int, default=100, help="with --coalesce: the hold (UDX_COALESCE_US)")
    ap.add_argument(
        "--baseline", default=None, help="also another revision's Python relay (a git revision or a checkout directory)"
    )
    args = ap.parse_args()
    global BASELINE
    tmp_tree = tempfile.TemporaryDirectory(prefix="udx-forward-baseline-")
    if args.baseline:
        sys.path.insert(0, str(ROOT))
        from benchmarks.baseline import baseline

        BASELINE = baseline(args.baseline, Path(tmp_tree.name))
        LABELS["baseline"] = f"Python, baseline {args.baseline}"
    ENVS["coalesce"] = {"UDX_COALESCE_US": str(args.coalesce_us)}
    LABELS["coalesce"] = f"Python, UDX_COALESCE_US={args.coalesce_us} (receive coalescing)"
    size = args.mb * MB
    kinds = (
        ["node", "python"]
        + (["kernel"] if args.kernel else [])
        + (["coalesce"] if args.coalesce else [])
        + (["no-gso"] if args.no_gso else [])
        + (["portable"] if args.portable else [])
        + (["baseline"] if args.baseline else [])
    )
    results: dict[str, list[Result]] = {k: [] for k in kinds}
    load0 = os.getloadavg()
    echoes: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:  # alternate who goes first
            if args.echo:
                rtts = await echo_round(kind, args.echo, args.echo_gap_ms / 1000, args.echo_bulk_mb * MB)
                echoes[kind].extend(rtts)
                q = statistics.quantiles(rtts, n=100)
                print(
                    f"round {r + 1} {kind:8}: {len(rtts)} round trips, median {1e6 * statistics.median(rtts):.0f} us, "
                    f"p90 {1e6 * q[89]:.0f} us, p99 {1e6 * q[98]:.0f} us",
                    flush=True,
                )
                continue
            if args.rss_pairs:
                res = await pairs_round(kind, args.rss_pairs, args.rss_pairs * 16384, per_socket=50, rss_only=True)
                results[kind].append(res)
                print(f"round {r + 1} {kind:8}: RSS {res.rss / MB:6.1f} MB with {args.rss_pairs} pairs", flush=True)
                continue
            if args.pairs > 1:
                res = await pairs_round(kind, args.pairs, size)
            else:
                res = await one_round(kind, size, args.both)
            results[kind].append(res)
            print(
                f"round {r + 1} {kind:8}: {res.mb_s:7.1f} MB/s  cpu {res.cpu:6.2f} s  "
                f"{res.cpu_per_gb:5.2f} cpu-s/GB  {res.packets} pkts  {res.us_per_packet:5.2f} us/pkt  "
                f"{res.retransmits} retransmits  sys {100 * res.sys_share:.0f}%  "
                f"sender {100 * res.sender_busy:.0f}% receiver {100 * res.receiver_busy:.0f}% busy  {res.offload}",
                flush=True,
            )
    load1 = os.getloadavg()
    where = f"relay on 127.0.0.1, {os.cpu_count()} cores, load average {load0[0]:.1f} → {load1[0]:.1f}"
    if args.echo:
        during = f", during a {args.echo_bulk_mb} MB transfer on another pair" if args.echo_bulk_mb else ""
        print(f"\nping round trips through the relay, one every {args.echo_gap_ms:g} ms{during}, {where}")
        print("| forwarder | median µs | p90 µs | p99 µs | samples |")
        print("|---|---:|---:|---:|---:|")
        for k in kinds:
            rtts = echoes[k]
            q = statistics.quantiles(rtts, n=100)
            print(
                f"| {LABELS[k]} | {1e6 * statistics.median(rtts):.0f} | {1e6 * q[89]:.0f} | {1e6 * q[98]:.0f} "
                f"| {len(rtts)} |"
            )
        return
    if args.rss_pairs:
        print(f"\nRSS with {args.rss_pairs} active relayed pairs, median of {args.rounds} rounds, {where}")
        print("| forwarder | RSS (MB) | rounds (min–max) |")
        print("|---|---:|---:|")
        med_rss = {k: statistics.median(x.rss / MB for x in v) for k, v in results.items()}
        for k in kinds:
            print(f"| {LABELS[k]} | {med_rss[k]:.1f} | {spread([x.rss / MB for x in results[k]])} |")
        print(f"| ratio Python/Node | {med_rss['python'] / med_rss['node']:.2f} | |")
        return
    med = {
        k: (
            statistics.median(x.mb_s for x in v),
            statistics.median(x.cpu_per_gb for x in v),
            statistics.median(x.us_per_packet for x in v),
            statistics.median(x.machine_per_gb for x in v),
        )
        for k, v in results.items()
    }
    direction = "both ways" if args.both else "one way"
    shape = f"{args.pairs} pairs at once" if args.pairs > 1 else "one pair"
    print(f"\n{args.mb} MB {direction}, {shape}, median of {args.rounds} rounds, {where}")
    print(
        "| forwarder | MB/s (min–max) | relay CPU-s per GB (min–max) | relay CPU µs per packet "
        "| machine CPU-s per GB (min–max) | sender busy |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for k in kinds:
        v = results[k]
        busy = statistics.median(x.sender_busy for x in v)
        print(
            f"| {LABELS[k]} | {med[k][0]:.1f} ({spread([x.mb_s for x in v])}) | "
            f"{med[k][1]:.2f} ({spread([x.cpu_per_gb for x in v])}) | {med[k][2]:.2f} | "
            f"{med[k][3]:.2f} ({spread([x.machine_per_gb for x in v])}) | {100 * busy:.0f}% |"
        )
    for k in [k for k in kinds if k in ("python", "kernel", "baseline")]:
        name = {"python": "Python", "kernel": "Python --kernel", "baseline": "baseline"}[k]
        print(
            f"| ratio {name}/Node | {med[k][0] / med['node'][0]:.2f} | "
            f"{med[k][1] / med['node'][1]:.2f} | {med[k][2] / med['node'][2]:.2f} | "
            f"{med[k][3] / med['node'][3]:.2f} | |"
        )
    for k in [k for k in kinds if k in ("python", "baseline")]:
        cpu = [x.cpu_per_gb / n.cpu_per_gb for x, n in zip(results[k], results["node"], strict=True)]
        tp = [x.mb_s / n.mb_s for x, n in zip(results[k], results["node"], strict=True)]
        print(
            f"{k} / Node per round: CPU per GB {' '.join(f'{x:.2f}' for x in cpu)} (median "
            f"{statistics.median(cpu):.2f}), throughput {' '.join(f'{x:.2f}' for x in tp)} "
            f"(median {statistics.median(tp):.2f})"
        )
    tmp_tree.cleanup()
    if args.profile:
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "relay.prof")
            res = await one_round("python", size, args.both, profile=path)
            print(f"\nprofiled round: {res.mb_s:.1f} MB/s, {res.cpu_per_gb:.2f} cpu-s/GB (profiler overhead included)")
            print_profile(path)


if __name__ == "__main__":
    asyncio.run(main())
