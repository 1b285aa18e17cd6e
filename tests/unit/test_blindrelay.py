"""relay.blindrelay against the npm blind-relay vectors and its Server's pairing and stats rules."""

from __future__ import annotations

import contextlib
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.blindrelay import (
    PAIR_MESSAGE,
    PROTOCOL,
    UNPAIR_MESSAGE,
    BlindRelayError,
    BlindRelayServer,
    BlindRelaySession,
    DestroyStream,
    Pair,
    PairingMatched,
    SessionClosed,
    SessionOpened,
    Unpair,
    decode_pair,
    decode_unpair,
    encode_pair,
    encode_unpair,
)
from relay.core import drain_events
from relay.keys import key_pair
from relay.protomux import Channel, ChannelClosed, ChannelOpened, MessageReceived, Mux
from relay.secretstream import HandshakeResult, Message, Opened, SecretStream
from tests.cores import fed
from tests.vectors import load

V = load("streams")["blind_relay"]
T1, T2, T3 = b"\x5a" * 32, b"\x77" * 32, b"\x88" * 32


def h(x: str) -> bytes:
    return bytes.fromhex(x)


# ------------------------------------------------------------------------------ codecs


def test_message_vectors() -> None:
    for name in ("pair_initiator", "pair_responder_big_id"):
        v = V["messages"][name]
        val = v["value"]
        m = Pair(val["isInitiator"], h(val["token"]), val["id"], val["seq"])
        assert encode_pair(m).hex() == v["hex"]
        assert decode_pair(h(v["hex"])) == m
    v = V["messages"]["unpair"]
    assert encode_unpair(Unpair(h(v["value"]["token"]))).hex() == v["hex"]
    assert decode_unpair(h(v["hex"])) == Unpair(h(v["value"]["token"]))


def test_decoders_follow_js_leniency() -> None:
    # bitfield(7): only bit 0 matters; a wide bitfield prefix is accepted as in JS; trailing bytes ignored
    assert decode_pair(b"\x03" + T1 + b"\x07\x00extra") == Pair(True, T1, 7, 0)
    assert decode_pair(b"\xfd\x01\x00" + T1 + b"\x07\x00").is_initiator
    assert decode_unpair(b"\x01" + T1) == Unpair(T1)
    for bad in (b"", b"\x01", b"\x01" + T1, b"\x01" + T1 + b"\x07", b"\x01" + T1 + b"\xfe\x01"):
        with pytest.raises(BlindRelayError):
            decode_pair(bad)
    with pytest.raises(BlindRelayError):
        decode_unpair(b"\x00" + T1[:31])


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=48))
def test_random_bytes_only_raise_blind_relay_error(data: bytes) -> None:
    for decode in (decode_pair, decode_unpair):
        with contextlib.suppress(BlindRelayError):
            decode(data)


# ------------------------------------------------------------------------------ harness


class Client:
    """A blind-relay client end built on our own Mux, wired to one server session."""

    def __init__(self, server: BlindRelayServer, key: bytes, owner: object = None, now: float = 0.0) -> None:
        self.mux = Mux()
        chan = self.mux.open_channel(PROTOCOL, key, messages=[PAIR_MESSAGE, UNPAIR_MESSAGE])
        assert chan is not None
        self.channel: Channel = chan
        self.session = server.accept(id=key, owner=owner, now=now)
        self.server = server
        self.replies: list[Pair] = []
        self.closed = False

    def flush(self, now: float = 0.0) -> None:
        for _ in range(10):
            moved = False
            for msg in self.mux.data_to_send():
                fed(self.session, msg, now)
                moved = True
            for session, msgs in self.server.data_to_send():
                for msg in msgs:
                    session_client[session].receive(msg)
                moved = True
            if not moved:
                return

    def receive(self, msg: bytes) -> None:
        for ev in fed(self.mux, msg):
            if isinstance(ev, MessageReceived):
                self.replies.append(ev.message)
            elif isinstance(ev, ChannelClosed):
                self.closed = True

    def pair(self, initiator: bool, token: bytes, id: int, now: float = 0.0) -> None:
        self.channel.send(0, Pair(initiator, token, id))
        self.flush(now)

    def unpair(self, token: bytes, now: float = 0.0) -> None:
        self.channel.send(1, Unpair(token))
        self.flush(now)


session_client: dict[BlindRelaySession, Client] = {}


