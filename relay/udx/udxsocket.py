"""The UDX runtime's sockets: `UDX` (one stream-id table) and `UDXSocket` (one UDP socket).

A `UDXSocket` is read with `loop.add_reader` and drained in batches instead of one
`datagram_received` call per packet: one event-loop wake serves a burst. On Linux that is the
batched reader and writer of `relay.udx.fastpath` (`recvmmsg`, a plan per read from
`relay.udx.forwarding`, `sendmmsg` through `mmsg.SendBatch`); elsewhere (or with
`UDX_NO_MMSG=1`) `_on_readable` reads one datagram at a time into a reused buffer. What no route
takes comes to `slow_path`: the firewall hook, relaying a stream's first packets, DESTROY, the
relay's own streams (`relay.udx.udxstream`), and every non-UDX datagram to `on_datagram`
(dht-rpc). Streams with output after a read are flushed once the read is done (ACKs for a whole
batch at once). Time is the event loop's clock, the one every stream's driver uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket as _socket
import struct
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from . import mmsg
from .fastpath import FastPath
from .forwarding import Route, cut_runs
from .kernel import KernelForwarder
from .moderation import hold_from_env
from .nft import Nft
from .packet import DESTROY, U32, UDXError
from .stats import SocketStats
from .udxstream import Address, Firewall, UDXStream

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


DatagramHandler = Callable[[bytes, Address], None]

BUFFER_SIZE = 2048  # libudx truncates longer datagrams to this, so do we
RECV_BATCH = 128
RECV_BATCH_MMSG = 64
SEND_QUEUE_MAX = 4096
_u32 = struct.Struct("<I")
_IP_MTU_DISCOVER = getattr(_socket, "IP_MTU_DISCOVER", 10)
_IP_PMTUDISC_PROBE = getattr(_socket, "IP_PMTUDISC_PROBE", 3)


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
        #: streams that took input during a read, in arrival order: flushed after it
        self._dirty: dict[UDXStream, None] = {}
        self._flush_scheduled = False
        self.closed = False
        self._mmsg: mmsg.BatchIO | None = None
        #: the batched reader and the one writer of forwarded datagrams (Linux)
        self.fast: FastPath | None = None
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
            hold = hold_from_env() if coalesce_us is None else max(0, coalesce_us) / 1e6
            self.fast = FastPath(self, self._mmsg, hold)
            self.loop.add_reader(sock.fileno(), self.fast.on_readable)
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
        self._dirty[s] = None

    @property
    def dirty(self) -> bool:
        """Streams wait for their output to be sent (`flush_streams`)."""
        return bool(self._dirty)

    @property
    def _on_readable_mmsg(self) -> Callable[[], None]:
        """The batched reader (what the loop calls when the socket is readable)."""
        assert self.fast is not None
        return self.fast.on_readable

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

    def forget_sent(self) -> None:
        """Drop the send vector's references to the streams it last wrote for (read only while a
        batch is sent): a closed stream left in a slot keeps its whole object graph alive."""
        io = self._mmsg
        if io is not None:
            io.targets[:] = [None] * len(io.targets)

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
        if self.fast is not None:
            self.fast.close()
        if self._sendq:
            self.loop.remove_writer(self._sock.fileno())
            self._sendq.clear()
        self._sock.close()
        with contextlib.suppress(ValueError):
            self.udx.sockets.remove(self)

    # --- sending ---------------------------------------------------------------------------

    def send_queued(self, data: bytes, addr: Address) -> None:
        """A forwarded datagram the batch could not send: after whatever waits, in order."""
        self._sendto(data, addr)

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
                self.flush_streams()  # ACK what the last 32 datagrams delivered
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
                self.slow_path(mv[:n], n, addr)
            except Exception:
                st.callback_errors += 1
                st.drop("error")
                log.exception("udx: error while handling a datagram from %s", addr)
        if self._dirty:
            self.flush_streams()

    def slow_path(self, buf: memoryview, n: int, addr: Address | int) -> None:
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
                s.receive_datagram(bytes(buf), self)
                return
            if s is not None and s.lingering:
                s.receive_datagram(bytes(buf), self)
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
        self._dirty[s] = None
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush_streams)

    def flush_streams(self) -> None:
        """Every stream with output waiting: its driver pumps (sends, re-arms its timer)."""
        self._flush_scheduled = False
        dirty = self._dirty
        if not dirty:
            return
        self._dirty = {}
        for s in dirty:
            s.pump()


def _v4(addr: Any) -> Address:
    host = addr[0]
    if host.startswith("::ffff:") and "." in host:
        host = host[7:]
    return (host, addr[1])
