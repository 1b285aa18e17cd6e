"""Sans-IO DHT cores: routing table, NAT sampler, RPC (tokens, retries, congestion), query
walk and the server handshake, all on virtual time and the dht.json vectors."""

from __future__ import annotations

import os

import nacl.bindings
import nacl.exceptions
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.dht.announcer import AnnounceState, sign_announce
from relay.dht.handshake import AttemptTimedOut, HandshakeResponder, open_payload, seal_payload
from relay.dht.holepunch import NatAnalyzer, PunchState
from relay.dht.messages import (
    NS_ANNOUNCE,
    Announce,
    Command,
    DHTError,
    ErrorCode,
    Firewall,
    Handshake,
    Holepunch,
    HolepunchPayload,
    LookupReply,
    Mode,
    NoisePayload,
    PayloadError,
    PeerRecord,
    RelayInfo,
    Request,
    Response,
    announce_signable,
    decode_message,
    hash32,
    node_id,
)
from relay.dht.persistent import Answer, GenerationCache, Persistent, mutable_signable
from relay.dht.query import Query
from relay.dht.router import Relay as RouterRelay
from relay.dht.router import Respond, route_handshake, route_holepunch, server_handshake_reply
from relay.dht.rpc import (
    CLIENT,
    RPC,
    SERVER,
    Peer,
    Reply,
    RequestFailed,
    RequestReceived,
    RequestRetrying,
    ResponseReceived,
)
from relay.dht.table import NatSampler, Node, RoutingTable, prefix_length, xor_compare
from relay.encoding import Reader, Writer
from relay.keys import key_pair
from relay.noise import NoiseHandshake
from tests.vectors import load

V = load("dht")["vectors"]
INPUTS = load("dht")["inputs"]


def addr(d: dict) -> tuple[str, int]:
    return (d["host"], d["port"])


# ------------------------------------------------------------------------- routing table


def test_prefix_length_matches_kademlia_rows() -> None:
    a = bytes(32)
    assert prefix_length(a, a) == 255
    assert prefix_length(b"\x80" + bytes(31), a) == 0
    assert prefix_length(b"\x01" + bytes(31), a) == 7
    assert prefix_length(bytes(1) + b"\x40" + bytes(30), a) == 9


def test_routing_table_rows_capacity_and_closest() -> None:
    own = bytes(32)
    table = RoutingTable(own, k=4)
    nodes = [Node(bytes([0x80 | i]) + os.urandom(31), "10.0.0.1", 1000 + i) for i in range(6)]
    results = [table.add(n) for n in nodes]
    # all share prefix length 0 with our id: one row of k=4, the rest bounce with that full row
    assert results[:4] == [True] * 4 and all(r is not True for r in results[4:])
    assert len(table) == 4
    near = Node(bytes([0x01]) + os.urandom(31), "10.0.0.2", 2000)
    assert table.add(near) is True
    assert table.get(near.id) is near and table.has(near.id)
    # closest() starts at the target's row and walks towards shorter prefixes first
    assert table.closest(near.id, 1) == [near]
    assert len(table.closest(os.urandom(32), 10)) == 5
    assert len(table.closest(os.urandom(32))) == 4  # k by default
    assert table.remove(near.id) and not table.has(near.id) and len(table) == 4
    # replacing a node with the same id keeps the size
    again = Node(nodes[0].id, "10.0.0.9", 9)
    assert table.add(again) is True and table.get(again.id) is again and len(table) == 4
    assert table.random() in list(table)


def test_xor_compare_orders_by_distance() -> None:
    target = bytes(32)
    near, far = b"\x01" + bytes(31), b"\x02" + bytes(31)
    assert xor_compare(target, near, far) < 0 < xor_compare(target, far, near)
    assert xor_compare(target, near, near) == 0


def test_nat_sampler_votes_like_nat_sampler() -> None:
    s = NatSampler()
    s.add("1.2.3.4", 1000)
    assert (s.host, s.port) == ("1.2.3.4", 1000)  # one sample is a majority of one
    s.add("1.2.3.4", 1001)
    assert (s.host, s.port) == ("1.2.3.4", 0)  # host consistent, port not: "randomized"
    for _ in range(6):
        s.add("1.2.3.4", 1000)
    assert (s.host, s.port) == ("1.2.3.4", 1000)
    t = NatSampler()
    for i in range(40):  # the ring keeps 16 samples; old ones stop counting
        t.add("5.6.7.8", 2000 + i % 2 if i < 20 else 3000)
    assert (t.host, t.port) == ("5.6.7.8", 3000)


# ------------------------------------------------------------------------- RPC core


def make_rpc(**kw) -> RPC:  # type: ignore[no-untyped-def]
    return RPC(RoutingTable(os.urandom(32)), **kw)