def make(server: BlindRelayServer, n: int, owners: list[object] | None = None, now: float = 0.0) -> list[Client]:
    clients = [Client(server, bytes([i + 1]) * 32, owners[i] if owners else None, now) for i in range(n)]
    for c in clients:
        session_client[c.session] = c
    for c in clients:
        c.flush()
    return clients


def stats(server: BlindRelayServer) -> dict[str, dict[str, int]]:
    return server.stats.as_dict()


def counter(start: int = 100):  # type: ignore[no-untyped-def]
    it = itertools.count(start)
    return lambda: next(it)


# ------------------------------------------------------------------------------ vectors


def test_exchange_vector_byte_for_byte() -> None:
    v = V["exchange"]
    server = BlindRelayServer(allocate_stream_id=counter(100))
    key_a, key_b = h(v["clientA_channel_id"]), h(v["clientB_channel_id"])
    sa = server.accept(id=key_a)
    sb = server.accept(id=key_b)
    out = {sa: [], sb: []}  # type: dict[BlindRelaySession, list[str]]
    for session, msgs in server.data_to_send():
        out[session] += [m.hex() for m in msgs]
    for w in v["wire"]:
        if w["from"] == "clientA":
            fed(sa, h(w["hex"]))
        elif w["from"] == "clientB":
            fed(sb, h(w["hex"]))
        for session, msgs in server.data_to_send():
            out[session] += [m.hex() for m in msgs]
    assert out[sa] == [w["hex"] for w in v["wire"] if w["from"] == "server->A"]
    assert out[sb] == [w["hex"] for w in v["wire"] if w["from"] == "server->B"]
    events = drain_events(server)
    assert events[:2] == [SessionOpened(sa), SessionOpened(sb)]
    (matched,) = [e for e in events if isinstance(e, PairingMatched)]
    assert [(link.session, link.is_initiator, link.stream_id, link.remote_stream_id) for link in matched.links] == [
        (sb, False, 100, 8),
        (sa, True, 101, 7),
    ]
    for pe in v["pair_events"]:
        link = matched.links[1] if pe["isInitiator"] else matched.links[0]
        assert link.stream_id == pe["remoteId"]
    # A's final unpair for an unknown token changes nothing
    assert stats(server)["pairings"] == {"requested": 2, "matched": 1, "cancelled": 0, "pending": 0, "active": 1}


def test_relay_connection_vector_plaintext() -> None:
    v = V["relay_connection"]
    plain = v["plaintext"]
    server = BlindRelayServer(allocate_stream_id=counter(200))
    client_key = h(plain[0]["hex"])[-32:]
    session = server.accept(id=client_key)
    (first,) = server.data_to_send()
    assert first[1][0].hex() == plain[1]["hex"]
    fed(session, h(plain[0]["hex"]))
    fed(session, h(plain[2]["hex"]))
    other = server.accept(id=b"\x07" * 32)
    fed(other, h("0001010b626c696e642d72656c617920") + b"\x07" * 32)
    fed(other, b"\x01\x00" + encode_pair(Pair(False, h(v["token"]), 3)))
    replies = {s: msgs for s, msgs in server.data_to_send()}
    assert replies[session] == [h(plain[3]["hex"])]
    assert decode_pair(replies[session][0][2:]).id == v["client_pair_event_remoteId"]


# ------------------------------------------------------------------------------ pairing rules and stats


def test_match_counts_and_links() -> None:
    server = BlindRelayServer(allocate_stream_id=counter())
    a, b = make(server, 2)
    assert stats(server)["sessions"] == {"accepted": 2, "opened": 2, "closed": 0}
    a.pair(True, T1, 7)
    assert stats(server)["pairings"] == {"requested": 1, "matched": 0, "cancelled": 0, "pending": 1, "active": 0}
    a.pair(True, T1, 99)  # same side again: ignored entirely
    assert server.stats.pairings_requested == 1 and a.replies == []
    b.pair(False, T1, 8)
    assert a.replies == [Pair(True, T1, 101)] and b.replies == [Pair(False, T1, 100)]
    assert stats(server)["pairings"] == {"requested": 2, "matched": 1, "cancelled": 0, "pending": 0, "active": 1}
    assert stats(server)["streams"] == {"opened": 2, "closed": 0, "errors": 0}
    assert a.session.active_links == 1 and b.session.active_links == 1


