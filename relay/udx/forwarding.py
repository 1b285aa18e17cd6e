"""The blind relay's forwarding decisions, with no sockets, no clock and no asyncio.

`relay.udx.runtime` reads a batch of datagrams (`relay.udx.mmsg`) and asks this module what
to do with it; everything here takes plain ints and lists and is tested on its own
(tests/unit/test_udx_forwarding.py):

- **routes**: a `Route` is the fast path's view of one relayed direction (the partner's id, the
  destination sockaddr, the source the packets must come from). `forwardable` says whether a
  datagram may take a route at all: a UDX header (magic, version, at least 20 bytes) and no
  DESTROY (a DESTROY goes to the slow path, which closes both streams).
- **address pins**: a relayed stream takes packets only from its peer's address. On the fast
  path that is a compare of the received `msg_name` words with the route's `source_key`; on
  the slow path `takes_from` compares the decoded address.
- **runs**: consecutive datagrams of one stream (`stream_runs`) are checked and forwarded as a
  whole; a batch whose streams interleave may be regrouped stream by stream (`plan_by_stream`,
  order kept per stream); a run leaves as segmented sends of equal-size datagrams
  (`cut_runs`, the last of a send may be shorter).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import groupby
from typing import Any, Protocol

from .packet import HEADER_SIZE

Address = tuple[str, int]

#: The first header word (little endian) masked to magic, version and the DESTROY bit...
HEAD_MASK = 0x10FFFF
#: ... equals this for a datagram the fast path may forward (ff 01, DESTROY clear).
HEAD_FORWARD = 0x01FF
#: Shorter datagrams are not UDX packets and never take a route.
MIN_FORWARD = HEADER_SIZE


def forwardable(head: int, length: int) -> bool:
    """A datagram whose first header word is `head` may take a route (else: the slow path)."""
    return length >= MIN_FORWARD and head & HEAD_MASK == HEAD_FORWARD


def all_forwardable(heads: list[int], lengths: list[int]) -> bool:
    """Every datagram of a run or batch may take a route (one pass per field, not per packet)."""
    if min(lengths) < MIN_FORWARD:
        return False
    h0 = heads[0]
    if h0 & HEAD_MASK != HEAD_FORWARD:
        return False
    return heads.count(h0) == len(heads) or all(h & HEAD_MASK == HEAD_FORWARD for h in set(heads))


def source_key(sockaddr: bytes | bytearray) -> tuple[int, int, int]:
    """The three 64-bit words of a `sockaddr_in`/`sockaddr_in6` (family+port+v4 address, then
    the v6 address) that a received `msg_name` must equal to come from this peer."""
    raw = bytes(sockaddr[:24]).ljust(24, b"\0")
    w = struct.unpack("<QQQ", raw)
    return (w[0], w[1], w[2])


def takes_from(pinned: Address | None, addr: Address) -> bool:
    """The slow path's address pin: a relayed stream takes a datagram only from its peer."""
    return pinned is not None and addr == pinned


def from_pinned(route: Route, src0: list[int], src1: list[int] | None = None, src2: list[int] | None = None) -> bool:
    """Every datagram of a run came from `route`'s pinned source (`src1`/`src2`: the v6 words,
    None on an IPv4 socket, where the first word holds family, port and address)."""
    k = len(src0)
    if src0.count(route.src0) != k:
        return False
    if src1 is None or src2 is None:
        return True
    return src1.count(route.src1) == k and src2.count(route.src2) == k


def stream_runs(ids: list[int]) -> list[tuple[int, int, int]]:
    """(stream id, first slot, end slot) of each run of consecutive datagrams of one stream."""
    out = []
    i = 0
    for sid, group in groupby(ids):
        k = sum(1 for _ in group)
        out.append((sid, i, i + k))
        i += k
    return out


def interleaved(ids: list[int]) -> bool:
    """The batch holds more than one stream (worth regrouping stream by stream)."""
    return ids.count(ids[0]) != len(ids)


