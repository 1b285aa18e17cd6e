"""The blind-relay client core against the blind-relay server core, in memory (no sockets)."""

from __future__ import annotations

import os

import pytest

from relay.blindrelay import BlindRelayError, BlindRelayServer, BlindRelaySession, PairingMatched
from relay.core import drain_events
from relay.dht.blindclient import BlindRelayClient, Paired, RelayChannelClosed, RelayChannelOpened
from tests.cores import closed, fed

SERVER_EVENTS: list = []


def wire(server: BlindRelayServer, *pairs: tuple[BlindRelayClient, BlindRelaySession]) -> dict:
    """Shuttle messages both ways until quiet, as the relay runtime pumps; each client's events."""
    events: dict = {c: [] for c, _ in pairs}
    by_session = {s: c for c, s in pairs}
    for _ in range(10):
        moved = False
        for c, sess in pairs:
            for m in c.data_to_send():
                fed(sess, m)
                moved = True
        SERVER_EVENTS.extend(drain_events(server))
        for sess, msgs in server.data_to_send():
            for m in msgs:
                events[by_session[sess]] += fed(by_session[sess], m)
                moved = True
        if not moved:
            break
    return events


def test_two_clients_pair_through_the_server_with_its_stream_ids() -> None:
    ids = iter([111, 222])
    server = BlindRelayServer(allocate_stream_id=lambda: next(ids))
    a_key, b_key, token = os.urandom(32), os.urandom(32), os.urandom(32)
    a, b = BlindRelayClient(a_key), BlindRelayClient(b_key)
    sa, sb = server.accept(id=a_key), server.accept(id=b_key)
    a.pair(True, token, 7)
    assert [e for e in wire(server, (a, sa), (b, sb))[a] if not isinstance(e, RelayChannelOpened)] == []
    assert a.opened and a.pending == 1
    b.pair(False, token, 9)
    ev = wire(server, (a, sa), (b, sb))
    ev_a, ev_b = ev[a], ev[b]
    matched = [e for e in SERVER_EVENTS if isinstance(e, PairingMatched)]
    assert len(matched) == 1
    links = {link.remote_stream_id: link.stream_id for link in matched[0].links}
    pa = [e for e in ev_a if isinstance(e, Paired)]
    pb = [e for e in ev_b if isinstance(e, Paired)]
    # each side connects its raw stream to the relay stream that forwards to its own id
    assert pa == [Paired(token, True, links[7])] and pb == [Paired(token, False, links[9])]
    assert a.pending == 0 and b.pending == 0


def test_answers_for_unknown_tokens_or_the_wrong_role_are_ignored() -> None:
    server = BlindRelayServer()
    token = os.urandom(32)
    a, b = BlindRelayClient(b"a" * 32), BlindRelayClient(b"b" * 32)
    sa, sb = server.accept(id=b"a" * 32), server.accept(id=b"b" * 32)
    a.pair(True, token, 1)
    wire(server, (a, sa), (b, sb))
    b.pair(True, token, 2)  # same role twice: the relay never matches it
    ev = wire(server, (a, sa), (b, sb))
    assert not [e for e in ev[a] + ev[b] if isinstance(e, Paired)]
    with pytest.raises(BlindRelayError):
        a.pair(True, token, 3)  # already pairing on this token


def test_garbage_from_the_relay_is_a_blind_relay_error_and_close_reports_pending() -> None:
    c = BlindRelayClient(b"c" * 32)
    token = os.urandom(32)
    c.pair(False, token, 5)
    with pytest.raises(BlindRelayError):
        fed(c, b"\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff")
    assert closed(c) == [RelayChannelClosed((token,))]
    assert c.closed
    with pytest.raises(BlindRelayError):
        c.pair(True, os.urandom(32), 6)
