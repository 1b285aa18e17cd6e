"""dht-rpc frames and hyperdht values against the vectors the real npm libraries produced."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.dht.messages import (
    NS_ANNOUNCE,
    NS_MUTABLE_PUT,
    NS_PEER_HANDSHAKE,
    NS_PEER_HOLEPUNCH,
    NS_PLUGIN,
    NS_UNANNOUNCE,
    Announce,
    DHTError,
    Handshake,
    Holepunch,
    HolepunchPayload,
    LookupReply,
    Mode,
    NoisePayload,
    PeerRecord,
    Request,
    Response,
    announce_signable,
    decode_message,
    encode_hyperdht_address,
    hash32,
    node_id,
)
from tests.vectors import load

V = load("dht")["vectors"]
INPUTS = load("dht")["inputs"]


def addr(d: dict) -> tuple[str, int]:
    return (d["host"], d["port"])


def roundtrip(hexstr: str) -> Request | Response:
    data = bytes.fromhex(hexstr)
    msg = decode_message(data)
    assert msg.encode() == data
    return msg


def test_namespaces() -> None:
    ns = V["namespaces"]
    assert hash32(b"hyperswarm/dht").hex() == ns["base_hash_of_hyperswarm_dht"]
    assert NS_ANNOUNCE.hex() == ns["ANNOUNCE_cmd4"]
    assert NS_UNANNOUNCE.hex() == ns["UNANNOUNCE_cmd5"]
    assert NS_MUTABLE_PUT.hex() == ns["MUTABLE_PUT_cmd6"]
    assert NS_PEER_HANDSHAKE.hex() == ns["PEER_HANDSHAKE_cmd0"]
    assert NS_PEER_HOLEPUNCH.hex() == ns["PEER_HOLEPUNCH_cmd1"]
    assert NS_PLUGIN.hex() == ns["PLUGIN_cmd10"]


def test_node_ids() -> None:
    v = V["nodeId"]
    assert node_id(addr(v["address"])).hex() == v["id"]
    assert node_id(addr(INPUTS["addrA"])).hex() == v["idOfAddrA"]
    assert node_id(addr(INPUTS["addrS"])).hex() == v["idOfAddrS"]


def test_ping_frames() -> None:
    v = V["ping"]
    req = roundtrip(v["request"]["hex"])
    assert isinstance(req, Request)
    assert req.internal and req.command == 0 and req.tid == 0x1234 and req.to == addr(v["request"]["to"])
    res = roundtrip(v["responsePersistent"]["hex"])
    assert isinstance(res, Response)
    assert res.id == node_id(addr(INPUTS["addrB"])) and res.to == addr(v["responsePersistent"]["to"])
    eph = roundtrip(v["responseEphemeral"]["hex"])
    assert isinstance(eph, Response) and eph.id is None


def test_internal_commands() -> None:
    pn = roundtrip(V["pingNat"]["request"]["hex"])
    assert isinstance(pn, Request) and pn.command == 1 and pn.value == (49737).to_bytes(2, "little")
    res = roundtrip(V["pingNat"]["response"]["hex"])
    assert res.to == addr(V["pingNat"]["response"]["sentTo"])
    dh = roundtrip(V["downHint"]["request"])
    assert dh.command == 3 and dh.value == bytes.fromhex("c633641651c3")
    dp = roundtrip(V["delayedPing"]["request"])
    assert dp.command == 4 and int.from_bytes(dp.value or b"", "little") == 2500


def test_find_node_and_find_peer() -> None:
    fn = V["findNode"]
    req = roundtrip(fn["request"]["hex"])
    assert isinstance(req, Request) and req.internal and req.target.hex() == fn["target"]
    assert req.id == node_id(addr(INPUTS["addrA"]))
    res = roundtrip(fn["response"]["hex"])
    assert res.closer_nodes == [addr(a) for a in fn["response"]["closerNodesInOrder"]]

    fp = V["findPeer"]
    req = roundtrip(fp["request"]["hex"])
    assert not req.internal and req.command == 2 and req.target.hex() == V["keys"]["target"]
    res = roundtrip(fp["responseWithRecord"])
    assert res.token.hex() == fp["tokenInResponse"] and res.value.hex() == fp["peerRecordValue"]
    rec = PeerRecord.decode(res.value)
    assert rec.public_key.hex() == V["keys"]["serverPublicKey"] and rec.relay_addresses == []
    assert roundtrip(fp["responseWithoutRecord"]).value is None
    unk = roundtrip(fp["responseUnknownCommandFromEphemeralNode"])
    assert unk.error == 1 and unk.id is None and len(unk.closer_nodes) == 1


def test_invalid_token_frames() -> None:
    req = roundtrip(V["invalidToken"]["request"])
    assert req.token == b"\x01" * 32
    res = roundtrip(V["invalidToken"]["response"])
    assert res.error == 2 and res.token is not None


def test_announce_signable_and_signature() -> None:
    import nacl.bindings

    a = V["announce"]
    target = bytes.fromhex(a["target"])
    peer = PeerRecord(bytes.fromhex(V["keys"]["serverPublicKey"]))
    assert peer.encode().hex() == a["encodedPeer"]
    nid, token = bytes.fromhex(a["nodeIdOfB"]), bytes.fromhex(a["token"])
    signable = announce_signable(target, nid, token, peer, None, NS_ANNOUNCE)
    assert signable.hex() == a["signable"]
    sk = bytes.fromhex(V["keys"]["serverSecretKey"])
    sig = nacl.bindings.crypto_sign(signable, sk)[:64]
    assert sig.hex() == a["signature"]
    value = Announce(peer=peer, signature=sig).encode()
    assert value.hex() == a["announceValue"]
    req = roundtrip(a["request"]["hex"])
    assert req.value == value and req.token == token and req.command == 4
    un = a["unannounce"]
    assert announce_signable(target, nid, token, peer, None, NS_UNANNOUNCE).hex() == un["signable"]
    assert Announce.decode(bytes.fromhex(un["value"])).signature.hex() == un["signature"]
    roundtrip(un["request"]["hex"])
    layout = Announce.decode(bytes.fromhex(a["layoutExample_relayAddresses_refresh_signature"]["hex"]))
    assert layout.peer.relay_addresses == [addr(INPUTS["addrN1"]), addr(INPUTS["addrN2"])]
    assert layout.refresh == b"\xcc" * 32
    assert layout.encode().hex() == a["layoutExample_relayAddresses_refresh_signature"]["hex"]


@pytest.mark.parametrize(
    "name",
    ["clientTypical", "serverOpen", "serverFirewalledWithHolepunch", "clientWithRelayThrough", "errorVersionMismatch"],
)
def test_noise_payloads(name: str) -> None:
    v = V["noisePayload"][name]
    data = bytes.fromhex(v["hex"])
    p = NoisePayload.decode(data)
    assert p.encode() == data
    assert p.error == v["value"]["error"] and p.firewall == v["value"]["firewall"]
    assert p.addresses4 == [addr(a) for a in v["value"]["addresses4"]]
    if v["value"]["udx"]:
        assert p.udx is not None and p.udx.id == v["value"]["udx"]["id"]
    if v["value"].get("relayAddresses") is not None:
        assert p.relay_addresses == [addr(a) for a in v["value"]["relayAddresses"]]
    if v["value"]["holepunch"]:
        assert p.holepunch is not None and p.holepunch.id == v["value"]["holepunch"]["id"]


def test_noise_payload_future_version_stops_decoding() -> None:
    p = NoisePayload.decode(bytes([2, 0xFF, 0xFF]))
    assert p.version == 2 and p.udx is None


def test_peer_handshake_chain() -> None:
    ph = V["peerHandshake"]
    client = addr(ph["clientAddress"])
    s1 = roundtrip(ph["step1_client_to_B_FROM_CLIENT"]["datagram"])
    hs1 = Handshake.decode(s1.value)
    assert hs1.mode == Mode.FROM_CLIENT and hs1.noise.hex() == V["noiseIK"]["message1"]
    s2 = roundtrip(ph["step2_B_to_S_FROM_RELAY"]["datagram"])
    hs2 = Handshake.decode(s2.value)
    assert hs2.mode == Mode.FROM_RELAY and hs2.peer_address == client and s2.tid == s1.tid
    s3 = roundtrip(ph["step3_S_to_B_FROM_SERVER"]["datagram"])
    hs3 = Handshake.decode(s3.value)
    assert hs3.mode == Mode.FROM_SERVER and hs3.peer_address == client and s3.tid == s1.tid
    assert Handshake(Mode.FROM_SERVER, hs3.noise, client).encode() == s3.value
    s4 = roundtrip(ph["step4_B_to_C_REPLY"]["datagram"])
    hs4 = Handshake.decode(s4.value)
    assert hs4.mode == Mode.REPLY and hs4.peer_address == addr(INPUTS["addrS"])
    d = roundtrip(ph["direct_S_to_C_REPLY"]["datagram"])
    assert Handshake.decode(d.value).peer_address is None
    roundtrip(ph["direct_C_to_S_FROM_CLIENT"]["datagram"])


def test_holepunch_messages() -> None:
    hp = V["holepunch"]
    plain = bytes.fromhex(hp["holepunchPayload"]["plainHex"])
    p = HolepunchPayload.decode(plain)
    assert p.encode() == plain and p.punching and p.round == 1 and p.firewall == 2
    for key, mode in (
        ("holepunchMessage_FROM_CLIENT", Mode.FROM_CLIENT),
        ("holepunchMessage_FROM_RELAY", Mode.FROM_RELAY),
        ("holepunchMessage_REPLY", Mode.REPLY),
    ):
        data = bytes.fromhex(hp[key])
        m = Holepunch.decode(data)
        assert m.mode == mode and m.encode() == data
        assert m.payload.hex() == hp["encryptedPayload"]
    abort = HolepunchPayload.decode(bytes.fromhex(hp["abortPayloadPlain"]))
    assert abort.error == 1


def test_misc() -> None:
    m = V["misc"]
    lr = LookupReply.decode(bytes.fromhex(m["lookupRawReply"]["hex"]))
    assert lr.encode().hex() == m["lookupRawReply"]["hex"] and len(lr.peers) == 1
    pr = PeerRecord.decode(bytes.fromhex(m["peerRecordWithRelays"]["hex"]))
    assert pr.encode().hex() == m["peerRecordWithRelays"]["hex"]
    key = bytes.fromhex(V["keys"]["serverPublicKey"])
    assert encode_hyperdht_address(key, []).hex() == m["hyperdhtAddress"]["keyOnly"]
    assert encode_hyperdht_address(key, [addr(INPUTS["addrS"])]).hex() == m["hyperdhtAddress"]["withNodes"]


def test_bad_frames_raise_dht_error() -> None:
    for bad in (b"", b"\x03", b"\x04\x00", b"\x03\x00\x01", b"\x13\x04\x00\x00\x01\x02\x03\x04\x05\x06\xff"):
        with pytest.raises(DHTError):
            decode_message(bad)


@given(st.binary(max_size=300))
def test_random_bytes_only_raise_dht_error(data: bytes) -> None:
    for decode in (
        decode_message,
        Handshake.decode,
        Holepunch.decode,
        NoisePayload.decode,
        HolepunchPayload.decode,
        Announce.decode,
        PeerRecord.decode,
        LookupReply.decode,
    ):
        with contextlib.suppress(DHTError):
            decode(data)


@given(st.binary(min_size=2, max_size=200).map(lambda b: bytes([0x03 if b[0] & 1 else 0x13]) + b[1:]))
def test_random_rpc_frames_roundtrip_or_raise(data: bytes) -> None:
    try:
        msg = decode_message(data)
    except DHTError:
        return
    again = decode_message(msg.encode())
    assert again == msg