def test_unpair_pending_by_any_session_and_unknown_token() -> None:
    server = BlindRelayServer(allocate_stream_id=counter())
    a, b = make(server, 2)
    a.pair(True, T1, 7)
    b.unpair(T2)  # unknown: nothing
    assert server.stats.pairings_cancelled == 0
    b.unpair(T1)  # npm blind-relay lets any session cancel a pending token
    assert server.stats.pairings_pending == 0 and server.stats.pairings_cancelled == 1
    assert a.session.pending_tokens == 0
    b.pair(False, T1, 8)  # starts a new pending entry
    assert server.stats.pairings_pending == 1 and b.replies == []


def test_unpair_active_destroys_both_streams() -> None:
    server = BlindRelayServer(allocate_stream_id=counter())
    a, b = make(server, 2)
    a.pair(True, T1, 7)
    b.pair(False, T1, 8)
    drain_events(server)
    a.unpair(T1)
    assert [(e.stream_id, e.reason) for e in drain_events(server) if isinstance(e, DestroyStream)] == [
        (101, "unpaired"),
        (100, "unpaired"),
    ]
    assert stats(server)["pairings"]["cancelled"] == 1 and stats(server)["pairings"]["active"] == 0
    assert stats(server)["streams"] == {"opened": 2, "closed": 2, "errors": 0}
    a.unpair(T1)  # nothing left
    assert stats(server)["pairings"]["cancelled"] == 1
    server.stream_closed(100)  # late close reports for streams we destroyed are ignored
    assert server.stats.streams_closed == 2


def test_session_close_cancels_pending_and_destroys_own_links_only() -> None:
    server = BlindRelayServer(allocate_stream_id=counter())
    a, b = make(server, 2)
    a.pair(True, T1, 7)
    b.pair(False, T1, 8)
    a.pair(True, T2, 9)
    a.pair(False, T3, 10)
    drain_events(server)
    a.session.connection_closed()
    events = drain_events(server)
    assert [e.stream_id for e in events if isinstance(e, DestroyStream)] == [101]
    assert events[-1] == SessionClosed(a.session)
    s = stats(server)
    assert s["sessions"] == {"accepted": 2, "opened": 2, "closed": 1}
    assert s["pairings"] == {"requested": 4, "matched": 1, "cancelled": 2, "pending": 0, "active": 1}
    assert s["streams"] == {"opened": 2, "closed": 1, "errors": 0}
    # the other side's stream lives until the runtime reports it closed (as in npm blind-relay)
    server.stream_error(100)
    server.stream_error(12345)  # unknown stream: not counted
    server.stream_closed(100)
    assert stats(server)["streams"] == {"opened": 2, "closed": 2, "errors": 1}
    assert server.stats.pairings_active == 0 and b.session.active_links == 0
    assert list(server.sessions) == [b.session]


def test_remote_close_and_reject_close_the_session() -> None:
    server = BlindRelayServer(allocate_stream_id=counter())
    (a,) = make(server, 1)
    a.channel.close()
    a.flush()
    assert server.stats.sessions_closed == 1 and a.session.closed
    # a client whose channel id differs rejects our open: the session closes unopened
    mux = Mux()
    session = server.accept(id=b"\x09" * 32)
    for _, msgs in server.data_to_send():
        for msg in msgs:
            fed(mux, msg)
    for msg in mux.data_to_send():
        fed(session, msg)
    assert session.closed and not session.opened
    assert stats(server)["sessions"] == {"accepted": 2, "opened": 1, "closed": 2}


def test_end_waits_for_pending_pairings() -> None:
    server = BlindRelayServer(allocate_stream_id=counter())
    a, b = make(server, 2)
    a.pair(True, T1, 7)
    a.session.end()
    a.flush()
    assert not a.closed and not a.session.closed
    b.pair(False, T1, 8)  # the match empties a's pending set: its channel closes
    assert a.closed and a.session.closed and a.replies == [Pair(True, T1, 101)]
    b.session.end()
    b.flush()
    assert b.closed
    assert server.stats.sessions_closed == 2


def test_a_session_pairing_with_itself() -> None:
    server = BlindRelayServer(allocate_stream_id=counter())
    (a,) = make(server, 1)
    a.pair(True, T1, 7)
    a.pair(False, T1, 8)
    assert a.replies == [Pair(False, T1, 100), Pair(True, T1, 101)]
    a.session.destroy()
    assert {e.stream_id for e in drain_events(server) if isinstance(e, DestroyStream)} == {100, 101}
    assert stats(server)["streams"]["closed"] == 2 and server.stats.pairings_active == 0


