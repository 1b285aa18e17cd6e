"""The blind relay's forwarding plan, with no sockets, no clock and no asyncio.

The batched reader (`relay.udx.fastpath`) reads a batch of datagrams (`relay.udx.mmsg`), asks
this module for a plan, and hands the plan to the one writer (`mmsg.SendBatch`). Everything here
takes plain ints and lists and is tested on its own (tests/unit/test_udx_forwarding.py):

- **routes**: a `Route` is the fast path's view of one relayed direction (the partner's id, the
  destination sockaddr, the source the packets must come from). `forwardable` says whether a
  datagram may take a route at all: a UDX header (magic, version, at least 20 bytes) and no
  DESTROY (a DESTROY goes to the slow path, which closes both streams).
- **address pins**: a relayed stream takes packets only from its peer's address. On the fast
  path that is a compare of the received `msg_name` words with the route's `source_key`; on
  the slow path `takes_from` compares the decoded address.
- **plans**: per datagram its route (or the slow path) and the id it leaves with (the route's
  `rid`), and how the datagrams leave: one `sendmmsg` entry per datagram in arrival order for a
  batch of many streams (`spread`), or segmented sends of equal-size datagrams (UDP GSO: `seg`,
  at most `limit` datagrams and `max_bytes` bytes each, `cut_runs`) for runs of one stream,
  regrouped stream by stream when streams interleave (`plan_streams`, order kept per stream)
  or in arrival order when some datagram needs the slow path (`plan_runs`: nothing after a
  slow-path datagram overtakes it). GRO buffers are planned as byte spans (`plan_slots`).

One datagram alone (most wakes of chatty pairs) is planned by `route_one`; many by `routes_for`
and `spread`; the rest by `plan_runs`, `plan_streams` and `plan_slots`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
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
#: A batch of many streams with at most this many datagrams each on average leaves as one send
#: entry per datagram in arrival order: cheaper than cutting such short runs into segmented sends
#: (measured in-process: 1.5-2.4 vs 1.8-3.4 us per datagram at 1-4 per stream; even at 8,
#: longer at 2-32).
SHORT_RUNS = 4


class Route:
    """The fast path's view of one relayed direction while both streams sit on one batching
    socket: packets for the source stream from its peer go to `target`'s peer with `rid` as their
    id, only from the pinned source (`src0`..`src2`, `source_key`'s words).

    `sa` is the address of the destination sockaddr `sa_buf` (kept alive here while send entries
    point at it); `target` and `sock` are the runtime's objects, opaque here.
    `relayed_packets`/`relayed_bytes` count what the fast paths passed on along this route (the
    source stream's share: it folds them into its own counts when the route goes).
    """

    __slots__ = ("relayed_bytes", "relayed_packets", "rid", "sa", "sa_buf", "sock", "src0", "src1", "src2", "target")

    def __init__(self, rid: int, sa: int, sa_buf: bytearray, target: Any, sock: Any, src: tuple[int, int, int]) -> None:
        self.rid = rid
        self.sa = sa
        self.sa_buf = sa_buf
        self.target = target
        self.sock = sock
        self.src0, self.src1, self.src2 = src
        self.relayed_packets = 0
        self.relayed_bytes = 0

    def pinned(self, src0: int, src12: tuple[int, int] | None = None) -> bool:
        """One datagram's `msg_name` words match the pinned source (`src12`: the v6 words, None
        on an IPv4 socket, where the first word holds family, port and address)."""
        return src0 == self.src0 and (src12 is None or (src12[0] == self.src1 and src12[1] == self.src2))


#: A planned send: (route, receive slots, their lengths, segment size, the datagrams' stream id).
#: Route None: one datagram for the slow path (`slots` holds its one slot).
Entry = tuple[Route | None, list[int], list[int], int, int]


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
    k = len(lengths)
    seg = lengths[0] if k else 0
    if 0 < k <= limit and seg * k <= max_bytes and lengths.count(seg) == k:
        return [(0, k)]  # the common case: one send of equal datagrams
    out = []
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


def may_route(same_socket: bool, batching: bool, backlogged: bool) -> bool:
    """After a datagram was passed on: whether the direction gets a fast-path route. Both
    streams must sit on the arrival socket, which must batch and have no send queue (a queue
    keeps order only while everything for it goes through it)."""
    return same_socket and batching and not backlogged


# --- plans --------------------------------------------------------------------------------------


def route_one(
    routes: Mapping[int, Route], n: int, head: int, sid: int, src0: int, src12: tuple[int, int] | None, ctl: int
) -> Route | None:
    """The plan for a lone datagram (`n` bytes, first header word `head`, stream id `sid`, from
    `src0`/`src12`; `ctl` nonzero: a GRO buffer): its route, or None for the slow path."""
    r = routes.get(sid)
    if (
        r is None
        or ctl
        or n < MIN_FORWARD
        or head & HEAD_MASK != HEAD_FORWARD
        or src0 != r.src0
        or (src12 is not None and (src12[0] != r.src1 or src12[1] != r.src2))
    ):
        return None
    return r


def routes_for(
    routes: Mapping[int, Route],
    ids: list[int],
    heads: list[int],
    lens: list[int],
    src0: list[int],
    src1: list[int] | None,
    src2: list[int] | None,
) -> list[Route] | None:
    """The route of every datagram of a batch when all of them take the fast path (a route,
    `all_forwardable`, the pinned source), else None. Checked over the batch's lists, not per
    datagram."""
    found = list(map(routes.get, ids))
    if None in found:
        return None
    rs: list[Route] = found  # type: ignore[assignment]  # no None left
    if not all_forwardable(heads, lens) or [r.src0 for r in rs] != src0:
        return None
    if src1 is not None and ([r.src1 for r in rs] != src1 or [r.src2 for r in rs] != src2):
        return None
    return rs


def spread(ids: list[int]) -> bool:
    """A batch whose streams are all different or nearly so (`SHORT_RUNS` or fewer datagrams per
    stream on average): one send entry per datagram in arrival order beats segmenting."""
    count = len(ids)
    return count <= SHORT_RUNS or count <= SHORT_RUNS * len(set(ids))


def plan_streams(rs: list[Route], ids: list[int], lens: list[int], limit: int, max_bytes: int) -> list[Entry]:
    """Every datagram takes the fast path (`rs`: their routes): stream by stream
    (`plan_by_stream`), each stream's datagrams cut into segmented sends."""
    out: list[Entry] = []
    groups = plan_by_stream(ids) if interleaved(ids) else [(ids[0], list(range(len(ids))))]
    for sid, slots in groups:
        r = rs[slots[0]]
        glens = [lens[x] for x in slots]
        for x, y in cut_runs(glens, limit, max_bytes):
            out.append((r, slots[x:y], glens[x:y], glens[x], sid))
    return out


def plan_runs(
    routes: Mapping[int, Route],
    ids: list[int],
    heads: list[int],
    lens: list[int],
    src0: list[int],
    src1: list[int] | None,
    src2: list[int] | None,
    limit: int,
    max_bytes: int,
) -> list[Entry]:
    """Arrival order, run by run (`stream_runs`): a run whose datagrams all take its stream's
    route (`all_forwardable`, `from_pinned`, checked over the run) leaves as segmented sends;
    every other datagram is a slow-path entry of its own, and the writer sends what came
    before it first."""
    out: list[Entry] = []
    for sid, i, end in stream_runs(ids):
        r = routes.get(sid)
        run_lens = lens[i:end]
        if (
            r is None
            or not all_forwardable(heads[i:end], run_lens)
            or not from_pinned(r, src0[i:end], src1[i:end] if src1 else None, src2[i:end] if src2 else None)
        ):
            out.extend((None, [x], [lens[x]], 0, sid) for x in range(i, end))
            continue
        for x, y in cut_runs(run_lens, limit, max_bytes):
            out.append((r, list(range(i + x, i + y)), run_lens[x:y], run_lens[x], sid))
    return out


#: A planned send from a batch holding GRO buffers: (route, byte spans (offset, length) in the
#: receive buffer, segment size, datagrams, receive slot). Route None: one slow-path datagram.
Span = tuple[Route | None, list[tuple[int, int]], int, int, int]


#: `segments(slot, length, seg)`: the first header word and the stream id of each segment of a
#: received GRO buffer (`mmsg.BatchIO.segments`)
Segments = Callable[[int, int, int], tuple[list[int], list[int]]]


def plan_slots(
    routes: Mapping[int, Route],
    lens: list[int],
    segs: list[int],
    heads: list[int],
    ids: list[int],
    sources: tuple[list[int], list[int] | None, list[int] | None],
    segments: Segments,
    size: int,
    *,
    gso: bool,
    limit: int,
    max_bytes: int,
) -> list[Span]:
    """A batch that holds GRO buffers (`segs[i]`: slot i's segment size, 0 for a plain
    datagram), slot by slot, as byte spans of the receive buffer (slot i at `i * size`).

    A buffer whose segments all take one route (the common case: one peer's run of DATA) leaves
    whole, as one segmented send; otherwise each segment on its own. A plain datagram joins the
    open send of its route while it is as long as that send's first (a shorter one ends it), so
    a stream's run split by other streams' datagrams still leaves as one send. A slow-path
    datagram closes every open send: nothing after it overtakes it.
    """
    src0, src1, src2 = sources
    out: list[Any] = []
    open_: dict[int, list[Any]] = {}  # id(route) -> [the send a datagram may join, its bytes]
    for i, n in enumerate(lens):
        off0 = i * size
        s12 = (src1[i], src2[i]) if src1 is not None and src2 is not None else None
        g = segs[i]
        if 0 < g < n:
            nseg = -(-n // g)
            hs, ds = segments(i, n, g)
            r = routes.get(ds[0])
            if (
                r is not None
                and gso
                and g & 3 == 0
                and g >= MIN_FORWARD
                and n - (nseg - 1) * g >= MIN_FORWARD
                and n <= max_bytes
                and ds.count(ds[0]) == nseg
                and all_forwardable(hs, [g])
                and r.pinned(src0[i], s12)
            ):
                open_.pop(id(r), None)  # nothing joins a whole buffer
                out.append((r, [(off0, n)], g, nseg, i))
                continue
            for k in range(nseg):
                off = off0 + k * g
                ln = min(g, n - k * g)
                r = routes.get(ds[k])
                if r is not None and forwardable(hs[k], ln) and r.pinned(src0[i], s12):
                    open_.pop(id(r), None)
                    out.append((r, [(off, ln)], 0, 1, i))
                else:
                    open_.clear()
                    out.append((None, [(off, ln)], 0, 1, i))
            continue
        r = routes.get(ids[i])
        if r is not None and forwardable(heads[i], n) and r.pinned(src0[i], s12):
            o = open_.get(id(r))
            if o is not None:
                e = o[0]
                if n <= e[2] and e[3] < limit and o[1] + n <= max_bytes:
                    e[1].append((off0, n))
                    e[3] += 1
                    o[1] += n
                    if n < e[2]:
                        del open_[id(r)]  # a shorter datagram ends the send
                    continue
            e = [r, [(off0, n)], n, 1, i]
            out.append(e)
            open_[id(r)] = [e, n]
            continue
        open_.clear()
        out.append((None, [(off0, n)], 0, 1, i))
    return out


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
