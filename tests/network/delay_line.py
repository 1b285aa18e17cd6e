"""A wire with a constant one-way delay: every Ethernet frame that arrives on one interface leaves
the other `delay_ms` later, both ways. This kernel has no sch_netem, so the benchmark's wan
delay is this small userspace forwarder in a namespace of its own between a router and the wan
bridge.

usage (inside that namespace): python delay_line.py IF0 IF1 DELAY_MS

Frames are read with AF_PACKET and PACKET_VNET_HDR, so a GSO super-packet (a UDX sender using
UDP_SEGMENT) passes whole with its virtio header and the kernel segments it on the far side.
Prints "ready" once both interfaces are open. Stops on SIGTERM or when stdin closes.
"""

from __future__ import annotations

import collections
import contextlib
import os
import select
import signal
import socket
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
FRAME_MAX = 65_536 + 64


def open_port(ifname: str) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)  # never forward what we just sent
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    s.bind((ifname, 0))
    s.setblocking(False)
    return s


def main(if0: str, if1: str, delay_ms: float) -> None:
    delay = delay_ms / 1000
    a, b = open_port(if0), open_port(if1)
    other = {a.fileno(): b, b.fileno(): a}
    by_fd = {a.fileno(): a, b.fileno(): b}
    # one FIFO: the delay is constant, so frames fall due in arrival order
    line: collections.deque[tuple[float, socket.socket, bytes]] = collections.deque()
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    watch = [a.fileno(), b.fileno(), sys.stdin.fileno()]
    print("ready", flush=True)
    while not stop:
        timeout = max(line[0][0] - time.monotonic(), 0) if line else 1.0
        readable, _, _ = select.select(watch, [], [], timeout)
        now = time.monotonic()
        for fd in readable:
            if fd == sys.stdin.fileno():
                if not os.read(fd, 4096):
                    stop = True
                continue
            src, dst = by_fd[fd], other[fd]
            for _ in range(256):
                try:
                    frame = src.recv(FRAME_MAX)
                except BlockingIOError:
                    break
                line.append((now + delay, dst, frame))
        now = time.monotonic()
        while line and line[0][0] <= now:
            _, dst, frame = line.popleft()
            with contextlib.suppress(OSError):  # a full queue on the far side: a lost frame, as on a wire
                dst.send(frame)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