def test_default_allocator_gives_distinct_32_bit_ids() -> None:
    server = BlindRelayServer()
    clients = make(server, 2)
    ids: set[int] = set()
    for i in range(50):
        token = i.to_bytes(32, "big")
        clients[0].pair(True, token, i)
        clients[1].pair(False, token, i)
    for e in drain_events(server):
        if isinstance(e, PairingMatched):
            ids.update(link.stream_id for link in e.links)
    assert len(ids) == 100 and all(0 <= x <= 0xFFFFFFFF for x in ids)


def tok(i: int) -> bytes:
    return i.to_bytes(32, "big")


def test_pending_caps_shed_the_heaviest_never_the_newcomer() -> None:
    server = BlindRelayServer(
        allocate_stream_id=counter(), max_pending_per_session=2, max_pending_total=3, pairing_timeout=10.0
    )
    a, b, c = make(server, 3, owners=["hog", "hog", "new"])
    a.pair(True, tok(1), 1, now=0.0)
    a.pair(True, tok(2), 2, now=1.0)
    a.pair(True, tok(3), 3, now=2.0)  # over the per-session cap: a's oldest (tok 1) goes, tok 3 stays
    assert server.shed["pending_per_session"] == 1 and server.stats.pairings_pending == 2
    assert list(a.session._pairing) == [tok(2), tok(3)]
    b.pair(True, tok(4), 4, now=3.0)  # total now 3 = the cap
    c.pair(True, tok(5), 5, now=4.0)  # a newcomer over the total cap: the hog's heaviest session pays
    assert server.shed["pending_total"] == 1 and server.stats.pairings_pending == 3
    assert list(a.session._pairing) == [tok(3)] and c.session.pending_tokens == 1
    c.pair(False, tok(3), 6, now=5.0)  # completing a pending token never sheds anything
    assert server.stats.pairings_matched == 1 and c.replies == [Pair(False, tok(3), 100)]
    assert server.shed["pending_total"] == 1
    c.pair(False, tok(6), 2**32, now=5.0)  # not a UDX stream id
    assert server.stats.pairings_refused_invalid == 1
    assert server.get_timer() == 13.0  # tok 4, made at 3.0
    server.handle_timer(12.9)
    assert server.stats.pairings_pending == 2
    server.handle_timer(13.0)
    assert server.stats.pairings_pending == 1 and server.stats.pairings_timed_out == 1
    server.handle_timer(100.0)
    s = server.stats
    assert (s.pairings_pending, s.pairings_timed_out) == (0, 2)
    assert server._owners["hog"].pending == 0 and server._owners["new"].pending == 0
    assert stats(server)["refusals"] == {
        "session_limit": 0,
        "total_limit": 0,
        "invalid": 1,
        "timed_out": 2,
        "full_sessions": 0,
        "full_pairs": 0,
        "memory_sessions": 0,
        "memory_pairs": 0,
    }
    assert dict(server.shed) == {"pending_per_session": 1, "pending_total": 1, "pending_timeout": 2}


def test_self_pairs_leave_no_phantom_pending_so_the_total_cap_holds() -> None:
    """A session pairing tokens with itself held each token once but counted it twice for its
    host: after many self-pairs that host looked heaviest with nothing pending, the total cap
    shed nothing there, and pending grew past the cap (seen as 301 > 256 under combined attacks)."""
    server = BlindRelayServer(allocate_stream_id=counter(), max_pending_total=4)
    hog, other = make(server, 2, owners=["10.0.0.9", "10.0.0.1"])
    for i in range(50):
        hog.pair(True, tok(i), 10 + i)
        hog.pair(False, tok(i), 100 + i)
    assert server.stats.pairings_matched == 50 and server._owners["10.0.0.9"].pending == 0
    for i in range(20):
        other.pair(True, tok(200 + i), 300 + i)
        assert server.stats.pairings_pending <= 4
    assert server.shed["pending_total"] == 16 and server._owners["10.0.0.1"].pending == 4


