"""The asyncio runtime: one non-blocking UDP socket per `UDXSocket`, timers, and the relay fast path.

The socket is read with `loop.add_reader` and drained in batches instead of one
`datagram_received` call per packet: one event-loop wake serves a burst. On Linux the batch is
one `recvmmsg` and forwarded packets leave with one `sendmmsg`, runs of one stream's packets as
UDP_SEGMENT entries (`relay.udx.mmsg`); `_batch_by_runs` is the relay's hot path and works per
run, not per packet. Elsewhere `_on_readable` reads one datagram at a time into a reused buffer.
A batch whose datagrams are all fast-path ones is forwarded stream by stream (order kept per
stream, not across streams), so one stream's run is not cut at every ACK of the other
direction. With UDX_COALESCE_US set, after a burst that did not fill the batch the reader
pauses for a short hold (`relay.udx.moderation`, a timerfd) so the next read gathers more. A relayed stream forwards
only what comes from its peer's address. Time is the event loop's clock (`loop.time()`), the
one timers are scheduled on; the hold's timerfd is armed with a duration, not a time.

Socket and stream talk through small public methods (UDXSocket.schedule_flush, note_input,
send_datagrams, wire_address, batching, backlogged; UDXStream.relay_datagram, pass_on,
receive_datagram, passes_firewall, route_from, send_pending, `route`); the portable reader's
per-datagram fast path still reads stream fields directly, where a property per packet costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket as _socket
import struct
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

from . import mmsg
from .forwarding import (
    HEAD_FORWARD,
    HEAD_MASK,
    MIN_FORWARD,
    Route,
    all_forwardable,
    cut_runs,
    forwardable,
    from_pinned,
    interleaved,
    may_route,
    plan_by_stream,
    source_key,
    stream_runs,
    takes_from,
)
from .kernel import KernelForwarder
from .moderation import Moderation, hold_from_env
from .nft import Nft
from .packet import DESTROY, U32, UDXError
from .stream import DataReceived, EndReceived, MessageReceived, StreamClosed, StreamCore, StreamStats

log = logging.getLogger("relay.udx")

#: receive buffer a socket asks for unless told otherwise (bounded by net.core.rmem_max)
RECEIVE_BUFFER = 4 << 20
SEND_BUFFER = 4 << 20
_SO_RCVBUFFORCE = getattr(_socket, "SO_RCVBUFFORCE", 33)
_SO_MEMINFO = 55  # Linux: u32 counters, the 9th is the datagrams the kernel dropped at this socket
_capped_logged = False


def size_receive_buffer(sock: _socket.socket, want: int, *, warn: bool = False) -> int:
    """Ask for a `want`-byte receive buffer; returns what the kernel granted (getsockopt's figure,
    which Linux doubles for its bookkeeping). With CAP_NET_ADMIN (SO_RCVBUFFORCE) any size is
    granted, else the kernel caps it at net.core.rmem_max without a word: `warn` logs that once."""
    global _capped_logged
    try:
        sock.setsockopt(_socket.SOL_SOCKET, _SO_RCVBUFFORCE, want)
    except OSError:  # not privileged: the kernel caps SO_RCVBUF at net.core.rmem_max
        with contextlib.suppress(OSError):
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_RCVBUF, want)
    got = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_RCVBUF)
    if warn and got < 2 * want and not _capped_logged:  # Linux grants twice what was asked
        _capped_logged = True
        log.warning(
            "UDP receive buffer is %d KB, asked for %d KB: a stalled relay loses more packets; "
            "run it with CAP_NET_ADMIN or raise it with sysctl -w net.core.rmem_max=%d",
            got >> 10,
            want >> 10,
            want,
        )
    return got


Address = tuple[str, int]
#: `firewall(stream, socket, address) -> bool`: True drops the packet (udx-native's convention).
Firewall = Callable[["UDXStream", "UDXSocket", Address], bool]
DatagramHandler = Callable[[bytes, Address], None]

BUFFER_SIZE = 2048  # libudx truncates longer datagrams to this, so do we
RECV_BATCH = 128
RECV_BATCH_MMSG = 64
RECV_ROUNDS = 4
#: A batch of at most this many datagrams is forwarded slot by slot (`_batch_small`), larger
#: ones run by run; measured in-process, the slot path is cheaper up to about here.
SMALL_BATCH = 4
#: A batch of many streams with at most this many datagrams each on average leaves as one
#: send entry per datagram in arrival order: cheaper than cutting such short runs into
#: segmented sends (measured in-process: 1.5-2.4 vs 1.8-3.4 us per datagram at 1-4 per stream;
#: even at 8, longer at 2-32).
SHORT_RUNS = 4
SEND_QUEUE_MAX = 4096
LINGER = 3.0
#: Packets held for a relay partner that has not connected yet. libudx drops them (the
#: sender's first RTO, ~1 s, repairs it); holding a few is compatible (docs/wire/udx.md §4).
EARLY_PACKETS = 64
#: ... and at most this many bytes over all streams of one UDX instance: an honest pair's early
#: packets are its first flight, gone within a round trip, while 64 packets held on each of the
#: 16,384 relay streams a relay may have would be 1.5 GB. Past it the packet is dropped
#: (`relay_unconnected`) and its sender's RTO repairs it, as with libudx.
EARLY_BYTES_TOTAL = 4 * 2**20
_u32 = struct.Struct("<I")
_IP_MTU_DISCOVER = getattr(_socket, "IP_MTU_DISCOVER", 10)
_IP_PMTUDISC_PROBE = getattr(_socket, "IP_PMTUDISC_PROBE", 3)


def _with_forwarded(base: str, forwarded: str, doc: str) -> property:
    """A counter that is `base` plus what the fast paths counted in `forwarded` (one number
    for a forwarded datagram's receive, relay and send); `+=` on it adjusts `base`."""

    def get(self: SocketStats) -> int:
        return int(getattr(self, base) + getattr(self, forwarded))

    def set_(self: SocketStats, value: int) -> None:
        setattr(self, base, value - getattr(self, forwarded))

    return property(get, set_, doc=doc)


class SocketStats:
    """Per-socket counters; the relay's metrics endpoint reports these.

    A datagram the fast paths forward is received, relayed and sent at once: they count it
    once in `forwarded_packets`/`forwarded_bytes` (and its read in `forwarded_reads`), three
    numbers per wake instead of seven, and the received/relayed/sent counters and `reads`
    include them whenever they are read.
    """

    __slots__ = (
        "_reads",
        "_received_bytes",
        "_received_packets",
        "_relayed_bytes",
        "_relayed_packets",
        "_sent_bytes",
        "_sent_packets",
        "callback_errors",
        "dropped_by_cause",
        "dropped_packets",
        "foreign_packets",
        "forwarded_bytes",
        "forwarded_packets",
        "forwarded_reads",
        "gro_buffers",
        "gro_segments",
        "gso_fallbacks",
        "gso_segments",
        "gso_sends",
        "holds",
        "kernel_bytes",
        "kernel_packets",
        "send_errors",
    )

    #: the counters `as_dict` reports, in order
    NAMES = (
        "received_packets",
        "received_bytes",
        "sent_packets",
        "sent_bytes",
        "relayed_packets",
        "relayed_bytes",
        "dropped_packets",
        "foreign_packets",
        "send_errors",
        "callback_errors",
        "dropped_by_cause",
        "gso_fallbacks",
        "gso_segments",
        "gso_sends",
        "gro_segments",
        "gro_buffers",
        "holds",
        "reads",
        "kernel_packets",
        "kernel_bytes",
    )

    received_packets = _with_forwarded("_received_packets", "forwarded_packets", "datagrams received")
    received_bytes = _with_forwarded("_received_bytes", "forwarded_bytes", "bytes received")
    sent_packets = _with_forwarded("_sent_packets", "forwarded_packets", "datagrams sent")
    sent_bytes = _with_forwarded("_sent_bytes", "forwarded_bytes", "bytes sent")
    relayed_packets = _with_forwarded("_relayed_packets", "forwarded_packets", "datagrams relayed")
    relayed_bytes = _with_forwarded("_relayed_bytes", "forwarded_bytes", "bytes relayed")
    #: batched reads (recvmmsg calls that returned datagrams): received_packets / reads is
    #: the mean batch
    reads = _with_forwarded("_reads", "forwarded_reads", "batched reads that returned datagrams")

    def __init__(self) -> None:
        self._received_packets = self._received_bytes = 0
        self._sent_packets = self._sent_bytes = 0
        self._relayed_packets = self._relayed_bytes = 0
        self._reads = 0
        self.forwarded_packets = self.forwarded_bytes = self.forwarded_reads = 0
        self.dropped_packets = 0
        self.foreign_packets = 0
        self.send_errors = 0
        self.callback_errors = 0
        #: `dropped_packets` by cause: garbage, unknown_stream, firewalled, wrong_address,
        #: invalid (the stream refused it), reorder_limit, relay_unconnected, error
        self.dropped_by_cause: dict[str, int] = {}
        #: times the kernel refused a segmented send and GSO was switched off for the socket
        self.gso_fallbacks = 0
        #: datagrams sent inside segmented (GSO) sends, and those sends
        self.gso_segments = 0
        self.gso_sends = 0
        #: datagrams that arrived coalesced by GRO, and the buffers that carried them
        self.gro_segments = 0
        self.gro_buffers = 0
        #: receive-coalescing holds (the reader paused so a batch could gather)
        self.holds = 0
        #: forwarded by the kernel (`relay.udx.kernel`), also counted in relayed_packets/bytes
        self.kernel_packets = 0
        self.kernel_bytes = 0

    def drop(self, cause: str, count: int = 1) -> None:
        self.dropped_packets += count
        self.dropped_by_cause[cause] = self.dropped_by_cause.get(cause, 0) + count

    def as_dict(self) -> dict[str, Any]:
        """Every counter by name (`dropped_by_cause` copied)."""
        out = {name: getattr(self, name) for name in self.NAMES}
        out["dropped_by_cause"] = dict(self.dropped_by_cause)
        return out

    def __repr__(self) -> str:
        return "SocketStats(" + ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items()) + ")"


