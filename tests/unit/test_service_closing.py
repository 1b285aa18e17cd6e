"""The relay's goodbye to a relayed peer: two DESTROYs, one of which any stream honours whatever
its ack, since a blind relay does not know the seqs it forwards."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.service.closing import reset_datagrams
from relay.udx.packet import DESTROY, decode, seq_diff
from relay.udx.stream import StreamClosed, UDXCore

EDGES = [0, 1, 5, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 1]


@given(st.integers(0, 2**32 - 1))
def test_one_of_the_two_passes_libudx_check_for_any_ack(ack: int) -> None:
    """libudx's process_packet closes the stream on a DESTROY iff seq_compare(ack, seq) <= 0."""
    packets = [decode(d) for d in reset_datagrams(0x1234)]
    assert all(p.type == DESTROY and p.id == 0x1234 and p.ack == 0 and p.rwnd > 0 for p in packets)
    assert any(seq_diff(ack, p.seq) <= 0 for p in packets)


@pytest.mark.parametrize("ack", EDGES)
def test_our_own_stream_is_reset_by_them_whatever_its_ack(ack: int) -> None:
    core = UDXCore(0x1234)
    core.connect(99, ack=ack)
    for d in reset_datagrams(0x1234):
        core.receive(d, 1.0)
    (closed,) = [e for e in core.events if isinstance(e, StreamClosed)]
    assert core.closed and closed.error is not None and closed.error.code == "ECONNRESET"
