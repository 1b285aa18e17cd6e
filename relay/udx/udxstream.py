"""`UDXStream`: one UDX stream on the event loop, a `relay.core.Driver` of its sans-IO `UDXCore`.

It feeds the core what its socket reads for it (`receive_datagram`, with the loop's time), hands
the core's datagrams to the socket (`transmit`; during a read the socket sends every stream's
answer once the read is done), delivers its events (data, END, messages, close) to the reader,
the callbacks or the read queue, and keeps the core's one timer (retransmission, probes,
keep-alive, the end of a linger). For a blind relay the same class is a raw relay stream: it
learns its peer's address from the first packet (the firewall hook), relays what it receives to
its partner's peer (`relay_to`, `relay_datagram`, `pass_on`), holds a few early packets for a
partner that has not connected yet, and keeps the fast path's `Route` for its direction (the
socket's route table) and its share of kernel forwarding (`leave_kernel`).

The socket's seam: `receive_datagram`, `relay_datagram`, `pass_on`, `passes_firewall`,
`route_from`, `route`, `send_address`, `lingering`, `unregister_now`, `pump` (the socket's flush).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from relay.core import Driver

from . import mmsg
from .forwarding import Route, may_route, source_key, takes_from
from .packet import DESTROY, U32, UDXError
from .stream import (
    DataReceived,
    EndReceived,
    Event,
    LingerEnded,
    MessageReceived,
    StreamClosed,
    StreamStats,
    UDXCore,
)

if TYPE_CHECKING:
    from .udxsocket import UDX, UDXSocket

log = logging.getLogger("relay.udx")

Address = tuple[str, int]
#: `firewall(stream, socket, address) -> bool`: True drops the packet (udx-native's convention).
Firewall = Callable[["UDXStream", "UDXSocket", Address], bool]

#: Packets held for a relay partner that has not connected yet. libudx drops them (the
#: sender's first RTO, ~1 s, repairs it); holding a few is compatible (docs/wire/udx.md §4).
EARLY_PACKETS = 64
#: ... and at most this many bytes over all streams of one UDX instance: an honest pair's early
#: packets are its first flight, gone within a round trip, while 64 packets held on each of the
#: 16,384 relay streams a relay may have would be 1.5 GB. Past it the packet is dropped
#: (`relay_unconnected`) and its sender's RTO repairs it, as with libudx.
EARLY_BYTES_TOTAL = 4 * 2**20
_u32 = struct.Struct("<I")


class UDXStream(Driver[Event]):
    """A UDX stream endpoint (or a raw relay stream) driven by its `UDXCore`: a `Driver` of it.

    Use `write`/`drain`/`end`/`read` like an asyncio stream, or set `on_data`, `on_end`,
    `on_message`, `on_close` callbacks (data then bypasses the read queue).
    """

    _core: UDXCore

    # slots and a read queue made on first use: a relay holds two of these per active pair
    # (16,384 at the default cap), so their size is the relay's memory under a pairing flood
    __slots__ = (
        "_closed_fut",
        "_drain_waiter",
        "_early",
        "_eof",
        "_finished",
        "_firewall",
        "_frame_buf",
        "_read_waiter",
        "_readq",
        "_relay",
        "_relayed_bytes",
        "_relayed_from",
        "_relayed_packets",
        "_remote_addr",
        "_remote_id_le",
        "_route",
        "_sa",
        "_sa_addr",
        "_send_addr",
        "_socket",
        "_src_key",
        "closed",
        "error",
        "framed",
        "id",
        "on_close",
        "on_data",
        "on_end",
        "on_message",
        "udx",
        "user_data",
    )

    def __init__(
        self,
        udx: UDX,
        id: int,
        *,
        firewall: Firewall | None,
        framed: bool,
        seq: int,
        max_reorder_bytes: int | None = None,
    ) -> None:
        self.udx = udx
        self.id = id
        if max_reorder_bytes is None:
            core = UDXCore(id, seq=seq)
        else:
            core = UDXCore(id, seq=seq, max_reorder_bytes=max_reorder_bytes)
        Driver.__init__(self, core)
        self._firewall = firewall
        self.framed = framed
        self._socket: UDXSocket | None = None
        self._remote_addr: Address | None = None
        self._send_addr: Address | None = None  # as the socket wants it (v4-mapped on IPv6)
        self._remote_id_le = b"\0\0\0\0"
        self._relay: UDXStream | None = None
        #: the streams that relay to this one (made by the first `relay_to`: a session's control
        #: stream has none; every field made on first use keeps a relay's memory per stream down)
        self._relayed_from: list[UDXStream] | None = None
        #: (datagram, the socket it arrived on, the partner that received it) held for this stream
        self._early: list[tuple[bytes, UDXSocket, UDXStream]] | None = None
        self._sa = bytearray()
        self._sa_addr = 0
        self._src_key = (0, 0, 0)
        #: (partner's remote id, its sockaddr pointer, partner, socket) while both relay
        #: streams sit on one batching socket: the forwarding fast path reads only this
        self._route: Route | None = None
        #: what this stream's peer sent that was passed on to the partner, outside a route
        #: (slow path, held early packets, kernel forwarding, routes gone): see `relayed_bytes`
        self._relayed_packets = 0
        self._relayed_bytes = 0
        self.closed = False
        self._finished = False
        self.error: UDXError | None = None
        self.on_data: Callable[[bytes], None] | None = None
        self.on_end: Callable[[], None] | None = None
        self.on_message: Callable[[bytes], None] | None = None
        self.on_close: Callable[[UDXError | None], None] | None = None
        self._readq: deque[bytes] | None = None  # made by the first chunk nobody's on_data takes
        self._eof = False
        self._frame_buf: bytearray | None = None  # a framed stream's partial frame, made on first data
        self._read_waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._closed_fut: asyncio.Future[None] | None = None
        self.user_data: Any = None

    def __repr__(self) -> str:
        return f"<UDXStream id={self.id:#010x} remote={self.remote_id:#010x}@{self._remote_addr} closed={self.closed}>"

    # --- properties ------------------------------------------------------------------------

    @property
    def socket(self) -> UDXSocket | None:
        return self._socket

    @property
    def remote_id(self) -> int:
        return self._core.remote_id

    @property
    def remote_addr(self) -> Address | None:
        return self._remote_addr

    @property
    def connected(self) -> bool:
        return self._socket is not None

    @property
    def relayed(self) -> bool:
        return self._relay is not None

    @property
    def stats(self) -> StreamStats:
        return self._core.stats

    @property
    def relayed_packets(self) -> int:
        """UDX datagrams this relay stream received from its peer and passed on to its partner's
        peer, by any path (fast paths, slow path, held early packets, the kernel: its share is
        added when the kernel's counters are read, once a second and when the pair leaves it)."""
        r = self._route
        return self._relayed_packets + (r.relayed_packets if r is not None else 0)

    @property
    def relayed_bytes(self) -> int:
        """The bytes of `relayed_packets` (UDX header and payload, as `SocketStats.relayed_bytes`)."""
        r = self._route
        return self._relayed_bytes + (r.relayed_bytes if r is not None else 0)

    def add_relayed(self, packets: int, nbytes: int) -> None:
        """Datagrams of this stream's peer passed on outside this runtime (the kernel path)."""
        self._relayed_packets += packets
        self._relayed_bytes += nbytes

    @property
    def core(self) -> UDXCore:
        return self._core

    @property
    def rtt(self) -> float:
        return self._core.srtt

    @property
    def cwnd(self) -> float:
        return self._core.cwnd

    @property
    def inflight(self) -> int:
        return self._core.inflight

    # --- commands --------------------------------------------------------------------------

    def connect(self, socket: UDXSocket, remote_id: int, addr: Address, *, ack: int | None = None) -> None:
        """Bind to `socket` and peer stream `remote_id` at `addr`; sends nothing (UDX has no handshake)."""
        if self.closed:
            raise UDXError("stream is closed", "ECLOSED")
        if self._socket is not None:
            raise UDXError("stream is already connected", "EALREADY")
        if socket.closed:
            raise UDXError("socket is closed", "ECLOSED")
        self._socket = socket
        self._remote_addr = (addr[0], addr[1])
        self._send_addr = socket.wire_address(self._remote_addr)
        self._remote_id_le = _u32.pack(remote_id & U32)
        self._set_sockaddr()
        self._core.connect(remote_id, ipv6=":" in addr[0], ack=ack)
        socket.schedule_flush(self)
        if self._early:
            self._flush_early()

    def _flush_early(self) -> None:
        """Forward what a relay partner sent before this stream learned its peer's address."""
        early, self._early = self._early or [], None
        sock = self._socket
        assert sock is not None and self._send_addr is not None
        for d, _, source in early:
            self.udx.early_bytes -= len(d)
            out = d[:4] + self._remote_id_le + d[8:]
            sock.send_datagrams([out], self._send_addr)
            sock.stats.relayed_packets += 1
            sock.stats.relayed_bytes += len(out)
            source._relayed_packets += 1
            source._relayed_bytes += len(out)

    def change_remote(self, socket: UDXSocket, remote_id: int, addr: Address) -> None:
        if self._socket is None:
            raise UDXError("stream is not connected", "ENOTCONN")
        self._socket = socket
        self._remote_addr = (addr[0], addr[1])
        self._send_addr = socket.wire_address(self._remote_addr)
        self._remote_id_le = _u32.pack(remote_id & U32)
        self._set_sockaddr()
        self._core.change_remote(remote_id, ipv6=":" in addr[0])

    @property
    def route(self) -> Route | None:
        """The fast path's route for datagrams to this stream (None: the slow path takes them)."""
        return self._route

    @route.setter
    def route(self, r: Route | None) -> None:
        old = self._route
        if old is not None:
            self._relayed_packets += old.relayed_packets
            self._relayed_bytes += old.relayed_bytes
            table = old.sock.routes
            if table.get(self.id) is old:
                del table[self.id]
        self._route = r
        if r is not None:
            r.sock.routes[self.id] = r

    def drop_route(self) -> None:
        """Back to the slow path for both directions until a datagram builds a route again."""
        self.route = None
        for p in self._relayed_from or ():
            p.route = None

    def leave_kernel(self, *, closing: bool = False) -> None:
        """Both directions through this stream out of kernel forwarding: its peer's address or
        id changes, or it closes (then what the kernel path remembers of it goes too)."""
        for p in (self, *(self._relayed_from or ())):
            k = p._socket.kernel if p._socket is not None else None
            if k is not None:
                k.withdraw(p, forget=closing)

    def _set_sockaddr(self) -> None:
        """The destination as a C sockaddr, for the batched relay path."""
        self.drop_route()
        self.leave_kernel()
        sock, addr = self._socket, self._remote_addr
        if sock is None or addr is None or not sock.batching:
            return
        self._sa = mmsg.sockaddr(sock.family, addr[0], addr[1])
        self._sa_addr = mmsg.address_of(self._sa)
        self._src_key = source_key(self._sa)

    def relay_to(self, destination: UDXStream) -> None:
        """Forward every packet this stream receives to `destination`'s peer, id rewritten."""
        if self._relay is not None:
            raise UDXError("stream is already relayed", "EINVAL")
        if destination.closed or self.closed:
            raise UDXError("cannot relay to or from a closed stream", "EINVAL")
        self._relay = destination
        if destination._relayed_from is None:
            destination._relayed_from = []
        destination._relayed_from.append(self)

    def write(self, data: bytes | bytearray | memoryview) -> bool:
        """Queue bytes; False means the buffer is above the high-water mark (await `drain`)."""
        if self._socket is None:
            raise UDXError("writing while not connected is not supported", "ENOTCONN")
        if self.closed:
            raise self.error or UDXError("stream is closed", "EPIPE")
        self._core.write(data)
        self._socket.schedule_flush(self)
        return self._core.write_buffered < self._core.high_watermark

    async def drain(self) -> None:
        while not self.closed and self._core.write_buffered >= self._core.high_watermark:
            if self._drain_waiter is None or self._drain_waiter.done():
                self._drain_waiter = asyncio.get_running_loop().create_future()
            await self._drain_waiter
        if self.closed and self.error is not None:
            raise self.error

    async def flush(self) -> None:
        """Wait until everything written so far (and the END, after `end`) is acknowledged."""
        while not self.closed and not self._core.all_acked:
            if self._drain_waiter is None or self._drain_waiter.done():
                self._drain_waiter = asyncio.get_running_loop().create_future()
            await self._drain_waiter
        if self.closed and self.error is not None:
            raise self.error

    def end(self, data: bytes = b"") -> None:
        """Half-close: send END after the queued data (graceful; the peer sees EOF)."""
        if self.closed:
            return
        if self._socket is None:
            raise UDXError("ending while not connected is not supported", "ENOTCONN")
        self._core.end(data)
        self._socket.schedule_flush(self)

    def send(self, data: bytes) -> None:
        """An unordered, unreliable MESSAGE datagram (udx-native `trySend`)."""
        if self._socket is None or self.closed:
            return
        self._core.send_message(data)
        self._socket.schedule_flush(self)

    def set_keepalive(self, seconds: float) -> None:
        self._core.set_keepalive(seconds, self.now())
        if self._socket is not None:
            self._socket.schedule_flush(self)

    def destroy(self, error: UDXError | None = None) -> None:
        """Abortive close: one DESTROY to the peer (nothing for relayed or unconnected streams)."""
        if self.closed:
            return
        self._core.destroy(error, send=self._relay is None)
        self.pump()

    async def read(self) -> bytes:
        """Next chunk of stream data (a whole frame in framed mode); b"" at EOF."""
        while True:
            if self._readq:
                chunk = self._readq.popleft()
                self._core.consumed(len(chunk))
                if self._core.wants_ack and self._socket is not None:
                    self._socket.schedule_flush(self)
                return chunk
            if self._eof:
                return b""
            if self.closed:
                if self.error is not None:
                    raise self.error
                return b""
            if self._read_waiter is None or self._read_waiter.done():
                self._read_waiter = asyncio.get_running_loop().create_future()
            await self._read_waiter

    async def wait_closed(self) -> UDXError | None:
        if not self.closed:
            if self._closed_fut is None:
                self._closed_fut = asyncio.get_running_loop().create_future()
            await self._closed_fut
        return self.error

    # --- the socket's seam (called by UDXSocket's reader) -------------------------------------

    @property
    def lingering(self) -> bool:
        """Closed gracefully and still re-ACKing a retransmitted END for a while."""
        return self._core.lingering

    @property
    def send_address(self) -> Address | None:
        """The peer's address as this stream's socket sends to it (v4-mapped on IPv6)."""
        return self._send_addr

    def receive_datagram(self, datagram: bytes, arrival: UDXSocket) -> None:
        """A datagram for this stream (not relayed): into the core with the loop's time, its
        events delivered now, its answer (ACKs) sent when the socket's read is done; what the
        core refuses is counted on `arrival` by cause (a lingering stream only re-ACKs)."""
        core = self._core
        if core.receive(datagram, self.now()) or self.closed:
            self.dispatch()
            sock = self._socket
            if sock is not None:
                sock.note_input(self)
            elif self.closed:
                self._finish_close()
        else:
            arrival.stats.drop(core.drop_reason)

    def relay_datagram(self, buf: memoryview, addr: Address, arrival: UDXSocket) -> None:
        """The slow path of a relayed stream: a datagram from `addr` reached `arrival`.

        Taken only from the peer's address (`wrong_address` otherwise), passed to the relay
        partner's peer; once both streams sit on one batching socket the fast path gets a
        route and takes the next ones. A DESTROY passing through closes both streams.
        """
        if not takes_from(self._remote_addr, addr):
            arrival.stats.drop("wrong_address")
            return
        t = self._relay
        assert t is not None
        if t.pass_on(buf, arrival, self) and self._socket is arrival and t.socket is arrival:
            if may_route(True, arrival.batching, arrival.backlogged):
                self.route = t.route_from(self._src_key, arrival)
            if arrival.kernel is not None and not buf[2] & DESTROY:
                arrival.kernel.offer(self, t)
        if buf[2] & DESTROY:
            self._on_relayed_destroy()

    def pass_on(self, buf: memoryview, arrival: UDXSocket, source: UDXStream) -> bool:
        """A datagram this stream's relay partner `source` received: to this stream's peer with
        its id (True), or held until this stream knows its peer (at most EARLY_PACKETS,
        EARLY_BYTES_TOTAL over all streams); counted as `source`'s once it is passed on."""
        st = arrival.stats
        dst, sock = self._send_addr, self._socket
        if dst is not None and sock is not None:
            buf[4:8] = self._remote_id_le
            sock.send_datagrams([buf], dst)
            n = len(buf)
            st.relayed_packets += 1
            st.relayed_bytes += n
            source._relayed_packets += 1
            source._relayed_bytes += n
            return True
        early = self._early
        if (early is None or len(early) < EARLY_PACKETS) and self.udx.early_bytes + len(buf) <= EARLY_BYTES_TOTAL:
            if early is None:
                early = self._early = []
            early.append((bytes(buf), arrival, source))
            self.udx.early_bytes += len(buf)
        else:
            st.drop("relay_unconnected")
        return False

    def route_from(self, src_key: tuple[int, int, int], sock: UDXSocket) -> Route:
        """The fast path's route to this stream's peer for datagrams from the source `src_key`."""
        return Route(self._core.remote_id, self._sa_addr, self._sa, self, sock, src_key)

    def unregister_now(self) -> None:
        """At UDX.close: a lingering stream stops lingering and leaves the id table now."""
        if self._core.lingering:
            self.disarm()
            self._unregister()

    def forget_partner(self, partner: UDXStream) -> None:
        """`partner` no longer relays to this stream (it closed)."""
        if self._relayed_from is not None and partner in self._relayed_from:
            self._relayed_from.remove(partner)

    def passes_firewall(self, arrival: UDXSocket, addr: Address) -> bool:
        """For a datagram reaching this stream on a socket it is not connected on: True to take it."""
        fw = self._firewall
        if fw is None:
            return False  # udx-native's default firewall drops everything
        port = addr[1]
        if not 0 < port < 65536:
            return False
        try:
            drop = fw(self, arrival, addr)
        except UDXError as e:  # e.g. a second connect, as blind-relay's firewall throws in libudx
            arrival.stats.callback_errors += 1
            log.debug("udx: firewall refused a packet for stream %#010x from %s: %s", self.id, addr, e)
            return False
        except Exception:
            arrival.stats.callback_errors += 1
            log.exception("udx: firewall callback failed")
            return False
        return not drop and not self.closed

    # --- the driver's hooks ---------------------------------------------------------------------

    def transmit(self, now: float) -> None:
        """What the core has for the wire now, to the peer through the socket."""
        out = self._core.datagrams_to_send(now)
        if out and self._socket is not None and self._send_addr is not None:
            self._socket.send_datagrams(out, self._send_addr)

    def arm(self) -> None:
        """After a pump: a closed stream finishes closing (and keeps a timer only to end its
        linger); an open one wakes a writer waiting for room and re-arms its timer."""
        if self.closed:
            self._finish_close()
            if self._core.lingering:
                super().arm()
            return
        w = self._drain_waiter
        if w is not None and not w.done() and self._core.write_buffered < self._core.high_watermark:
            w.set_result(None)
        super().arm()

    def handle_event(self, ev: Event) -> None:
        if isinstance(ev, DataReceived):
            if self.framed:
                self._deliver_framed(ev.data)
            else:
                self._deliver(ev.data)
        elif isinstance(ev, EndReceived):
            self._eof = True
            self._wake_reader()
            if self.on_end is not None:
                self._call(self.on_end)
        elif isinstance(ev, MessageReceived):
            if self.on_message is not None:
                self._call(self.on_message, ev.data)
        elif isinstance(ev, StreamClosed):
            self.closed = True
            self.error = ev.error
        elif isinstance(ev, LingerEnded):
            self._unregister()

    # --- runtime internals -------------------------------------------------------------------

    def _deliver(self, data: bytes) -> None:
        if self.on_data is not None:
            self._core.consumed(len(data))
            self._call(self.on_data, data)
        else:
            if self._readq is None:
                self._readq = deque()
            self._readq.append(data)
            self._wake_reader()

    def _deliver_framed(self, data: bytes) -> None:
        """Hand out whole 3-byte-length-prefixed frames, as udx-native's framed mode."""
        fb = self._frame_buf
        if fb is None:
            fb = self._frame_buf = bytearray()
        fb += data
        self._core.consumed(len(data))
        while len(fb) >= 3:
            size = 3 + (fb[0] | fb[1] << 8 | fb[2] << 16)
            if len(fb) < size:
                break
            frame = bytes(fb[:size])
            del fb[:size]
            self._core.hold_unread(size)  # accounted again when the reader takes it
            self._deliver(frame)

    def _wake_reader(self) -> None:
        w = self._read_waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _call(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            if self._socket is not None:
                self._socket.stats.callback_errors += 1
            log.exception("udx: stream callback failed")

    def _on_relayed_destroy(self) -> None:
        self._core.destroy(UDXError("stream was reset by the peer", "ECONNRESET"), send=False)
        self.dispatch()
        self._finish_close()

    def _finish_close(self) -> None:
        if self._finished:
            return
        self._finished = True
        self.drop_route()
        self.leave_kernel(closing=True)
        if not self._core.lingering:  # a lingering one goes at its linger's end (LingerEnded)
            self.disarm()
            self._unregister()
        self._wake_reader()
        w = self._drain_waiter
        if w is not None and not w.done():
            w.set_result(None)
        if self._closed_fut is not None and not self._closed_fut.done():
            self._closed_fut.set_result(None)
        for d, held_by, _source in self._early or ():
            self.udx.early_bytes -= len(d)
            held_by.stats.drop("relay_unconnected")
        self._early = None
        partners = self._relayed_from or []
        self._relayed_from = None
        for p in partners:
            p.destroy()
        if self._relay is not None:
            t = self._relay
            self._relay = None
            t.forget_partner(self)
            t.destroy()
        # a closed stream calls nothing back: dropping its hooks breaks the cycles they close
        # through their owners (a protocol's bound methods, a handshake's firewall closure), so
        # refcounting frees a closed connection without waiting for a garbage collection
        self.on_data = self.on_end = self.on_message = self._firewall = None
        cb = self.on_close
        if cb is not None:
            self.on_close = None
            self._call(cb, self.error)

    def _unregister(self) -> None:
        self._core.end_linger()
        if self.udx.streams.get(self.id) is self:
            del self.udx.streams[self.id]
