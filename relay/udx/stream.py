"""The UDX stream as a sans-IO state machine.

`UDXCore` never touches a socket or a clock and speaks `relay.core`'s vocabulary: the
runtime (`relay.udx.udxstream.UDXStream`, a `relay.core.Driver`) feeds it datagrams with
`receive(datagram, now)` (seconds, the loop's clock), collects `datagrams_to_send(now)`, arms one
timer for `get_timer()` and calls `handle_timer(now)`, and takes events with `next_event()`. A
stream closed gracefully lingers `LINGER` seconds to re-ACK a retransmitted END; the end of that
is a deadline too (`LingerEnded`). Behaviour follows libudx as described in
`docs/wire/udx.md`: per-packet sequence numbers, an ACK for every DATA/END burst with
SACK blocks while out-of-order data is buffered, RACK loss detection from the peer's SACKs,
a tail-loss probe, an RTO of at least 1 s, END as a sequenced half-close, DESTROY as an
unsequenced reset. Congestion control (`relay.udx.congestion`, packet-counting NewReno —
libudx runs BBR, but the peer does not care which algorithm the other end runs) and the
loss-recovery timing (`relay.udx.recovery`: RTT estimator, RACK reordering window, TLP
timeout) live in modules of their own; this one owns the packets and the sequence space.

Sequence numbers are kept internally as unbounded ints (unwrapped against the current
cumulative position) so the rest of the code can compare with `<`; only the wire is mod 2³².
"""

from __future__ import annotations

import heapq
import struct
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .congestion import OPEN, NewReno
from .packet import (
    DATA,
    DEFAULT_RWND,
    DESTROY,
    END,
    HEADER_SIZE,
    HEARTBEAT,
    MAGIC,
    MAX_SACKS,
    MESSAGE,
    SACK,
    U32,
    VERSION,
    UDXError,
    max_payload,
)
from .recovery import RttEstimator
from .recovery import probe_timeout as _probe_timeout
from .recovery import reo_wnd as _reo_wnd

_HEADER = struct.Struct("<BBBBIIII")
_BLOCK = struct.Struct("<II")
_u32 = struct.Struct("<I")

MAX_RTO_TIMEOUTS = 6
#: Out-of-order packets buffered above the cumulative ack; Node's window (4 MiB / 1152) fits.
MAX_REORDER = 4096
#: Out-of-order bytes buffered per stream by default: our advertised window, which a peer
#: that follows the protocol never exceeds. Each packet is charged its payload plus
#: REORDER_OVERHEAD (what holding it costs in Python), so tiny packets cannot park more.
MAX_REORDER_BYTES = DEFAULT_RWND
REORDER_OVERHEAD = 128
HIGH_WATERMARK = 262144
#: Seconds a gracefully closed stream keeps re-ACKing a retransmitted END (Node has no TIME_WAIT).
LINGER = 3.0


# --- events -----------------------------------------------------------------------------


@dataclass(slots=True)
class DataReceived:
    data: bytes


@dataclass(slots=True)
class EndReceived:
    """The peer's END was delivered in order: no more stream data will come."""


@dataclass(slots=True)
class MessageReceived:
    data: bytes


@dataclass(slots=True)
class StreamClosed:
    """The stream is finished; `error` is None for a graceful close (both ENDs acknowledged)."""

    error: UDXError | None = None


@dataclass(slots=True)
class LingerEnded:
    """A gracefully closed stream stopped lingering: its id can go."""


Event = DataReceived | EndReceived | MessageReceived | StreamClosed | LingerEnded


@dataclass(slots=True)
class StreamStats:
    """Counters the tests and the metrics endpoint read; names follow udx-native's getters."""

    packets_tx: int = 0
    bytes_tx: int = 0
    packets_rx: int = 0
    bytes_rx: int = 0
    retransmits: int = 0
    rack_losses: int = 0
    tlp_probes: int = 0
    rto_count: int = 0
    rto_losses: int = 0
    fast_recoveries: int = 0
    duplicates: int = 0
    dropped: int = 0
    sacks_rx: int = 0
    sacks_tx: int = 0
    acks_tx: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class _Sent:
    """One DATA/END packet kept until it is acknowledged."""

    __slots__ = ("lost", "payload", "retransmitted", "rto_timeouts", "seq", "time_sent", "type")

    def __init__(self, seq: int, type_: int, payload: bytes, now: float) -> None:
        self.seq = seq
        self.type = type_
        self.payload = payload
        self.time_sent = now
        self.retransmitted = False
        self.lost = False
        self.rto_timeouts = 0