def test_active_pairs_cap_sheds_the_self_pairing_hog() -> None:
    server = BlindRelayServer(allocate_stream_id=counter(), max_active_pairs=3)
    hog, x, y = make(server, 3, owners=["10.0.0.9", "10.0.0.1", "10.0.0.2"])
    x.pair(True, tok(100), 1)
    y.pair(False, tok(100), 2)  # the legitimate pair, across two owners
    server.stream_carried(100)
    server.stream_carried(101)
    for i in range(10):  # one session pairs tokens with itself
        hog.pair(True, tok(i), 10 + i)
        hog.pair(False, tok(i), 20 + i)
    assert server.stats.pairings_active == 3 and server.shed["active_pairs"] == 8
    assert x.session.active_links == 1 and y.session.active_links == 1
    assert hog.session.active_links == 4 and set(hog.session._links) == {tok(8), tok(9)}
    destroyed = [e for e in drain_events(server) if isinstance(e, DestroyStream)]
    assert len(destroyed) == 16 and all(e.session is hog.session for e in destroyed)


def test_active_pairs_cap_prefers_a_silent_pair() -> None:
    server = BlindRelayServer(allocate_stream_id=counter(), max_active_pairs=2)
    (a,) = make(server, 1, owners=["h"])
    a.pair(True, tok(1), 1)
    a.pair(False, tok(1), 2)  # streams 100, 101
    a.pair(True, tok(2), 3)
    a.pair(False, tok(2), 4)  # streams 102, 103
    server.stream_carried(100)
    server.stream_carried(101)  # tok 1 is carrying traffic both ways, tok 2 not
    a.pair(True, tok(3), 5)
    a.pair(False, tok(3), 6)
    assert set(a.session._links) == {tok(1), tok(3)}


def test_silent_pairs_are_reaped_carried_ones_kept() -> None:
    server = BlindRelayServer(allocate_stream_id=counter(), pair_idle_timeout=5.0)
    a, b = make(server, 2, owners=["p", "q"])
    a.pair(True, tok(1), 1, now=0.0)
    b.pair(False, tok(1), 2, now=0.0)  # streams 100 (b), 101 (a)
    a.pair(True, tok(2), 3, now=1.0)
    b.pair(False, tok(2), 4, now=1.0)  # streams 102, 103
    server.stream_carried(100)
    server.stream_carried(101)
    server.stream_carried(102)  # one way only: still silent
    assert server.get_timer() == 6.0
    drain_events(server)
    server.handle_timer(5.9)
    assert server.stats.pairings_active == 2
    server.handle_timer(6.0)
    assert server.stats.pairings_active == 1 and server.shed["silent_pair"] == 1
    assert sorted(e.stream_id for e in drain_events(server) if isinstance(e, DestroyStream)) == [102, 103]
    server.handle_timer(1000.0)
    assert server.stats.pairings_active == 1 and server.get_timer() is None


def test_idle_sessions_are_closed_busy_ones_kept() -> None:
    server = BlindRelayServer(allocate_stream_id=counter(), session_idle_timeout=10.0)
    idle, a, b = make(server, 3, owners=["x", "y", "z"], now=0.0)
    idle.pair(True, tok(9), 9, now=1.0)  # pending alone is not pairing anything
    a.pair(True, tok(1), 1, now=2.0)
    b.pair(False, tok(1), 2, now=2.0)
    server.handle_timer(9.9)
    assert server.stats.sessions_closed == 0
    server.handle_timer(10.0)
    assert idle.session.closed and server.stats.sessions_closed == 1 and server.shed["idle_session"] == 1
    assert server.stats.pairings_pending == 0
    server.handle_timer(50.0)
    assert server.stats.sessions_closed == 1  # a and b hold a link
    a.unpair(tok(1), now=50.0)  # links gone at t=50: idle from now
    server.handle_timer(59.9)
    assert server.stats.sessions_closed == 1
    server.handle_timer(60.0)
    assert a.session.closed and b.session.closed and server.shed["idle_session"] == 3


def test_shed_session_takes_the_heaviest_owners_least_busy_session() -> None:
    server = BlindRelayServer(allocate_stream_id=counter())
    clients = [Client(server, bytes([i + 1]) * 32, "hog" if i < 3 else "other", now=float(i)) for i in range(4)]
    for c in clients:
        session_client[c.session] = c
    for c in clients:
        c.flush()
    h0, h1, h2, other = clients
    h0.pair(True, tok(1), 1)
    h0.pair(False, tok(1), 2)  # h0 is relaying: shed last
    victim = server.shed_session(10.0)
    assert victim is h1.session and h1.session.closed and server.shed["sessions"] == 1
    assert server.shed_session(10.0) is h2.session
    assert server.sessions_of("hog") == 1 and server.sessions_of("other") == 1
    server.shed_session(10.0)
    assert server.sessions_of("hog") + server.sessions_of("other") == 1
    assert not h0.session.closed or not other.session.closed