def test_tokens_match_vector_and_rotate() -> None:
    t = V["token"]
    rpc = make_rpc()
    rpc.set_secrets(bytes.fromhex(INPUTS["tokenSecret0"]["hex"]), bytes.fromhex(INPUTS["tokenSecret1"]["hex"]))
    assert rpc.token(t["forHost"], 0).hex() == t["tokenWithSecret0"]
    assert rpc.token(t["forHost"], 1).hex() == t["tokenWithSecret1"]
    rpc._next_drain = 0.0
    for i in range(10):  # 10 drains of 750 ms = one rotation
        rpc.handle_timer(0.75 * (i + 1))
    assert rpc._secrets is not None
    assert rpc._secrets[0].hex() == t["afterRotation_secret0"]
    assert rpc._secrets[1].hex() == t["afterRotation_secret1"]
    assert rpc.token(t["forHost"], 1).hex() == t["afterRotation_tokenWithSecret1"]


def test_invalid_token_is_answered_by_rpc_with_a_fresh_token() -> None:
    inv = V["invalidToken"]
    rpc = make_rpc()
    rpc.set_secrets(bytes.fromhex(INPUTS["tokenSecret0"]["hex"]), bytes.fromhex(INPUTS["tokenSecret1"]["hex"]))
    rpc.ephemeral = False
    rpc.table = RoutingTable(node_id(addr(INPUTS["addrB"])))
    rpc.receive(bytes.fromhex(inv["request"]), addr(INPUTS["addrS"]), SERVER, 0.0)
    assert rpc.next_event() is None  # never dispatched
    ((sock, data, to),) = rpc.datagrams_to_send()
    assert sock == SERVER and to == addr(INPUTS["addrS"])
    assert data.hex() == inv["response"]  # byte-identical to dht-rpc's own error reply
    # with a routing table the error carries closer nodes, as the request had a target
    rpc.table.add(Node(node_id(addr(INPUTS["addrN1"])), *addr(INPUTS["addrN1"])))
    rpc.receive(bytes.fromhex(inv["request"]), addr(INPUTS["addrS"]), SERVER, 0.0)
    res = decode_message(rpc.datagrams_to_send()[0][1])
    assert isinstance(res, Response) and res.error == 2 and res.closer_nodes == [addr(INPUTS["addrN1"])]


def test_valid_token_request_is_dispatched_and_reply_carries_token() -> None:
    rpc = make_rpc()
    src = ("203.0.113.5", 40000)
    good = rpc.token(src[0], 1)
    req = Request(tid=7, to=("192.0.2.1", 1), command=4, token=good, target=os.urandom(32), value=b"x")
    rpc.receive(req.encode(), src, SERVER, 0.0)
    ev = rpc.next_event()
    assert isinstance(ev, RequestReceived) and ev.incoming.request.token == good
    rpc.reply(ev.incoming, b"ok")
    ((_, data, to),) = rpc.datagrams_to_send()
    res = decode_message(data)
    assert isinstance(res, Response) and to == src and res.tid == 7 and res.token == good and res.value == b"ok"
    assert res.to == src and res.id is None  # ephemeral: never our id


def test_ping_vector_reply_from_persistent_and_ephemeral() -> None:
    p = V["ping"]
    rpc = make_rpc()
    rpc.table = RoutingTable(node_id(addr(INPUTS["addrB"])))
    rpc.receive(bytes.fromhex(p["request"]["hex"]), addr(INPUTS["addrA"]), SERVER, 0.0)
    ev = rpc.next_event()
    assert isinstance(ev, RequestReceived)
    rpc.reply(ev.incoming, token=False, closer_nodes=False)
    assert rpc.datagrams_to_send()[0][1].hex() == p["responseEphemeral"]["hex"]
    rpc.ephemeral = False
    rpc.reply(ev.incoming, token=False, closer_nodes=False)
    assert rpc.datagrams_to_send()[0][1].hex() == p["responsePersistent"]["hex"]


def test_retransmit_same_bytes_then_timeout() -> None:
    rpc = make_rpc()
    p = rpc.request(("10.0.0.1", 5), 0, 0.0, internal=True)
    assert p.socket == CLIENT  # firewalled nodes ask from the client socket
    (first,) = rpc.datagrams_to_send()
    now = 0.0
    sends = [first]
    events = []
    while p in rpc.inflight.values():
        now = rpc.get_timer() or now
        rpc.handle_timer(now)
        sends += rpc.datagrams_to_send()
        while (ev := rpc.next_event()) is not None:
            events.append(ev)
    assert len(sends) == 4 and len({d for _, d, _ in sends}) == 1  # 1 + 3 retries, identical bytes
    assert isinstance(events[0], RequestRetrying)
    assert isinstance(events[-1], RequestFailed) and events[-1].error.code == "REQUEST_TIMEOUT"
    assert 3.9 < now < 4.1


def test_response_matches_tid_and_source_only() -> None:
    rpc = make_rpc()
    p = rpc.request(("10.0.0.1", 5), 0, 0.0, internal=True)
    rpc.datagrams_to_send()
    res = Response(tid=p.tid, to=("1.2.3.4", 99)).encode()
    rpc.receive(res, ("10.0.0.2", 5), CLIENT, 0.1)  # right tid, wrong sender: ignored
    assert rpc.next_event() is None and p.tid in rpc.inflight
    rpc.receive(res, ("10.0.0.1", 5), CLIENT, 0.2)
    ev = rpc.next_event()
    assert isinstance(ev, ResponseReceived) and ev.reply.to == ("1.2.3.4", 99) and not rpc.inflight


