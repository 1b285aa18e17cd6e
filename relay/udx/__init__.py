"""UDX (libudx / udx-native wire protocol) in Python: streams, socket sharing, blind forwarding.

Layers (sans-IO core, one asyncio runtime):

- `relay.udx.packet` — codec: `decode(datagram) -> Packet`, `encode(...)`, flag constants
  `DATA END SACK MESSAGE DESTROY HEARTBEAT`, `seq_lt`/`seq_diff`, `UDXError` (the one error
  type of this layer; `.code` is `ECONNRESET`, `ETIMEDOUT`, `EBADPACKET`, ...).
- `relay.udx.stream` — `UDXCore`: the stream state machine in `relay.core`'s vocabulary
  (`receive(datagram, now)` in; `datagrams_to_send(now)`, `get_timer()`/`handle_timer(now)`,
  `next_event()` -> `DataReceived`, `EndReceived`, `MessageReceived`, `StreamClosed(error)`).
  No sockets, no clocks. Congestion control (`relay.udx.congestion.NewReno`) and loss-recovery
  timing (`relay.udx.recovery`) are modules of their own.
- `relay.udx.forwarding` — the relay fast path's plan (routes, address pins, how a batch
  leaves), pure: no sockets, no clock.
- `relay.udx.udxsocket` — `UDX`, `UDXSocket` below (the socket, its portable reader, the slow
  path); `relay.udx.fastpath` — its batched reader (read, plan, write); `relay.udx.udxstream` —
  `UDXStream`, a `relay.core.Driver` of its `UDXCore`; `relay.udx.stats` — `SocketStats`. One
  clock, the event loop's.
- `relay.udx.mmsg` — recvmmsg/sendmmsg batches with UDP GSO/GRO (`BatchIO`), the one writer of
  forwarded datagrams (`SendBatch`), and the timerfd of receive coalescing.
- `relay.udx.moderation` — receive coalescing's sans-IO decision: after a burst that did not
  fill the batch the reader can pause for a short hold (`UDX_COALESCE_US`, e.g. 100; off by
  default: it pays only for saturated flows), so the next read takes more at once.

Public asyncio API (names are stable)::

    udx = UDX()                                   # one stream-id table (a libudx instance)
    sock = await udx.create_socket("0.0.0.0", 49737, on_datagram=handler, use_mmsg=None, coalesce_us=None)
    #   use_mmsg None: recvmmsg/sendmmsg batches on Linux (UDX_NO_MMSG=1 turns them off);
    #   use_gso None: UDP GSO/GRO with them where the kernel has them (UDX_NO_GSO=1 turns them
    #   off); sock.gso, sock.gro, sock.offload() -> {gso, gro, gso_fallbacks} for /stats;
    #   coalesce_us None: receive-coalescing hold from UDX_COALESCE_US (0 = off)
    #   handler(data: bytes, addr: (host, port)) gets every datagram that is not a UDX packet
    #   for a live stream of `udx` (dht-rpc shares the socket this way); send yours with
    #   sock.send(data, addr). sock.address, sock.port, sock.stats (SocketStats counters:
    #   received/sent/relayed/dropped/foreign packets and bytes), sock.close().

    s = udx.create_stream(id=None, firewall=None, framed=False)   # id None = random u32
    s.connect(sock, remote_id, (host, port))      # sends nothing, as libudx
    s.write(data) -> bool                         # False above the high-water mark
    await s.drain();  await s.flush()             # below HWM / everything (and END) acknowledged
    s.end(data=b"")                               # graceful half-close (END)
    await s.read() -> bytes                       # next chunk, b"" at EOF, raises UDXError
    s.on_data / s.on_end / s.on_message / s.on_close(error)   # optional callbacks instead
    s.send(datagram)                              # unordered MESSAGE packet
    s.destroy(error=None)                         # abortive close: one DESTROY to the peer
    await s.wait_closed() -> UDXError | None
    s.set_keepalive(seconds)                      # HEARTBEATs while idle
    s.change_remote(sock, remote_id, addr)
    s.id, s.remote_id, s.remote_addr, s.socket, s.connected, s.closed, s.error,
    s.stats (StreamStats: retransmits, rack_losses, tlp_probes, rto_count, ...),
    s.rtt, s.cwnd, s.inflight, s.user_data

Raw streams for a blind relay (what blind-relay does with udx-native)::

    def firewall(stream, socket, addr) -> bool:   # True = drop (udx-native's convention)
        stream.connect(socket, peer_stream_id, addr)   # first packet teaches the address
        return False
    a = udx.create_stream(firewall=firewall_a); b = udx.create_stream(firewall=firewall_b)
    a.relay_to(b); b.relay_to(a)

The firewall runs for packets reaching a stream that is not connected on the arrival
socket; without one such packets are dropped (udx-native's default). A relayed stream
forwards every packet it receives to its destination's peer with bytes 4..7 replaced by
the destination's `remote_id` — nothing else is touched, nothing is ACKed or reordered.
Packets arriving before the destination is connected are held (at most 64, then dropped)
and sent when it connects; libudx drops them all and the sender's 1 s RTO repairs that
(docs/wire/udx.md §4). A DESTROY passing through closes both streams; closing either
stream locally closes its partner and sends nothing. A stream closed gracefully lingers
3 s to re-ACK a retransmitted END (Node has no TIME_WAIT).

A relayed stream takes packets only from the address it learned (others, a forged DESTROY
too, are dropped as `wrong_address`). Out-of-order bytes per stream are bounded
(`create_stream(max_reorder_bytes=...)`, default the 4 MiB window).

Counters for metrics: `sock.stats` (`SocketStats`: received/sent/relayed/dropped/foreign
packets and bytes, send and callback errors, GSO/GRO use); every datagram the socket could
not use counts in `dropped_packets` and by cause in `dropped_by_cause` — `garbage` (not UDX,
no `on_datagram`), `unknown_stream` (UDX, no live stream with its id), `firewalled`,
`wrong_address`, `invalid` (bad ack, out-of-window seq), `reorder_limit`,
`relay_unconnected` (held for a partner that never connected), `error`. An `on_datagram`
handler that rejects a datagram reports it with `sock.count_dropped(cause)`. Nothing raises
out of the reader.
"""

from __future__ import annotations

from .packet import (
    DATA,
    DESTROY,
    END,
    HEADER_SIZE,
    HEARTBEAT,
    MESSAGE,
    SACK,
    Packet,
    UDXError,
    decode,
    encode,
    seq_diff,
    seq_lt,
)
from .stats import SocketStats
from .stream import (
    DataReceived,
    EndReceived,
    MessageReceived,
    StreamClosed,
    StreamStats,
    UDXCore,
)
from .udxsocket import UDX, UDXSocket
from .udxstream import Address, Firewall, UDXStream

__all__ = [
    "DATA",
    "DESTROY",
    "END",
    "HEADER_SIZE",
    "HEARTBEAT",
    "MESSAGE",
    "SACK",
    "UDX",
    "Address",
    "DataReceived",
    "EndReceived",
    "Firewall",
    "MessageReceived",
    "Packet",
    "SocketStats",
    "StreamClosed",
    "StreamStats",
    "UDXCore",
    "UDXError",
    "UDXSocket",
    "UDXStream",
    "decode",
    "encode",
    "seq_diff",
    "seq_lt",
]