def test_shed_session_spares_a_relaying_host_when_the_cap_evens_everyone_out() -> None:
    """Issue #13 handshake flood at a small cap: 64 hosts each left with one idle session, the
    legitimate host with two (its client relaying, its server waiting for the partner). Counting
    sessions alone made it the heaviest and it lost a session mid-echo; a relaying session weighs
    1/8 and a waiting one 1/2, so idle flood sessions go first, oldest first."""
    server = BlindRelayServer(allocate_stream_id=counter())
    flood = [Client(server, bytes([i + 1]) * 32, f"10.0.0.{i}", now=float(i)) for i in range(8)]
    legit = [Client(server, bytes([100 + i]) * 32, "127.0.0.1", now=20.0) for i in range(3)]
    for c in flood + legit:
        session_client[c.session] = c
    for c in flood + legit:
        c.flush()
    a, b, waiting = legit
    a.pair(True, tok(1), 1)
    b.pair(False, tok(1), 2)  # a and b relay each other
    waiting.pair(True, tok(2), 3)  # the next connection's session, its partner not here yet
    assert server._owners["127.0.0.1"].linked == 2
    shed = [server.shed_session(30.0) for _ in range(8)]
    assert shed == [c.session for c in flood]  # every idle flood session, the longest idle first
    assert not any(c.session.closed for c in legit)
    assert server.shed_session(30.0) is waiting.session  # then the waiting one, before the relaying
    assert not a.session.closed and not b.session.closed
    a.session.destroy()  # its own links go (b's stays until its stream closes): the books follow
    assert server._owners["127.0.0.1"].linked == 1
    b.session.destroy()
    assert "127.0.0.1" not in server._owners or server._owners["127.0.0.1"].linked == 0


def test_shed_session_an_address_whose_many_sessions_all_relay_still_pays() -> None:
    """Relaying sessions weigh little, not nothing: a host that self-pairs to keep 40 sessions
    busy outweighs a newcomer's one waiting session."""
    server = BlindRelayServer(allocate_stream_id=counter())
    hog = [Client(server, bytes([i + 1]) * 32, "hog", now=float(i)) for i in range(40)]
    (new,) = [Client(server, b"\xee" * 32, "new", now=50.0)]
    for c in [*hog, new]:
        session_client[c.session] = c
    for c in [*hog, new]:
        c.flush()
    for i, c in enumerate(hog):
        c.pair(True, tok(i), 1)
        c.pair(False, tok(i), 2)
    new.pair(True, tok(99), 3)
    victim = server.shed_session(60.0)
    assert victim is not None and victim is not new.session and victim.owner == "hog"


def _carry(server: BlindRelayServer, a: Client, b: Client, token: bytes, ids: tuple[int, int]) -> None:
    """Pair `a` and `b` on `token` and report a packet on both relay streams (a live pair)."""
    a.pair(True, token, ids[0])
    b.pair(False, token, ids[1])
    for link in (*a.session._links[token], *b.session._links[token]):
        assert link.stream_id is not None
        server.stream_carried(link.stream_id)


def test_session_cap_spares_a_worker_address_whose_sessions_relay() -> None:
    """The deployment's shape: every job's connection to the worker is a session from the
    worker's address, so one address legitimately holds most sessions. At the cap the idle
    hoard goes, never a session relaying traffic (counting relaying sessions at 1/8 made the
    worker's 80 sessions outweigh 8 idle ones, and a live pair died)."""
    server = BlindRelayServer(allocate_stream_id=counter(), max_sessions=168)
    worker = [Client(server, bytes([1, i]) * 16, "worker", now=1.0) for i in range(80)]
    jobs = [Client(server, bytes([2, i]) * 16, "jobs", now=1.0) for i in range(80)]
    hoard = [Client(server, bytes([3, i]) * 16, "hoard", now=0.0) for i in range(8)]
    for c in worker + jobs + hoard:
        session_client[c.session] = c
    for c in worker + jobs + hoard:
        c.flush()
    for i, (w, j) in enumerate(zip(worker, jobs, strict=True)):
        _carry(server, w, j, tok(i), (2 * i + 1, 2 * i + 2))
    for k in range(8):
        assert server.room_for_session(5.0)
        session_client[Client(server, bytes([4, k]) * 16, f"new{k}", now=5.0).session] = None  # type: ignore[assignment]
    assert all(c.session.closed for c in hoard) and server.shed["sessions"] == 8
    assert server.session_count == 168
    assert not any(c.session.closed for c in worker + jobs)


