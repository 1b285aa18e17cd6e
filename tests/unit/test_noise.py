"""relay.noise against the transcripts noise-handshake 4.2 + noise-curve-ed wrote (streams and dht)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.keys import key_pair, namespace
from relay.noise import NoiseError, NoiseHandshake, dh, hkdf, hmac_blake2b, protocol_name
from tests.vectors import load

V = load("streams")
DHT = load("dht")
NS_PEER_HANDSHAKE = namespace("hyperswarm/dht", [0])[0]


def _seed(hexstr: str):
    return key_pair(bytes.fromhex(hexstr))


def test_hmac_blake2b_vector() -> None:
    p = V["primitives"]["hmac_blake2b"]
    assert hmac_blake2b(p["key_utf8"].encode(), p["msg_utf8"].encode()).hex() == p["out"]


def test_hkdf_vector() -> None:
    p = V["primitives"]["hkdf2"]
    out1, out2 = hkdf(bytes.fromhex(p["salt"]), bytes.fromhex(p["ikm"]))
    assert (out1.hex(), out2.hex()) == (p["out1"], p["out2"])


def test_ed25519_dh_vector_is_symmetric() -> None:
    p = V["primitives"]["ed25519_dh"]
    a, b = _seed(p["a_seed"]), _seed(p["b_seed"])
    assert dh(b.public_key, a).hex() == p["out"]
    assert dh(a.public_key, b).hex() == p["out"]


@pytest.mark.parametrize("bad", [bytes(32), b"\xff" * 32, bytes([1]) + bytes(31)])
def test_dh_rejects_bad_points(bad: bytes) -> None:
    with pytest.raises(NoiseError):
        dh(bad, key_pair())


def _pair(v: dict) -> tuple[NoiseHandshake, NoiseHandshake]:
    prologue = bytes.fromhex(v["prologue"])
    i_static, r_static = _seed(v["initiator"]["static_seed"]), _seed(v["responder"]["static_seed"])
    assert i_static.public_key.hex() == v["initiator"]["static_publicKey"]
    ini = NoiseHandshake(
        v["pattern"],
        True,
        i_static,
        remote_static=r_static.public_key if v["pattern"] == "IK" else None,
        prologue=prologue,
        ephemeral=_seed(v["initiator"]["ephemeral_seed"]),
    )
    res = NoiseHandshake(
        v["pattern"], False, r_static, prologue=prologue, ephemeral=_seed(v["responder"]["ephemeral_seed"])
    )
    return ini, res


@pytest.mark.parametrize("name", ["xx", "ik"])
def test_noise_transcript_matches_vectors(name: str) -> None:
    v = V["noise"][name]
    assert protocol_name(v["pattern"]) == v["protocol_name"].encode()
    ini, res = _pair(v)
    for side, obj in (("initiator", ini), ("responder", res)):
        assert obj.h.hex() == v["after_initialise"][side]["h"]
        assert obj.ck.hex() == v["after_initialise"][side]["ck"]
    for m in v["messages"]:
        sender, receiver = (ini, res) if m["from"] == "initiator" else (res, ini)
        assert sender.my_turn and not receiver.my_turn
        wire = sender.send(bytes.fromhex(m["payload"]))
        assert wire.hex() == m["message"]
        assert len(wire) == m["length"]
        if m["state_after_sender"]:
            assert sender.h.hex() == m["state_after_sender"]["h"]
            assert sender.ck.hex() == m["state_after_sender"]["ck"]
        assert receiver.recv(wire).hex() == m["receiver_decrypted_payload"]
        if m["state_after_receiver"]:
            assert receiver.h.hex() == m["state_after_receiver"]["h"]
            assert receiver.ck.hex() == m["state_after_receiver"]["ck"]
    r = v["result"]
    assert ini.complete and res.complete
    assert ini.hash.hex() == res.hash.hex() == r["handshake_hash"]
    for side, obj in (("initiator", ini), ("responder", res)):
        assert obj.tx.hex() == r[side]["tx"]
        assert obj.rx.hex() == r[side]["rx"]
        assert obj.remote_static.hex() == r[side]["rs"]


def test_noise_dh_values_match_vectors() -> None:
    d = V["noise"]["xx"]["dh"]
    v = V["noise"]["xx"]
    ie, re_ = _seed(v["initiator"]["ephemeral_seed"]), _seed(v["responder"]["ephemeral_seed"])
    is_, rs = _seed(v["initiator"]["static_seed"]), _seed(v["responder"]["static_seed"])
    assert dh(re_.public_key, ie).hex() == d["ee"]
    assert dh(rs.public_key, ie).hex() == d["es_initiator_e_responder_s"]
    assert dh(re_.public_key, is_).hex() == d["se_initiator_s_responder_e"]
    assert dh(rs.public_key, is_).hex() == d["ss"]


def test_noise_ik_hyperdht_vectors_both_roles() -> None:
    """dht.json noiseIK: client = IK initiator, server = IK responder with NS.PEER_HANDSHAKE."""
    v = DHT["vectors"]["noiseIK"]
    inp = DHT["inputs"]
    prologue = bytes.fromhex(v["prologue"])
    assert prologue == NS_PEER_HANDSHAKE
    server, client = _seed(inp["serverSeed"]["hex"]), _seed(inp["clientSeed"]["hex"])
    c_eph, s_eph = _seed(inp["clientEphemeralSeed"]["hex"]), _seed(inp["serverEphemeralSeed"]["hex"])
    assert c_eph.public_key.hex() == v["clientEphemeralPublicKey"]
    # server side alone, fed the captured client message: what the relay does
    srv = NoiseHandshake("IK", False, server, prologue=prologue, ephemeral=s_eph)
    assert srv.recv(bytes.fromhex(v["message1"])).hex() == v["clientPayloadPlain"]
    assert srv.remote_static == client.public_key
    assert srv.send(bytes.fromhex(v["serverPayloadPlain"])).hex() == v["message2"]
    assert (srv.tx.hex(), srv.rx.hex(), srv.hash.hex()) == (v["serverTx"], v["serverRx"], v["handshakeHash"])
    # client side alone, fed the captured server message
    cli = NoiseHandshake("IK", True, client, remote_static=server.public_key, prologue=prologue, ephemeral=c_eph)
    assert cli.send(bytes.fromhex(v["clientPayloadPlain"])).hex() == v["message1"]
    assert cli.recv(bytes.fromhex(v["message2"])).hex() == v["serverPayloadPlain"]
    assert (cli.tx.hex(), cli.rx.hex(), cli.hash.hex()) == (v["clientTx"], v["clientRx"], v["handshakeHash"])


@pytest.mark.parametrize("pattern", ["XX", "IK"])
def test_random_keys_handshake_agrees(pattern: str) -> None:
    a, b = key_pair(), key_pair()
    ini = NoiseHandshake(pattern, True, a, remote_static=b.public_key if pattern == "IK" else None, prologue=b"p")
    res = NoiseHandshake(pattern, False, b, prologue=b"p")
    msg = ini.send(b"one")
    assert res.recv(msg) == b"one"
    msg = res.send(b"two")
    assert ini.recv(msg) == b"two"
    if pattern == "XX":
        assert res.recv(ini.send(b"three")) == b"three"
    assert ini.tx == res.rx and ini.rx == res.tx and ini.hash == res.hash
    assert ini.remote_static == b.public_key and res.remote_static == a.public_key


def test_prologue_mismatch_fails_cleanly() -> None:
    a, b = key_pair(), key_pair()
    ini = NoiseHandshake("IK", True, a, remote_static=b.public_key, prologue=b"one")
    res = NoiseHandshake("IK", False, b, prologue=b"two")
    with pytest.raises(NoiseError, match="authentication"):
        res.recv(ini.send())
    with pytest.raises(NoiseError, match="already failed"):
        res.send()


def test_ik_wrong_responder_key_fails() -> None:
    a, b, c = key_pair(), key_pair(), key_pair()
    ini = NoiseHandshake("IK", True, a, remote_static=c.public_key)
    with pytest.raises(NoiseError):
        NoiseHandshake("IK", False, b).recv(ini.send())


def test_turn_order_and_completion_are_enforced() -> None:
    a, b = key_pair(), key_pair()
    ini, res = NoiseHandshake("XX", True, a), NoiseHandshake("XX", False, b)
    with pytest.raises(NoiseError, match="out of turn"):
        ini.recv(b"x" * 32)
    with pytest.raises(NoiseError, match="out of turn"):
        res.send()
    res.recv(ini.send())
    ini.recv(res.send())
    res.recv(ini.send())
    assert ini.complete and res.complete
    with pytest.raises(NoiseError, match="complete"):
        ini.send()
    with pytest.raises(NoiseError):
        NoiseHandshake("IK", True, a)  # IK initiator needs the responder key
    with pytest.raises(NoiseError):
        NoiseHandshake("NN", True, a)  # type: ignore[arg-type]


def test_payload_too_large_is_noise_error() -> None:
    a, b = key_pair(), key_pair()
    ini = NoiseHandshake("IK", True, a, remote_static=b.public_key)
    with pytest.raises(NoiseError, match="65535"):
        ini.send(bytes(65535))


_STATIC = key_pair(b"\x05" * 32)
_OTHER = key_pair(b"\x06" * 32)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(["XX", "IK"]))
def test_responder_recv_random_bytes_raises_only_noise_error(data: bytes, pattern: str) -> None:
    res = NoiseHandshake(pattern, False, _STATIC)
    try:
        res.recv(data)
    except NoiseError:
        return
    assert pattern == "XX" and len(data) >= 32  # XX msg 1 is plaintext: any 32+ bytes parse


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_truncated_or_flipped_messages_raise_only_noise_error(data: st.DataObject) -> None:
    pattern = data.draw(st.sampled_from(["XX", "IK"]))
    ini = NoiseHandshake(pattern, True, _OTHER, remote_static=_STATIC.public_key if pattern == "IK" else None)
    res = NoiseHandshake(pattern, False, _STATIC)
    m1 = ini.send(b"hi")
    res.recv(m1)
    m2 = bytearray(res.send(b"there"))
    cut = data.draw(st.integers(0, len(m2)))
    flip = data.draw(st.integers(0, len(m2) - 1))
    mutated = bytearray(m2[:cut])
    if mutated and flip < len(mutated):
        mutated[flip] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(NoiseError):
        ini.recv(bytes(mutated))
