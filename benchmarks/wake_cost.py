"""What one relay wake costs, against a floor that makes no decision at all, in one process.

    python3 benchmarks/wake_cost.py [--datagrams 1,4,16] [--wakes 20000] [--flush-kb 0] [--cpu 1]

A chatty relay is woken for one datagram or a few (benchmarks/chatty.py). This times the relay's
reader itself (`UDXSocket._on_readable_mmsg`: `recvmmsg`, the forwarding decisions, the send) for
k datagrams of k relayed pairs waiting on the socket, and, on the same socket and pairs, a floor:
`recvmmsg` and one send of the same datagrams to the same destinations with no lookup, no check
and no count (`BatchIO` calls only). The peers are raw UDP sockets in this process; each wake's
datagrams are sent before the clock starts, so only the reader is timed (syscalls included).
Medians over `--wakes` wakes.

`--flush-kb K` writes K KiB of memory between wakes (outside the timing): in a real relay the
peers run on the same cores between wakes and evict the relay's working set, which is where a
Python wake costs most (L2 is 2 MiB per core on the box the docs' figures come from, so 1536
evicts most of it). The difference ours − floor is what the decisions cost; the floor itself is
the syscalls plus entering Python, which no change to the decisions can remove.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from relay.udx import UDX, UDXSocket, UDXStream
from relay.udx.packet import DATA, DEFAULT_RWND, encode

LOOP = "127.0.0.1"


def _firewall(peer_id: int) -> Callable[[UDXStream, UDXSocket, tuple[str, int]], bool]:
    def firewall(stream: UDXStream, sock: UDXSocket, addr: tuple[str, int]) -> bool:
        stream.connect(sock, peer_id, addr)
        return False

    return firewall


async def measure(k: int, wakes: int, flush_kb: int, floor: bool) -> float:
    """Median µs per wake of the reader (or of the floor) with `k` datagrams waiting."""
    udx = UDX()
    sock = await udx.create_socket(LOOP, 0)
    dst = (LOOP, sock.port)
    ends: list[tuple[socket.socket, socket.socket, bytes, bytes]] = []
    for i in range(k):
        # as the blind relay picks them: each relay stream's id is its partner peer's own id
        a_id, d_id = 0xA0000000 + i, 0xD0000000 + i
        rb = udx.create_stream(d_id, firewall=_firewall(a_id))
        rc = udx.create_stream(a_id, firewall=_firewall(d_id))
        rb.relay_to(rc)
        rc.relay_to(rb)
        ea, ed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for e in (ea, ed):
            e.bind((LOOP, 0))
            e.setblocking(False)
            e.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        payload = b"x" * 236  # 256-byte datagrams, as chatty.py's round trips
        ends.append(
            (ea, ed, encode(DATA, rb.id, DEFAULT_RWND, 0, 0, payload), encode(DATA, rc.id, DEFAULT_RWND, 0, 0, payload))
        )
    for _ in range(50):  # both ends speak until every direction has a fast-path route
        for ea, ed, to_d, to_a in ends:
            ea.sendto(to_d, dst)
            ed.sendto(to_a, dst)
        await asyncio.sleep(0.01)
        if len(sock.routes) == 2 * k:
            break
    if len(sock.routes) != 2 * k:
        raise SystemExit(f"only {len(sock.routes)} of {2 * k} directions got a route")

    def drain() -> None:
        for ea, ed, _, _ in ends:
            for e in (ea, ed):
                try:
                    while True:
                        e.recv(4096)
                except BlockingIOError:
                    pass

    drain()
    sock.loop.remove_reader(sock.fileno())  # this loop calls the reader itself
    io = sock._mmsg
    if io is None:
        raise SystemExit("this needs the batched reader (Linux recvmmsg)")
    reader: Callable[[], None] = sock._on_readable_mmsg
    if floor:
        first = int.from_bytes(ends[0][2][4:8], "little")
        sas = [sock.routes[int.from_bytes(to_d[4:8], "little")].sa for _, _, to_d, _ in ends]
        one_sa = sock.routes[first].sa

        def floor_reader() -> None:
            n = io.recv()
            if n == 1:
                io.send_first(one_sa, 256)
            elif n > 1:
                io.received(n)
                io.put_spread(n, sas[:n])
                io.send(n)

        reader = floor_reader
    junk = bytearray(flush_kb << 10)
    fill = bytes(len(junk))
    relayed = sock.stats.relayed_packets
    samples = []
    for w in range(wakes):
        for ea, _, to_d, _ in ends:
            ea.sendto(to_d, dst)
        if junk:
            junk[:] = fill
        t = time.perf_counter_ns()
        reader()
        samples.append(time.perf_counter_ns() - t)
        if w % 16 == 15:
            drain()
    if not floor and sock.stats.relayed_packets - relayed != k * wakes:
        raise SystemExit(f"relayed {sock.stats.relayed_packets - relayed} of {k * wakes}")
    udx.close()
    for ea, ed, _, _ in ends:
        ea.close()
        ed.close()
    return statistics.median(samples) / 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datagrams", default="1,4,16", help="datagrams waiting per wake (comma list)")
    p.add_argument("--wakes", type=int, default=20000)
    p.add_argument("--flush-kb", type=int, default=0, help="KiB of memory written between wakes (0: none)")
    p.add_argument("--cpu", type=int, default=None, help="pin this process to one CPU")
    args = p.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    try:
        import uvloop

        run: Callable[..., float] = uvloop.run
    except ImportError:
        run = asyncio.run
    load = os.getloadavg()[0]
    print(
        f"<!-- python3 benchmarks/wake_cost.py --datagrams {args.datagrams} --wakes {args.wakes} "
        f"--flush-kb {args.flush_kb}; load average {load:.2f} -->"
    )
    print("| datagrams per wake | the relay's reader | floor (syscalls only) | reader − floor |")
    print("|---:|---:|---:|---:|")
    for k in (int(x) for x in args.datagrams.split(",")):
        ours = run(measure(k, args.wakes, args.flush_kb, floor=False))
        bare = run(measure(k, args.wakes, args.flush_kb, floor=True))
        print(f"| {k} | {ours:.2f} µs | {bare:.2f} µs | {ours - bare:+.2f} µs ({ours / k:.2f} µs per datagram) |")


if __name__ == "__main__":
    main()