def test_full_relay_refuses_the_newcomer_when_every_session_relays() -> None:
    server = BlindRelayServer(allocate_stream_id=counter(), max_sessions=4)
    a, b, c, d = make(server, 4, owners=["w", "j", "w", "j"])
    _carry(server, a, b, tok(1), (1, 2))
    _carry(server, c, d, tok(2), (3, 4))
    assert not server.room_for_session(1.0)
    assert server.stats.sessions_refused_full == 1 and server.shed["sessions"] == 0
    assert stats(server)["refusals"]["full_sessions"] == 1
    assert not any(x.session.closed for x in (a, b, c, d))
    c.session.destroy()  # a pair ends: d's side stays until its stream closes, c's slot is free
    assert server.room_for_session(2.0)


def test_session_cap_takes_a_silent_pairs_session_before_refusing() -> None:
    """Sessions whose pairs never carried a packet (a self-pairing hoard) may still go."""
    server = BlindRelayServer(allocate_stream_id=counter(), max_sessions=3)
    a, b, hog = make(server, 3, owners=["w", "j", "hog"])
    _carry(server, a, b, tok(1), (1, 2))
    hog.pair(True, tok(2), 3)
    hog.pair(False, tok(2), 4)  # matched, never carried
    assert server.room_for_session(1.0)
    assert hog.session.closed and not a.session.closed and not b.session.closed
    assert server.stats.sessions_refused_full == 0


def test_active_pairs_cap_refuses_a_new_pairing_when_every_pair_carries() -> None:
    """Full of live pairs: the new pairing is refused, its sessions close their channel so the
    peers learn at once (npm's client fails it with CHANNEL_CLOSED), and no live pair dies."""
    server = BlindRelayServer(allocate_stream_id=counter(), max_active_pairs=2)
    a, b, c, d, e, f = make(server, 6, owners=["w", "j", "w", "j", "w", "j"])
    _carry(server, a, b, tok(1), (1, 2))
    _carry(server, c, d, tok(2), (3, 4))
    drain_events(server)
    e.pair(True, tok(3), 5)
    f.pair(False, tok(3), 6)
    s = server.stats
    assert (s.pairings_refused_full, s.pairings_active, s.pairings_pending) == (1, 2, 0)
    assert s.pairings_cancelled == 0 and server.shed["active_pairs"] == 0
    assert e.closed and f.closed and e.session.closed and f.session.closed
    assert not any(x.session.closed for x in (a, b, c, d))
    assert not any(isinstance(ev, DestroyStream) for ev in drain_events(server))
    assert stats(server)["refusals"]["full_pairs"] == 1


def test_get_timer_includes_the_idle_session_deadline() -> None:
    """One timer for the glue: idle sessions expire at `get_timer()`, not on a 1 s poll."""
    server = BlindRelayServer(allocate_stream_id=counter(), session_idle_timeout=10.0)
    a, b = make(server, 2, owners=["x", "y"], now=3.0)
    assert server.get_timer() == 13.0
    a.pair(True, tok(1), 1, now=4.0)
    b.pair(False, tok(1), 2, now=4.0)
    assert server.get_timer() is None
    a.unpair(tok(1), now=6.0)
    assert server.get_timer() == 16.0
    server.handle_timer(16.0)
    assert a.session.closed and b.session.closed and server.get_timer() is None


def test_server_close_destroys_everything() -> None:
    server = BlindRelayServer(allocate_stream_id=counter())
    a, b = make(server, 2)
    a.pair(True, T1, 7)
    b.pair(False, T1, 8)
    b.pair(False, T2, 9)
    server.close()
    a.flush()
    b.flush()
    assert a.closed and b.closed
    s = stats(server)
    assert s["sessions"]["closed"] == 2 and s["pairings"]["pending"] == 0 and s["pairings"]["active"] == 0
    assert s["streams"]["closed"] == 2


def test_bad_input_raises_blind_relay_error() -> None:
    server = BlindRelayServer()
    (a,) = make(server, 1)
    with pytest.raises(BlindRelayError):
        fed(a.session, b"\x01\x00\x01" + T1[:5])  # truncated pair on the channel
    server2 = BlindRelayServer()
    s = server2.accept(id=b"\x01" * 32)
    with pytest.raises(BlindRelayError):
        fed(s, b"\x00\x01\x05")  # open that skips ahead
    with pytest.raises(BlindRelayError, match="already open"):
        BlindRelaySession(server2, s.mux, b"\x01" * 32, None)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=48), max_size=4))
