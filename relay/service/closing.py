"""Ending a relay so its peers notice at once: a planned restart must not look like a crash.

A relayed connection is one end-to-end UDX stream between two peers; the relay only rewrites
stream ids. libudx sends nothing when a relayed stream is destroyed, so after a silent stop the
peers keep retransmitting into the void and learn of it by ETIMEDOUT 13-17 s later. On the way
out the relay therefore resets each peer's stream itself: a UDX DESTROY addressed to the peer's
stream id, which the peer answers by closing the connection with ECONNRESET.

libudx honours a DESTROY only if its seq is not behind the stream's ack, serially
(`seq_compare(ack, seq) <= 0`), and a blind relay does not track the seqs it forwards. Two
DESTROYs cover every ack: seq 2**31 lands for acks in [0, 2**31], seq 0 for acks in
[2**31, 2**32) and 0. The ack field is 0 (acknowledges nothing, so a DESTROY the peer ignores
touches no send state) and the window the default (never a zero window).
"""

from __future__ import annotations

from collections.abc import Iterable

from relay.udx import UDXStream
from relay.udx.packet import DEFAULT_RWND, DESTROY, encode_header

_HALF = 0x80000000


def reset_datagrams(remote_id: int) -> list[bytes]:
    """The two DESTROYs that close the peer stream `remote_id` whatever its ack."""
    return [encode_header(DESTROY, remote_id, DEFAULT_RWND, seq, 0) for seq in (_HALF, 0)]


def reset_relayed_peers(streams: Iterable[UDXStream]) -> int:
    """Reset the peer behind each relay stream that knows its peer (address learned from its
    first packet); returns how many peers were told. The streams themselves are left to the
    blind-relay core to destroy."""
    told = 0
    for stream in streams:
        sock, addr = stream.socket, stream.send_address
        if stream.closed or sock is None or addr is None:
            continue
        sock.send_datagrams(reset_datagrams(stream.remote_id), addr)
        told += 1
    return told