class UDX:
    """One stream-id table shared by its sockets, as one libudx instance (hyperdht has two sockets)."""

    def __init__(self) -> None:
        self.streams: dict[int, UDXStream] = {}
        self.sockets: list[UDXSocket] = []
        self.early_bytes = 0  # held for relay partners not connected yet, bounded by EARLY_BYTES_TOTAL

    def random_id(self) -> int:
        while True:
            i = int.from_bytes(os.urandom(4), "little")
            if i not in self.streams:
                return i

    def id_free(self, sid: int) -> bool:
        return 0 <= sid <= U32 and sid not in self.streams

    def create_stream(
        self,
        id: int | None = None,
        *,
        firewall: Firewall | None = None,
        framed: bool = False,
        seq: int = 0,
        max_reorder_bytes: int | None = None,
    ) -> UDXStream:
        """`max_reorder_bytes` bounds what the stream holds out of order (default: its window;
        a relay's control streams, which carry tiny messages, can pass far less)."""
        sid = self.random_id() if id is None else id & U32
        if sid in self.streams and not self.streams[sid].closed:
            raise UDXError(f"stream id {sid:#010x} is in use", "EADDRINUSE")
        s = UDXStream(self, sid, firewall=firewall, framed=framed, seq=seq, max_reorder_bytes=max_reorder_bytes)
        self.streams[sid] = s
        return s

    async def create_socket(
        self,
        host: str = "0.0.0.0",
        port: int = 0,
        *,
        on_datagram: DatagramHandler | None = None,
        reuse_port: bool = False,
        use_mmsg: bool | None = None,
        use_gso: bool | None = None,
        coalesce_us: int | None = None,
        receive_buffer: int | None = None,
    ) -> UDXSocket:
        """Bind a UDP socket; `receive_buffer` None = RECEIVE_BUFFER, quietly capped by
        net.core.rmem_max (a size given is forced when privileged, else capped with a warning);
        `use_mmsg` None = batch syscalls on Linux unless UDX_NO_MMSG=1,
        `use_gso` None = UDP GSO/GRO on the batched path where the kernel has them, unless
        UDX_NO_GSO=1 (False turns them off, True asks for them where supported);
        `coalesce_us` None = receive coalescing hold from UDX_COALESCE_US (0 = off;
        `relay.udx.moderation`)."""
        sock = UDXSocket(
            self,
            host,
            port,
            on_datagram=on_datagram,
            reuse_port=reuse_port,
            use_mmsg=use_mmsg,
            use_gso=use_gso,
            coalesce_us=coalesce_us,
            receive_buffer=receive_buffer,
        )
        self.sockets.append(sock)
        return sock

    def close(self) -> None:
        """Destroy every stream (one DESTROY each when connected) and close the sockets."""
        for s in list(self.streams.values()):
            s.destroy()
            s.unregister_now()
        for sock in list(self.sockets):
            sock.close()


