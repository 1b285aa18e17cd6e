"""recvmmsg/sendmmsg batching for the relay's hot path (Linux, through ctypes).

Forwarding a packet costs one receive and one send syscall plus the Python around them.
Receiving up to `batch` datagrams with one `recvmmsg` into fixed buffers, rewriting the
stream id in place, and sending all forwarded datagrams of the batch with one `sendmmsg`
(each iovec pointing into the receive buffer: no copy, no bytes object, no address tuple)
removes most of the per-packet Python and syscall overhead. Measured in
`benchmarks/udx_forward.py`; the portable per-datagram path in `runtime.py` remains the
fallback (and is used when `UDX_NO_MMSG=1`).
"""

from __future__ import annotations

import ctypes
import errno
import socket
import struct
import sys
from typing import Any

MSG_DONTWAIT = 0x40
IOV = struct.Struct("=QQ")
_AGAIN = (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR)
NAME_STRIDE = 32
HDR_SIZE = 64  # struct mmsghdr on 64-bit Linux: msghdr (56) + msg_len (4) + padding


def available() -> bool:
    """64-bit little-endian Linux: the struct layouts and the word test below assume it."""
    return sys.platform.startswith("linux") and struct.calcsize("P") == 8 and sys.byteorder == "little"


def _address(buf: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def sockaddr(family: int, host: str, port: int) -> bytearray:
    """A `struct sockaddr_in` / `sockaddr_in6` (IPv4 becomes v4-mapped on an IPv6 socket)."""
    if family == socket.AF_INET:
        return bytearray(
            struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + socket.inet_aton(host) + bytes(8)
        )
    if ":" not in host:
        host = "::ffff:" + host
    raw = socket.inet_pton(socket.AF_INET6, host)
    return bytearray(struct.pack("=H", socket.AF_INET6) + struct.pack("!HI", port, 0) + raw + bytes(4))


class BatchIO:
    """Fixed receive/send batches for one non-blocking UDP socket."""

    def __init__(self, fd: int, family: int, batch: int = 64, size: int = 2048) -> None:
        libc = ctypes.PyDLL(None, use_errno=True)  # non-blocking calls: no need to drop the GIL
        self._recvmmsg = libc.recvmmsg
        self._recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
        self._recvmmsg.restype = ctypes.c_int
        self._sendmmsg = libc.sendmmsg
        self._sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
        self._sendmmsg.restype = ctypes.c_int
        self.fd = fd
        self.family = family
        self.batch = batch
        self.size = size

        self.rbuf = bytearray(batch * size)
        self.rbuf_addr = _address(self.rbuf)
        self.mv = memoryview(self.rbuf)
        self.u32 = self.mv.cast("I")
        self.names = bytearray(batch * NAME_STRIDE)
        names_addr = _address(self.names)
        self.riov = bytearray(batch * 16)
        riov_addr = _address(self.riov)
        self.rhdr = bytearray(batch * HDR_SIZE)
        self.rhdr_addr = _address(self.rhdr)
        for i in range(batch):
            IOV.pack_into(self.riov, i * 16, self.rbuf_addr + i * size, size)
            struct.pack_into(
                "=QI4xQQ", self.rhdr, i * HDR_SIZE, names_addr + i * NAME_STRIDE, 28, riov_addr + i * 16, 1
            )
        self.lens = memoryview(self.rhdr).cast("I")  # msg_len of entry i at [i * 16 + 14]

        self.siov = bytearray(batch * 16)
        siov_addr = _address(self.siov)
        self.shdr = bytearray(batch * HDR_SIZE)
        self.shdr_addr = _address(self.shdr)
        name_len = 16 if family == socket.AF_INET else 28  # one family per socket
        for j in range(batch):
            struct.pack_into("=QI4xQQ", self.shdr, j * HDR_SIZE, 0, name_len, siov_addr + j * 16, 1)
        # per packet the fast path stores iovec base/length and the name pointer through these
        self.siov_q = memoryview(self.siov).cast("Q")
        self.shdr_q = memoryview(self.shdr).cast("Q")
        self.targets: list[Any] = [None] * batch

    def recv(self) -> int:
        """Datagrams received into the batch (0 when the socket is drained)."""
        n = self._recvmmsg(self.fd, self.rhdr_addr, self.batch, MSG_DONTWAIT, None)
        if n < 0:
            e = ctypes.get_errno()
            if e in _AGAIN:
                return 0
            if e in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH):
                return -1  # an ICMP error surfaced on the socket; try again
            raise OSError(e, "recvmmsg failed")
        return n

    def address(self, i: int) -> tuple[str, int]:
        off = i * NAME_STRIDE
        names = self.names
        port = names[off + 2] << 8 | names[off + 3]
        if names[off] | names[off + 1] << 8 == socket.AF_INET:
            return (socket.inet_ntop(socket.AF_INET, bytes(names[off + 4 : off + 8])), port)
        host = socket.inet_ntop(socket.AF_INET6, bytes(names[off + 8 : off + 24]))
        if host.startswith("::ffff:") and "." in host:
            host = host[7:]
        return (host, port)

    def flush(self, total: int) -> tuple[int, int, list[tuple[int, bytes]]]:
        """Send the first `total` prepared entries (iovecs point into the receive buffer).

        Returns (sent, failed, leftovers) — leftovers are (entry index, copy of the datagram)
        when the socket buffer is full, for the caller to queue in order.
        """
        done = 0
        failed = 0
        while done < total:
            n = self._sendmmsg(self.fd, self.shdr_addr + done * HDR_SIZE, total - done, MSG_DONTWAIT)
            if n > 0:
                done += n
                continue
            e = ctypes.get_errno()
            if n < 0 and e in _AGAIN:
                rest = []
                for k in range(done, total):
                    ptr, ln = IOV.unpack_from(self.siov, k * 16)
                    off = ptr - self.rbuf_addr
                    rest.append((k, bytes(self.mv[off : off + ln])))
                return done - failed, failed, rest
            done += 1  # this destination failed (e.g. unreachable); skip it
            failed += 1
        return done - failed, failed, []