def test_congestion_window_queues_and_drains() -> None:
    rpc = make_rpc(max_window=4)
    ps = [rpc.request(("10.0.0.1", 1000 + i), 0, 0.0, internal=True) for i in range(10)]
    assert len(rpc.datagrams_to_send()) == 4
    assert sum(p.queued for p in ps) == 6
    rpc.handle_timer(0.75)  # next slot
    assert len(rpc.datagrams_to_send()) == 4


@given(st.lists(st.binary(max_size=120), max_size=30))
@settings(max_examples=200, deadline=None)
def test_random_datagrams_never_raise_from_rpc(datagrams: list[bytes]) -> None:
    rpc = make_rpc()
    for i, d in enumerate(datagrams):
        rpc.receive(d, ("10.1.2.3", 1 + i), SERVER, float(i))
        rpc.receive(b"\x03" + d, ("10.1.2.3", 1 + i), CLIENT, float(i))
        rpc.receive(b"\x13" + d, ("10.1.2.3", 1 + i), CLIENT, float(i))
        while (ev := rpc.next_event()) is not None:
            if isinstance(ev, RequestReceived):
                rpc.reply(ev.incoming, error=ErrorCode.UNKNOWN_COMMAND)
    rpc.datagrams_to_send()


# ------------------------------------------------------------------------- query walk


def fake_reply(q: Query, frm: tuple[str, int], closer: list[tuple[str, int]], with_id: bool = True) -> Reply:
    res = Response(tid=1, to=("192.0.2.44", 49737), id=node_id(frm) if with_id else None, token=os.urandom(32))
    res.closer_nodes = closer
    return Reply(None, res, Peer(frm[0], frm[1], node_id(frm) if with_id else None), False)  # type: ignore[arg-type]


def test_query_walks_closer_nodes_and_keeps_k_closest() -> None:
    network = [(f"10.0.{i // 250}.{i % 250 + 1}", 49737) for i in range(60)]
    target = os.urandom(32)
    boot = ("10.9.9.9", 49737)
    q = Query(target, RoutingTable(os.urandom(32)), bootstrap=[boot], k=20, concurrency=10)
    asked: list[tuple[str, int]] = []
    rounds = 0
    while not q.finished and rounds < 100:
        rounds += 1
        visits = q.next_visits()
        for c in visits:
            asked.append(c.address)
            # an id-less bootstrap node (as hyperdht's bootstrappers) refers everyone
            closer = network if c.address == boot else sorted(network, key=lambda a: xor_key(target, a))[:20]
            q.on_reply(c.address, fake_reply(q, c.address, closer, with_id=c.address != boot))
    assert q.finished
    best = sorted(network, key=lambda a: xor_key(target, a))[:20]
    assert [r.peer.address for r in q.closest_replies] == best
    assert boot not in q.closest_nodes  # replies without a valid id never count as closest
    assert len(asked) == len(set(asked))  # nobody is asked twice


def xor_key(target: bytes, a: tuple[str, int]) -> bytes:
    return bytes(x ^ y for x, y in zip(target, node_id(a), strict=True))


def test_query_timeouts_send_down_hints_to_referrers() -> None:
    q = Query(os.urandom(32), RoutingTable(os.urandom(32)), bootstrap=[("10.0.0.1", 1)])
    (b,) = q.next_visits()
    dead = ("10.0.0.2", 2)
    q.on_reply(b.address, fake_reply(q, b.address, [dead]))
    (d,) = q.next_visits()
    assert d.address == dead
    q.on_retrying()
    q.on_failed(dead, timed_out=True, was_slow=True)
    assert [(h.to, h.down) for h in q.take_down_hints()] == [(b.address, dead)]
    assert q.next_visits() == [] and q.finished


# ------------------------------------------------------------------------- announce


def test_sign_announce_matches_vector_and_verifies() -> None:
    import nacl.bindings

    a = V["announce"]
    kp = key_pair(bytes.fromhex(INPUTS["serverSeed"]["hex"]))
    ann = sign_announce(kp, bytes.fromhex(a["target"]), bytes.fromhex(a["nodeIdOfB"]), bytes.fromhex(a["token"]))
    assert ann.encode().hex() == a["announceValue"]
    un = sign_announce(
        kp, bytes.fromhex(a["target"]), bytes.fromhex(a["nodeIdOfB"]), bytes.fromhex(a["token"]), unannounce=True
    )
    assert un.encode().hex() == a["unannounce"]["value"]
    signable = announce_signable(
        bytes.fromhex(a["target"]),
        bytes.fromhex(a["nodeIdOfB"]),
        bytes.fromhex(a["token"]),
        PeerRecord(kp.public_key),
        None,
        NS_ANNOUNCE,
    )
    assert ann.signature is not None
    nacl.bindings.crypto_sign_open(ann.signature + signable, kp.public_key)  # raises if invalid
    # bound to the node: another node id makes it invalid
    other = announce_signable(
        bytes.fromhex(a["target"]),
        os.urandom(32),
        bytes.fromhex(a["token"]),
        PeerRecord(kp.public_key),
        None,
        NS_ANNOUNCE,
    )
    with pytest.raises(nacl.exceptions.BadSignatureError):
        nacl.bindings.crypto_sign_open(ann.signature + other, kp.public_key)
    assert Announce.decode(ann.encode()) == ann