class UDXSocket:
    """One UDP socket: UDX packets go to streams by id, every other datagram to `on_datagram`."""

    def __init__(
        self,
        udx: UDX,
        host: str = "0.0.0.0",
        port: int = 0,
        *,
        on_datagram: DatagramHandler | None = None,
        reuse_port: bool = False,
        use_mmsg: bool | None = None,
        use_gso: bool | None = None,
        coalesce_us: int | None = None,
        receive_buffer: int | None = None,
    ) -> None:
        self.udx = udx
        self.loop = asyncio.get_running_loop()
        self.on_datagram = on_datagram
        self.stats = SocketStats()
        #: stream id -> route, for the relayed streams whose route is on this socket, kept by
        #: `UDXStream.route`: the fast paths' one lookup per datagram
        self.routes: dict[int, Route] = {}
        family = _socket.AF_INET6 if ":" in host else _socket.AF_INET
        sock = _socket.socket(family, _socket.SOCK_DGRAM)
        sock.setblocking(False)
        if reuse_port:
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEPORT, 1)
        if receive_buffer is None:
            with contextlib.suppress(OSError):  # capped by net.core.rmem_max
                sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_RCVBUF, RECEIVE_BUFFER)
            #: the receive buffer the kernel granted (bytes, as getsockopt reports it)
            self.receive_buffer = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_RCVBUF)
        else:
            self.receive_buffer = size_receive_buffer(sock, receive_buffer, warn=True)
        with contextlib.suppress(OSError):  # capped by net.core.wmem_max
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDBUF, SEND_BUFFER)
        if family == _socket.AF_INET:
            with contextlib.suppress(OSError):
                sock.setsockopt(_socket.IPPROTO_IP, _IP_MTU_DISCOVER, _IP_PMTUDISC_PROBE)
        else:
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(_socket.IPPROTO_IPV6, _socket.IPV6_V6ONLY, 0)
        sock.bind((host, port))
        self._sock = sock
        self.family = family
        self._buf = bytearray(BUFFER_SIZE)
        self._mv = memoryview(self._buf)
        self._sendq: deque[tuple[bytes, Address]] = deque()
        self._dirty: set[UDXStream] = set()
        self._flush_scheduled = False
        self.closed = False
        self._mmsg: mmsg.BatchIO | None = None
        self._v6 = family == _socket.AF_INET6
        #: receive coalescing (batched reader only): the decision, its timer, and whether the
        #: socket's reader is registered right now (off during a hold)
        self._moderation: Moderation | None = None
        self._hold_timer: mmsg.HoldTimer | None = None
        self._reading = True
        #: kernel forwarding of established relayed pairs, once `enable_kernel_forwarding` ran
        self.kernel: KernelForwarder | None = None
        if use_mmsg is None:
            use_mmsg = mmsg.available() and os.environ.get("UDX_NO_MMSG") != "1"
        if use_mmsg:
            gso, gro = mmsg.offload_support() if use_gso is not False else (False, False)
            if gro:
                try:
                    sock.setsockopt(mmsg.SOL_UDP, mmsg.UDP_GRO, 1)
                except OSError:
                    gro = False
            self._mmsg = mmsg.BatchIO(sock.fileno(), family, RECV_BATCH_MMSG, BUFFER_SIZE, gso=gso, gro=gro)
            self.loop.add_reader(sock.fileno(), self._on_readable_mmsg)
            hold = hold_from_env() if coalesce_us is None else max(0, coalesce_us) / 1e6
            if hold > 0:
                try:
                    self._hold_timer = mmsg.HoldTimer()
                except OSError:
                    log.debug("udx: no timerfd; receive coalescing is off")
                else:
                    self._moderation = Moderation(hold)
                    self.loop.add_reader(self._hold_timer.fd, self._on_hold_end)
        else:
            self.loop.add_reader(sock.fileno(), self._on_readable)

    @property
    def address(self) -> Address:
        a = self._sock.getsockname()
        return (a[0], a[1])

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def batching(self) -> bool:
        """Read with recvmmsg and forward with sendmmsg (the relay's fast path can be used)."""
        return self._mmsg is not None

    @property
    def backlogged(self) -> bool:
        """Datagrams wait for the socket buffer (sent one by one, in order, until it drains)."""
        return bool(self._sendq)

    def note_input(self, s: UDXStream) -> None:
        """A stream took input during a read: the reader flushes it (ACKs) after the batch."""
        self._dirty.add(s)

    @property
    def gso(self) -> bool:
        """Forwarded runs go out as one segmented send (UDP_SEGMENT) right now."""
        return self._mmsg is not None and self._mmsg.gso

    @property
    def gro(self) -> bool:
        """The kernel may hand this socket coalesced runs (UDP_GRO)."""
        return self._mmsg is not None and self._mmsg.gro

    def kernel_drops(self) -> int | None:
        """Datagrams the kernel dropped at this socket (its receive buffer was full while the loop
        did not read): the relay never saw them. None where the kernel does not say (SO_MEMINFO)."""
        try:
            raw = self._sock.getsockopt(_socket.SOL_SOCKET, _SO_MEMINFO, 9 * 4)
        except OSError:
            return None
        return struct.unpack("9I", raw)[8] if len(raw) >= 36 else None

    def offload(self) -> dict[str, Any]:
        """The `/stats` `udx` group for this socket: {gso, gro, gso_fallbacks}."""
        return {"gso": self.gso, "gro": self.gro, "gso_fallbacks": self.stats.gso_fallbacks}

    def enable_kernel_forwarding(self, nft: Nft | None = None) -> KernelForwarder:
        """Forward established relayed pairs in the kernel (nftables); raises KernelUnavailable.

        UDP_GRO is switched off on this socket: GRO merges a peer's packets by address, not by
        stream, and the kernel rule routes a merged buffer by its first packet's stream id.
        """
        if self.kernel is None:
            self.kernel = KernelForwarder(self, nft)
            io = self._mmsg
            if io is not None and io.gro:
                with contextlib.suppress(OSError):
                    self._sock.setsockopt(mmsg.SOL_UDP, mmsg.UDP_GRO, 0)
                io.gro = False
        return self.kernel

    def count_dropped(self, cause: str) -> None:
        """For an `on_datagram` handler that could not use a datagram: count it by cause."""
        self.stats.drop(cause)

    def send(self, data: bytes | bytearray | memoryview, addr: Address) -> None:
        """Send a non-UDX datagram (dht-rpc) from this socket."""
        self._sendto(data, self.wire_address(addr))

    def wire_address(self, addr: Address) -> Address:
        """`addr` as this socket sends to it: IPv4 peers of a dual-stack IPv6 socket are
        addressed as ::ffff:a.b.c.d."""
        if self.family == _socket.AF_INET6 and ":" not in addr[0]:
            return ("::ffff:" + addr[0], addr[1])
        return (addr[0], addr[1])

    def close(self) -> None:
        if self.closed:
            return
        if self.kernel is not None:
            self.kernel.close()
        for s in [s for s in self.udx.streams.values() if s.socket is self]:
            s.destroy()
        self.closed = True
        self.loop.remove_reader(self._sock.fileno())
        if self._hold_timer is not None:
            self.loop.remove_reader(self._hold_timer.fd)
            self._hold_timer.close()
            self._hold_timer = None
            self._moderation = None
        if self._sendq:
            self.loop.remove_writer(self._sock.fileno())
            self._sendq.clear()
        self._sock.close()
        with contextlib.suppress(ValueError):
            self.udx.sockets.remove(self)

    # --- sending ---------------------------------------------------------------------------

    def _sendto(self, data: bytes | bytearray | memoryview, addr: Address) -> None:
        if self._sendq:
            if len(self._sendq) < SEND_QUEUE_MAX:
                self._sendq.append((bytes(data), addr))
            else:
                self.stats.send_errors += 1
            return
        try:
            self._sock.sendto(data, addr)
        except BlockingIOError:
            self._sendq.append((bytes(data), addr))
            self.loop.add_writer(self._sock.fileno(), self._on_writable)
            return
        except OSError:
            self.stats.send_errors += 1
            return
        self.stats.sent_packets += 1
        self.stats.sent_bytes += len(data)

    def send_datagrams(self, out: Sequence[bytes | bytearray | memoryview], addr: Address) -> None:
        """A stream's datagrams for one destination (in this socket's address form): runs of equal size (the last may be
        shorter) go out as one UDP_SEGMENT send when GSO is on, the rest one by one."""
        io = self._mmsg
        if io is None or not io.gso or self._sendq or len(out) < 2:
            for d in out:
                self._sendto(d, addr)
            return
        lens = [len(d) for d in out]
        for x, y in cut_runs(lens, mmsg.GSO_MAX_SEGMENTS, mmsg.GSO_MAX_BYTES):
            if y - x < 2 or self._sendq or not io.gso:
                for d in out[x:y]:
                    self._sendto(d, addr)
            else:
                self._send_segmented(out[x:y], lens[x], addr)

    def _send_segmented(self, run: Sequence[bytes | bytearray | memoryview], seg: int, addr: Address) -> None:
        st = self.stats
        try:
            self._sock.sendmsg([b"".join(run)], [(mmsg.SOL_UDP, mmsg.UDP_SEGMENT, struct.pack("=H", seg))], 0, addr)
        except BlockingIOError:
            pass
        except OSError as e:
            if e.errno in mmsg.GSO_REFUSED and self._mmsg is not None:
                self._mmsg.disable_gso()
                st.gso_fallbacks += 1
                log.warning("udx: the kernel refused a UDP_SEGMENT send; GSO is off for this socket")
            elif e.errno != errno.EMSGSIZE:
                st.send_errors += len(run)
                return
        else:
            st.sent_packets += len(run)
            st.sent_bytes += sum(len(d) for d in run)
            st.gso_sends += 1
            st.gso_segments += len(run)
            return
        for d in run:  # the socket buffer is full, or segmentation was refused: one by one
            self._sendto(d, addr)

    def _on_writable(self) -> None:
        q = self._sendq
        sendto = self._sock.sendto
        st = self.stats
        while q:
            data, addr = q[0]
            try:
                sendto(data, addr)
            except BlockingIOError:
                return
            except OSError:
                st.send_errors += 1
            else:
                st.sent_packets += 1
                st.sent_bytes += len(data)
            q.popleft()
        self.loop.remove_writer(self._sock.fileno())

    # --- receiving (hot path) -------------------------------------------------------------

    def _on_readable(self) -> None:
        """Portable reader: one `recvfrom_into` per datagram into a reused buffer."""
        recv_into = self._sock.recvfrom_into
        buf = self._buf
        mv = self._mv
        streams = self.udx.streams
        st = self.stats
        v6 = self.family == _socket.AF_INET6
        for k in range(RECV_BATCH):
            if k & 31 == 31 and self._dirty:
                self._flush_dirty()  # ACK what the last 32 datagrams delivered
            try:
                n, addr = recv_into(buf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                continue
            st.received_packets += 1
            st.received_bytes += n
            if v6:
                addr = _v4(addr)
            try:
                # fast path: a connected relay stream whose partner is connected on this socket
                if n >= 20 and buf[0] == 0xFF and buf[1] == 0x01:
                    s = streams.get(_u32.unpack_from(buf, 4)[0])
                    if s is not None and s._socket is self and not s.closed and addr == s._remote_addr:
                        t = s._relay
                        if t is not None and t._socket is self and not self._sendq and not buf[2] & DESTROY:
                            buf[4:8] = t._remote_id_le
                            try:
                                self._sock.sendto(mv[:n], t._send_addr)  # type: ignore[arg-type]
                                st.sent_packets += 1
                                st.sent_bytes += n
                            except BlockingIOError:
                                self._sendq.append((bytes(mv[:n]), t._send_addr))  # type: ignore[arg-type]
                                self.loop.add_writer(self._sock.fileno(), self._on_writable)
                            except OSError:
                                st.send_errors += 1
                            st.relayed_packets += 1
                            st.relayed_bytes += n
                            s._relayed_packets += 1
                            s._relayed_bytes += n
                            continue
                self._handle(mv[:n], n, addr)
            except Exception:
                st.callback_errors += 1
                st.drop("error")
                log.exception("udx: error while handling a datagram from %s", addr)
        if self._dirty:
            self._flush_dirty()

    def _on_readable_mmsg(self) -> None:
        """Linux reader: `recvmmsg` a batch, forward relay packets with one `sendmmsg`.

        A lone datagram of a relayed pair (most wakes of chatty traffic) is forwarded inline,
        with as little as possible between the two syscalls; a batch of many pairs' datagrams
        goes to `_forward_spread` (one send entry each, in arrival order). Other batches: one
        without GRO-coalesced buffers goes to `_batch_by_runs` (work per run of one stream's
        packets, not per packet); one with them to `_batch_per_slot`.
        """
        io = self._mmsg
        assert io is not None
        count = io.recv()
        if count == 1:
            # the decisions of `forwarding.forwardable` and the route's pinned source, written out
            n, head, sid, src0, ctl = io.slot(0)
            r = self.routes.get(sid)
            if (
                r is not None
                and not ctl
                and (
                    n >= MIN_FORWARD
                    and head & HEAD_MASK == HEAD_FORWARD
                    and src0 == r.src0
                    and (not self._v6 or io.source(0)[1:] == (r.src1, r.src2))
                )
            ):
                if r.rid != sid:
                    io.set_ids(0, 1, r.rid)
                r.relayed_packets += 1
                r.relayed_bytes += n
                if io.send_first(r.sa, n):
                    st = self.stats
                    st.forwarded_reads += 1
                    st.forwarded_packets += 1
                    st.forwarded_bytes += n
                else:
                    self._first_failed(io, r, n)
                if self._moderation is not None and not self.closed:
                    self._moderate(self._moderation, 1, False)
                return
        st = self.stats
        got = 0
        merged = False
        rounds = RECV_ROUNDS
        while count:
            if count > 0:
                got += count
                coalesced = io.gro and io.coalesced(count)
                if not coalesced and count > 1 and self._forward_spread(io, count):
                    pass
                else:
                    st.reads += 1
                    st.received_packets += count
                    if count <= SMALL_BATCH and not coalesced:
                        st.received_bytes += self._batch_small(io, count)
                    else:
                        lens = io.received(count)
                        st.received_bytes += sum(lens)
                        if coalesced:
                            merged = True
                            self._batch_per_slot(io, count, lens)
                        else:
                            self._batch_by_runs(io, count, lens)
                    if self._dirty:
                        self._flush_dirty()  # ACK what this batch delivered before reading more
                if count < io.batch:
                    break
            rounds -= 1
            if not rounds:
                break
            count = io.recv()
        mod = self._moderation
        if mod is not None and not self.closed:
            self._moderate(mod, got, merged)

    def _first_failed(self, io: mmsg.BatchIO, r: Route, n: int) -> None:
        """`send_first` did not take slot 0 (socket buffer full, or an error): counted as
        received and relayed, and sent or queued in order by `_send_rest`, which counts what
        it sends."""
        st = self.stats
        st.reads += 1
        st.received_packets += 1
        st.received_bytes += n
        st.relayed_packets += 1
        st.relayed_bytes += n
        fallbacks = io.gso_fallbacks
        self._send_rest(io, 1, 1, n, io.first_failed(r.sa, r.target, n), fallbacks)

    def _forward_spread(self, io: mmsg.BatchIO, count: int) -> bool:
        """A batch of relayed datagrams whose streams are all different or nearly so (many
        chatty pairs, a datagram or two each): each leaves as its own send entry, in arrival
        order, with one `sendmmsg` (ids rewritten only where they differ: the blind relay
        gives a relay stream its partner peer's own id). Only when the batch is spread
        (`SHORT_RUNS` or fewer per stream: longer runs go out as segmented sends by
        `_batch_by_runs`) and every datagram takes the fast path (`_take_batch`); otherwise
        False before anything is sent.
        """
        ids = io.ids(0, count)
        if count > SHORT_RUNS and count > SHORT_RUNS * len(set(ids)):
            return False
        lens = io.received(count)
        rs = self._take_batch(io, count, ids, lens)
        if rs is None:
            return False
        io.put_spread(count, [r.sa for r in rs])
        for r, n in zip(rs, lens, strict=True):  # each source stream's share
            r.relayed_packets += 1
            r.relayed_bytes += n
        nbytes = sum(lens)
        fallbacks = io.gso_fallbacks
        st = self.stats
        res = io.send(count)
        if res is None:
            st.forwarded_reads += 1
            st.forwarded_packets += count
            st.forwarded_bytes += nbytes
            return True
        st.reads += 1
        st.received_packets += count
        st.received_bytes += nbytes
        st.relayed_packets += count
        st.relayed_bytes += nbytes
        io.targets[:count] = [r.target for r in rs]
        self._send_rest(io, count, count, nbytes, res, fallbacks)
        return True

    def _take_batch(self, io: mmsg.BatchIO, count: int, ids: list[int], lens: list[int]) -> list[Route] | None:
        """When every datagram of a batch takes the fast path (a route on this socket,
        `forwarding.all_forwardable`, from its pinned source): their ids rewritten for their
        partners (only where they differ) and the route of each; else None, nothing touched.
        The checks run over the batch's lists, not per datagram."""
        found = list(map(self.routes.get, ids))
        if None in found:
            return None
        rs = cast("list[Route]", found)
        if not all_forwardable(io.heads(0, count), lens):
            return None
        src0, src1, src2 = io.sources(0, count)
        if [r.src0 for r in rs] != src0:
            return None
        if src1 is not None and ([r.src1 for r in rs] != src1 or [r.src2 for r in rs] != src2):
            return None
        rids = [r.rid for r in rs]
        if rids != ids:
            io.set_each_id(count, rids)
        return rs

    def _moderate(self, mod: Moderation, got: int, merged: bool) -> None:
        """After a wake that read `got` entries (`merged`: some were GRO runs): pause reading
        for a hold, or read on."""
        io = self._mmsg
        timer = self._hold_timer
        assert io is not None and timer is not None
        if mod.after_batch(got, io.batch, self.loop.time(), coalesced=merged) is not None:
            try:
                timer.arm(mod.hold)
            except OSError:
                log.warning("udx: the hold timer failed; receive coalescing is off for this socket")
                mod.hold = 0.0
                mod.release(self.loop.time())
            else:
                self.stats.holds += 1
                if self._reading:
                    self.loop.remove_reader(self._sock.fileno())
                    self._reading = False
                return
        if not self._reading:
            self.loop.add_reader(self._sock.fileno(), self._on_readable_mmsg)
            self._reading = True

    def _on_hold_end(self) -> None:
        """The hold's timer fired: read what gathered (the read may start the next hold)."""
        mod = self._moderation
        timer = self._hold_timer
        if mod is None or timer is None:
            return
        if not mod.release(self.loop.time()):
            timer.clear()
            return
        try:
            self._on_readable_mmsg()
        finally:
            if not mod.holding:
                timer.clear()
                if not self._reading and not self.closed:
                    self.loop.add_reader(self._sock.fileno(), self._on_readable_mmsg)
                    self._reading = True

    def _batch_small(self, io: mmsg.BatchIO, count: int) -> int:
        """A few plain datagrams (a chatty pair's wake): decided slot by slot, each forwarded
        one its own send entry, no per-batch lists or runs. Returns the bytes received.

        The same decisions as the run paths (`forwarding.forwardable`, the route's pinned
        source), written out: at one to a few datagrams per wake, the lists and calls that
        pay off for a run cost more than the forwarding itself.
        """
        streams = self.udx.streams
        v6 = self._v6
        j = nbytes = total = 0
        for i in range(count):
            n, head, sid, src0, _ = io.slot(i)
            total += n
            s = streams.get(sid)
            if s is not None:
                r = s.route
                if (
                    r is not None
                    and r.sock is self
                    and n >= MIN_FORWARD
                    and head & HEAD_MASK == HEAD_FORWARD
                    and src0 == r.src0
                    and (not v6 or io.source(i)[1:] == (r.src1, r.src2))
                ):
                    io.put_one(j, i, r.rid, r.sa, r.target, n)
                    r.relayed_packets += 1
                    r.relayed_bytes += n
                    j += 1
                    nbytes += n
                    continue
            if j:  # what is prepared goes first: nothing overtakes what came before it
                self._flush_batch(io, j, j, nbytes, 0, 0)
                j = nbytes = 0
            try:
                self._handle(io.mv[i * io.size : i * io.size + n], n, i)
            except Exception:
                self.stats.callback_errors += 1
                self.stats.drop("error")
                log.exception("udx: error while handling a datagram")
        if j:
            self._flush_batch(io, j, j, nbytes, 0, 0)
        return total

    def _batch_by_runs(self, io: mmsg.BatchIO, count: int, lens: list[int]) -> None:
        """Forward a batch of plain datagrams run by run.

        A run is consecutive datagrams with one stream id (`forwarding.stream_runs`). For a
        relayed stream whose route is on this socket, the checks (`all_forwardable`,
        `from_pinned`) and the id rewrite are slice operations over the whole run; the run
        goes out as segmented entries pointing into the per-slot iovec table. Anything else is
        taken datagram by datagram by `_handle`, after what is already prepared has been sent,
        so nothing for one destination overtakes what came before it.
        """
        ids = io.ids(0, count)
        if interleaved(ids) and self._forward_by_stream(io, count, ids, lens):
            return
        streams = self.udx.streams
        st = self.stats
        cap = io.batch
        limit = io.max_segments
        j = fw_pkts = fw_bytes = seg_sends = seg_dgrams = 0
        for sid, i, end in stream_runs(ids):
            s = streams.get(sid)
            r = s.route if s is not None else None
            run_lens = lens[i:end]
            if (
                r is None
                or r.sock is not self
                or not all_forwardable(io.heads(i, end), run_lens)
                or not from_pinned(r, *io.sources(i, end))
            ):
                if j:
                    self._flush_batch(io, j, fw_pkts, fw_bytes, seg_sends, seg_dgrams)
                    j = fw_pkts = fw_bytes = seg_sends = seg_dgrams = 0
                mv = io.mv
                size = io.size
                for x in range(i, end):
                    n = lens[x]
                    try:
                        self._handle(mv[x * size : x * size + n], n, x)
                    except Exception:
                        st.callback_errors += 1
                        st.drop("error")
                        log.exception("udx: error while handling a datagram")
                continue
            io.set_ids(i, end, r.rid)
            run_bytes = sum(run_lens)
            r.relayed_packets += end - i
            r.relayed_bytes += run_bytes
            fw_pkts += end - i
            fw_bytes += run_bytes
            sa = r.sa
            target = r.target
            for x, y in cut_runs(run_lens, limit, mmsg.GSO_MAX_BYTES):
                n = y - x
                io.put_slots(j, sa, target, i + x, n, run_lens[x])
                if n > 1:
                    seg_sends += 1
                    seg_dgrams += n
                j += 1
                if j >= cap:
                    self._flush_batch(io, j, fw_pkts, fw_bytes, seg_sends, seg_dgrams)
                    j = fw_pkts = fw_bytes = seg_sends = seg_dgrams = 0
            r.gen = -1  # the per-slot path must not extend an entry of this batch
        if j:
            self._flush_batch(io, j, fw_pkts, fw_bytes, seg_sends, seg_dgrams)

    def _forward_by_stream(self, io: mmsg.BatchIO, count: int, ids: list[int], lens: list[int]) -> bool:
        """Forward a batch whose streams interleave (A's data between D's ACKs) in runs longer
        than `SHORT_RUNS` (shorter ones went slot for entry in `_forward_spread`): stream by
        stream (`forwarding.plan_by_stream`) as segmented sends.

        Only when every datagram of the batch is a fast-path one (`_take_batch`): otherwise
        returns False before touching anything and the caller takes the batch in arrival order.
        """
        if self._take_batch(io, count, ids, lens) is None:
            return False
        route = self.routes
        self._forward_plan(io, [(route[sid], slots) for sid, slots in plan_by_stream(ids)], lens)
        return True

    def _forward_plan(self, io: mmsg.BatchIO, plan: list[tuple[Route, list[int]]], lens: list[int]) -> None:
        """Send checked per-stream runs (route, receive slots in order; their ids already
        rewritten): equal-size sub-runs as segmented entries (gathered through the entry's own
        iovecs when the run is not contiguous in the receive buffer)."""
        cap = io.batch
        limit = io.max_segments
        max_bytes = mmsg.GSO_MAX_BYTES
        j = fw_pkts = fw_bytes = seg_sends = seg_dgrams = 0
        for r, slots in plan:
            k = len(slots)
            first = slots[0]
            sa = r.sa
            target = r.target
            r.gen = -1
            if k == 1:  # one datagram: no run to cut
                n = lens[first]
                io.put_slots(j, sa, target, first, 1, n)
                r.relayed_packets += 1
                r.relayed_bytes += n
                j += 1
                fw_pkts += 1
                fw_bytes += n
                if j >= cap:
                    self._flush_batch(io, j, fw_pkts, fw_bytes, seg_sends, seg_dgrams)
                    j = fw_pkts = fw_bytes = seg_sends = seg_dgrams = 0
                continue
            contiguous = slots[-1] - first == k - 1
            glens = lens[first : first + k] if contiguous else [lens[x] for x in slots]
            run_bytes = sum(glens)
            r.relayed_packets += k
            r.relayed_bytes += run_bytes
            fw_pkts += k  # counted before a full batch may be flushed on the way
            fw_bytes += run_bytes
            if contiguous:  # as they lie in the receive buffer
                for x, y in cut_runs(glens, limit, max_bytes):
                    n = y - x
                    io.put_slots(j, sa, target, first + x, n, glens[x])
                    if n > 1:
                        seg_sends += 1
                        seg_dgrams += n
                    j += 1
                    if j >= cap:
                        self._flush_batch(io, j, fw_pkts, fw_bytes, seg_sends, seg_dgrams)
                        j = fw_pkts = fw_bytes = seg_sends = seg_dgrams = 0
            else:
                for x, y in cut_runs(glens, limit, max_bytes):
                    n = y - x
                    io.put_gather(j, sa, target, slots[x:y], glens[x:y], glens[x])
                    if n > 1:
                        seg_sends += 1
                        seg_dgrams += n
                    j += 1
                    if j >= cap:
                        self._flush_batch(io, j, fw_pkts, fw_bytes, seg_sends, seg_dgrams)
                        j = fw_pkts = fw_bytes = seg_sends = seg_dgrams = 0
        if j:
            self._flush_batch(io, j, fw_pkts, fw_bytes, seg_sends, seg_dgrams)

    def _batch_per_slot(self, io: mmsg.BatchIO, count: int, lens: list[int]) -> None:
        """Forward a batch that holds GRO-coalesced buffers, slot by slot.

        Per forwarded packet: one word test (`forwarding.forwardable`), one dict lookup, one
        source-address test, one in-place id store and one send entry (or, with GSO, a packet
        of the same size as the open run of its route joins that run's entry instead). A
        coalesced buffer goes to `_forward_coalesced`.
        """
        streams = self.udx.streams
        st = self.stats
        mv = io.mv
        u32 = io.u32  # the datagrams' own words: the header's first word and the stream id
        size = io.size
        words = size >> 2
        cap = io.batch
        v6 = self.family == _socket.AF_INET6
        max_bytes = mmsg.GSO_MAX_BYTES
        maxseg = io.max_segments
        gen = io.gen
        j = fw_pkts = fw_bytes = 0
        for i in range(count):
            n = lens[i]
            g = io.segment_size(i)
            if 0 < g < n:
                j, p, nb = self._forward_coalesced(io, i, n, g, j)
                fw_pkts += p
                fw_bytes += nb
                if j >= cap:
                    self._flush_batch(io, j, fw_pkts, fw_bytes)
                    j = fw_pkts = fw_bytes = 0
                gen = io.gen
                maxseg = io.max_segments
                continue
            w = i * words
            s = streams.get(u32[w + 1])
            r = s.route if s is not None else None
            if r is not None and r.sock is self and n >= MIN_FORWARD and u32[w] & HEAD_MASK == HEAD_FORWARD:
                src = io.source(i)
                if src[0] == r.src0 and (not v6 or (src[1] == r.src1 and src[2] == r.src2)):
                    u32[w + 1] = r.rid
                    k = r.k
                    if r.gen == gen and n <= r.seg and k < maxseg and r.nbytes + n <= max_bytes:
                        io.extend(r.entry, k, i * size, n, r.seg)
                        r.k = k + 1
                        r.nbytes += n
                        if n < r.seg:
                            r.seg = 0  # a shorter datagram ends the run
                    else:
                        io.put_span(j, r.sa, r.target, i * size, n)
                        r.entry = j
                        r.seg = n
                        r.k = 1
                        r.nbytes = n
                        r.gen = gen
                        j += 1
                    r.relayed_packets += 1
                    r.relayed_bytes += n
                    fw_pkts += 1
                    fw_bytes += n
                    if j >= cap:
                        self._flush_batch(io, j, fw_pkts, fw_bytes)
                        j = fw_pkts = fw_bytes = 0
                        gen = io.gen
                        maxseg = io.max_segments
                    continue
            try:
                self._handle(mv[i * size : i * size + n], n, i)
            except Exception:
                st.callback_errors += 1
                st.drop("error")
                log.exception("udx: error while handling a datagram")
        if j:
            self._flush_batch(io, j, fw_pkts, fw_bytes)

    def _forward_coalesced(self, io: mmsg.BatchIO, i: int, n: int, g: int, j: int) -> tuple[int, int, int]:
        """A GRO buffer: `n` bytes of datagrams of `g` bytes (the last may be shorter) from one source.

        When every segment is a fast-path packet of one stream (the common case: one peer's
        run of DATA) the ids are rewritten with one strided store and the buffer is forwarded
        as one segmented entry. Otherwise each segment is taken on its own (at most
        GSO_MAX_SEGMENTS entries: GRO coalesces no more). Returns the next free entry and
        the datagrams and bytes it forwarded.
        """
        st = self.stats
        nseg = -(-n // g)
        st.received_packets += nseg - 1  # the caller counts the buffer as one
        st.gro_buffers += 1
        st.gro_segments += nseg
        size = io.size
        off0 = i * size
        u32 = io.u32
        last = n - (nseg - 1) * g
        src0, src1, src2 = io.sources(i, i + 1)
        if g & 3 == 0 and g >= MIN_FORWARD and last >= MIN_FORWARD and io.gso and n <= mmsg.GSO_MAX_BYTES:
            gw = g >> 2
            w = i * (size >> 2)
            stop = w + (nseg - 1) * gw + 2
            heads = u32[w:stop:gw].tolist()
            ids = u32[w + 1 : stop : gw].tolist()
            sid = ids[0]
            s = self.udx.streams.get(sid)
            r = s.route if s is not None else None
            if (
                r is not None
                and r.sock is self
                and ids.count(sid) == nseg
                and all_forwardable(heads, [g])
                and from_pinned(r, src0, src1, src2)
            ):
                u32[w + 1 : stop : gw] = array("I", [r.rid]) * nseg
                io.put_span(j, r.sa, r.target, off0, n, g)
                r.gen = -1  # nothing joins a coalesced entry
                r.relayed_packets += nseg
                r.relayed_bytes += n
                return j + 1, nseg, n
        mv = io.mv
        pkts = nbytes = 0
        for off in range(off0, off0 + n, g):
            ln = min(g, off0 + n - off)
            seg = mv[off : off + ln]
            if ln >= MIN_FORWARD and forwardable(_u32.unpack_from(seg, 0)[0], ln):
                s = self.udx.streams.get(_u32.unpack_from(seg, 4)[0])
                r = s.route if s is not None else None
                if r is not None and r.sock is self and from_pinned(r, src0, src1, src2):
                    seg[4:8] = _u32.pack(r.rid)
                    io.put_span(j, r.sa, r.target, off, ln)
                    r.gen = -1
                    r.relayed_packets += 1
                    r.relayed_bytes += ln
                    j += 1
                    pkts += 1
                    nbytes += ln
                    continue
            try:
                self._handle(seg, ln, i)
            except Exception:
                st.callback_errors += 1
                st.drop("error")
                log.exception("udx: error while handling a datagram")
        return j, pkts, nbytes

    def _flush_batch(
        self, io: mmsg.BatchIO, count: int, datagrams: int, nbytes: int, seg_sends: int = -1, seg_datagrams: int = 0
    ) -> None:
        """Send `count` prepared entries carrying `datagrams` forwarded datagrams (`nbytes`),
        `seg_sends` of them segmented with `seg_datagrams` in all (-1: count them here)."""
        st = self.stats
        st.relayed_packets += datagrams
        st.relayed_bytes += nbytes
        if seg_sends < 0:
            seg_sends, seg_datagrams = io.count_segmented(count)
        st.gso_sends += seg_sends
        st.gso_segments += seg_datagrams
        fallbacks = io.gso_fallbacks
        res = io.send(count)
        if res is None:  # all of it went out in one call
            st.sent_packets += datagrams
            st.sent_bytes += nbytes
            return
        self._send_rest(io, count, datagrams, nbytes, res, fallbacks)

    def _send_rest(
        self,
        io: mmsg.BatchIO,
        count: int,
        datagrams: int,
        nbytes: int,
        res: tuple[int, int, list[tuple[int, list[bytes]]]],
        fallbacks: int,
    ) -> None:
        """After a `sendmmsg` that did not take all `count` entries (`res` from `BatchIO.send`):
        count what went, send the rest one by one in order (queued if the socket is full), and
        put the streams involved on the queued path until the queue drains."""
        st = self.stats
        _sent, failed, rest = res
        st.send_errors += failed
        if io.gso_fallbacks != fallbacks:
            st.gso_fallbacks += io.gso_fallbacks - fallbacks
            log.warning("udx: the kernel refused a UDP_SEGMENT send; GSO is off for this socket")
        if not rest:
            st.sent_packets += datagrams - failed
            st.sent_bytes += nbytes
            return
        # the socket buffer is full or segmentation was refused: the rest, in order, one by one
        for _k, datagrams_k in rest:
            datagrams -= len(datagrams_k)
            nbytes -= sum(len(d) for d in datagrams_k)
        st.sent_packets += datagrams - failed
        st.sent_bytes += nbytes
        for k, datagrams_k in rest:
            t = io.targets[k]
            for d in datagrams_k:
                if t is not None and t.send_address is not None:
                    self._sendto(d, t.send_address)
                else:
                    st.send_errors += 1
        if self._sendq:
            for t in set(io.targets[:count]):
                if t is not None:
                    t.drop_route()  # back to the queued path until the queue drains

    def _handle(self, buf: memoryview, n: int, addr: Address | int) -> None:
        """Everything but the relay fast path: firewall, relaying, streams, foreign datagrams.

        `addr` is the source, or its index in the recvmmsg batch (decoded only when needed).
        A relayed stream that knows its peer's address takes packets from that address only:
        anything else for its id (a forged DESTROY too) is dropped as `wrong_address`.
        """
        st = self.stats
        if n >= 20 and buf[0] == 0xFF and buf[1] == 0x01:
            s = self.udx.streams.get(_u32.unpack_from(buf, 4)[0])
            if s is not None and not s.closed:
                if s.socket is not self:
                    if isinstance(addr, int):
                        addr = self._mmsg.address(addr)  # type: ignore[union-attr]
                    if not s.passes_firewall(self, addr):
                        st.drop("firewalled")
                        return
                if s.relayed:
                    if isinstance(addr, int):
                        addr = self._mmsg.address(addr)  # type: ignore[union-attr]
                    s.relay_datagram(buf, addr, self)
                    return
                s.receive_datagram(bytes(buf), self.loop.time(), self)
                return
            if s is not None and s.lingering:
                s.receive_datagram(bytes(buf), self.loop.time(), self)
                return
            # UDX-shaped with the id of no live stream. libudx hands such a datagram to the
            # socket's message callback, where dht-rpc fails to decode it (its messages start
            # 0x03/0x13): count it here instead of passing it on.
            st.drop("unknown_stream")
            return
        cb = self.on_datagram
        if cb is None:
            st.drop("garbage")
            return
        st.foreign_packets += 1
        if isinstance(addr, int):
            addr = self._mmsg.address(addr)  # type: ignore[union-attr]
        cb(bytes(buf), addr)

    def schedule_flush(self, s: UDXStream) -> None:
        """For a stream with something to send (data, an ACK, a close): flush it soon, once."""
        self._dirty.add(s)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush_dirty)

    def _flush_dirty(self) -> None:
        self._flush_scheduled = False
        dirty = self._dirty
        if not dirty:
            return
        self._dirty = set()
        now = self.loop.time()
        for s in dirty:
            s.send_pending(now)


def _now() -> float:
    """The relay's one clock: the running event loop's (timers are scheduled on it too)."""
    return asyncio.get_running_loop().time()


def _v4(addr: Any) -> Address:
    host = addr[0]
    if host.startswith("::ffff:") and "." in host:
        host = host[7:]
    return (host, addr[1])


class UDXStream:
    """A UDX stream endpoint (or a raw relay stream) driven by its `StreamCore`.

    Use `write`/`drain`/`end`/`read` like an asyncio stream, or set `on_data`, `on_end`,
    `on_message`, `on_close` callbacks (data then bypasses the read queue).
    """

    # slots and a read queue made on first use: a relay holds two of these per active pair
    # (16,384 at the default cap), so their size is the relay's memory under a pairing flood
    __slots__ = (
        "_closed_fut",
        "_core",
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
        "_sa_len",
        "_send_addr",
        "_socket",
        "_src_key",
        "_timer",
        "_timer_at",
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
            self._core = StreamCore(id, seq=seq)
        else:
            self._core = StreamCore(id, seq=seq, max_reorder_bytes=max_reorder_bytes)
        self._firewall = firewall
        self.framed = framed
        self._socket: UDXSocket | None = None
        self._remote_addr: Address | None = None
        self._send_addr: Address | None = None  # as the socket wants it (v4-mapped on IPv6)
        self._remote_id_le = b"\0\0\0\0"
        self._relay: UDXStream | None = None
        self._relayed_from: list[UDXStream] = []
        #: (datagram, the socket it arrived on, the partner that received it) held for this stream
        self._early: list[tuple[bytes, UDXSocket, UDXStream]] = []
        self._sa = bytearray()
        self._sa_addr = 0
        self._sa_len = 0
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
        self._frame_buf = bytearray()
        self._read_waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._closed_fut: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
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
    def core(self) -> StreamCore:
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
        early, self._early = self._early, []
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
        for p in self._relayed_from:
            p.route = None

    def leave_kernel(self, *, closing: bool = False) -> None:
        """Both directions through this stream out of kernel forwarding: its peer's address or
        id changes, or it closes (then what the kernel path remembers of it goes too)."""
        for p in (self, *self._relayed_from):
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
        self._sa_len = len(self._sa)
        self._src_key = source_key(self._sa)

    def relay_to(self, destination: UDXStream) -> None:
        """Forward every packet this stream receives to `destination`'s peer, id rewritten."""
        if self._relay is not None:
            raise UDXError("stream is already relayed", "EINVAL")
        if destination.closed or self.closed:
            raise UDXError("cannot relay to or from a closed stream", "EINVAL")
        self._relay = destination
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
        self._core.set_keepalive(seconds, _now())
        if self._socket is not None:
            self._socket.schedule_flush(self)

    def destroy(self, error: UDXError | None = None) -> None:
        """Abortive close: one DESTROY to the peer (nothing for relayed or unconnected streams)."""
        if self.closed:
            return
        self._core.destroy(error, send=self._relay is None)
        self.send_pending(_now())

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

    def receive_datagram(self, datagram: bytes, now: float, arrival: UDXSocket) -> None:
        """A datagram for this stream (not relayed): into the core; what it refuses is counted
        on `arrival` by cause (a lingering stream only re-ACKs)."""
        core = self._core
        if core.receive(datagram, now) or self.closed:
            self._after_input()
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
        if len(self._early) < EARLY_PACKETS and self.udx.early_bytes + len(buf) <= EARLY_BYTES_TOTAL:
            self._early.append((bytes(buf), arrival, source))
            self.udx.early_bytes += len(buf)
        else:
            st.drop("relay_unconnected")
        return False

    def route_from(self, src_key: tuple[int, int, int], sock: UDXSocket) -> Route:
        """The fast path's route to this stream's peer for datagrams from the source `src_key`."""
        return Route(self._core.remote_id, self._sa_addr, self._sa, self, sock, src_key)

    def unregister_now(self) -> None:
        """At UDX.close: a lingering stream stops lingering and leaves the id table now."""
        if self._timer is not None:
            self._timer.cancel()
            self._unregister()

    def forget_partner(self, partner: UDXStream) -> None:
        """`partner` no longer relays to this stream (it closed)."""
        if partner in self._relayed_from:
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

    # --- runtime internals -------------------------------------------------------------------

    def _after_input(self) -> None:
        if self._core.events:
            self._dispatch()
        sock = self._socket
        if sock is not None:
            sock.note_input(self)
        elif self.closed:
            self._finish_close()

    def send_pending(self, now: float) -> None:
        """Send what the core has for the wire now, dispatch its events, re-arm its timer."""
        core = self._core
        out = core.datagrams_to_send(now)
        if out and self._socket is not None and self._send_addr is not None:
            self._socket.send_datagrams(out, self._send_addr)
        if core.events:
            self._dispatch()
        if self.closed:
            self._finish_close()
            return
        w = self._drain_waiter
        if w is not None and not w.done() and core.write_buffered < core.high_watermark:
            w.set_result(None)
        deadline = core.get_timer()
        if deadline is not None and (self._timer is None or deadline < self._timer_at):
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = asyncio.get_running_loop().call_later(max(0.0, deadline - now), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = _now()
        self._core.handle_timer(now)
        self.send_pending(now)

    def _dispatch(self) -> None:
        core = self._core
        ev = core.next_event()
        while ev is not None:
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
            ev = core.next_event()

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
        self._dispatch()
        self._finish_close()

    def _finish_close(self) -> None:
        if self._finished:
            return
        self._finished = True
        self.drop_route()
        self.leave_kernel(closing=True)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        core = self._core
        if core.lingering:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(LINGER, self._unregister)
        else:
            self._unregister()
        self._wake_reader()
        w = self._drain_waiter
        if w is not None and not w.done():
            w.set_result(None)
        if self._closed_fut is not None and not self._closed_fut.done():
            self._closed_fut.set_result(None)
        for d, held_by, _source in self._early:
            self.udx.early_bytes -= len(d)
            held_by.stats.drop("relay_unconnected")
        self._early = []
        partners = self._relayed_from
        self._relayed_from = []
        for p in partners:
            p.destroy()
        if self._relay is not None:
            t = self._relay
            self._relay = None
            t.forget_partner(self)
            t.destroy()
        cb = self.on_close
        if cb is not None:
            self.on_close = None
            self._call(cb, self.error)

    def _unregister(self) -> None:
        self._timer = None
        self._core.end_linger()
        if self.udx.streams.get(self.id) is self:
            del self.udx.streams[self.id]
