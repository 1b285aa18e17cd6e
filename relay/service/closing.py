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

import asyncio
from collections.abc import Iterable

from relay.udx import UDXSocket, UDXStream
from relay.udx.packet import DEFAULT_RWND, DESTROY, encode_header

_HALF = 0x80000000
#: relay streams reset per batch, the pause between batches, and how many times each is sent:
#: 3,200 peers a second, so 8,192 relay streams (4,096 pairs) take ~2.6 s a round
RESET_BATCH = 32
RESET_PAUSE = 0.01
RESET_ROUNDS = 2

Target = tuple[UDXSocket, tuple[str, int], int]


def reset_datagrams(remote_id: int) -> list[bytes]:
    """The two DESTROYs that close the peer stream `remote_id` whatever its ack."""
    return [encode_header(DESTROY, remote_id, DEFAULT_RWND, seq, 0) for seq in (_HALF, 0)]


def reset_targets(streams: Iterable[UDXStream]) -> list[Target]:
    """Where to send the resets: each relay stream that knows its peer (address learned from its
    first packet). Taken before the streams are destroyed; the socket stays open until the end."""
    out: list[Target] = []
    for stream in streams:
        sock, addr = stream.socket, stream.send_address
        if not stream.closed and sock is not None and addr is not None:
            out.append((sock, addr, stream.remote_id))
    return out


async def send_resets(
    targets: list[Target], *, batch: int = RESET_BATCH, pause: float = RESET_PAUSE, rounds: int = RESET_ROUNDS
) -> None:
    """Reset every target, `batch` at a time with `pause` between, `rounds` times over.

    Paced because a worker address holds thousands of connections on one UDP socket: thousands
    of DESTROYs at once overflow its receive buffer while it is busy closing the first ones, and
    a lost one leaves that peer to time out. Sent again in a second round for the same reason;
    a peer whose stream is already gone ignores the repeat (unknown stream id)."""
    for _ in range(rounds):
        for i in range(0, len(targets), batch):
            for sock, addr, remote_id in targets[i : i + batch]:
                sock.send_datagrams(reset_datagrams(remote_id), addr)
            await asyncio.sleep(pause)