class UDXCore:
    """One UDX stream endpoint. See the module docstring for the contract."""

    __slots__ = (
        "_ack_before_connect",
        "_ack_needed",
        "_adv_rwnd",
        "_end_seq",
        "_ending",
        "_keepalive_at",
        "_linger_at",
        "_lost",
        "_ooo",
        "_outstanding",
        "_rack_end",
        "_rack_rtt",
        "_rack_xmit",
        "_remote_end",
        "_reorder_at",
        "_reordering_seen",
        "_rto_at",
        "_run_ends",
        "_run_starts",
        "_sacked_hi",
        "_sendbuf",
        "_sendoff",
        "_tlp_at",
        "_tlp_outstanding",
        "_tlp_permitted",
        "_unacked_bytes",
        "_wl1",
        "_wl2",
        "_zwp_at",
        "ack",
        "cc",
        "closed",
        "connected",
        "drop_reason",
        "ended",
        "ended_remote",
        "events",
        "id",
        "inflight",
        "keepalive",
        "lingering",
        "max_payload",
        "max_reorder_bytes",
        "out",
        "remote_acked",
        "remote_id",
        "reorder_bytes",
        "rtt",
        "rwnd_max",
        "send_rwnd",
        "seq",
        "stats",
        "unread",
    )

    def __init__(
        self, local_id: int, *, seq: int = 0, rwnd_max: int = DEFAULT_RWND, max_reorder_bytes: int = MAX_REORDER_BYTES
    ) -> None:
        self.id = local_id & U32
        self.remote_id = 0
        self.connected = False
        self.closed = False
        self.lingering = False
        self._linger_at: float | None = None
        self.max_payload = max_payload()
        self.stats = StreamStats()
        self.events: list[Event] = []  # pending, oldest first; taken with next_event
        self.out: list[bytes] = []

        # sender
        self.seq = seq
        self.remote_acked = seq
        self._outstanding: dict[int, _Sent] = {}
        self.inflight = 0
        self._unacked_bytes = 0
        self._sendbuf = bytearray()
        self._sendoff = 0
        self._ending = False
        self._end_seq: int | None = None
        self.ended = False
        self._lost: list[int] = []
        self._sacked_hi = seq
        self.cc = NewReno(seq)
        self.send_rwnd = DEFAULT_RWND
        self._wl1 = 0
        self._wl2 = 0

        # rtt / rack
        self.rtt = RttEstimator()
        self._rack_xmit = -1.0
        self._rack_end = seq - 1
        self._rack_rtt = 0.0
        self._reordering_seen = False

        # timers (absolute deadlines or None)
        self._rto_at: float | None = None
        self._tlp_at: float | None = None
        self._reorder_at: float | None = None
        self._zwp_at: float | None = None
        self._keepalive_at: float | None = None
        self.keepalive: float = 0.0
        self._tlp_outstanding = False
        self._tlp_permitted = False

        # receiver
        self.ack = 0
        self._ooo: dict[int, tuple[int, bytes]] = {}
        #: bytes held out of order (payload + REORDER_OVERHEAD each), bounded by max_reorder_bytes
        self.reorder_bytes = 0
        self.max_reorder_bytes = max_reorder_bytes
        #: why `receive` last returned False: "invalid" or "reorder_limit" (a socket drop cause)
        self.drop_reason = "invalid"
        self._run_starts: list[int] = []
        self._run_ends: list[int] = []
        self._remote_end: int | None = None
        self.ended_remote = False
        self._ack_needed = False
        self.rwnd_max = rwnd_max
        self.unread = 0
        self._adv_rwnd = rwnd_max
        self._ack_before_connect = False

    # --- congestion control and RTT (their own modules; read here for callers) -----------

    @property
    def cwnd(self) -> float:
        return self.cc.cwnd

    @property
    def ssthresh(self) -> float:
        return self.cc.ssthresh

    @property
    def ca_state(self) -> int:
        return self.cc.state

    @property
    def srtt(self) -> float:
        return self.rtt.srtt

    @property
    def rttvar(self) -> float:
        return self.rtt.rttvar

    @property
    def min_rtt(self) -> float:
        return self.rtt.min_rtt

    @property
    def rto(self) -> float:
        return self.rtt.rto

    # --- commands -------------------------------------------------------------------------

    def connect(self, remote_id: int, *, ipv6: bool = False, ack: int | None = None) -> None:
        if self.closed:
            raise UDXError("stream is closed", "ECLOSED")
        if self.connected:
            raise UDXError("stream is already connected", "EALREADY")
        self.remote_id = remote_id & U32
        self.connected = True
        self.max_payload = max_payload(ipv6=ipv6)
        if ack is not None:
            self.ack = ack
        if self._ack_before_connect:
            self._ack_needed = True

    def change_remote(self, remote_id: int, *, ipv6: bool = False) -> None:
        self.remote_id = remote_id & U32
        self.max_payload = max_payload(ipv6=ipv6)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._ending or self.closed:
            raise UDXError("write after end or close", "EPIPE")
        self._sendbuf += data

    def end(self, data: bytes = b"") -> None:
        if self._ending or self.closed:
            return
        if data:
            self._sendbuf += data
        self._ending = True

    def send_message(self, data: bytes) -> None:
        """An unordered, unreliable datagram on this stream (udx-native `send`)."""
        if not self.connected or self.closed:
            raise UDXError("stream is not connected", "ENOTCONN")
        self._emit(MESSAGE, self.seq, bytes(data))

    def set_keepalive(self, interval: float, now: float) -> None:
        self.keepalive = interval
        self._keepalive_at = now + interval if interval > 0 and self.inflight == 0 else None

    def destroy(self, error: UDXError | None = None, *, send: bool = True) -> None:
        """Abortive close; sends one DESTROY when connected (relayed streams pass send=False)."""
        if self.closed:
            return
        if send and self.connected:
            self._emit(DESTROY, self.seq, b"")
        self._close(error, linger=False)

    def next_event(self) -> Event | None:
        """The oldest event not yet taken, None when there is none (`relay.core`'s contract;
        `events` holds the pending ones, rarely more than two)."""
        events = self.events
        return events.pop(0) if events else None

    @property
    def wants_ack(self) -> bool:
        """An ACK (or window update) is due: the runtime should collect `datagrams_to_send` soon."""
        return self._ack_needed

    def hold_unread(self, nbytes: int) -> None:
        """Bytes handed on whole (a framed stream's frame) count as unread until `consumed`."""
        self.unread += nbytes

    def end_linger(self) -> None:
        """The closed stream stops re-ACKing a retransmitted END (its linger time is over)."""
        self.lingering = False
        self._linger_at = None

    def consumed(self, nbytes: int) -> None:
        """The application took `nbytes` of delivered data; may reopen the receive window."""
        self.unread = max(0, self.unread - nbytes)
        if self._adv_rwnd < 4 * self.max_payload and self.rwnd_max - self.unread >= 4 * self.max_payload:
            self._ack_needed = True

    # --- inspection -----------------------------------------------------------------------

    @property
    def write_buffered(self) -> int:
        """Bytes written but not yet acknowledged (unsent included)."""
        return len(self._sendbuf) - self._sendoff + self._unacked_bytes

    @property
    def all_acked(self) -> bool:
        """Everything written, and the END if one was queued, is acknowledged."""
        return self.write_buffered == 0 and (not self._ending or self.ended)

    @property
    def high_watermark(self) -> int:
        return HIGH_WATERMARK + int(self.cc.cwnd) * self.max_payload

    @property
    def has_pending(self) -> bool:
        return self._ack_needed or (self.connected and not self.closed and self._can_send_more())

    def get_timer(self) -> float | None:
        """The loop time of the core's next deadline (RTO, tail-loss probe, reorder, zero-window
        probe, keepalive; closed: the end of its linger), None if none: the runtime arms one
        timer for it."""
        if self.closed:
            return self._linger_at
        best: float | None = None
        for t in (self._rto_at, self._tlp_at, self._reorder_at, self._zwp_at, self._keepalive_at):
            if t is not None and (best is None or t < best):
                best = t
        return best

    # --- input ----------------------------------------------------------------------------

    def receive(self, data: bytes | bytearray | memoryview, now: float) -> bool:
        """Process one datagram already demultiplexed to this stream; False if it was dropped."""
        n = len(data)
        stats = self.stats
        if n < HEADER_SIZE:
            self.drop_reason = "invalid"
            stats.dropped += 1
            return False
        magic, version, type_, off, _id, rwnd, wseq, wack = _HEADER.unpack_from(data, 0)
        if magic != MAGIC or version != VERSION or off > n - HEADER_SIZE:
            self.drop_reason = "invalid"
            stats.dropped += 1
            return False
        if self.closed:
            if self.lingering and type_ & (DATA | END):
                self._ack_needed = True  # re-ACK a retransmitted END the peer still waits for
                return True
            self.drop_reason = "invalid"
            stats.dropped += 1
            return False
        stats.packets_rx += 1
        stats.bytes_rx += n
        if type_ & HEARTBEAT:
            self._ack_needed = True
            return True

        # The ack field first: a packet acknowledging what we never sent is not from our peer.
        acked = self.remote_acked + (((wack - self.remote_acked) & U32 ^ 0x80000000) - 0x80000000)
        if acked > self.seq:
            self.drop_reason = "invalid"
            stats.dropped += 1
            return False

        seq = self.ack + (((wseq - self.ack) & U32 ^ 0x80000000) - 0x80000000)
        if type_ & (DATA | END | DESTROY) and seq >= self.ack:
            if type_ & DESTROY:
                self._close(UDXError("stream was reset by the peer", "ECONNRESET"), linger=False)
                return True
            if seq - self.ack >= MAX_REORDER:
                self.drop_reason = "invalid"
                stats.dropped += 1
                return False
            payload = bytes(data[HEADER_SIZE + off :])
            if type_ & END:
                self._remote_end = seq
            if seq == self.ack:
                self._deliver(type_, payload, seq)
                self.ack = seq + 1
                if self._run_starts and self._run_starts[0] == self.ack:
                    self._drain_reorder()
                if self.ended_remote is False and self._remote_end is not None and self.ack > self._remote_end:
                    self.ended_remote = True
                    self.events.append(EndReceived())
            elif seq in self._ooo:
                stats.duplicates += 1
            else:
                cost = len(payload) + REORDER_OVERHEAD
                if self.reorder_bytes + cost > self.max_reorder_bytes:
                    stats.dropped += 1
                    stats.extra["reorder_limit"] = stats.extra.get("reorder_limit", 0) + 1
                    self.drop_reason = "reorder_limit"
                    return False
                self.reorder_bytes += cost
                self._ooo[seq] = (type_, payload)
                self._add_run(seq)
        elif type_ & (DATA | END):
            stats.duplicates += 1

        if type_ & MESSAGE:
            self.events.append(MessageReceived(bytes(data[HEADER_SIZE + off :])))

        if not self.connected:
            if type_ & (DATA | END):
                self._ack_before_connect = True
            return True

        self._process_ack(type_, rwnd, wseq, acked, data, off, now)
        if self.closed:
            return True
        if type_ & (DATA | END):
            self._ack_needed = True
        return True

    def _deliver(self, type_: int, payload: bytes, seq: int) -> None:
        if payload and type_ & DATA:
            self.unread += len(payload)
            self.events.append(DataReceived(payload))

    def _drain_reorder(self) -> None:
        start, end = self._run_starts.pop(0), self._run_ends.pop(0)
        ooo = self._ooo
        freed = 0
        for s in range(start, end):
            type_, payload = ooo.pop(s)
            freed += len(payload) + REORDER_OVERHEAD
            self._deliver(type_, payload, s)
        self.reorder_bytes -= freed
        self.ack = end

    def _add_run(self, s: int) -> None:
        starts, ends = self._run_starts, self._run_ends
        i = bisect_right(starts, s) - 1
        if i >= 0 and ends[i] == s:
            ends[i] = s + 1
            if i + 1 < len(starts) and starts[i + 1] == s + 1:
                ends[i] = ends[i + 1]
                del starts[i + 1], ends[i + 1]
        elif i + 1 < len(starts) and starts[i + 1] == s + 1:
            starts[i + 1] = s
        else:
            starts.insert(i + 1, s)
            ends.insert(i + 1, s + 1)

    def _process_ack(
        self, type_: int, rwnd: int, wseq: int, acked: int, data: bytes | bytearray | memoryview, off: int, now: float
    ) -> None:
        # Window update, RFC 793 style, so a stale packet cannot shrink the window.
        if acked >= self.remote_acked:
            d = (wseq - self._wl1) & U32
            if (0 < d < 0x80000000) or (d == 0 and ((acked & U32) - self._wl2) & U32 < 0x80000000):
                self.send_rwnd = rwnd
                self._wl1 = wseq
                self._wl2 = acked & U32
                if rwnd > 0:
                    self._zwp_at = None

        newly = 0
        outstanding = self._outstanding
        if acked > self.remote_acked:
            for s in range(self.remote_acked, acked):
                p = outstanding.pop(s, None)
                if p is not None:
                    newly += 1
                    self._on_acked(p, now)
            self.remote_acked = acked
            if self._sacked_hi < acked:
                self._sacked_hi = acked
            self._tlp_outstanding = False
            self._rto_at = now + self.rtt.rto if outstanding else None
            if outstanding and self.cc.state == OPEN and self._sacked_hi <= acked:
                self._arm_tlp(now)
            else:
                self._tlp_at = None
            self.cc.on_cumulative_ack(acked)
            if not self.ended and self._end_seq is not None and acked > self._end_seq:
                self.ended = True
                if self.ended_remote:
                    self._close(None, linger=True, now=now)
                else:
                    self._ack_needed = True  # libudx's "final state" ACK
                return

        if type_ & SACK:
            n = len(data) - HEADER_SIZE
            sack_len = off if 0 < off < n else n
            count = min(sack_len >> 3, MAX_SACKS * 4)
            if count:
                self.stats.sacks_rx += 1
                newly += self._process_sacks(data, count, now)

        if outstanding and self._rack_end >= self.remote_acked and self._sacked_hi > self.remote_acked:
            self._rack_detect_loss(now)

        if newly:
            self.cc.on_acked(newly, self.inflight)

    def _process_sacks(self, data: bytes | bytearray | memoryview, count: int, now: float) -> int:
        newly = 0
        outstanding = self._outstanding
        base = self.remote_acked
        hi = self._sacked_hi
        for i in range(count):
            ws, we = _BLOCK.unpack_from(data, HEADER_SIZE + 8 * i)
            start = base + (((ws - base) & U32 ^ 0x80000000) - 0x80000000)
            end = base + (((we - base) & U32 ^ 0x80000000) - 0x80000000)
            if not (start < end <= self.seq and start >= base):
                self.stats.extra["dropped_sacks"] = self.stats.extra.get("dropped_sacks", 0) + 1
                continue
            if start < hi:  # below what was SACKed before only the holes are still outstanding
                holes = []
                for q in outstanding:
                    if q >= hi or q >= end:
                        break
                    if q >= start:
                        holes.append(q)
                for q in holes:
                    newly += 1
                    self._on_acked(outstanding.pop(q), now)
            for s in range(max(start, hi), end):
                p = outstanding.pop(s, None)
                if p is not None:
                    newly += 1
                    self._on_acked(p, now)
            if end > hi:
                hi = end
        self._sacked_hi = hi
        return newly

    def _on_acked(self, p: _Sent, now: float) -> None:
        if not p.lost:
            self.inflight -= 1
        self._unacked_bytes -= len(p.payload)
        rtt = now - p.time_sent
        if p.retransmitted:
            if rtt < self.rtt.min_rtt:
                return  # ambiguous: probably the ACK of the original transmission
        else:
            self._rtt_sample(rtt)
        if p.seq < self._rack_end and not p.retransmitted:
            self._reordering_seen = True
        if p.time_sent > self._rack_xmit or (p.time_sent == self._rack_xmit and p.seq > self._rack_end):
            self._rack_xmit = p.time_sent
            self._rack_end = p.seq
            self._rack_rtt = rtt

    def _rtt_sample(self, rtt: float) -> None:
        if self.rtt.sample(rtt):
            self._tlp_permitted = True

    def _reo_wnd(self) -> float:
        return _reo_wnd(self.rtt, self._reordering_seen, self.cc.state != OPEN)

    def _rack_detect_loss(self, now: float) -> None:
        """RFC 8985 §6.2: a packet sent before one that was delivered is lost after rtt + reo_wnd."""
        limit = self._rack_xmit
        wait = self._rack_rtt + self._reo_wnd()
        hi = self._sacked_hi
        timeout: float | None = None
        lost_any = False
        for s, p in self._outstanding.items():
            if s >= hi:
                break
            if p.lost:
                continue
            if p.time_sent < limit or (p.time_sent == limit and s < self._rack_end):
                remaining = p.time_sent + wait - now
                if remaining <= 0:
                    self._mark_lost(p)
                    self.stats.rack_losses += 1
                    lost_any = True
                elif timeout is None or remaining < timeout:
                    timeout = remaining
        self._reorder_at = now + timeout if timeout is not None else None
        if lost_any and self.cc.on_loss_episode(self.seq):
            self.stats.fast_recoveries += 1
            self._tlp_at = None

    def _mark_lost(self, p: _Sent) -> None:
        p.lost = True
        self.inflight -= 1
        heapq.heappush(self._lost, p.seq)

    # --- timers ---------------------------------------------------------------------------

    def handle_timer(self, now: float) -> None:
        if self.closed:
            if self._linger_at is not None and now >= self._linger_at:
                self.end_linger()
                self.events.append(LingerEnded())
            return
        if self._reorder_at is not None and now >= self._reorder_at:
            self._reorder_at = None
            if self._outstanding:
                self._rack_detect_loss(now)
        if self._tlp_at is not None and now >= self._tlp_at:
            self._tlp_at = None
            self._on_tlp(now)
        if self._rto_at is not None and now >= self._rto_at:
            self._on_rto(now)
        if self._zwp_at is not None and now >= self._zwp_at:
            if self.send_rwnd == 0 and self._can_send_more():
                self._emit(HEARTBEAT, self.seq, b"")
                self._zwp_at = now + 2 * self.rtt.rto
            else:
                self._zwp_at = None
        if self._keepalive_at is not None and now >= self._keepalive_at:
            if self.connected and self.inflight == 0 and self.keepalive > 0:
                self._emit(HEARTBEAT, self.seq, b"")
                self._keepalive_at = now + self.keepalive
            else:
                self._keepalive_at = None

    def _on_tlp(self, now: float) -> None:
        if self._tlp_outstanding or not self._tlp_permitted or not self._outstanding:
            return
        self._tlp_outstanding = True
        self._tlp_permitted = False
        self.stats.tlp_probes += 1
        if self._has_new_data() and self.send_rwnd > 0:
            self._send_new(now, probe=True)
            return
        p = self._outstanding[next(reversed(self._outstanding))]
        if p.lost:
            return
        self._retransmit(p, now)  # still counted in flight: the probe duplicates it

    def _on_rto(self, now: float) -> None:
        if not self._outstanding:
            self._rto_at = None
            return
        self.stats.rto_count += 1
        self._rto_at = now + 2 * self.rtt.rto
        self._tlp_at = None
        self._reorder_at = None
        self.cc.on_rto(self.inflight, self.seq)
        for p in self._outstanding.values():
            if p.rto_timeouts >= MAX_RTO_TIMEOUTS:
                self._close(UDXError("stream timed out: no acknowledgement after 6 retransmissions", "ETIMEDOUT"))
                return
            p.rto_timeouts += 1
            if not p.lost:
                self._mark_lost(p)
                self.stats.rto_losses += 1

    # --- output ---------------------------------------------------------------------------

    def _has_new_data(self) -> bool:
        return len(self._sendbuf) > self._sendoff or (self._ending and self._end_seq is None)

    def _can_send_more(self) -> bool:
        return bool(self._lost) or self._has_new_data()

    def _rwnd(self) -> int:
        w = self.rwnd_max - self.unread
        return w if w > 0 else 0

    def _emit(self, type_: int, seq: int, payload: bytes) -> None:
        rwnd = self._rwnd()
        self._adv_rwnd = rwnd
        pkt = _HEADER.pack(MAGIC, VERSION, type_, 0, self.remote_id, rwnd, seq & U32, self.ack & U32)
        if payload:
            pkt += payload
        self.out.append(pkt)
        self.stats.packets_tx += 1
        self.stats.bytes_tx += len(pkt)

    def _retransmit(self, p: _Sent, now: float) -> None:
        p.time_sent = now
        p.retransmitted = True
        self.stats.retransmits += 1
        self._emit(p.type, p.seq, p.payload)

    def _send_new(self, now: float, probe: bool = False) -> None:
        buf = self._sendbuf
        off = self._sendoff
        take = min(len(buf) - off, self.max_payload)
        payload = bytes(buf[off : off + take])
        off += take
        if off >= 1 << 20 or off == len(buf):
            del buf[:off]
            off = 0
        self._sendoff = off
        type_ = DATA if take else 0
        if self._ending and len(buf) == off:
            type_ |= END
            self._end_seq = self.seq
        p = _Sent(self.seq, type_, payload, now)
        self._outstanding[self.seq] = p
        self._unacked_bytes += take
        self.inflight += 1
        self.seq += 1
        self._emit(type_, p.seq, payload)
        if self._rto_at is None:
            self._rto_at = now + self.rtt.rto
        self._keepalive_at = None
        if not probe and self.cc.state == OPEN and self._sacked_hi <= self.remote_acked:
            self._arm_tlp(now)

    def _arm_tlp(self, now: float) -> None:
        """RFC 8985 §7.2: probe after 2·srtt (+ ack delay when one packet is out), not after the RTO."""
        at = now + _probe_timeout(self.rtt, self.inflight)
        self._tlp_at = at if self._rto_at is None or at < self._rto_at else self._rto_at

    def datagrams_to_send(self, now: float) -> list[bytes]:
        """Datagrams to send now (retransmissions first, then new data, then a bare ACK)."""
        if self.connected and not self.closed:
            cwnd = self.cc.cwnd
            lost = self._lost
            while lost and self.inflight < cwnd:
                s = heapq.heappop(lost)
                p = self._outstanding.get(s)
                if p is None or not p.lost:
                    continue
                p.lost = False
                self.inflight += 1
                self._retransmit(p, now)
            if not lost and self._has_new_data():
                rwnd = self.send_rwnd
                window = min(cwnd, max(1, rwnd // self.max_payload)) if rwnd else 0
                sent = False
                while self.inflight < window and self._has_new_data():
                    self._send_new(now)
                    sent = True
                if sent and self._ack_needed and not self._run_starts:
                    self._ack_needed = False  # the ack field of the DATA we just sent says it all
                if rwnd == 0 and self.inflight == 0 and self._zwp_at is None:
                    self._emit(HEARTBEAT, self.seq, b"")
                    self._zwp_at = now + self.rtt.rto
        if self._ack_needed and self.connected:
            self._ack_needed = False
            self._send_ack()
            if not self.closed and self.ended and self.ended_remote:
                self._close(None, linger=True, now=now)
        if self.ended_remote and self.ended and not self.closed:
            self._close(None, linger=True, now=now)
        if self.keepalive > 0 and self.inflight == 0 and self._keepalive_at is None and not self.closed:
            self._keepalive_at = now + self.keepalive
        out = self.out
        self.out = []
        return out

    def _send_ack(self) -> None:
        starts = self._run_starts
        stats = self.stats
        stats.acks_tx += 1
        if not starts:
            self._emit(0, self.seq, b"")
            return
        stats.sacks_tx += 1
        ends = self._run_ends
        k = min(len(starts), MAX_SACKS)
        blocks = b"".join([_BLOCK.pack(starts[i] & U32, ends[i] & U32) for i in range(k)])
        self._emit(SACK, self.seq, blocks)

    def _close(self, error: UDXError | None, *, linger: bool = False, now: float = 0.0) -> None:
        if self.closed:
            return
        self.closed = True
        self.lingering = linger and error is None
        if self.lingering:
            self._linger_at = now + LINGER
        self._rto_at = self._tlp_at = self._reorder_at = self._zwp_at = self._keepalive_at = None
        self._outstanding.clear()
        self._lost.clear()
        self._ooo.clear()
        self.reorder_bytes = 0
        self._run_starts.clear()
        self._run_ends.clear()
        self._sendbuf = bytearray()
        self._sendoff = 0
        self._unacked_bytes = 0
        self.inflight = 0
        self.events.append(StreamClosed(error))


if TYPE_CHECKING:
    from relay.core import DatagramCore, DrivenCore

    # mypy checks the core against relay.core's contract here (never run: the guard sees no asyncio)
    def _conforms(core: UDXCore) -> tuple[DatagramCore[Event], DrivenCore[Event]]:
        return core, core