# ------------------------------------------------------------------------- server handshake


def vector_responder() -> tuple[HandshakeResponder, bytes]:
    server = key_pair(bytes.fromhex(INPUTS["serverSeed"]["hex"]))
    return HandshakeResponder(server), bytes.fromhex(V["noiseIK"]["message1"])


def test_responder_reproduces_hyperdht_message2_and_keys() -> None:
    ik = V["noiseIK"]
    r, msg1 = vector_responder()
    eph = key_pair(bytes.fromhex(INPUTS["serverEphemeralSeed"]["hex"]))
    client_addr = addr(INPUTS["clientAddress"])
    a = r.accept(msg1, client_addr, addr(INPUTS["addrB"]), addr(INPUTS["addrS"]), 0.0, ephemeral=eph)
    assert a is not None and not a.direct and a.client_address == client_addr
    assert a.remote_public_key.hex() == V["keys"]["clientPublicKey"]
    assert a.remote_payload.encode().hex() == ik["clientPayloadPlain"] and a.error == PayloadError.NONE
    s = addr(INPUTS["addrS"])
    msg2 = r.reply(
        a,
        0.0,
        stream_id=INPUTS["udxIds"]["server"],
        remote_address=s,
        local_addresses=[("10.0.0.5", 49737)],
        relay_addresses=[s, addr(INPUTS["addrN1"]), addr(INPUTS["addrN2"])],
        relays=[],
    )
    assert msg2.hex() == ik["message2"]
    assert a.result is not None
    assert a.result.hash.hex() == ik["handshakeHash"]
    assert a.result.tx.hex() == ik["serverTx"] and a.result.rx.hex() == ik["serverRx"]
    assert a.holepunch_secret is not None and a.holepunch_secret.hex() == ik["holepunchSecret"]
    # the FROM_SERVER value the router sends back is the vector's step 3 value
    step3 = decode_message(bytes.fromhex(V["peerHandshake"]["step3_S_to_B_FROM_SERVER"]["datagram"]))
    assert Handshake(Mode.FROM_SERVER, msg2, client_addr).encode() == step3.value


def test_responder_dedups_by_message1_and_clears_after_10s() -> None:
    r, msg1 = vector_responder()
    a = r.accept(msg1, None, ("203.0.113.9", 41000), ("192.0.2.44", 49737), 0.0)
    assert a is not None and a.direct
    reply = r.reply(a, 0.0, stream_id=7, remote_address=None, local_addresses=[], relay_addresses=[], relays=[])
    # the relayed copy and retransmissions get the very same attempt and message 2
    assert r.accept(msg1, ("203.0.113.9", 41000), ("198.51.100.7", 49737), ("192.0.2.44", 49737), 1.0) is a
    assert r.reply(a, 1.0, stream_id=8, remote_address=None, local_addresses=[], relay_addresses=[], relays=[]) == reply
    payload = NoisePayload.decode(client_view_of_reply(a))
    assert payload.firewall == 0 and payload.holepunch is not None and payload.holepunch.id == a.slot
    assert r.get_timer() == 10.0
    r.handle_timer(10.0)  # passive wait for the client's UDX packet ran out
    assert r.next_event() == AttemptTimedOut(a) and r.next_event() is None
    assert r.lookup(msg1) is a and r.get_timer() == 20.0
    r.handle_timer(20.0)  # its dedup window is over: forgotten, nothing to report
    assert r.next_event() is None and r.lookup(msg1) is None and r.slots == []


def client_view_of_reply(a) -> bytes:  # type: ignore[no-untyped-def]
    """Decrypt our own message 2 as the client would."""
    client = key_pair(bytes.fromhex(INPUTS["clientSeed"]["hex"]))
    eph = key_pair(bytes.fromhex(INPUTS["clientEphemeralSeed"]["hex"]))
    from relay.dht.messages import NS_PEER_HANDSHAKE

    nh = NoiseHandshake("IK", True, client, a.noise.static.public_key, prologue=NS_PEER_HANDSHAKE, ephemeral=eph)
    nh.send(bytes.fromhex(V["noiseIK"]["clientPayloadPlain"]))
    return nh.recv(a.reply)


