"""The forwarding fast path across a lossy link: Python relay with GSO/GRO, with UDX_NO_GSO=1, with
UDX_COALESCE_US=0 (no receive coalescing), and the Node relay, in the namespace topology of
benchmarks/blocked_network_bench.py (its `Wan`: two NATed LANs, a userspace delay line per
uplink, nftables loss on the wan). Issue #12.

    sudo python3 benchmarks/udx_lossy.py [--delay-ms 10] [--loss 0.5] [--mib 12] [--rounds 3] [--gro]

Per relay, rounds alternating which goes first: MB/s of one echo of `--mib` MiB from LAN b to LAN a
through the relay, and the relay process's CPU-seconds per GB crossing it (echo = 2x payload).
Needs root, `ip`, `nft` and the npm packages of tests/interop (as the topology does).

`--gro` turns generic receive offload on for every veth of the topology (the legacy ethtool
ioctl ETHTOOL_SGRO, so no ethtool binary is needed; on veth it also switches the device to
NAPI, which is what lets GRO coalesce) and prints what each device reports afterwards. The
Python relay's socket asks for UDP_GRO, so runs of one peer arrive coalesced; `/stats` shows it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.blocked_network_bench import Wan, cpu_seconds, warm_up

#: Run inside a namespace: turn GRO on (argv[1] = 1) for each device named after it, print the
#: state read back (ETHTOOL_GGRO) per device, or the errno the kernel answered.
GRO_SET = """import fcntl, socket, struct, sys
ETHTOOL_GGRO, ETHTOOL_SGRO, SIOCETHTOOL = 0x2B, 0x2C, 0x8946
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
def ethtool(dev, cmd, data=0):
    value = bytearray(struct.pack("=II", cmd, data))
    ifr = struct.pack("16sP16x", dev.encode(), __import__("ctypes").addressof(
        (__import__("ctypes").c_char * 8).from_buffer(value)))
    fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifr)
    return struct.unpack("=II", value)[1]
for dev in sys.argv[2:]:
    try:
        ethtool(dev, ETHTOOL_SGRO, int(sys.argv[1]))
        print(dev, "gro", "on" if ethtool(dev, ETHTOOL_GGRO) else "off")
    except OSError as e:
        print(dev, "refused", e.errno)
"""


def enable_gro(wan: Wan) -> list[str]:
    """GRO on for every interface of every namespace of the topology; what each reports."""
    out = []
    for ns in wan.topo.namespaces:
        links = subprocess.run(["ip", "-n", ns, "-o", "link", "show"], capture_output=True, text=True).stdout
        devs = [
            ln.split(":")[1].strip().split("@")[0] for ln in links.splitlines() if "veth" in ln or "link/ether" in ln
        ]
        devs = [d for d in devs if d != "lo" and not d.startswith("br")]
        if not devs:
            continue
        r = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", GRO_SET, "1", *devs], capture_output=True, text=True
        )
        out += [f"{ns}: {ln}" for ln in (r.stdout + r.stderr).strip().splitlines()]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delay-ms", type=float, default=10, help="one way per uplink")
    ap.add_argument("--loss", type=float, default=0.5, help="percent of wan datagrams dropped")
    ap.add_argument("--mib", type=int, default=12, help="echoed per round (the peer writes it at once: < 16)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gro", action="store_true", help="turn GRO on for the topology's veths first")
    args = ap.parse_args()
    nbytes = args.mib << 20
    results: dict[str, list[tuple[float, float]]] = {}
    with Wan(delay_ms=args.delay_ms, loss_percent=args.loss) as wan:
        if args.gro:
            for line in enable_gro(wan):
                print(line, flush=True)
        probe = wan.probe_rtt()
        relays = {"node": wan.start_relay("node"), "python": wan.start_relay("python")}
        for name, value in (("UDX_NO_GSO", "1"), ("UDX_COALESCE_US", "0")):
            os.environ[name] = value  # inherited by the next relay process only
            try:
                relays[f"python {name}={value}"] = wan.start_relay("python")
            finally:
                del os.environ[name]
        for relay in relays.values():
            warm_up(wan, relay, limit_s=120, every_s=5)
        kinds = list(relays)
        for r in range(args.rounds):
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                relay = relays[kind]
                cpu0 = cpu_seconds(relay)
                out = wan.echo(relay, nbytes, timeout_ms=300_000)
                cpu = cpu_seconds(relay) - cpu0
                if not out.get("ok"):
                    print(f"round {r + 1} {kind}: failed: {out.get('error')}", flush=True)
                    continue
                mb_s = nbytes / 1e6 / (out["echoMs"] / 1000)
                per_gb = cpu / (2 * nbytes / 1e9)
                results.setdefault(kind, []).append((mb_s, per_gb))
                print(f"round {r + 1} {kind:20} {mb_s:6.2f} MB/s  {per_gb:6.2f} CPU-s/GB", flush=True)
    print(
        f"\n{args.mib} MiB echoed, {args.delay_ms:g} ms one way per uplink (RTT LAN→relay {probe['rtt_ms']:.1f} ms, "
        f"{probe['answered']}/{probe['sent']} answered), {args.loss:g} % loss, median of {args.rounds} rounds, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    )
    print("| relay | MB/s (min–max) | CPU-s per GB (min–max) |")
    print("|---|---:|---:|")
    for kind, v in results.items():
        mbs, cpu = [x for x, _ in v], [y for _, y in v]
        print(
            f"| {kind} | {statistics.median(mbs):.2f} ({min(mbs):.2f}–{max(mbs):.2f}) | "
            f"{statistics.median(cpu):.2f} ({min(cpu):.2f}–{max(cpu):.2f}) |"
        )


if __name__ == "__main__":
    main()
