"""A UDX socket's counters: what the relay's metrics report for its one socket.

Datagrams the fast paths forward are counted once for their receive, relay and send together
(`forwarded_*`, added by `relay.udx.mmsg.SendBatch`); every other path counts each as it goes.
"""

from __future__ import annotations

from typing import Any


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