def test_random_messages_on_a_session_only_raise_blind_relay_error(msgs: list[bytes]) -> None:
    server = BlindRelayServer()
    session = server.accept(id=b"\x01" * 32)
    client_open = h("0001010b626c696e642d72656c617920") + b"\x01" * 32
    try:
        fed(session, client_open)
        for m in msgs:
            fed(session, b"\x01" + m)  # on the client's channel (id 1)
            fed(session, m)
    except BlindRelayError:
        pass
    session.connection_closed()
    s = server.stats
    assert s.sessions_closed == 1 and s.pairings_pending == 0 and s.pairings_active == 0
    assert isinstance(drain_events(server)[-1], SessionClosed)


def test_session_events_other_channels_are_returned() -> None:
    server = BlindRelayServer()
    s = server.accept(id=b"\x01" * 32)
    s.mux.pair("other")
    others = fed(s, h("00010105") + b"other" + b"\x00")
    assert [type(e).__name__ for e in others] == ["ChannelRequested"]
    assert not any(isinstance(e, ChannelOpened) for e in others)


def test_relay_connection_vector_encrypted_full_stack() -> None:
    """secret-stream (hyperdht hand-over) + Mux + session: the relay's bytes equal the JS relay's."""
    v = V["relay_connection"]
    client_pk = key_pair(b"\x01" * 32).public_key
    relay_pk = key_pair(b"\x02" * 32).public_key
    hs = HandshakeResult(h(v["client_rx"]), h(v["client_tx"]), h(v["handshake_hash"]), relay_pk, client_pk)
    stream = SecretStream(False, handshake=hs)
    stream._force_header(b"\xf6" * 24)
    server = BlindRelayServer(allocate_stream_id=counter(200))
    stream.start(0.0)
    sessions: list[BlindRelaySession] = []
    wire_out = [stream.data_to_send()]

    def pump() -> None:
        for ev in stream.events():
            if isinstance(ev, Opened):
                sessions.append(server.accept(id=ev.remote_public_key))
            elif isinstance(ev, Message):
                fed(sessions[0], ev.data)
        for _session, msgs in server.data_to_send():
            for m in msgs:
                if _session is sessions[0]:
                    stream.send(m)
        out = stream.data_to_send()
        if out:
            wire_out.append(out)

    pump()
    for w in v["wire"]:
        if w["from"] == "client":
            stream.receive(h(w["hex"]), 0.0)
            pump()
    other = server.accept(id=b"\x07" * 32)
    fed(other, h("0001010b626c696e642d72656c617920") + b"\x07" * 32)
    fed(other, b"\x01\x00" + encode_pair(Pair(False, h(v["token"]), 3)))
    pump()
    assert b"".join(wire_out).hex() == "".join(w["hex"] for w in v["wire"] if w["from"] == "relay")


def test_relay_stream_ids_are_the_partner_peers_own_when_free() -> None:
    """Each relay stream's id is its partner peer's stream id, so forwarded packets keep their
    id (the kernel can forward them untouched: relay.udx.kernel); taken ids fall back."""
    taken = {9}
    server = BlindRelayServer(allocate_stream_id=counter(100), stream_id_free=lambda i: i not in taken)
    a, b, c, d = make(server, 4)
    a.pair(True, T1, 7)
    b.pair(False, T1, 8)
    # A's peer stream 7 reaches the relay stream facing A, which forwards to B's peer stream 8
    assert a.replies == [Pair(True, T1, 8)] and b.replies == [Pair(False, T1, 7)]
    c.pair(True, T2, 9)  # 9 is taken (say a DHT connection's stream): D's side gets a fresh id
    d.pair(False, T2, 7)  # 7 is the relay's already (the stream facing B): so does C's
    assert d.replies == [Pair(False, T2, 100)] and c.replies == [Pair(True, T2, 101)]


def test_relay_stream_ids_differ_when_both_peers_use_the_same_id() -> None:
    server = BlindRelayServer(allocate_stream_id=counter(100), stream_id_free=lambda i: True)
    a, b = make(server, 2)
    a.pair(True, T1, 5)
    b.pair(False, T1, 5)
    ids = {a.replies[0].id, b.replies[0].id}
    assert len(ids) == 2 and 5 in ids
