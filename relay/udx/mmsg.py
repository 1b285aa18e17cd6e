"""recvmmsg/sendmmsg batching with UDP GSO/GRO for the relay's hot path (Linux, through ctypes).

Forwarding a packet costs one receive and one send syscall plus the Python around them.
Receiving up to `batch` datagrams with one `recvmmsg` into fixed buffers, rewriting the
stream id in place, and sending all forwarded datagrams of the batch with one `sendmmsg`
(each iovec pointing into the receive buffer: no copy, no bytes object, no address tuple)
removes most of the per-packet Python and syscall overhead.

Generic segmentation goes further. A blind relay forwards runs of equal-size packets from
one peer to one peer, the shape UDP GSO and GRO are made for:

- with `UDP_SEGMENT` one `sendmmsg` entry carries a whole run (up to `GSO_MAX_SEGMENTS`
  datagrams, `GSO_MAX_BYTES` in all, the last one may be shorter): one iovec per datagram,
  still pointing into the receive buffer, and the kernel cuts it into datagrams once;
- with `UDP_GRO` the kernel hands over a run from one source as one buffer with the segment
  size in a control message (the receive slots are then 64 KiB each; untouched pages cost
  no memory), and a run for one stream is forwarded as one entry, ids rewritten in place.

Support is probed once per process (`offload_support`); `UDX_NO_GSO=1` turns both off. If
the kernel refuses a segmented send at run time (`EIO`, `EINVAL`, `ENOPROTOOPT`: a device
without checksum offload, a path through xfrm, ...) GSO is switched off for that socket and
the refusal is counted in `gso_fallbacks`; the run is resent datagram by datagram.
Measured in `benchmarks/udx_forward.py`; the portable per-datagram reader in
`relay.udx.udxsocket` remains the fallback (and is used when `UDX_NO_MMSG=1`).

`BatchIO` knows the `mmsghdr`/`iovec`/`cmsghdr` layout; `SendBatch` is the one writer of
forwarded datagrams: it stores a plan's entries (`relay.udx.forwarding`), sends them, hands what
the kernel did not take to the socket's queue in order, and counts (per route and per socket).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import socket
import struct
import sys
from array import array
from collections.abc import Sequence
from typing import Any, Protocol

from .forwarding import Route
from .stats import SocketStats

log = logging.getLogger("relay.udx")

MSG_DONTWAIT = 0x40
IOV = struct.Struct("=QQ")
_U32 = struct.Struct("<I")
_WORDS = struct.Struct("<II")
_AGAIN = (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR)
NAME_STRIDE = 32
HDR_SIZE = 64  # struct mmsghdr on 64-bit Linux: msghdr (56) + msg_len (4) + padding
SOL_UDP = 17
UDP_SEGMENT = 103
UDP_GRO = 104
#: The kernel's UDP_MAX_SEGMENTS on older kernels (newer ones allow 128); also GRO's limit.
GSO_MAX_SEGMENTS = 64
#: Largest UDP payload of one IPv4 datagram (65535 - 20 IP - 8 UDP): the whole run must fit.
GSO_MAX_BYTES = 65507
GRO_SLOT = 65536
RCTL_STRIDE = 32  # CMSG_SPACE(sizeof(int)) = 24, rounded up
SCTL_STRIDE = 24  # CMSG_SPACE(sizeof(uint16_t))
SCTL_LEN = 24
#: errnos that mean "this socket/path cannot do UDP_SEGMENT" (udp_send_skb)
GSO_REFUSED = (errno.EIO, errno.EINVAL, errno.ENOPROTOOPT)

_support: tuple[bool, bool] | None = None
#: the v6 `msg_name` words of a read's slots (None on an IPv4 socket)
Words = list[int] | None


def available() -> bool:
    """64-bit little-endian Linux: the struct layouts and the word test below assume it."""
    return sys.platform.startswith("linux") and struct.calcsize("P") == 8 and sys.byteorder == "little"


def offload_support() -> tuple[bool, bool]:
    """(gso, gro) this kernel accepts, probed once on a throwaway socket; UDX_NO_GSO=1 says no."""
    global _support
    if os.environ.get("UDX_NO_GSO") == "1" or not available():
        return (False, False)
    if _support is None:
        gso = gro = False
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                try:
                    s.setsockopt(SOL_UDP, UDP_SEGMENT, 1200)
                    gso = s.getsockopt(SOL_UDP, UDP_SEGMENT) == 1200
                except OSError:
                    pass
                try:
                    s.setsockopt(SOL_UDP, UDP_GRO, 1)
                    gro = s.getsockopt(SOL_UDP, UDP_GRO) == 1
                except OSError:
                    pass
        except OSError:
            pass
        _support = (gso, gro)
    return _support


def address_of(buf: bytearray) -> int:
    """The address of a bytearray's buffer (it must not be resized while the address is in use)."""
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
    """Fixed receive/send batches for one non-blocking UDP socket.

    The `mmsghdr`/`iovec`/`cmsghdr` layout is known here only: the runtime reads a batch
    through `received`, `heads`, `ids`, `sources`, `segment_size`, `address`, and rewrites ids
    with `set_ids`. Send side: entry `e` of the `sendmmsg` vector owns iovecs
    `e * GSO_MAX_SEGMENTS ...`, so a run for one destination can grow (`extend`) while entries
    for other destinations are added after it; the runtime fills entries with `put_slots`
    (slots as they lie), `put_gather` (slots apart), `put_span` (one buffer), `put_spread`
    (slot i as entry i) and calls `send`/`flush(count)`. A lone datagram in slot 0 leaves
    through its own header (`send_first`).
    """

    def __init__(
        self, fd: int, family: int, batch: int = 64, size: int = 2048, *, gso: bool = False, gro: bool = False
    ) -> None:
        libc = ctypes.PyDLL(None, use_errno=True)  # non-blocking calls: no need to drop the GIL
        # No argtypes: converting each argument costs more than the call (measured ~2x);
        # pointers are passed as prebuilt c_void_p objects, the rest are small ints.
        self._recvmmsg = libc.recvmmsg
        self._recvmmsg.restype = ctypes.c_int
        self._sendmmsg = libc.sendmmsg
        self._sendmmsg.restype = ctypes.c_int
        self._sendmsg = libc.sendmsg  # one entry: its msghdr alone (cheaper in the kernel)
        self._sendmsg.restype = ctypes.c_ssize_t
        self.fd = fd
        self.family = family
        self.v6 = family == socket.AF_INET6
        self.batch = batch
        self.gro = gro  # the caller has set UDP_GRO on the socket

        self.gso = gso
        self.gso_fallbacks = 0
        #: segments per send entry: 1 without GSO (one datagram per entry, as before)
        self.max_segments = GSO_MAX_SEGMENTS if gso else 1
        self.size = size = GRO_SLOT if gro else size
        self.words = size >> 2  # 32-bit words per receive slot

        self.rbuf = bytearray(batch * size)
        self.rbuf_addr = address_of(self.rbuf)
        self.mv = memoryview(self.rbuf)
        self.u32 = self.mv.cast("I")
        self.names = bytearray(batch * NAME_STRIDE)
        self.names_q = memoryview(self.names).cast("Q")
        names_addr = address_of(self.names)
        self.riov = bytearray(batch * 16)
        riov_addr = address_of(self.riov)
        self.rctl = bytearray(batch * RCTL_STRIDE)
        rctl_addr = address_of(self.rctl)
        self.rctl32 = memoryview(self.rctl).cast("I")
        self.rhdr = bytearray(batch * HDR_SIZE)
        self.rhdr_addr = address_of(self.rhdr)
        self._rhdr_ptr = ctypes.c_void_p(self.rhdr_addr)
        for i in range(batch):
            IOV.pack_into(self.riov, i * 16, self.rbuf_addr + i * size, size)
            struct.pack_into(
                "=QI4xQQQQ",
                self.rhdr,
                i * HDR_SIZE,
                names_addr + i * NAME_STRIDE,
                28,
                riov_addr + i * 16,
                1,
                rctl_addr + i * RCTL_STRIDE if gro else 0,
                RCTL_STRIDE if gro else 0,
            )
        self._rctl_lens = memoryview(array("Q", [RCTL_STRIDE] * batch))
        self._rused = 0  # entries the last read filled (their msg_controllen is restored before the next)
        self.lens = memoryview(self.rhdr).cast("I")  # msg_len of entry i at [i * 16 + 14]
        self.rhdr_q = memoryview(self.rhdr).cast("Q")  # msg_controllen of entry i at [i * 8 + 5]

        iovs = GSO_MAX_SEGMENTS
        #: send entries: the runtime flushes once `batch` are used; a GRO buffer split into
        #: its segments may add up to GSO_MAX_SEGMENTS more before that check
        self.send_cap = send_cap = batch + GSO_MAX_SEGMENTS
        self.siov = bytearray(send_cap * iovs * 16)
        self.siov_addr = siov_addr = address_of(self.siov)
        #: one send iovec per receive slot (base fixed, length copied in per batch): a run of
        #: consecutive slots is sent as one entry pointing into this table, no per-packet store
        self.fiov = bytearray(batch * 16)
        self.fiov_addr = address_of(self.fiov)
        for i in range(batch):
            IOV.pack_into(self.fiov, i * 16, self.rbuf_addr + i * size, 0)
        self.fiov32 = memoryview(self.fiov).cast("I")  # length of slot i at [i * 4 + 2]
        # for `put_spread`: each slot's iovec address, and the iovlen/controllen of plain entries
        self._slot_iovs = memoryview(array("Q", [self.fiov_addr + i * 16 for i in range(batch)]))
        self._ones = memoryview(array("Q", [1] * batch))
        self._zeros = memoryview(array("Q", [0] * batch))
        self.sctl = bytearray(send_cap * SCTL_STRIDE)
        sctl_addr = address_of(self.sctl)
        self.shdr = bytearray(send_cap * HDR_SIZE)
        self.shdr_addr = address_of(self.shdr)
        self._shdr_ptr = ctypes.c_void_p(self.shdr_addr)
        name_len = 16 if family == socket.AF_INET else 28  # one family per socket
        for j in range(send_cap):
            struct.pack_into(
                "=QI4xQQQQ",
                self.shdr,
                j * HDR_SIZE,
                0,
                name_len,
                siov_addr + j * iovs * 16,
                1,
                sctl_addr + j * SCTL_STRIDE,
                0,
            )
            struct.pack_into("=QiiH", self.sctl, j * SCTL_STRIDE, 18, SOL_UDP, UDP_SEGMENT, 0)  # CMSG_LEN(2)
        # per packet the fast path stores iovec base/length, the name pointer, iovlen,
        # controllen and the segment size through these
        self.siov_q = memoryview(self.siov).cast("Q")
        self.shdr_q = memoryview(self.shdr).cast("Q")
        self.sctl16 = memoryview(self.sctl).cast("H")  # gso_size of entry j at [j * 12 + 8]
        self.targets: list[Any] = [None] * send_cap
        #: bumped by every flush: a run started before it cannot be extended after it
        self.gen = 0
        #: a lone datagram in slot 0 (most wakes of a chatty pair) leaves through its own
        #: msghdr and iovec: the hot path stores the destination and the length, nothing else
        self.one = bytearray(HDR_SIZE + 16)
        one_addr = address_of(self.one)
        struct.pack_into("=QI4xQQQQ", self.one, 0, 0, name_len, one_addr + HDR_SIZE, 1, 0, 0)
        IOV.pack_into(self.one, HDR_SIZE, self.rbuf_addr, 0)
        self._one_q = memoryview(self.one).cast("Q")  # [0] msg_name, [9] the iovec's length
        self._one_ptr = ctypes.c_void_p(one_addr)
        #: the send entries are in slot layout (entry i = receive slot i, one iovec, no cmsg):
        #: `put_spread` then stores only the destinations
        self._slot_layout = False

    def recv(self) -> int:
        """Datagrams (or coalesced runs) received into the batch (0 when the socket is drained)."""
        used = self._rused
        if used:  # the kernel rewrote msg_controllen of the entries it filled (to 0 without a cmsg)
            if used == 1:
                self.rhdr_q[5] = RCTL_STRIDE
            else:
                self.rhdr_q[5 : used * 8 : 8] = self._rctl_lens[:used]
            self._rused = 0
        n = self._recvmmsg(self.fd, self._rhdr_ptr, self.batch, MSG_DONTWAIT, None)
        if n < 0:
            e = ctypes.get_errno()
            if e in _AGAIN:
                return 0
            if e in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH):
                return -1  # an ICMP error surfaced on the socket; try again
            raise OSError(e, "recvmmsg failed")
        if self.gro:
            self._rused = n
        return n

    # --- the received batch, as the runtime reads it (msghdr/iovec layout stays here) -------

    def received(self, count: int) -> list[int]:
        """The lengths of the first `count` received entries; also copied into the per-slot
        send iovecs, so a run of slots can be sent as it lies in the receive buffer."""
        lens = self.lens[14 : count * 16 : 16]
        self.fiov32[2 : count * 4 : 4] = lens
        return lens.tolist()

    def fields(self, count: int) -> tuple[list[int], list[int], list[int], list[int], Words, Words]:
        """(ids, lengths, first header words, the three `msg_name` word lists) of the first
        `count` slots: `ids`, `received`, `heads` and `sources` of a read in one call (what
        every read of more than one datagram is planned on)."""
        w = self.words
        stop = count * w
        u32 = self.u32
        lens = self.lens[14 : count * 16 : 16]
        self.fiov32[2 : count * 4 : 4] = lens
        q = self.names_q
        b = count * 4
        s1: Words = None
        s2: Words = None
        if self.v6:
            s1, s2 = q[1:b:4].tolist(), q[2:b:4].tolist()
        return u32[1:stop:w].tolist(), lens.tolist(), u32[0:stop:w].tolist(), q[0:b:4].tolist(), s1, s2

    def coalesced(self, count: int) -> bool:
        """Some of the first `count` entries are GRO runs (they carry a control message)."""
        return self.gro and any(self.rhdr_q[5 : count * 8 : 8])

    def heads(self, start: int, stop: int) -> list[int]:
        """The first header word (magic, version, type, ...) of slots `start`..`stop`."""
        w = self.size >> 2
        return self.u32[start * w : stop * w : w].tolist()

    def ids(self, start: int, stop: int) -> list[int]:
        """The stream id (header bytes 4..7) of slots `start`..`stop`."""
        w = self.size >> 2
        return self.u32[start * w + 1 : stop * w : w].tolist()

    def set_ids(self, start: int, stop: int, sid: int) -> None:
        """Rewrite the stream id of slots `start`..`stop` in place."""
        w = self.size >> 2
        self.u32[start * w + 1 : stop * w : w] = array("I", (sid,)) * (stop - start)

    def sources(self, start: int, stop: int) -> tuple[list[int], list[int] | None, list[int] | None]:
        """The `msg_name` words of slots `start`..`stop` (`forwarding.source_key`'s form; the
        last two are None on an IPv4 socket, whose first word says it all)."""
        q = self.names_q
        a, b = start * 4, stop * 4
        if self.family != socket.AF_INET6:
            return q[a:b:4].tolist(), None, None
        return q[a:b:4].tolist(), q[a + 1 : b : 4].tolist(), q[a + 2 : b : 4].tolist()

    def slot(self, i: int) -> tuple[int, int, int, int, tuple[int, int] | None, int]:
        """(length, first header word, stream id, first `msg_name` word, the v6 words or None on
        an IPv4 socket, control length) of received slot `i`: what a lone datagram is planned
        on, in one call. A control length other than 0 means a GRO run (see `segment_size`)."""
        w = i * self.words
        u32 = self.u32
        q = self.names_q
        b = i * 4
        return (
            self.lens[i * 16 + 14],
            u32[w],
            u32[w + 1],
            q[b],
            (q[b + 1], q[b + 2]) if self.v6 else None,
            self.rhdr_q[i * 8 + 5],
        )

    def segment_sizes(self, count: int) -> list[int]:
        """`segment_size` of the first `count` entries (0: a plain datagram), in one pass."""
        if not self.gro:
            return [0] * count
        n8 = count * (RCTL_STRIDE // 4)
        c = self.rctl32
        ctl = self.rhdr_q[5 : count * 8 : 8].tolist()
        levels, types, values = c[2:n8:8].tolist(), c[3:n8:8].tolist(), c[4:n8:8].tolist()
        return [
            v if k and lv == SOL_UDP and t == UDP_GRO else 0
            for k, lv, t, v in zip(ctl, levels, types, values, strict=True)
        ]

    def segments(self, i: int, length: int, seg: int) -> tuple[list[int], list[int]]:
        """The first header word and the stream id of each `seg`-byte segment of GRO entry `i`
        (`length` bytes; a segment shorter than a header reads as 0, 0)."""
        nseg = -(-length // seg)
        if seg & 3 == 0:
            gw = seg >> 2
            w = i * self.words
            stop = w + (nseg - 1) * gw + 2
            if (nseg - 1) * seg + 8 <= length:
                return self.u32[w:stop:gw].tolist(), self.u32[w + 1 : stop : gw].tolist()
        base = i * self.size
        mv = self.mv
        heads, ids = [], []
        for off in range(base, base + length, seg):
            if base + length - off >= 8:
                h, d = _WORDS.unpack_from(mv, off)
            else:
                h = d = 0
            heads.append(h)
            ids.append(d)
        return heads, ids

    def set_id_at(self, offset: int, sid: int) -> None:
        """Rewrite the stream id of the datagram at byte `offset` of the receive buffer."""
        _U32.pack_into(self.mv, offset + 4, sid)

    def set_segment_ids(self, offset: int, seg: int, nseg: int, sid: int) -> None:
        """Rewrite the stream id of `nseg` datagrams `seg` bytes apart from byte `offset`."""
        if seg & 3 == 0 and offset & 3 == 0:
            w = (offset >> 2) + 1
            self.u32[w : w + (nseg - 1) * (seg >> 2) + 1 : seg >> 2] = array("I", (sid,)) * nseg
        else:
            for k in range(nseg):
                _U32.pack_into(self.mv, offset + k * seg + 4, sid)

    def set_ids_of(self, slots: Sequence[int], sid: int) -> None:
        """Rewrite the stream id of the datagrams in receive `slots` (not adjacent)."""
        u32, w = self.u32, self.words
        for s in slots:
            u32[s * w + 1] = sid

    def set_each_id(self, count: int, sids: list[int]) -> None:
        """Rewrite the stream id of slots 0..`count`, slot i's to `sids[i]` (one strided store)."""
        w = self.words
        self.u32[1 : count * w : w] = array("I", sids)

    def send_first(self, sa: int, length: int) -> bool:
        """Slot 0 (`length` bytes, id already right) to sockaddr `sa`, alone: True when it went.
        On False, `first_failed` says what to do with it."""
        q = self._one_q
        q[0] = sa
        q[9] = length
        return self._sendmsg(self.fd, self._one_ptr, MSG_DONTWAIT) >= 0

    def first_failed(self, sa: int, target: Any, length: int) -> tuple[int, int, list[tuple[int, list[bytes]]]]:
        """After `send_first` returned False: what `flush` returns for it (the errno is the
        failed call's; ctypes keeps it until the next foreign call)."""
        e = ctypes.get_errno()
        self.fiov32[2] = length
        self.put_slots(0, sa, target, 0, 1, 0)
        return self.flush(1, (-1, e))

    def put_spread(self, count: int, sas: list[int]) -> None:
        """Entries 0..`count`: receive slot i as entry i (lengths from `received`), to `sas[i]`."""
        q = self.shdr_q
        n8 = count * 8
        if not self._slot_layout:
            self._to_slot_layout()
        q[0:n8:8] = array("Q", sas)

    def put_routes(self, routes: Sequence[Route]) -> None:
        """Entries 0..len(`routes`): receive slot i as entry i (lengths from `received`), its id
        set to `routes[i].rid` and sent to `routes[i].sa`. One pass, item by item: for the few
        datagrams of a spread read that costs less than building arrays for strided stores
        (0.8 against 1.8 us for four, in-process); `put_spread` and `set_each_id` for many."""
        if not self._slot_layout:
            self._to_slot_layout()
        q = self.shdr_q
        u32 = self.u32
        w = self.words
        x = 1
        e = 0
        for r in routes:
            u32[x] = r.rid
            q[e] = r.sa
            x += w
            e += 8

    def _to_slot_layout(self) -> None:
        """Every send entry i points at receive slot i's iovec, one iovec, no control message."""
        q = self.shdr_q
        b = self.batch * 8
        q[2:b:8] = self._slot_iovs
        q[3:b:8] = self._ones
        q[5:b:8] = self._zeros
        self._slot_layout = True

    def send(self, total: int) -> tuple[int, int, list[tuple[int, list[bytes]]]] | None:
        """`flush` for the common case: None when all `total` entries went out in one call,
        else what `flush` returns (it goes on from where this call stopped)."""
        self.gen += 1
        n = self._sendmmsg(self.fd, self._shdr_ptr, total, MSG_DONTWAIT)
        if n == total:
            return None
        self.gen -= 1
        return self.flush(total, (n, ctypes.get_errno()))

    # --- send entries (the runtime fills them, `flush` sends them) --------------------------

    def put_slots(self, j: int, sa: int, target: Any, first: int, n: int, seg: int) -> None:
        """Entry `j` to sockaddr `sa`: receive slots `first`..`first + n` as they lie (their
        lengths are in the per-slot iovecs), as one segmented send of `seg`-byte datagrams
        when `n` > 1."""
        self._slot_layout = False
        q = self.shdr_q
        e8 = j * 8
        q[e8] = sa
        q[e8 + 2] = self.fiov_addr + first * 16
        q[e8 + 3] = n
        if n > 1:
            q[e8 + 5] = SCTL_LEN
            self.sctl16[j * 12 + 8] = seg
        else:
            q[e8 + 5] = 0
        self.targets[j] = target

    def put_gather(self, j: int, sa: int, target: Any, slots: Sequence[int], lens: Sequence[int], seg: int) -> None:
        """Entry `j` to `sa`: the datagrams in receive `slots` (not adjacent), gathered through
        the entry's own iovecs, segmented by `seg` when more than one."""
        self._slot_layout = False
        q = self.shdr_q
        siov_q = self.siov_q
        n = len(slots)
        b = j * GSO_MAX_SEGMENTS * 2
        rbuf, size = self.rbuf_addr, self.size
        if n <= 4:
            x = b
            for k in range(n):
                siov_q[x] = rbuf + slots[k] * size
                siov_q[x + 1] = lens[k]
                x += 2
        else:
            siov_q[b : b + 2 * n : 2] = array("Q", [rbuf + s * size for s in slots])
            siov_q[b + 1 : b + 2 * n : 2] = array("Q", lens)
        e8 = j * 8
        q[e8] = sa
        q[e8 + 2] = self.siov_addr + b * 8
        q[e8 + 3] = n
        if n > 1:
            q[e8 + 5] = SCTL_LEN
            self.sctl16[j * 12 + 8] = seg
        else:
            q[e8 + 5] = 0
        self.targets[j] = target

    def put_span(self, j: int, sa: int, target: Any, offset: int, length: int, seg: int = 0) -> None:
        """Entry `j` to `sa`: `length` bytes at `offset` in the receive buffer as one iovec
        (a GRO run re-segmented by `seg`, or one datagram with `seg` 0)."""
        self._slot_layout = False
        x = j * GSO_MAX_SEGMENTS * 2
        siov_q = self.siov_q
        siov_q[x] = self.rbuf_addr + offset
        siov_q[x + 1] = length
        q = self.shdr_q
        e8 = j * 8
        q[e8] = sa
        q[e8 + 2] = self.siov_addr + x * 8
        q[e8 + 3] = 1
        if seg:
            q[e8 + 5] = SCTL_LEN
            self.sctl16[j * 12 + 8] = seg
        else:
            q[e8 + 5] = 0
        self.targets[j] = target

    def extend(self, e: int, k: int, offset: int, length: int, seg: int) -> None:
        """Entry `e` (made by `put_span` with one datagram) gets its `k`-th iovec: `length`
        bytes at `offset`; from the second on it is a segmented send of `seg`-byte datagrams."""
        self._slot_layout = False
        x = e * GSO_MAX_SEGMENTS * 2 + 2 * k
        self.siov_q[x] = self.rbuf_addr + offset
        self.siov_q[x + 1] = length
        q = self.shdr_q
        q[e * 8 + 3] = k + 1
        if k == 1:
            q[e * 8 + 5] = SCTL_LEN
            self.sctl16[e * 12 + 8] = seg

    def segmented(self, e: int) -> bool:
        """Send entry `e` carries UDP_SEGMENT."""
        return bool(self.shdr_q[e * 8 + 5])

    def entry_of(self, ptr: int) -> int:
        """The index of the send entry at address `ptr` (what `sendmmsg` was handed)."""
        return (ptr - self.shdr_addr) // HDR_SIZE

    def segment_size(self, i: int) -> int:
        """The GRO segment size of receive entry `i` (0: one plain datagram)."""
        if not self.rhdr_q[i * 8 + 5]:
            return 0
        c = self.rctl32
        k = i * (RCTL_STRIDE // 4)
        if c[k + 2] == SOL_UDP and c[k + 3] == UDP_GRO:
            return c[k + 4]
        return 0

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

    def _iovecs(self, e: int) -> list[tuple[int, int]]:
        """(offset into the receive buffer, length) of each iovec of send entry `e`."""
        q = self.shdr_q
        ptr, iovlen = q[e * 8 + 2], q[e * 8 + 3]
        if self.fiov_addr <= ptr < self.fiov_addr + len(self.fiov):
            buf, x = self.fiov, ptr - self.fiov_addr
        else:
            buf, x = self.siov, ptr - self.siov_addr
        out = []
        for k in range(iovlen):
            base, ln = IOV.unpack_from(buf, x + 16 * k)
            out.append((base - self.rbuf_addr, ln))
        return out

    def entry_datagrams(self, e: int) -> list[bytes]:
        """Copies of the datagrams send entry `e` carries (its iovecs, cut by its segment size)."""
        q = self.shdr_q
        data = b"".join(bytes(self.mv[off : off + ln]) for off, ln in self._iovecs(e))
        seg = self.sctl16[e * 12 + 8] if q[e * 8 + 5] else len(data)
        if seg <= 0:
            return [data]
        return [data[o : o + seg] for o in range(0, len(data), seg)] or [data]

    def entry_size(self, e: int) -> tuple[int, int]:
        """(datagrams, bytes) send entry `e` carries (the bytes only for a one-iovec entry)."""
        q = self.shdr_q
        iovlen = q[e * 8 + 3]
        if iovlen == 1:
            total = self._iovecs(e)[0][1]
            seg = self.sctl16[e * 12 + 8] if q[e * 8 + 5] else 0
            return (-(-total // seg) if seg else 1), total
        return iovlen, 0

    def flush(self, total: int, first: tuple[int, int] | None = None) -> tuple[int, int, list[tuple[int, list[bytes]]]]:
        """Send the first `total` prepared entries (iovecs point into the receive buffer).

        Returns (entries sent, datagrams failed, leftovers) — leftovers are (entry index,
        copies of its datagrams) for the caller to send or queue in order: the socket buffer
        was full, or the kernel refused segmentation (then GSO is off for this socket).
        """
        self.gen += 1
        done = 0
        failed = 0
        while done < total:
            if first is not None:  # `send` made the first call already
                n, e = first
                first = None
            else:
                ptr = self._shdr_ptr if done == 0 else ctypes.c_void_p(self.shdr_addr + done * HDR_SIZE)
                n = self._sendmmsg(self.fd, ptr, total - done, MSG_DONTWAIT)
                e = ctypes.get_errno() if n < 0 else 0
            if n > 0:
                done += n
                continue
            if n < 0 and e in _AGAIN:
                return done, failed, [(k, self.entry_datagrams(k)) for k in range(done, total)]
            if self.shdr_q[done * 8 + 5]:  # a segmented entry was refused
                if e in GSO_REFUSED:
                    self.disable_gso()
                if e in GSO_REFUSED or e == errno.EMSGSIZE:
                    return done, failed, [(k, self.entry_datagrams(k)) for k in range(done, total)]
            failed += self.entry_size(done)[0]  # this destination failed (e.g. unreachable); skip it
            done += 1
        return done, failed, []

    def disable_gso(self) -> None:
        if self.gso:
            self.gso = False
            self.max_segments = 1
        self.gso_fallbacks += 1


class Queue(Protocol):
    """The socket's own send path, for what a batch could not send at once (kept in order)."""

    @property
    def backlogged(self) -> bool: ...

    def send_queued(self, data: bytes, addr: tuple[str, int]) -> None: ...


#: A spread read of at most this many datagrams has its ids and destinations stored item by
#: item (`BatchIO.put_routes`); a longer one through strided stores of arrays (in-process, item
#: by item is 2-3x cheaper up to 8 datagrams and dearer from 16 on).
SPREAD_ITEMWISE = 8

#: (entries sent, datagrams failed, leftovers: (entry, copies of its datagrams)), as `flush` says
Sent = tuple[int, int, list[tuple[int, list[bytes]]]]


class SendBatch:
    """The one writer of a batching socket's forwarded datagrams.

    It stores a plan's sends (`relay.udx.forwarding`: a lone datagram, a spread batch, entries of
    receive slots, spans of GRO buffers) into the `sendmmsg` vector with each datagram's id set
    to its route's, sends them (`flush`, also when the vector is full), and counts: each route's
    `relayed_*` (its source stream's share) as it stores, the socket's counters as it sends. A
    datagram sent whole with its batch is counted once (`SocketStats.forwarded_*`); what the
    kernel did not take goes to the socket's queue in order, counted as received and relayed
    there, and its streams leave the fast path until the queue drains.
    """

    __slots__ = ("cap", "datagrams", "io", "j", "nbytes", "queue", "seg_datagrams", "seg_sends", "stats")

    def __init__(self, io: BatchIO, stats: SocketStats, queue: Queue) -> None:
        self.io = io
        self.stats = stats
        self.queue = queue
        self.cap = io.batch
        self.j = 0  # send entries stored
        self.datagrams = self.nbytes = 0  # ... and what they carry
        self.seg_sends = self.seg_datagrams = 0

    def first(self, r: Route, n: int, sid: int) -> None:
        """Slot 0, a lone datagram of `n` bytes for `r`, through its own `msghdr` (`sendmsg`)."""
        io = self.io
        if r.rid != sid:
            io.set_ids(0, 1, r.rid)
        r.relayed_packets += 1
        r.relayed_bytes += n
        if io.send_first(r.sa, n):
            st = self.stats
            st.forwarded_reads += 1
            st.forwarded_packets += 1
            st.forwarded_bytes += n
            return
        self._counted_apart(1, n)
        fallbacks = io.gso_fallbacks
        self._rest(1, 1, n, io.first_failed(r.sa, r.target, n), fallbacks)

    def spread(self, rs: list[Route], ids: list[int], lens: list[int]) -> None:
        """A read whose datagrams all take the fast path, slot i as send entry i (the routes
        `rs`, ids rewritten only where they differ: the blind relay gives a relay stream its
        partner peer's own id), with one `sendmmsg`."""
        io = self.io
        count = len(rs)
        if count <= SPREAD_ITEMWISE:
            io.put_routes(rs)
        else:
            rids = [r.rid for r in rs]
            if rids != ids:
                io.set_each_id(count, rids)
            io.put_spread(count, [r.sa for r in rs])
        for r, n in zip(rs, lens, strict=True):  # each source stream's share
            r.relayed_packets += 1
            r.relayed_bytes += n
        nbytes = sum(lens)
        fallbacks = io.gso_fallbacks
        res = io.send(count)
        if res is None:
            st = self.stats
            st.forwarded_reads += 1
            st.forwarded_packets += count
            st.forwarded_bytes += nbytes
            return
        self._counted_apart(count, nbytes)
        io.targets[:count] = [r.target for r in rs]
        self._rest(count, count, nbytes, res, fallbacks)

    def add(self, r: Route, slots: list[int], lens: list[int], seg: int, sid: int) -> None:
        """One planned send of receive slots (a `forwarding.Entry` with a route): as they lie in
        the receive buffer when adjacent, gathered otherwise; segmented by `seg` when more than
        one. The vector is sent when full."""
        io = self.io
        n = len(slots)
        first = slots[0]
        if slots[-1] - first == n - 1:
            if r.rid != sid:
                io.set_ids(first, first + n, r.rid)
            io.put_slots(self.j, r.sa, r.target, first, n, seg)
        else:
            if r.rid != sid:
                io.set_ids_of(slots, r.rid)
            io.put_gather(self.j, r.sa, r.target, slots, lens, seg)
        self._stored(r, n, sum(lens) if n > 1 else lens[0])

    def add_spans(self, r: Route, spans: list[tuple[int, int]], seg: int, datagrams: int) -> None:
        """One planned send of byte spans (`forwarding.plan_slots`): a whole GRO buffer of
        `datagrams` `seg`-byte datagrams, or datagrams one span each, segmented by `seg`."""
        io = self.io
        j = self.j
        off, ln = spans[0]
        if datagrams > len(spans):
            io.set_segment_ids(off, seg, datagrams, r.rid)
            io.put_span(j, r.sa, r.target, off, ln, seg)
            self._stored(r, datagrams, ln)
            return
        rid = r.rid
        io.set_id_at(off, rid)
        io.put_span(j, r.sa, r.target, off, ln)
        nbytes = ln
        for k in range(1, len(spans)):
            off, ln = spans[k]
            io.set_id_at(off, rid)
            io.extend(j, k, off, ln, seg)
            nbytes += ln
        self._stored(r, datagrams, nbytes)

    def _stored(self, r: Route, datagrams: int, nbytes: int) -> None:
        r.relayed_packets += datagrams
        r.relayed_bytes += nbytes
        self.datagrams += datagrams
        self.nbytes += nbytes
        if datagrams > 1:
            self.seg_sends += 1
            self.seg_datagrams += datagrams
        self.j += 1
        if self.j >= self.cap:
            self.flush()

    def flush(self) -> None:
        """Send what is stored (before a slow-path datagram, when the vector is full, at the end
        of a read)."""
        j = self.j
        if not j:
            return
        datagrams, nbytes = self.datagrams, self.nbytes
        st = self.stats
        st.gso_sends += self.seg_sends
        st.gso_segments += self.seg_datagrams
        self.j = self.datagrams = self.nbytes = self.seg_sends = self.seg_datagrams = 0
        io = self.io
        fallbacks = io.gso_fallbacks
        res = io.send(j)
        if res is None:  # all of it went out in one call
            st.forwarded_packets += datagrams
            st.forwarded_bytes += nbytes
            return
        self._counted_apart(datagrams, nbytes)
        self._rest(j, datagrams, nbytes, res, fallbacks)

    def _counted_apart(self, datagrams: int, nbytes: int) -> None:
        """Forwarded datagrams the batch did not send whole: received and relayed counted here,
        sent by `_rest` as they go."""
        st = self.stats
        st.received_packets += datagrams
        st.received_bytes += nbytes
        st.relayed_packets += datagrams
        st.relayed_bytes += nbytes

    def _rest(self, count: int, datagrams: int, nbytes: int, res: Sent, fallbacks: int) -> None:
        """After a send that did not take all `count` entries: count what went, send the rest one
        by one in order (queued if the socket is full), and put the streams involved on the
        queued path until the queue drains."""
        st = self.stats
        io = self.io
        _sent, failed, rest = res
        st.send_errors += failed
        if io.gso_fallbacks != fallbacks:
            st.gso_fallbacks += io.gso_fallbacks - fallbacks
            log.warning("udx: the kernel refused a UDP_SEGMENT send; GSO is off for this socket")
        for _k, datagrams_k in rest:
            datagrams -= len(datagrams_k)
            nbytes -= sum(len(d) for d in datagrams_k)
        st.sent_packets += datagrams - failed
        st.sent_bytes += nbytes
        if not rest:
            return
        queue = self.queue
        for k, datagrams_k in rest:
            t = io.targets[k]
            for d in datagrams_k:
                if t is not None and t.send_address is not None:
                    queue.send_queued(d, t.send_address)
                else:
                    st.send_errors += 1
        if queue.backlogged:
            for t in set(io.targets[:count]):
                if t is not None:
                    t.drop_route()  # back to the queued path until the queue drains


CLOCK_MONOTONIC = 1
TFD_NONBLOCK = os.O_NONBLOCK
TFD_CLOEXEC = os.O_CLOEXEC


class HoldTimer:
    """A one-shot timerfd with microsecond resolution for receive coalescing
    (`relay.udx.moderation`): asyncio's own timers round to milliseconds.

    Register `fd` with `loop.add_reader`; the callback calls `clear()` (or re-arms, which
    resets the expiration count too). Not having timerfd (not Linux) raises OSError.
    """

    def __init__(self) -> None:
        if not available():
            raise OSError(errno.ENOSYS, "timerfd needs 64-bit Linux")
        libc = ctypes.PyDLL(None, use_errno=True)
        fd = libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        self.fd: int = fd
        self._settime = libc.timerfd_settime
        self._settime.restype = ctypes.c_int
        self._spec = bytearray(32)  # struct itimerspec {it_interval, it_value}
        self._spec_ptr = ctypes.c_void_p(address_of(self._spec))
        self._spec_q = memoryview(self._spec).cast("q")

    def arm(self, seconds: float) -> None:
        """Fire once, `seconds` from now (at least 1 µs: 0 would disarm)."""
        ns = max(1000, int(seconds * 1e9))
        q = self._spec_q
        q[2] = ns // 1_000_000_000
        q[3] = ns % 1_000_000_000
        if self._settime(self.fd, 0, self._spec_ptr, None) < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))

    def clear(self) -> None:
        """Consume the expiration so the fd is no longer readable."""
        if self.fd < 0:
            return
        with contextlib.suppress(BlockingIOError, InterruptedError):
            os.read(self.fd, 8)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