def test_responder_rejects_garbage_firewalled_and_old_versions() -> None:
    r, msg1 = vector_responder()
    assert r.accept(os.urandom(120), None, ("1.1.1.1", 1), ("2.2.2.2", 2), 0.0) is None
    blocked = HandshakeResponder(r.key_pair, firewall=lambda pk, payload, address: True)
    assert blocked.accept(msg1, None, ("1.1.1.1", 1), ("2.2.2.2", 2), 0.0) is None
    # a client speaking payload version 2 gets VERSION_MISMATCH (and no stream)
    server = r.key_pair
    client = key_pair()
    from relay.dht.messages import NS_PEER_HANDSHAKE

    nh = NoiseHandshake("IK", True, client, server.public_key, prologue=NS_PEER_HANDSHAKE)
    m1 = nh.send(bytes([2, 0]))
    a = r.accept(m1, None, ("1.1.1.1", 1), ("2.2.2.2", 2), 0.0)
    assert a is not None and a.error == PayloadError.VERSION_MISMATCH
    m2 = r.reply(a, 0.0, stream_id=0, remote_address=None, local_addresses=[], relay_addresses=[], relays=[])
    assert NoisePayload.decode(nh.recv(m2)).error == PayloadError.VERSION_MISMATCH
    assert a.clear_at == 10.0


def test_holepunch_payload_secretbox_vector() -> None:
    hp = V["holepunch"]
    secret = bytes.fromhex(V["noiseIK"]["holepunchSecret"])
    plain = HolepunchPayload.decode(bytes.fromhex(hp["holepunchPayload"]["plainHex"]))
    sealed = seal_payload(secret, plain, nonce=bytes.fromhex(INPUTS["holepunchNonce"]["hex"]))
    assert sealed.hex() == hp["encryptedPayload"]
    assert open_payload(secret, sealed) == plain
    assert open_payload(secret, sealed[:-1] + bytes([sealed[-1] ^ 1])) is None
    assert open_payload(os.urandom(32), sealed) is None


def test_relay_info_in_firewalled_payload() -> None:
    r, msg1 = vector_responder()
    a = r.accept(msg1, ("203.0.113.9", 41000), ("198.51.100.7", 49737), ("192.0.2.44", 49737), 0.0)
    assert a is not None
    relays = [RelayInfo(("198.51.100.21", 49737), ("192.0.2.44", 49737))]
    r.reply(
        a, 0.0, stream_id=5, remote_address=None, local_addresses=[("10.0.0.5", 1)], relay_addresses=[], relays=relays
    )
    p = NoisePayload.decode(client_view_of_reply(a))
    assert p.holepunch is not None and p.holepunch.relays == relays and p.relay_addresses is None
    assert p.udx is not None and p.udx.id == 5 and p.secret_stream


def test_bad_address_is_a_dht_error() -> None:
    with pytest.raises(DHTError):
        node_id(("not-an-ip", 1))
    assert hash32(b"") != hash32(b"\x00")


def announce_reply(host: str, token: bytes | None = b"t" * 32, with_id: bool = True) -> Reply:
    a = (host, 49737)
    res = Response(tid=1, to=("192.0.2.44", 40000), id=node_id(a) if with_id else None, token=token)
    return Reply(None, res, Peer(host, 49737, node_id(a) if with_id else None), False)  # type: ignore[arg-type]


