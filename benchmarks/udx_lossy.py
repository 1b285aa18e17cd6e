"""The forwarding fast path across a lossy link: Python relay with GSO/GRO, with UDX_NO_GSO=1, with
UDX_COALESCE_US=100 (receive coalescing), and the Node relay, in the namespace topology of
benchmarks/blocked_network_bench.py (its `Wan`: two NATed LANs, a userspace delay line per
uplink, nftables loss on the wan). Issue #12.

    sudo python3 benchmarks/udx_lossy.py [--delay-ms 10] [--loss 0.5] [--mib 12] [--rounds 3] [--gro] [--kernel]

Per relay, rounds alternating which goes first: MB/s of one echo of `--mib` MiB from LAN b to LAN a
through the relay, and the relay process's CPU-seconds per GB crossing it (echo = 2x payload).
Needs root, `ip`, `nft` and the npm packages of tests/interop (as the topology does). `--kernel`
adds the Python relay with `--kernel-forwarding` (established pairs forwarded by nftables); its
CPU is then mostly the kernel's, spent outside the relay process, so every relay also gets the
machine's CPU-seconds per GB (all processes, the delay lines included).

`--gro` turns generic receive offload on for every veth of the topology (the legacy ethtool
ioctls, so no ethtool binary is needed) and prints what each device reports afterwards. On
this kernel that alone merges nothing: a veth takes the GRO (NAPI) path only for datagrams its
peer sent without TSO, and each datagram from a userspace sender is polled on its own. So on
the relay host's uplink `--gro` also turns TSO off on the bridge port facing it and sets a
GRO flush timeout (`--gro-flush-us`, sysfs `gro_flush_timeout`): the kernel then hands the
relay's UDP_GRO socket runs of one peer as one buffer. `--probe-gro` shows it on one veth
pair in namespaces of its own: 800 datagrams of 1,200 bytes from a userspace sender to a
UDP_GRO socket, for each combination of these settings, and how many buffers they arrived in.
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
from benchmarks.udx_forward import machine_cpu

#: Run inside a namespace: `gro|tso 0|1 DEV...` sets the feature with the legacy ethtool ioctl
#: (ETHTOOL_SGRO / ETHTOOL_STSO) and prints what each device reports back, or the errno.
ETHTOOL_SET = """import ctypes, fcntl, socket, struct, sys
CMDS = {"gro": (0x2B, 0x2C), "tso": (0x1E, 0x1F)}
SIOCETHTOOL = 0x8946
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
def ethtool(dev, cmd, data=0):
    value = bytearray(struct.pack("=II", cmd, data))
    ifr = struct.pack("16sP16x", dev.encode(), ctypes.addressof((ctypes.c_char * 8).from_buffer(value)))
    fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifr)
    return struct.unpack("=II", value)[1]
get, put = CMDS[sys.argv[1]]
for dev in sys.argv[3:]:
    try:
        ethtool(dev, put, int(sys.argv[2]))
        print(dev, sys.argv[1], "on" if ethtool(dev, get) else "off")
    except OSError as e:
        print(dev, sys.argv[1], "refused", e.errno)
"""


def _ns_exec(ns: str, *argv: str) -> str:
    r = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True)
    return (r.stdout + r.stderr).strip()


def enable_gro(wan: Wan, flush_us: int) -> list[str]:
    """GRO on for every veth of the topology, and on the relay host's uplink what makes veth
    GRO actually merge (found on this kernel, 6.18): the sending veth (the bridge port facing
    the relay) without TSO, so forwarded datagrams take the receiver's NAPI path, and a GRO
    flush timeout on the receiving one, so datagrams polled one by one still merge. What each
    device reports afterwards is returned."""
    out = []
    for ns in wan.topo.namespaces:
        links = subprocess.run(["ip", "-n", ns, "-o", "link", "show"], capture_output=True, text=True).stdout
        devs = [ln.split(":")[1].strip().split("@")[0] for ln in links.splitlines() if "link/ether" in ln]
        devs = [d for d in devs if not d.startswith("br")]
        if devs:
            out += [
                f"{ns}: {ln}" for ln in _ns_exec(ns, sys.executable, "-c", ETHTOOL_SET, "gro", "1", *devs).splitlines()
            ]
    wan_ns, relay_ns = wan.topo.ns("wan"), wan.topo.ns("relay")
    out.append(f"{wan_ns}: " + _ns_exec(wan_ns, sys.executable, "-c", ETHTOOL_SET, "tso", "0", "prelay"))
    sysfs = (
        f"echo {flush_us * 1000} > /sys/class/net/wan0/gro_flush_timeout; "
        "echo 2 > /sys/class/net/wan0/napi_defer_hard_irqs; "
        "echo gro_flush_timeout $(cat /sys/class/net/wan0/gro_flush_timeout) ns"
    )
    out.append(f"{relay_ns}: wan0 " + _ns_exec(relay_ns, "sh", "-c", sysfs))
    return out


PROBE_RECEIVER = """import socket, struct
r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
r.bind(("10.9.0.2", 9000)); r.setsockopt(17, 104, 1); r.settimeout(1)
print("ready", flush=True)
got = []
try:
    while True:
        d, anc, _, _ = r.recvmsg(65536, 64)
        seg = [struct.unpack("=H", c[2][:2])[0] for c in anc if c[0] == 17 and c[1] == 104]
        got.append((len(d), seg[0] if seg else 0))
except socket.timeout:
    pass