def plan_by_stream(ids: list[int]) -> list[tuple[int, list[int]]]:
    """(stream id, its slots in arrival order) per stream, streams in order of their smallest
    id: each stream keeps its order; only the interleaving between streams (which go to
    different peers) is given up, so a stream's run is not cut at every other stream's ACK."""
    order = sorted(range(len(ids)), key=ids.__getitem__)  # stable: arrival order per stream
    return [(sid, list(g)) for sid, g in groupby(order, key=ids.__getitem__)]


def cut_runs(lengths: Sequence[int], limit: int, max_bytes: int) -> list[tuple[int, int]]:
    """Cut a run of datagram lengths into segmented sends: (start, stop) slices whose
    datagrams are all as long as the first, except that the last may be shorter, at most
    `limit` datagrams and `max_bytes` bytes each (`limit` 1: one datagram per send)."""
    out = []
    k = len(lengths)
    x = 0
    while x < k:
        seg = lengths[x]
        y = min(k, x + limit, x + max(1, max_bytes // seg) if seg else x + 1)
        if y - x > 1 and lengths[x:y].count(seg) != y - x:  # sizes differ: up to the first other size
            z = x + 1
            while z < y and lengths[z] == seg:
                z += 1
            y = z + 1 if z < y and lengths[z] < seg else z  # a shorter one may end it
        out.append((x, y))
        x = y
    return out


class Route:
    """The fast path's view of one relayed direction while both streams sit on one batching
    socket: packets for `source` from its peer go to `target`'s peer with `rid` as their id.

    `sa` is the address of the destination sockaddr `sa_buf` (kept alive here while send
    entries point at it); `target` and `sock` are the runtime's objects, opaque here.
    `entry`/`seg`/`k`/`nbytes`/`gen` describe the open GSO run of the current send batch
    (the per-slot path extends it while the batch's generation is `gen`).
    `relayed_packets`/`relayed_bytes` count what the fast paths passed on along this route (the
    source stream's share: it folds them into its own counts when the route goes).
    """

    __slots__ = (
        "entry",
        "gen",
        "k",
        "nbytes",
        "relayed_bytes",
        "relayed_packets",
        "rid",
        "sa",
        "sa_buf",
        "seg",
        "sock",
        "src0",
        "src1",
        "src2",
        "target",
    )

    def __init__(self, rid: int, sa: int, sa_buf: bytearray, target: Any, sock: Any, src: tuple[int, int, int]) -> None:
        self.rid = rid
        self.sa = sa
        self.sa_buf = sa_buf
        self.target = target
        self.sock = sock
        self.src0, self.src1, self.src2 = src
        self.entry = 0
        self.seg = 0
        self.k = 0
        self.nbytes = 0
        self.gen = -1
        self.relayed_packets = 0
        self.relayed_bytes = 0

    def pinned(self, src0: int, src1: int = 0, src2: int = 0, *, v6: bool = False) -> bool:
        """One datagram's `msg_name` words match the pinned source."""
        return src0 == self.src0 and (not v6 or (src1 == self.src1 and src2 == self.src2))


def may_route(same_socket: bool, batching: bool, backlogged: bool) -> bool:
    """After a datagram was passed on: whether the direction gets a fast-path route. Both
    streams must sit on the arrival socket, which must batch and have no send queue (a queue
    keeps order only while everything for it goes through it)."""
    return same_socket and batching and not backlogged


# --- what the kernel forwarder needs of the runtime (typed here: no import cycle) ----------


class RelayCounters(Protocol):
    """The socket counters kernel forwarding adds to."""

    relayed_packets: int
    relayed_bytes: int
    kernel_packets: int
    kernel_bytes: int


class RelaySocket(Protocol):
    """A UDX socket as `relay.udx.kernel` sees it."""

    @property
    def family(self) -> int: ...

    @property
    def address(self) -> Address: ...

    @property
    def stats(self) -> RelayCounters: ...


class RelayStream(Protocol):
    """A relayed UDX stream as `relay.udx.kernel` sees it."""

    @property
    def id(self) -> int: ...

    @property
    def remote_id(self) -> int: ...

    @property
    def remote_addr(self) -> Address | None: ...

    def add_relayed(self, packets: int, nbytes: int) -> None:
        """Datagrams from this stream's peer that were passed on outside the stream's sight."""