def test_announce_state_rounds_publish_and_unannounce_dropped_nodes() -> None:
    kp = key_pair(bytes.fromhex(INPUTS["serverSeed"]["hex"]))
    st_ = AnnounceState(kp, hash32(kp.public_key))
    replies = [announce_reply(f"10.0.0.{i}") for i in range(1, 6)]
    # responders without a token or a proven id are never announce targets, nor take a slot
    assert AnnounceState.pick([announce_reply("10.0.0.9", token=None), *replies]) == replies[:3]
    assert AnnounceState.pick([announce_reply("10.0.0.9", with_id=False)]) == []

    st_.begin_round(("192.0.2.44", 49737))
    for r in AnnounceState.pick(replies):
        st_.announced(r)
    assert st_.finish_round([r.peer.address for r in replies]) == []
    # our public address first, then announce nodes, at most 3 in all
    assert st_.relay_addresses == [("192.0.2.44", 49737), ("10.0.0.1", 49737), ("10.0.0.2", 49737)]
    assert [r.peer_address for r in st_.relays] == [("192.0.2.44", 40000)] * 3
    assert set(st_.announced_to) == {("10.0.0.1", 49737), ("10.0.0.2", 49737), ("10.0.0.3", 49737)}

    # next round: 10.0.0.1 is gone, 10.0.0.4 takes its place; only the lost one is unannounced
    st_.begin_round(None)
    for r in (replies[1], replies[2], replies[3]):
        st_.announced(r)
    assert st_.finish_round([]) == [("10.0.0.1", 49737)]
    assert st_.relay_addresses == [("10.0.0.2", 49737), ("10.0.0.3", 49737), ("10.0.0.4", 49737)]
    assert st_.is_relay(("10.0.0.1", 49737))  # still recognised for two generations
    assert st_.rounds == 2

    # the value we send verifies for that node's id and token only
    value = Announce.decode(st_.announce_value(replies[0].peer.id or b"", b"t" * 32))
    assert value.peer == PeerRecord(kp.public_key) and value.signature is not None
    assert st_.needs_refresh(3, 2) and not st_.needs_refresh(3, 3) and not st_.needs_refresh(1, 1)
    assert st_.needs_refresh(2, 1) and not st_.needs_refresh(0, 0)


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_query_always_terminates_and_never_asks_twice(data: st.DataObject) -> None:
    """Whatever replies, errors, timeouts and referrals arrive, in any order, the walk ends."""
    network = [(f"10.{i // 250}.0.{i % 250 + 1}", 1000 + i) for i in range(40)]
    target = data.draw(st.binary(min_size=32, max_size=32))
    q = Query(target, RoutingTable(bytes(32)), bootstrap=network[:2], k=data.draw(st.integers(1, 20)))
    inflight: list[tuple[tuple[str, int], bool]] = []
    asked: list[tuple[str, int]] = []
    for _ in range(400):
        for c in q.next_visits():
            asked.append(c.address)
            inflight.append((c.address, False))
        assert q.inflight == len(inflight) >= 0
        if q.finished or not inflight:
            break
        i = data.draw(st.integers(0, len(inflight) - 1))
        addr_, slow = inflight.pop(i)
        outcome = data.draw(st.sampled_from(["reply", "error", "timeout", "slow"]))
        if outcome == "slow" and not slow:
            q.on_retrying()
            inflight.insert(i, (addr_, True))
        elif outcome == "timeout" or outcome == "slow":
            q.on_failed(addr_, timed_out=True, was_slow=slow)
        elif outcome == "error":
            q.on_failed(addr_, timed_out=False, was_slow=slow)
        else:
            closer = data.draw(st.lists(st.sampled_from(network), max_size=8))
            q.on_reply(addr_, fake_reply(q, addr_, closer, with_id=data.draw(st.booleans())), was_slow=slow)
    q.next_visits()
    # done: nothing in flight, or (as dht-rpc) only slow requests left once k closest answered
    assert q.finished and q.inflight == len(inflight)
    assert not inflight or (all(slow for _, slow in inflight) and len(q.closest_replies) >= q.k)
    assert len(asked) == len(set(asked))
    ids = [r.peer.id for r in q.closest_replies]
    assert all(i is not None for i in ids) and len(ids) <= q.k
    assert ids == sorted(ids, key=lambda i: bytes(a ^ b for a, b in zip(target, i or b"", strict=True)))


# ------------------------------------------------------------------------- persistent storage


def test_persistent_announce_find_unannounce_with_vector_values() -> None:
    a = V["announce"]
    target, token = bytes.fromhex(a["target"]), bytes.fromhex(a["token"])
    store = Persistent(bytes.fromhex(a["nodeIdOfB"]))
    src = addr(INPUTS["addrS"])
    now = 1_800_000_000.0
    # the real announce value S sent to B is accepted; B now relays handshakes for the key to S
    ans = store.handle(Command.ANNOUNCE, target, token, bytes.fromhex(a["announceValue"]), src, now)
    assert ans is not None and ans.value is None and not ans.token and not ans.closer_nodes
    fwd = store.forwards.get(target)
    assert fwd is not None and fwd.relay == src and fwd.record.hex() == V["findPeer"]["peerRecordValue"]
    found = store.handle(Command.FIND_PEER, target, None, None, ("1.1.1.1", 1), now)
    assert found is not None and found.value is not None and found.value.hex() == V["findPeer"]["peerRecordValue"]
    look = store.handle(Command.LOOKUP, target, None, None, ("1.1.1.1", 1), now)
    assert look is not None and LookupReply.decode(look.value or b"").peers == [PeerRecord.decode(fwd.record)]
    # the same value at another node (other id) or with another token is dropped silently
    assert (
        Persistent(os.urandom(32)).handle(Command.ANNOUNCE, target, token, bytes.fromhex(a["announceValue"]), src, now)
        is None
    )
    assert store.handle(Command.ANNOUNCE, target, os.urandom(32), bytes.fromhex(a["announceValue"]), src, now) is None
    assert store.handle(Command.ANNOUNCE, target, None, bytes.fromhex(a["announceValue"]), src, now) is None
    un = store.handle(Command.UNANNOUNCE, target, token, bytes.fromhex(a["unannounce"]["value"]), src, now)
    assert un is not None and store.forwards.get(target) is None
    assert store.handle(Command.FIND_PEER, target, None, None, src, now) == Answer(None)