print(len(got), sum(-(-n // g) if g else 1 for n, g in got), max((n for n, _ in got), default=0))
"""
PROBE_SENDER = """import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(800):
    s.sendto(b"x" * 1200, ("10.9.0.2", 9000))
"""


def probe_gro(flush_us: int) -> None:
    """One veth pair (namespaces named after this pid): which settings make GRO merge."""
    a, b = f"gsoprobe{os.getpid()}a", f"gsoprobe{os.getpid()}b"
    for ns in (a, b):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(
            ["ip", "link", "add", "v0", "netns", a, "type", "veth", "peer", "name", "v1", "netns", b], check=True
        )
        for ns, dev, addr in ((a, "v0", "10.9.0.1/24"), (b, "v1", "10.9.0.2/24")):
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
            subprocess.run(["ip", "-n", ns, "addr", "add", addr, "dev", dev], check=True)
        print("| receiving veth GRO | sending veth TSO | GRO flush timeout | buffers for 800 datagrams | largest |")
        print("|---|---|---:|---:|---:|")
        for gro, tso, flush in ((0, 1, 0), (1, 1, 0), (1, 1, flush_us), (1, 0, 0), (1, 0, flush_us)):
            _ns_exec(b, sys.executable, "-c", ETHTOOL_SET, "gro", str(gro), "v1")
            _ns_exec(a, sys.executable, "-c", ETHTOOL_SET, "tso", str(tso), "v0")
            _ns_exec(b, "sh", "-c", f"echo {flush * 1000} > /sys/class/net/v1/gro_flush_timeout")
            rx = subprocess.Popen(
                ["ip", "netns", "exec", b, sys.executable, "-c", PROBE_RECEIVER], stdout=subprocess.PIPE, text=True
            )
            assert rx.stdout is not None
            rx.stdout.readline()
            _ns_exec(a, sys.executable, "-c", PROBE_SENDER)
            buffers, datagrams, largest = rx.stdout.read().split()
            rx.wait()
            print(
                f"| {'on' if gro else 'off'} | {'on' if tso else 'off'} | {flush} µs | {buffers} "
                f"({datagrams} datagrams) | {largest} B |"
            )
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delay-ms", type=float, default=10, help="one way per uplink")
    ap.add_argument("--loss", type=float, default=0.5, help="percent of wan datagrams dropped")
    ap.add_argument("--mib", type=int, default=12, help="echoed per round (the peer writes it at once: < 16)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gro", action="store_true", help="turn GRO on for the topology's veths first")
    ap.add_argument("--gro-flush-us", type=int, default=100, help="with --gro: the relay uplink's GRO flush timeout")
    ap.add_argument("--probe-gro", action="store_true", help="only probe which veth settings make GRO merge")
    ap.add_argument(
        "--kernel",
        action="store_true",
        help="also run the Python relay with --kernel-forwarding (ip_forward=1 on the relay host for every relay)",
    )
    args = ap.parse_args()
    if args.probe_gro:
        probe_gro(args.gro_flush_us)
        return
    nbytes = args.mib << 20
    results: dict[str, list[tuple[float, float]]] = {}
    with Wan(delay_ms=args.delay_ms, loss_percent=args.loss) as wan:
        if args.gro:
            for line in enable_gro(wan, args.gro_flush_us):
                print(line, flush=True)
        probe = wan.probe_rtt()
        # the Node relay starts as dht-rpc makes a relay on a public address once its NAT check
        # concludes (as relay_bench.py runs it): left to find out here, it did not within 120 s
        relays = {"node": wan.start_relay("node", told_public=True), "python": wan.start_relay("python")}
        if args.kernel:
            # a relay host forwarding pairs in the kernel needs IP forwarding (the Node relay and
            # the plain Python relay do not forward, so this changes nothing for them)
            wan.topo.exec_in("relay", "sysctl", "-qw", "net.ipv4.ip_forward=1")
            relays["python --kernel-forwarding"] = wan.start_relay("python", extra=("--kernel-forwarding",))
        for name, value in (("UDX_NO_GSO", "1"), ("UDX_COALESCE_US", "100")):
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
                cpu0, m0 = cpu_seconds(relay), machine_cpu()
                out = wan.echo(relay, nbytes, timeout_ms=300_000)
                cpu, machine = cpu_seconds(relay) - cpu0, machine_cpu() - m0
                if not out.get("ok"):
                    print(f"round {r + 1} {kind}: failed: {out.get('error')}", flush=True)
                    continue
                mb_s = nbytes / 1e6 / (out["echoMs"] / 1000)
                per_gb = cpu / (2 * nbytes / 1e9)
                machine_gb = machine / (2 * nbytes / 1e9)
                results.setdefault(kind, []).append((mb_s, per_gb, machine_gb))
                print(
                    f"round {r + 1} {kind:20} {mb_s:6.2f} MB/s  {per_gb:6.2f} CPU-s/GB  "
                    f"machine {machine_gb:6.2f} CPU-s/GB",
                    flush=True,
                )
    print(
        f"\n{args.mib} MiB echoed, {args.delay_ms:g} ms one way per uplink (RTT LAN→relay {probe['rtt_ms']:.1f} ms, "
        f"{probe['answered']}/{probe['sent']} answered), {args.loss:g} % loss, median of {args.rounds} rounds, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    )
    print("| relay | MB/s (min–max) | relay CPU-s per GB (min–max) | machine CPU-s per GB (min–max) |")
    print("|---|---:|---:|---:|")
    for kind, v in results.items():
        mbs, cpu, mach = [x[0] for x in v], [x[1] for x in v], [x[2] for x in v]
        print(
            f"| {kind} | {statistics.median(mbs):.2f} ({min(mbs):.2f}–{max(mbs):.2f}) | "
            f"{statistics.median(cpu):.2f} ({min(cpu):.2f}–{max(cpu):.2f}) | "
            f"{statistics.median(mach):.2f} ({min(mach):.2f}–{max(mach):.2f}) |"
        )


if __name__ == "__main__":
    main()
