"""The batched reader of a UDX socket (Linux): read a batch, plan it, send the plan.

One wake of the event loop serves a whole burst: `recvmmsg` fills up to 64 slots
(`mmsg.BatchIO`), `relay.udx.forwarding` plans what each datagram does (its route and id, or
the slow path; how the forwarded ones leave), and `mmsg.SendBatch` writes the plan out with
`sendmmsg`. A datagram's trip only goes down: read → plan → write; the slow path
(`UDXSocket.slow_path`: firewall, relaying a stream's first packets, the relay's own streams,
the DHT) gets a datagram only after everything planned before it was sent, so nothing overtakes
it. Which plan a read gets:

- one datagram (most wakes of chatty pairs): `route_one`, then `SendBatch.first` (one `sendmsg`);
- every datagram on the fast path and the streams spread (many pairs, a few datagrams each):
  `routes_for` and `spread`, then `SendBatch.spread` (one entry per datagram, arrival order);
- every datagram on the fast path in runs: `plan_streams` (stream by stream, segmented sends);
- some datagram for the slow path: `plan_runs` (arrival order, run by run);
- a read holding GRO buffers: `plan_slots` (byte spans, a whole buffer as one segmented send).

With UDX_COALESCE_US set, after a burst that did not fill the batch the reader pauses for a
short hold (`relay.udx.moderation`, a timerfd: `mmsg.HoldTimer`) so the next read gathers more.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from . import mmsg
from .forwarding import plan_runs, plan_slots, plan_streams, route_one, routes_for, spread
from .moderation import Moderation

if TYPE_CHECKING:
    from .udxsocket import UDXSocket

log = logging.getLogger("relay.udx")

#: reads per wake while each one fills the batch (then the loop gets a turn)
RECV_ROUNDS = 4


class FastPath:
    """A batching socket's reader and writer: `on_readable` is its `loop.add_reader` callback."""

    __slots__ = ("_hold_timer", "_moderation", "_reading", "batch", "io", "routes", "sock", "stats")

    def __init__(self, sock: UDXSocket, io: mmsg.BatchIO, hold: float) -> None:
        self.sock = sock
        self.io = io
        self.stats = sock.stats
        #: stream id -> route: the socket's table (kept by `UDXStream.route`)
        self.routes = sock.routes
        self.batch = mmsg.SendBatch(io, sock.stats, sock)
        #: receive coalescing: the decision, its timer, and whether the reader is registered
        #: right now (off during a hold)
        self._moderation: Moderation | None = None
        self._hold_timer: mmsg.HoldTimer | None = None
        self._reading = True
        if hold > 0:
            try:
                self._hold_timer = mmsg.HoldTimer()
            except OSError:
                log.debug("udx: no timerfd; receive coalescing is off")
            else:
                self._moderation = Moderation(hold)
                sock.loop.add_reader(self._hold_timer.fd, self._on_hold_end)

    def close(self) -> None:
        if self._hold_timer is not None:
            self.sock.loop.remove_reader(self._hold_timer.fd)
            self._hold_timer.close()
            self._hold_timer = None
            self._moderation = None

    # --- a wake ---------------------------------------------------------------------------------

    def on_readable(self) -> None:
        """Read, plan, send; up to RECV_ROUNDS reads while each fills the batch."""
        io = self.io
        count = io.recv()
        if count == 1:
            n, head, sid, src0, src12, ctl = io.slot(0)
            r = route_one(self.routes, n, head, sid, src0, src12, ctl)
            if r is not None:
                self.batch.first(r, n, sid)
                if self._moderation is not None and not self.sock.closed:
                    self._moderate(self._moderation, 1, False)
                return
        got = 0
        merged = False
        rounds = RECV_ROUNDS
        sock = self.sock
        while count:
            if count > 0:
                got += count
                if io.gro and io.coalesced(count):
                    merged = True
                    self._read_spans(count)
                else:
                    self._read_slots(count)
                if sock.dirty:
                    sock.flush_streams()  # ACK what this batch delivered before reading more
                if count < io.batch:
                    break
            rounds -= 1
            if not rounds:
                break
            count = io.recv()
        mod = self._moderation
        if mod is not None and not sock.closed:
            self._moderate(mod, got, merged)

    def _read_slots(self, count: int) -> None:
        """A read of plain datagrams: spread, by stream, or in arrival order (see the module)."""
        io = self.io
        ids, lens, heads, src0, src1, src2 = io.fields(count)
        rs = routes_for(self.routes, ids, heads, lens, src0, src1, src2)
        if rs is not None and spread(ids):
            self.batch.spread(rs, ids, lens)
            return
        self.stats.reads += 1
        limit, max_bytes = io.max_segments, mmsg.GSO_MAX_BYTES
        if rs is not None:
            plan = plan_streams(rs, ids, lens, limit, max_bytes)
        else:
            plan = plan_runs(self.routes, ids, heads, lens, src0, src1, src2, limit, max_bytes)
        batch = self.batch
        size = io.size
        for r, slots, run_lens, seg, sid in plan:
            if r is not None:
                batch.add(r, slots, run_lens, seg, sid)
            else:
                batch.flush()  # what came before it goes first
                i = slots[0]
                self._slow(i * size, run_lens[0], i)
        batch.flush()

    def _read_spans(self, count: int) -> None:
        """A read holding GRO buffers (runs of one source coalesced by the kernel)."""
        io = self.io
        st = self.stats
        st.reads += 1
        lens = io.received(count)
        segs = io.segment_sizes(count)
        for g, n in zip(segs, lens, strict=True):
            if 0 < g < n:
                st.gro_buffers += 1
                st.gro_segments += -(-n // g)
        plan = plan_slots(
            self.routes,
            lens,
            segs,
            io.heads(0, count),
            io.ids(0, count),
            io.sources(0, count),
            io.segments,
            io.size,
            gso=io.gso,
            limit=io.max_segments,
            max_bytes=mmsg.GSO_MAX_BYTES,
        )
        batch = self.batch
        for r, spans, seg, datagrams, slot in plan:
            if r is not None:
                batch.add_spans(r, spans, seg, datagrams)
            else:
                batch.flush()
                off, ln = spans[0]
                self._slow(off, ln, slot)
        batch.flush()

    def _slow(self, offset: int, n: int, slot: int) -> None:
        """One datagram to the slow path (counted received here; its slot locates its source)."""
        st = self.stats
        st.received_packets += 1
        st.received_bytes += n
        try:
            self.sock.slow_path(self.io.mv[offset : offset + n], n, slot)
        except Exception:
            st.callback_errors += 1
            st.drop("error")
            log.exception("udx: error while handling a datagram")

    # --- receive coalescing ---------------------------------------------------------------------

    def _moderate(self, mod: Moderation, got: int, merged: bool) -> None:
        """After a wake that read `got` entries (`merged`: some were GRO runs): pause reading
        for a hold, or read on."""
        io = self.io
        timer = self._hold_timer
        loop = self.sock.loop
        assert timer is not None
        if mod.after_batch(got, io.batch, loop.time(), coalesced=merged) is not None:
            try:
                timer.arm(mod.hold)
            except OSError:
                log.warning("udx: the hold timer failed; receive coalescing is off for this socket")
                mod.hold = 0.0
                mod.release(loop.time())
            else:
                self.stats.holds += 1
                if self._reading:
                    loop.remove_reader(self.sock.fileno())
                    self._reading = False
                return
        if not self._reading:
            loop.add_reader(self.sock.fileno(), self.on_readable)
            self._reading = True

    def _on_hold_end(self) -> None:
        """The hold's timer fired: read what gathered (the read may start the next hold)."""
        mod = self._moderation
        timer = self._hold_timer
        if mod is None or timer is None:
            return
        loop = self.sock.loop
        if not mod.release(loop.time()):
            timer.clear()
            return
        try:
            self.on_readable()
        finally:
            if not mod.holding:
                timer.clear()
                if not self._reading and not self.sock.closed:
                    loop.add_reader(self.sock.fileno(), self.on_readable)
                    self._reading = True