def test_persistent_mutable_immutable_and_expiry() -> None:
    store = Persistent(os.urandom(32), max_age=30.0)
    kp = key_pair()
    target = hash32(kp.public_key)

    def put(seq: int, value: bytes) -> Answer | None:
        sig = nacl.bindings.crypto_sign(mutable_signable(seq, value), kp.secret_key)[:64]
        req = Writer().fixed32(kp.public_key).uint(seq).buffer(value).fixed64(sig).getvalue()
        return store.handle(Command.MUTABLE_PUT, target, b"t" * 32, req, ("1.1.1.1", 1), 0.0)

    assert put(2, b"two") == Answer(None)
    assert put(2, b"other") == Answer(error=ErrorCode.SEQ_REUSED, token=False)
    assert put(1, b"one") == Answer(error=ErrorCode.SEQ_TOO_LOW, token=False)
    got = store.handle(Command.MUTABLE_GET, target, None, Writer().uint(0).getvalue(), ("1.1.1.1", 1), 0.0)
    assert got is not None and got.value is not None and Reader(got.value).uint() == 2
    newer = store.handle(Command.MUTABLE_GET, target, None, Writer().uint(3).getvalue(), ("1.1.1.1", 1), 0.0)
    assert newer == Answer(None)
    forged = Writer().fixed32(kp.public_key).uint(9).buffer(b"x").fixed64(b"\0" * 64).getvalue()
    assert store.handle(Command.MUTABLE_PUT, target, b"t" * 32, forged, ("1.1.1.1", 1), 0.0) is None

    blob = b"immutable"
    assert store.handle(Command.IMMUTABLE_PUT, hash32(blob), b"t" * 32, blob, ("1.1.1.1", 1), 0.0) == Answer(None)
    assert store.handle(Command.IMMUTABLE_PUT, os.urandom(32), b"t" * 32, blob, ("1.1.1.1", 1), 0.0) is None
    assert store.handle(Command.IMMUTABLE_GET, hash32(blob), None, None, ("1.1.1.1", 1), 0.0) == Answer(blob)

    # xache expiry: written/read entries survive one GC, untouched ones die at the second
    c: GenerationCache[str, int] = GenerationCache(max_age=30.0)
    c.tick(0.0)
    c.set("a", 1)
    c.set("b", 2)
    c.tick(20.0)  # GC 1 (every 2/3 of max age)
    assert c.get("a") == 1  # read: back to the young generation
    c.tick(40.0)  # GC 2
    assert c.get("a") == 1 and c.get("b") is None
    # garbage never raises
    for cmd in range(2, 10):
        assert store.handle(cmd, target, b"t" * 32, b"\xff\xff", ("1.1.1.1", 1), 0.0) in (None, Answer(None))


# ------------------------------------------------------------------------- router (vector chain)


def node_b_rpc() -> RPC:
    """Node B of the vectors: persistent, its id, answering from its server socket."""
    rpc = RPC(RoutingTable(node_id(addr(INPUTS["addrB"]))), firewalled=False)
    rpc.ephemeral = False
    return rpc


def test_router_reproduces_the_relayed_handshake_chain_byte_for_byte() -> None:
    ph = V["peerHandshake"]
    client, server = addr(INPUTS["clientAddress"]), addr(INPUTS["addrS"])
    rpc = node_b_rpc()
    # step 1 -> 2: B holds the forward entry (relay = S) and relays the client's message 1
    rpc.receive(bytes.fromhex(ph["step1_client_to_B_FROM_CLIENT"]["datagram"]), client, SERVER, 0.0)
    ev = rpc.next_event()
    assert isinstance(ev, RequestReceived)
    route = route_handshake(Handshake.decode(ev.incoming.value or b""), client, server)
    assert isinstance(route, RouterRelay) and route.to == server
    rpc.relay(ev.incoming, route.value, route.to)
    ((_, data, to),) = rpc.datagrams_to_send()
    assert to == server and data.hex() == ph["step2_B_to_S_FROM_RELAY"]["datagram"]
    # step 3 -> 4: S's FROM_SERVER comes back; B answers the client's pending request
    rpc.receive(bytes.fromhex(ph["step3_S_to_B_FROM_SERVER"]["datagram"]), server, SERVER, 0.0)
    ev = rpc.next_event()
    assert isinstance(ev, RequestReceived)
    route = route_handshake(Handshake.decode(ev.incoming.value or b""), server, None)
    assert isinstance(route, Respond) and route.to == client
    rpc.reply(ev.incoming, route.value, token=False, closer_nodes=route.closer_nodes, to=route.to)
    ((_, data, to),) = rpc.datagrams_to_send()
    assert to == client and data.hex() == ph["step4_B_to_C_REPLY"]["datagram"]


def test_server_reply_routes_by_mode() -> None:
    ph = V["peerHandshake"]
    msg2 = bytes.fromhex(V["noiseIK"]["message2"])
    client, b = addr(INPUTS["clientAddress"]), addr(INPUTS["addrB"])
    step2 = decode_message(bytes.fromhex(ph["step2_B_to_S_FROM_RELAY"]["datagram"]))
    route = server_handshake_reply(Handshake.decode(step2.value or b""), msg2, b)
    step3 = decode_message(bytes.fromhex(ph["step3_S_to_B_FROM_SERVER"]["datagram"]))
    assert route == RouterRelay(step3.value or b"", b)
    direct = decode_message(bytes.fromhex(ph["direct_C_to_S_FROM_CLIENT"]["datagram"]))
    reply = decode_message(bytes.fromhex(ph["direct_S_to_C_REPLY"]["datagram"]))
    assert server_handshake_reply(Handshake.decode(direct.value or b""), msg2, client) == Respond(reply.value)
    second = Handshake(Mode.FROM_SECOND_RELAY, b"m1", client, ("198.51.100.21", 49737))
    assert server_handshake_reply(second, msg2, b) == RouterRelay(
        Handshake(Mode.FROM_SERVER, msg2, client).encode(), ("198.51.100.21", 49737)
    )
    assert server_handshake_reply(Handshake(Mode.REPLY, b"x"), msg2, b) is None


def test_router_edge_cases() -> None:
    c, n = ("203.0.113.9", 41000), ("198.51.100.21", 49737)
    # no record and no hint: answer with closer nodes so the client keeps walking
    assert route_handshake(Handshake(Mode.FROM_CLIENT, b"m1"), c, None) == Respond(None, closer_nodes=True)
    assert route_handshake(Handshake(Mode.FROM_CLIENT, b""), c, n) is None
    assert route_handshake(Handshake(Mode.FROM_RELAY, b"m1", c), n, None) is None
    fwd = route_handshake(Handshake(Mode.FROM_RELAY, b"m1", c), n, ("192.0.2.44", 49737))
    assert fwd == RouterRelay(Handshake(Mode.FROM_SECOND_RELAY, b"m1", c, n).encode(), ("192.0.2.44", 49737))
    assert route_handshake(Handshake(Mode.FROM_SERVER, b"m2"), n, None) is None
    assert route_handshake(Handshake(Mode.REPLY, b"m2", c), n, None) is None
    hp = V["holepunch"]
    from_client = Holepunch.decode(bytes.fromhex(hp["holepunchMessage_FROM_CLIENT"]))
    relayed = route_holepunch(from_client, c, None)
    assert relayed is not None and isinstance(relayed, RouterRelay)
    assert Holepunch.decode(relayed.value).mode == Mode.FROM_RELAY and relayed.to == from_client.peer_address
    assert route_holepunch(Holepunch(Mode.FROM_CLIENT, 0, b"p"), c, None) is None
    back = route_holepunch(Holepunch(Mode.FROM_SERVER, 0, b"p", c), n, None)
    assert back == Respond(Holepunch(Mode.REPLY, 0, b"p", n).encode(), to=c)


# ------------------------------------------------------------------------- holepunch state


def test_nat_analyzer_classifies_like_hyperdht() -> None:
    nat = NatAnalyzer()
    nat.add(("1.2.3.4", 5000), ("10.0.0.1", 1))
    nat.add(("1.2.3.4", 5000), ("10.0.0.1", 1))  # one sample per responder
    nat.add(("1.2.3.4", 5000), ("10.0.0.2", 1))
    assert nat.sampled == 2 and nat.firewall == Firewall.UNKNOWN and not nat.done
    nat.add(("1.2.3.4", 5000), ("10.0.0.3", 1))
    assert nat.firewall == Firewall.CONSISTENT and nat.addresses == [("1.2.3.4", 5000)] and nat.done
    rnd = NatAnalyzer()
    for i in range(3):
        rnd.add(("1.2.3.4", 6000 + i), (f"10.0.0.{i}", 1))
    assert rnd.firewall == Firewall.RANDOM and rnd.addresses == [("1.2.3.4", 0)]
    two = NatAnalyzer()  # two hosts each seen twice (multi-homed, consistent per host)
    for i, mapped in enumerate([("1.1.1.1", 1), ("2.2.2.2", 2), ("1.1.1.1", 1), ("2.2.2.2", 2)]):
        two.add(mapped, (f"10.0.0.{i}", 1))
    assert two.firewall == Firewall.CONSISTENT and set(two.addresses or []) == {("1.1.1.1", 1), ("2.2.2.2", 2)}
    frozen = NatAnalyzer()
    frozen.freeze()
    for i in range(4):
        frozen.add(("1.2.3.4", 1), (f"10.0.0.{i}", 1))
    assert frozen.firewall == Firewall.UNKNOWN and frozen.done  # frozen: no reclassification


def test_punch_state_decisions() -> None:
    nat = NatAnalyzer()
    for i in range(3):
        nat.add(("1.2.3.4", 5000), (f"10.0.0.{i}", 1))
    st_ = PunchState(nat)
    st_.update_remote(True, Firewall.CONSISTENT, [("5.6.7.8", 1), ("5.6.7.9", 2)], verified="5.6.7.8")
    assert st_.stable() and st_.can_punch() and st_.remote_holepunching
    st_.punching = True
    rounds = []
    while st_.more_tries():
        rounds.append(st_.probe_targets())
    assert len(rounds) == 10
    assert all(("5.6.7.8", 1) in r for r in rounds)  # verified: every round
    assert [i + 1 for i, r in enumerate(rounds) if ("5.6.7.9", 2) in r] == [4, 8]  # others: every 4th
    st_.update_remote(True, Firewall.RANDOM, [("5.6.7.8", 1)], verified=None)
    assert st_.remote_addresses[0].verified  # a verified host stays verified
    assert st_.stable() and not st_.can_punch()  # we do not run birthday attacks on random NATs
    unknown = PunchState(NatAnalyzer())
    assert not unknown.stable()
